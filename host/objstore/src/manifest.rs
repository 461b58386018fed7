//! Manifests, the commit marks of checkpoints: what one holds (the
//! checkpoint's metadata, its segments, where each piece lies), how it is
//! encoded and checked, and the names manifests and segments go by.

use serde::{Deserialize, Serialize};
use sluice_storage::{CheckpointMeta, Result, StorageError};

/// The manifest format this build writes and reads.
pub(crate) const FORMAT: u32 = 1;

/// The commit mark of one checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    /// [`FORMAT`].
    pub(crate) format: u32,
    /// The checkpoint's metadata.
    pub(crate) meta: CheckpointMeta,
    /// The segments its pieces lie in (its own and earlier checkpoints').
    pub(crate) segments: Vec<String>,
    /// Its pieces, ordered by (shard, worker), several of one key in
    /// restore order (a whole piece, then deltas).
    pub(crate) pieces: Vec<PieceRef>,
}

/// Where one piece lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PieceRef {
    /// The shard the piece is of.
    pub(crate) shard: u32,
    /// The worker that wrote it.
    pub(crate) worker: u32,
    /// Index into [`Manifest::segments`].
    pub(crate) segment: u32,
    /// Where in the segment it starts.
    pub(crate) offset: u64,
    /// How many bytes it is.
    pub(crate) len: u64,
}

impl Manifest {
    /// The bytes of this manifest, as stored.
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        let step = self.meta.step;
        postcard::to_allocvec(self).map_err(StorageError::corrupt(format!(
            "manifest of checkpoint {step}"
        )))
    }

    /// The manifest of checkpoint `step` that `bytes` hold, if they hold
    /// one of this build's [`FORMAT`] and of that step.
    pub(crate) fn decode(step: u64, bytes: &[u8]) -> Result<Manifest> {
        let manifest: Manifest = postcard::from_bytes(bytes).map_err(StorageError::corrupt(
            format!("manifest of checkpoint {step}"),
        ))?;
        if manifest.format != FORMAT || manifest.meta.step != step {
            return Err(StorageError::Corrupt {
                what: format!("manifest of checkpoint {step}"),
                message: format!(
                    "format {} of step {} (this build reads format {FORMAT})",
                    manifest.format, manifest.meta.step
                ),
            });
        }
        Ok(manifest)
    }
}

/// The name of checkpoint `step`'s manifest in a store without a ledger
/// (where writing it is the commit).
pub(crate) fn plain_name(step: u64) -> String {
    format!("{step:020}")
}

/// The name of a manifest of checkpoint `step` in a store with a ledger:
/// never reused (the write's `nonce`), committed once the ledger records it.
pub(crate) fn ledgered_name(step: u64, nonce: u64) -> String {
    format!("{step:020}-{nonce:016x}")
}

/// The step a manifest or segment file name starts with.
pub(crate) fn step_of(name: &str) -> Option<u64> {
    name.get(..20)?.parse().ok()
}
