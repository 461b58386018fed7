//! Fault injection: wrappers that make any [`LogBackend`] or
//! [`CheckpointStore`] fail or stall, for tests of what the runtime does
//! when storage misbehaves (the shape of object_store's `ThrottledStore`).
//!
//! A fault either happens *before* the operation (nothing was done) or
//! *after* it (it was done, but the caller is told it failed: the ambiguous
//! case a network store has). Faults are drawn from a seeded generator, so a
//! failing run can be repeated.

use crate::error::{Result, StorageError};
use crate::{
    AppendBatch, Carried, Checkpoint, CheckpointMeta, CheckpointStore, LogBackend, ProducerState,
    StatePiece,
};
use sluice_core::{Event, OutputEntry, StepCommit, StepRecord};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An injected fault: the source of the transient
/// [`StorageError::Backend`] a faulty wrapper returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("injected fault in {op} ({})", if *after { "after it was done" } else { "nothing was done" })]
pub struct Injected {
    /// The operation.
    pub op: &'static str,
    /// Whether the operation was done before the fault was reported.
    pub after: bool,
}

/// What to inject.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultConfig {
    /// Seed of the fault generator.
    pub seed: u64,
    /// Probability that a write (append, commit, fence, trim, checkpoint put)
    /// fails before doing anything.
    pub fail_before: f64,
    /// Probability that a write fails after it was done.
    pub fail_after: f64,
    /// Probability that a read fails.
    pub fail_read: f64,
    /// Delay added to every operation.
    pub delay: Duration,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            seed: 1,
            fail_before: 0.0,
            fail_after: 0.0,
            fail_read: 0.0,
            delay: Duration::ZERO,
        }
    }
}

/// The shared fault generator.
struct Faults {
    config: FaultConfig,
    state: Mutex<u64>,
    injected: AtomicU64,
    /// An outage: every operation fails before doing anything.
    down: AtomicBool,
}

impl Faults {
    fn new(config: FaultConfig) -> Self {
        Faults {
            config,
            state: Mutex::new(config.seed | 1),
            injected: AtomicU64::new(0),
            down: AtomicBool::new(false),
        }
    }

