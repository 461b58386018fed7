//! Replicas of a worker ([`PipelineOptions::replicas`](super::PipelineOptions::replicas)):
//! beside each worker's primary instance, followers on other slots step on
//! the same input and exchange the same events. The primary's output is
//! committed as before; each follower's output is hashed where it runs and
//! only the hash comes back, checked against the primary's before the step
//! is committed. A difference is a nondeterminism finding
//! ([`Error::ReplicasDiverged`]) and the pipeline stops, nothing of the step
//! written; the exchange checks the replicas' copies of every round too
//! ([`ExchangeError::Diverged`](crate::ExchangeError::Diverged)).
//!
//! A follower is built from its primary's state, in memory (a full
//! snapshot restored into a fresh instance), when the coordinator opens,
//! after a layout change and after the hosts change: so every follower
//! holds exactly its primary's state at a step boundary.

use super::Coordinator;
use super::step::{Commit, cause_rank, root_cause};
use super::workers::{AnyWorker, coordinator_exchange, start_worker};
use crate::error::{Error, ExchangeError, Result};
use crate::hosts::placement::replica_slot;
use crate::hosts::{ShareSpec, Stepped};
use crate::step_io::{InputRange, Spare, StepRead, WorkerOutput, blocking, read_batches};

/// A replica of a worker beside its primary: it steps on the same input,
/// exchanges the same events, and its output's hash is checked against the
/// primary's every step.
pub(crate) struct Follower {
    /// The slot it runs on (0 this process, `i` the `i`-th host).
    pub(super) slot: u32,
    /// Its instance (taken while it steps).
    pub(super) instance: Option<AnyWorker>,
}

/// A follower's step under way: its worker, its index among the worker's
/// followers, and the task running it.
pub(super) type FollowerTask = (
    usize,
    usize,
    tokio::task::JoinHandle<(AnyWorker, Result<Stepped>)>,
);

impl Coordinator {
    /// How many replicas each worker gets: the option, at most one per
    /// slot (this process and every host).
    pub fn replicas_wanted(&self) -> usize {
        (self.options.replicas.max(1) as usize).min(self.placement.hosts.len() + 1)
    }

    /// The slots of each worker's followers.
    pub(super) fn follower_slots(&self) -> Vec<Vec<u32>> {
        self.placement
            .followers
            .iter()
            .map(|fs| fs.iter().map(|f| f.slot).collect())
            .collect()
    }

    /// The zone of the host on `slot` ([`PipelineOptions::zones`](super::PipelineOptions::zones)),
    /// if it has one.
    pub(super) fn slot_zone(&self, slot: u32) -> Option<&str> {
        let addr = match slot as usize {
            0 => "",
            s => self.placement.hosts.get(s - 1)?.addr(),
        };
        self.options.zones.get(addr).map(String::as_str)
    }

    /// Who runs on `slot`, for messages: "this host" or a host's address.
    pub(super) fn slot_name(&self, slot: u32) -> String {
        match slot as usize {
            0 => "this host".into(),
            s => self
                .placement
                .hosts
                .get(s - 1)
                .map_or_else(|| format!("slot {s}"), |h| format!("host {}", h.addr())),
        }
    }

    /// The addresses of each worker's followers' hosts (empty for this
    /// process), as [`placement_addrs`](Self::placement_addrs) gives the
    /// primaries'.
    pub fn replica_addrs(&self) -> Vec<Vec<String>> {
        self.placement
            .followers
            .iter()
            .map(|fs| fs.iter().map(|f| self.slot_addr(f.slot)).collect())
            .collect()
    }

    /// The addresses of the hosts the workers run on now (a host whose
    /// replicas were lost leaves before the next step): a leader adds the
    /// group's other hosts back with [`replace_hosts`](Self::replace_hosts).
    pub fn host_addrs(&self) -> Vec<String> {
        self.placement
            .hosts
            .iter()
            .map(|h| h.addr().to_owned())
            .collect()
    }

    /// Whether replicas were lost (or a follower took over) in the last
    /// step and the placement is not healed yet: the next step first drops
    /// the hosts whose connection ended and rebuilds the replicas.
    pub fn degraded(&self) -> bool {
        self.placement.heal_pending
    }

