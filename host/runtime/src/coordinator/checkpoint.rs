//! Checkpoints: snapshot every instance after a committed step (each
//! worker's host writing its own pieces where it reaches the store, the
//! unchanged shards carried from the last checkpoint), write the
//! checkpoint and trim the input it covers in the background while steps
//! go on.
//!
//! **A store outage delays checkpoints, never steps.** A write that fails
//! transiently (the object store or the disk is away) leaves the newest
//! committed checkpoint as it was: nothing is trimmed, the next checkpoint
//! is written whole, and it is tried again after the checkpoint interval
//! (no sooner, so an outage does not pause every step for snapshots). The
//! pipeline reports that its checkpoints are behind, and why
//! ([`Coordinator::checkpoints_behind`]). A refusal that would recur — an
//! invariant, a fence — still fails the step.

use super::workers::AnyWorker;
use super::{Base, CheckpointsBehind, Coordinator, PendingCheckpoint, Written};
use crate::error::{Error, Result};
use sluice_core::crash::{CrashPoint, crash_point};
use sluice_storage::{Carried, Checkpoint, CheckpointMeta, Staged, StatePiece};
use std::collections::BTreeSet;
use std::time::Instant;

/// What taking one worker's part of a checkpoint gave.
enum Taken {
    /// Its pieces, here.
    Pieces(crate::worker::Snapshot),
    /// Its host wrote them to the store.
    Staged(Staged, Option<Vec<u32>>),
}

impl Coordinator {
    /// Whether a checkpoint is due (by steps or by time since the last); after
    /// a failed write, not before its retry time.
    pub fn checkpoint_due(&self) -> bool {
        self.checkpoint_due_at(self.position.next_step)
    }

    /// Whether a checkpoint will be due once the next step is committed.
    pub(super) fn checkpoint_due_after_next(&self) -> bool {
        self.checkpoint_due_at(self.position.next_step + 1)
    }

    /// [`checkpoint_due`](Self::checkpoint_due) with `next_step` steps
    /// committed.
    fn checkpoint_due_at(&self, next_step: u64) -> bool {
        if self
            .checkpoints
            .behind
            .as_ref()
            .is_some_and(|b| Instant::now() < b.retry_at)
        {
            return false;
        }
        let last = self
            .checkpoints
            .pending
            .as_ref()
            .map(|p| p.step)
            .or(self.checkpoints.step);
        let since = next_step.saturating_sub(last.map_or(0, |s| s + 1));
        since >= self.options.checkpoint_every_steps.max(1)
            || self.checkpoints.last_at.elapsed() >= self.options.checkpoint_interval
    }

    /// Why the pipeline's checkpoints are behind its steps, if they are: the
    /// error of the last failed write, the newest step a checkpoint covers
    /// still being older than the steps committed since.
    pub fn checkpoints_behind(&self) -> Option<&str> {
        self.checkpoints.behind.as_ref().map(|b| b.reason.as_str())
    }

