//! A step's input and output, the same wherever a worker runs: the input
//! ranges a worker reads ([`InputRange`], [`read_batches`]) and what it does
//! with a record that is not an event (fail, or skip it into the input's
//! dead-letter log: [`DeadLetters`]), the checks and hash of its output
//! ([`OutputChecks`], [`convert_output`]), and how a share's commit error
//! reads. Both the coordinator and a host that serves
//! workers ([`hosts`](crate::hosts)) use these, so the two build the same
//! batches and the same hashes.

use crate::bindings::Batch;
use crate::error::{Error, GuestError, Result};
use crate::packed::slices;
use serde::{Deserialize, Serialize};
use sluice_core::{
    BadRecordPolicy, DeadLetter, Event, Frontier, PartitionId, dead_letter_log, hash_outputs,
};
use sluice_storage::RecordRef;
use std::sync::{Arc, Mutex, PoisonError};

/// One partition's part of a worker's input for one step: offsets
/// `start..end` of partition `id` of input log `name`, and what a record
/// there that is not an event does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InputRange {
    pub(crate) id: PartitionId,
    pub(crate) name: String,
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// The input's policy for this step (a replay always skips: a recorded
    /// step's bad records were skipped when it ran, or it had none).
    pub(crate) bad_records: BadRecordPolicy,
}

/// The input each worker reads in a step from frontiers `from` to `to`: one
/// range per partition it owns that moved, in the order it owns them, each
/// with its input's bad-record policy (`policy`).
pub(crate) fn input_ranges(
    owned: &[Vec<(PartitionId, String)>],
    from: &[Frontier],
    to: &[Frontier],
    policy: &dyn Fn(&str) -> BadRecordPolicy,
) -> Vec<Vec<InputRange>> {
    owned
        .iter()
        .enumerate()
        .map(|(w, parts)| {
            parts
                .iter()
                .filter_map(|(id, name)| {
                    let start = from[w].get(id).copied().unwrap_or(0);
                    let end = to[w].get(id).copied().unwrap_or(start);
                    (end > start).then(|| InputRange {
                        id: *id,
                        name: name.clone(),
                        start,
                        end,
                        bad_records: policy(name),
                    })
                })
                .collect()
        })
        .collect()
}

/// The input records one worker skipped in one step, as the events of
/// the inputs' dead-letter logs: `(dead-letter log, events)`, in the order
/// the worker read them. Committed with the step's outputs, by whoever
/// commits them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DeadLetters(pub(crate) Vec<(String, Vec<Event>)>);

impl DeadLetters {
    /// Adds `letter` to its input's dead-letter log.
    fn push(&mut self, letter: &DeadLetter) {
        let log = dead_letter_log(&letter.input);
        let event = letter.to_event();
        match self.0.iter_mut().find(|(name, _)| *name == log) {
            Some((_, events)) => events.push(event),
            None => self.0.push((log, vec![event])),
        }
    }

    /// How many records were skipped.
    pub(crate) fn count(&self) -> u64 {
        self.0.iter().map(|(_, e)| e.len() as u64).sum()
    }
}

/// What a worker read for one step: its batches, and the records it
/// skipped.
#[derive(Default)]
pub(crate) struct StepRead {
    /// One batch per input port it read.
    pub(crate) batches: Vec<Batch>,
    /// The records that are not events, skipped (policy `dead-letter`).
    pub(crate) dead_letters: DeadLetters,
}

/// Input batches kept from one step for the reads of the next.
///
/// A worker's batch of a step holds megabytes (q2's ~8 MB per step at
/// W = 1); the allocator maps a block that large alone and unmaps it when
/// freed ([`memory`](crate::memory)), so a batch built anew each step
/// faulted in every page again: 44 % of a q2 run's page faults. The
/// coordinator gives the batches of its local workers back here once they
/// stepped on them (and a read-ahead's it did not use), and the reads of
/// later steps fill them again. What is kept is bounded ([`SPARE_BYTES`],
/// [`SPARE_BATCHES`]) and goes with the pool's last handle (normally the
/// coordinator's).
#[derive(Clone, Default)]
pub(crate) struct Spare(Arc<Mutex<Vec<Batch>>>);

