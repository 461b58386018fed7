//! The [`LogBackend`] trait: a pipeline's logs and the atomic step commit.
//!
//! A backend holds a pipeline's input logs (partitioned, append-only), its
//! output logs (one entry per step per worker) and its step records, and
//! commits a step atomically. It does not know about checkpoints: the trim
//! rule (I2) is enforced one level up, in [`Guarded`](crate::Guarded).
//! Backends live in their own crates (`sluice-embedded`, `sluice-kafka`) and
//! pass [`conformance::log_backend`](crate::conformance::log_backend).

use crate::error::{Result, StorageError};
use crate::records::{InputRecord, RecordRef};
use sluice_core::{
    ConfigError, Event, Frontier, OutputEntry, StepCommit, StepRecord, dead_letter_input,
    hash_ports,
};
use std::ops::{ControlFlow, Range};
use std::sync::Arc;

/// Events to append to input logs, made durable together.
#[derive(Debug, Clone, Default)]
pub struct AppendBatch {
    /// `(input log, partition, events)`; events keep their order.
    pub appends: Vec<(String, u32, Vec<Event>)>,
    /// Stored atomically with the events, so an interrupted ingest resumes
    /// exactly where the durable part ends.
    pub mark: Option<IngestMark>,
    /// The producer, its session and the sequence number of this append:
    /// the batch is appended only if it is the producer's next one on its
    /// input (see [`check_producer`] for the rules). A producer's batch
    /// appends to one input log.
    pub producer: Option<ProducerSeq>,
}

/// A producer's identity, session and the sequence number of one append.
///
/// Sequence numbers are per (producer, input log) and start at 1 in each
/// session; a producer starts a new session by raising its epoch, which
/// fences the older session (its appends are refused from then on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerSeq {
    /// The producer's id, chosen by the producer.
    pub id: String,
    /// The producer's session; 0 for the first.
    pub epoch: u64,
    /// 1 for the session's first append to an input, then one more each.
    pub seq: u64,
}

/// What a backend remembers of a producer on one input log.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProducerState {
    /// Its current session.
    pub epoch: u64,
    /// The last sequence number appended in that session (0: none yet).
    pub last_seq: u64,
    /// The offsets that append got, per entry of its batch: the answer to a
    /// retry of it.
    pub ranges: Vec<Range<u64>>,
}

/// What a producer's append must do, by the rules of Kafka's idempotent
/// producer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProducerCheck {
    /// The next sequence number (or the first of a new session): append.
    Append,
    /// A retry of the last append: answer with its offsets, append nothing.
    Duplicate(Vec<Range<u64>>),
}

/// Decides a producer's append on `input` from what was stored (`None`: a
/// producer never seen there). With `last` the session's last sequence
/// number: `seq == last + 1` appends; `seq == last` is a retry, answered
/// with the original offsets; `seq < last` fails with
/// [`StorageError::DuplicateSequence`]; `seq > last + 1` with
/// [`StorageError::OutOfOrderSequence`]. An epoch above the stored one
/// starts a new session (`seq` must then be 1); one below fails with
/// [`StorageError::InputProducerSuperseded`]. Nothing is acknowledged that was not
/// appended.
pub fn check_producer(
    p: &ProducerSeq,
    input: &str,
    state: Option<&ProducerState>,
) -> Result<ProducerCheck> {
    let fresh = ProducerState::default();
    let state = state.unwrap_or(&fresh);
    let last = match p.epoch.cmp(&state.epoch) {
        std::cmp::Ordering::Less => {
            return Err(StorageError::InputProducerSuperseded {
                producer: p.id.clone(),
                input: input.to_owned(),
                epoch: p.epoch,
                current: state.epoch,
            });
        }
        std::cmp::Ordering::Greater => 0,
        std::cmp::Ordering::Equal => state.last_seq,
    };
    if p.seq == last + 1 {
        Ok(ProducerCheck::Append)
    } else if p.seq == last && last > 0 {
        Ok(ProducerCheck::Duplicate(state.ranges.clone()))
    } else if p.seq < last {
        Err(StorageError::DuplicateSequence {
            producer: p.id.clone(),
            input: input.to_owned(),
            seq: p.seq,
            last,
        })
    } else {
        Err(StorageError::OutOfOrderSequence {
            producer: p.id.clone(),
            input: input.to_owned(),
            seq: p.seq,
            expected: last + 1,
        })
    }
}

