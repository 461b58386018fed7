//! Storage: every durable byte of a pipeline goes through these traits.
//!
//! - [`LogBackend`]: input logs, output logs and step records; the atomic
//!   step commit. Embedded RocksDB ([`EmbeddedLog`]) by default.
//! - [`CheckpointStore`]: all workers' state at a step boundary, committed at
//!   once. RocksDB ([`RocksCheckpointStore`]).
//! - [`Guarded`]: the host's enforcement of invariants I1–I3 over any pair
//!   of backends; the runtime only talks to storage through it.
//! - [`conformance`]: the shared test suites every backend must pass.
//! - [`faults`]: wrappers that inject errors and delays into any backend.
//! - [`verify`]: the offline audit behind `sluice verify`.

pub mod checkpoint;
pub mod conformance;
pub mod db;
pub mod faults;
pub mod invariants;
pub mod log;
pub mod meta;
pub mod verify;

pub use checkpoint::{Checkpoint, CheckpointStore, RocksCheckpointStore};
pub use invariants::Guarded;
pub use log::{AppendBatch, EmbeddedLog, IngestMark, LogBackend, input_key, output_key};
#[cfg(feature = "kafka")]
pub use log::{KafkaConfig, KafkaLog};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One Z-set delta at a port: a JSON value and its weight change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The record, as JSON bytes (stored as one byte string, not byte by
    /// byte; postcard's wire format is the same either way).
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// +1 insert, −1 delete, or a multiple.
    pub weight: i64,
}

/// One partition of one input log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PartitionId {
    /// Index of the input port (in the circuit's input order).
    pub input: u32,
    /// Partition within that input's log.
    pub partition: u32,
}

/// For one worker: for every input partition it reads, the offset one past
/// the last event consumed.
pub type Frontier = BTreeMap<PartitionId, u64>;

/// The durable record of a step: its number, every worker's frontier after
/// it (the division of input into steps), the time the guests saw, the epoch
/// of the host that committed it, and the hash of every worker's output,
/// against which a replay is checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Step number, from 0.
    pub step: u64,
    /// The fencing epoch of the host that committed the step: a commit from
    /// an epoch older than the log's current one is refused.
    pub epoch: u64,
    /// Wall-clock time of the step (ms since the epoch) as the guests' WASI
    /// clocks report it, in this step and in every replay of it (I4).
    pub time_ms: u64,
    /// Frontier of each worker after this step, indexed by worker.
    pub frontiers: Vec<Frontier>,
    /// Hash of each worker's output in this step, indexed by worker.
    pub output_hashes: Vec<u128>,
}

/// One worker's output on one output port in one step: the unit an output log
/// holds exactly one of per (step, worker).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputEntry {
    /// The step that produced it.
    pub step: u64,
    /// The worker that produced it.
    pub worker: u32,
    /// The input frontier this output covers (the worker's frontier after
    /// the step).
    pub frontier: Frontier,
    /// The deltas, consolidated by the circuit.
    pub events: Vec<Event>,
}

/// Everything one step commits, atomically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepCommit {
    /// The step record (division and hashes).
    pub record: StepRecord,
    /// Per output log name, one entry per worker (indexed by worker).
    pub outputs: Vec<(String, Vec<OutputEntry>)>,
}

/// Where an output event sits in its output log: entries are ordered by
/// step, then worker, and events by their index within the entry. A consumer
/// remembers the last position it processed and resumes after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OutputPosition {
    /// The step that produced the event.
    pub step: u64,
    /// The worker that produced it.
    pub worker: u32,
    /// Its index within that worker's entry for the step.
    pub index: u32,
}

/// An output event with its position and the input frontier its entry
/// covers (every input event below the frontier has had its effect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PositionedEvent {
    /// Where it sits.
    pub position: OutputPosition,
    /// The frontier of its entry.
    pub frontier: Frontier,
    /// The event.
    pub event: Event,
}

/// Reads up to `limit` events of output log `output` after position `after`
/// (from the start if `None`).
pub fn read_output(
    log: &dyn LogBackend,
    output: &str,
    after: Option<OutputPosition>,
    limit: usize,
) -> crate::Result<Vec<PositionedEvent>> {
    let mut out = Vec::new();
    log.scan_output(output, after.map_or(0, |a| a.step), &mut |entry| {
        for (i, event) in entry.events.into_iter().enumerate() {
            let position = OutputPosition {
                step: entry.step,
                worker: entry.worker,
                index: i as u32,
            };
            if out.len() < limit && after.is_none_or(|a| position > a) {
                out.push(PositionedEvent {
                    position,
                    frontier: entry.frontier.clone(),
                    event,
                });
            }
        }
        Ok(())
    })?;
    Ok(out)
}

/// Validates a log or port name: 1–64 characters of `[A-Za-z0-9_.-]`, not
/// starting with a dot. Names reach storage keys and file names, so nothing
/// else is accepted.
pub fn validate_name(kind: &str, name: &str) -> crate::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(crate::Error::Config(format!(
            "invalid {kind} name {name:?}: use 1-64 characters of A-Z a-z 0-9 _ - . (not starting with .)"
        )))
    }
}
