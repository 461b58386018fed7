//! The coordinator: one per running pipeline. It owns the W workers and runs
//! the step protocol:
//!
//! 1. **divide**: fix each worker's end offsets for the step (at most
//!    `max_batch` events per partition);
//! 2. **run**: every worker reads its events and runs `step`, concurrently,
//!    exchanging keyed events through the [`Exchange`];
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

use crate::bindings::Batch;
use crate::engine::{LoadedComponent, SluiceEngine};
use crate::error::{Error, GuestError, Result};
use crate::exchange::Exchange;
use crate::remote::{
    AnyWorker, MeshPlan, RemoteHost, RemoteWorker, ShareSpec, Stepped, coordinator_exchange,
    place_one, replace_placement, round_robin,
};
use crate::worker::{Worker, WorkerInfo};
use serde::{Deserialize, Serialize};
use sluice_core::crash::{CrashPoint, crash_point};
use sluice_core::{
    ConfigError, Event, Frontier, Layout, OutputEntry, PartitionId, PipelineShape, SHARDS,
    StepCommit, StepLimits, StepRecord, hash_outputs,
};
use sluice_storage::{
    Carried, Checkpoint, CheckpointMeta, Guarded, ReadBytes, Staged, StatePiece, WorkerCommit,
    WorkerCommitter,
};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// more fails the step with [`GuestError::OutputLimit`].
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
    /// (as [`RemoteHost::addr`]), empty for the coordinator's own process —
    /// what [`Coordinator::placement_addrs`] returned. Opening on hosts
    /// then keeps every worker whose host is among them where it was (its
    /// host restores it from its own copy of the checkpoint) and spreads
    /// only the others, as [`Coordinator::replace_hosts`] does. Empty (or
    /// of another W): workers are dealt round robin.
    pub placement_hint: Vec<String>,
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
    /// Input events consumed by committed steps.
    pub events_in: u64,
    /// Of those, events the workers' hosts read from the logs themselves
    /// (only their offsets travelled).
    pub events_in_read_by_hosts: u64,
    /// Output events committed.
    pub events_out: u64,
    /// Fuel the guests burned in steps (committed or not).
    pub fuel_used: u64,
    /// Layout changes made live (not replayed).
    pub relayouts: u64,
    /// Bytes of state pieces checkpoints wrote (carried pieces not
    /// counted).
    pub checkpoint_bytes_written: u64,
    /// Workers moved live to another host ([`Coordinator::replace_hosts`]).
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
}

/// A placement hint entry for a worker no host prefers.
const UNPLACED: &str = "?";

/// Where each of `workers` workers has most of its state in committed
/// checkpoint `step` in a host's own copy: this process (empty), a host's
/// address, or [`UNPLACED`]; empty when no host has any (deal round
/// robin). A host that cannot answer counts as having none.
async fn locality_hint(
    storage: &Arc<Guarded>,
    hosts: &[Arc<RemoteHost>],
    step: u64,
    workers: u32,
) -> Vec<String> {
    let mut best: Vec<(u64, Option<String>)> = vec![(0, None); workers as usize];
    let mut offer = |held: Vec<(u32, u64)>, addr: &str| {
        for (w, bytes) in held {
            if let Some(b) = best.get_mut(w as usize)
                && bytes > b.0
            {
                *b = (bytes, Some(addr.to_owned()));
            }
        }
    };
    let s = storage.clone();
    if let Ok(held) = blocking(move || s.checkpoints().local_bytes(step)).await {
        offer(held, "");
    }
    let mut asked = tokio::task::JoinSet::new();
    for h in hosts {
        let h = h.clone();
        asked.spawn(async move { (h.locality(step).await, h) });
    }
    while let Some(Ok((held, h))) = asked.join_next().await {
        match held {
            Ok(held) => offer(held, h.addr()),
            Err(e) => tracing::debug!(host = %h.addr(), error = %e, "no locality from a host"),
        }
    }
    if best.iter().all(|(_, a)| a.is_none()) {
        return Vec::new();
    }
    best.into_iter()
        .map(|(_, a)| a.unwrap_or_else(|| UNPLACED.to_owned()))
        .collect()
}

/// The first placement of `workers` workers on this process and `hosts`:
/// where `hint` says they ran, for those whose host is among `hosts` (the
/// others spread to the least loaded, then balanced), or round robin
/// without a hint of this W.
fn placement_from_hint(hint: &[String], workers: u32, hosts: &[Arc<RemoteHost>]) -> Vec<u32> {
    if hint.len() != workers as usize {
        return round_robin(workers, hosts.len());
    }
    let mut before: Vec<&str> = Vec::new();
    let slots: Vec<u32> = hint
        .iter()
        .map(|addr| {
            if addr.is_empty() {
                return 0;
            }
            let i = before.iter().position(|a| a == addr).unwrap_or_else(|| {
                before.push(addr);
                before.len() - 1
            });
            i as u32 + 1
        })
        .collect();
    let now: Vec<&str> = hosts.iter().map(|h| h.addr()).collect();
    replace_placement(&slots, &before, &now)
}

/// Restores worker `w` from its pieces of committed checkpoint `step`:
/// `pieces` when they were read here already; otherwise on its host, from
/// the store there, when it is remote (the caller checked its host
/// reaches the store), or read here.
async fn restore_worker(
    worker: &mut AnyWorker,
    storage: &Arc<Guarded>,
    pieces: Option<Vec<StatePiece>>,
    step: u64,
    w: u32,
) -> Result<ReadBytes> {
    let (pieces, mut read) = match pieces {
        Some(pieces) => {
            let local = pieces.iter().map(|p| p.state.len() as u64).sum();
            (pieces, ReadBytes { local, fetched: 0 })
        }
        None => {
            if let AnyWorker::Remote(r) = worker {
                match r.restore_from(step).await? {
                    Ok(read) => return Ok(read),
                    // Its host cannot read the store (its instance is
                    // untouched): the pieces are read here and sent.
                    Err(why) => tracing::warn!(
                        host = %r.host().addr(),
                        worker = w,
                        error = %why,
                        "a host could not read its worker's checkpoint pieces: they are sent"
                    ),
                }
            }
            let s = storage.clone();
            blocking(move || s.checkpoints().worker_pieces(step, w))
                .await?
                .ok_or_else(|| sluice_storage::StorageError::Corrupt {
                    what: format!("checkpoint of step {step}"),
                    message: "its pieces are missing".into(),
                })?
        }
    };
    if let AnyWorker::Remote(_) = worker {
        // Read here, they travel to the worker's host.
        read.fetched += std::mem::take(&mut read.local);
    }
    if !pieces.is_empty() {
        worker
            .restore(pieces.into_iter().map(|p| (p.shard, p.state)).collect())
            .await?;
    }
    Ok(read)
}

/// What a worker steps on.
enum StepInput {
    /// Its input, read here.
    Batches(Vec<Batch>),
    /// The offsets its host reads; with a share, the host also commits the
    /// worker's share of the (divided) step.
    Read(Vec<InputRange>, Option<ShareSpec>),
}

/// What taking one worker's part of a checkpoint gave.
enum Taken {
    /// Its pieces, here.
    Pieces(crate::worker::Snapshot),
    /// Its host wrote them to the store.
    Staged(Staged, Option<Vec<u32>>),
}

/// One worker's output of one step.
pub(crate) struct WorkerOutput {
    /// Events per output port.
    pub ports: Vec<Vec<Event>>,
    pub hash: u128,
    /// Its host committed it, as the worker's share of a divided step:
    /// `ports` is empty, this many events went out.
    pub shared: Option<u64>,
}

