//! Events packed the way they cross the WIT boundary: one buffer of values
//! back to back, where each ends, and the weights.
//!
//! A step's input arrives in this form and its output leaves in it, so the
//! SDK decodes records from slices of the host's buffer and encodes results
//! straight into the buffer it hands back: no per-event allocation on either
//! side, and no second copy of a step's events in the instance's memory
//! (which never shrinks once grown).

use crate::error::{Error, Result};
use crate::exchange::RawEvent;
use crate::zset::Weight;

/// Checks the ends of packed slices: `count` of them, ascending, none past
/// `bytes`.
fn check_ends(what: &str, ends: &[u32], count: usize, bytes: usize) -> Result<()> {
    let ascending = ends.windows(2).all(|w| w[0] <= w[1]);
    let within = ends.last().is_none_or(|e| *e as usize <= bytes);
    if ends.len() != count || !ascending || !within {
        return Err(Error::Protocol(format!(
            "malformed batch: {} ends of {what} for {count} events, {bytes} bytes of {what}",
            ends.len(),
        )));
    }
    Ok(())
}

/// A port's events in one step, packed: event `i`'s value is
/// `values[ends[i-1]..ends[i]]` (from 0 for the first), its weight
/// `weights[i]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventBatch {
    values: Vec<u8>,
    ends: Vec<u32>,
    weights: Vec<Weight>,
}

impl EventBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// A batch from its parts, checked: one end per weight, ascending,
    /// none past the values.
    pub fn from_parts(values: Vec<u8>, ends: Vec<u32>, weights: Vec<Weight>) -> Result<Self> {
        check_ends("values", &ends, weights.len(), values.len())?;
        Ok(EventBatch {
            values,
            ends,
            weights,
        })
    }

    /// The parts: values, ends, weights.
    pub fn into_parts(self) -> (Vec<u8>, Vec<u32>, Vec<Weight>) {
        (self.values, self.ends, self.weights)
    }

    /// The number of events.
    pub fn len(&self) -> usize {
        self.weights.len()
    }

    /// Whether the batch has no event.
    pub fn is_empty(&self) -> bool {
        self.weights.is_empty()
    }

    /// Appends an event.
    pub fn push(&mut self, value: &[u8], weight: Weight) -> Result<()> {
        self.push_with(weight, |values| {
            values.extend_from_slice(value);
            Ok(())
        })
    }

    /// Appends an event whose value `encode` writes at the end of the
    /// values buffer (and nowhere else).
    pub fn push_with(
        &mut self,
        weight: Weight,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<()>,
    ) -> Result<()> {
        let start = self.values.len();
        if let Err(e) = encode(&mut self.values) {
            self.values.truncate(start);
            return Err(e);
        }
        let end = u32::try_from(self.values.len()).map_err(|_| {
            self.values.truncate(start);
            Error::Failed("a step's output on one port passed 4 GiB".into())
        })?;
        self.ends.push(end);
        self.weights.push(weight);
        Ok(())
    }

    /// The events in order, as (value, weight).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&[u8], Weight)> + '_ {
        let mut start = 0;
        self.ends.iter().zip(&self.weights).map(move |(&end, &w)| {
            let value = &self.values[start..end as usize];
            start = end as usize;
            (value, w)
        })
    }

    /// A batch of `events`' values and weights (their keys are dropped).
    pub fn from_events(events: &[RawEvent]) -> Result<Self> {
        let mut batch = EventBatch::new();
        for e in events {
            batch.push(&e.value, e.weight)?;
        }
        Ok(batch)
    }

    /// The events, each value copied out, with no key.
    pub fn to_events(&self) -> Vec<RawEvent> {
        self.iter()
            .map(|(value, weight)| RawEvent {
                key: Vec::new(),
                value: value.to_vec(),
                weight,
            })
            .collect()
    }
}

/// Keyed events packed the way they cross the exchange: each event's key
/// (the bytes the host hashes to route it), value and weight.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyedBatch {
    keys: Vec<u8>,
    key_ends: Vec<u32>,
    events: EventBatch,
}

