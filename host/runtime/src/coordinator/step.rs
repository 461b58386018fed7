//! The step, on one host or with every worker's output committed here:
//! divide (each worker's end offsets), run (every worker reads its input
//! and steps, exchanging keyed events), commit (all outputs and the step
//! record at once), then move on — and start a checkpoint if one is due.

use super::Coordinator;
use super::options::COMMITTED_BY_KEPT;
use super::seal::{WrittenStep, seal, write_commit};
use super::workers::AnyWorker;
use crate::bindings::Batch;
use crate::error::{Error, ExchangeError, Result};
use crate::hosts::{ShareSpec, Stepped};
use crate::step_io::{
    InputRange, OutputChecks, SPLIT_READ_EVENTS, StepRead, Unchecked, WorkerOutput, blocking,
    convert_output, input_ranges, read_batches, read_steps, read_threads,
};
use sluice_core::crash::{CrashPoint, crash_point};
use sluice_core::{BadRecordPolicy, Frontier, StepCommit, StepLimits, StepRecord};

/// What a worker steps on.
enum StepInput {
    /// Its input, read here (and the records skipped reading it).
    Batches(StepRead),
    /// The offsets its host reads; with a share, the host also commits the
    /// worker's share of the (divided) step.
    Read(Vec<InputRange>, Option<ShareSpec>),
}

/// The next step's input, read while a step ran: the ranges read and each
/// worker's batches.
pub(super) type ReadAhead = (Vec<Vec<InputRange>>, Vec<StepRead>);

/// A read ahead under way: its result, or `None` when the next division
/// could not be foreseen.
type ReadingAhead = tokio::task::JoinHandle<Result<Option<ReadAhead>>>;

/// A whole step's commit still being written while the next step runs
/// ([`Coordinator::step_overlapped`]): the write (which first checks and
/// hashes the step's output), and the step's figures, counted once it is
/// durable.
pub(super) struct PendingCommit {
    /// The check and the write (`commit_step` on a blocking thread).
    write: tokio::task::JoinHandle<Result<WrittenStep>>,
    /// The step.
    step: u64,
    /// Input events it read, and of them read by the workers' hosts.
    events: (u64, u64),
    /// The position before the step (its frontiers and the time of the
    /// step before): where the pipeline is again if the commit fails.
    before: (Vec<Frontier>, u64),
}

/// How a step commits its workers' output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Commit {
    /// Whole, here: every worker's output comes back.
    Whole,
    /// Divided, before the division is recorded: hosts that commit their
    /// workers' shares hold them until told.
    Hold,
    /// Divided, the division recorded (a replay): hosts commit at once.
    Now,
}

