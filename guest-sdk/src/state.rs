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
///
/// One pass: each key is encoded once, for its shard and into the piece
/// (an entry's encoding is its key's followed by its value's), and the
/// value straight after it; each piece then gets its length in front.
pub fn split<'a, K: Serialize + 'a, V: Serialize + 'a>(
    entries: impl IntoIterator<Item = (&'a K, &'a V)>,
    only: Option<&Shards>,
) -> Result<BTreeMap<u32, Vec<u8>>> {
    // Per shard: how many entries, and their encodings back to back.
    let mut shards: Vec<(usize, Vec<u8>)> = (0..SHARDS).map(|_| (0, Vec::new())).collect();
    let mut key = Vec::new();
    for (k, v) in entries {
        key.clear();
        codec::write_bytes(&mut key, k)?;
        let shard = shard_of(&key);
        if only.is_none_or(|o| o.contains(shard)) {
            let (n, piece) = &mut shards[shard as usize];
            *n += 1;
            piece.extend_from_slice(&key);
            codec::write_bytes(piece, v)?;
        }
    }
    let mut pieces = BTreeMap::new();
    for (shard, (n, entries)) in shards.into_iter().enumerate() {
        if n == 0 {
            continue;
        }
        // A sequence's encoding: its length (a varint), then its elements.
        let mut piece = codec::to_bytes(&n)?;
        piece.extend_from_slice(&entries);
        pieces.insert(shard as u32, piece);
    }
    Ok(pieces)
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
