//! Events and frontiers: what the logs hold and how far a worker has read.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One Z-set delta at a port: a JSON value and its weight change. The one
/// event type of the host's storage and ports (the WIT event, with its
/// sharding key, stays inside the runtime).
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