impl AppendBatch {
    /// The one input log a producer's batch appends to, or why the batch is
    /// not a valid producer append.
    pub fn producer_input(&self) -> Result<Option<&str>> {
        let Some(p) = &self.producer else {
            return Ok(None);
        };
        let mut inputs = self.appends.iter().map(|(input, _, _)| input.as_str());
        let first = inputs.next();
        match first {
            Some(input) if inputs.all(|i| i == input) => Ok(Some(input)),
            _ => Err(ConfigError::Invalid(format!(
                "an append of producer `{}` must go to exactly one input log",
                p.id
            ))
            .into()),
        }
    }
}

/// Progress of one ingest source (a file appended by `sluice run`), stored
/// with the events it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngestMark {
    /// Identifies the source.
    pub source: String,
    /// The source's own encoding of how far it got.
    pub state: Vec<u8>,
}

/// The error of a [`LogBackend::read_exact`] past what the reader sees.
pub fn not_visible(input: &str, partition: u32, end: u64, high: u64) -> StorageError {
    StorageError::backend(
        "log",
        format!("reading input `{input}` partition {partition}"),
        true,
        format!("offsets up to {end} are not visible here yet (the end is {high})"),
    )
}

/// The error for partition `partition` of input `input`, which has
/// `partitions` partitions.
pub fn unknown_partition(input: &str, partition: u32, partitions: u32) -> StorageError {
    StorageError::Unknown {
        kind: "partition",
        name: format!("{input}[{partition}]"),
        hint: format!(" (input `{input}` has {partitions} partitions)"),
    }
}

/// One worker's share of a *divided* step: its entry in every output log
/// (in the pipeline's output order) and the hash of its output, committed
/// with the worker's done record by whoever holds the worker
/// ([`LogBackend::take_worker`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommit {
    /// The step.
    pub step: u64,
    /// The worker.
    pub worker: u32,
    /// [`hash_outputs`](sluice_core::hash_outputs) of the entries' events,
    /// port by port.
    pub hash: u128,
    /// `(output log, entry)`, one per output log.
    pub outputs: Vec<(String, OutputEntry)>,
    /// `(dead-letter log, entry)`: the input records the worker skipped as
    /// not events in this step, one entry per dead-letter log it skipped
    /// any for; tagged like its outputs, committed with them, not in the
    /// hash.
    pub dead_letters: Vec<(String, OutputEntry)>,
}

impl WorkerCommit {
    /// Worker `worker`'s share of step `step`: its events per output log
    /// (in port order), each entry tagged with the step, the worker and its
    /// `frontier`, and their `hash`.
    pub fn new(
        step: u64,
        worker: u32,
        frontier: &Frontier,
        outputs: impl IntoIterator<Item = (String, Vec<Event>)>,
        hash: u128,
    ) -> Self {
        let outputs = outputs
            .into_iter()
            .map(|(name, events)| {
                let entry = OutputEntry {
                    step,
                    worker,
                    frontier: frontier.clone(),
                    events,
                };
                (name, entry)
            })
            .collect();
        WorkerCommit {
            step,
            worker,
            hash,
            outputs,
            dead_letters: Vec::new(),
        }
    }

    /// With the records it skipped: `(dead-letter log, events)`, those
    /// without events left out; each entry tagged like the outputs.
    pub fn with_dead_letters(
        mut self,
        frontier: &Frontier,
        dead_letters: impl IntoIterator<Item = (String, Vec<Event>)>,
    ) -> Self {
        self.dead_letters = dead_letters
            .into_iter()
            .filter(|(_, events)| !events.is_empty())
            .map(|(name, events)| {
                let entry = OutputEntry {
                    step: self.step,
                    worker: self.worker,
                    frontier: frontier.clone(),
                    events,
                };
                (name, entry)
            })
            .collect();
        self
    }

