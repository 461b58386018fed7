//! # sluice-shard: which shard a key belongs to
//!
//! The key space of every pipeline is cut into [`SHARDS`] shards by one
//! hash of the key's bytes (xxh3, fixed seed: the same on every host, in
//! every guest, in every version). The host's exchange routes a keyed event
//! to the worker that owns its key's shard in the pipeline's layout; the
//! guest SDK keeps each keyed operator's state split by the same shards, so
//! a layout change moves whole shards of state and nothing else. Both sides
//! depend on this crate so they cannot disagree.
//!
//! ```
//! use sluice_shard::{SHARDS, shard_of};
//! let s = shard_of(b"some key");
//! assert!(s < SHARDS);
//! assert_eq!(s, shard_of(b"some key"));
//! ```

/// The number of shards of the key space. Fixed: changing it would move
/// every key of every pipeline.
pub const SHARDS: u32 = 1024;

/// The shard of a key (its encoded bytes, as the exchange sees them).
pub fn shard_of(key: &[u8]) -> u32 {
    shard_of_hash(hash(key))
}

/// The fixed 64-bit hash of a key's bytes that [`shard_of`] reduces. Code
/// that also needs a hash for its own index (the guest's keyed tables)
/// computes it once and derives the shard with [`shard_of_hash`].
pub fn hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// The shard of a key whose [`hash`] is `hash`.
pub fn shard_of_hash(hash: u64) -> u32 {
    (hash % SHARDS as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_fixed() {
        // Stored state is split by these values: they must never change.
        assert_eq!(shard_of(b""), 194);
        assert_eq!(
            shard_of(b"word"),
            (xxhash_rust::xxh3::xxh3_64(b"word") % 1024) as u32
        );
        assert_eq!(shard_of(b"word"), shard_of(b"word"));
        let spread: std::collections::BTreeSet<u32> =
            (0..10_000u32).map(|i| shard_of(&i.to_le_bytes())).collect();
        assert!(spread.len() > 1000, "keys spread over the shards");
    }
}