/// A checkpoint being written in the background.
struct PendingCheckpoint {
    step: u64,
    started: Instant,
    snapshots: Duration,
    /// Its pieces, `(shard, worker)`, written or carried: the base of the
    /// next incremental checkpoint once it is committed.
    pieces: BTreeSet<(u32, u32)>,
    write: tokio::task::JoinHandle<Result<()>>,
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

/// The runtime of one pipeline.
pub struct Coordinator {
    storage: Arc<Guarded>,
    shape: PipelineShape,
    /// The layout the instances are in.
    layout: Layout,
    /// The layout changed since the last committed step: the next step
    /// commits it.
    relayout_pending: bool,
    /// The component, to start instances for added workers.
    component: LoadedComponent,
    /// The engine (limits, pool) instances start in.
    engine: SluiceEngine,
    outputs: Vec<String>,
    /// Per worker, the partitions it reads, with the input log name.
    owned: Vec<Vec<(PartitionId, String)>>,
    options: PipelineOptions,
    exchange: Arc<Exchange>,
    /// Where the workers run, as the hosts are told.
    mesh: MeshPlan,
    instances: Vec<Option<AnyWorker>>,
    /// The other hosts running workers.
    hosts: Vec<Arc<RemoteHost>>,
    /// The slot of each worker: 0 this process, `i` `hosts[i - 1]`.
    placement: Vec<u32>,
    next_step: u64,
    frontiers: Vec<Frontier>,
    checkpointed_step: Option<u64>,
    last_checkpoint_at: Instant,
    snapshot_version: u32,
    /// This host's fencing epoch, stamped on every commit.
    epoch: u64,
    /// The time of the last step, so step times never go backwards.
    last_time_ms: u64,
    /// The deterministic limits new steps run (and are recorded) with.
    limits: StepLimits,
    /// The chain hash of the last committed step's record, which the next
    /// record links to.
    prev: u128,
    /// Input events the last executed step read.
    events_read: u64,
    /// Of those, read by the workers' hosts.
    events_read_there: u64,
    /// How long the last checkpoint took.
    last_checkpoint_took: Duration,
    /// How much of it taking the snapshots took (the rest: writing, trim).
    last_checkpoint_snapshots: Duration,
    /// A checkpoint whose snapshots are taken and whose write (and trim)
    /// runs in the background while steps go on.
    pending: Option<PendingCheckpoint>,
    /// What the next checkpoint may be incremental to; `None` forces a
    /// full one (none yet, a layout change, a failed checkpoint, or
    /// incremental checkpoints turned off).
    base: Option<Base>,
    stats: Stats,
    /// This host's holders of workers whose shares of divided steps it
    /// commits ([`LogBackend::take_worker`](sluice_storage::LogBackend::take_worker)),
    /// taken on first use and dropped when the worker's host commits them.
    committers: Vec<Option<Box<dyn WorkerCommitter>>>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs blocking storage work off the async workers.
async fn blocking<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> Result<T>
where
    T: Send + 'static,
    E: Into<Error> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(Error::task("a storage task"))?
        .map_err(Into::into)
}

impl Coordinator {
    /// Starts the workers of the pipeline stored in `storage` and recovers
    /// its state: takes a new fencing epoch, restores the newest checkpoint,
    /// then replays committed steps after it.
    pub async fn open(
        engine: &SluiceEngine,
        component: &LoadedComponent,
        storage: Arc<Guarded>,
        options: PipelineOptions,
    ) -> Result<Self> {
        Self::open_on(engine, component, storage, options, Vec::new()).await
    }

    /// [`open`](Self::open), running workers on other hosts too: worker `w`
    /// runs on slot `w mod (hosts.len() + 1)` — slot 0 this process, slot
    /// `i` `hosts[i - 1]` (connected with [`RemoteHost::connect`]). A step
    /// fails if a host fails; reopening on the hosts still alive recovers.
    pub async fn open_on(
        engine: &SluiceEngine,
        component: &LoadedComponent,
        storage: Arc<Guarded>,
        options: PipelineOptions,
        hosts: Vec<Arc<RemoteHost>>,
    ) -> Result<Self> {
        let opened = Instant::now();
        let shape = storage.shape().clone();
        if shape.workers == 0 {
            return Err(ConfigError::NoWorkers.into());
        }
        let (checkpoint, epoch) = {
            let s = storage.clone();
            // Take over the pipeline: a new epoch fences any older host.
            blocking(move || {
                let epoch = s.fence()?;
                Ok::<_, Error>((s.checkpoints().latest_meta()?, epoch))
            })
            .await?
        };
        let layout = match &checkpoint {
            Some(meta) => meta.layout.clone(),
            None => Layout::initial(&shape),
        };
        layout
            .validate(&shape)
            .map_err(|m| ConfigError::Invalid(format!("the checkpoint's layout: {m}")))?;
        // Without a hint (a new leader), workers go where their state is:
        // the host with most of a worker's pieces in its own copy.
        let hint = match &checkpoint {
            Some(meta) if options.placement_hint.is_empty() && !hosts.is_empty() => {
                locality_hint(&storage, &hosts, meta.step, layout.workers).await
            }
            _ => options.placement_hint.clone(),
        };
        let placement = placement_from_hint(&hint, layout.workers, &hosts);
        let (exchange, mesh) = coordinator_exchange(&layout, &hosts, &placement)?;
        let limits = StepLimits {
            fuel_per_call: engine.limits().fuel_per_call,
            memory: engine.limits().memory as u64,
        };
        let mut instances = Vec::with_capacity(layout.workers as usize);
        for w in 0..layout.workers {
            let worker = Self::start_worker(
                engine,
                component,
                &options,
                &hosts,
                limits,
                w,
                layout.workers,
                &exchange,
                &mesh,
            )
            .await?;
            instances.push(Some(worker));
        }
        let owned = layout.assignment(&shape);
        let mut c = Coordinator {
            storage,
            outputs: shape.outputs.clone(),
            frontiers: owned
                .iter()
                .map(|ps| ps.iter().map(|(id, _)| (*id, 0)).collect())
                .collect(),
            owned,
            snapshot_version: shape.snapshot_version,
            shape,
            layout,
            relayout_pending: false,
            component: component.clone(),
            engine: engine.with_limits(engine.limits()),
            options,
            exchange,
            mesh,
            instances,
            hosts,
            placement,
            next_step: 0,
            checkpointed_step: None,
            last_checkpoint_at: Instant::now(),
            epoch,
            last_time_ms: 0,
            limits,
            prev: 0,
            events_read: 0,
            events_read_there: 0,
            last_checkpoint_took: Duration::ZERO,
            last_checkpoint_snapshots: Duration::ZERO,
            pending: None,
            base: None,
            stats: Stats::default(),
            committers: Vec::new(),
        };
        if let Some(meta) = checkpoint {
            if meta.frontiers.len() != c.layout.workers as usize {
                return Err(ConfigError::WorkersChanged {
                    stored: meta.frontiers.len() as u32,
                    wanted: c.layout.workers,
                }
                .into());
            }
            // Every piece goes back to the worker that held it, so the
            // replay runs on exactly the state the steps ran on.
            let step = meta.step;
            let missing = || sluice_storage::StorageError::Corrupt {
                what: format!("checkpoint of step {step}"),
                message: "its pieces are missing".into(),
            };
            // A worker whose host reaches this pipeline's checkpoint store
            // reads its own pieces there (from that host's own copy when it
            // wrote them); the others' are read here — from a store only
            // this host sees, all at once.
            let location = c.storage.checkpoints().location();
            let there: Vec<bool> = c
                .instances
                .iter()
                .map(|i| match i {
                    Some(AnyWorker::Remote(r)) => {
                        location.is_some() && r.store() == location.as_deref()
                    }
                    _ => false,
                })
                .collect();
            let s = c.storage.clone();
            let (keys, mut here): (Vec<(u32, u32)>, Option<Vec<StatePiece>>) =
                // A shared store is read worker by worker (telling what came
                // from this host's copy); this host's own store at once.
                if location.is_some() || there.iter().any(|t| *t) {
                    let keys = blocking(move || s.checkpoints().keys(step)).await?;
                    (keys.ok_or_else(missing)?, None)
                } else {
                    let pieces = blocking(move || s.checkpoints().pieces(step, None)).await?;
                    let pieces = pieces.ok_or_else(missing)?;
                    (
                        pieces.iter().map(|p| (p.shard, p.worker)).collect(),
                        Some(pieces),
                    )
                };
            if let Some((_, w)) = keys.iter().find(|(_, w)| *w >= c.layout.workers) {
                return Err(sluice_storage::StorageError::Corrupt {
                    what: format!("checkpoint of step {step}"),
                    message: format!("a piece of worker {w} of {}", c.layout.workers),
                }
                .into());
            }
            // Restored as they lie, the pieces are what the instances'
            // next incremental snapshot is relative to (a piece of the
            // format before shards is not: it is rewritten whole).
            if keys.iter().all(|(shard, _)| *shard < SHARDS) {
                c.base = Some(Base {
                    step,
                    pieces: keys.iter().copied().collect(),
                });
            }
            // The instances restore side by side (each on its own task).
            let mut tasks = Vec::with_capacity(c.instances.len());
            for w in 0..c.layout.workers {
                let Some(mut worker) = c.instances[w as usize].take() else {
                    continue;
                };
                let storage = c.storage.clone();
                let mine: Option<Vec<StatePiece>> = here.as_mut().map(|all| {
                    let (mine, rest) = std::mem::take(all).into_iter().partition(|p| p.worker == w);
                    *all = rest;
                    mine
                });
                tasks.push((
                    w,
                    tokio::spawn(async move {
                        let r = restore_worker(&mut worker, &storage, mine, step, w).await;
                        (worker, r)
                    }),
                ));
            }
            let mut failure = None;
            for (w, task) in tasks {
                match task.await {
                    Ok((worker, r)) => {
                        c.instances[w as usize] = Some(worker);
                        match r {
                            Ok(read) => {
                                c.stats.restored_local_bytes += read.local;
                                c.stats.restored_fetched_bytes += read.fetched;
                            }
                            Err(e) => failure = failure.or(Some(e)),
                        }
                    }
                    Err(e) => failure = failure.or(Some(Error::task(format!("worker {w}"))(e))),
                }
            }
            if let Some(e) = failure {
                return Err(e);
            }
            c.frontiers = meta.frontiers.clone();
            c.next_step = meta.step + 1;
            c.checkpointed_step = Some(meta.step);
            c.stats.restored_checkpoint = Some(meta.step);
        }
        c.stats.restore_took = opened.elapsed();
        c.check_input_reachable().await?;
        let replaying = Instant::now();
        c.replay().await?;
        c.stats.replay_took = replaying.elapsed();
        tracing::debug!(
            pipeline = %c.options.name,
            restored = ?c.stats.restored_checkpoint,
            replayed = c.stats.replayed_steps,
            workers = c.layout.workers,
            "recovered"
        );
        Ok(c)
    }