    /// Every log it writes to, with its entry: the outputs, then the
    /// dead-letter logs.
    pub fn logs(&self) -> impl Iterator<Item = (&str, &OutputEntry)> {
        self.outputs
            .iter()
            .chain(&self.dead_letters)
            .map(|(name, entry)| (name.as_str(), entry))
    }

    /// Its dead letters, over every dead-letter log.
    pub fn dead_letter_count(&self) -> u64 {
        self.dead_letters
            .iter()
            .map(|(_, e)| e.events.len() as u64)
            .sum()
    }

    /// Its output events, over every output log.
    pub fn events(&self) -> u64 {
        self.outputs
            .iter()
            .map(|(_, e)| e.events.len() as u64)
            .sum()
    }
}

/// What [`WorkerCommitter::commit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerDone {
    /// The entries and the done record are committed.
    Committed,
    /// The worker's done record for the step already existed, with the
    /// same hash: nothing was written (a replay of a completed share).
    Already,
}

/// The right to commit one worker's shares of divided steps, got from
/// [`LogBackend::take_worker`]. Taking a worker fences every earlier holder
/// of it: their commits fail from then on, so a zombie host still running
/// the worker can commit nothing.
pub trait WorkerCommitter: Send {
    /// The worker it commits for.
    fn worker(&self) -> u32;

    /// Commits the worker's share of a divided step — its entries (the
    /// dead letters' too) and its done record, atomically — unless the done record exists: then
    /// compares the hash ([`StorageError::DoneDiffers`] if it differs) and
    /// writes nothing. Fails if the step's division is not recorded, if the
    /// share does not fit it ([`check_worker_commit`]), or if another
    /// holder took the worker since ([`StorageError::WorkerTaken`], or the
    /// backend's fencing error).
    fn commit(&mut self, commit: &WorkerCommit) -> Result<WorkerDone>;
}

/// Checks a worker's share against its step's division record: the record
/// is a division (its hashes are in done records), the worker is one of
/// the step's, every entry is tagged with the step, the worker and the
/// worker's frontier, no output log appears twice, and the hash is the
/// entries' hash.
pub fn check_worker_commit(record: &StepRecord, commit: &WorkerCommit) -> Result<()> {
    let invalid = |message: String| StorageError::InvalidCommit {
        step: commit.step,
        message,
    };
    if !record.is_division() || record.step != commit.step {
        return Err(invalid(format!(
            "worker {}'s share commits to step {}, which is not a divided step",
            commit.worker, commit.step
        )));
    }
    let Some(frontier) = record.frontiers.get(commit.worker as usize) else {
        return Err(invalid(format!(
            "worker {} is not one of the step's {} workers",
            commit.worker,
            record.frontiers.len()
        )));
    };
    let mut names: Vec<&str> = commit.logs().map(|(n, _)| n).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err(invalid(
            "an output log appears twice in a worker's share".into(),
        ));
    }
    if let Some((name, entry)) = commit
        .dead_letters
        .iter()
        .find(|(name, e)| dead_letter_input(name).is_none() || e.events.is_empty())
    {
        return Err(invalid(format!(
            "worker {}'s share names `{name}` as a dead-letter log, with {} records",
            commit.worker,
            entry.events.len()
        )));
    }
    for (name, entry) in commit.logs() {
        if entry.step != commit.step || entry.worker != commit.worker || &entry.frontier != frontier
        {
            return Err(invalid(format!(
                "worker {}'s entry in `{name}` must be tagged with this step, the worker and its \
                 frontier",
                commit.worker
            )));
        }
    }
    if hash_ports(commit.outputs.iter().map(|(_, e)| e.events.as_slice())) != commit.hash {
        return Err(invalid(format!(
            "worker {}'s share does not hash to the hash it names",
            commit.worker
        )));
    }
    Ok(())
}