    /// Brings every worker up to its replicas: each missing follower goes
    /// to the least loaded slot that runs no replica of its worker yet,
    /// starts there and takes its primary's whole state (a full snapshot,
    /// so the next checkpoint is whole); then every instance exchanges in
    /// a new session that knows the followers. Does nothing when every
    /// worker has its replicas. On failure the instances are dropped
    /// (reopening recovers).
    pub(super) async fn replicate(&mut self) -> Result<()> {
        let r = self.replicate_inner().await;
        if r.is_err() {
            self.placement.drop_instances();
        }
        r
    }

    async fn replicate_inner(&mut self) -> Result<()> {
        let wanted = self.replicas_wanted();
        let workers = self.placement.layout.workers as usize;
        let slots = self.placement.hosts.len() + 1;
        self.placement.followers.resize_with(workers, Vec::new);
        let mut load = vec![0u32; slots];
        for s in self
            .placement
            .slots
            .iter()
            .chain(self.follower_slots().iter().flatten())
        {
            if let Some(l) = load.get_mut(*s as usize) {
                *l += 1;
            }
        }
        let mut planned = self.follower_slots();
        let mut new: Vec<(u32, u32)> = Vec::new();
        let zones: Vec<Option<&str>> = (0..slots as u32).map(|s| self.slot_zone(s)).collect();
        let zone = |s: u32| zones.get(s as usize).copied().flatten();
        for (w, followers) in planned.iter_mut().enumerate() {
            let primary = self.placement.slots[w];
            while followers.len() + 1 < wanted {
                // Another zone first, then the least loaded free slot.
                let taken: Vec<u32> = std::iter::once(primary)
                    .chain(followers.iter().copied())
                    .collect();
                let Some(slot) = replica_slot(&taken, &load, zone) else {
                    break;
                };
                load[slot as usize] += 1;
                followers.push(slot);
                new.push((w as u32, slot));
            }
        }
        if new.is_empty() {
            return Ok(());
        }
        // A full snapshot marks every shard unchanged: no checkpoint may be
        // in flight whose incremental successor would count on the marks.
        self.await_checkpoint().await?;
        let layout = self.placement.layout.clone();
        let (exchange, mesh) = coordinator_exchange(
            &layout,
            &self.placement.hosts,
            &self.placement.slots,
            &planned,
        )?;
        for instance in self.placement.instances.iter_mut() {
            let worker = instance.as_mut().ok_or(Error::WorkersLost)?;
            worker.rewire(&exchange, &mesh).await?;
        }
        for follower in self.placement.followers.iter_mut().flatten() {
            let worker = follower.instance.as_mut().ok_or(Error::WorkersLost)?;
            worker.rewire(&exchange, &mesh).await?;
        }
        // One snapshot of each primary for all its new followers.
        let mut snapshot_of: Option<u32> = None;
        let mut pieces: Vec<(u32, Vec<u8>)> = Vec::new();
        for (w, slot) in new {
            if snapshot_of != Some(w) {
                let primary = self.placement.instances[w as usize]
                    .as_mut()
                    .ok_or(Error::WorkersLost)?;
                pieces = primary.snapshot(false).await?.pieces;
                snapshot_of = Some(w);
            }
            let pieces = pieces.clone();
            let mut follower = start_worker(
                &self.engine,
                &self.component,
                &self.options,
                &self.placement.hosts,
                self.limits,
                w,
                layout.workers,
                slot,
                &exchange,
                &mesh,
            )
            .await?;
            follower.set_step_limits(self.limits);
            self.stats.replica_bytes += pieces.iter().map(|(_, p)| p.len() as u64).sum::<u64>();
            if !pieces.is_empty() {
                follower.restore(pieces).await?;
            }
            self.placement.followers[w as usize].push(Follower {
                slot,
                instance: Some(follower),
            });
            self.stats.replicas_built += 1;
        }
        self.placement.exchange = exchange;
        self.placement.mesh = mesh;
        // The primaries' snapshots marked every shard unchanged.
        self.checkpoints.base = None;
        tracing::info!(
            pipeline = %self.options.name,
            replicas = wanted,
            followers = ?self.follower_slots(),
            "followers built"
        );
        Ok(())
    }

