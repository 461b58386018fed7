//! [`Guarded`]: a pipeline's storage behind the checks by which the host
//! enforces the storage invariants, whatever the guest or a backend does:
//!
//! - **I1 replay safety**: a step is committed at most once (the backend's
//!   commit refuses a step that exists; this layer refuses malformed ones).
//! - **I2 trim safety**: input is trimmed only below the newest committed
//!   checkpoint's frontier ([`Guarded::trim`]).
//! - **I3 division durability**: a step's division (its record) is committed
//!   in the same atomic write as its outputs, never after; frontiers only
//!   move forward; a checkpoint covers only committed steps; each record
//!   holds the hash of the one before it (the chain the audit checks).

use crate::error::{Result, StorageError};
use crate::{
    Carried, Checkpoint, CheckpointMeta, CheckpointStore, LogBackend, Staged, WorkerCommitter,
};
use sluice_core::crash::{CrashPoint, crash_point};
use sluice_core::{
    Frontier, Layout, PartitionId, PipelineShape, StepCommit, StepRecord, dead_letter_input,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The last committed step as the guard knows it.
#[derive(Debug, Clone)]
struct Tip {
    /// Its record (`None`: no step committed yet).
    record: Option<StepRecord>,
    /// The layout it ran under (the initial one before any step).
    layout: Layout,
}

/// The layout the steps after `last` run under unless one changes it: the
/// layout of step `last` (the initial layout when no step is committed).
/// Starts from the newest checkpoint at or below `last` (its layout) and
/// follows the records after it.
pub fn layout_after(
    log: &dyn LogBackend,
    checkpoints: &dyn CheckpointStore,
    shape: &PipelineShape,
    last: Option<u64>,
) -> Result<Layout> {
    let Some(last) = last else {
        return Ok(Layout::initial(shape));
    };
    let mut from = 0;
    let mut layout = Layout::initial(shape);
    if let Some(step) = checkpoints.list()?.into_iter().rev().find(|s| *s <= last)
        && let Some(meta) = checkpoints.meta(step)?
    {
        layout = meta.layout;
        from = step + 1;
    }
    for step in from..=last {
        let record = log
            .step_record(step)?
            .ok_or_else(|| StorageError::Corrupt {
                what: "step log".into(),
                message: format!("the record of committed step {step} is missing"),
            })?;
        if let Some(l) = record.layout {
            layout = l;
        }
    }
    Ok(layout)
}

/// Every input partition's offset in a set of frontiers, with its reader.
fn offsets(frontiers: &[Frontier]) -> BTreeMap<PartitionId, (u32, u64)> {
    frontiers
        .iter()
        .enumerate()
        .flat_map(|(w, f)| f.iter().map(move |(id, o)| (*id, (w as u32, *o))))
        .collect()
}

/// A log backend and a checkpoint store behind the host's invariant checks.
pub struct Guarded {
    log: Arc<dyn LogBackend>,
    checkpoints: Arc<dyn CheckpointStore>,
    shape: PipelineShape,
    /// The last committed step and its layout, to check that frontiers
    /// move forward and follow the layout; `None` until it is read from the
    /// log (at the first commit or [`fence`](Self::fence)).
    last: Mutex<Option<Tip>>,
    /// Checks, at every take-over, the changes of component the log
    /// records against those the host opened the pipeline with (see
    /// [`checking_upgrades`](Self::checking_upgrades)).
    upgrades_check: Option<UpgradesCheck>,
}

/// See [`Guarded::checking_upgrades`].
type UpgradesCheck = Box<dyn Fn(Option<Vec<u8>>) -> Result<()> + Send + Sync>;

impl Guarded {
    /// Guards `log` and `checkpoints` for a pipeline of this shape.
    pub fn new(
        log: Arc<dyn LogBackend>,
        checkpoints: Arc<dyn CheckpointStore>,
        shape: PipelineShape,
    ) -> Self {
        // Nothing is read here: until a host fences, a log may hold a
        // predecessor's open transaction (Kafka), which reads wait out.
        Guarded {
            log,
            checkpoints,
            shape,
            last: Mutex::new(None),
            upgrades_check: None,
        }
    }

    /// Has every [`fence`](Self::fence), once the log is fenced, pass
    /// what the log records of the pipeline's changes of component
    /// ([`LogBackend::upgrades`]) to `check`, which fails the take-over
    /// where the host opened the pipeline under another component than
    /// the last recorded one (an upgrade made elsewhere since). Read after
    /// the fence, the record is whole: a later one fails to commit.
    pub fn checking_upgrades(
        mut self,
        check: impl Fn(Option<Vec<u8>>) -> Result<()> + Send + Sync + 'static,
    ) -> Self {
        self.upgrades_check = Some(Box::new(check));
        self
    }

    fn read_last(&self) -> Result<Tip> {
        let last = self.log.last_step()?;
        let record = match last {
            Some(step) => self.log.step_record(step)?,
            None => None,
        };
        let layout = layout_after(&*self.log, &*self.checkpoints, &self.shape, last)?;
        Ok(Tip { record, layout })
    }

    /// The layout of the last committed step (the initial layout before
    /// any): the layout the next step runs under unless it changes it.
    pub fn layout(&self) -> Result<Layout> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none() {
            *last = Some(self.read_last()?);
        }
        Ok(last.as_ref().expect("just read").layout.clone())
    }

    /// Takes over the pipeline: starts a new fencing epoch in the log (see
    /// [`LogBackend::fence`]) and returns it, then reads the last committed
    /// step as it stands once every older host is fenced.
    pub fn fence(&self) -> Result<u64> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let epoch = self.log.fence()?;
        if let Some(check) = &self.upgrades_check {
            check(self.log.upgrades()?)?;
        }
        *last = Some(self.read_last()?);
        Ok(epoch)
    }

    /// The log, for reads.
    pub fn log(&self) -> &dyn LogBackend {
        &*self.log
    }

    /// Takes worker `worker` of divided steps
    /// ([`LogBackend::take_worker`]); fails where the log commits steps
    /// whole. The shares it commits are checked against their divisions by
    /// the log ([`check_worker_commit`](crate::check_worker_commit)).
    pub fn take_worker(&self, worker: u32) -> Result<Box<dyn WorkerCommitter>> {
        self.log.clone().take_worker(worker)
    }

    /// The checkpoint store, for reads.
    pub fn checkpoints(&self) -> &dyn CheckpointStore {
        &*self.checkpoints
    }

    /// The pipeline's shape.
    pub fn shape(&self) -> &PipelineShape {
        &self.shape
    }

    /// Checks a step commit's shape, layout and frontiers, then commits it.
    pub fn commit_step(&self, commit: &StepCommit) -> Result<()> {
        let step = commit.record.step;
        let invalid = |message: String| StorageError::InvalidCommit { step, message };
        let rec = &commit.record;
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none() {
            *last = Some(self.read_last()?);
        }
        let tip = last.as_ref().expect("just read");
        let layout = match &rec.layout {
            Some(next) => {
                next.validate(&self.shape)
                    .map_err(|m| invalid(format!("its layout: {m}")))?;
                if next.epoch <= tip.layout.epoch {
                    return Err(invalid(format!(
                        "its layout has epoch {}, not above the current layout's {}",
                        next.epoch, tip.layout.epoch
                    )));
                }
                next
            }
            None => &tip.layout,
        };
        let workers = layout.workers as usize;
        if rec.is_division() {
            // A divided step: its record first, each worker's share later,
            // from whoever holds the worker.
            if !self.log.worker_commits() {
                return Err(invalid(
                    "a divided step (no output hashes), but this log commits steps whole".into(),
                ));
            }
            if rec.frontiers.len() != workers
                || !commit.outputs.is_empty()
                || !commit.dead_letters.is_empty()
            {
                return Err(invalid(format!(
                    "a division must have one frontier per worker ({} for {workers}) and no \
                     outputs",
                    rec.frontiers.len()
                )));
            }
        } else if rec.frontiers.len() != workers || rec.output_hashes.len() != workers {
            return Err(invalid(format!(
                "{} frontiers and {} hashes for {workers} workers",
                rec.frontiers.len(),
                rec.output_hashes.len(),
            )));
        }
        // No step is recorded after an incomplete one (a worker's share
        // missing): the log is read until every done record is there.
        if let Some(prev) = tip.record.as_ref().filter(|p| p.is_division()) {
            match self.log.await_complete(prev.step) {
                Ok(_) => {}
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => {
                    return Err(invalid(format!(
                        "step {} before it is not complete: {e}",
                        prev.step
                    )));
                }
            }
        }
        // A division has no outputs (checked above).
        if !rec.is_division()
            && (commit.outputs.len() != self.shape.outputs.len()
                || commit
                    .outputs
                    .iter()
                    .zip(&self.shape.outputs)
                    .any(|((a, _), b)| a != b))
        {
            return Err(invalid(
                "outputs do not match the pipeline's output logs".into(),
            ));
        }
        for (name, entries) in &commit.outputs {
            let well_formed = entries.len() == workers
                && entries.iter().enumerate().all(|(w, e)| {
                    e.worker as usize == w && e.step == step && e.frontier == rec.frontiers[w]
                });
            if !well_formed {
                return Err(invalid(format!(
                    "output `{name}` must hold exactly one entry per worker, tagged with this step and its frontier"
                )));
            }
        }
        self.check_dead_letters(commit, workers)?;
        // Each partition in the frontier of its reader in the layout.
        let now = offsets(&rec.frontiers);
        if now.len() != rec.frontiers.iter().map(|f| f.len()).sum::<usize>() {
            return Err(invalid("a partition is in two workers' frontiers".into()));
        }
        for (id, (w, _)) in &now {
            if layout.reader(id.input, id.partition) != Some(*w) {
                return Err(invalid(format!(
                    "worker {w}'s frontier holds {id:?}, which its layout gives to worker {:?}",
                    layout.reader(id.input, id.partition)
                )));
            }
        }
        // The step that follows the last must link to it (any other step is
        // refused by the log: written already, or out of order).
        let previous = tip.record.as_ref();
        let next = previous.map_or(0, |p| p.step + 1);
        let link = previous.map_or(0, StepRecord::chain_hash);
        if rec.step == next && rec.prev != link {
            return Err(invalid(
                "its record does not chain to the previous step's record".into(),
            ));
        }
        if let Some(prev) = previous {
            for (id, (_, old)) in offsets(&prev.frontiers) {
                if now.get(&id).is_none_or(|(_, o)| *o < old) {
                    return Err(invalid(format!("the frontier moves backwards on {id:?}")));
                }
            }
        }
        self.log.commit_step(commit)?;
        let layout = layout.clone();
        *last = Some(Tip {
            record: Some(commit.record.clone()),
            layout,
        });
        Ok(())
    }

    /// Checks a step's dead letters: each log is the dead-letter log of one
    /// of the pipeline's inputs, named once, and holds an entry only for
    /// workers that skipped records, in worker order, tagged with the step
    /// and the worker's frontier.
    fn check_dead_letters(&self, commit: &StepCommit, workers: usize) -> Result<()> {
        let rec = &commit.record;
        let invalid = |message: String| StorageError::InvalidCommit {
            step: rec.step,
            message,
        };
        let mut names: Vec<&str> = commit
            .dead_letters
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err(invalid("a dead-letter log appears twice".into()));
        }
        for (name, entries) in &commit.dead_letters {
            let known = dead_letter_input(name)
                .is_some_and(|input| self.shape.inputs.iter().any(|i| i.name == input));
            if !known {
                return Err(invalid(format!(
                    "`{name}` is not the dead-letter log of one of the pipeline's inputs"
                )));
            }
            let well_formed = entries.windows(2).all(|w| w[0].worker < w[1].worker)
                && entries.iter().all(|e| {
                    (e.worker as usize) < workers
                        && e.step == rec.step
                        && e.frontier == rec.frontiers[e.worker as usize]
                        && !e.events.is_empty()
                });
            if !well_formed {
                return Err(invalid(format!(
                    "dead-letter log `{name}` must hold one entry per worker that skipped \
                     records, in worker order, tagged with this step and its frontier"
                )));
            }
        }
        Ok(())
    }

    /// Stores a checkpoint, after checking that it covers a committed step
    /// with that step's frontiers.
    pub fn checkpoint(&self, checkpoint: &Checkpoint) -> Result<()> {
        self.checkpoint_staged(checkpoint, &[], None)
    }

    /// Stores an incremental checkpoint: `checkpoint`'s pieces plus those
    /// `carried` takes from an earlier committed checkpoint. Checked like
    /// [`checkpoint`](Self::checkpoint), and also: the earlier checkpoint
    /// is committed, earlier, and ran under the same layout. A written piece
    /// of a `(shard, worker)` that is also carried is a delta: it follows
    /// the carried ones, and restoring adds them up.
    pub fn checkpoint_carrying(&self, checkpoint: &Checkpoint, carried: &Carried) -> Result<()> {
        self.checkpoint_staged(checkpoint, &[], Some(carried))
    }

    /// Stores a checkpoint whose pieces are `checkpoint`'s and those other
    /// hosts `staged` in the store (and those `carried`, if any), checked
    /// like [`checkpoint_carrying`](Self::checkpoint_carrying) over all of
    /// them; a staged segment of another step, or a second one of a worker,
    /// is refused. The store checks the staged segments are there.
    pub fn checkpoint_staged(
        &self,
        checkpoint: &Checkpoint,
        staged: &[Staged],
        carried: Option<&Carried>,
    ) -> Result<()> {
        let step = checkpoint.meta.step;
        let refuse = |message: String| StorageError::InvalidCheckpoint { step, message };
        if let Some(s) = staged.iter().find(|s| s.step != step) {
            return Err(refuse(format!(
                "it names pieces of worker {} staged for step {}",
                s.worker, s.step
            )));
        }
        let keys = checkpoint.pieces.iter().map(|p| (p.shard, p.worker)).chain(
            staged
                .iter()
                .flat_map(|s| s.pieces.iter().map(|(shard, _)| (*shard, s.worker))),
        );
        self.check_checkpoint(&checkpoint.meta, keys)?;
        let mut workers: Vec<u32> = staged.iter().map(|s| s.worker).collect();
        workers.sort_unstable();
        if let Some(w) = workers.windows(2).find(|w| w[0] == w[1]) {
            return Err(refuse(format!("two staged segments of worker {}", w[0])));
        }
        if let Some(carried) = carried {
            let base = self.checkpoints.meta(carried.from)?.ok_or_else(|| {
                refuse(format!(
                    "it carries pieces of checkpoint {}, which is not committed",
                    carried.from
                ))
            })?;
            if carried.from >= step || base.layout != checkpoint.meta.layout {
                return Err(refuse(format!(
                    "it carries pieces of checkpoint {}, which is not an earlier checkpoint of \
                     the same layout",
                    carried.from
                )));
            }
        }
        self.checkpoints.put_staged(checkpoint, staged, carried)
    }

    fn check_checkpoint(
        &self,
        meta: &CheckpointMeta,
        keys: impl Iterator<Item = (u32, u32)>,
    ) -> Result<()> {
        let step = meta.step;
        let refuse = |message: &str| StorageError::InvalidCheckpoint {
            step,
            message: message.into(),
        };
        let record = self
            .log
            .step_record(step)?
            .ok_or_else(|| refuse("the step is not committed (I3)"))?;
        if record.frontiers != meta.frontiers {
            return Err(refuse("its frontiers differ from the step record's"));
        }
        let layout = layout_after(&*self.log, &*self.checkpoints, &self.shape, Some(step))?;
        if meta.layout != layout {
            return Err(refuse(&format!(
                "its layout (epoch {}) is not the layout step {step} ran under (epoch {})",
                meta.layout.epoch, layout.epoch
            )));
        }
        let mut keys: Vec<(u32, u32)> = keys.collect();
        if let Some((shard, worker)) = keys
            .iter()
            .find(|(shard, worker)| *worker >= layout.workers || *shard >= sluice_core::SHARDS)
        {
            return Err(refuse(&format!(
                "a piece of shard {shard} of worker {worker} (the layout has {} workers)",
                layout.workers
            )));
        }
        keys.sort_unstable();
        if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
            return Err(refuse(&format!(
                "two pieces of shard {} of worker {}",
                w[0].0, w[0].1
            )));
        }
        Ok(())
    }

    /// The offset of `input`/`partition` that the newest committed checkpoint
    /// covers (0 if none).
    pub fn checkpointed_offset(&self, input: u32, partition: u32) -> Result<u64> {
        let Some(meta) = self.checkpoints.latest_meta()? else {
            return Ok(0);
        };
        let id = PartitionId { input, partition };
        Ok(meta
            .frontiers
            .iter()
            .find_map(|f| f.get(&id).copied())
            .unwrap_or(0))
    }

    /// Trims one input partition below `below`; refused (I2) if the newest
    /// committed checkpoint does not cover it.
    pub fn trim(&self, input: u32, partition: u32, below: u64) -> Result<()> {
        let name = self
            .shape
            .input_name(input)
            .ok_or_else(|| StorageError::Unknown {
                kind: "input port index",
                name: input.to_string(),
                hint: String::new(),
            })?;
        let allowed = self.checkpointed_offset(input, partition)?;
        if below > allowed {
            return Err(StorageError::TrimAboveCheckpoint {
                input: name.to_owned(),
                partition,
                requested: below,
                allowed,
            });
        }
        self.log.trim(name, partition, below)
    }

    /// Trims every input partition up to the newest committed checkpoint's
    /// frontier. Returns how many partitions it covered.
    pub fn trim_to_checkpoint(&self) -> Result<usize> {
        let Some(meta) = self.checkpoints.latest_meta()? else {
            return Ok(0);
        };
        let all: Frontier = meta.frontiers.into_iter().flatten().collect();
        for (i, (id, offset)) in all.iter().enumerate() {
            self.trim(id.input, id.partition, *offset)?;
            if i == 0 {
                crash_point(CrashPoint::MidTrim);
            }
        }
        Ok(all.len())
    }
}