/// The most a [`Spare`] keeps: bytes of capacity in all, and batches.
const SPARE_BYTES: usize = 64 << 20;
const SPARE_BATCHES: usize = 16;

impl Spare {
    /// An empty batch for `port`, with the largest kept batch's buffers if
    /// any.
    fn take(&self, port: u32) -> Batch {
        let kept = {
            let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            let largest = (kept.iter().enumerate())
                .max_by_key(|(_, b)| b.values.capacity())
                .map(|(i, _)| i);
            largest.map(|i| kept.swap_remove(i))
        };
        match kept {
            Some(mut batch) => {
                batch.port = port;
                batch.values.clear();
                batch.ends.clear();
                batch.weights.clear();
                batch
            }
            None => Batch {
                port,
                values: Vec::new(),
                ends: Vec::new(),
                weights: Vec::new(),
            },
        }
    }

    /// Keeps the buffers of `batches` for later reads, as far as the bounds
    /// allow; the rest are freed.
    pub(crate) fn keep(&self, batches: Vec<Batch>) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let bytes =
            |b: &Batch| b.values.capacity() + 4 * b.ends.capacity() + 8 * b.weights.capacity();
        let mut total: usize = kept.iter().map(bytes).sum();
        for batch in batches {
            let size = bytes(&batch);
            if kept.len() < SPARE_BATCHES && total + size <= SPARE_BYTES {
                total += size;
                kept.push(batch);
            }
        }
    }
}

/// Reads `ranges` from `log` into one batch per input port (in the order
/// the ranges name them): what a worker steps on — built the same way
/// wherever it is read, so a worker's host reading its own input gives the
/// worker what the coordinator would have sent. With `strict` (a reader
/// other than the one that divided the step), a range past the partition's
/// end fails instead of reading short: its events are not all visible
/// here yet. A record that is not an event fails the read under its
/// range's policy `fail` ([`StorageError::BadRecord`], naming its
/// position), and is skipped into [`StepRead::dead_letters`] under
/// `dead-letter` — the same records, read from the same offsets, on every
/// run of the step. The batches take their buffers from `spare`.
///
/// [`StorageError::BadRecord`]: sluice_storage::StorageError::BadRecord
pub(crate) fn read_batches(
    log: &dyn sluice_storage::LogBackend,
    ranges: &[InputRange],
    strict: bool,
    spare: &Spare,
) -> Result<StepRead> {
    let mut batches: Vec<Batch> = Vec::new();
    let mut dead_letters = DeadLetters::default();
    for r in ranges {
        let (name, partition, start, end) = (&r.name, r.id.partition, r.start, r.end);
        let i = match batches.iter().position(|b| b.port == r.id.input) {
            Some(i) => i,
            None => {
                batches.push(spare.take(r.id.input));
                batches.len() - 1
            }
        };
        let batch = &mut batches[i];
        // Each value is copied once, from the log into the batch.
        let read = log.each_record(name, partition, start..end, strict, &mut |record| {
            match (record, r.bad_records) {
                (RecordRef::Event { value, weight }, _) => {
                    batch.values.extend_from_slice(value);
                    batch.ends.push(batch.values.len() as u32);
                    batch.weights.push(weight);
                }
                (RecordRef::Bad(bad), BadRecordPolicy::Fail) => return Err(bad.into_error()),
                (RecordRef::Bad(bad), BadRecordPolicy::DeadLetter) => {
                    dead_letters.push(&DeadLetter {
                        input: name.clone(),
                        partition,
                        offset: bad.offset,
                        position: bad.position,
                        error: bad.error,
                        value: bad.value,
                    });
                }
            }
            Ok(())
        })?;
        // Offsets may be sparse (Kafka's transaction markers take
        // offsets), so the range holds at most `end - start` records; a
        // dense backend checks its own ranges.
        if read > end - start {
            return Err(sluice_storage::StorageError::Corrupt {
                what: format!("input `{name}` partition {partition}"),
                message: format!("offsets {start}..{end} returned {read} records"),
            }
            .into());
        }
    }
    Ok(StepRead {
        batches,
        dead_letters,
    })
}

/// Input events past which a read that steps wait on is split among
/// threads ([`read_steps`]): below it, a thread's start costs more than it
/// saves.
pub(crate) const SPLIT_READ_EVENTS: u64 = 16_384;

