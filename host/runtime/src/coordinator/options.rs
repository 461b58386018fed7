//! What a pipeline runs with and what it reports: [`PipelineOptions`],
//! what a layout change moved ([`Relayout`]) and what a coordinator did
//! since it opened ([`Stats`]).

use sluice_core::BadRecordPolicy;
use std::collections::BTreeMap;
use std::time::Duration;

/// How a pipeline runs.
#[derive(Debug, Clone)]
pub struct PipelineOptions {
    /// The pipeline's identity: names it in logs and seeds its guests'
    /// random numbers (every host running the pipeline must use the same).
    pub name: String,
    /// At most this many events per input partition per step.
    pub max_batch: u64,
    /// Checkpoint after this many committed steps…
    pub checkpoint_every_steps: u64,
    /// …or this much time, whichever comes first.
    pub checkpoint_interval: Duration,
    /// Let guests write to the host's stderr (panic messages); for local
    /// runs only, never for a shared host.
    pub inherit_guest_stderr: bool,
    /// Settings handed to the circuit in `worker-info.config`.
    pub config: Vec<(String, String)>,
    /// At most this many output events per worker per step (all ports);
    /// more fails the step with [`GuestError::OutputLimit`](crate::GuestError::OutputLimit).
    pub max_output_per_step: Option<u64>,
    /// Write only the shards changed since the previous checkpoint (and
    /// carry the others' pieces from it) when the instances can say which
    /// changed; off, every checkpoint is written whole.
    pub incremental_checkpoints: bool,
    /// Parse every output value as JSON before committing it, failing the
    /// step on one that is not (a host serving output to clients wants
    /// this; a local run trusts its own circuit and skips the cost).
    pub check_output_json: bool,
    /// Where each worker ran before, across hosts: the address of its host
    /// (as [`RemoteHost::addr`](crate::RemoteHost::addr)), empty for the coordinator's own process —
    /// what [`Coordinator::placement_addrs`](crate::Coordinator::placement_addrs) returned. Opening on hosts
    /// then keeps every worker whose host is among them where it was (its
    /// host restores it from its own copy of the checkpoint) and spreads
    /// only the others, as [`Coordinator::replace_hosts`](crate::Coordinator::replace_hosts) does. Empty (or
    /// of another W): workers are dealt round robin.
    pub placement_hint: Vec<String>,
    /// Input port → what a live step does with a record there that is not
    /// an event (a port not named: [`BadRecordPolicy::Fail`]). Sent with
    /// each step's input ranges, so every host of a step does the same; a
    /// replay skips such records whatever this says (a recorded step
    /// skipped them, or had none), so changing it changes only the steps
    /// to come.
    pub bad_records: BTreeMap<String, BadRecordPolicy>,
    /// How many instances run each worker, each on another host (the
    /// coordinator's process counts as one): the primary, whose output is
    /// committed, and followers that step beside it on the same input and
    /// exchange the same events, their output's hash checked against the
    /// primary's every step (a difference stops the pipeline:
    /// [`Error::ReplicasDiverged`](crate::Error::ReplicasDiverged)). With fewer hosts than
    /// this, each worker runs on every host. 1 (the default): no followers.
    pub replicas: u32,
    /// The zone (failure domain) of each host, by its address
    /// ([`RemoteHost::addr`](crate::RemoteHost::addr); empty for the
    /// coordinator's own process): the replicas of each worker go to
    /// different zones first, then to the least loaded hosts. A host
    /// without a zone is a zone of its own.
    pub zones: BTreeMap<String, String>,
    /// This process's own worker host, if it runs one (as `sluice host`
    /// does): a coordinator opened here adopts the workers an earlier
    /// coordinator left on it, as it adopts those on the other hosts.
    pub own_host: Option<std::sync::Arc<crate::hosts::WorkerHost>>,
    /// The pipeline moved to this component from another at a checkpoint
    /// (`sluice upgrade`): while that checkpoint, the other component's, is
    /// the newest, the instances take it through the circuit's `upgrade`,
    /// not `restore`. `None`: no upgrade pending.
    pub upgraded_at: Option<UpgradedAt>,
    /// Keep every input record: checkpoints trim nothing (the pipeline's
    /// input retention, so that an upgrade can rebuild the state from
    /// all of it: [`UpgradedAt::rebuilt`]).
    pub retain_input: bool,
}

