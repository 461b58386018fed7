//! State split by shard: how stateful operators take part in checkpoints
//! and layout changes.
//!
//! Keyed state lies in the shard of its key — the shard the host's exchange
//! routes the key to ([`sluice_shard::shard_of`] of the key's encoding) — so
//! that the worker owning a shard holds every key of it. State that never
//! crosses the exchange (`integrate`, `differentiate`) lies in the shard of
//! its element's encoding; it is linear, so pieces of one shard from several
//! workers simply add up wherever they land.
//!
//! A piece of one operator is the encoding of its entries in that shard,
//! the same encoding the whole state had before states were split (a map is
//! written as its sorted pairs), so a snapshot of the earlier format
//! restores as one piece holding everything.

use crate::codec;
use crate::error::Result;
use serde::Serialize;
use std::collections::BTreeMap;

pub use sluice_shard::{SHARDS, shard_of};

/// The shard id of a whole instance's state written before states were
/// split by shard (format 1), restored as is.
pub const WHOLE: u32 = u32::MAX;

/// A set of shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shards([u64; (SHARDS / 64) as usize]);

impl Shards {
    /// No shard.
    pub fn none() -> Self {
        Shards([0; (SHARDS / 64) as usize])
    }

    /// Every shard.
    pub fn all() -> Self {
        Shards([u64::MAX; (SHARDS / 64) as usize])
    }

    /// Adds `shard` (ignored if it is not below [`SHARDS`]).
    pub fn insert(&mut self, shard: u32) {
        if shard < SHARDS {
            self.0[(shard / 64) as usize] |= 1 << (shard % 64);
        }
    }

    /// Whether `shard` is in the set.
    pub fn contains(&self, shard: u32) -> bool {
        shard < SHARDS && self.0[(shard / 64) as usize] & (1 << (shard % 64)) != 0
    }

    /// Adds every shard of `other`.
    pub fn union(&mut self, other: &Shards) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a |= b;
        }
    }

    /// The shards in the set, in order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..SHARDS).filter(|s| self.contains(*s))
    }
}

impl FromIterator<u32> for Shards {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut s = Shards::none();
        for shard in iter {
            s.insert(shard);
        }
        s
    }
}

/// Collects a value's postcard encoding on the stack when it is short (a
/// typical key), on the heap past 64 bytes: computing a shard does not
/// allocate for most keys.
struct KeyBytes {
    inline: [u8; 64],
    len: usize,
    spill: Vec<u8>,
}

impl postcard::ser_flavors::Flavor for KeyBytes {
    type Output = KeyBytes;

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        if self.spill.is_empty() && self.len + data.len() <= self.inline.len() {
            self.inline[self.len..self.len + data.len()].copy_from_slice(data);
            self.len += data.len();
        } else {
            if self.spill.is_empty() {
                self.spill.extend_from_slice(&self.inline[..self.len]);
            }
            self.spill.extend_from_slice(data);
        }
        Ok(())
    }

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.try_extend(&[data])
    }

    fn finalize(self) -> postcard::Result<KeyBytes> {
        Ok(self)
    }
}

/// The shard of a key (or element): [`shard_of`] its encoding, the bytes
/// the exchange routes it by.
pub fn shard_of_key<K: Serialize + ?Sized>(key: &K) -> Result<u32> {
    let bytes = postcard::serialize_with_flavor(
        key,
        KeyBytes {
            inline: [0; 64],
            len: 0,
            spill: Vec::new(),
        },
    )
    .map_err(|e| crate::Error::Failed(format!("encoding a key: {e}")))?;
    Ok(if bytes.spill.is_empty() {
        shard_of(&bytes.inline[..bytes.len])
    } else {
        shard_of(&bytes.spill)
    })
}

/// Splits entries by the shard of their key, keeping the shards in `only`
/// (all when `None`): per shard, the encoding of its entries in order — a
/// `Vec<(K, V)>`'s encoding, which restores read.
pub fn split<'a, K: Serialize + 'a, V: Serialize + 'a>(
    entries: impl IntoIterator<Item = (&'a K, &'a V)>,
    only: Option<&Shards>,
) -> Result<BTreeMap<u32, Vec<u8>>> {
    let mut pieces = BTreeMap::new();
    for (shard, split) in split_entries(entries, only)? {
        let mut piece = Vec::with_capacity(split.encoded_len()?);
        split.write(&mut piece)?;
        pieces.insert(shard, piece);
    }
    Ok(pieces)
}

/// One shard's entries, as [`split_entries`] gathers them: how many, and
/// their encodings back to back.
#[derive(Default)]
pub(crate) struct Split {
    count: usize,
    entries: Vec<u8>,
}

impl Split {
    /// The length of the entries' encoding as a sequence.
    pub(crate) fn encoded_len(&self) -> Result<usize> {
        Ok(varint_len(self.count)? + self.entries.len())
    }