/// The threads that read one step's input ([`read_steps`]): the
/// machine's cores, 4 at most.
pub(crate) fn read_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(4)))
}

/// [`read_batches`] of each worker's `ranges` (empty for a worker that
/// reads nothing here), for a step whose workers wait on the read: a read
/// of at least `split_at` events is split among up to `threads` threads,
/// each reading a run of whole ranges, the runs balanced by events. The
/// pieces are joined in order, so each worker's batches, and the records
/// it skipped, are those one read would give; an error is the one the
/// first failing range gives, as in one read.
pub(crate) fn read_steps(
    log: &dyn sluice_storage::LogBackend,
    ranges: &[&[InputRange]],
    strict: bool,
    spare: &Spare,
    (split_at, threads): (u64, usize),
) -> Result<Vec<StepRead>> {
    let items: Vec<(usize, &InputRange)> = (ranges.iter().enumerate())
        .flat_map(|(w, rs)| rs.iter().map(move |r| (w, r)))
        .collect();
    let events = |rs: &[(usize, &InputRange)]| -> u64 {
        rs.iter().map(|(_, r)| r.end.saturating_sub(r.start)).sum()
    };
    let total = events(&items);
    let threads = threads.min(items.len());
    // Runs of whole ranges, each about `total / threads` events.
    let mut runs: Vec<&[(usize, &InputRange)]> = Vec::new();
    match total >= split_at && threads > 1 {
        false => runs.push(&items),
        true => {
            let (mut start, mut sum) = (0, 0);
            for (i, (_, r)) in items.iter().enumerate() {
                sum += r.end.saturating_sub(r.start);
                let due = total * (runs.len() as u64 + 1) / threads as u64;
                if sum >= due && runs.len() + 1 < threads {
                    runs.push(&items[start..=i]);
                    start = i + 1;
                }
            }
            if start < items.len() || runs.is_empty() {
                runs.push(&items[start..]);
            }
        }
    }
    // Each run's reads, worker by worker: a run holds whole ranges of
    // consecutive workers.
    let read_run = |run: &[(usize, &InputRange)]| -> Result<Vec<(usize, StepRead)>> {
        let mut reads = Vec::new();
        for piece in run.chunk_by(|a, b| a.0 == b.0) {
            let own: Vec<InputRange> = piece.iter().map(|(_, r)| (*r).clone()).collect();
            reads.push((piece[0].0, read_batches(log, &own, strict, spare)?));
        }
        Ok(reads)
    };
    let pieces: Vec<Result<Vec<(usize, StepRead)>>> = match runs.split_first() {
        Some((first, rest)) if !rest.is_empty() => std::thread::scope(|scope| {
            // A run whose thread cannot start is read here, after the first.
            let others: Vec<_> = (rest.iter())
                .map(|run| {
                    let thread = std::thread::Builder::new().name("sluice-read".into());
                    thread
                        .spawn_scoped(scope, || read_run(run))
                        .map_err(|_| run)
                })
                .collect();
            let mut all = vec![read_run(first)];
            for other in others {
                all.push(match other {
                    Ok(thread) => thread
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                    Err(run) => read_run(run),
                });
            }
            all
        }),
        _ => runs.iter().map(|run| read_run(run)).collect(),
    };
    let mut out: Vec<StepRead> = ranges.iter().map(|_| StepRead::default()).collect();
    for piece in pieces {
        for (w, read) in piece? {
            out[w].join(read, spare)?;
        }
    }
    Ok(out)
}

impl StepRead {
    /// Appends what `next` read after this: each port's events after this
    /// one's, its skipped records after these. Its buffers go back to
    /// `spare`.
    /// Fails if a port's events would take 4 GiB or more (the ends of a
    /// batch are `u32`s).
    fn join(&mut self, next: StepRead, spare: &Spare) -> Result<()> {
        let mut emptied = Vec::new();
        for batch in next.batches {
            match self.batches.iter_mut().find(|b| b.port == batch.port) {
                Some(into) => {
                    let base = into.values.len();
                    u32::try_from(base + batch.values.len()).map_err(|_| too_large(batch.port))?;
                    let base = base as u32;
                    into.values.extend_from_slice(&batch.values);
                    into.ends.extend(batch.ends.iter().map(|end| base + end));
                    into.weights.extend_from_slice(&batch.weights);
                    emptied.push(batch);
                }
                None => self.batches.push(batch),
            }
        }
        spare.keep(emptied);
        for (log, events) in next.dead_letters.0 {
            match self
                .dead_letters
                .0
                .iter_mut()
                .find(|(name, _)| *name == log)
            {
                Some((_, into)) => into.extend(events),
                None => self.dead_letters.0.push((log, events)),
            }
        }
        Ok(())
    }
}

