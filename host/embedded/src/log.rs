//! The embedded log: every log of a pipeline in its RocksDB database.
//!
//! Keys (big-endian numbers, so RocksDB's order is log order):
//! - input:  `[name][partition u32][first offset u64][0xFF]` → a chunk,
//!   postcard `Vec<Event>` (weight 0: a line an ingest kept as not an
//!   event, see [`sluice_core::bad_records`]; it reads back as a
//!   [`BadRecord`]); databases written before chunks hold
//!   `[name][partition u32][offset u64]` → postcard [`Event`] (see the
//!   `input` module)
//! - output: `[name][step u64][worker u32]` → postcard [`OutputEntry`] (a
//!   dead-letter log `<input>.dead-letter` too); an ingested entry larger
//!   than 64 KiB as pieces of its encoding,
//!   `[name][step u64][worker u32][piece u32][pieces u32]` (see the
//!   `output` module)
//! - steps:  `[step u64]` → postcard [`StepRecord`]
//! - meta:   `log.input.[name]` → partitions (u32), `log.low.[name][partition]` → low watermark,
//!   `log.done.[step u64][worker u32]` → a divided step's done record (the
//!   worker's output hash, u128), `log.worker.[worker u32]` → the worker's
//!   holder epoch (u64)
//! - ingest: `[source]` → mark

use crate::db::{self, CF_INGEST, CF_INPUT, CF_META, CF_OUTPUT, CF_STEPS, rocks};
use rocksdb::{IteratorMode, WriteBatch};
use sluice_core::{ConfigError, Event, OutputEntry, StepCommit, StepRecord, validate_name};
use sluice_storage::records::events_only;
use sluice_storage::{
    AppendBatch, InputRecord, LogBackend, ProducerCheck, ProducerState, RecordRef, Result,
    StorageError as Error, WorkerCommit, WorkerCommitter, WorkerDone, check_producer, decide_share,
};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(test)]
mod in_place_tests;
mod input;
mod output;

/// Input, output and step logs in the pipeline's RocksDB database.
pub struct EmbeddedLog {
    db: Arc<db::PipelineDb>,
    /// `(input, partition)` → `(low, high)`, kept in step with the database
    /// under this lock; appends and trims take it.
    marks: Mutex<HashMap<(String, u32), (u64, u64)>>,
    /// The last committed step; commits take this lock, which makes the
    /// "is this step new?" check and the write one atomic action.
    last_step: Mutex<Option<u64>>,
    /// Whether step commits are fsynced (always, except in benchmarks that
    /// measure what durability costs).
    sync_commits: bool,
    /// Whether output may lie past the last recorded step: set when the
    /// log opens and before a step's output is ingested, cleared once it
    /// is known none does (see the `output` module).
    unsettled_output: AtomicBool,
    /// The size of a step's output, in bytes, from which it is ingested as
    /// a table file rather than written in the commit's batch.
    ingest_output_at: usize,
}

/// The key of an input event as databases written before chunks hold it,
/// and the start of a partition's range of keys at `offset` (a chunk's key
/// is this one and a tag byte: see the `input` module).
pub fn input_key(name: &str, partition: u32, offset: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + 13);
    db::push_name(&mut k, name);
    k.extend_from_slice(&partition.to_be_bytes());
    k.extend_from_slice(&offset.to_be_bytes());
    k
}

/// The key of an output entry (for tools and tests that inspect the
/// database). An entry written as pieces has none: its pieces' keys start
/// with it (see the `output` module).
pub fn output_key(name: &str, step: u64, worker: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + 13);
    db::push_name(&mut k, name);
    k.extend_from_slice(&step.to_be_bytes());
    k.extend_from_slice(&worker.to_be_bytes());
    k
}

const EPOCH_KEY: &[u8] = b"log.epoch";

/// The key of a divided step's done record of one worker.
fn done_key(step: u64, worker: u32) -> Vec<u8> {
    let mut k = b"log.done.".to_vec();
    k.extend_from_slice(&step.to_be_bytes());
    k.extend_from_slice(&worker.to_be_bytes());
    k
}

