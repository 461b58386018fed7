//! Adoption: how a coordinator opens without restoring or replaying, when
//! the one before it went (its process died, stalled or was cut off) and
//! the worker hosts kept the instances it ran there.
//!
//! The new coordinator has fenced the pipeline (a new epoch) and reads the
//! step log's last step; then it asks every host, and its own process's
//! worker host, which instances they kept ([`WorkerHost`]'s parked
//! workers). It adopts them only if **every** worker has a kept instance
//! whose last step is exactly the log's last step: the same number, run in
//! the epoch that recorded it, on the frontier recorded for the worker, in
//! the same layout, with no call failed or running since. One instance of
//! each worker becomes its primary, the others its followers; a share of
//! that step whose done record is not in the log yet is committed by the
//! instance holding it (a follower's host takes the worker first, fencing
//! the old primary's holder, and a done record already there is checked
//! instead: the first commit wins, I1); the replicas missing are rebuilt
//! from the survivors. Anything else — a worker without such an instance,
//! a host that does not answer, an adoption that fails — and the
//! coordinator opens as it always did: restore the newest checkpoint and
//! replay.
//!
//! Why the checks suffice: an instance's state is a function of the steps
//! it ran (I4). Kept instances ran the same session's steps as the log
//! records up to the last one — a coordinator that reopened in between
//! started its own instances, which drops what the hosts kept — and the
//! epoch and frontier of the last step tell a recorded step from one its
//! coordinator ran but never recorded.
//!
//! [`WorkerHost`]: crate::WorkerHost

use super::options::{PipelineOptions, Stats};
use super::replicas::Follower;
use super::workers::{AnyWorker, coordinator_exchange};
use super::{CheckpointState, Coordinator, StepPosition, WorkerPlacement};
use crate::engine::{LoadedComponent, SluiceEngine};
use crate::error::{Error, Result};
use crate::hosts::wire::WireParked;
use crate::hosts::{Adopt, MeshPlan, RemoteHost, RemoteWorker, WorkerHost};
use crate::step_io::{blocking, share_error};
use sluice_core::{Layout, StepLimits, StepRecord};
use sluice_storage::{CheckpointMeta, Guarded};
use std::sync::Arc;

/// An instance a host kept: on which slot (0 this process), and what.
struct Kept {
    slot: u32,
    parked: WireParked,
}

/// What a coordinator about to open knows.
pub(super) struct Opening<'a> {
    pub(super) engine: &'a SluiceEngine,
    pub(super) component: &'a LoadedComponent,
    pub(super) storage: &'a Arc<Guarded>,
    pub(super) options: &'a PipelineOptions,
    pub(super) hosts: &'a [Arc<RemoteHost>],
    pub(super) checkpoint: Option<&'a CheckpointMeta>,
    pub(super) layout: &'a Layout,
    pub(super) epoch: u64,
    pub(super) limits: StepLimits,
}

