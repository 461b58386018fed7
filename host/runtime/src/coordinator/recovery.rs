//! Recovery, which is also how a pipeline opens: take the pipeline over (a
//! new fencing epoch), start the workers where their state is, restore the
//! newest checkpoint (each piece back to the worker that held it), then
//! replay the steps committed after it with their recorded divisions,
//! layouts and limits, checking every replayed output against its hash.

use super::options::{PipelineOptions, Stats};
use super::step::Commit;
use super::workers::{AnyWorker, coordinator_exchange, start_worker};
use super::{Base, CheckpointState, Coordinator, StepPosition, WorkerPlacement};
use crate::engine::{LoadedComponent, SluiceEngine};
use crate::error::{Error, Result};
use crate::hosts::RemoteHost;
use crate::hosts::placement::placement_from_hint;
use crate::step_io::blocking;
use sluice_core::crash::{CrashPoint, crash_point};
use sluice_core::{ConfigError, Layout, SHARDS, StepLimits, StepRecord};
use sluice_storage::{CheckpointMeta, Guarded, ReadBytes, StatePiece};
use std::sync::Arc;
use std::time::Instant;

/// A checkpoint's `(shard, worker)` piece keys, and its pieces when read
/// here at once.
type CheckpointKeys = (Vec<(u32, u32)>, Option<Vec<StatePiece>>);