/// The wall clock, in milliseconds since the epoch: a new step's time.
pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Coordinator {
    /// Runs and commits one step. Returns `false` (doing nothing) when no
    /// worker has new input. A checkpoint that falls due is started: its
    /// snapshots pause the pipeline, its write overlaps the next steps.
    pub async fn step(&mut self) -> Result<bool> {
        self.step_with(false, false).await
    }

    /// [`step`](Self::step), but returns once the step's commit is under
    /// way: the next step runs while it is written (a pipeline whose
    /// workers are all in this process, on one log, without replicas; any
    /// other, or a step after which a checkpoint falls due, commits as
    /// [`step`](Self::step) does). The commit is awaited before the next
    /// step's commit starts, and by [`checkpoint`](Self::checkpoint),
    /// [`finish`](Self::finish), [`settle`](Self::settle) and every
    /// [`step`](Self::step). The step's output is checked (well-formed,
    /// within the limits, JSON where the options ask) and hashed as part of
    /// that commit, beside the next step; its failure, or the commit's, is
    /// the error of the call that
    /// awaits it (the instances are then dropped, as after any failed
    /// commit: recovery restores a state that matches the log). Meanwhile
    /// [`next_step`](Self::next_step) and [`frontiers`](Self::frontiers)
    /// already count the step; [`stats`](Self::stats) count it once
    /// committed. Output is still written step by step, in order: a step
    /// whose predecessor's commit failed is never committed.
    pub async fn step_overlapped(&mut self) -> Result<bool> {
        self.step_with(false, true).await
    }

    /// [`step`](Self::step); with `force`, commits a step even when no
    /// worker has new input (to commit a layout change); with `overlap`, as
    /// [`step_overlapped`](Self::step_overlapped).
    pub(super) async fn step_with(&mut self, force: bool, overlap: bool) -> Result<bool> {
        if self
            .checkpoints
            .pending
            .as_ref()
            .is_some_and(|p| p.write.is_finished())
            && let Err(e) = self.await_checkpoint().await
        {
            // Leave no commit writing behind the error either.
            let _ = self.settle_commit().await;
            return Err(e);
        }
        let r = self.step_inner(force, overlap).await;
        if let Err(later) = &r {
            // Leave no write behind a failure: recovery must see the
            // logs, the checkpoint store and the input as they will stay.
            let settled = self.settle_commit().await;
            let _ = self.await_checkpoint().await;
            // The step before failed too (its commit, or its output's
            // check): its error is the one to tell — the earlier step,
            // and where the position now is.
            if let Err(earlier) = settled {
                tracing::warn!(pipeline = %self.options.name, error = %later, "the next step failed too");
                return Err(earlier);
            }
        }
        r
    }

    /// Whether a step's commit may be left writing while the next step
    /// runs: every worker here, the step committed whole, no layout to
    /// commit, nothing to heal, and no checkpoint due after it (its
    /// snapshots must follow a durable step).
    fn may_overlap(&self) -> bool {
        self.placement.hosts.is_empty()
            && self.placement.followers.iter().all(Vec::is_empty)
            && !self.placement.relayout_pending
            && !self.placement.heal_pending
            && self
                .placement
                .instances
                .iter()
                .flatten()
                .all(|w| matches!(w, AnyWorker::Local(_)))
            && !self.checkpoint_due_after_next()
    }

    /// Awaits the commit still being written, if any, and counts its step.
    /// A failed commit drops the instances (they hold its effects and
    /// those of any step run since) and is the error.
    pub(super) async fn settle_commit(&mut self) -> Result<()> {
        let Some(p) = self.commit.take() else {
            return Ok(());
        };
        let written = p
            .write
            .await
            .map_err(Error::task("a step's commit"))
            .and_then(|r| r);
        let written = match written {
            Ok(written) => written,
            Err(e) => {
                self.placement.drop_instances();
                // The step is not in the log: the position goes back to
                // before it (a later call fails for want of instances
                // rather than taking the pipeline for idle past input it
                // never committed).
                let (frontiers, last_time_ms) = p.before;
                self.position.frontiers = frontiers;
                self.position.last_time_ms = last_time_ms;
                self.position.next_step = p.step;
                // Nor does a checkpoint write go on behind the failure.
                let _ = self.await_checkpoint().await;
                return Err(e);
            }
        };
        self.position.prev = written.link;
        let (events_in, by_hosts) = p.events;
        self.count_committed(
            p.step,
            events_in,
            by_hosts,
            written.events_out,
            written.skipped,
        );
        Ok(())
    }

    pub(super) async fn step_inner(&mut self, force: bool, overlap: bool) -> Result<bool> {
        let overlap = overlap && self.may_overlap();
        if !overlap {
            self.settle_commit().await?;
        }
        self.heal().await?;
        let target = self.divide().await?;
        if target == self.position.frontiers && !force {
            // Idle: the step before is committed (and its output checked)
            // before saying so.
            self.settle_commit().await?;
            return Ok(false);
        }
        crash_point(CrashPoint::AfterDivide);
        let step = self.position.next_step;
        let time_ms = now_ms().max(self.position.last_time_ms);
        if self.divides() {
            self.settle_commit().await?;
            return self.step_divided(target, step, time_ms).await;
        }
        // The first step after an upgrade that rebuilt operators adds the
        // switch's output to worker 0's, checked here.
        let switches = matches!(&self.position.switch_output, Some((at, _)) if *at == step);
        let outputs = self
            .execute(
                &target,
                step,
                time_ms,
                Commit::Whole,
                None,
                overlap && !switches,
            )
            .await?;
        crash_point(CrashPoint::MidStep);
        // Events, not offsets: Kafka's offsets include transaction markers.
        let events_in = self.position.events_read;
        // The step before, written while this one ran, is durable first:
        // its record is the one this one's links to.
        self.settle_commit().await?;
        // Its output hashes are filled in by `seal`, once it is checked.
        let record = self.step_record(step, time_ms, &target);
        let ports = self.shape.outputs.clone();
        if overlap {
            let storage = self.storage.clone();
            let write = tokio::task::spawn_blocking(move || {
                let sealed = seal(record, &ports, outputs)?;
                write_commit(&storage, &sealed.commit)?;
                Ok(WrittenStep {
                    link: sealed.commit.record.chain_hash(),
                    events_out: sealed.events_out,
                    skipped: sealed.skipped,
                })
            });
            let by_hosts = self.position.events_read_by_hosts;
            self.commit = Some(PendingCommit {
                write,
                step,
                events: (events_in, by_hosts),
                before: (self.position.frontiers.clone(), self.position.last_time_ms),
            });
            self.advance(target, time_ms);
            return Ok(true);
        }
        let sealed = match seal(record, &ports, outputs) {
            Ok(sealed) => sealed,
            Err(e) => {
                self.placement.drop_instances();
                return Err(e);
            }
        };
        self.commit_record(sealed.commit).await?;
        self.committed(
            target,
            time_ms,
            events_in,
            sealed.events_out,
            sealed.skipped,
        )
        .await
    }

    /// The record of step `step` at `time_ms` to `target`, linked to the
    /// last committed one, with the layout if it changed; its output hashes
    /// are left for the commit to fill in.
    pub(super) fn step_record(&self, step: u64, time_ms: u64, target: &[Frontier]) -> StepRecord {
        StepRecord {
            step,
            epoch: self.epoch,
            time_ms,
            frontiers: target.to_vec(),
            output_hashes: Vec::new(),
            limits: self.limits,
            prev: self.position.prev,
            layout: self
                .placement
                .relayout_pending
                .then(|| self.placement.layout.clone()),
        }
    }

    /// Fixes the next step's division: each worker's end offsets. An input
    /// that now ends below where the pipeline has read it (a topic deleted
    /// and made again, truncated) is an error, never skipped.
    pub(super) async fn divide(&mut self) -> Result<Vec<Frontier>> {
        let (storage, owned, mut target) = (
            self.storage.clone(),
            self.placement.owned.clone(),
            self.position.frontiers.clone(),
        );
        let max = self.options.max_batch.max(1);
        let (target, ends) = blocking(move || {
            let mut ends = vec![Frontier::new(); owned.len()];
            for (w, parts) in owned.iter().enumerate() {
                for (id, name) in parts {
                    let (_, high) = storage.log().watermarks(name, id.partition)?;
                    ends[w].insert(*id, high);
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
            Ok::<_, Error>((target, ends))
        })
        .await?;
        self.position.input_ends = ends;
        Ok(target)
    }

    /// Runs one step on every worker: the input between the current
    /// frontiers and `target`. Does not commit. A record that is not an
    /// event follows its input's bad-record policy — in a replay of a
    /// step recorded in epoch `replay`, always `dead-letter`: the step
    /// skipped it when it ran (under `fail` it would not have been
    /// recorded), and its replay must read what it read. (The hosts note
    /// the epoch a step is recorded in with its share: see
    /// [`ShareSpec::epoch`].) With `defer`, a local worker's output comes
    /// back [unchecked](WorkerOutput::check), for the step's commit to
    /// check and hash on its write's thread.
    pub(super) async fn execute(
        &mut self,
        target: &[Frontier],
        step: u64,
        time_ms: u64,
        commit: Commit,
        replay: Option<u64>,
        defer: bool,
    ) -> Result<Vec<WorkerOutput>> {
        // A worker whose host reads this pipeline's logs reads its own
        // input (only the offsets travel); the others' is read here.
        let policies = &self.options.bad_records;
        let policy = |input: &str| match replay {
            Some(_) => BadRecordPolicy::DeadLetter,
            None => policies.get(input).copied().unwrap_or_default(),
        };
        let ranges = input_ranges(
            &self.placement.owned,
            &self.position.frontiers,
            target,
            &policy,
        );
        // Followers step on the same ranges.
        let follower_ranges = match self.has_followers() {
            true => ranges.clone(),
            false => Vec::new(),
        };
        let host_reads = self.hosts_read_input();
        // In a divided step, a worker whose host reads the logs also
        // commits its share there, if the host may write them.
        let host_commits = self.hosts_commit_shares(&host_reads);
        let shares: Vec<Option<ShareSpec>> = (0..host_reads.len())
            .map(|w| {
                (commit != Commit::Whole && host_commits[w]).then(|| ShareSpec {
                    frontier: target[w].clone(),
                    outputs: self.shape.outputs.clone(),
                    checks: self.output_checks(),
                    now: commit == Commit::Now,
                    follow: false,
                    epoch: replay.unwrap_or(self.epoch),
                    // A host that commits reads its input itself.
                    own_input: true,
                })
            })
            .collect();
        // A step of this process's own workers, committed whole, may use
        // what the step before read ahead for it, if it is what it needs.
        let own = commit == Commit::Whole
            && replay.is_none()
            && !self.has_followers()
            && !host_reads.iter().any(|there| *there);
        let ahead = match self.read_ahead.take() {
            Some((read, reads)) if own && read == ranges => Some(reads),
            // Another division (more input came, a rescale): read here,
            // into the buffers of what was read ahead.
            Some((_, reads)) => {
                self.spare
                    .keep(reads.into_iter().flat_map(|r| r.batches).collect());
                None
            }
            None => None,
        };
        let inputs: Vec<StepInput> = match ahead {
            Some(reads) => {
                self.stats.events_read_ahead += (reads.iter())
                    .flat_map(|r| &r.batches)
                    .map(|b| b.weights.len() as u64)
                    .sum::<u64>();
                reads.into_iter().map(StepInput::Batches).collect()
            }
            None => {
                let storage = self.storage.clone();
                let host_reads = host_reads.clone();
                let spare = self.spare.clone();
                blocking(move || {
                    // The workers wait on this read: it may take threads.
                    let here: Vec<&[InputRange]> = (ranges.iter().zip(&host_reads))
                        .map(|(ranges, there)| if *there { &[][..] } else { ranges })
                        .collect();
                    let split = (SPLIT_READ_EVENTS, read_threads());
                    let reads = read_steps(storage.log(), &here, false, &spare, split)?;
                    Ok::<_, Error>(
                        (ranges.into_iter().zip(host_reads).zip(shares).zip(reads))
                            .map(|(((ranges, there), share), read)| match there {
                                true => StepInput::Read(ranges, share),
                                false => StepInput::Batches(read),
                            })
                            .collect::<Vec<_>>(),
                    )
                })
                .await?
            }
        };
        self.placement.exchange.begin_step(step);
        let follower_tasks = match self.has_followers() {
            true => {
                let started = self
                    .start_followers(&follower_ranges, target, step, time_ms)
                    .await;
                match started {
                    Ok(tasks) => tasks,
                    Err(e) => {
                        self.placement.drop_instances();
                        return Err(e);
                    }
                }
            }
            false => Vec::new(),
        };
        let replicated = self.has_followers();
        let mut tasks = Vec::with_capacity(inputs.len());
        for (w, input) in inputs.into_iter().enumerate() {
            let mut worker = self.placement.instances[w]
                .take()
                .ok_or(Error::WorkersLost)?;
            let exchange = self.placement.exchange.clone();
            let local = matches!(worker, AnyWorker::Local(_));
            let lose = (!local && replicated).then_some(self.placement.slots[w]);
            // A local worker's output is checked and hashed on its task,
            // or, with `defer`, by the step's commit.
            let checks = local.then(|| self.output_checks());
            let spare = self.spare.clone();
            tasks.push(tokio::spawn(async move {
                let r = match input {
                    StepInput::Batches(read) => {
                        let events = read.batches.iter().map(|b| b.weights.len() as u64).sum();
                        worker
                            .step(step, time_ms, read.batches, &spare)
                            .await
                            .map(|outputs| Stepped {
                                outputs,
                                events,
                                shared: None,
                                dead_letters: read.dead_letters,
                                checked: None,
                            })
                    }
                    StepInput::Read(ranges, share) => match &mut worker {
                        AnyWorker::Remote(r) => r.step_reading(step, time_ms, ranges, share).await,
                        AnyWorker::Local(_) => Err(Error::WorkersLost),
                    },
                };
                // (A worker on a host is that host's exchange's to know.)
                if local {
                    exchange.worker_finished(w as u32);
                }
                if let Err(e) = &r {
                    match lose {
                        // With replicas, a host whose worker failed is
                        // given up for the step: others may carry on.
                        Some(slot) => {
                            let why = format!("worker {w} failed there: {e}");
                            exchange.slot_lost(slot, ExchangeError::Aborted(why));
                        }
                        None => exchange.worker_failed(w as u32, &e.to_string()),
                    }
                }
                let r = match (r, checks) {
                    (Ok(mut stepped), Some(checks)) if stepped.shared.is_none() => {
                        let batches = std::mem::take(&mut stepped.outputs);
                        let worker = w as u32;
                        match defer {
                            true => {
                                stepped.checked = Some(WorkerOutput::unchecked(Unchecked {
                                    checks,
                                    worker,
                                    step,
                                    batches,
                                }));
                                Ok(stepped)
                            }
                            false => convert_output(&checks, worker, step, batches).map(|o| {
                                stepped.checked = Some(o);
                                stepped
                            }),
                        }
                    }
                    (r, _) => r,
                };
                (worker, r)
            }));
        }
        // The next step's input is read while the workers step, and waited
        // for with them (no read outlives the step).
        let reading_ahead = own.then(|| self.start_read_ahead(target));
        self.position.events_read = 0;
        self.position.events_read_by_hosts = 0;
        let mut results = Vec::with_capacity(tasks.len());
        for (w, task) in tasks.into_iter().enumerate() {
            results.push(match task.await {
                Ok((mut worker, r)) => {
                    self.stats.fuel_used += worker.take_fuel_used();
                    self.placement.instances[w] = Some(worker);
                    r.and_then(|stepped| {
                        self.position.events_read += stepped.events;
                        if host_reads[w] {
                            self.position.events_read_by_hosts += stepped.events;
                        }
                        self.output_of(w as u32, step, stepped)
                    })
                }
                Err(e) => Err(Error::task(format!("worker {w}"))(e)),
            });
        }
        if let Some(reading) = reading_ahead {
            // A failed read ahead is no step's failure: the next step reads
            // its input itself.
            self.read_ahead = reading.await.ok().and_then(|r| r.ok()).flatten();
        }
        let settled = match follower_tasks.is_empty() {
            true => root_cause(results),
            // Each worker's replicas: checked against each other, a failed
            // primary replaced by a follower that stepped.
            false => {
                let followers = self.follower_outcomes(follower_tasks, step).await;
                self.settle_replicas(step, results, followers, commit)
            }
        };
        if settled.is_err() {
            // Instances stopped mid-step cannot be trusted (or re-entered).
            self.placement.drop_instances();
        }
        let mut settled = settled;
        if let Ok(outputs) = &mut settled {
            self.add_switch_output(step, outputs)?;
        }
        settled
    }

    /// The first step after an upgrade that rebuilt operators carries the
    /// switch's output (see [`rebuild`](super::rebuild)): worker 0's
    /// output gets it, after its own, and is hashed with it — in the step
    /// and in every replay of it, which the recovery through the upgrade
    /// makes the same.
    /// Fails where worker 0's share is committed by another host (never
    /// for an upgrade, which runs every worker here): its output would go
    /// without the switch's.
    fn add_switch_output(&mut self, step: u64, outputs: &mut [WorkerOutput]) -> Result<()> {
        match &self.position.switch_output {
            Some((at, _)) if *at < step => self.position.switch_output = None,
            Some((at, switch)) if *at == step => {
                let first = outputs.first_mut().ok_or(Error::WorkersLost)?;
                if first.shared.is_some() {
                    return Err(Error::UpgradeAcrossHosts);
                }
                // (A step that adds the switch's output checks its own
                // first: `step_inner` does not defer it.)
                first.check()?;
                for (port, events) in switch.iter().enumerate() {
                    if let Some(out) = first.ports.get_mut(port) {
                        out.extend(events.iter().cloned());
                    }
                }
                first.hash = sluice_core::hash_outputs(&first.ports);
            }
            _ => {}
        }
        Ok(())
    }

    /// Starts reading, in the background, the input the next step reads if
    /// it divides from `from` (this step's target) as this one did: every
    /// partition a whole batch further, or left where it is when it has no
    /// new input. A partition with part of a batch is read to its end only
    /// if it has not grown since this step's division (the tail of an
    /// input that may be finished); otherwise nothing is read: the next
    /// step may take more. The next step uses the read only when its own
    /// division asks for exactly these ranges; input below a partition's
    /// end never changes, so what was read is what it would read.
    fn start_read_ahead(&self, from: &[Frontier]) -> ReadingAhead {
        let storage = self.storage.clone();
        let owned = self.placement.owned.clone();
        let from = from.to_vec();
        let seen = self.position.input_ends.clone();
        let max = self.options.max_batch.max(1);
        let policies = self.options.bad_records.clone();
        let spare = self.spare.clone();
        tokio::task::spawn_blocking(move || {
            let mut to = from.clone();
            for (w, parts) in owned.iter().enumerate() {
                for (id, name) in parts {
                    let (_, high) = storage.log().watermarks(name, id.partition)?;
                    let at = to[w].entry(*id).or_insert(0);
                    let settled = seen.get(w).and_then(|ends| ends.get(id)) == Some(&high);
                    if high >= *at + max {
                        *at += max;
                    } else if settled {
                        *at = high;
                    } else if high != *at {
                        return Ok(None);
                    }
                }
            }
            let policy = |input: &str| policies.get(input).copied().unwrap_or_default();
            let ranges = input_ranges(&owned, &from, &to, &policy);
            let reads = (ranges.iter())
                .map(|r| read_batches(storage.log(), r, false, &spare))
                .collect::<Result<Vec<_>>>()?;
            Ok(Some((ranges, reads)))
        })
    }

    /// A worker's step as its output: committed by its host (its hash and
    /// counts), or returned here (checked and hashed, or left for the
    /// step's commit to check: see [`execute`](Self::execute)'s `defer`).
    pub(super) fn output_of(
        &self,
        worker: u32,
        step: u64,
        stepped: Stepped,
    ) -> Result<WorkerOutput> {
        if let Some(mut checked) = stepped.checked {
            checked.dead_count = stepped.dead_letters.count();
            checked.dead_letters = stepped.dead_letters;
            return Ok(checked);
        }
        match stepped.shared {
            Some(done) => Ok(WorkerOutput {
                ports: Vec::new(),
                hash: done.hash,
                shared: Some(done.events),
                dead_letters: Default::default(),
                dead_count: done.dead_letters,
                unchecked: None,
            }),
            None => self.convert(worker, step, stepped.outputs).map(|mut o| {
                o.dead_count = stepped.dead_letters.count();
                o.dead_letters = stepped.dead_letters;
                o
            }),
        }
    }

    /// Checks a worker's output batches and hashes them
    /// ([`convert_output`]).
    pub(super) fn convert(
        &self,
        worker: u32,
        step: u64,
        batches: Vec<Batch>,
    ) -> Result<WorkerOutput> {
        convert_output(&self.output_checks(), worker, step, batches)
    }

    /// What a worker's output is checked against.
    pub(super) fn output_checks(&self) -> OutputChecks {
        OutputChecks {
            ports: self.shape.outputs.len(),
            max_output: self.options.max_output_per_step,
            check_json: self.options.check_output_json,
        }
    }

    /// Commits a step's record — whole, with every worker's output, or a
    /// division — and links the next record to it.
    pub(super) async fn commit_record(&mut self, commit: StepCommit) -> Result<()> {
        let link = commit.record.chain_hash();
        let committed = blocking(self.commit_write(commit));
        if let Err(e) = committed.await {
            // The instances already hold this step's effects: continuing with
            // them after a failed (or ambiguous) commit could lose or repeat
            // it. Recovery (reopening) restores a state that matches the log.
            self.placement.drop_instances();
            return Err(e);
        }
        self.position.prev = link;
        self.placement.relayout_pending = false;
        Ok(())
    }

    /// The durable write of a step's commit, for a blocking thread
    /// ([`write_commit`]).
    fn commit_write(&self, commit: StepCommit) -> impl FnOnce() -> Result<()> + Send + 'static {
        let storage = self.storage.clone();
        move || write_commit(&storage, &commit)
    }

    /// Moves on past the step just committed (which skipped `skipped`
    /// input records into dead-letter logs), and starts a checkpoint if
    /// one is due.
    pub(super) async fn committed(
        &mut self,
        target: Vec<Frontier>,
        time_ms: u64,
        events_in: u64,
        events_out: u64,
        skipped: u64,
    ) -> Result<bool> {
        let step = self.position.next_step;
        let by_hosts = self.position.events_read_by_hosts;
        self.count_committed(step, events_in, by_hosts, events_out, skipped);
        self.advance(target, time_ms);
        if self.checkpoint_due() {
            self.start_checkpoint().await?;
        }
        Ok(true)
    }

    /// Moves the position past a step: its frontiers and time.
    fn advance(&mut self, target: Vec<Frontier>, time_ms: u64) {
        self.position.frontiers = target;
        self.position.last_time_ms = time_ms;
        self.position.next_step += 1;
    }

    /// Counts a committed step in the figures.
    fn count_committed(
        &mut self,
        step: u64,
        events_in: u64,
        events_in_read_by_hosts: u64,
        events_out: u64,
        skipped: u64,
    ) {
        tracing::debug!(pipeline = %self.options.name, step, events_in, events_out, "step committed");
        if skipped > 0 {
            tracing::warn!(
                pipeline = %self.options.name,
                step,
                skipped,
                "input records that are not events went to their inputs' dead-letter logs"
            );
        }
        self.stats.dead_letters += skipped;
        // Whose output this step committed: its primaries'.
        let by = self.placement_addrs();
        if self.stats.committed_by.last().is_none_or(|(_, h)| *h != by) {
            self.stats.committed_by.push((step, by));
            let over = self
                .stats
                .committed_by
                .len()
                .saturating_sub(COMMITTED_BY_KEPT);
            self.stats.committed_by.drain(..over);
        }
        self.stats.steps += 1;
        self.stats.events_in += events_in;
        self.stats.events_in_read_by_hosts += events_in_read_by_hosts;
        self.stats.events_out += events_out;
    }

    /// Sets the deterministic limits of every instance (a record without
    /// them, all zero, keeps the current ones).
    pub(super) fn set_limits(&mut self, limits: StepLimits) {
        if limits == StepLimits::default() {
            return;
        }
        for worker in self.placement.instances.iter_mut().flatten() {
            worker.set_step_limits(limits);
        }
    }
}

/// Every worker's output, or the root cause of the step's failure: an
/// exchange failure is usually the echo of another worker's failure, so a
/// worker's own failure is reported first, then a broken exchange contract
/// (the guest's doing), and only then an abort (a host or a link failed:
/// transient).
pub(super) fn root_cause<T>(results: Vec<Result<T>>) -> Result<Vec<T>> {
    let mut failure: Option<Error> = None;
    let mut outputs = Vec::with_capacity(results.len());
    for r in results {
        match r {
            Ok(out) => outputs.push(out),
            Err(e) => {
                if failure
                    .as_ref()
                    .is_none_or(|f| cause_rank(&e) > cause_rank(f))
                {
                    failure = Some(e);
                }
            }
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(outputs),
    }
}

/// How much a worker's error says about why a step failed: its own
/// failure (2) over an echo of a broken exchange contract (1) over an
/// echo of an abort (0: the cause was elsewhere — a host or a link, when
/// nothing better is reported).
pub(super) fn cause_rank(e: &Error) -> u8 {
    match (e.is_exchange_echo(), e.is_transient()) {
        (false, _) => 2,
        (true, false) => 1,
        (true, true) => 0,
    }
}
