//! The step topic as this handle read it: step records, workers' done
//! records of divided steps and checkpoint records, read incrementally into
//! the [`StepState`] cache; the keys those records carry.
//!
//! [`StepState`]: crate::handle::StepState

use crate::config::KafkaConfig;
use crate::errors::kafka;
use crate::handle::{KafkaLog, StepState, lock};
use rdkafka::consumer::Consumer;
use rdkafka::message::{Message, OwnedMessage};
use sluice_core::StepRecord;
use sluice_storage::{Result, StorageError as Error};
use std::collections::BTreeMap;
use std::ops::Range;

impl KafkaLog {
    /// The last committed step as of now (read to the step topic's end:
    /// another host may be committing the steps).
    pub fn latest_step(&self) -> Result<Option<u64>> {
        self.with_fresh_steps(|s| {
            Ok(s.records
                .as_ref()
                .and_then(|r| r.keys().next_back().copied()))
        })
    }

    /// Reads the step topic from where `s` was read up to its end
    /// (committed records): step records (keyed by the step) and done
    /// records (keyed by step and worker). A second done record of one
    /// (step, worker) is corrupt: the worker's share was committed twice.
    pub(crate) fn catch_up(&self, s: &mut StepState) -> Result<()> {
        let topic = self.config.steps_topic();
        let bounds = self.topic_watermarks(&topic, 0)?;
        self.read_steps(s, &topic, bounds)
    }

    /// [`catch_up`](Self::catch_up) to the step topic's true end: past
    /// every transaction open now, waiting until each is committed or
    /// aborted. A worker's new holder reads this far before its first
    /// commit, so it sees every done record any earlier holder of any
    /// worker may still commit (a `read_committed` end stops at the first
    /// open transaction, possibly another worker's, before a done record of
    /// this one).
    pub(crate) fn catch_up_to_end(&self, s: &mut StepState) -> Result<()> {
        let topic = self.config.steps_topic();
        let (low, end) = self
            .ends
            .fetch_watermarks(&topic, 0, self.config.timeout)
            .map_err(kafka(format!("reading the end of {topic}")))?;
        self.read_steps(s, &topic, (low.max(0) as u64, end.max(0) as u64))
    }

    /// Reads the step topic from where `s` was read (or its low watermark)
    /// up to `end`, with the `read_committed` reader; then drops the
    /// window's oldest records if it grew past its cap.
    fn read_steps(&self, s: &mut StepState, topic: &str, (low, end): (u64, u64)) -> Result<()> {
        let from = s.read_to.max(low);
        self.read_into(s, topic, from..end)?;
        s.read_to = s.read_to.max(end);
        s.prune(self.config.step_window);
        Ok(())
    }

    /// Takes the step topic's records at offsets `range` into `s`.
    fn read_into(&self, s: &mut StepState, topic: &str, range: Range<u64>) -> Result<()> {
        let records = s.records.get_or_insert_with(BTreeMap::new);
        let mut into = Window {
            records,
            offsets: &mut s.offsets,
            done: &mut s.done,
            checkpoints: &mut s.checkpoints,
        };
        self.read_records(topic, 0, range, &mut |m| {
            step_topic_record(topic, m, &mut into)
        })
    }

    /// Forgets what `s` holds of the step topic and reads its tail: from
    /// its end (committed records) back to the last step record (left
    /// unloaded if that fails). Older records are read when asked for
    /// ([`extend_down`](Self::extend_down)).
    pub(crate) fn reload_steps(&self, s: &mut StepState) -> Result<()> {
        s.forget();
        let topic = self.config.steps_topic();
        let read = self.topic_watermarks(&topic, 0).and_then(|(_, end)| {
            s.read_from = end;
            s.read_to = end;
            s.records = Some(BTreeMap::new());
            self.extend_down(s, |s| s.records.as_ref().is_some_and(|r| !r.is_empty()))
        });
        if read.is_err() {
            s.forget();
        }
        read
    }

