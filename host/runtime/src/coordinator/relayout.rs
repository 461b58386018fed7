//! Layout changes between two steps: a rescale to another W (the moving
//! shards handed off between instances, committed with the next step's
//! record, then checkpointed) and moving workers onto another set of
//! hosts (each moving worker's state handed from its old instance to its
//! new one, in memory).

use super::Coordinator;
use super::options::Relayout;
use super::workers::{coordinator_exchange, start_worker};
use crate::error::{Error, Result};
use crate::hosts::RemoteHost;
use crate::hosts::placement::{place_one, replace_placement};
use sluice_core::crash::{CrashPoint, crash_point};
use sluice_core::{ConfigError, Frontier, Layout, PartitionId, SHARDS};
use std::sync::Arc;
use std::time::Instant;

impl Coordinator {
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
        if workers == self.placement.layout.workers {
            return Ok(None);
        }
        self.settle_commit().await?;
        self.await_checkpoint().await?;
        let started = Instant::now();
        let next = self.placement.layout.rebalance(workers);
        let from = self.placement.layout.workers;
        let shards_moved = self.placement.layout.moves(&next).len() as u32;
        let bytes_moved = self.relayout(next).await?;
        self.placement.relayout_pending = true;
        self.step_with(true, false).await?;
        let pause = started.elapsed();
        crash_point(CrashPoint::AfterRelayout);
        // The change is committed with the step; its checkpoint shortens
        // the replay of a crash and may be delayed by a store outage.
        self.checkpoint_or_delay().await?;
        self.replicate().await?;
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
    pub(super) async fn relayout(&mut self, next: Layout) -> Result<u64> {
        let r = self.relayout_inner(next).await;
        if r.is_err() {
            self.placement.drop_instances();
        }
        r
    }

    pub(super) async fn relayout_inner(&mut self, next: Layout) -> Result<u64> {
        // Pieces move between workers: the next checkpoint is whole.
        self.checkpoints.base = None;
        // The followers are built again once the new layout is committed.
        self.placement.followers.clear();
        next.validate(&self.shape)
            .map_err(|m| ConfigError::Invalid(format!("layout {}: {m}", next.epoch)))?;
        let old = std::mem::replace(&mut self.placement.layout, next.clone());
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
            let worker = self.placement.instances[w as usize]
                .as_mut()
                .ok_or(Error::WorkersLost)?;
            for (shard, state) in worker.export_shards(shards).await? {
                handed.push((w, shard, state));
            }
        }
        crash_point(CrashPoint::MidHandoff);
        self.placement.instances.truncate(next.workers as usize);
        self.placement.slots.truncate(next.workers as usize);
        while self.placement.slots.len() < next.workers as usize {
            let slot = place_one(&self.placement.slots, self.placement.hosts.len() + 1);
            self.placement.slots.push(slot);
        }
        (self.placement.exchange, self.placement.mesh) =
            coordinator_exchange(&next, &self.placement.hosts, &self.placement.slots, &[])?;
        for slot in self.placement.instances.iter_mut() {
            let worker = slot.as_mut().ok_or(Error::WorkersLost)?;
            worker
                .relayout(next.workers, &self.placement.exchange, &self.placement.mesh)
                .await?;
        }
        for w in old.workers..next.workers {
            let worker = start_worker(
                &self.engine,
                &self.component,
                &self.options,
                &self.placement.hosts,
                self.limits,
                w,
                next.workers,
                self.placement.mesh.slot(w),
                &self.placement.exchange,
                &self.placement.mesh,
            )
            .await?;
            self.placement.instances.push(Some(worker));
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
                let worker = self.placement.instances[w]
                    .as_mut()
                    .ok_or(Error::WorkersLost)?;
                worker.restore(pieces).await?;
            }
        }
        let offsets: Vec<(PartitionId, u64)> = self
            .position
            .frontiers
            .iter()
            .flatten()
            .map(|(id, o)| (*id, *o))
            .collect();
        self.placement.owned = next.assignment(&self.shape);
        self.position.frontiers = vec![Frontier::new(); next.workers as usize];
        for (id, offset) in offsets {
            let reader = next.reader(id.input, id.partition).ok_or_else(|| {
                ConfigError::Invalid(format!("layout {} has no reader of {id:?}", next.epoch))
            })?;
            self.position.frontiers[reader as usize].insert(id, offset);
        }
        for (w, parts) in self.placement.owned.iter().enumerate() {
            for (id, _) in parts {
                self.position.frontiers[w].entry(*id).or_insert(0);
            }
        }
        Ok(bytes_moved)
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
        self.settle_commit().await?;
        self.await_checkpoint().await?;
        let r = self.replace_hosts_inner(hosts).await;
        if r.is_err() {
            self.placement.drop_instances();
        }
        let moved = r?;
        self.replicate().await?;
        Ok(moved)
    }

    pub(super) async fn replace_hosts_inner(&mut self, hosts: Vec<Arc<RemoteHost>>) -> Result<u64> {
        let from: Vec<&str> = self.placement.hosts.iter().map(|h| h.addr()).collect();
        let to: Vec<&str> = hosts.iter().map(|h| h.addr()).collect();
        // The followers are built again on the new hosts.
        self.placement.followers.clear();
        let placement = replace_placement(&self.placement.slots, &from, &to);
        let addr = |slot: u32, hosts: &[&str]| -> Option<String> {
            (slot > 0).then(|| hosts[slot as usize - 1].to_owned())
        };
        let stays: Vec<bool> = (0..self.placement.layout.workers as usize)
            .map(|w| addr(self.placement.slots[w], &from) == addr(placement[w], &to))
            .collect();
        let all: Vec<u32> = (0..SHARDS).collect();
        let mut moved = 0u64;
        // The workers' places change: a new exchange session for all.
        let (exchange, mesh) =
            coordinator_exchange(&self.placement.layout, &hosts, &placement, &[])?;
        for w in 0..self.placement.layout.workers {
            if stays[w as usize] {
                let worker = self.placement.instances[w as usize]
                    .as_mut()
                    .ok_or(Error::WorkersLost)?;
                worker.rewire(&exchange, &mesh).await?;
                continue;
            }
            let mut old = self.placement.instances[w as usize]
                .take()
                .ok_or(Error::WorkersLost)?;
            let pieces = old.export_shards(&all).await?;
            drop(old);
            let mut fresh = start_worker(
                &self.engine,
                &self.component,
                &self.options,
                &hosts,
                self.limits,
                w,
                self.placement.layout.workers,
                mesh.slot(w),
                &exchange,
                &mesh,
            )
            .await?;
            fresh.set_step_limits(self.limits);
            moved += pieces.iter().map(|(_, p)| p.len() as u64).sum::<u64>();
            if !pieces.is_empty() {
                fresh.restore(pieces).await?;
            }
            self.placement.instances[w as usize] = Some(fresh);
            self.stats.workers_moved += 1;
        }
        self.placement.hosts = hosts;
        self.placement.slots = placement;
        self.placement.exchange = exchange;
        self.placement.mesh = mesh;
        // Pieces moved between instances: the next checkpoint is whole.
        self.checkpoints.base = None;
        Ok(moved)
    }
}
