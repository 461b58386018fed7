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
use super::workers::{AnyWorker, coordinator_exchange, start_worker};
use crate::error::{Error, Result};
use crate::hosts::{ShareSpec, Stepped};
use crate::step_io::{InputRange, StepRead, blocking, read_batches};

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
    fn replicas_wanted(&self) -> usize {
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
        for (w, followers) in planned.iter_mut().enumerate() {
            let primary = self.placement.slots[w];
            while followers.len() + 1 < wanted {
                // The least loaded free slot; ties: the highest, so this
                // process is the last to take more.
                let Some(slot) = (0..slots as u32)
                    .filter(|s| *s != primary && !followers.contains(s))
                    .min_by_key(|s| (load[*s as usize], std::cmp::Reverse(*s)))
                else {
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
                    blocking(move || read_batches(storage.log(), &ranges, false)).await?
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
            };
            let offsets = if reads { ranges[w].clone() } else { Vec::new() };
            let exchange = self.placement.exchange.clone();
            tasks.push((
                w,
                i,
                tokio::spawn(async move {
                    let r = match &mut worker {
                        AnyWorker::Local(local) => {
                            let r = local.step(step, time_ms, read.batches).await;
                            exchange.worker_finished(w as u32);
                            r.map(|outputs| Stepped {
                                outputs,
                                events: 0,
                                shared: None,
                                dead_letters: read.dead_letters,
                            })
                        }
                        AnyWorker::Remote(remote) => {
                            remote
                                .step_follower(step, time_ms, read.batches, offsets, spec)
                                .await
                        }
                    };
                    if let Err(e) = &r {
                        exchange.worker_failed(w as u32, &e.to_string());
                    }
                    (worker, r)
                }),
            ));
        }
        Ok(tasks)
    }

    /// Waits for the followers' steps and checks each one's output hash
    /// against its primary's (`hashes[w]`): a follower that failed fails
    /// the step; one whose hash differs is a nondeterminism finding.
    pub(super) async fn check_followers(
        &mut self,
        tasks: Vec<FollowerTask>,
        step: u64,
        hashes: Option<&[u128]>,
    ) -> Result<()> {
        let mut failure: Option<Error> = None;
        let mut diverged: Option<Error> = None;
        for (w, i, task) in tasks {
            let (worker, r) = task
                .await
                .map_err(Error::task(format!("a follower of worker {w}")))?;
            let mut worker = worker;
            self.stats.fuel_used += worker.take_fuel_used();
            let local = matches!(worker, AnyWorker::Local(_));
            self.placement.followers[w][i].instance = Some(worker);
            let hash = r.and_then(|stepped| match stepped.shared {
                Some(done) => Ok(done.hash),
                None if local => Ok(self.convert(w as u32, step, stepped.outputs)?.hash),
                None => Err(Error::remote(
                    &self.slot_name(self.placement.followers[w][i].slot),
                    "a follower's step came back without its hash",
                )),
            });
            match (hash, hashes) {
                (Err(e), _) => {
                    failure.get_or_insert(e);
                }
                (Ok(h), Some(hashes)) if h != hashes[w] => {
                    diverged.get_or_insert(Error::ReplicasDiverged {
                        step,
                        worker: w as u32,
                        primary: format!("{:032x}", hashes[w]),
                        primary_at: self.slot_name(self.placement.slots[w]),
                        replica: format!("{h:032x}"),
                        replica_at: self.slot_name(self.placement.followers[w][i].slot),
                    });
                }
                (Ok(_), Some(_)) => self.stats.replica_steps_checked += 1,
                (Ok(_), None) => {}
            }
        }
        match diverged.or(failure) {
            Some(e) => {
                self.placement.drop_instances();
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Whether any worker has followers.
    pub(super) fn has_followers(&self) -> bool {
        self.placement.followers.iter().any(|f| !f.is_empty())
    }
}