    /// Grows the window downward, in chunks that double, until `enough`
    /// holds or it reaches the topic's first record: what reading back to
    /// an older step costs is what lies between, not the history.
    pub(crate) fn extend_down(
        &self,
        s: &mut StepState,
        enough: impl Fn(&StepState) -> bool,
    ) -> Result<()> {
        let topic = self.config.steps_topic();
        let mut chunk = 64u64;
        while !s.whole && !enough(s) {
            let (low, _) = self.topic_watermarks(&topic, 0)?;
            if s.read_from <= low {
                s.whole = true;
                break;
            }
            let span = s.read_to.saturating_sub(s.read_from).max(chunk);
            let from = s.read_from.saturating_sub(span).max(low);
            self.read_into(s, &topic, from..s.read_from)?;
            s.read_from = from;
            chunk = chunk.saturating_mul(2);
        }
        Ok(())
    }

    /// Grows the window back to step `step`'s record (see
    /// [`StepState::covers`]), and keeps it from there while `step` is
    /// the last step asked for ([`StepState::floor`]).
    pub(crate) fn ensure_step(&self, s: &mut StepState, step: u64) -> Result<()> {
        self.extend_down(s, |s| s.covers(step))?;
        s.floor = Some(step);
        Ok(())
    }

    /// The records of steps `steps`, in step order, read from the step
    /// topic without taking them into the window — for a reader of old
    /// output, which must not make a handle hold the history. Found by
    /// bisection on the step records' keys, then read forward.
    pub(crate) fn read_old_steps(&self, steps: Range<u64>) -> Result<Vec<StepRecord>> {
        let topic = self.config.steps_topic();
        let (low, high) = self.topic_watermarks(&topic, 0)?;
        let mut at = self.first_offset_of(&topic, 0, low..high, steps.start, &step_of_key)?;
        let mut out = Vec::new();
        let mut chunk = 256u64;
        while at < high
            && out
                .last()
                .is_none_or(|r: &StepRecord| r.step + 1 < steps.end)
        {
            let to = at.saturating_add(chunk).min(high);
            self.read_records(&topic, 0, at..to, &mut |m| {
                if let Some(step) = step_of_key(m)?
                    && steps.contains(&step)
                {
                    out.push(decode_step_record(&topic, m)?);
                }
                Ok(())
            })?;
            at = to;
            chunk = chunk.saturating_mul(2);
        }
        Ok(out)
    }

    /// How many step records this handle holds in memory now (its window;
    /// see [`KafkaConfig::step_window`](crate::KafkaConfig::step_window)).
    pub fn steps_in_memory(&self) -> usize {
        lock(&self.steps).records.as_ref().map_or(0, BTreeMap::len)
    }

    /// Runs `f` on the step state, read from the step topic first if it is
    /// not loaded.
    pub(crate) fn with_steps<T>(&self, f: impl FnOnce(&mut StepState) -> Result<T>) -> Result<T> {
        let mut s = lock(&self.steps);
        if s.records.is_none() {
            self.reload_steps(&mut s)?;
        }
        f(&mut s)
    }

    /// [`with_steps`](Self::with_steps), having read what other hosts
    /// committed since — unless this handle is the committer: its view is
    /// whole (it read everything when it fenced, and no one else commits
    /// steps or records checkpoints without fencing it), and a committer
    /// that was fenced unawares must keep its own view, so that its next
    /// commit fails as fenced rather than as a gap.
    pub(crate) fn with_fresh_steps<T>(
        &self,
        f: impl FnOnce(&mut StepState) -> Result<T>,
    ) -> Result<T> {
        let mut s = lock(&self.steps);
        if s.records.is_none() {
            self.reload_steps(&mut s)?;
        } else if s.epoch == 0 {
            self.catch_up(&mut s)?;
        }
        f(&mut s)
    }

    /// Every worker's hash of step `step` if each done record is seen.
    pub(crate) fn complete(s: &StepState, record: &StepRecord) -> Option<Vec<u128>> {
        (0..record.frontiers.len() as u32)
            .map(|w| s.done.get(&(record.step, w)).map(|(h, _)| *h))
            .collect()
    }
}
/// The maps of a [`StepState`] one read of the step topic fills.
struct Window<'a> {
    records: &'a mut BTreeMap<u64, StepRecord>,
    offsets: &'a mut BTreeMap<u64, u64>,
    done: &'a mut BTreeMap<(u64, u32), (u128, Option<u64>)>,
    checkpoints: &'a mut BTreeMap<u64, String>,
}