    /// Starts the instance of worker `w` of `workers`, on its host.
    #[allow(clippy::too_many_arguments)]
    async fn start_worker(
        engine: &SluiceEngine,
        component: &LoadedComponent,
        options: &PipelineOptions,
        hosts: &[Arc<RemoteHost>],
        limits: StepLimits,
        w: u32,
        workers: u32,
        exchange: &Arc<Exchange>,
        mesh: &MeshPlan,
    ) -> Result<AnyWorker> {
        let info = WorkerInfo {
            worker: w,
            workers,
            pipeline: options.name.clone(),
            config: options.config.clone(),
        };
        let slot = mesh.slot(w) as usize;
        if slot > 0 {
            let host = hosts[slot - 1].clone();
            return Ok(AnyWorker::Remote(
                RemoteWorker::start(
                    host,
                    info,
                    &component.hash,
                    mesh,
                    limits,
                    options.inherit_guest_stderr,
                )
                .await?,
            ));
        }
        Ok(AnyWorker::Local(Box::new(
            Worker::start(
                engine,
                component,
                info,
                Some(exchange.clone()),
                options.inherit_guest_stderr,
            )
            .await?,
        )))
    }

    /// Changes the layout to one of `workers` workers (a sticky rebalance:
    /// only the shards the new balance needs move): hands the moving shards
    /// off between the instances, starts or stops instances, commits the
    /// next step (with whatever input there is, maybe none) with the new
    /// layout in its record, and checkpoints. Returns what moved, or `None`
    /// when the pipeline already has `workers` workers.
    pub async fn rescale(&mut self, workers: u32) -> Result<Option<Relayout>> {
        if workers == 0 {
            return Err(ConfigError::NoWorkers.into());
        }
        if workers == self.layout.workers {
            return Ok(None);
        }
        self.await_checkpoint().await?;
        let started = Instant::now();
        let next = self.layout.rebalance(workers);
        let from = self.layout.workers;
        let shards_moved = self.layout.moves(&next).len() as u32;
        let bytes_moved = self.relayout(next).await?;
        self.relayout_pending = true;
        self.step_with(true).await?;
        let pause = started.elapsed();
        crash_point(CrashPoint::AfterRelayout);
        self.checkpoint().await?;
        self.stats.relayouts += 1;
        tracing::info!(
            pipeline = %self.options.name,
            from,
            to = workers,
            shards_moved,
            bytes_moved,
            ?pause,
            "layout changed"
        );
        Ok(Some(Relayout {
            from,
            to: workers,
            shards_moved,
            bytes_moved,
            pause,
        }))
    }

    /// Moves the instances to layout `next`: every old owner of a moving
    /// shard exports it (a removed worker exports everything it holds),
    /// removed instances stop, added ones start, every instance learns the
    /// new layout, and the new owners take the pieces. The frontiers follow
    /// the partitions to their new readers. Returns the bytes handed off.
    ///
    /// The same procedure runs live and when a replay meets the change, so
    /// both end in the same state. On failure the instances are dropped
    /// (recovery restores a state that matches the log).
    async fn relayout(&mut self, next: Layout) -> Result<u64> {
        let r = self.relayout_inner(next).await;
        if r.is_err() {
            self.instances.iter_mut().for_each(|i| *i = None);
        }
        r
    }

    async fn relayout_inner(&mut self, next: Layout) -> Result<u64> {
        // Pieces move between workers: the next checkpoint is whole.
        self.base = None;
        next.validate(&self.shape)
            .map_err(|m| ConfigError::Invalid(format!("layout {}: {m}", next.epoch)))?;
        let old = std::mem::replace(&mut self.layout, next.clone());
        let mut moving: Vec<Vec<u32>> = vec![Vec::new(); old.workers as usize];
        for (shard, from, _) in old.moves(&next) {
            moving[from as usize].push(shard);
        }
        let all: Vec<u32> = (0..SHARDS).collect();
        let mut handed: Vec<(u32, u32, Vec<u8>)> = Vec::new();
        for w in 0..old.workers {
            let shards = if w >= next.workers {
                &all
            } else {
                &moving[w as usize]
            };
            if shards.is_empty() {
                continue;
            }
            let worker = self.instances[w as usize]
                .as_mut()
                .ok_or(Error::WorkersLost)?;
            for (shard, state) in worker.export_shards(shards).await? {
                handed.push((w, shard, state));
            }
        }
        crash_point(CrashPoint::MidHandoff);
        self.instances.truncate(next.workers as usize);
        self.placement.truncate(next.workers as usize);
        while self.placement.len() < next.workers as usize {
            let slot = place_one(&self.placement, self.hosts.len() + 1);
            self.placement.push(slot);
        }
        (self.exchange, self.mesh) = coordinator_exchange(&next, &self.hosts, &self.placement)?;
        for slot in self.instances.iter_mut() {
            let worker = slot.as_mut().ok_or(Error::WorkersLost)?;
            worker
                .relayout(next.workers, &self.exchange, &self.mesh)
                .await?;
        }
        for w in old.workers..next.workers {
            let worker = Self::start_worker(
                &self.engine,
                &self.component,
                &self.options,
                &self.hosts,
                self.limits,
                w,
                next.workers,
                &self.exchange,
                &self.mesh,
            )
            .await?;
            self.instances.push(Some(worker));
        }
        // The live instances' deterministic limits hold for added ones too.
        self.set_limits(self.limits);
        let bytes_moved = handed.iter().map(|(_, _, s)| s.len() as u64).sum();
        let mut per_worker: Vec<Vec<(u32, Vec<u8>)>> = vec![Vec::new(); next.workers as usize];
        // In (source worker, shard) order: the same on every run.
        for (_, shard, state) in handed {
            per_worker[next.owner(shard) as usize].push((shard, state));
        }
        for (w, pieces) in per_worker.into_iter().enumerate() {
            if !pieces.is_empty() {
                let worker = self.instances[w].as_mut().ok_or(Error::WorkersLost)?;
                worker.restore(pieces).await?;
            }
        }
        let offsets: Vec<(PartitionId, u64)> = self
            .frontiers
            .iter()
            .flatten()
            .map(|(id, o)| (*id, *o))
            .collect();
        self.owned = next.assignment(&self.shape);
        self.frontiers = vec![Frontier::new(); next.workers as usize];
        for (id, offset) in offsets {
            let reader = next.reader(id.input, id.partition).ok_or_else(|| {
                ConfigError::Invalid(format!("layout {} has no reader of {id:?}", next.epoch))
            })?;
            self.frontiers[reader as usize].insert(id, offset);
        }
        for (w, parts) in self.owned.iter().enumerate() {
            for (id, _) in parts {
                self.frontiers[w].entry(*id).or_insert(0);
            }
        }
        Ok(bytes_moved)
    }

