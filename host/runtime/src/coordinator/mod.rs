//! The coordinator: one per running pipeline. It owns the W workers and runs
//! the step protocol:
//!
//! 1. **divide**: fix each worker's end offsets for the step (at most
//!    `max_batch` events per partition);
//! 2. **run**: every worker reads its events and runs `step`, concurrently,
//!    exchanging keyed events through the [`Exchange`](crate::exchange::Exchange);
//! 3. **commit**: all outputs and the step record in one atomic, durable write;
//! 4. **checkpoint** every N steps or T seconds (and on [`finish`](Coordinator::finish));
//! 5. **trim** input below the newest checkpoint's frontier.
//!
//! [`Coordinator::open`] is also recovery: restore the newest checkpoint
//! (each piece of state back to the worker that held it), replay the steps
//! committed after it with their recorded divisions and layouts, comparing
//! output hashes (I4), then continue live.
//!
//! **Layouts.** Which worker owns each shard of the key space and reads
//! each input partition is the pipeline's [`Layout`].
//! [`Coordinator::rescale`] changes it between steps: the old owners hand the
//! moving shards off (`export-shards`), instances start or stop, the new
//! owners take the pieces (`restore`), and the next step commits the new
//! layout in its record — the change's commit point — followed by a
//! checkpoint. A replay meets the change at that record and makes the same
//! hand-off, so a crash anywhere recovers to the old layout (nothing
//! committed) or the new one, never a mix.
//!
//! The files of this module, in the order of a pipeline's life:
//! [`recovery`] (open: take over, restore, replay), [`step`] (divide, run,
//! commit), [`divided`] (steps whose shares other hosts commit),
//! [`checkpoint`] (snapshot, write, trim), [`relayout`] (rescale, move
//! workers between hosts), [`replicas`] (followers beside each worker,
//! checked every step); [`workers`] is what the coordinator drives and
//! [`options`] what it is opened with and reports.

mod adopt;
mod checkpoint;
mod divided;
mod options;
mod rebuild;
mod recovery;
mod relayout;
mod replicas;
mod seal;
mod step;
mod workers;

use crate::engine::{LoadedComponent, SluiceEngine};
use crate::error::Error;
use crate::exchange::Exchange;
use crate::hosts::{MeshPlan, RemoteHost};
use sluice_core::{Frontier, Layout, PartitionId, PipelineShape, StepLimits};
use sluice_storage::{Guarded, WorkerCommitter};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use workers::AnyWorker;

pub use options::{COMMITTED_BY_KEPT, PipelineOptions, Relayout, Stats, UpgradedAt};

/// The runtime of one pipeline.
pub struct Coordinator {
    /// The pipeline's storage, behind the invariant checks.
    storage: Arc<Guarded>,
    /// The pipeline's inputs, outputs and snapshot version, as stored.
    shape: PipelineShape,
    /// The component, to start instances for added workers.
    component: LoadedComponent,
    /// The engine (limits, pool) instances start in.
    engine: SluiceEngine,
    /// How the pipeline runs.
    options: PipelineOptions,
    /// This host's fencing epoch, stamped on every commit.
    epoch: u64,
    /// The deterministic limits new steps run (and are recorded) with.
    limits: StepLimits,
    /// Where the pipeline is in its steps.
    position: StepPosition,
    /// The layout, and where the workers run.
    placement: WorkerPlacement,
    /// The checkpoints taken, the one being written, and the base of the
    /// next.
    checkpoints: CheckpointState,
    /// What the coordinator has done since it opened.
    stats: Stats,
    /// The next step's input, read while the last step ran (a step of this
    /// process's own workers, committed whole, only).
    read_ahead: Option<step::ReadAhead>,
    /// Input batches its local workers stepped on, kept for the next reads.
    spare: crate::step_io::Spare,
    /// The last step's commit, still being written
    /// ([`Coordinator::step_overlapped`]).
    commit: Option<step::PendingCommit>,
}

