//! The exchange: how keyed operators re-shard their input across workers.
//!
//! Inside a component the host implements it (`exchange.shuffle` in the WIT
//! world); natively, [`LocalExchange`] stands in for a single worker.

use crate::error::Result;
use crate::zset::Weight;

/// An event as it crosses the exchange: sharding key, encoded value, weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEvent {
    /// The bytes the host hashes to choose the receiving worker.
    pub key: Vec<u8>,
    /// The encoded payload.
    pub value: Vec<u8>,
    /// The weight change.
    pub weight: Weight,
}

/// Moves events to the worker that owns their key.
pub trait Exchange {
    /// Sends `events` on `channel` and returns the events this worker owns,
    /// from all workers, in worker order. Every worker calls it once per
    /// keyed operator per step.
    fn shuffle(&mut self, channel: u32, events: Vec<RawEvent>) -> Result<Vec<RawEvent>>;
}

/// The exchange of a single-worker circuit: every event stays here.
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalExchange;

impl Exchange for LocalExchange {
    fn shuffle(&mut self, _channel: u32, events: Vec<RawEvent>) -> Result<Vec<RawEvent>> {
        Ok(events)
    }
}
