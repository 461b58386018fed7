//! Input records as a step reads them ([`LogBackend::read_records`], or
//! lent one by one by [`LogBackend::each_record`]): an event, or a record
//! that is not one ([`BadRecord`]) with its position and why — which the
//! step then fails on or dead-letters, by its input's policy.
//!
//! [`LogBackend::read_records`]: crate::LogBackend::read_records
//! [`LogBackend::each_record`]: crate::LogBackend::each_record

use crate::error::StorageError;
use sluice_core::Event;

/// A record of an input log that is not an event: a Kafka record whose
/// value is not JSON or whose `sluice-weight` header is malformed, or a
/// line an ingest kept as not an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRecord {
    /// Its offset in its partition.
    pub offset: u64,
    /// Where it is, as its log names it: `topic/partition@offset` (Kafka),
    /// `input/partition@offset` (embedded).
    pub position: String,
    /// Why it is not an event.
    pub error: String,
    /// Its value, as it is (`None`: it has none).
    pub value: Option<Vec<u8>>,
}

impl BadRecord {
    /// The error of a read that must return events only.
    pub fn into_error(self) -> StorageError {
        StorageError::BadRecord {
            position: self.position,
            message: self.error,
        }
    }
}

/// One record of an input log, as a step reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputRecord {
    /// An event.
    Event(Event),
    /// A record that is not an event.
    Bad(BadRecord),
}

/// One record of an input log lent to a reader
/// ([`LogBackend::each_record`](crate::LogBackend::each_record)): an
/// event's value borrowed from the log, or a record that is not an event.
#[derive(Debug, PartialEq, Eq)]
pub enum RecordRef<'a> {
    /// An event: its value (JSON bytes) and weight.
    Event {
        /// The value, as stored.
        value: &'a [u8],
        /// Its weight, never 0.
        weight: i64,
    },
    /// A record that is not an event.
    Bad(BadRecord),
}

impl RecordRef<'_> {
    /// The record, owned (its value copied).
    pub fn into_record(self) -> InputRecord {
        match self {
            RecordRef::Event { value, weight } => InputRecord::Event(Event {
                value: value.to_vec(),
                weight,
            }),
            RecordRef::Bad(bad) => InputRecord::Bad(bad),
        }
    }
}

/// The events of `records`, failing on the first that is not one (what
/// [`LogBackend::read`](crate::LogBackend::read) returns).
pub fn events_only(records: Vec<InputRecord>) -> Result<Vec<Event>, StorageError> {
    records
        .into_iter()
        .map(|r| match r {
            InputRecord::Event(e) => Ok(e),
            InputRecord::Bad(b) => Err(b.into_error()),
        })
        .collect()
}