/// Where a pipeline is in its steps.
struct StepPosition {
    /// The next step to run (the number of committed steps).
    next_step: u64,
    /// Each worker's frontier after the last committed step.
    frontiers: Vec<Frontier>,
    /// The time of the last step, so step times never go backwards.
    last_time_ms: u64,
    /// The chain hash of the last committed step's record, which the next
    /// record links to. While a step's commit is still being written (see
    /// [`Coordinator::step_overlapped`]) it is the record before that one's:
    /// the next record is built only once that commit is settled.
    prev: u128,
    /// Input events the last executed step read.
    events_read: u64,
    /// Of those, read by the workers' hosts.
    events_read_by_hosts: u64,
    /// After an upgrade that rebuilt operators: the step that carries the
    /// switch's output (the first after the upgrade's checkpoint) and what
    /// it adds to each output port ([`rebuild`]).
    switch_output: Option<(u64, Vec<Vec<sluice_core::Event>>)>,
    /// Each worker's input ends as the last division saw them: a read
    /// ahead takes a batch shorter than a whole one only where its input
    /// has not grown since (most likely the tail of a finished input).
    input_ends: Vec<Frontier>,
}

impl StepPosition {
    /// Before the first step: every worker at the start of what it reads.
    fn start(frontiers: Vec<Frontier>) -> Self {
        StepPosition {
            next_step: 0,
            frontiers,
            last_time_ms: 0,
            prev: 0,
            events_read: 0,
            events_read_by_hosts: 0,
            switch_output: None,
            input_ends: Vec::new(),
        }
    }
}

/// The layout a pipeline's instances are in, and where its workers run.
struct WorkerPlacement {
    /// The layout the instances are in.
    layout: Layout,
    /// The layout changed since the last committed step: the next step
    /// commits it.
    relayout_pending: bool,
    /// Per worker, the partitions it reads, with the input log name.
    owned: Vec<Vec<(PartitionId, String)>>,
    /// The workers' instances, here or on their hosts (`None` after a
    /// failure: a reopen restores them) — with replicas, their primaries.
    instances: Vec<Option<AnyWorker>>,
    /// Each worker's followers: replicas on other slots stepping beside
    /// its primary ([`PipelineOptions::replicas`]; empty without).
    followers: Vec<Vec<replicas::Follower>>,
    /// Replicas were lost or a follower took over in the last step: the
    /// next one first heals the placement.
    heal_pending: bool,
    /// …but not before this step (a coordinator that adopted its workers
    /// commits a step before it rebuilds the followers that died with the
    /// coordinator before it).
    heal_not_before: u64,
    /// The outputs of the last divided step that followers in this process
    /// computed, by worker: committed here if the primary's host fails to.
    held_here: Vec<(usize, crate::step_io::WorkerOutput)>,
    /// The other hosts running workers.
    hosts: Vec<Arc<RemoteHost>>,
    /// The slot of each worker: 0 this process, `i` `hosts[i - 1]`.
    slots: Vec<u32>,
    /// Where the workers run, as the hosts are told.
    mesh: MeshPlan,
    /// The exchange of this process's workers.
    exchange: Arc<Exchange>,
    /// This host's holders of workers whose shares of divided steps it
    /// commits ([`LogBackend::take_worker`](sluice_storage::LogBackend::take_worker)),
    /// taken on first use and dropped when the worker's host commits them.
    committers: Vec<Option<Box<dyn WorkerCommitter>>>,
}

impl WorkerPlacement {
    /// Drops every instance after a failure: instances stopped mid-call
    /// cannot be trusted (or re-entered), and continuing with state that
    /// may not match the log could lose or repeat a step. Reopening
    /// restores them.
    fn drop_instances(&mut self) {
        self.instances.iter_mut().for_each(|i| *i = None);
        self.followers.clear();
    }
}

/// The checkpoints of a pipeline: the newest committed, the one being
/// written, what the next may be incremental to.
struct CheckpointState {
    /// The step of the newest checkpoint restored or committed.
    step: Option<u64>,
    /// When the last checkpoint started.
    last_at: Instant,
    /// How long the last checkpoint took.
    last_took: Duration,
    /// How much of it taking the snapshots took (the rest: writing, trim).
    last_snapshots: Duration,
    /// A checkpoint whose snapshots are taken and whose write (and trim)
    /// runs in the background while steps go on.
    pending: Option<PendingCheckpoint>,
    /// What the next checkpoint may be incremental to; `None` forces a
    /// full one (none yet, a layout change, a failed checkpoint, or
    /// incremental checkpoints turned off).
    base: Option<Base>,
    /// Set while checkpoint writes fail (a store outage).
    behind: Option<CheckpointsBehind>,
}

/// How a checkpoint's background write ended.
enum Written {
    /// Committed, and the input it covers trimmed.
    Done,
    /// Committed, but the trim after it failed (the next checkpoint trims).
    Untrimmed(Error),
    /// Not committed.
    Failed(Error),
}

