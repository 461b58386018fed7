//! The exchange: how keyed operators re-shard their input across workers.
//!
//! Inside a component the host implements it (`exchange.shuffle` in the WIT
//! world); natively, [`LocalExchange`] stands in for a single worker.

pub use crate::batch::KeyedBatch;
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
    /// keyed operator per step. Events travel packed ([`KeyedBatch`]), as
    /// they cross the WIT boundary: an event costs no allocation of its own.
    fn shuffle(&mut self, channel: u32, events: KeyedBatch) -> Result<KeyedBatch>;

    /// The number of workers W. With one worker every event stays where it
    /// is, and keyed operators skip the exchange altogether.
    fn workers(&self) -> u32;
}

/// The exchange of a single-worker circuit: every event stays here.
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalExchange;

impl Exchange for LocalExchange {
    fn shuffle(&mut self, _channel: u32, events: KeyedBatch) -> Result<KeyedBatch> {
        Ok(events)
    }

    fn workers(&self) -> u32 {
        1
    }
}

/// Sends keyed pairs through the exchange (key and value postcard-encoded,
/// straight into the batch) and decodes what this worker receives. With one
/// worker nothing moves, so nothing is encoded or sent: the pairs come back
/// as they are, in order, exactly what the exchange would have returned.
pub(crate) fn shuffle_keyed<K: crate::Data, V: crate::Data>(
    exchange: &mut dyn Exchange,
    channel: u32,
    pairs: impl IntoIterator<Item = ((K, V), Weight)>,
) -> Result<Vec<((K, V), Weight)>> {
    use crate::{Error, codec};
    if exchange.workers() == 1 {
        return Ok(pairs.into_iter().filter(|(_, w)| *w != 0).collect());
    }
    let mut send = KeyedBatch::new();
    for ((k, v), weight) in pairs {
        if weight != 0 {
            send.push_with(
                |out| codec::write_bytes(out, &k),
                weight,
                |out| codec::write_bytes(out, &v),
            )?;
        }
    }
    let received = exchange.shuffle(channel, send)?;
    received
        .iter()
        .map(|(key, value, weight)| {
            let k = codec::from_bytes(key)
                .map_err(|m| Error::Failed(format!("exchange: undecodable key: {m}")))?;
            let v = codec::from_bytes(value)
                .map_err(|m| Error::Failed(format!("exchange: undecodable value: {m}")))?;
            Ok(((k, v), weight))
        })
        .collect()
}