    /// Checkpoints the state after the last committed step (if not yet
    /// checkpointed), then trims the input it covers. Unlike the background
    /// checkpoints of [`step`](Self::step), a write that fails is this
    /// call's error (a graceful stop wants to know).
    pub async fn checkpoint(&mut self) -> Result<()> {
        self.start_checkpoint().await?;
        match self.settle_write().await? {
            Some(Written::Failed(e) | Written::Untrimmed(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// [`checkpoint`](Self::checkpoint) as the background checkpoints take
    /// it: a write that fails transiently only delays checkpoints (the
    /// pipeline reports them [behind](Self::checkpoints_behind)) and is not
    /// this call's error — for a host checkpointing while idle.
    pub async fn checkpoint_or_delay(&mut self) -> Result<()> {
        self.start_checkpoint().await?;
        self.await_checkpoint().await
    }

    /// Takes the snapshots of a checkpoint of the last committed step and
    /// starts writing it (then trimming) in the background. One write at a
    /// time: a previous one is waited for first.
    pub(super) async fn start_checkpoint(&mut self) -> Result<()> {
        // The snapshots follow the last step: its commit is durable first.
        self.settle_commit().await?;
        self.await_checkpoint().await?;
        let Some(step) = self.position.next_step.checked_sub(1) else {
            return Ok(());
        };
        if self.checkpoints.step == Some(step) {
            return Ok(());
        }
        let started = Instant::now();
        // Taking snapshots resets what the instances count as changed: from
        // here until this checkpoint commits, nothing is a base.
        let base = self
            .checkpoints
            .base
            .take()
            .filter(|_| self.options.incremental_checkpoints);
        let incremental = base.is_some();
        // A worker whose host reaches this pipeline's checkpoint store
        // writes its pieces there itself (they never travel here); the
        // others' pieces come here and are written with the manifest.
        let location = self.storage.checkpoints().location();
        let mut tasks = Vec::with_capacity(self.placement.instances.len());
        for slot in self.placement.instances.iter_mut() {
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
        let mut failed = Vec::new();
        for (w, task) in tasks.into_iter().enumerate() {
            match task.await {
                Ok((worker, r)) => {
                    self.placement.instances[w] = Some(worker);
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
                            failed.push(w as usize);
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
            // With replicas, a follower holds the same state: it takes
            // over from a primary whose host is lost, and the snapshots
            // are taken again, whole (the followers' change marks are not
            // this checkpoint's base).
            if e.is_transient() && self.fail_over(&failed) {
                self.checkpoints.base = None;
                return Box::pin(self.start_checkpoint()).await;
            }
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
                frontiers: self.position.frontiers.clone(),
                snapshot_version: self.shape.snapshot_version,
                layout: self.placement.layout.clone(),
            },
            pieces,
        };
        let storage = self.storage.clone();
        let retain_input = self.options.retain_input;
        let write = tokio::task::spawn_blocking(move || -> Written {
            crash_point(CrashPoint::MidCheckpoint);
            let carried = carried.as_ref().filter(|c| !c.pieces.is_empty());
            if let Err(e) = storage.checkpoint_staged(&checkpoint, &staged, carried) {
                return Written::Failed(e.into());
            }
            crash_point(CrashPoint::AfterCheckpoint);
            if retain_input {
                return Written::Done;
            }
            match storage.trim_to_checkpoint() {
                Ok(_) => Written::Done,
                Err(e) => Written::Untrimmed(e.into()),
            }
        });
        self.checkpoints.pending = Some(PendingCheckpoint {
            step,
            started,
            snapshots,
            pieces: all,
            base: true,
            write,
        });
        self.checkpoints.last_at = Instant::now();
        Ok(())
    }

    /// Waits for the checkpoint being written, if any, and records it. A
    /// write that failed transiently only delays checkpoints (see the
    /// module's docs); any other failure is the error.
    pub(super) async fn await_checkpoint(&mut self) -> Result<()> {
        self.settle_write().await.map(|_| ())
    }

    /// [`await_checkpoint`](Self::await_checkpoint), telling how the write
    /// ended (`None`: no write was pending). Errs only on a failure that
    /// would recur.
    async fn settle_write(&mut self) -> Result<Option<Written>> {
        let Some(p) = self.checkpoints.pending.take() else {
            return Ok(None);
        };
        let written = p.write.await.map_err(Error::task("the checkpoint write"))?;
        match &written {
            Written::Failed(e) => {
                if !e.is_transient() {
                    return Err(self.take_error(written));
                }
                // Nothing was committed (or it is unknown whether it was:
                // a store that failed after the write; then the store has
                // a newer checkpoint than this host knows, which the next
                // one supersedes). The instances' change tracking was
                // reset by the snapshots: the next checkpoint is whole.
                self.checkpoints.base = None;
                self.checkpoint_behind(p.step, e);
                return Ok(Some(written));
            }
            Written::Untrimmed(e) if !e.is_transient() => {
                return Err(self.take_error(written));
            }
            Written::Untrimmed(e) => {
                tracing::warn!(
                    pipeline = %self.options.name,
                    step = p.step,
                    error = %e,
                    "checkpoint committed, but trimming the input it covers failed: the next checkpoint trims"
                );
            }
            Written::Done => {
                tracing::debug!(
                    pipeline = %self.options.name,
                    step = p.step,
                    snapshots = ?p.snapshots,
                    total = ?p.started.elapsed(),
                    "checkpoint committed, input trimmed"
                );
            }
        }
        self.checkpoints.step = Some(p.step);
        self.checkpoints.base = p.base.then_some(Base {
            step: p.step,
            pieces: p.pieces,
        });
        self.checkpoints.behind = None;
        self.checkpoints.last_took = p.started.elapsed();
        self.checkpoints.last_snapshots = p.snapshots;
        self.stats.checkpoints += 1;
        Ok(Some(written))
    }

    /// The error a write ended with.
    fn take_error(&self, written: Written) -> Error {
        match written {
            Written::Failed(e) | Written::Untrimmed(e) => e,
            Written::Done => Error::WorkersLost,
        }
    }

    /// Records that the checkpoint of `step` could not be written: the
    /// checkpoints are behind until one is, tried again after the
    /// checkpoint interval.
    fn checkpoint_behind(&mut self, step: u64, e: &Error) {
        self.stats.checkpoint_failures += 1;
        let since = self
            .checkpoints
            .behind
            .as_ref()
            .map_or(step, |b| b.since_step);
        let failures = self.checkpoints.behind.as_ref().map_or(0, |b| b.failures) + 1;
        let reason = format!(
            "{failures} checkpoint write(s) failed since step {since}; the newest committed \
             checkpoint is {}; the last error: {e}",
            self.checkpoints
                .step
                .map_or("none".to_owned(), |s| format!("of step {s}"))
        );
        tracing::warn!(pipeline = %self.options.name, step, error = %e, "a checkpoint write failed: checkpoints (and trims) are delayed, steps go on");
        self.checkpoints.behind = Some(CheckpointsBehind {
            since_step: since,
            failures,
            reason,
            retry_at: Instant::now() + self.options.checkpoint_interval,
        });
    }

    /// Waits for a checkpoint still being written in the background (before
    /// dropping a coordinator whose storage is about to go away).
    pub async fn settle(&mut self) -> Result<()> {
        self.settle_commit().await?;
        self.await_checkpoint().await
    }

    /// Graceful stop: checkpoints the last committed step.
    pub async fn finish(&mut self) -> Result<()> {
        self.checkpoint().await
    }
}