/// Checkpoints that could not be written: when it began and why.
struct CheckpointsBehind {
    /// The step of the first checkpoint that failed.
    since_step: u64,
    /// Writes failed since.
    failures: u64,
    /// What the status says.
    reason: String,
    /// No checkpoint is tried before this.
    retry_at: Instant,
}

impl CheckpointState {
    /// No checkpoint yet.
    fn none() -> Self {
        CheckpointState {
            step: None,
            last_at: Instant::now(),
            last_took: Duration::ZERO,
            last_snapshots: Duration::ZERO,
            pending: None,
            base: None,
            behind: None,
        }
    }
}

/// A checkpoint being written in the background.
struct PendingCheckpoint {
    step: u64,
    started: Instant,
    snapshots: Duration,
    /// Its pieces, `(shard, worker)`, written or carried: the base of the
    /// next incremental checkpoint once it is committed.
    pieces: BTreeSet<(u32, u32)>,
    /// Whether, once committed, it is the base of the next incremental
    /// checkpoint: not when an instance whose snapshot it does not hold
    /// took a worker over meanwhile (a follower promoted: its changes
    /// count from its own start, not from this checkpoint).
    base: bool,
    write: tokio::task::JoinHandle<Written>,
}

/// The committed checkpoint the instances' state was last snapshotted for
/// (or restored from): an incremental checkpoint carries its pieces of the
/// shards that did not change since.
#[derive(Debug, Clone)]
struct Base {
    step: u64,
    /// Its pieces, `(shard, worker)`.
    pieces: BTreeSet<(u32, u32)>,
}

impl Coordinator {
    /// Drops the coordinator as the death of its process would: its
    /// connections to the hosts just end (no worker there is told to
    /// stop), so the hosts keep their workers for the next coordinator to
    /// adopt; its own instances are gone. A step's commit still being
    /// written ([`step_overlapped`](Self::step_overlapped)) goes on in the
    /// background, as a dying process's last write may reach the disk. For
    /// fault campaigns and tests — a coordinator that stops on purpose
    /// [`finish`](Self::finish)es.
    pub fn crash(self) {
        for h in &self.placement.hosts {
            h.sever();
        }
    }

    /// The step of the newest checkpoint this coordinator restored or took.
    pub fn checkpointed_step(&self) -> Option<u64> {
        self.checkpoints.step
    }

    /// The hosts' zones from now on ([`PipelineOptions::zones`]): where the
    /// followers built from now on go (those running stay where they are).
    pub fn set_zones(&mut self, zones: std::collections::BTreeMap<String, String>) {
        self.options.zones = zones;
    }

    /// Turns incremental checkpoints on or off from the next checkpoint on
    /// (see [`PipelineOptions::incremental_checkpoints`]).
    pub fn set_incremental_checkpoints(&mut self, on: bool) {
        self.options.incremental_checkpoints = on;
    }

    /// How long the last checkpoint took (snapshots, write and trim).
    pub fn last_checkpoint_time(&self) -> Duration {
        self.checkpoints.last_took
    }

    /// Of the last checkpoint's time, how much taking the snapshots took
    /// (the rest is the durable write and the trim).
    pub fn last_checkpoint_snapshots(&self) -> Duration {
        self.checkpoints.last_snapshots
    }

    /// What the coordinator has done since it opened.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The next step to run (the number of committed steps).
    pub fn next_step(&self) -> u64 {
        self.position.next_step
    }

    /// Each worker's current frontier.
    pub fn frontiers(&self) -> &[Frontier] {
        &self.position.frontiers
    }

    /// The address of each worker's host ([`RemoteHost::addr`]), empty for
    /// this process: the hint a coordinator opened after this one fails
    /// takes ([`PipelineOptions::placement_hint`]).
    pub fn placement_addrs(&self) -> Vec<String> {
        self.placement
            .slots
            .iter()
            .map(|slot| self.slot_addr(*slot))
            .collect()
    }

    /// The address of the host on `slot`, empty for this process.
    fn slot_addr(&self, slot: u32) -> String {
        match slot as usize {
            0 => String::new(),
            s => self
                .placement
                .hosts
                .get(s - 1)
                .map(|h| h.addr().to_owned())
                .unwrap_or_default(),
        }
    }

    /// The storage the coordinator commits to.
    pub fn storage(&self) -> &Arc<Guarded> {
        &self.storage
    }

    /// The layout the pipeline runs under.
    pub fn layout(&self) -> &Layout {
        &self.placement.layout
    }

    /// The number of workers W.
    pub fn workers(&self) -> u32 {
        self.placement.layout.workers
    }
}