/// Takes in one record of the step topic: a step record (keyed by the
/// step), a worker's done record (keyed by step and worker) or a
/// checkpoint's commit (keyed `checkpoint:` and the step). A second done
/// record of one (step, worker) is corrupt: the worker's share was
/// committed twice.
fn step_topic_record(topic: &str, m: &OwnedMessage, w: &mut Window<'_>) -> Result<()> {
    let key = m.key().unwrap_or_default();
    let offset = m.offset() as u64;
    if key.starts_with(CHECKPOINT_KEY.as_bytes()) {
        let (step, manifest): (u64, String) = postcard::from_bytes(m.payload().unwrap_or_default())
            .map_err(Error::corrupt(format!("checkpoint record in `{topic}`")))?;
        w.checkpoints.insert(step, manifest);
        return Ok(());
    }
    if key.len() == DONE_KEY_LEN {
        let (step, worker, hash): (u64, u32, u128) =
            postcard::from_bytes(m.payload().unwrap_or_default())
                .map_err(Error::corrupt(format!("done record in `{topic}`")))?;
        match w.done.get_mut(&(step, worker)) {
            Some((h, at)) if *h == hash && at.is_none_or(|a| a == offset) => *at = Some(offset),
            Some(_) => {
                return Err(Error::Corrupt {
                    what: format!("step topic `{topic}`"),
                    message: format!(
                        "a second done record of step {step} worker {worker} (offset {offset}): \
                         the worker's share was committed twice (I1)"
                    ),
                });
            }
            None => {
                w.done.insert((step, worker), (hash, Some(offset)));
            }
        }
        return Ok(());
    }
    let record = decode_step_record(topic, m)?;
    w.offsets.insert(record.step, offset);
    w.records.insert(record.step, record);
    Ok(())
}

/// A step record's value.
fn decode_step_record(topic: &str, m: &OwnedMessage) -> Result<StepRecord> {
    postcard::from_bytes(m.payload().unwrap_or_default())
        .map_err(Error::corrupt(format!("step record in `{topic}`")))
}

/// The step of a step record, by its key (8 bytes, the step big-endian);
/// `None` for the step topic's other records.
fn step_of_key(m: &OwnedMessage) -> Result<Option<u64>> {
    Ok(m.key()
        .and_then(|k| <[u8; 8]>::try_from(k).ok())
        .map(u64::from_be_bytes))
}

/// The error for a commit through a step producer a failed checkpoint
/// record lost: fenced, or a transient failure (a recovery fences again).
pub(crate) fn lost_producer(config: &KafkaConfig, step: Option<u64>, fenced: bool) -> Error {
    let transactional_id = format!("sluice.{}.steps", config.pipeline);
    match fenced {
        true => Error::TransactionalProducerSuperseded {
            step,
            transactional_id,
        },
        false => Error::backend(
            "Kafka",
            format!("a transaction of `{transactional_id}`"),
            true,
            "the step producer was lost with a failed checkpoint record; reopen to fence again",
        ),
    }
}

/// A done record's key: the step and the worker, big-endian (a step
/// record's key is the step alone, 8 bytes).
const DONE_KEY_LEN: usize = 12;

/// How a checkpoint record's key starts (the step follows, in decimal: the
/// record is meant to be read with Kafka's tools too).
pub(crate) const CHECKPOINT_KEY: &str = "checkpoint:";

/// The key of worker `worker`'s done record of step `step`.
pub(crate) fn done_key(step: u64, worker: u32) -> [u8; DONE_KEY_LEN] {
    let mut key = [0; DONE_KEY_LEN];
    key[..8].copy_from_slice(&step.to_be_bytes());
    key[8..].copy_from_slice(&worker.to_be_bytes());
    key
}