impl Coordinator {
    /// Opens by adopting the instances the coordinator before left on the
    /// hosts, if they hold the state of the log's last step (see the
    /// module's notes); `None` if they do not (nothing changed: open as
    /// usual). On a failure half-way the adopted instances are dropped and
    /// `None` returned.
    pub(super) async fn adopt(opening: Opening<'_>) -> Option<Coordinator> {
        match Self::adopt_inner(&opening).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(
                    pipeline = %opening.options.name,
                    error = %e,
                    "adopting the workers the coordinator before left failed: restoring instead"
                );
                // What is kept goes: the restore starts its own workers.
                if let Some(own) = &opening.options.own_host {
                    own.drop_parked();
                }
                for h in opening.hosts {
                    h.drop_parked().await;
                }
                None
            }
        }
    }

    async fn adopt_inner(o: &Opening<'_>) -> Result<Option<Coordinator>> {
        let own = o.options.own_host.clone();
        if o.hosts.is_empty() && own.is_none() {
            return Ok(None);
        }
        let s = o.storage.clone();
        let tail = blocking(move || {
            let Some(last) = s.log().last_step()? else {
                return Ok::<_, Error>(None);
            };
            let Some(record) = s.log().step_record(last)? else {
                return Ok(None);
            };
            let complete = s.log().output_hashes(last)?.is_some();
            Ok(Some((record, complete)))
        })
        .await?;
        let Some((mut record, mut complete)) = tail else {
            return Ok(None);
        };
        let enough = |kept: &[Kept]| choose(o, &record, complete, kept).is_some();
        let kept = kept_instances(own.as_deref(), o.hosts, enough).await;
        if kept.is_empty() {
            return Ok(None);
        }
        let mut recorded = None;
        let chosen = match choose(o, &record, complete, &kept) {
            Some(chosen) => chosen,
            None => match complete.then(|| in_flight(o, &record, &kept)).flatten() {
                Some((chosen, next)) => {
                    // The step the coordinator before was running when it
                    // went, computed by every worker: recorded here, with
                    // the division the instances ran — the step's commit
                    // point. (Should adopting fail after this, a recovery
                    // replays the step from this record, as any.)
                    let s = o.storage.clone();
                    let division = sluice_core::StepCommit::division(next.clone());
                    blocking(move || s.commit_step(&division)).await?;
                    tracing::info!(
                        pipeline = %o.options.name,
                        step = next.step,
                        "the step the coordinator before left in flight is recorded, as its workers ran it"
                    );
                    (record, complete, recorded) = (next, false, Some(o.epoch));
                    chosen
                }
                None => {
                    tracing::info!(
                        pipeline = %o.options.name,
                        step = record.step,
                        kept = kept.len(),
                        "the hosts kept no instance of some worker at the log's last step: restoring"
                    );
                    if let Some(own) = &own {
                        own.drop_parked();
                    }
                    for h in o.hosts {
                        h.drop_parked().await;
                    }
                    return Ok(None);
                }
            },
        };
        let in_flight_recorded = u64::from(recorded.is_some());
        let slots: Vec<u32> = chosen.primaries.iter().map(|k| k.slot).collect();
        let follower_slots: Vec<Vec<u32>> = chosen
            .followers
            .iter()
            .map(|fs| fs.iter().map(|k| k.slot).collect())
            .collect();
        let (exchange, mesh) = coordinator_exchange(o.layout, o.hosts, &slots, &follower_slots)?;
        let step = record.step;
        let mut instances = Vec::with_capacity(slots.len());
        let mut followers: Vec<Vec<Follower>> = Vec::with_capacity(slots.len());
        let mut adopted = 0u64;
        let adopt = AdoptOne {
            own: own.as_deref(),
            hosts: o.hosts,
            storage: o.storage,
            exchange: &exchange,
            mesh: &mesh,
            limits: o.limits,
            recorded,
            component: &o.component.hash,
            config: &o.options.config,
        };
        for (w, primary) in chosen.primaries.iter().enumerate() {
            let commit = chosen.commit[w].then_some(step);
            instances.push(Some(adopt.one(primary, commit).await?));
            let mut mine = Vec::new();
            for f in &chosen.followers[w] {
                mine.push(Follower {
                    slot: f.slot,
                    instance: Some(adopt.one(f, None).await?),
                });
            }
            adopted += 1 + mine.len() as u64;
            followers.push(mine);
        }
        if !complete {
            // Every share of the last step is committed now, by whichever
            // instance held it (or was found committed): the step is
            // complete before the next one runs.
            let s = o.storage.clone();
            blocking(move || s.log().await_complete(step)).await?;
        }
        let shape = o.storage.shape().clone();
        let owned = o.layout.assignment(&shape);
        let mut checkpoints = CheckpointState::none();
        // The next checkpoint is whole: the adopted instances' change marks
        // count from their own last snapshot, not from the newest
        // checkpoint.
        checkpoints.step = o.checkpoint.map(|m| m.step);
        let c = Coordinator {
            storage: o.storage.clone(),
            shape,
            component: o.component.clone(),
            engine: o.engine.with_limits(o.engine.limits()),
            options: o.options.clone(),
            epoch: o.epoch,
            limits: o.limits,
            position: StepPosition {
                next_step: step + 1,
                frontiers: record.frontiers.clone(),
                last_time_ms: record.time_ms,
                prev: record.chain_hash(),
                events_read: 0,
                events_read_by_hosts: 0,
                switch_output: None,
                input_ends: Vec::new(),
            },
            placement: WorkerPlacement {
                layout: o.layout.clone(),
                relayout_pending: false,
                owned,
                instances,
                hosts: o.hosts.to_vec(),
                slots,
                mesh,
                exchange,
                committers: Vec::new(),
                followers,
                // The followers that died with the coordinator before are
                // rebuilt after the first step (as after a host's failover),
                // not before it: the pipeline goes on at once.
                heal_pending: true,
                heal_not_before: step + 2,
                held_here: Vec::new(),
            },
            checkpoints,
            stats: Stats {
                adopted,
                adopted_in_flight: in_flight_recorded,
                ..Stats::default()
            },
            read_ahead: None,
            spare: Default::default(),
            commit: None,
        };
        // What was kept and not adopted goes (a step left running that
        // never ends among it).
        if let Some(own) = &own {
            own.drop_parked();
        }
        for h in o.hosts {
            h.drop_parked().await;
        }
        tracing::info!(
            pipeline = %c.options.name,
            step,
            adopted,
            "opened on the workers the coordinator before left: nothing restored, nothing replayed"
        );
        Ok(Some(c))
    }
}