    /// Reads the record of committed step `step` (a future that holds no
    /// borrow of the coordinator, whose instances are not `Sync`).
    fn record(&self, step: u64) -> impl Future<Output = Result<StepRecord>> + use<> {
        let s = self.storage.clone();
        async move {
            blocking(move || s.log().step_record(step))
                .await?
                .ok_or_else(|| {
                    sluice_storage::StorageError::Corrupt {
                        what: "step log".into(),
                        message: format!("the record of committed step {step} is missing"),
                    }
                    .into()
                })
        }
    }

    /// Replays the steps committed after the restored state, each under the
    /// limits it ran with, checking that each produces the committed output
    /// (by hash) and dropping it. Step times continue from the last
    /// committed step's, whatever the wall clock says now.
    async fn replay(&mut self) -> Result<()> {
        let s = self.storage.clone();
        let last = blocking(move || s.log().last_step()).await?;
        let Some(last) = last else { return Ok(()) };
        let last_record = self.record(last).await?;
        self.last_time_ms = self.last_time_ms.max(last_record.time_ms);
        self.prev = last_record.chain_hash();
        let live = self.limits;
        while self.next_step <= last {
            let step = self.next_step;
            let record = self.record(step).await?;
            if let Some(next) = record.layout.clone() {
                // The step runs under a new layout: make the same hand-off
                // the live run made before it.
                self.relayout(next).await?;
            }
            self.set_limits(record.limits);
            if record.is_division() {
                // Every worker's share is committed unless its done record
                // exists (then checked against it): a step its leader left
                // incomplete completes here.
                self.take_holders().await?;
                let outputs = self
                    .execute(&record.frontiers, step, record.time_ms, Commit::Now)
                    .await?;
                self.commit_shares(step, &record.frontiers, outputs, Commit::Now)
                    .await?;
                self.frontiers = record.frontiers;
                self.next_step += 1;
                self.stats.replayed_steps += 1;
                crash_point(CrashPoint::DuringReplay);
                continue;
            }
            let outputs = self
                .execute(&record.frontiers, step, record.time_ms, Commit::Whole)
                .await?;
            for (w, (out, committed)) in outputs.iter().zip(&record.output_hashes).enumerate() {
                if out.hash != *committed {
                    self.instances.iter_mut().for_each(|i| *i = None);
                    return Err(Error::Nondeterministic {
                        step,
                        worker: w as u32,
                        committed: format!("{committed:032x}"),
                        replayed: format!("{:032x}", out.hash),
                    });
                }
            }
            self.frontiers = record.frontiers;
            self.next_step += 1;
            self.stats.replayed_steps += 1;
            crash_point(CrashPoint::DuringReplay);
        }
        self.set_limits(live);
        Ok(())
    }

    /// Sets the deterministic limits of every instance (a record without
    /// them, all zero, keeps the current ones).
    fn set_limits(&mut self, limits: StepLimits) {
        if limits == StepLimits::default() {
            return;
        }
        for worker in self.instances.iter_mut().flatten() {
            worker.set_step_limits(limits);
        }
    }

    /// Checks that the input the recovered state goes on from is still
    /// there: where a checkpoint this host does not have trimmed it (another
    /// host's, with another data directory), say so, instead of failing on
    /// the first read.
    fn check_input_reachable(&self) -> impl Future<Output = Result<()>> + use<> {
        let (storage, owned, from) = (
            self.storage.clone(),
            self.owned.clone(),
            self.frontiers.clone(),
        );
        let restored = self.checkpointed_step;
        blocking(move || {
            for (w, parts) in owned.iter().enumerate() {
                for (id, name) in parts {
                    let (low, _) = storage.log().watermarks(name, id.partition)?;
                    let at = from[w].get(id).copied().unwrap_or(0);
                    if at < low {
                        return Err(Error::CheckpointElsewhere {
                            input: name.clone(),
                            partition: id.partition,
                            trimmed_below: low,
                            restored,
                            resumes_at: at,
                        });
                    }
                }
            }
            Ok(())
        })
    }

    /// Fixes the next step's division: each worker's end offsets. An input
    /// that now ends below where the pipeline has read it (a topic deleted
    /// and made again, truncated) is an error, never skipped.
    async fn divide(&mut self) -> Result<Vec<Frontier>> {
        let (storage, owned, mut target) = (
            self.storage.clone(),
            self.owned.clone(),
            self.frontiers.clone(),
        );
        let max = self.options.max_batch.max(1);
        blocking(move || {
            for (w, parts) in owned.iter().enumerate() {
                for (id, name) in parts {
                    let (_, high) = storage.log().watermarks(name, id.partition)?;
                    let at = target[w].entry(*id).or_insert(0);
                    if high < *at {
                        return Err(sluice_storage::StorageError::InputShrank {
                            input: name.clone(),
                            partition: id.partition,
                            end: high,
                            frontier: *at,
                        }
                        .into());
                    }
                    *at = high.min(*at + max);
                }
            }
            Ok::<_, Error>(target)
        })
        .await
    }