/// Decides a worker's share, offered to the holder of worker `holder`,
/// from what the log holds of its step: the division (`None`: not
/// recorded) and the hash in the worker's done record, if it has one.
/// `Ok(None)`: commit the share;
/// `Ok(Some(WorkerDone::Already))`: its done record exists with the same
/// hash, write nothing. Fails for a share of an unrecorded step, one that
/// does not fit its division ([`check_worker_commit`]) and one whose done
/// record has another hash ([`StorageError::DoneDiffers`]).
pub fn decide_share(
    holder: u32,
    record: Option<&StepRecord>,
    done: Option<u128>,
    commit: &WorkerCommit,
) -> Result<Option<WorkerDone>> {
    if commit.worker != holder {
        return Err(StorageError::InvalidCommit {
            step: commit.step,
            message: format!(
                "worker {}'s share offered to worker {holder}'s holder",
                commit.worker
            ),
        });
    }
    let record = record.ok_or_else(|| StorageError::InvalidCommit {
        step: commit.step,
        message: format!(
            "worker {}'s share of a step whose division is not recorded",
            commit.worker
        ),
    })?;
    check_worker_commit(record, commit)?;
    match done {
        None => Ok(None),
        Some(hash) if hash == commit.hash => Ok(Some(WorkerDone::Already)),
        Some(hash) => Err(StorageError::DoneDiffers {
            step: commit.step,
            worker: commit.worker,
            committed: format!("{hash:032x}"),
            replayed: format!("{:032x}", commit.hash),
        }),
    }
}

/// The durable, partitioned logs of one pipeline.
///
/// Implementations are shared between tasks (`Send + Sync`) and may block:
/// callers on an async runtime run them on its blocking pool.
pub trait LogBackend: Send + Sync {
    /// Creates input log `input` with `partitions` partitions, or checks that
    /// an existing one has that many.
    fn create_input(&self, input: &str, partitions: u32) -> Result<()>;

    /// The number of partitions of input log `input`.
    fn partitions(&self, input: &str) -> Result<u32>;

    /// Appends events and returns, per entry of `batch.appends`, the offsets
    /// they got. Returns only once the events (and the mark, and the
    /// producer's new state) are durable, in one atomic write.
    ///
    /// A producer's batch follows [`check_producer`]: a retry of the
    /// producer's last append gets that append's offsets and appends
    /// nothing; any other sequence number than the next fails.
    fn append(&self, batch: AppendBatch) -> Result<Vec<Range<u64>>>;

    /// [`append`](Self::append), except that the batch need not be durable
    /// yet when this returns: it is appended atomically, in order with the
    /// log's other writes, and is durable once a later durable write is
    /// (an `append`, a step's commit: a step that read it makes it durable
    /// by committing) or [`sync_appends`](Self::sync_appends) returns. A
    /// crash of the machine before then may lose it and every lazy append
    /// after it, never a part of one, nor one without those before it. For
    /// the chunks of a file, each carrying its mark: a lost tail of them is
    /// appended again from the last durable mark. The default, for a log
    /// whose every append is durable: `append`.
    fn append_lazily(&self, batch: AppendBatch) -> Result<Vec<Range<u64>>> {
        self.append(batch)
    }

    /// Makes every append before it durable (see
    /// [`append_lazily`](Self::append_lazily)). The default: nothing to do.
    fn sync_appends(&self) -> Result<()> {
        Ok(())
    }

    /// What is stored of producer `id` on input log `input`, if it appended
    /// there.
    fn producer(&self, id: &str, input: &str) -> Result<Option<ProducerState>>;

    /// The last mark stored for `source`, if any.
    fn ingest_mark(&self, source: &str) -> Result<Option<Vec<u8>>>;

    /// `(low, high)`: the first offset still stored and one past the last
    /// offset appended.
    fn watermarks(&self, input: &str, partition: u32) -> Result<(u64, u64)>;

    /// Reads offsets `range` of one partition. Fails with
    /// [`StorageError::Trimmed`] if part of it was trimmed;
    /// returns fewer events only if the range extends past the high
    /// watermark.
    fn read(&self, input: &str, partition: u32, range: Range<u64>) -> Result<Vec<Event>>;