impl KeyedBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// A batch from its parts, checked like [`EventBatch::from_parts`]:
    /// keys, where each key ends, values, where each value ends, weights.
    pub fn from_parts(
        keys: Vec<u8>,
        key_ends: Vec<u32>,
        values: Vec<u8>,
        ends: Vec<u32>,
        weights: Vec<Weight>,
    ) -> Result<Self> {
        check_ends("keys", &key_ends, weights.len(), keys.len())?;
        Ok(KeyedBatch {
            keys,
            key_ends,
            events: EventBatch::from_parts(values, ends, weights)?,
        })
    }

    /// The parts: keys, key ends, values, value ends, weights.
    #[allow(clippy::type_complexity)]
    pub fn into_parts(self) -> (Vec<u8>, Vec<u32>, Vec<u8>, Vec<u32>, Vec<Weight>) {
        let (values, ends, weights) = self.events.into_parts();
        (self.keys, self.key_ends, values, ends, weights)
    }

    /// The number of events.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether the batch has no event.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Appends an event.
    pub fn push(&mut self, key: &[u8], value: &[u8], weight: Weight) -> Result<()> {
        self.push_with(
            |k| {
                k.extend_from_slice(key);
                Ok(())
            },
            weight,
            |v| {
                v.extend_from_slice(value);
                Ok(())
            },
        )
    }

    /// Appends an event whose key `key` and value `value` write at the end
    /// of the keys' and the values' buffers (and nowhere else).
    pub fn push_with(
        &mut self,
        key: impl FnOnce(&mut Vec<u8>) -> Result<()>,
        weight: Weight,
        value: impl FnOnce(&mut Vec<u8>) -> Result<()>,
    ) -> Result<()> {
        let start = self.keys.len();
        let end = key(&mut self.keys).and_then(|()| {
            u32::try_from(self.keys.len())
                .map_err(|_| Error::Failed("a step's keys on one exchange passed 4 GiB".into()))
        });
        let end = match end {
            Ok(end) => end,
            Err(e) => {
                self.keys.truncate(start);
                return Err(e);
            }
        };
        if let Err(e) = self.events.push_with(weight, value) {
            self.keys.truncate(start);
            return Err(e);
        }
        self.key_ends.push(end);
        Ok(())
    }

    /// Appends every event of `other`, in order.
    pub fn extend_from(&mut self, other: &KeyedBatch) -> Result<()> {
        for (key, value, weight) in other.iter() {
            self.push(key, value, weight)?;
        }
        Ok(())
    }

    /// The events in order, as (key, value, weight).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&[u8], &[u8], Weight)> + '_ {
        let mut start = 0;
        self.key_ends
            .iter()
            .zip(self.events.iter())
            .map(move |(&end, (value, weight))| {
                let key = &self.keys[start..end as usize];
                start = end as usize;
                (key, value, weight)
            })
    }

    /// A batch of `events`.
    pub fn from_events(events: &[RawEvent]) -> Result<Self> {
        let mut batch = KeyedBatch::new();
        for e in events {
            batch.push(&e.key, &e.value, e.weight)?;
        }
        Ok(batch)
    }

    /// The events, each key and value copied out.
    pub fn to_events(&self) -> Vec<RawEvent> {
        self.iter()
            .map(|(key, value, weight)| RawEvent {
                key: key.to_vec(),
                value: value.to_vec(),
                weight,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_events_and_checks_parts() {
        let events: Vec<RawEvent> = [(&b"\"a\""[..], 1), (b"", -2), (b"[1,2]", 3)]
            .iter()
            .map(|(v, w)| RawEvent {
                key: Vec::new(),
                value: v.to_vec(),
                weight: *w,
            })
            .collect();
        let batch = EventBatch::from_events(&events).unwrap();
        assert_eq!(batch.len(), 3);
        assert_eq!(batch.to_events(), events);
        let (values, ends, weights) = batch.clone().into_parts();
        assert_eq!(
            EventBatch::from_parts(values.clone(), ends.clone(), weights.clone()).unwrap(),
            batch
        );
        assert!(EventBatch::from_parts(values.clone(), vec![3, 2, 8], weights.clone()).is_err());
        assert!(EventBatch::from_parts(values.clone(), vec![3, 3, 99], weights.clone()).is_err());
        assert!(EventBatch::from_parts(values, ends, vec![1]).is_err());
    }

    #[test]
    fn a_failed_encoding_leaves_nothing_behind() {
        let mut batch = EventBatch::new();
        batch.push(b"x", 1).unwrap();
        let failed = batch.push_with(1, |v| {
            v.extend_from_slice(b"partial");
            Err(Error::Failed("no".into()))
        });
        assert!(failed.is_err());
        assert_eq!(batch.to_events().len(), 1);
        assert_eq!(batch.iter().next(), Some((&b"x"[..], 1)));

        let mut keyed = KeyedBatch::new();
        keyed.push(b"k", b"v", 2).unwrap();
        let failed = keyed.push_with(
            |k| {
                k.extend_from_slice(b"kk");
                Ok(())
            },
            1,
            |_| Err(Error::Failed("no".into())),
        );
        assert!(failed.is_err());
        assert_eq!(keyed.len(), 1);
        assert_eq!(keyed.iter().next(), Some((&b"k"[..], &b"v"[..], 2)));
    }

    #[test]
    fn keyed_batches_round_trip_and_check_parts() {
        let events: Vec<RawEvent> = [(&b"a"[..], &b"1"[..], 1), (b"", b"", -1), (b"bc", b"22", 5)]
            .iter()
            .map(|(k, v, w)| RawEvent {
                key: k.to_vec(),
                value: v.to_vec(),
                weight: *w,
            })
            .collect();
        let batch = KeyedBatch::from_events(&events).unwrap();
        assert_eq!(batch.to_events(), events);
        let mut twice = batch.clone();
        twice.extend_from(&batch).unwrap();
        assert_eq!(twice.to_events(), [events.clone(), events].concat());
        let (keys, key_ends, values, ends, weights) = batch.clone().into_parts();
        assert_eq!(
            KeyedBatch::from_parts(
                keys.clone(),
                key_ends.clone(),
                values.clone(),
                ends.clone(),
                weights.clone()
            )
            .unwrap(),
            batch
        );
        assert!(
            KeyedBatch::from_parts(
                keys.clone(),
                vec![1, 0, 3],
                values.clone(),
                ends.clone(),
                weights.clone()
            )
            .is_err()
        );
        assert!(KeyedBatch::from_parts(keys, key_ends, values, ends, vec![1, 1]).is_err());
    }
}