    fn chance(&self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        ((*s >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn inject(&self, op: &'static str, after: bool) -> StorageError {
        self.injected.fetch_add(1, Ordering::Relaxed);
        StorageError::backend("fault injection", op, true, Injected { op, after })
    }

    fn pause(&self) {
        if !self.config.delay.is_zero() {
            std::thread::sleep(self.config.delay);
        }
    }

    fn read<T>(&self, op: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.pause();
        if self.down.load(Ordering::Relaxed) || self.chance(self.config.fail_read) {
            return Err(self.inject(op, false));
        }
        f()
    }

    fn write<T>(&self, op: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.pause();
        if self.down.load(Ordering::Relaxed) || self.chance(self.config.fail_before) {
            return Err(self.inject(op, false));
        }
        let v = f()?;
        if self.chance(self.config.fail_after) {
            return Err(self.inject(op, true));
        }
        Ok(v)
    }
}

/// A [`LogBackend`] that injects faults into another.
pub struct FaultyLog {
    inner: Arc<dyn LogBackend>,
    faults: Faults,
}

impl FaultyLog {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn LogBackend>, config: FaultConfig) -> Self {
        FaultyLog {
            inner,
            faults: Faults::new(config),
        }
    }

    /// Starts (`true`) or ends an outage: while it lasts, every operation
    /// fails before doing anything, as a store or broker out of reach does.
    pub fn set_down(&self, down: bool) {
        self.faults.down.store(down, Ordering::Relaxed);
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> u64 {
        self.faults.injected.load(Ordering::Relaxed)
    }
}

impl LogBackend for FaultyLog {
    fn memory_bytes(&self) -> u64 {
        self.inner.memory_bytes()
    }

    fn reachable(&self) -> Result<()> {
        self.faults.read("reachable", || self.inner.reachable())
    }

    fn create_input(&self, input: &str, partitions: u32) -> Result<()> {
        self.faults.write("create_input", || {
            self.inner.create_input(input, partitions)
        })
    }
    fn partitions(&self, input: &str) -> Result<u32> {
        self.faults
            .read("partitions", || self.inner.partitions(input))
    }
    fn append(&self, batch: AppendBatch) -> Result<Vec<Range<u64>>> {
        self.faults.write("append", || self.inner.append(batch))
    }
    fn append_lazily(&self, batch: AppendBatch) -> Result<Vec<Range<u64>>> {
        self.faults
            .write("append", || self.inner.append_lazily(batch))
    }
    fn sync_appends(&self) -> Result<()> {
        self.faults
            .write("sync_appends", || self.inner.sync_appends())
    }
    fn producer(&self, id: &str, input: &str) -> Result<Option<ProducerState>> {
        self.faults
            .read("producer", || self.inner.producer(id, input))
    }
    fn ingest_mark(&self, source: &str) -> Result<Option<Vec<u8>>> {
        self.faults
            .read("ingest_mark", || self.inner.ingest_mark(source))
    }
    fn watermarks(&self, input: &str, partition: u32) -> Result<(u64, u64)> {
        self.faults
            .read("watermarks", || self.inner.watermarks(input, partition))
    }
    fn read(&self, input: &str, partition: u32, range: Range<u64>) -> Result<Vec<Event>> {
        self.faults
            .read("read", || self.inner.read(input, partition, range))
    }
    fn read_records(
        &self,
        input: &str,
        partition: u32,
        range: Range<u64>,
        exact: bool,
    ) -> Result<Vec<crate::InputRecord>> {
        self.faults.read("read", || {
            self.inner.read_records(input, partition, range, exact)
        })
    }
    fn each_record(
        &self,
        input: &str,
        partition: u32,
        range: Range<u64>,
        exact: bool,
        each: &mut dyn FnMut(crate::RecordRef<'_>) -> Result<()>,
    ) -> Result<u64> {
        self.faults.read("read", || {
            self.inner
                .each_record(input, partition, range, exact, &mut *each)
        })
    }
    fn fence(&self) -> Result<u64> {
        self.faults.write("fence", || self.inner.fence())
    }
    fn record_upgrades(&self, upgrades: &[u8]) -> Result<bool> {
        self.faults
            .write("record_upgrades", || self.inner.record_upgrades(upgrades))
    }
    fn upgrades(&self) -> Result<Option<Vec<u8>>> {
        self.faults.read("upgrades", || self.inner.upgrades())
    }
    fn commit_step(&self, commit: &StepCommit) -> Result<()> {
        self.faults
            .write("commit_step", || self.inner.commit_step(commit))
    }
    fn last_step(&self) -> Result<Option<u64>> {
        self.faults.read("last_step", || self.inner.last_step())
    }
    fn step_record(&self, step: u64) -> Result<Option<StepRecord>> {
        self.faults
            .read("step_record", || self.inner.step_record(step))
    }
    fn worker_commits(&self) -> bool {
        self.inner.worker_commits()
    }
    fn location(&self) -> Option<String> {
        self.inner.location()
    }
    fn take_worker(self: Arc<Self>, worker: u32) -> Result<Box<dyn crate::WorkerCommitter>> {
        self.faults
            .write("take_worker", || self.inner.clone().take_worker(worker))
    }
    fn output_hashes(&self, step: u64) -> Result<Option<Vec<u128>>> {
        self.faults
            .read("output_hashes", || self.inner.output_hashes(step))
    }
    fn await_complete(&self, step: u64) -> Result<Vec<u128>> {
        self.faults
            .read("await_complete", || self.inner.await_complete(step))
    }
    fn trim_output(&self, output: &str, below_step: u64) -> Result<()> {
        self.faults
            .write("trim_output", || self.inner.trim_output(output, below_step))
    }

    fn output_low(&self, output: &str) -> Result<u64> {
        self.faults
            .read("output_low", || self.inner.output_low(output))
    }

    fn scan_output(
        &self,
        output: &str,
        from_step: u64,
        f: &mut dyn FnMut(OutputEntry) -> Result<std::ops::ControlFlow<()>>,
    ) -> Result<()> {
        self.faults.read("scan_output", || {
            self.inner.scan_output(output, from_step, f)
        })
    }
    fn trim(&self, input: &str, partition: u32, below: u64) -> Result<()> {
        self.faults
            .write("trim", || self.inner.trim(input, partition, below))
    }
}

/// A [`CheckpointStore`] that injects faults into another.
pub struct FaultyCheckpoints {
    inner: Arc<dyn CheckpointStore>,
    faults: Faults,
}

impl FaultyCheckpoints {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn CheckpointStore>, config: FaultConfig) -> Self {
        FaultyCheckpoints {
            inner,
            faults: Faults::new(config),
        }
    }

    /// Starts (`true`) or ends an outage: while it lasts, every operation
    /// fails before doing anything, as a store or broker out of reach does.
    pub fn set_down(&self, down: bool) {
        self.faults.down.store(down, Ordering::Relaxed);
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> u64 {
        self.faults.injected.load(Ordering::Relaxed)
    }
}

impl CheckpointStore for FaultyCheckpoints {
    fn put(&self, checkpoint: &Checkpoint) -> Result<()> {
        self.faults
            .write("checkpoint put", || self.inner.put(checkpoint))
    }
    fn put_carrying(&self, checkpoint: &Checkpoint, carried: &Carried) -> Result<()> {
        self.faults.write("checkpoint put", || {
            self.inner.put_carrying(checkpoint, carried)
        })
    }
    fn latest_meta(&self) -> Result<Option<CheckpointMeta>> {
        self.faults
            .read("checkpoint latest", || self.inner.latest_meta())
    }
    fn pieces(&self, step: u64, shards: Option<&[u32]>) -> Result<Option<Vec<StatePiece>>> {
        self.faults
            .read("checkpoint pieces", || self.inner.pieces(step, shards))
    }
    fn meta(&self, step: u64) -> Result<Option<CheckpointMeta>> {
        self.faults
            .read("checkpoint meta", || self.inner.meta(step))
    }
    fn list(&self) -> Result<Vec<u64>> {
        self.faults.read("checkpoint list", || self.inner.list())
    }
}