/// What every host (and this process's own worker host) kept, once no
/// kept instance is still running a call (a step its coordinator started
/// goes on without it) or `enough` says the instances not busy will do,
/// or after [`BUSY_WAIT`].
async fn kept_instances(
    own: Option<&WorkerHost>,
    hosts: &[Arc<RemoteHost>],
    enough: impl Fn(&[Kept]) -> bool,
) -> Vec<Kept> {
    let until = std::time::Instant::now() + BUSY_WAIT;
    loop {
        let kept = kept_now(own, hosts).await;
        if !kept.iter().any(|k| k.parked.busy)
            || enough(&kept)
            || std::time::Instant::now() >= until
        {
            return kept;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// How long a new coordinator waits for the steps the one before left
/// running on the hosts to end. (A step that never ends — its coordinator
/// went before every worker's host was told to run it, and it waits on
/// their events — is dropped once the new coordinator has decided.)
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

async fn kept_now(own: Option<&WorkerHost>, hosts: &[Arc<RemoteHost>]) -> Vec<Kept> {
    let mut kept: Vec<Kept> = own
        .map(|h| h.parked())
        .unwrap_or_default()
        .into_iter()
        .map(|parked| Kept { slot: 0, parked })
        .collect();
    let mut asked = tokio::task::JoinSet::new();
    for (i, h) in hosts.iter().enumerate() {
        let h = h.clone();
        asked.spawn(async move { (i as u32 + 1, h.parked().await, h) });
    }
    while let Some(Ok((slot, answer, h))) = asked.join_next().await {
        match answer {
            Ok(all) => kept.extend(all.into_iter().map(|parked| Kept { slot, parked })),
            Err(e) => tracing::debug!(host = %h.addr(), error = %e, "no kept workers from a host"),
        }
    }
    kept
}

/// Which kept instance runs each worker.
struct Chosen<'k> {
    /// Each worker's primary.
    primaries: Vec<&'k Kept>,
    /// Each worker's followers.
    followers: Vec<Vec<&'k Kept>>,
    /// Per worker: its primary holds its share of the last step, whose
    /// done record is not in the log yet — it commits it on adoption.
    commit: Vec<bool>,
}

/// The instances to adopt, if every worker has one at the log's last
/// step (`record`, complete or not): primaries spread over the slots,
/// followers up to the replicas wanted.
fn choose<'k>(
    o: &Opening<'_>,
    record: &StepRecord,
    complete: bool,
    kept: &'k [Kept],
) -> Option<Chosen<'k>> {
    let workers = o.layout.workers as usize;
    if !record.is_division() || record.frontiers.len() != workers {
        return None;
    }
    let step = record.step;
    let fits = |k: &&Kept| {
        let p = &k.parked;
        let at_last = p.at.as_ref().is_some_and(|m| {
            m.step == step
                && m.epoch == record.epoch
                && record.frontiers.get(p.worker as usize) == Some(&m.frontier)
        });
        p.clean
            && !p.busy
            && at_last
            && p.component == o.component.hash
            && p.workers == o.layout.workers
            && p.owners == o.layout.shards
            && (complete || p.held == Some(step) || p.committed == Some(step))
    };
    let candidates = by_worker(kept, workers, fits)?;
    // The replicas that hold a share of the step must hold the same one.
    for (w, c) in candidates.iter().enumerate() {
        let mut held = c.iter().filter(|k| k.parked.held == Some(step));
        if let Some(first) = held.next()
            && held.any(|k| k.parked.held_hash != first.parked.held_hash)
        {
            tracing::warn!(
                pipeline = %o.options.name,
                worker = w,
                step,
                "the instances kept of a worker hold different shares of a step: not adopted"
            );
            return None;
        }
    }
    place(o, candidates, step, complete)
}