    /// Appends the entries' encoding as a sequence (a `Vec<(K, V)>`'s):
    /// their number (a varint), then the entries.
    pub(crate) fn write(&self, out: &mut Vec<u8>) -> Result<()> {
        codec::write_bytes(out, &self.count)?;
        out.extend_from_slice(&self.entries);
        Ok(())
    }
}

/// The length of `n`'s encoding (a varint).
pub(crate) fn varint_len(n: usize) -> Result<usize> {
    postcard::experimental::serialized_size(&n)
        .map_err(|e| crate::Error::Failed(format!("encoding state: {e}")))
}

/// The most [`split_entries`] sizes a shard's buffer for up front, in
/// bytes: a first entry far larger than the rest must not make every shard
/// take its size times the entries (an instance's memory counts against
/// its limit once grown); past it a buffer grows by doubling.
const RESERVE_AT_MOST: usize = 256 << 10;

/// Per shard holding entries (of `only`, or all), the entries there.
///
/// One pass: each key is encoded once, for its shard and into the piece
/// (an entry's encoding is its key's followed by its value's), and the
/// value straight after it. Keys hash evenly over the shards: a shard's
/// buffer is sized at its first entry for its share of the entries (as
/// the iterator tells their number), each of that entry's size, and a
/// quarter more (up to [`RESERVE_AT_MOST`]) — grown by doubling instead, the buffers of a large state
/// were copied about once more, into memory the instance then keeps (a
/// sixth of Nexmark q9's final snapshot went to growing them).
pub(crate) fn split_entries<'a, K: Serialize + 'a, V: Serialize + 'a>(
    entries: impl IntoIterator<Item = (&'a K, &'a V)>,
    only: Option<&Shards>,
) -> Result<BTreeMap<u32, Split>> {
    let entries = entries.into_iter();
    let share = entries.size_hint().0 / SHARDS as usize + 1;
    let mut shards: Vec<Split> = (0..SHARDS).map(|_| Split::default()).collect();
    let mut entry = Vec::new();
    for (k, v) in entries {
        entry.clear();
        codec::write_bytes(&mut entry, k)?;
        let shard = shard_of(&entry);
        if only.is_none_or(|o| o.contains(shard)) {
            let split = &mut shards[shard as usize];
            split.count += 1;
            if split.entries.capacity() == 0 {
                codec::write_bytes(&mut entry, v)?;
                let size = entry.len().saturating_mul(share);
                let size = size.saturating_add(size / 4).min(RESERVE_AT_MOST);
                split.entries.reserve_exact(size);
                split.entries.extend_from_slice(&entry);
            } else {
                split.entries.extend_from_slice(&entry);
                codec::write_bytes(&mut split.entries, v)?;
            }
        }
    }
    Ok((0..SHARDS)
        .zip(shards)
        .filter(|(_, s)| s.count > 0)
        .collect())
}

/// Removes the entries of a map whose key lies in `shards`.
pub fn forget<K: Serialize + Ord, V>(map: &mut BTreeMap<K, V>, shards: &Shards) {
    // A key that does not encode cannot have been stored by a step.
    map.retain(|k, _| shard_of_key(k).is_ok_and(|s| !shards.contains(s)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_is_by_the_key_encoding_s_shard() {
        let map: BTreeMap<String, i64> = (0..100).map(|i| (format!("k{i}"), i)).collect();
        let pieces = split(&map, None).unwrap();
        // A length is written as a sequence's length is, past one byte too.
        let long = codec::to_bytes(&vec![7u8; 300]).unwrap();
        assert_eq!(long[..2], codec::to_bytes(&300usize).unwrap()[..]);
        // Each piece is the encoding of its entries as a sequence of pairs,
        // the format restores read (and snapshots before one pass wrote).
        for (shard, bytes) in &pieces {
            let entries: Vec<(&String, &i64)> = map
                .iter()
                .filter(|(k, _)| shard_of(&codec::to_bytes(k).unwrap()) == *shard)
                .collect();
            assert_eq!(*bytes, codec::to_bytes(&entries).unwrap(), "shard {shard}");
        }
        let mut back: BTreeMap<String, i64> = BTreeMap::new();
        for (shard, bytes) in &pieces {
            let entries: Vec<(String, i64)> = codec::from_bytes(bytes).unwrap();
            for (k, v) in entries {
                assert_eq!(shard_of(&codec::to_bytes(&k).unwrap()), *shard);
                back.insert(k, v);
            }
        }
        assert_eq!(back, map);
        let one = *pieces.keys().next().unwrap();
        let only: Shards = [one].into_iter().collect();
        assert_eq!(split(&map, Some(&only)).unwrap().len(), 1);
        let in_one = codec::from_bytes::<Vec<(String, i64)>>(&pieces[&one])
            .unwrap()
            .len();
        let mut rest = map.clone();
        forget(&mut rest, &only);
        assert_eq!(rest.len(), map.len() - in_one);
    }
}
