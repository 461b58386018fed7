//! Packed batches: a batch's (or keyed batch's) values back to back in one
//! buffer, with where each ends — how events cross the WIT boundary and the
//! wire. Packing and unpacking, checked (a guest's ends may be malformed).

use crate::bindings::{Batch, KeyedEvents};

/// Packs events into one port's batch: the values back to back, where each
/// ends, the weights.
pub(crate) fn pack_batch(port: u32, events: &[sluice_core::Event]) -> Batch {
    let mut values = Vec::with_capacity(events.iter().map(|e| e.value.len()).sum());
    let mut ends = Vec::with_capacity(events.len());
    let mut weights = Vec::with_capacity(events.len());
    for e in events {
        values.extend_from_slice(&e.value);
        ends.push(values.len() as u32);
        weights.push(e.weight);
    }
    Batch {
        port,
        values,
        ends,
        weights,
    }
}

/// The `count` slices of a packed buffer (`ends[i]`: where slice `i`
/// ends), or `None` if the packing is malformed: not `count` ends, or ends
/// that descend or overrun the bytes.
pub(crate) fn slices<'a>(bytes: &'a [u8], ends: &[u32], count: usize) -> Option<Vec<&'a [u8]>> {
    if ends.len() != count {
        return None;
    }
    let mut out = Vec::with_capacity(count);
    let mut start = 0usize;
    for &end in ends {
        let end = end as usize;
        if end < start || end > bytes.len() {
            return None;
        }
        out.push(&bytes[start..end]);
        start = end;
    }
    Some(out)
}

/// No events.
pub(crate) fn empty() -> KeyedEvents {
    KeyedEvents {
        keys: Vec::new(),
        key_ends: Vec::new(),
        values: Vec::new(),
        ends: Vec::new(),
        weights: Vec::new(),
    }
}

/// One event of a [`KeyedEvents`]: key, value, weight.
pub(crate) type Unpacked<'a> = (&'a [u8], &'a [u8], i64);

/// The `(key, value, weight)` of each event of `events`, or `None` if the
/// packing is malformed (lengths differ, ends descend or overrun).
pub(crate) fn unpack(events: &KeyedEvents) -> Option<Vec<Unpacked<'_>>> {
    let n = events.weights.len();
    let keys = slices(&events.keys, &events.key_ends, n)?;
    let values = slices(&events.values, &events.ends, n)?;
    Some(
        keys.into_iter()
            .zip(values)
            .zip(&events.weights)
            .map(|((k, v), w)| (k, v, *w))
            .collect(),
    )
}

/// Appends one event to `to`.
pub(crate) fn push(to: &mut KeyedEvents, key: &[u8], value: &[u8], weight: i64) {
    to.keys.extend_from_slice(key);
    to.key_ends.push(to.keys.len() as u32);
    to.values.extend_from_slice(value);
    to.ends.push(to.values.len() as u32);
    to.weights.push(weight);
}

/// Appends every event of `from` to `to`.
pub(crate) fn append(to: &mut KeyedEvents, from: KeyedEvents) {
    let (k, v) = (to.keys.len() as u32, to.values.len() as u32);
    to.keys.extend_from_slice(&from.keys);
    to.key_ends.extend(from.key_ends.iter().map(|e| e + k));
    to.values.extend_from_slice(&from.values);
    to.ends.extend(from.ends.iter().map(|e| e + v));
    to.weights.extend_from_slice(&from.weights);
}