/// The kept instances that `fit`, by worker — if every one of the
/// `workers` has one.
fn by_worker(
    kept: &[Kept],
    workers: usize,
    fits: impl Fn(&&Kept) -> bool,
) -> Option<Vec<Vec<&Kept>>> {
    let mut candidates: Vec<Vec<&Kept>> = vec![Vec::new(); workers];
    for k in kept.iter().filter(fits) {
        if let Some(c) = candidates.get_mut(k.parked.worker as usize) {
            c.push(k);
        }
    }
    (!candidates.iter().any(Vec::is_empty)).then_some(candidates)
}

/// One instance of each worker as its primary, on the least loaded slot
/// (preferring one that holds the share of `step` still to commit, when
/// the step is not `complete`), the others its followers, up to the
/// replicas wanted. Every worker has a candidate.
fn place<'k>(
    o: &Opening<'_>,
    candidates: Vec<Vec<&'k Kept>>,
    step: u64,
    complete: bool,
) -> Option<Chosen<'k>> {
    let workers = candidates.len();
    let wanted = (o.options.replicas.max(1) as usize).min(o.hosts.len() + 1);
    let mut load = vec![0u32; o.hosts.len() + 1];
    let mut chosen = Chosen {
        primaries: Vec::with_capacity(workers),
        followers: Vec::with_capacity(workers),
        commit: Vec::with_capacity(workers),
    };
    // The share of `step` still to commit: a primary holding it commits
    // it — one that read the step's input itself (its share carries the
    // input records skipped).
    let to_commit =
        |k: &Kept| !complete && k.parked.held == Some(step) && k.parked.committed != Some(step);
    let may_commit = |k: &Kept| k.parked.at.as_ref().is_some_and(|m| m.own_input);
    for c in candidates {
        let primary = c.iter().copied().min_by_key(|k| {
            (
                to_commit(k) && !may_commit(k),
                load.get(k.slot as usize).copied().unwrap_or(u32::MAX),
                k.parked.held != Some(step),
            )
        })?;
        let commit = to_commit(primary);
        if commit && !may_commit(primary) {
            return None;
        }
        if let Some(l) = load.get_mut(primary.slot as usize) {
            *l += 1;
        }
        chosen.primaries.push(primary);
        chosen.commit.push(commit);
        chosen.followers.push(
            c.iter()
                .copied()
                .filter(|k| k.slot != primary.slot)
                .take(wanted.saturating_sub(1))
                .collect(),
        );
    }
    Some(chosen)
}