/// Where a pipeline's component changed ([`PipelineOptions::upgraded_at`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradedAt {
    /// The step of the checkpoint, of the component before, that the new
    /// component's instances take their state from (the pipeline's last
    /// committed step when it changed).
    pub checkpoint: u64,
    /// The operators the new component starts empty (passed to `upgrade`).
    pub start_empty: Vec<String>,
    /// The operators rebuilt from the pipeline's input instead (`None`: no
    /// rebuild; an empty list: a rebuild for the switch's output only). A
    /// rebuild runs one instance of the new component through
    /// every committed step up to the checkpoint, from empty, and these
    /// operators take its state; every output port then gets, in the first
    /// step after the checkpoint, the difference between what the rebuild
    /// says it holds and what its log holds. Needs the input and those
    /// output logs untrimmed.
    pub rebuilt: Option<Vec<String>>,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        PipelineOptions {
            name: "pipeline".into(),
            max_batch: 10_000,
            checkpoint_every_steps: 100,
            checkpoint_interval: Duration::from_secs(10),
            inherit_guest_stderr: false,
            config: Vec::new(),
            max_output_per_step: None,
            incremental_checkpoints: true,
            check_output_json: false,
            placement_hint: Vec::new(),
            bad_records: BTreeMap::new(),
            replicas: 1,
            zones: BTreeMap::new(),
            own_host: None,
            upgraded_at: None,
            retain_input: false,
        }
    }
}

/// What a layout change moved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Relayout {
    /// W before.
    pub from: u32,
    /// W after.
    pub to: u32,
    /// Shards that changed owner.
    pub shards_moved: u32,
    /// Bytes of state handed from one worker to another.
    pub bytes_moved: u64,
    /// From the last step under the old layout to the first under the new
    /// one committed (the hand-off and that step).
    pub pause: Duration,
}

/// How many changes of [`Stats::committed_by`] a coordinator keeps.
pub const COMMITTED_BY_KEPT: usize = 16;

/// What a coordinator has done since it was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Checkpoint restored on open, if any.
    pub restored_checkpoint: Option<u64>,
    /// Steps replayed during recovery (outputs dropped as duplicates).
    pub replayed_steps: u64,
    /// Steps committed.
    pub steps: u64,
    /// Checkpoints committed.
    pub checkpoints: u64,
    /// Checkpoint writes that failed transiently (a store outage): the
    /// steps went on, the checkpoint was tried again later.
    pub checkpoint_failures: u64,
    /// Input events consumed by committed steps.
    pub events_in: u64,
    /// Of those, events the workers' hosts read from the logs themselves
    /// (only their offsets travelled).
    pub events_in_read_by_hosts: u64,
    /// Input events of the steps run (committed or not) that were read
    /// while the step before ran (a step of this process's own workers
    /// whose division was foreseen: every partition a whole batch on).
    pub events_read_ahead: u64,
    /// Output events committed.
    pub events_out: u64,
    /// Input records that are not events, skipped into their inputs'
    /// dead-letter logs by the steps committed (replays not counted).
    pub dead_letters: u64,
    /// Fuel the guests burned in steps (committed or not).
    pub fuel_used: u64,
    /// Layout changes made live (not replayed).
    pub relayouts: u64,
    /// Bytes of state pieces checkpoints wrote (carried pieces not
    /// counted).
    pub checkpoint_bytes_written: u64,
    /// Workers moved live to another host ([`Coordinator::replace_hosts`](crate::Coordinator::replace_hosts)).
    pub workers_moved: u64,
    /// How long opening took to restore the checkpoint (starting the
    /// instances included).
    pub restore_took: Duration,
    /// How long opening took to replay the steps after it.
    pub replay_took: Duration,
    /// Bytes of state the restore on open read where the worker runs,
    /// from that host's own copy (no download, no transfer).
    pub restored_local_bytes: u64,
    /// Bytes of state the restore on open fetched from the checkpoint
    /// store (or sent from this host to the worker's).
    pub restored_fetched_bytes: u64,
    /// Bytes of state checkpoints had other hosts write to the store
    /// themselves (part of `checkpoint_bytes_written`; they never reached
    /// this host).
    pub checkpoint_bytes_staged: u64,
    /// Followers started ([`PipelineOptions::replicas`]), each from its
    /// primary's state.
    pub replicas_built: u64,
    /// Bytes of state handed from primaries to the followers started.
    pub replica_bytes: u64,
    /// Followers' steps whose output hash was checked against their
    /// primary's (and found the same).
    pub replica_steps_checked: u64,
    /// Steps in which a follower took over from a failed primary (its host
    /// died, stalled or was cut off), counted per worker: the step went
    /// on, nothing was replayed.
    pub failovers: u64,
    /// Replicas dropped after they failed (their hosts lost), each
    /// replaced from a survivor's state before the next step.
    pub replicas_lost: u64,
    /// Instances this coordinator adopted when it opened: workers (and
    /// followers) an earlier coordinator left on the hosts, at the log's
    /// last step — nothing restored, nothing replayed (0: it restored).
    pub adopted: u64,
    /// Whose output was committed, step by step, as its changes: from step
    /// `.0` on, per worker, the address of the host of the replica whose
    /// output was committed (its primary; empty: the coordinator's own
    /// process), until the next entry. The last [`COMMITTED_BY_KEPT`]
    /// changes since the coordinator opened.
    pub committed_by: Vec<(u64, Vec<String>)>,
    /// Of the adoptions, steps this coordinator recorded when it opened:
    /// the one in flight when the coordinator before went, which every
    /// worker had computed (0 or 1).
    pub adopted_in_flight: u64,
}