    /// Reads offsets `range` like [`read`](Self::read) — with `exact`,
    /// like [`read_exact`](Self::read_exact) — but a record that is not an
    /// event comes back as [`InputRecord::Bad`] in its place (with its
    /// position and why) instead of failing the read: what a step reads, so
    /// its input's bad-record policy decides. Deterministic: the same
    /// offsets give the same records, bad ones included. The default, for
    /// a log whose records are all events, wraps `read`.
    fn read_records(
        &self,
        input: &str,
        partition: u32,
        range: Range<u64>,
        exact: bool,
    ) -> Result<Vec<InputRecord>> {
        let events = match exact {
            true => self.read_exact(input, partition, range)?,
            false => self.read(input, partition, range)?,
        };
        Ok(events.into_iter().map(InputRecord::Event).collect())
    }

    /// Reads offsets `range` like [`read_records`](Self::read_records),
    /// lending each record to `each` in offset order instead of collecting
    /// them (a step's read then copies each value once, into its batch).
    /// Returns how many records it lent. An error from `each` stops the
    /// read and is returned. The default wraps `read_records`.
    fn each_record(
        &self,
        input: &str,
        partition: u32,
        range: Range<u64>,
        exact: bool,
        each: &mut dyn FnMut(RecordRef<'_>) -> Result<()>,
    ) -> Result<u64> {
        let records = self.read_records(input, partition, range, exact)?;
        let count = records.len() as u64;
        for record in records {
            match record {
                InputRecord::Event(e) => each(RecordRef::Event {
                    value: &e.value,
                    weight: e.weight,
                })?,
                InputRecord::Bad(bad) => each(RecordRef::Bad(bad))?,
            }
        }
        Ok(count)
    }

    /// Reads offsets `range` like [`read`](Self::read), but never short:
    /// fails (transiently: the events become visible) when the range
    /// extends past the partition's end as this reader sees it. For a
    /// reader other than the one that divided the step, which must read
    /// exactly the events the division covers.
    fn read_exact(&self, input: &str, partition: u32, range: Range<u64>) -> Result<Vec<Event>> {
        let (_, high) = self.watermarks(input, partition)?;
        if high < range.end {
            return Err(not_visible(input, partition, range.end, high));
        }
        self.read(input, partition, range)
    }

    /// Where the logs live, if a worker on another host can read them
    /// there: two logs with the same location hold the same events, so a
    /// coordinator may have a worker's host read that worker's input
    /// itself (by offsets) instead of sending it. `None` (the default): no
    /// other host reads them.
    fn location(&self) -> Option<String> {
        None
    }

    /// Checks, within a few seconds, that the logs answer now: a host
    /// reports whether its workers read their own input at the start of
    /// every coordinator's session, so a host that lost the logs since it
    /// opened them is sent its input instead of failing every step (a
    /// livelock of reopens). A transient error if they do not answer. The
    /// default, for a log in this process: `Ok`.
    fn reachable(&self) -> Result<()> {
        Ok(())
    }

    /// Records the pipeline's changes of component (`sluice upgrade`), the
    /// whole list as the caller encodes it (replacing what was recorded),
    /// where every host opening the pipeline reads it
    /// ([`upgrades`](Self::upgrades)): in a commit fenced like a step's,
    /// so a host another fenced records nothing. `Ok(false)` (the
    /// default): this log keeps no such record — the embedded log, whose
    /// data directory's metadata is the record (its lock the fence).
    fn record_upgrades(&self, upgrades: &[u8]) -> Result<bool> {
        let _ = upgrades;
        Ok(false)
    }

    /// The changes of component last recorded with
    /// [`record_upgrades`](Self::record_upgrades), as committed; `None`
    /// when none were (or this log keeps none).
    fn upgrades(&self) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }

    /// Starts a new fencing epoch and returns it: from now on, commits whose
    /// record carries an older epoch fail with
    /// [`StorageError::HostEpochSuperseded`]. A host calls this once when
    /// it takes over a pipeline, so a zombie predecessor can no longer
    /// commit. Durable before it returns.
    fn fence(&self) -> Result<u64>;