/// Takes the pipeline over — a new epoch fences any older host — and
/// reads the newest committed checkpoint's description.
async fn take_over(storage: &Arc<Guarded>) -> Result<(Option<CheckpointMeta>, u64)> {
    let s = storage.clone();
    blocking(move || {
        let epoch = s.fence()?;
        Ok::<_, Error>((s.checkpoints().latest_meta()?, epoch))
    })
    .await
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

/// Restores worker `w` from its pieces of committed checkpoint `step`:
/// `pieces` when they were read here already; otherwise on its host, from
/// the store there, when it is remote (the caller checked its host
/// reaches the store), or read here. With `upgrade` (the operators to
/// start empty), the checkpoint is another component's: the worker takes
/// its pieces through the circuit's `upgrade`, all in one call (on its
/// host, when it is remote).
async fn restore_worker(
    worker: &mut AnyWorker,
    storage: &Arc<Guarded>,
    pieces: Option<Vec<StatePiece>>,
    step: u64,
    w: u32,
    upgrade: Option<Vec<String>>,
) -> Result<ReadBytes> {
    let (pieces, mut read) = match pieces {
        Some(pieces) => {
            let local = pieces.iter().map(|p| p.state.len() as u64).sum();
            (pieces, ReadBytes { local, fetched: 0 })
        }
        None => {
            if let AnyWorker::Remote(r) = worker {
                match r.restore_from(step, upgrade.clone()).await? {
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
    let pieces = pieces.into_iter().map(|p| (p.shard, p.state)).collect();
    match (upgrade, worker) {
        (Some(start_empty), AnyWorker::Local(local)) => local.upgrade(pieces, start_empty).await?,
        (Some(start_empty), AnyWorker::Remote(remote)) => {
            remote.upgrade(pieces, start_empty).await?
        }
        (None, worker) if !pieces.is_empty() => worker.restore(pieces).await?,
        (None, _) => {}
    }
    Ok(read)
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
        let (checkpoint, epoch) = take_over(&storage).await?;
        let layout = match &checkpoint {
            Some(meta) => meta.layout.clone(),
            None => Layout::initial(&shape),
        };
        layout
            .validate(&shape)
            .map_err(|m| ConfigError::Invalid(format!("the checkpoint's layout: {m}")))?;
        let limits = StepLimits {
            fuel_per_call: engine.limits().fuel_per_call,
            memory: engine.limits().memory as u64,
        };
        // The coordinator before went and the hosts kept its workers at
        // the log's last step: adopt them (nothing restored or replayed).
        let opening = super::adopt::Opening {
            engine,
            component,
            storage: &storage,
            options: &options,
            hosts: &hosts,
            checkpoint: checkpoint.as_ref(),
            layout: &layout,
            epoch,
            limits,
        };
        if let Some(mut c) = Self::adopt(opening).await {
            c.stats.restore_took = opened.elapsed();
            return Ok(c);
        }
        // Without a hint (a new leader), workers go where their state is:
        // the host with most of a worker's pieces in its own copy.
        let hint = match &checkpoint {
            Some(meta) if options.placement_hint.is_empty() && !hosts.is_empty() => {
                locality_hint(&storage, &hosts, meta.step, layout.workers).await
            }
            _ => options.placement_hint.clone(),
        };
        let addrs: Vec<&str> = hosts.iter().map(|h| h.addr()).collect();
        let slots = placement_from_hint(&hint, layout.workers, &addrs);
        let (exchange, mesh) = coordinator_exchange(&layout, &hosts, &slots, &[])?;
        let mut instances = Vec::with_capacity(layout.workers as usize);
        for w in 0..layout.workers {
            let worker = start_worker(
                engine,
                component,
                &options,
                &hosts,
                limits,
                w,
                layout.workers,
                mesh.slot(w),
                &exchange,
                &mesh,
            )
            .await?;
            instances.push(Some(worker));
        }
        let owned = layout.assignment(&shape);
        let frontiers = owned
            .iter()
            .map(|ps| ps.iter().map(|(id, _)| (*id, 0)).collect())
            .collect();
        let mut c = Coordinator {
            storage,
            shape,
            component: component.clone(),
            engine: engine.with_limits(engine.limits()),
            options,
            epoch,
            limits,
            position: StepPosition::start(frontiers),
            placement: WorkerPlacement {
                layout,
                relayout_pending: false,
                owned,
                instances,
                hosts,
                slots,
                mesh,
                exchange,
                committers: Vec::new(),
                followers: Vec::new(),
                heal_pending: false,
                heal_not_before: 0,
                held_here: Vec::new(),
            },
            checkpoints: CheckpointState::none(),
            stats: Stats::default(),
            read_ahead: None,
            spare: Default::default(),
            commit: None,
        };
        // The steps up to an upgrade's checkpoint ran the component before
        // it: without that checkpoint (or a newer one) they would replay
        // under this one.
        if let Some(u) = &c.options.upgraded_at
            && checkpoint.as_ref().is_none_or(|m| m.step < u.checkpoint)
        {
            return Err(ConfigError::Invalid(format!(
                "the pipeline was upgraded at the checkpoint of step {}, which this host does not \
                 have ({}): the steps up to it ran the component before the upgrade; run it with \
                 that checkpoint (its data directory, or keep checkpoints in a shared store, \
                 --store)",
                u.checkpoint,
                checkpoint.map_or("it has none".to_owned(), |m| format!(
                    "its newest is of step {}",
                    m.step
                ))
            ))
            .into());
        }
        if let Some(meta) = checkpoint {
            c.restore_checkpoint(meta).await?;
        }
        c.stats.restore_took = opened.elapsed();
        c.check_input_reachable().await?;
        let replaying = Instant::now();
        c.replay().await?;
        c.stats.replay_took = replaying.elapsed();
        c.replicate().await?;
        tracing::debug!(
            pipeline = %c.options.name,
            restored = ?c.stats.restored_checkpoint,
            replayed = c.stats.replayed_steps,
            workers = c.placement.layout.workers,
            "recovered"
        );
        Ok(c)
    }

    /// Restores every instance from committed checkpoint `meta`: every
    /// piece goes back to the worker that held it, so the replay runs on
    /// exactly the state the steps ran on. A worker whose host reaches this
    /// pipeline's checkpoint store reads its own pieces there (from that
    /// host's own copy when it wrote them); the others' are read here.
    pub(super) async fn restore_checkpoint(&mut self, meta: CheckpointMeta) -> Result<()> {
        let workers = self.placement.layout.workers;
        if meta.frontiers.len() != workers as usize {
            return Err(ConfigError::WorkersChanged {
                stored: meta.frontiers.len() as u32,
                wanted: workers,
            }
            .into());
        }
        let step = meta.step;
        // The checkpoint of the component before an upgrade: taken through
        // `upgrade`, and no base for the next incremental checkpoint (the
        // pieces are the other component's).
        let upgrade = self
            .options
            .upgraded_at
            .as_ref()
            .filter(|u| u.checkpoint == step)
            .map(|u| [u.start_empty.clone(), u.rebuilt.clone().unwrap_or_default()].concat());
        let rebuilt = match &self.options.upgraded_at {
            Some(u) if u.checkpoint == step => u.rebuilt.clone(),
            _ => None,
        };
        // A rebuild (and its switch output) runs in this process only:
        // refused before any worker takes a piece, not after the replay.
        if rebuilt.is_some()
            && self
                .placement
                .instances
                .iter()
                .flatten()
                .any(|w| matches!(w, AnyWorker::Remote(_)))
        {
            return Err(Error::UpgradeAcrossHosts);
        }
        if upgrade.is_some() {
            tracing::debug!(
                pipeline = %self.options.name,
                step,
                "taking the checkpoint of the component before the upgrade"
            );
        }
        let (keys, mut here) = self.checkpoint_keys(step).await?;
        if let Some((_, w)) = keys.iter().find(|(_, w)| *w >= workers) {
            return Err(sluice_storage::StorageError::Corrupt {
                what: format!("checkpoint of step {step}"),
                message: format!("a piece of worker {w} of {workers}"),
            }
            .into());
        }
        // Restored as they lie, the pieces are what the instances' next
        // incremental snapshot is relative to (a piece of the format before
        // shards is not: it is rewritten whole).
        if upgrade.is_none() && keys.iter().all(|(shard, _)| *shard < SHARDS) {
            self.checkpoints.base = Some(Base {
                step,
                pieces: keys.iter().copied().collect(),
            });
        }
        // The instances restore side by side (each on its own task).
        let mut tasks = Vec::with_capacity(self.placement.instances.len());
        for w in 0..workers {
            let Some(mut worker) = self.placement.instances[w as usize].take() else {
                continue;
            };
            let storage = self.storage.clone();
            let mine: Option<Vec<StatePiece>> = here.as_mut().map(|all| {
                let (mine, rest) = std::mem::take(all).into_iter().partition(|p| p.worker == w);
                *all = rest;
                mine
            });
            let upgrade = upgrade.clone();
            tasks.push((
                w,
                tokio::spawn(async move {
                    let r = restore_worker(&mut worker, &storage, mine, step, w, upgrade).await;
                    (worker, r)
                }),
            ));
        }
        let mut failure = None;
        for (w, task) in tasks {
            match task.await {
                Ok((worker, r)) => {
                    self.placement.instances[w as usize] = Some(worker);
                    match r {
                        Ok(read) => {
                            self.stats.restored_local_bytes += read.local;
                            self.stats.restored_fetched_bytes += read.fetched;
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
        if upgrade.is_some() {
            if let Some(rebuilt) = rebuilt {
                self.rebuild(step, &rebuilt).await?;
            }
            self.hand_foreign_shards().await?;
        }
        self.position.frontiers = meta.frontiers;
        self.position.next_step = step + 1;
        self.checkpoints.step = Some(step);
        self.stats.restored_checkpoint = Some(step);
        Ok(())
    }

    /// After an upgrade: the new version's migration may have given state
    /// new keys, in shards other workers own. Every worker hands what it
    /// holds of shards it does not own to their owners, as a layout change
    /// hands shards over. (State that never crosses the exchange moves
    /// too: pieces of a shard add up on whichever worker holds them.) The
    /// same on every recovery through the upgrade, so replays see the same
    /// state.
    async fn hand_foreign_shards(&mut self) -> Result<()> {
        let layout = self.placement.layout.clone();
        if layout.workers < 2 {
            return Ok(());
        }
        let mut handed: Vec<Vec<(u32, Vec<u8>)>> = vec![Vec::new(); layout.workers as usize];
        for w in 0..layout.workers {
            let foreign: Vec<u32> = (0..SHARDS).filter(|&s| layout.owner(s) != w).collect();
            let worker = self.placement.instances[w as usize]
                .as_mut()
                .ok_or(Error::WorkersLost)?;
            for (shard, state) in worker.export_shards(&foreign).await? {
                handed[layout.owner(shard) as usize].push((shard, state));
            }
        }
        for (w, pieces) in handed.into_iter().enumerate() {
            if pieces.is_empty() {
                continue;
            }
            tracing::debug!(
                worker = w,
                pieces = pieces.len(),
                "takes shards after an upgrade"
            );
            let worker = self.placement.instances[w]
                .as_mut()
                .ok_or(Error::WorkersLost)?;
            worker.restore(pieces).await?;
        }
        Ok(())
    }

    /// The `(shard, worker)` keys of committed checkpoint `step`'s pieces,
    /// and the pieces themselves when they are all read here at once (this
    /// host's own store, which no worker's host reaches); a shared store is
    /// read worker by worker, telling what came from a host's own copy. (A
    /// future that holds no borrow of the coordinator, whose instances are
    /// not `Sync`.)
    pub(super) fn checkpoint_keys(
        &self,
        step: u64,
    ) -> impl Future<Output = Result<CheckpointKeys>> + use<> {
        let location = self.storage.checkpoints().location();
        let reach_store = self.placement.instances.iter().any(|i| {
            matches!(i, Some(AnyWorker::Remote(r))
                if location.is_some() && r.store() == location.as_deref())
        });
        let s = self.storage.clone();
        async move {
            let missing = || sluice_storage::StorageError::Corrupt {
                what: format!("checkpoint of step {step}"),
                message: "its pieces are missing".into(),
            };
            if location.is_some() || reach_store {
                let keys = blocking(move || s.checkpoints().keys(step)).await?;
                return Ok((keys.ok_or_else(missing)?, None));
            }
            let pieces = blocking(move || s.checkpoints().pieces(step, None)).await?;
            let pieces = pieces.ok_or_else(missing)?;
            Ok((
                pieces.iter().map(|p| (p.shard, p.worker)).collect(),
                Some(pieces),
            ))
        }
    }

    /// Reads the record of committed step `step` (a future that holds no
    /// borrow of the coordinator, whose instances are not `Sync`).
    pub(super) fn record(&self, step: u64) -> impl Future<Output = Result<StepRecord>> + use<> {
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
    pub(super) async fn replay(&mut self) -> Result<()> {
        let s = self.storage.clone();
        let last = blocking(move || s.log().last_step()).await?;
        let Some(last) = last else { return Ok(()) };
        let last_record = self.record(last).await?;
        self.position.last_time_ms = self.position.last_time_ms.max(last_record.time_ms);
        self.position.prev = last_record.chain_hash();
        let live = self.limits;
        while self.position.next_step <= last {
            let step = self.position.next_step;
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
                    .execute(
                        &record.frontiers,
                        step,
                        record.time_ms,
                        Commit::Now,
                        Some(record.epoch),
                        false,
                    )
                    .await?;
                self.commit_shares(step, &record.frontiers, outputs, Commit::Now)
                    .await?;
                self.position.frontiers = record.frontiers;
                self.position.next_step += 1;
                self.stats.replayed_steps += 1;
                crash_point(CrashPoint::DuringReplay);
                continue;
            }
            let outputs = self
                .execute(
                    &record.frontiers,
                    step,
                    record.time_ms,
                    Commit::Whole,
                    Some(record.epoch),
                    false,
                )
                .await?;
            for (w, (out, committed)) in outputs.iter().zip(&record.output_hashes).enumerate() {
                if out.hash != *committed {
                    self.placement.drop_instances();
                    return Err(Error::Nondeterministic {
                        step,
                        worker: w as u32,
                        committed: format!("{committed:032x}"),
                        replayed: format!("{:032x}", out.hash),
                    });
                }
            }
            self.position.frontiers = record.frontiers;
            self.position.next_step += 1;
            self.stats.replayed_steps += 1;
            crash_point(CrashPoint::DuringReplay);
        }
        self.set_limits(live);
        Ok(())
    }

    /// Checks that the input the recovered state goes on from is still
    /// there: where a checkpoint this host does not have trimmed it (another
    /// host's, with another data directory), say so, instead of failing on
    /// the first read.
    pub(super) fn check_input_reachable(&self) -> impl Future<Output = Result<()>> + use<> {
        let (storage, owned, from) = (
            self.storage.clone(),
            self.placement.owned.clone(),
            self.position.frontiers.clone(),
        );
        let restored = self.checkpoints.step;
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
}