/// A worker's input of one step on `port` that does not fit a batch.
fn too_large(port: u32) -> Error {
    Error::Config(sluice_core::ConfigError::Invalid(format!(
        "a worker's input on port {port} in one step reaches 4 GiB: lower --max-batch"
    )))
}

/// What a worker's output is checked against: the circuit's output ports,
/// [`PipelineOptions::max_output_per_step`](crate::PipelineOptions::max_output_per_step)
/// and [`PipelineOptions::check_output_json`](crate::PipelineOptions::check_output_json).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OutputChecks {
    /// The circuit's output ports.
    pub ports: usize,
    /// At most this many output events per worker per step.
    pub max_output: Option<u64>,
    /// Every output value must be JSON.
    pub check_json: bool,
}

/// One worker's output of one step.
pub(crate) struct WorkerOutput {
    /// Events per output port.
    pub ports: Vec<Vec<Event>>,
    /// Their hash ([`hash_outputs`]), which the step record or the done
    /// record keeps and a replay must reproduce.
    pub hash: u128,
    /// Its host committed it, as the worker's share of a divided step:
    /// `ports` is empty, this many events went out.
    pub shared: Option<u64>,
    /// The input records it skipped, committed with its output (empty when
    /// its host committed the share).
    pub dead_letters: DeadLetters,
    /// How many it skipped (its host's count when the host committed).
    pub dead_count: u64,
    /// Batches still to check and hash: then `ports` is empty and `hash`
    /// 0 until [`check`](Self::check) converts them. A whole step whose
    /// commit is written while the next step runs checks its output on the
    /// write's thread, not between the two steps.
    pub unchecked: Option<Unchecked>,
}

/// A worker's output batches as the guest returned them, with what they
/// are to be checked against ([`convert_output`]).
pub(crate) struct Unchecked {
    /// The checks.
    pub checks: OutputChecks,
    /// The worker.
    pub worker: u32,
    /// The step.
    pub step: u64,
    /// The batches.
    pub batches: Vec<Batch>,
}

impl WorkerOutput {
    /// Output to be checked later ([`check`](Self::check)).
    pub(crate) fn unchecked(unchecked: Unchecked) -> Self {
        WorkerOutput {
            ports: Vec::new(),
            hash: 0,
            shared: None,
            dead_letters: DeadLetters::default(),
            dead_count: 0,
            unchecked: Some(unchecked),
        }
    }

    /// Checks and hashes this output's batches, if they were not yet
    /// ([`convert_output`]); its dead letters are kept.
    pub(crate) fn check(&mut self) -> Result<()> {
        if let Some(u) = self.unchecked.take() {
            let converted = convert_output(&u.checks, u.worker, u.step, u.batches)?;
            self.ports = converted.ports;
            self.hash = converted.hash;
        }
        Ok(())
    }
}