    /// Runs one step on every worker: the input between the current
    /// frontiers and `target`. Does not commit.
    async fn execute(
        &mut self,
        target: &[Frontier],
        step: u64,
        time_ms: u64,
        commit: Commit,
    ) -> Result<Vec<WorkerOutput>> {
        // A worker whose host reads this pipeline's logs reads its own
        // input (only the offsets travel); the others' is read here.
        let ranges = input_ranges(&self.owned, &self.frontiers, target);
        let reads_there = self.reads_there();
        // In a divided step, a worker whose host reads the logs also
        // commits its share there, if the host may write them.
        let commits_there = self.commits_there(&reads_there);
        let shares: Vec<Option<ShareSpec>> = (0..reads_there.len())
            .map(|w| {
                (commit != Commit::Whole && commits_there[w]).then(|| ShareSpec {
                    frontier: target[w].clone(),
                    outputs: self.outputs.clone(),
                    checks: self.output_checks(),
                    now: commit == Commit::Now,
                })
            })
            .collect();
        let inputs: Vec<StepInput> = {
            let storage = self.storage.clone();
            let reads_there = reads_there.clone();
            blocking(move || {
                ranges
                    .into_iter()
                    .zip(reads_there)
                    .zip(shares)
                    .map(|((ranges, there), share)| {
                        Ok(if there {
                            StepInput::Read(ranges, share)
                        } else {
                            StepInput::Batches(read_batches(storage.log(), &ranges, false)?)
                        })
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .await?
        };
        self.exchange.begin_step(step);
        let mut tasks = Vec::with_capacity(inputs.len());
        for (w, input) in inputs.into_iter().enumerate() {
            let mut worker = self.instances[w].take().ok_or(Error::WorkersLost)?;
            let exchange = self.exchange.clone();
            tasks.push(tokio::spawn(async move {
                let r = match input {
                    StepInput::Batches(batches) => {
                        let events = batches.iter().map(|b| b.weights.len() as u64).sum();
                        worker
                            .step(step, time_ms, batches)
                            .await
                            .map(|outputs| Stepped {
                                outputs,
                                events,
                                shared: None,
                            })
                    }
                    StepInput::Read(ranges, share) => match &mut worker {
                        AnyWorker::Remote(r) => r.step_reading(step, time_ms, ranges, share).await,
                        AnyWorker::Local(_) => Err(Error::WorkersLost),
                    },
                };
                exchange.worker_finished(w as u32);
                if let Err(e) = &r {
                    exchange.worker_failed(w as u32, &e.to_string());
                }
                (worker, r)
            }));
        }
        self.events_read = 0;
        self.events_read_there = 0;
        let mut outputs = Vec::with_capacity(tasks.len());
        let mut failure: Option<Error> = None;
        for (w, task) in tasks.into_iter().enumerate() {
            let result = match task.await {
                Ok((mut worker, r)) => {
                    self.stats.fuel_used += worker.take_fuel_used();
                    self.instances[w] = Some(worker);
                    r.and_then(|stepped| {
                        self.events_read += stepped.events;
                        if reads_there[w] {
                            self.events_read_there += stepped.events;
                        }
                        match stepped.shared {
                            Some(done) => Ok(WorkerOutput {
                                ports: Vec::new(),
                                hash: done.hash,
                                shared: Some(done.events),
                            }),
                            None => self.convert(w as u32, step, stepped.outputs),
                        }
                    })
                }
                Err(e) => Err(Error::task(format!("worker {w}"))(e)),
            };
            match result {
                Ok(out) => outputs.push(out),
                // An exchange failure is usually the echo of another worker's
                // failure: report the root cause.
                Err(e) => match &failure {
                    None
                    | Some(Error::Guest(GuestError::Exchange { .. }))
                    | Some(Error::Remote { exchange: true, .. }) => failure = Some(e),
                    Some(_) => {}
                },
            }
        }
        if let Some(e) = failure {
            // Instances stopped mid-step cannot be trusted (or re-entered).
            self.instances.iter_mut().for_each(|i| *i = None);
            return Err(e);
        }
        Ok(outputs)
    }

    /// Checks a worker's output batches and hashes them
    /// ([`convert_output`]).
    fn convert(&self, worker: u32, step: u64, batches: Vec<Batch>) -> Result<WorkerOutput> {
        convert_output(&self.output_checks(), worker, step, batches)
    }

    /// What a worker's output is checked against.
    fn output_checks(&self) -> OutputChecks {
        OutputChecks {
            ports: self.outputs.len(),
            max_output: self.options.max_output_per_step,
            check_json: self.options.check_output_json,
        }
    }

    /// Runs and commits one step. Returns `false` (doing nothing) when no
    /// worker has new input. A checkpoint that falls due is started: its
    /// snapshots pause the pipeline, its write overlaps the next steps.
    pub async fn step(&mut self) -> Result<bool> {
        self.step_with(false).await
    }

    /// [`step`](Self::step); with `force`, commits a step even when no
    /// worker has new input (to commit a layout change).
    async fn step_with(&mut self, force: bool) -> Result<bool> {
        if self.pending.as_ref().is_some_and(|p| p.write.is_finished()) {
            self.await_checkpoint().await?;
        }
        let r = self.step_inner(force).await;
        if r.is_err() {
            // Leave no write behind a failure: recovery must see the
            // checkpoint store and the input as they will stay.
            let _ = self.await_checkpoint().await;
        }
        r
    }

    async fn step_inner(&mut self, force: bool) -> Result<bool> {
        let target = self.divide().await?;
        if target == self.frontiers && !force {
            return Ok(false);
        }
        crash_point(CrashPoint::AfterDivide);
        let step = self.next_step;
        let time_ms = now_ms().max(self.last_time_ms);
        if self.divides() {
            return self.step_divided(target, step, time_ms).await;
        }
        let mut outputs = self.execute(&target, step, time_ms, Commit::Whole).await?;
        crash_point(CrashPoint::MidStep);
        // Events, not offsets: Kafka's offsets include transaction markers.
        let events_in = self.events_read;
        let mut events_out = 0;
        let mut logs = Vec::with_capacity(self.outputs.len());
        for (port, name) in self.outputs.iter().enumerate() {
            let entries: Vec<OutputEntry> = outputs
                .iter_mut()
                .enumerate()
                .map(|(w, out)| {
                    let events = std::mem::take(&mut out.ports[port]);
                    events_out += events.len() as u64;
                    OutputEntry {
                        step,
                        worker: w as u32,
                        frontier: target[w].clone(),
                        events,
                    }
                })
                .collect();
            logs.push((name.clone(), entries));
        }
        let commit = StepCommit {
            record: StepRecord {
                step,
                epoch: self.epoch,
                time_ms,
                frontiers: target.clone(),
                output_hashes: outputs.iter().map(|o| o.hash).collect(),
                limits: self.limits,
                prev: self.prev,
                layout: self.relayout_pending.then(|| self.layout.clone()),
            },
            outputs: logs,
        };
        self.commit_record(commit).await?;
        self.committed(target, time_ms, events_in, events_out).await
    }

    /// Commits a step's record — whole, with every worker's output, or a
    /// division — and links the next record to it.
    async fn commit_record(&mut self, commit: StepCommit) -> Result<()> {
        let whole = !commit.record.is_division();
        let link = commit.record.chain_hash();
        let storage = self.storage.clone();
        let committed = blocking(move || {
            crash_point(CrashPoint::BeforeCommit);
            storage.commit_step(&commit)?;
            if whole {
                crash_point(CrashPoint::AfterCommit);
            }
            Ok::<_, Error>(())
        });
        if let Err(e) = committed.await {
            // The instances already hold this step's effects: continuing with
            // them after a failed (or ambiguous) commit could lose or repeat
            // it. Recovery (reopening) restores a state that matches the log.
            self.instances.iter_mut().for_each(|i| *i = None);
            return Err(e);
        }
        self.prev = link;
        self.relayout_pending = false;
        Ok(())
    }

    /// Moves on past the step just committed.
    async fn committed(
        &mut self,
        target: Vec<Frontier>,
        time_ms: u64,
        events_in: u64,
        events_out: u64,
    ) -> Result<bool> {
        let step = self.next_step;
        tracing::debug!(pipeline = %self.options.name, step, events_in, events_out, "step committed");
        self.frontiers = target;
        self.last_time_ms = time_ms;
        self.next_step += 1;
        self.stats.steps += 1;
        self.stats.events_in += events_in;
        self.stats.events_in_read_by_hosts += self.events_read_there;
        self.stats.events_out += events_out;
        if self.checkpoint_due() {
            self.start_checkpoint().await?;
        }
        Ok(true)
    }

    /// Whether the next step is divided: the log takes divided steps and a
    /// worker's host writes to the pipeline's logs (it reads them), so it
    /// can commit its workers' output itself and the output need not come
    /// back here.
    fn divides(&self) -> bool {
        self.storage.log().worker_commits()
            && self.commits_there(&self.reads_there()).contains(&true)
    }

    /// Per worker, whether its host commits the worker's shares of
    /// divided steps: it reads this pipeline's logs and may write them.
    /// `reads` is [`reads_there`](Self::reads_there).
    fn commits_there(&self, reads: &[bool]) -> Vec<bool> {
        self.instances
            .iter()
            .zip(reads)
            .map(|(i, reads)| *reads && matches!(i, Some(AnyWorker::Remote(r)) if r.commits()))
            .collect()
    }

    /// Per worker, whether its host reads this pipeline's logs itself.
    fn reads_there(&self) -> Vec<bool> {
        let location = self.storage.log().location();
        self.instances
            .iter()
            .map(|i| match i {
                Some(AnyWorker::Remote(r)) => location.is_some() && r.log() == location.as_deref(),
                _ => false,
            })
            .collect()
    }

    /// Takes (before the step runs) every worker whose shares of divided
    /// steps this host commits and does not hold yet: taking ends the
    /// earlier holder's open transaction, which would hold back the other
    /// holders' reads of the step log.
    async fn take_holders(&mut self) -> Result<()> {
        let here: Vec<u32> = self
            .commits_there(&self.reads_there())
            .iter()
            .enumerate()
            .filter(|(_, there)| !**there)
            .map(|(w, _)| w as u32)
            .collect();
        self.committers.resize_with(self.instances.len(), || None);
        let missing: Vec<u32> = here
            .into_iter()
            .filter(|w| self.committers[*w as usize].is_none())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let storage = self.storage.clone();
        let taken = blocking(move || {
            missing
                .into_iter()
                .map(|w| Ok((w, storage.take_worker(w)?)))
                .collect::<Result<Vec<_>>>()
        })
        .await?;
        for (w, holder) in taken {
            self.committers[w as usize] = Some(holder);
        }
        Ok(())
    }

    /// Runs and commits a divided step: the division first (the step's
    /// commit point, so a recovery replays exactly this step), then every
    /// worker's share — by its host where the host writes to the logs,
    /// here otherwise — and the step is complete when every share's done
    /// record is in the log.
    async fn step_divided(
        &mut self,
        target: Vec<Frontier>,
        step: u64,
        time_ms: u64,
    ) -> Result<bool> {
        let record = StepRecord {
            step,
            epoch: self.epoch,
            time_ms,
            frontiers: target.clone(),
            output_hashes: Vec::new(),
            limits: self.limits,
            prev: self.prev,
            layout: self.relayout_pending.then(|| self.layout.clone()),
        };
        // Every worker computes its share first (the hosts hold theirs):
        // a step that fails (a guest, a limit, a host) is not recorded, so
        // a recovery never replays a step that cannot run.
        if let Err(e) = self.take_holders().await {
            self.instances.iter_mut().for_each(|i| *i = None);
            return Err(e);
        }
        let outputs = self.execute(&target, step, time_ms, Commit::Hold).await?;
        crash_point(CrashPoint::MidStep);
        self.commit_record(StepCommit {
            record,
            outputs: Vec::new(),
        })
        .await?;
        // From here on the step is recorded: a failure leaves its completion
        // to recovery, which replays it.
        let events_in = self.events_read;
        let events_out = self
            .commit_shares(step, &target, outputs, Commit::Hold)
            .await?;
        crash_point(CrashPoint::AfterCommit);
        self.committed(target, time_ms, events_in, events_out).await
    }

    /// Commits every share of divided step `step`: with [`Commit::Hold`]
    /// the hosts commit the shares they hold; the shares no host commits
    /// are committed here (with this host's holders of those workers).
    /// Then waits until every worker's done record is in the log and checks
    /// every worker's output against its done record. Returns the output
    /// events. On failure the instances are dropped (recovery finds out
    /// which shares committed).
    async fn commit_shares(
        &mut self,
        step: u64,
        frontiers: &[Frontier],
        outputs: Vec<WorkerOutput>,
        commit: Commit,
    ) -> Result<u64> {
        let r = self
            .commit_shares_inner(step, frontiers, outputs, commit)
            .await;
        if r.is_err() {
            // Whether the shares committed is for recovery to find out.
            self.instances.iter_mut().for_each(|i| *i = None);
        }
        r
    }

    async fn commit_shares_inner(
        &mut self,
        step: u64,
        frontiers: &[Frontier],
        outputs: Vec<WorkerOutput>,
        commit: Commit,
    ) -> Result<u64> {
        if commit == Commit::Hold {
            // The hosts that hold their workers' shares commit them, side
            // by side.
            let held: Vec<_> = outputs
                .iter()
                .zip(&self.instances)
                .filter(|(o, _)| o.shared.is_some())
                .filter_map(|(_, i)| match i {
                    Some(AnyWorker::Remote(r)) => Some(tokio::spawn(r.commit_share(step))),
                    _ => None,
                })
                .collect();
            for task in held {
                task.await.map_err(Error::task("committing a share"))??;
            }
        }
        let mut events_out = 0;
        self.committers.resize_with(outputs.len(), || None);
        let hashes: Vec<u128> = outputs.iter().map(|o| o.hash).collect();
        let mut shares = Vec::new();
        for (w, out) in outputs.into_iter().enumerate() {
            let worker = w as u32;
            match out.shared {
                Some(n) => {
                    events_out += n;
                    // Its host holds the worker now: a holder kept here
                    // would be fenced.
                    self.committers[w] = None;
                }
                None => {
                    let outputs = self.outputs.iter().cloned().zip(out.ports);
                    let share = WorkerCommit::new(step, worker, &frontiers[w], outputs, out.hash);
                    events_out += share.events();
                    shares.push((share, self.committers[w].take()));
                }
            }
        }
        let storage = self.storage.clone();
        let (shares, recorded) = blocking(move || {
            for (share, holder) in &mut shares {
                let committer = match holder {
                    Some(c) => c,
                    None => holder.insert(storage.take_worker(share.worker)?),
                };
                committer.commit(share).map_err(share_error)?;
            }
            crash_point(CrashPoint::InsideTransaction);
            let recorded = storage.log().await_complete(step)?;
            Ok::<_, Error>((shares, recorded))
        })
        .await?;
        for (share, holder) in shares {
            self.committers[share.worker as usize] = holder;
        }
        if let Some(w) = (0..hashes.len()).find(|w| recorded.get(*w) != Some(&hashes[*w])) {
            return Err(Error::Nondeterministic {
                step,
                worker: w as u32,
                committed: recorded
                    .get(w)
                    .map_or("none".into(), |h| format!("{h:032x}")),
                replayed: format!("{:032x}", hashes[w]),
            });
        }
        Ok(events_out)
    }

    /// Whether a checkpoint is due (by steps or by time since the last).
    pub fn checkpoint_due(&self) -> bool {
        let last = self
            .pending
            .as_ref()
            .map(|p| p.step)
            .or(self.checkpointed_step);
        let since = self.next_step - last.map_or(0, |s| s + 1);
        since >= self.options.checkpoint_every_steps.max(1)
            || self.last_checkpoint_at.elapsed() >= self.options.checkpoint_interval
    }

    /// Checkpoints the state after the last committed step (if not yet
    /// checkpointed), then trims the input it covers.
    pub async fn checkpoint(&mut self) -> Result<()> {
        self.start_checkpoint().await?;
        self.await_checkpoint().await
    }

    /// Takes the snapshots of a checkpoint of the last committed step and
    /// starts writing it (then trimming) in the background. One write at a
    /// time: a previous one is waited for first.
    async fn start_checkpoint(&mut self) -> Result<()> {
        self.await_checkpoint().await?;
        let Some(step) = self.next_step.checked_sub(1) else {
            return Ok(());
        };
        if self.checkpointed_step == Some(step) {
            return Ok(());
        }
        let started = Instant::now();
        // Taking snapshots resets what the instances count as changed: from
        // here until this checkpoint commits, nothing is a base.
        let base = self
            .base
            .take()
            .filter(|_| self.options.incremental_checkpoints);
        let incremental = base.is_some();
        // A worker whose host reaches this pipeline's checkpoint store
        // writes its pieces there itself (they never travel here); the
        // others' pieces come here and are written with the manifest.
        let location = self.storage.checkpoints().location();
        let mut tasks = Vec::with_capacity(self.instances.len());
        for slot in self.instances.iter_mut() {
            let mut worker = slot.take().ok_or(Error::WorkersLost)?;
            let location = location.clone();
            tasks.push(tokio::spawn(async move {
                let r = match &mut worker {
                    AnyWorker::Remote(r)
                        if location.is_some() && r.store() == location.as_deref() =>
                    {
                        match r.stage(incremental, step).await {
                            Ok((staged, changed)) => Ok(Taken::Staged(staged, changed)),
                            // Its host could not write the store (the
                            // snapshot was taken: what changed is reset):
                            // its whole state comes here instead.
                            Err(e @ Error::Remote { guest: false, .. })
                                if r.host().closed().is_none() =>
                            {
                                tracing::warn!(host = %r.host().addr(), error = %e, "a host could not write its checkpoint pieces: they come to the coordinator");
                                r.snapshot(false).await.map(Taken::Pieces)
                            }
                            Err(e) => Err(e),
                        }
                    }
                    w => w.snapshot(incremental).await.map(Taken::Pieces),
                };
                (worker, r)
            }));
        }
        let mut pieces = Vec::new();
        let mut staged = Vec::new();
        let mut carried = Vec::new();
        let mut failure = None;
        for (w, task) in tasks.into_iter().enumerate() {
            match task.await {
                Ok((worker, r)) => {
                    self.instances[w] = Some(worker);
                    let w = w as u32;
                    let changed = match r {
                        Ok(Taken::Pieces(snap)) => {
                            pieces.extend(snap.pieces.into_iter().map(|(shard, state)| {
                                StatePiece {
                                    shard,
                                    worker: w,
                                    state,
                                }
                            }));
                            snap.changed
                        }
                        Ok(Taken::Staged(s, changed)) => {
                            staged.push(s);
                            changed
                        }
                        Err(e) => {
                            failure = failure.or(Some(e));
                            continue;
                        }
                    };
                    if let (Some(base), Some(changed)) = (&base, &changed) {
                        carried.extend(
                            base.pieces
                                .iter()
                                .copied()
                                .filter(|(s, bw)| *bw == w && changed.binary_search(s).is_err()),
                        );
                    }
                }
                Err(e) => failure = failure.or(Some(Error::task(format!("worker {w}"))(e))),
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        let snapshots = started.elapsed();
        pieces.sort_by_key(|p| (p.shard, p.worker));
        let all: BTreeSet<(u32, u32)> = pieces
            .iter()
            .map(|p| (p.shard, p.worker))
            .chain(
                staged
                    .iter()
                    .flat_map(|s| s.pieces.iter().map(|(shard, _)| (*shard, s.worker))),
            )
            .chain(carried.iter().copied())
            .collect();
        let staged_bytes: u64 = staged.iter().map(Staged::bytes).sum();
        self.stats.checkpoint_bytes_staged += staged_bytes;
        self.stats.checkpoint_bytes_written +=
            pieces.iter().map(|p| p.state.len() as u64).sum::<u64>() + staged_bytes;
        let carried = base.map(|b| Carried {
            from: b.step,
            pieces: carried,
        });
        let checkpoint = Checkpoint {
            meta: CheckpointMeta {
                step,
                frontiers: self.frontiers.clone(),
                snapshot_version: self.snapshot_version,
                layout: self.layout.clone(),
            },
            pieces,
        };
        let storage = self.storage.clone();
        let write = tokio::task::spawn_blocking(move || -> Result<()> {
            crash_point(CrashPoint::MidCheckpoint);
            let carried = carried.as_ref().filter(|c| !c.pieces.is_empty());
            storage.checkpoint_staged(&checkpoint, &staged, carried)?;
            crash_point(CrashPoint::AfterCheckpoint);
            storage.trim_to_checkpoint()?;
            Ok(())
        });
        self.pending = Some(PendingCheckpoint {
            step,
            started,
            snapshots,
            pieces: all,
            write,
        });
        self.last_checkpoint_at = Instant::now();
        Ok(())
    }

    /// Waits for the checkpoint being written, if any, and records it.
    async fn await_checkpoint(&mut self) -> Result<()> {
        let Some(p) = self.pending.take() else {
            return Ok(());
        };
        p.write
            .await
            .map_err(Error::task("the checkpoint write"))??;
        tracing::debug!(
            pipeline = %self.options.name,
            step = p.step,
            snapshots = ?p.snapshots,
            total = ?p.started.elapsed(),
            "checkpoint committed, input trimmed"
        );
        self.checkpointed_step = Some(p.step);
        self.base = Some(Base {
            step: p.step,
            pieces: p.pieces,
        });
        self.last_checkpoint_took = p.started.elapsed();
        self.last_checkpoint_snapshots = p.snapshots;
        self.stats.checkpoints += 1;
        Ok(())
    }

    /// Waits for a checkpoint still being written in the background (before
    /// dropping a coordinator whose storage is about to go away).
    pub async fn settle(&mut self) -> Result<()> {
        self.await_checkpoint().await
    }

    /// Graceful stop: checkpoints the last committed step.
    pub async fn finish(&mut self) -> Result<()> {
        self.checkpoint().await
    }

    /// The step of the newest checkpoint this coordinator restored or took.
    pub fn checkpointed_step(&self) -> Option<u64> {
        self.checkpointed_step
    }

    /// Turns incremental checkpoints on or off from the next checkpoint on
    /// (see [`PipelineOptions::incremental_checkpoints`]).
    pub fn set_incremental_checkpoints(&mut self, on: bool) {
        self.options.incremental_checkpoints = on;
    }

    /// How long the last checkpoint took (snapshots, write and trim).
    pub fn last_checkpoint_time(&self) -> Duration {
        self.last_checkpoint_took
    }

    /// Of the last checkpoint's time, how much taking the snapshots took
    /// (the rest is the durable write and the trim).
    pub fn last_checkpoint_snapshots(&self) -> Duration {
        self.last_checkpoint_snapshots
    }

    /// What the coordinator has done since it opened.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The next step to run (the number of committed steps).
    pub fn next_step(&self) -> u64 {
        self.next_step
    }

    /// Each worker's current frontier.
    pub fn frontiers(&self) -> &[Frontier] {
        &self.frontiers
    }

    /// The address of each worker's host ([`RemoteHost::addr`]), empty for
    /// this process: the hint a coordinator opened after this one fails
    /// takes ([`PipelineOptions::placement_hint`]).
    pub fn placement_addrs(&self) -> Vec<String> {
        self.placement
            .iter()
            .map(|slot| match *slot as usize {
                0 => String::new(),
                s => self
                    .hosts
                    .get(s - 1)
                    .map(|h| h.addr().to_owned())
                    .unwrap_or_default(),
            })
            .collect()
    }

    /// The storage the coordinator commits to.
    pub fn storage(&self) -> &Arc<Guarded> {
        &self.storage
    }

    /// Moves workers onto `hosts` (and this process) between two steps,
    /// stickily: a worker whose host stays keeps it, the workers of hosts
    /// no longer listed go to the least loaded hosts, and workers move from
    /// the most to the least loaded until the loads differ by at most one —
    /// so a host leaving moves only its workers and a host joining takes
    /// only its share. Each worker that moves hands its whole state from its
    /// old instance to a new one on its new host, in memory — nothing is
    /// read from the checkpoint store and the workers that stay keep their
    /// instances. A host that leaves must still be reachable (it leaves
    /// gracefully; a dead one is recovered by reopening).
    /// Hosts that stay must be passed as the same [`RemoteHost`]s (a new
    /// connection to a host replaces the old one and drops its workers).
    /// Returns the bytes moved. On failure the instances are dropped:
    /// reopening recovers.
    pub async fn replace_hosts(&mut self, hosts: Vec<Arc<RemoteHost>>) -> Result<u64> {
        self.await_checkpoint().await?;
        let r = self.replace_hosts_inner(hosts).await;
        if r.is_err() {
            self.instances.iter_mut().for_each(|i| *i = None);
        }
        r
    }

    async fn replace_hosts_inner(&mut self, hosts: Vec<Arc<RemoteHost>>) -> Result<u64> {
        let from: Vec<&str> = self.hosts.iter().map(|h| h.addr()).collect();
        let to: Vec<&str> = hosts.iter().map(|h| h.addr()).collect();
        let placement = replace_placement(&self.placement, &from, &to);
        let addr = |slot: u32, hosts: &[&str]| -> Option<String> {
            (slot > 0).then(|| hosts[slot as usize - 1].to_owned())
        };
        let stays: Vec<bool> = (0..self.layout.workers as usize)
            .map(|w| addr(self.placement[w], &from) == addr(placement[w], &to))
            .collect();
        let all: Vec<u32> = (0..SHARDS).collect();
        let mut moved = 0u64;
        // The workers' places change: a new exchange session for all.
        let (exchange, mesh) = coordinator_exchange(&self.layout, &hosts, &placement)?;
        for w in 0..self.layout.workers {
            if stays[w as usize] {
                let worker = self.instances[w as usize]
                    .as_mut()
                    .ok_or(Error::WorkersLost)?;
                worker.rewire(&exchange, &mesh).await?;
                continue;
            }
            let mut old = self.instances[w as usize]
                .take()
                .ok_or(Error::WorkersLost)?;
            let pieces = old.export_shards(&all).await?;
            drop(old);
            let mut fresh = Self::start_worker(
                &self.engine,
                &self.component,
                &self.options,
                &hosts,
                self.limits,
                w,
                self.layout.workers,
                &exchange,
                &mesh,
            )
            .await?;
            fresh.set_step_limits(self.limits);
            moved += pieces.iter().map(|(_, p)| p.len() as u64).sum::<u64>();
            if !pieces.is_empty() {
                fresh.restore(pieces).await?;
            }
            self.instances[w as usize] = Some(fresh);
            self.stats.workers_moved += 1;
        }
        self.hosts = hosts;
        self.placement = placement;
        self.exchange = exchange;
        self.mesh = mesh;
        // Pieces moved between instances: the next checkpoint is whole.
        self.base = None;
        Ok(moved)
    }

    /// The layout the pipeline runs under.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The number of workers W.
    pub fn workers(&self) -> u32 {
        self.layout.workers
    }
}

/// One partition's part of a worker's input for one step: offsets
/// `start..end` of partition `id` of input log `name`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InputRange {
    pub(crate) id: PartitionId,
    pub(crate) name: String,
    pub(crate) start: u64,
    pub(crate) end: u64,
}

/// How a step commits its workers' output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Commit {
    /// Whole, here: every worker's output comes back.
    Whole,
    /// Divided, before the division is recorded: hosts that commit their
    /// workers' shares hold them until told.
    Hold,
    /// Divided, the division recorded (a replay): hosts commit at once.
    Now,
}

/// A worker share's commit error: a done record with another hash is a
/// replay that computed other output.
pub(crate) fn share_error(e: sluice_storage::StorageError) -> Error {
    match e {
        sluice_storage::StorageError::DoneDiffers {
            step,
            worker,
            committed,
            replayed,
        } => Error::Nondeterministic {
            step,
            worker,
            committed,
            replayed,
        },
        e => e.into(),
    }
}

/// What a worker's output is checked against: the circuit's output ports,
/// [`PipelineOptions::max_output_per_step`] and
/// [`PipelineOptions::check_output_json`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OutputChecks {
    /// The circuit's output ports.
    pub ports: usize,
    /// At most this many output events per worker per step.
    pub max_output: Option<u64>,
    /// Every output value must be JSON.
    pub check_json: bool,
}

/// Checks a worker's output batches (well-formed, within the limits) and
/// hashes them: where the coordinator commits the output, and on a host
/// that commits its workers' shares of divided steps.
pub(crate) fn convert_output(
    checks: &OutputChecks,
    worker: u32,
    step: u64,
    batches: Vec<Batch>,
) -> Result<WorkerOutput> {
    if let Some(limit) = checks.max_output {
        let attempted: u64 = batches.iter().map(|b| b.weights.len() as u64).sum();
        if attempted > limit {
            return Err(GuestError::OutputLimit {
                worker,
                step,
                limit,
                attempted,
            }
            .into());
        }
    }
    let refuse = |message: String| -> Error {
        GuestError::Failed {
            worker,
            call: "step",
            message,
        }
        .into()
    };
    let mut ports: Vec<Vec<Event>> = vec![Vec::new(); checks.ports];
    for batch in batches {
        let port = ports.get_mut(batch.port as usize).ok_or_else(|| {
            refuse(format!(
                "returned a batch for output port {}, but the circuit has {} output ports",
                batch.port, checks.ports
            ))
        })?;
        let values = crate::worker::slices(&batch.values, &batch.ends, batch.weights.len())
            .ok_or_else(|| {
                refuse(format!(
                    "returned a malformed batch for output port {} (ends out of order or \
                         past the values, or as many ends as weights)",
                    batch.port
                ))
            })?;
        port.reserve(values.len());
        for (value, weight) in values.into_iter().zip(&batch.weights) {
            if *weight == 0 {
                continue;
            }
            if checks.check_json
                && let Err(err) = serde_json::from_slice::<serde::de::IgnoredAny>(value)
            {
                return Err(refuse(format!(
                    "output port {} got a value that is not JSON: {err}",
                    batch.port
                )));
            }
            port.push(Event {
                value: value.to_vec(),
                weight: *weight,
            });
        }
    }
    let hash = hash_outputs(&ports);
    Ok(WorkerOutput {
        ports,
        hash,
        shared: None,
    })
}

/// The input each worker reads in a step from frontiers `from` to `to`: one
/// range per partition it owns that moved, in the order it owns them.
fn input_ranges(
    owned: &[Vec<(PartitionId, String)>],
    from: &[Frontier],
    to: &[Frontier],
) -> Vec<Vec<InputRange>> {
    owned
        .iter()
        .enumerate()
        .map(|(w, parts)| {
            parts
                .iter()
                .filter_map(|(id, name)| {
                    let start = from[w].get(id).copied().unwrap_or(0);
                    let end = to[w].get(id).copied().unwrap_or(start);
                    (end > start).then(|| InputRange {
                        id: *id,
                        name: name.clone(),
                        start,
                        end,
                    })
                })
                .collect()
        })
        .collect()
}

/// Reads `ranges` from `log` into one batch per input port (in the order
/// the ranges name them): what a worker steps on — built the same way
/// wherever it is read, so a worker's host reading its own input gives the
/// worker what the coordinator would have sent. With `strict` (a reader
/// other than the one that divided the step), a range past the partition's
/// end fails instead of reading short: its events are not all visible
/// here yet.
pub(crate) fn read_batches(
    log: &dyn sluice_storage::LogBackend,
    ranges: &[InputRange],
    strict: bool,
) -> Result<Vec<Batch>> {
    let mut batches: Vec<Batch> = Vec::new();
    for r in ranges {
        let (name, partition, start, end) = (&r.name, r.id.partition, r.start, r.end);
        // Offsets may be sparse (Kafka's transaction markers take
        // offsets), so the range holds at most `end - start` events; a
        // dense backend checks its own ranges.
        let events = if strict {
            log.read_exact(name, partition, start..end)?
        } else {
            log.read(name, partition, start..end)?
        };
        if events.len() as u64 > end - start {
            return Err(sluice_storage::StorageError::Corrupt {
                what: format!("input `{name}` partition {partition}"),
                message: format!("offsets {start}..{end} returned {} events", events.len()),
            }
            .into());
        }
        let i = match batches.iter().position(|b| b.port == r.id.input) {
            Some(i) => i,
            None => {
                batches.push(Batch {
                    port: r.id.input,
                    values: Vec::new(),
                    ends: Vec::new(),
                    weights: Vec::new(),
                });
                batches.len() - 1
            }
        };
        let batch = &mut batches[i];
        for e in events {
            batch.values.extend_from_slice(&e.value);
            batch.ends.push(batch.values.len() as u32);
            batch.weights.push(e.weight);
        }
    }
    Ok(batches)
}