    /// Starts every follower's step beside the primaries': on the same
    /// input ranges (`ranges[w]`, read by the follower's host where it
    /// reads the logs, here otherwise), held there as a follower's share
    /// whose hash comes back.
    pub(super) async fn start_followers(
        &mut self,
        ranges: &[Vec<InputRange>],
        target: &[sluice_core::Frontier],
        step: u64,
        time_ms: u64,
    ) -> Result<Vec<FollowerTask>> {
        let location = self.storage.log().location();
        // What each follower steps on, read first: a read that fails
        // leaves every instance where it was.
        let reading: Vec<(usize, usize, bool)> = self
            .placement
            .followers
            .iter()
            .enumerate()
            .flat_map(|(w, followers)| followers.iter().enumerate().map(move |(i, f)| (w, i, f)))
            .map(|(w, i, f)| {
                let reads = matches!(&f.instance, Some(AnyWorker::Remote(r))
                    if location.is_some() && r.log() == location.as_deref());
                (w, i, reads)
            })
            .collect();
        let mut inputs: Vec<(usize, usize, bool, StepRead)> = Vec::new();
        for (w, i, reads) in reading {
            let read = match reads {
                true => StepRead::default(),
                false => {
                    let (storage, ranges) = (self.storage.clone(), ranges[w].clone());
                    blocking(move || read_batches(storage.log(), &ranges, false, &Spare::default()))
                        .await?
                }
            };
            inputs.push((w, i, reads, read));
        }
        let mut tasks = Vec::new();
        for (w, i, reads, read) in inputs {
            let mut worker = self.placement.followers[w][i]
                .instance
                .take()
                .ok_or(Error::WorkersLost)?;
            let spec = ShareSpec {
                frontier: target[w].clone(),
                outputs: self.shape.outputs.clone(),
                checks: self.output_checks(),
                now: false,
                follow: true,
                epoch: self.epoch,
                own_input: reads,
            };
            let offsets = if reads { ranges[w].clone() } else { Vec::new() };
            let slot = self.placement.followers[w][i].slot;
            let exchange = self.placement.exchange.clone();
            tasks.push((
                w,
                i,
                tokio::spawn(async move {
                    let r = match &mut worker {
                        AnyWorker::Local(local) => {
                            let r = local.step(step, time_ms, &read.batches).await;
                            exchange.worker_finished(w as u32);
                            r.map(|outputs| Stepped {
                                outputs,
                                events: 0,
                                shared: None,
                                dead_letters: read.dead_letters,
                                checked: None,
                            })
                        }
                        AnyWorker::Remote(remote) => {
                            remote
                                .step_follower(step, time_ms, read.batches, offsets, spec)
                                .await
                        }
                    };
                    if let Err(e) = &r {
                        match slot {
                            0 => exchange.worker_failed(w as u32, &e.to_string()),
                            // Its host is given up for the step: the
                            // worker's other replicas may carry on.
                            _ => {
                                let why = format!("a follower of worker {w} failed there: {e}");
                                exchange.slot_lost(slot, ExchangeError::Aborted(why));
                            }
                        }
                    }
                    (worker, r)
                }),
            ));
        }
        Ok(tasks)
    }

    /// Waits for the followers' steps: each one's output (as
    /// [`output_of`](Self::output_of) gives it), or why it failed.
    pub(super) async fn follower_outcomes(
        &mut self,
        tasks: Vec<FollowerTask>,
        step: u64,
    ) -> Vec<(usize, usize, Result<WorkerOutput>)> {
        let mut outcomes = Vec::with_capacity(tasks.len());
        for (w, i, task) in tasks {
            let outcome = match task.await {
                Ok((mut worker, r)) => {
                    self.stats.fuel_used += worker.take_fuel_used();
                    self.placement.followers[w][i].instance = Some(worker);
                    r.and_then(|stepped| self.output_of(w as u32, step, stepped))
                }
                Err(e) => Err(Error::task(format!("a follower of worker {w}"))(e)),
            };
            outcomes.push((w, i, outcome));
        }
        outcomes
    }