/// The key of a worker's holder epoch ([`LogBackend::take_worker`]).
fn worker_key(worker: u32) -> Vec<u8> {
    let mut k = b"log.worker.".to_vec();
    k.extend_from_slice(&worker.to_be_bytes());
    k
}

/// The key of a producer's state on one input: ingest marks are named
/// `file:…`, producers live in their own namespace.
fn producer_key(id: &str, input: &str) -> Vec<u8> {
    let mut k = b"producer:".to_vec();
    db::push_name(&mut k, input);
    k.extend_from_slice(id.as_bytes());
    k
}

fn input_meta_key(name: &str) -> Vec<u8> {
    [b"log.input.".as_slice(), name.as_bytes()].concat()
}

fn low_key(name: &str, partition: u32) -> Vec<u8> {
    let mut k = b"log.low.".to_vec();
    db::push_name(&mut k, name);
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

/// Where output log `name` starts after retention.
fn output_low_key(name: &str) -> Vec<u8> {
    let mut k = b"log.output-low.".to_vec();
    db::push_name(&mut k, name);
    k
}

fn be_u64(bytes: &[u8], what: &str) -> Result<u64> {
    let arr: [u8; 8] = bytes.try_into().map_err(|_| Error::Corrupt {
        what: what.into(),
        message: format!("expected 8 bytes, found {}", bytes.len()),
    })?;
    Ok(u64::from_be_bytes(arr))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave the data inconsistent
    // (the cache is only updated after a successful write), so keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl EmbeddedLog {
    /// Opens the log in a database opened by [`db::open`].
    pub fn open(db: Arc<db::PipelineDb>) -> Result<Self> {
        if let Some(dir) = db.path().parent() {
            output::remove_left_tables(dir);
        }
        let steps = db::cf(&db, CF_STEPS)?;
        let last_step = match db.iterator_cf(steps, IteratorMode::End).next() {
            Some(item) => {
                let (k, _) = item.map_err(rocks("reading the last step"))?;
                Some(be_u64(&k, "step key")?)
            }
            None => None,
        };
        Ok(EmbeddedLog {
            db,
            marks: Mutex::new(HashMap::new()),
            last_step: Mutex::new(last_step),
            sync_commits: true,
            unsettled_output: AtomicBool::new(true),
            ingest_output_at: output::INGEST_AT,
        })
    }

    /// Like [`open`](Self::open), but step commits are not fsynced: a crash
    /// of the machine (not of the process) can lose committed steps. Only for
    /// benchmarks that measure what durable commits cost.
    pub fn open_unsynced_for_benchmarks(db: Arc<db::PipelineDb>) -> Result<Self> {
        Ok(EmbeddedLog {
            sync_commits: false,
            ..Self::open(db)?
        })
    }

    fn commit_options(&self) -> rocksdb::WriteOptions {
        if self.sync_commits {
            db::synced()
        } else {
            rocksdb::WriteOptions::default()
        }
    }

    /// Appends `batch` (see [`LogBackend::append`]) with `write`'s
    /// durability.
    fn append_with(
        &self,
        batch: AppendBatch,
        write: &rocksdb::WriteOptions,
    ) -> Result<Vec<Range<u64>>> {
        let cf = db::cf(&self.db, CF_INPUT)?;
        let producer_input = batch.producer_input()?;
        // The lock orders appends: a producer's check and its write are one
        // action.
        let mut cache = lock(&self.marks);
        if let (Some(p), Some(input)) = (&batch.producer, producer_input) {
            let state = self.producer(&p.id, input)?;
            if let ProducerCheck::Duplicate(ranges) = check_producer(p, input, state.as_ref())? {
                return Ok(ranges);
            }
        }
        let mut next: HashMap<(String, u32), u64> = HashMap::new();
        // Sized before it is filled (it would grow by doubling, copying):
        // each event's value, its length and weight, and per chunk a key,
        // lengths, a tag and a column family.
        let capacity: usize = (batch.appends.iter())
            .map(|(input, _, events)| {
                let bytes: usize = events.iter().map(|e| e.value.len() + 20).sum();
                bytes + (bytes / input::CHUNK_BYTES + 1) * (input.len() + 40)
            })
            .sum();
        let mut wb = WriteBatch::with_capacity_bytes(capacity + 4096);
        let mut ranges = Vec::with_capacity(batch.appends.len());
        for (input, partition, events) in &batch.appends {
            let start = match next.get(&(input.clone(), *partition)) {
                Some(n) => *n,
                None => self.marks_of(&mut cache, input, *partition)?.1,
            };
            input::put_chunks(&mut wb, cf, (input, *partition), start, events)?;
            let end = start + events.len() as u64;
            next.insert((input.clone(), *partition), end);
            ranges.push(start..end);
        }
        if let Some(mark) = &batch.mark {
            wb.put_cf(
                db::cf(&self.db, CF_INGEST)?,
                mark.source.as_bytes(),
                &mark.state,
            );
        }
        if let (Some(p), Some(input)) = (&batch.producer, producer_input) {
            let pairs: Vec<(u64, u64)> = ranges.iter().map(|r| (r.start, r.end)).collect();
            let state = postcard::to_allocvec(&(p.epoch, p.seq, pairs))
                .map_err(Error::corrupt("producer state"))?;
            wb.put_cf(
                db::cf(&self.db, CF_INGEST)?,
                producer_key(&p.id, input),
                state,
            );
        }
        self.db
            .write_opt(wb, write)
            .map_err(rocks("appending input"))?;
        for (key, high) in next {
            if let Some(m) = cache.get_mut(&key) {
                m.1 = high;
            }
        }
        Ok(ranges)
    }

    fn current_epoch(&self) -> Result<u64> {
        Ok(match self.meta(EPOCH_KEY, "the epoch")? {
            Some(v) => be_u64(&v, "epoch")?,
            None => 0,
        })
    }

    /// The value of `key` in the meta column family.
    fn meta(&self, key: &[u8], what: &str) -> Result<Option<Vec<u8>>> {
        let meta = db::cf(&self.db, CF_META)?;
        self.db
            .get_cf(meta, key)
            .map_err(rocks(format!("reading {what}")))
    }

    /// A worker's done record of a divided step: its output hash.
    fn done(&self, step: u64, worker: u32) -> Result<Option<u128>> {
        let Some(v) = self.meta(&done_key(step, worker), "a done record")? else {
            return Ok(None);
        };
        let arr: [u8; 16] = v.as_slice().try_into().map_err(|_| Error::Corrupt {
            what: format!("done record of step {step} worker {worker}"),
            message: format!("expected 16 bytes, found {}", v.len()),
        })?;
        Ok(Some(u128::from_be_bytes(arr)))
    }

    /// The holder epoch of a worker (0: never taken).
    fn worker_epoch(&self, worker: u32) -> Result<u64> {
        Ok(
            match self.meta(&worker_key(worker), "a worker's holder epoch")? {
                Some(v) => be_u64(&v, "worker holder epoch")?,
                None => 0,
            },
        )
    }

    /// Every worker's output hash of a recorded step (`None` while a
    /// divided step misses a worker's done record).
    fn hashes_of(&self, record: StepRecord) -> Result<Option<Vec<u128>>> {
        if !record.is_division() {
            return Ok(Some(record.output_hashes));
        }
        (0..record.frontiers.len() as u32)
            .map(|w| self.done(record.step, w))
            .collect()
    }

    /// The first step whose output is not visible (yet): past the last
    /// recorded step, or the last step itself while it is a divided step
    /// still missing a worker's share. Bounding a scan by it keeps steps
    /// recorded while the scan runs out of it.
    fn visible_end(&self) -> Result<u64> {
        let Some(last) = *lock(&self.last_step) else {
            return Ok(0);
        };
        let complete = match self.step_record(last)? {
            Some(r) => self.hashes_of(r)?.is_some(),
            None => true,
        };
        Ok(if complete { last + 1 } else { last })
    }

    /// Reads `(low, high)` of a partition from the database.
    fn load_marks(&self, input: &str, partition: u32) -> Result<(u64, u64)> {
        let meta = db::cf(&self.db, CF_META)?;
        let low = match self
            .db
            .get_cf(meta, low_key(input, partition))
            .map_err(rocks("reading a low watermark"))?
        {
            Some(v) => be_u64(&v, "low watermark")?,
            None => 0,
        };
        let high = self.stored_end(input, partition)?;
        Ok((low, high.max(low)))
    }

    fn marks_of(
        &self,
        cache: &mut HashMap<(String, u32), (u64, u64)>,
        input: &str,
        partition: u32,
    ) -> Result<(u64, u64)> {
        if let Some(m) = cache.get(&(input.to_owned(), partition)) {
            return Ok(*m);
        }
        let partitions = self.partitions(input)?;
        if partition >= partitions {
            return Err(sluice_storage::log::unknown_partition(
                input, partition, partitions,
            ));
        }
        let m = self.load_marks(input, partition)?;
        cache.insert((input.to_owned(), partition), m);
        Ok(m)
    }
}

/// One worker of an embedded pipeline's divided steps, taken at a holder
/// epoch: its commits check that no later holder took the worker.
struct EmbeddedWorker {
    log: Arc<EmbeddedLog>,
    worker: u32,
    epoch: u64,
}

impl WorkerCommitter for EmbeddedWorker {
    fn worker(&self) -> u32 {
        self.worker
    }

    fn commit(&mut self, commit: &WorkerCommit) -> Result<WorkerDone> {
        let (step, worker) = (commit.step, commit.worker);
        let log = &self.log;
        // The commit lock makes the holder check and the write one action.
        let _commits = lock(&log.last_step);
        if log.worker_epoch(self.worker)? != self.epoch {
            return Err(Error::WorkerTaken {
                worker: self.worker,
                step,
            });
        }
        let record = log.step_record(step)?;
        if let Some(done) = decide_share(
            self.worker,
            record.as_ref(),
            log.done(step, worker)?,
            commit,
        )? {
            return Ok(done);
        }
        let out = db::cf(&log.db, CF_OUTPUT)?;
        let mut wb = WriteBatch::default();
        for (name, entry) in commit.logs() {
            let value = postcard::to_allocvec(entry).map_err(Error::corrupt("output entry"))?;
            wb.put_cf(out, output_key(name, step, worker), value);
        }
        wb.put_cf(
            db::cf(&log.db, CF_META)?,
            done_key(step, worker),
            commit.hash.to_be_bytes(),
        );
        log.db
            .write_opt(wb, &log.commit_options())
            .map_err(rocks(format!(
                "committing worker {worker}'s share of step {step}"
            )))?;
        Ok(WorkerDone::Committed)
    }
}

impl LogBackend for EmbeddedLog {
    /// RocksDB's memtables, table readers and block caches, over every
    /// column family.
    fn memory_bytes(&self) -> u64 {
        db::memory_bytes(&self.db)
    }

    /// This instance, in this process: only workers of hosts running in
    /// the same process and handed this log (tests, benchmarks) read it.
    fn location(&self) -> Option<String> {
        Some(format!(
            "embedded:{}:{:p}",
            std::process::id(),
            Arc::as_ptr(&self.db)
        ))
    }

    fn create_input(&self, input: &str, partitions: u32) -> Result<()> {
        validate_name("input log", input).map_err(ConfigError::from)?;
        if partitions == 0 {
            return Err(ConfigError::Invalid(format!(
                "input log `{input}` needs at least one partition"
            ))
            .into());
        }
        let meta = db::cf(&self.db, CF_META)?;
        match self
            .db
            .get_cf(meta, input_meta_key(input))
            .map_err(rocks("reading input metadata"))?
        {
            Some(v) if v.as_slice() == partitions.to_be_bytes() => Ok(()),
            Some(v) => Err(ConfigError::PartitionsChanged {
                input: input.to_owned(),
                stored: v
                    .first_chunk::<4>()
                    .map(|b| u32::from_be_bytes(*b))
                    .unwrap_or(0),
                wanted: partitions,
            }
            .into()),
            None => self
                .db
                .put_cf_opt(
                    meta,
                    input_meta_key(input),
                    partitions.to_be_bytes(),
                    &db::synced(),
                )
                .map_err(rocks("creating an input log")),
        }
    }

    fn partitions(&self, input: &str) -> Result<u32> {
        let meta = db::cf(&self.db, CF_META)?;
        match self
            .db
            .get_cf(meta, input_meta_key(input))
            .map_err(rocks("reading input metadata"))?
        {
            Some(v) => v
                .first_chunk::<4>()
                .map(|b| u32::from_be_bytes(*b))
                .ok_or_else(|| Error::Corrupt {
                    what: format!("metadata of input log `{input}`"),
                    message: "short value".into(),
                }),
            None => Err(Error::Unknown {
                kind: "input log",
                name: input.to_owned(),
                hint: String::new(),
            }),
        }
    }

    fn append(&self, batch: AppendBatch) -> Result<Vec<Range<u64>>> {
        self.append_with(batch, &db::synced())
    }

    fn append_lazily(&self, batch: AppendBatch) -> Result<Vec<Range<u64>>> {
        // Written to the write-ahead log (a process that dies loses
        // nothing), not synced: the next synced write syncs the log up to
        // itself, this write included (RocksDB syncs every log file before
        // a synced write's), and recovery keeps a prefix of the writes.
        self.append_with(batch, &rocksdb::WriteOptions::default())
    }

    fn sync_appends(&self) -> Result<()> {
        self.db
            .flush_wal(true)
            .map_err(rocks("syncing appended input"))
    }

    fn producer(&self, id: &str, input: &str) -> Result<Option<ProducerState>> {
        let cf = db::cf(&self.db, CF_INGEST)?;
        let Some(v) = self
            .db
            .get_cf(cf, producer_key(id, input))
            .map_err(rocks("reading a producer's state"))?
        else {
            return Ok(None);
        };
        let (epoch, last_seq, pairs): (u64, u64, Vec<(u64, u64)>) = postcard::from_bytes(&v)
            .map_err(Error::corrupt(format!(
                "state of producer `{id}` on input `{input}`"
            )))?;
        Ok(Some(ProducerState {
            epoch,
            last_seq,
            ranges: pairs.into_iter().map(|(a, b)| a..b).collect(),
        }))
    }

    fn ingest_mark(&self, source: &str) -> Result<Option<Vec<u8>>> {
        let cf = db::cf(&self.db, CF_INGEST)?;
        self.db
            .get_cf(cf, source.as_bytes())
            .map_err(rocks("reading an ingest mark"))
    }

    fn watermarks(&self, input: &str, partition: u32) -> Result<(u64, u64)> {
        let mut cache = lock(&self.marks);
        self.marks_of(&mut cache, input, partition)
    }

    fn read(&self, input: &str, partition: u32, range: Range<u64>) -> Result<Vec<Event>> {
        events_only(self.read_range(input, partition, range)?)
    }

    fn read_records(
        &self,
        input: &str,
        partition: u32,
        range: Range<u64>,
        exact: bool,
    ) -> Result<Vec<InputRecord>> {
        self.check_visible(input, partition, &range, exact)?;
        self.read_range(input, partition, range)
    }

    fn each_record(
        &self,
        input: &str,
        partition: u32,
        range: Range<u64>,
        exact: bool,
        each: &mut dyn FnMut(RecordRef<'_>) -> Result<()>,
    ) -> Result<u64> {
        self.check_visible(input, partition, &range, exact)?;
        self.scan_range(input, partition, range, each)
    }

    fn fence(&self) -> Result<u64> {
        // The commit lock orders a fence against commits of this handle; the
        // epoch itself is read from the database at every commit, so a fence
        // through any handle is seen.
        let _commits = lock(&self.last_step);
        let epoch = self.current_epoch()? + 1;
        let meta = db::cf(&self.db, CF_META)?;
        self.db
            .put_cf_opt(meta, EPOCH_KEY, epoch.to_be_bytes(), &db::synced())
            .map_err(rocks("starting a new epoch"))?;
        Ok(epoch)
    }

    fn commit_step(&self, commit: &StepCommit) -> Result<()> {
        let step = commit.record.step;
        let mut last = lock(&self.last_step);
        let current = self.current_epoch()?;
        if commit.record.epoch != current {
            return Err(Error::HostEpochSuperseded {
                step,
                epoch: commit.record.epoch,
                current,
            });
        }
        match *last {
            Some(l) if step <= l => return Err(Error::StepExists { step }),
            Some(l) if step != l + 1 => {
                return Err(Error::StepGap {
                    step,
                    last: Some(l),
                });
            }
            None if step != 0 => return Err(Error::StepGap { step, last: None }),
            _ => {}
        }
        // Output a crash or a failed record left past the last step is
        // deleted before this step's (whose keys it may share) is written.
        self.settle_output()?;
        let out = db::cf(&self.db, CF_OUTPUT)?;
        let record =
            postcard::to_allocvec(&commit.record).map_err(Error::corrupt("step record"))?;
        let entries: Vec<(Vec<u8>, &OutputEntry)> = commit
            .logs()
            .flat_map(|(name, entries)| {
                entries
                    .iter()
                    .map(move |entry| (output_key(name, step, entry.worker), entry))
            })
            .collect();
        // The batch is sized before it is filled: grown by doubling, a
        // key-heavy step's batch would hold up to twice its output again.
        // So is each entry's value.
        let mut capacity = record.len() + 64;
        let mut sizes = Vec::with_capacity(entries.len());
        for (key, entry) in &entries {
            let size = postcard::experimental::serialized_size(entry)
                .map_err(Error::corrupt("output entry"))?;
            // The value and key, each with its length, and the tag.
            capacity += size + key.len() + 16;
            sizes.push(size);
        }
        // A large output is ingested first (durably) and the batch holds
        // the record alone; not in benchmarks without synced commits, whose
        // batches nothing syncs.
        let ingest = self.sync_commits && !entries.is_empty() && capacity >= self.ingest_output_at;
        let mut wb;
        if ingest {
            wb = WriteBatch::with_capacity_bytes(record.len() + 64);
            self.ingest_output(step, entries)?;
        } else {
            wb = WriteBatch::with_capacity_bytes(capacity);
            for ((key, entry), size) in entries.into_iter().zip(sizes) {
                let value = postcard::to_io(entry, Vec::with_capacity(size))
                    .map_err(Error::corrupt("output entry"))?;
                wb.put_cf(out, key, value);
            }
        }
        wb.put_cf(db::cf(&self.db, CF_STEPS)?, step.to_be_bytes(), record);
        self.db
            .write_opt(wb, &self.commit_options())
            .map_err(rocks(format!("committing step {step}")))?;
        if ingest {
            self.unsettled_output.store(false, Ordering::Release);
        }
        *last = Some(step);
        Ok(())
    }

    fn last_step(&self) -> Result<Option<u64>> {
        Ok(*lock(&self.last_step))
    }

    fn step_record(&self, step: u64) -> Result<Option<StepRecord>> {
        let cf = db::cf(&self.db, CF_STEPS)?;
        match self
            .db
            .get_cf(cf, step.to_be_bytes())
            .map_err(rocks("reading a step record"))?
        {
            Some(v) => Ok(Some(
                postcard::from_bytes(&v)
                    .map_err(Error::corrupt(format!("record of step {step}")))?,
            )),
            None => Ok(None),
        }
    }

    fn scan_output(
        &self,
        output: &str,
        from_step: u64,
        f: &mut dyn FnMut(OutputEntry) -> Result<std::ops::ControlFlow<()>>,
    ) -> Result<()> {
        self.scan_output_keyed(output, from_step, &mut |_, _, e| f(e))
    }

    fn worker_commits(&self) -> bool {
        true
    }

    fn take_worker(self: Arc<Self>, worker: u32) -> Result<Box<dyn WorkerCommitter>> {
        let epoch = {
            let _commits = lock(&self.last_step);
            let epoch = self.worker_epoch(worker)? + 1;
            let meta = db::cf(&self.db, CF_META)?;
            self.db
                .put_cf_opt(meta, worker_key(worker), epoch.to_be_bytes(), &db::synced())
                .map_err(rocks(format!("taking worker {worker}")))?;
            epoch
        };
        Ok(Box::new(EmbeddedWorker {
            log: self,
            worker,
            epoch,
        }))
    }

    fn output_hashes(&self, step: u64) -> Result<Option<Vec<u128>>> {
        match self.step_record(step)? {
            Some(r) => self.hashes_of(r),
            None => Ok(None),
        }
    }

    fn trim_output(&self, output: &str, below_step: u64) -> Result<()> {
        let low = self.output_low(output)?;
        if below_step <= low {
            return Ok(());
        }
        let mut wb = WriteBatch::default();
        wb.delete_range_cf(
            db::cf(&self.db, CF_OUTPUT)?,
            output_key(output, low, 0),
            output_key(output, below_step, 0),
        );
        wb.put_cf(
            db::cf(&self.db, CF_META)?,
            output_low_key(output),
            below_step.to_be_bytes(),
        );
        self.db
            .write_opt(wb, &db::synced())
            .map_err(rocks("trimming output"))
    }

    fn output_low(&self, output: &str) -> Result<u64> {
        match self
            .db
            .get_cf(db::cf(&self.db, CF_META)?, output_low_key(output))
            .map_err(rocks("reading where output starts"))?
        {
            Some(v) => be_u64(&v, "output low"),
            None => Ok(0),
        }
    }

    fn trim(&self, input: &str, partition: u32, below: u64) -> Result<()> {
        let mut cache = lock(&self.marks);
        let (low, high) = self.marks_of(&mut cache, input, partition)?;
        if below <= low {
            return Ok(());
        }
        let below = below.min(high);
        // Entries wholly below `below` go; a chunk holding it stays, whole
        // (the low watermark keeps reads off its trimmed part).
        let cut = self.trim_cut(input, partition, below)?;
        let mut wb = WriteBatch::default();
        wb.delete_range_cf(
            db::cf(&self.db, CF_INPUT)?,
            input_key(input, partition, 0),
            input_key(input, partition, cut),
        );
        wb.put_cf(
            db::cf(&self.db, CF_META)?,
            low_key(input, partition),
            below.to_be_bytes(),
        );
        self.db
            .write_opt(wb, &db::synced())
            .map_err(rocks("trimming input"))?;
        cache.insert((input.to_owned(), partition), (below, high));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_storage::conformance::{self, LogFlags};
    use std::cell::RefCell;

    /// Both ways of writing a step's output: in the commit's batch, and
    /// (with every output large enough) as an ingested table file.
    #[test]
    fn passes_the_log_conformance_suite() {
        for ingest_output_at in [output::INGEST_AT, 0] {
            let dirs = RefCell::new(Vec::new());
            conformance::log_backend(
                &|| {
                    let dir = tempfile::tempdir().unwrap();
                    let mut log = EmbeddedLog::open(db::open(dir.path()).unwrap()).unwrap();
                    log.ingest_output_at = ingest_output_at;
                    dirs.borrow_mut().push(dir);
                    Arc::new(log)
                },
                LogFlags {
                    supports_trim: true,
                    dense_offsets: true,
                    output_retention: true,
                },
            );
        }
    }

    #[test]
    fn state_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = EmbeddedLog::open(db::open(dir.path()).unwrap()).unwrap();
            log.create_input("in", 1).unwrap();
            log.append(AppendBatch {
                appends: vec![(
                    "in".into(),
                    0,
                    vec![
                        Event {
                            value: b"1".to_vec(),
                            weight: 1
                        };
                        5
                    ],
                )],
                mark: None,
                producer: None,
            })
            .unwrap();
            log.trim("in", 0, 2).unwrap();
            assert_eq!(log.fence().unwrap(), 1);
            log.commit_step(&conformance::sample_commit(0, 2)).unwrap();
        }
        let log = EmbeddedLog::open(db::open(dir.path()).unwrap()).unwrap();
        assert_eq!(log.watermarks("in", 0).unwrap(), (2, 5));
        assert_eq!(log.last_step().unwrap(), Some(0));
        assert!(matches!(
            log.commit_step(&conformance::sample_commit(0, 2)),
            Err(Error::StepExists { step: 0 })
        ));
    }

    #[test]
    fn a_second_open_of_the_same_directory_is_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let _db = db::open(dir.path()).unwrap();
        match db::open(dir.path()) {
            Err(Error::Locked { dir: d, holder }) => {
                assert_eq!(d, dir.path());
                assert!(
                    holder.contains(&format!("pid {}", std::process::id())),
                    "{holder}"
                );
            }
            Err(other) => panic!("expected Locked, got {other}"),
            Ok(_) => panic!("a second open must fail"),
        }
    }
}
