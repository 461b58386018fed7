//! The [`LogBackend`] trait: a pipeline's logs and the atomic step commit.
//!
//! A backend holds a pipeline's input logs (partitioned, append-only), its
//! output logs (one entry per step per worker) and its step records, and
//! commits a step atomically. It does not know about checkpoints: the trim
//! rule (I2) is enforced one level up, in [`Guarded`](crate::Guarded).
//! Backends live in their own crates (`sluice-embedded`, `sluice-kafka`) and
//! pass [`conformance::log_backend`](crate::conformance::log_backend).

use crate::error::Result;
use sluice_core::{Event, OutputEntry, StepCommit, StepRecord};
use std::ops::Range;

/// Events to append to input logs, made durable together.
#[derive(Debug, Clone, Default)]
pub struct AppendBatch {
    /// `(input log, partition, events)`; events keep their order.
    pub appends: Vec<(String, u32, Vec<Event>)>,
    /// Stored atomically with the events, so an interrupted ingest resumes
    /// exactly where the durable part ends.
    pub mark: Option<IngestMark>,
    /// The producer and its sequence number: an append whose sequence
    /// number is not above the producer's last one is a retry, acknowledged
    /// without appending anything.
    pub producer: Option<ProducerSeq>,
}

/// A producer's identity and the sequence number of one of its appends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerSeq {
    /// The producer's id, chosen by the producer.
    pub id: String,
    /// Increases with every append of the producer.
    pub seq: u64,
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
    /// they got. Returns only once the events (and the mark) are durable.
    ///
    /// With a producer sequence number not above the producer's last, nothing
    /// is appended: a retry of the producer's last append gets that append's
    /// offsets again; an older one gets empty ranges.
    fn append(&self, batch: AppendBatch) -> Result<Vec<Range<u64>>>;

    /// The last mark stored for `source`, if any.
    fn ingest_mark(&self, source: &str) -> Result<Option<Vec<u8>>>;

    /// `(low, high)`: the first offset still stored and one past the last
    /// offset appended.
    fn watermarks(&self, input: &str, partition: u32) -> Result<(u64, u64)>;

    /// Reads offsets `range` of one partition. Fails with
    /// [`StorageError::Trimmed`](crate::StorageError::Trimmed) if part of it was trimmed;
    /// returns fewer events only if the range extends past the high
    /// watermark.
    fn read(&self, input: &str, partition: u32, range: Range<u64>) -> Result<Vec<Event>>;

    /// Starts a new fencing epoch and returns it: from now on, commits whose
    /// record carries an older epoch fail with
    /// [`StorageError::Fenced`](crate::StorageError::Fenced). A host calls this once when
    /// it takes over a pipeline, so a zombie predecessor can no longer
    /// commit. Durable before it returns.
    fn fence(&self) -> Result<u64>;

    /// Commits a step: every worker's output entries and the step record,
    /// atomically and durably. Fails with
    /// [`StorageError::StepExists`](crate::StorageError::StepExists) if the step is already
    /// committed (I1), [`StorageError::StepGap`](crate::StorageError::StepGap) if it does
    /// not follow the last committed step, and
    /// [`StorageError::Fenced`](crate::StorageError::Fenced) if the record's epoch is not
    /// the current one. The epoch check and the write are one atomic action.
    fn commit_step(&self, commit: &StepCommit) -> Result<()>;

    /// The last committed step, if any.
    fn last_step(&self) -> Result<Option<u64>>;

    /// The record of a committed step (the seed's `get_frontier`).
    fn step_record(&self, step: u64) -> Result<Option<StepRecord>>;

    /// Calls `f` with every entry of output log `output`, in (step, worker)
    /// order, from step `from_step` on.
    fn scan_output(
        &self,
        output: &str,
        from_step: u64,
        f: &mut dyn FnMut(OutputEntry) -> Result<()>,
    ) -> Result<()>;

    /// Discards offsets below `below` of one partition. Idempotent; never
    /// moves the low watermark down. Callers must go through
    /// [`Guarded::trim`](crate::Guarded::trim), which checks I2.
    fn trim(&self, input: &str, partition: u32, below: u64) -> Result<()>;
}