/// The instances to adopt when every worker has one that computed the
/// step after the log's last (`record`, complete) and holds its share —
/// the step its coordinator was running when it went — and the division
/// to record for it: the frontiers, time and limits the instances ran it
/// with. The replicas of each worker must hold the same share (else that
/// is a nondeterminism finding for the recovery's replay to make).
fn in_flight<'k>(
    o: &Opening<'_>,
    record: &StepRecord,
    kept: &'k [Kept],
) -> Option<(Chosen<'k>, StepRecord)> {
    let workers = o.layout.workers as usize;
    if !record.is_division() || record.frontiers.len() != workers {
        return None;
    }
    let next = record.step + 1;
    let fits = |k: &&Kept| {
        let p = &k.parked;
        let from_last = p.before.as_ref().is_some_and(|m| {
            m.step == record.step
                && m.epoch == record.epoch
                && record.frontiers.get(p.worker as usize) == Some(&m.frontier)
        });
        p.clean
            && !p.busy
            && from_last
            && p.at.as_ref().is_some_and(|m| m.step == next)
            && p.held == Some(next)
            && p.component == o.component.hash
            && p.workers == o.layout.workers
            && p.owners == o.layout.shards
    };
    let candidates = by_worker(kept, workers, fits)?;
    let first = candidates[0][0].parked.at.clone()?;
    let mut frontiers = Vec::with_capacity(workers);
    for (w, c) in candidates.iter().enumerate() {
        let mine = c[0].parked.at.as_ref()?;
        for k in c {
            let (m, p) = (k.parked.at.as_ref()?, &k.parked);
            let same_step = m.epoch == first.epoch
                && m.time_ms == first.time_ms
                && m.limits == first.limits
                && m.frontier == mine.frontier;
            if !same_step || p.held_hash != c[0].parked.held_hash {
                tracing::warn!(
                    pipeline = %o.options.name,
                    worker = w,
                    step = next,
                    "the instances kept of a worker computed the step in flight differently: not adopted"
                );
                return None;
            }
        }
        frontiers.push(mine.frontier.clone());
    }
    let division = StepRecord {
        step: next,
        epoch: o.epoch,
        time_ms: first.time_ms,
        frontiers,
        output_hashes: Vec::new(),
        limits: first.limits,
        prev: record.chain_hash(),
        layout: None,
    };
    // Every primary holds its share: it commits it once the division is
    // recorded.
    Some((place(o, candidates, next, false)?, division))
}

/// Adopts kept instances into a new session.
struct AdoptOne<'a> {
    own: Option<&'a WorkerHost>,
    hosts: &'a [Arc<RemoteHost>],
    storage: &'a Arc<Guarded>,
    exchange: &'a Arc<crate::exchange::Exchange>,
    mesh: &'a MeshPlan,
    limits: StepLimits,
    /// The epoch this coordinator recorded the adopted step in, if it did.
    recorded: Option<u64>,
    /// The coordinator's component and the pipeline's settings: a kept
    /// instance of another is refused.
    component: &'a str,
    config: &'a [(String, String)],
}

impl AdoptOne<'_> {
    /// Adopts `kept`, committing its share of step `commit` first, if
    /// given. Refused where the instance moved on since it was seen.
    async fn one(&self, kept: &Kept, commit: Option<u64>) -> Result<AnyWorker> {
        let (w, slot) = (kept.parked.worker, kept.slot);
        let at = kept.parked.at.as_ref().ok_or(Error::WorkersLost)?;
        if slot == 0 {
            let own = self.own.ok_or(Error::WorkersLost)?;
            let (mut worker, held) = own
                .unpark(w, at, self.component, self.config)
                .await
                .ok_or(Error::WorkersLost)?;
            if let Some(step) = commit {
                // Committed here, with this process's holder of the worker
                // (fencing any other).
                let share = held.filter(|c| c.step == step).ok_or(Error::WorkersLost)?;
                let storage = self.storage.clone();
                blocking(move || {
                    let mut holder = storage.take_worker(w)?;
                    holder.commit(&share).map_err(share_error)?;
                    Ok::<_, Error>(())
                })
                .await?;
            }
            worker.rewire(self.exchange.clone());
            worker.set_step_limits(self.limits);
            return Ok(AnyWorker::Local(Box::new(worker)));
        }
        let host = self
            .hosts
            .get(slot as usize - 1)
            .ok_or(Error::WorkersLost)?
            .clone();
        let adopt = Adopt {
            recorded: self.recorded,
            at: at.clone(),
            component: self.component.to_owned(),
            config: self.config.to_vec(),
        };
        let remote = RemoteWorker::adopt(host, w, self.mesh, self.limits, adopt).await?;
        if let Some(step) = commit {
            remote.commit_share(step).await?;
        }
        Ok(AnyWorker::Remote(remote))
    }
}
