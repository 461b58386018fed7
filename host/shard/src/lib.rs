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

    /// The keys of the vectors the Python SDK's `shard.py` is checked
    /// against: every length through each of XXH3's code paths.
    fn vector_keys() -> Vec<Vec<u8>> {
        let lengths = (0..=260).chain([511, 1024, 1025, 2049, 4100]);
        lengths
            .map(|n| (0..n).map(|i| ((i * 31 + n * 7) % 251) as u8).collect())
            .collect()
    }

    /// `guest-sdk/python/tests/shard_vectors.txt` holds this crate's hash
    /// of each vector key (hex key, space, hash): the Python SDK reads it
    /// in its tests. Regenerate with `SLUICE_BLESS=1`.
    #[test]
    fn the_python_sdk_s_vectors_are_this_crate_s_hashes() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../guest-sdk/python/tests/shard_vectors.txt"
        );
        let want: String = vector_keys()
            .iter()
            .map(|k| {
                let hex: String = k.iter().map(|b| format!("{b:02x}")).collect();
                format!("{hex} {}\n", hash(k))
            })
            .collect();
        if std::env::var_os("SLUICE_BLESS").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(have == want, "{path} is stale: run with SLUICE_BLESS=1");
    }
}