/// Checks a worker's output batches (well-formed, within the limits) and
/// hashes them: where the coordinator commits the output, and on a host
/// that commits its workers' shares of divided steps.
pub(crate) fn convert_output(
    checks: &OutputChecks,
    worker: u32,
    step: u64,
    batches: Vec<Batch>,
) -> Result<WorkerOutput> {
    if let Some(limit) = checks.max_output {
        let attempted: u64 = batches.iter().map(|b| b.weights.len() as u64).sum();
        if attempted > limit {
            return Err(GuestError::OutputLimit {
                worker,
                step,
                limit,
                attempted,
            }
            .into());
        }
    }
    let refuse = |message: String| -> Error {
        GuestError::Failed {
            worker,
            call: "step",
            message: format!("step {step}: {message}"),
        }
        .into()
    };
    let mut ports: Vec<Vec<Event>> = vec![Vec::new(); checks.ports];
    for batch in batches {
        let port = ports.get_mut(batch.port as usize).ok_or_else(|| {
            refuse(format!(
                "returned a batch for output port {}, but the circuit has {} output ports",
                batch.port, checks.ports
            ))
        })?;
        let values = slices(&batch.values, &batch.ends, batch.weights.len()).ok_or_else(|| {
            refuse(format!(
                "returned a malformed batch for output port {} (ends out of order or \
                         past the values, or as many ends as weights)",
                batch.port
            ))
        })?;
        port.reserve(values.len());
        for (value, weight) in values.into_iter().zip(&batch.weights) {
            if *weight == 0 {
                continue;
            }
            if checks.check_json
                && let Err(err) = serde_json::from_slice::<serde::de::IgnoredAny>(value)
            {
                return Err(refuse(format!(
                    "output port {} got a value that is not JSON: {err}",
                    batch.port
                )));
            }
            port.push(Event {
                value: value.to_vec(),
                weight: *weight,
            });
        }
    }
    let hash = hash_outputs(&ports);
    Ok(WorkerOutput {
        ports,
        hash,
        shared: None,
        dead_letters: DeadLetters::default(),
        dead_count: 0,
        unchecked: None,
    })
}

/// A worker share's commit error: a done record with another hash is a
/// replay that computed other output.
pub(crate) fn share_error(e: sluice_storage::StorageError) -> Error {
    match e {
        sluice_storage::StorageError::DoneDiffers {
            step,
            worker,
            committed,
            replayed,
        } => Error::Nondeterministic {
            step,
            worker,
            committed,
            replayed,
        },
        e => e.into(),
    }
}

/// Runs blocking storage work off the async workers.
pub(crate) async fn blocking<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> Result<T>
where
    T: Send + 'static,
    E: Into<Error> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(Error::task("a storage task"))?
        .map_err(Into::into)
}

#[cfg(test)]
#[path = "step_io/read_tests.rs"]
mod read_tests;

#[cfg(test)]
mod tests {
    use super::{SPARE_BATCHES, SPARE_BYTES, Spare};
    use crate::bindings::Batch;

    fn batch(port: u32, bytes: usize) -> Batch {
        Batch {
            port,
            values: vec![7; bytes],
            ends: vec![bytes as u32],
            weights: vec![1],
        }
    }

    /// How many batches with buffers `spare` holds (taking them all).
    fn kept(spare: &Spare) -> usize {
        std::iter::from_fn(|| Some(spare.take(0)))
            .take_while(|b| b.values.capacity() > 0)
            .count()
    }

    #[test]
    fn a_kept_batch_comes_back_empty_with_its_buffers() {
        let spare = Spare::default();
        spare.keep(vec![batch(3, 1000)]);
        let b = spare.take(5);
        assert_eq!(b.port, 5);
        assert!(b.values.is_empty() && b.ends.is_empty() && b.weights.is_empty());
        assert!(b.values.capacity() >= 1000 && b.ends.capacity() >= 1);
        // Nothing is kept any more: a new batch.
        assert_eq!(spare.take(0).values.capacity(), 0);
        // A clone is the same pool.
        spare.clone().keep(vec![batch(0, 10)]);
        assert_eq!(kept(&spare), 1);
        // The largest is taken first.
        spare.keep(vec![batch(0, 10), batch(1, 1000), batch(2, 100)]);
        assert!(spare.take(0).values.capacity() >= 1000);
        assert!(spare.take(0).values.capacity() >= 100);
    }

    #[test]
    fn what_is_kept_is_bounded() {
        let spare = Spare::default();
        spare.keep(
            (0..SPARE_BATCHES as u32 + 4)
                .map(|p| batch(p, 10))
                .collect(),
        );
        assert_eq!(kept(&spare), SPARE_BATCHES);
        // One too large alone; of two halves, the second would pass the
        // bound with the first.
        spare.keep(vec![
            batch(0, SPARE_BYTES + 1),
            batch(1, SPARE_BYTES / 2),
            batch(2, SPARE_BYTES / 2),
        ]);
        assert_eq!(kept(&spare), 1);
    }
}
