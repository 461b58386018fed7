//! Divided steps (across hosts, on a log that takes them): every worker
//! computes its share first; the leader records the step's division (its
//! commit point); then each worker's share is committed — by its own host
//! where that host may write the logs, here otherwise — and the step is
//! complete when every share's done record is in the log.

use super::Coordinator;
use super::step::Commit;
use super::workers::AnyWorker;
use crate::error::{Error, Result};
use crate::step_io::{WorkerOutput, blocking, share_error};
use sluice_core::crash::{CrashPoint, crash_point};
use sluice_core::{Frontier, StepCommit};
use sluice_storage::WorkerCommit;

impl Coordinator {
    /// Whether the next step is divided: the log takes divided steps and a
    /// worker's host writes to the pipeline's logs (it reads them), so it
    /// can commit its workers' output itself and the output need not come
    /// back here.
    pub(super) fn divides(&self) -> bool {
        self.storage.log().worker_commits()
            && self
                .hosts_commit_shares(&self.hosts_read_input())
                .contains(&true)
    }

    /// Per worker, whether its host commits the worker's shares of
    /// divided steps: it reads this pipeline's logs and may write them.
    /// `reads` is [`hosts_read_input`](Self::hosts_read_input).
    pub(super) fn hosts_commit_shares(&self, reads: &[bool]) -> Vec<bool> {
        self.placement
            .instances
            .iter()
            .zip(reads)
            .map(|(i, reads)| *reads && matches!(i, Some(AnyWorker::Remote(r)) if r.commits()))
            .collect()
    }

    /// Per worker, whether its host reads this pipeline's logs itself.
    pub(super) fn hosts_read_input(&self) -> Vec<bool> {
        let location = self.storage.log().location();
        self.placement
            .instances
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
    pub(super) async fn take_holders(&mut self) -> Result<()> {
        let here: Vec<u32> = self
            .hosts_commit_shares(&self.hosts_read_input())
            .iter()
            .enumerate()
            .filter(|(_, there)| !**there)
            .map(|(w, _)| w as u32)
            .collect();
        self.placement
            .committers
            .resize_with(self.placement.instances.len(), || None);
        let missing: Vec<u32> = here
            .into_iter()
            .filter(|w| self.placement.committers[*w as usize].is_none())
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
            self.placement.committers[w as usize] = Some(holder);
        }
        Ok(())
    }

    /// Runs and commits a divided step: the division first (the step's
    /// commit point, so a recovery replays exactly this step), then every
    /// worker's share — by its host where the host writes to the logs,
    /// here otherwise — and the step is complete when every share's done
    /// record is in the log.
    pub(super) async fn step_divided(
        &mut self,
        target: Vec<Frontier>,
        step: u64,
        time_ms: u64,
    ) -> Result<bool> {
        let record = self.step_record(step, time_ms, &target);
        // Every worker computes its share first (the hosts hold theirs):
        // a step that fails (a guest, a limit, a host) is not recorded, so
        // a recovery never replays a step that cannot run.
        if let Err(e) = self.take_holders().await {
            self.placement.drop_instances();
            return Err(e);
        }
        let outputs = self
            .execute(&target, step, time_ms, Commit::Hold, None, false)
            .await?;
        crash_point(CrashPoint::MidStep);
        self.commit_record(StepCommit::division(record)).await?;
        // From here on the step is recorded: a failure leaves its completion
        // to recovery, which replays it.
        let events_in = self.position.events_read;
        let skipped = outputs.iter().map(|o| o.dead_count).sum();
        let events_out = self
            .commit_shares(step, &target, outputs, Commit::Hold)
            .await?;
        crash_point(CrashPoint::AfterCommit);
        self.committed(target, time_ms, events_in, events_out, skipped)
            .await
    }

    /// Commits every share of divided step `step`: with [`Commit::Hold`]
    /// the hosts commit the shares they hold; the shares no host commits
    /// are committed here (with this host's holders of those workers),
    /// each with the input records its worker skipped.
    /// Then waits until every worker's done record is in the log and checks
    /// every worker's output against its done record. Returns the output
    /// events. On failure the instances are dropped (recovery finds out
    /// which shares committed).
    pub(super) async fn commit_shares(
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
            self.placement.drop_instances();
        }
        r
    }

    pub(super) async fn commit_shares_inner(
        &mut self,
        step: u64,
        frontiers: &[Frontier],
        mut outputs: Vec<WorkerOutput>,
        commit: Commit,
    ) -> Result<u64> {
        if commit == Commit::Hold {
            // The hosts that hold their workers' shares commit them, side
            // by side.
            let held: Vec<_> = outputs
                .iter()
                .zip(&self.placement.instances)
                .enumerate()
                .filter(|(_, (o, _))| o.shared.is_some())
                .filter_map(|(w, (_, i))| match i {
                    Some(AnyWorker::Remote(r)) => Some((w, tokio::spawn(r.commit_share(step)))),
                    _ => None,
                })
                .collect();
            let mut failed = Vec::new();
            for (w, task) in held {
                match task.await.map_err(Error::task("committing a share"))? {
                    Ok(_) => {}
                    // Its host is lost: a follower holding the same share
                    // may commit it instead.
                    Err(e) if e.is_transient() && self.has_followers() => failed.push((w, e)),
                    Err(e) => return Err(e),
                }
            }
            for (w, e) in failed {
                if self.commit_by_follower(w, step, outputs[w].hash).await {
                    continue;
                }
                // A follower here stepped too: its output is committed
                // here, below, with this host's holder of the worker.
                match self.take_over_here(w) {
                    Some(out) => outputs[w] = out,
                    None => return Err(e),
                }
            }
        }
        let mut events_out = 0;
        self.placement
            .committers
            .resize_with(outputs.len(), || None);
        let hashes: Vec<u128> = outputs.iter().map(|o| o.hash).collect();
        let mut shares = Vec::new();
        for (w, out) in outputs.into_iter().enumerate() {
            let worker = w as u32;
            match out.shared {
                Some(n) => {
                    events_out += n;
                    // Its host holds the worker now: a holder kept here
                    // would be fenced.
                    self.placement.committers[w] = None;
                }
                None => {
                    let outputs = self.shape.outputs.iter().cloned().zip(out.ports);
                    let share = WorkerCommit::new(step, worker, &frontiers[w], outputs, out.hash)
                        .with_dead_letters(&frontiers[w], out.dead_letters.0);
                    events_out += share.events();
                    shares.push((share, self.placement.committers[w].take()));
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
            self.placement.committers[share.worker as usize] = holder;
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
}