    /// Commits a step: every worker's output entries, the dead letters
    /// ([`StepCommit::dead_letters`], written like output entries) and the
    /// step record, atomically and durably — as readers see it: a backend
    /// may write the entries first, provided no read returns them before
    /// the record is in and none ever does if it never comes. Fails with
    /// [`StorageError::StepExists`] if the step is already
    /// committed (I1), [`StorageError::StepGap`] if it does
    /// not follow the last committed step, and
    /// [`StorageError::HostEpochSuperseded`] if the record's epoch is not
    /// the current one. The epoch check and the write are one atomic action.
    fn commit_step(&self, commit: &StepCommit) -> Result<()>;

    /// Whether this log takes *divided* steps: a step whose record is
    /// committed first as its division ([`StepRecord::is_division`],
    /// through [`commit_step`](Self::commit_step) with no outputs), each
    /// worker's share then committed by whoever holds the worker
    /// ([`take_worker`](Self::take_worker)). `false` (the default): every
    /// step commits whole.
    fn worker_commits(&self) -> bool {
        false
    }

    /// Takes worker `worker` of divided steps: fences every earlier holder
    /// (its commits fail from now on) and returns the right to commit the
    /// worker's shares. Fails where the log does not take divided steps
    /// (the default; see [`worker_commits`](Self::worker_commits)).
    fn take_worker(self: Arc<Self>, worker: u32) -> Result<Box<dyn WorkerCommitter>> {
        Err(ConfigError::Invalid(format!(
            "this log commits every step whole: it takes no worker (worker {worker})"
        ))
        .into())
    }

    /// The hash of every worker's output in step `step`: the record's for a
    /// step committed whole; for a divided step, its workers' done records
    /// once every one is visible here (`None` before: the step is not
    /// complete). `None` for a step not recorded.
    fn output_hashes(&self, step: u64) -> Result<Option<Vec<u128>>> {
        Ok(self
            .step_record(step)?
            .filter(|r| !r.is_division())
            .map(|r| r.output_hashes))
    }

    /// Waits until divided step `step` is complete as seen here (every
    /// worker's done record visible, reading those committed elsewhere);
    /// fails if one is still missing at the log's end.
    fn await_complete(&self, step: u64) -> Result<Vec<u128>> {
        self.output_hashes(step)?
            .ok_or_else(|| StorageError::InvalidCommit {
                step,
                message: "the step is not complete: a worker's share is missing".into(),
            })
    }

    /// The last committed step, if any (for divided steps: the last
    /// recorded division, which may not be complete yet).
    fn last_step(&self) -> Result<Option<u64>>;

    /// The record of a committed step (the seed's `get_frontier`).
    fn step_record(&self, step: u64) -> Result<Option<StepRecord>>;

    /// Calls `f` with every entry of output log `output`, in (step, worker)
    /// order, from step `from_step` on, until `f` breaks. Output is indexed
    /// by step: a scan costs what it reads from `from_step` to where `f`
    /// stops, not the log's history.
    fn scan_output(
        &self,
        output: &str,
        from_step: u64,
        f: &mut dyn FnMut(OutputEntry) -> Result<ControlFlow<()>>,
    ) -> Result<()>;

    /// Discards offsets below `below` of one partition. Idempotent; never
    /// moves the low watermark down. Callers must go through
    /// [`Guarded::trim`](crate::Guarded::trim), which checks I2.
    fn trim(&self, input: &str, partition: u32, below: u64) -> Result<()>;

    /// Discards the entries of output log `output` below step `below_step`
    /// (output retention), durably; [`output_low`](Self::output_low) says
    /// where the output now starts. Idempotent; never moves it down.
    /// Callers must keep every step a recovery may replay (above the newest
    /// checkpoint). A backend whose output has its own retention (Kafka:
    /// the topic's `retention.ms`/`retention.bytes`) keeps the entries and
    /// leaves `output_low` at 0.
    fn trim_output(&self, output: &str, below_step: u64) -> Result<()>;

    /// The first step whose entries output log `output` still holds (0 if
    /// it was never trimmed).
    fn output_low(&self, output: &str) -> Result<u64>;

    /// Host memory this log holds for its pipeline now (write buffers,
    /// caches, index readers), in bytes, as far as the backend can tell:
    /// a multi-tenant host counts it in the tenant's usage. The default: 0,
    /// for a log that keeps nothing it can measure.
    fn memory_bytes(&self) -> u64 {
        0
    }
}