    /// Settles a step's replicas: every replica that stepped must have
    /// computed the same output as the others of its worker (else
    /// [`Error::ReplicasDiverged`]); a failure that is not transient (the
    /// guest's) stops the step. Otherwise each worker needs one replica
    /// that stepped and can commit: its primary, or — when the primary
    /// failed (its host died, stalled or was cut off) — a follower, which
    /// becomes the primary: the step goes on, nothing is replayed. Replicas
    /// that failed are dropped; the next step first heals the placement
    /// ([`heal`](Self::heal)). Returns each worker's output.
    pub(super) fn settle_replicas(
        &mut self,
        step: u64,
        primaries: Vec<Result<WorkerOutput>>,
        followers: Vec<(usize, usize, Result<WorkerOutput>)>,
        commit: Commit,
    ) -> Result<Vec<WorkerOutput>> {
        // The root cause of any failure, and whether it is the guest's.
        let errors = primaries
            .iter()
            .chain(followers.iter().map(|(_, _, r)| r))
            .filter_map(|r| r.as_ref().err());
        let worst = errors.max_by_key(|e| cause_rank(e));
        if let Some(e) = worst
            && !e.is_transient()
        {
            let all = primaries
                .into_iter()
                .chain(followers.into_iter().map(|(_, _, r)| r))
                .collect();
            return Err(root_cause(all).err().unwrap_or(Error::WorkersLost));
        }
        let workers = primaries.len();
        // Per worker, its replicas that stepped: (follower index or None
        // for the primary, output).
        let mut stepped: Vec<Vec<(Option<usize>, WorkerOutput)>> =
            (0..workers).map(|_| Vec::new()).collect();
        let mut failed_followers: Vec<(usize, usize)> = Vec::new();
        let mut first_error: Option<Error> = None;
        for (w, r) in primaries.into_iter().enumerate() {
            match r {
                Ok(out) => stepped[w].push((None, out)),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        for (w, i, r) in followers {
            match r {
                Ok(out) => stepped[w].push((Some(i), out)),
                Err(e) => {
                    failed_followers.push((w, i));
                    first_error.get_or_insert(e);
                }
            }
        }
        for (w, outs) in stepped.iter().enumerate() {
            let Some((first, reference)) = outs.first() else {
                // No replica of this worker stepped: recovery it is.
                return Err(first_error.unwrap_or(Error::WorkersLost));
            };
            if let Some((other, out)) = outs.iter().find(|(_, o)| o.hash != reference.hash) {
                let at = |i: &Option<usize>| match i {
                    None => self.slot_name(self.placement.slots[w]),
                    Some(i) => self.slot_name(self.placement.followers[w][*i].slot),
                };
                return Err(Error::ReplicasDiverged {
                    step,
                    worker: w as u32,
                    primary: format!("{:032x}", reference.hash),
                    primary_at: at(first),
                    replica: format!("{:032x}", out.hash),
                    replica_at: at(other),
                });
            }
            self.stats.replica_steps_checked += outs.len().saturating_sub(1) as u64;
        }
        // Each worker's output: its primary's, or a follower's that takes
        // over.
        let mut outputs = Vec::with_capacity(workers);
        let mut promoted: Vec<(usize, usize)> = Vec::new();
        self.placement.held_here.clear();
        for (w, outs) in stepped.into_iter().enumerate() {
            // A follower here keeps its output until the step is committed:
            // it commits it if the primary's host fails to.
            // (The primary, when it stepped, comes first.)
            let mut outs = outs;
            if commit == Commit::Hold
                && outs.first().is_some_and(|(i, _)| i.is_none())
                && let Some(at) = outs.iter().position(|(i, o)| {
                    i.is_some_and(|i| self.placement.followers[w][i].slot == 0)
                        && o.shared.is_none()
                })
            {
                let (_, out) = outs.remove(at);
                self.placement.held_here.push((w, out));
            }
            let mut outs = outs.into_iter();
            let taken = outs.find(|(i, _)| match i {
                None => true,
                Some(i) => self.takes_over(w, *i, commit),
            });
            match taken {
                Some((None, out)) => outputs.push(out),
                Some((Some(i), out)) => {
                    promoted.push((w, i));
                    outputs.push(out);
                }
                // Only followers whose output is not here (held on a host
                // that may not commit it, or a whole step): recovery.
                None => return Err(first_error.unwrap_or(Error::WorkersLost)),
            }
        }
        // A promoted follower's place takes the old primary's (failed)
        // instance: dropped with the followers that failed.
        let mut gone = failed_followers;
        for (w, i) in promoted {
            self.promote(w, i);
            gone.push((w, i));
            self.stats.failovers += 1;
        }
        gone.sort_unstable();
        gone.dedup();
        self.placement.heal_pending |= !gone.is_empty();
        for (w, i) in gone.into_iter().rev() {
            self.placement.followers[w].remove(i);
            self.stats.replicas_lost += 1;
        }
        Ok(outputs)
    }
    /// Whether follower `i` of worker `w` can take over from its primary
    /// in a step committed as `commit`: its output is here (this process),
    /// or its host holds it as a share and may commit it.
    fn takes_over(&self, w: usize, i: usize, commit: Commit) -> bool {
        let location = self.storage.log().location();
        match &self.placement.followers[w][i].instance {
            Some(AnyWorker::Local(_)) => true,
            Some(AnyWorker::Remote(r)) => {
                commit == Commit::Hold
                    && r.commits()
                    && location.is_some()
                    && r.log() == location.as_deref()
            }
            None => false,
        }
    }

    /// Has a follower of worker `w` whose host holds its share of divided
    /// step `step` commit it, after the primary's host failed to: the
    /// follower's host takes the worker — fencing the old primary's holder,
    /// so whatever it did not commit it never will — and commits the share,
    /// or finds the done record the old primary wrote first and checks its
    /// hash (`hash`, every replica's). The follower becomes the primary.
    /// Returns whether one did.
    pub(super) async fn commit_by_follower(&mut self, w: usize, step: u64, hash: u128) -> bool {
        for i in 0..self.placement.followers[w].len() {
            if !self.takes_over(w, i, Commit::Hold) {
                continue;
            }
            let Some(AnyWorker::Remote(r)) = &self.placement.followers[w][i].instance else {
                continue;
            };
            match r.commit_share(step).await {
                Ok(done) if done.hash == hash => {
                    self.promote(w, i);
                    self.placement.followers[w].remove(i);
                    self.placement.heal_pending = true;
                    self.stats.failovers += 1;
                    self.stats.replicas_lost += 1;
                    return true;
                }
                Ok(done) => {
                    tracing::error!(
                        worker = w,
                        step,
                        held = %format!("{:032x}", done.hash),
                        expected = %format!("{hash:032x}"),
                        "a follower's share differs from the step's"
                    );
                }
                Err(e) => {
                    tracing::warn!(worker = w, step, error = %e, "a follower could not commit the share");
                }
            }
        }
        false
    }

    /// Between steps, after the primaries of `workers` failed transiently
    /// (their host lost): each one's first follower becomes its primary
    /// (every follower holds its primary's state at a step boundary).
    /// Returns whether every one had a follower; the placement heals before
    /// the next step.
    pub(super) fn fail_over(&mut self, workers: &[usize]) -> bool {
        if workers.is_empty()
            || workers
                .iter()
                .any(|w| self.placement.followers.get(*w).is_none_or(Vec::is_empty))
        {
            return false;
        }
        for &w in workers {
            self.promote(w, 0);
            self.placement.followers[w].remove(0);
            self.stats.failovers += 1;
            self.stats.replicas_lost += 1;
        }
        self.placement.heal_pending = true;
        true
    }

    /// Worker `w`'s follower in this process becomes its primary, after
    /// the primary's host failed to commit its share of the divided step
    /// just run: returns the follower's output of that step, to commit
    /// here (`None`: no follower here stepped).
    pub(super) fn take_over_here(&mut self, w: usize) -> Option<WorkerOutput> {
        let at = self
            .placement
            .held_here
            .iter()
            .position(|(of, _)| *of == w)?;
        let (_, out) = self.placement.held_here.swap_remove(at);
        let i = self.placement.followers[w]
            .iter()
            .position(|f| f.slot == 0)?;
        self.promote(w, i);
        self.placement.followers[w].remove(i);
        self.placement.heal_pending = true;
        self.stats.failovers += 1;
        self.stats.replicas_lost += 1;
        Some(out)
    }

    /// Follower `i` of worker `w` becomes its primary; the old primary
    /// takes the follower's place (to be dropped).
    fn promote(&mut self, w: usize, i: usize) {
        let follower = &mut self.placement.followers[w][i];
        std::mem::swap(&mut self.placement.instances[w], &mut follower.instance);
        std::mem::swap(&mut self.placement.slots[w], &mut follower.slot);
        // Its change marks count from its own start, not from the newest
        // checkpoint (nor from one being written): the next checkpoint is
        // whole (the WIT contract of `snapshot(changed-only)`).
        self.checkpoints.base = None;
        if let Some(p) = self.checkpoints.pending.as_mut() {
            p.base = false;
        }
        // Whoever held the worker here holds it no longer: the new
        // primary's host takes it.
        if let Some(c) = self.placement.committers.get_mut(w) {
            *c = None;
        }
        tracing::warn!(
            pipeline = %self.options.name,
            worker = w,
            now_on = %self.slot_name(self.placement.slots[w]),
            "a follower took over from its primary: nothing is replayed"
        );
    }

    /// After replicas were lost or a follower took over: the hosts whose
    /// connection ended leave the placement (with the followers they ran),
    /// every instance exchanges in a new session, and the workers are
    /// brought back to their replicas from the survivors' state. On
    /// failure the instances are dropped (reopening recovers).
    pub(super) async fn heal(&mut self) -> Result<()> {
        if !self.placement.heal_pending || self.position.next_step < self.placement.heal_not_before
        {
            return Ok(());
        }
        let r = self.heal_inner().await;
        if r.is_err() {
            self.placement.drop_instances();
        }
        r
    }

    async fn heal_inner(&mut self) -> Result<()> {
        self.placement.heal_pending = false;
        let alive: Vec<bool> = std::iter::once(true)
            .chain(self.placement.hosts.iter().map(|h| h.closed().is_none()))
            .collect();
        // A primary whose host's connection ended since the last step (it
        // stepped, then the host went): a follower on a live host holds the
        // same state, and takes over.
        for w in 0..self.placement.slots.len() {
            let slot = self.placement.slots[w];
            if alive[slot as usize] {
                continue;
            }
            let live = self.placement.followers[w]
                .iter()
                .position(|f| alive[f.slot as usize] && f.instance.is_some());
            let Some(i) = live else {
                let host = self.slot_name(slot);
                return Err(Error::remote(
                    &host,
                    format!("its connection ended, and no other host runs worker {w}"),
                ));
            };
            self.promote(w, i);
            self.placement.followers[w].remove(i);
            self.stats.failovers += 1;
            self.stats.replicas_lost += 1;
        }
        for followers in self.placement.followers.iter_mut() {
            followers.retain(|f| alive[f.slot as usize]);
        }
        // Slot numbers of the hosts that stay, in their order.
        let mut next = 0u32;
        let renumber: Vec<u32> = alive
            .iter()
            .map(|a| {
                let slot = next;
                next += u32::from(*a);
                slot
            })
            .collect();
        let mut i = 0;
        self.placement.hosts.retain(|_| {
            i += 1;
            alive[i]
        });
        for s in self.placement.slots.iter_mut() {
            *s = renumber[*s as usize];
        }
        for f in self.placement.followers.iter_mut().flatten() {
            f.slot = renumber[f.slot as usize];
        }
        let layout = self.placement.layout.clone();
        let followers = self.follower_slots();
        let (exchange, mesh) = coordinator_exchange(
            &layout,
            &self.placement.hosts,
            &self.placement.slots,
            &followers,
        )?;
        for instance in self.placement.instances.iter_mut() {
            let worker = instance.as_mut().ok_or(Error::WorkersLost)?;
            worker.rewire(&exchange, &mesh).await?;
        }
        for follower in self.placement.followers.iter_mut().flatten() {
            let worker = follower.instance.as_mut().ok_or(Error::WorkersLost)?;
            worker.rewire(&exchange, &mesh).await?;
        }
        self.placement.exchange = exchange;
        self.placement.mesh = mesh;
        self.replicate_inner().await
    }

    /// Whether any worker has followers.
    pub(super) fn has_followers(&self) -> bool {
        self.placement.followers.iter().any(|f| !f.is_empty())
    }
}
