//! Checkpoints: all W instances' state at the end of one step, with that
//! step's frontiers, committed at once. The [`CheckpointStore`] trait; the
//! RocksDB implementation is `sluice-embedded`'s (checkpoints stay in the
//! data directory's RocksDB whatever the log backend).

use crate::error::Result;
use serde::{Deserialize, Serialize};
use sluice_core::Frontier;

/// How many committed checkpoints a store keeps.
pub const KEPT: usize = 2;

/// What a checkpoint covers, without the states.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// The last step whose effects the states include.
    pub step: u64,
    /// Each worker's frontier after that step.
    pub frontiers: Vec<Frontier>,
    /// The circuit's snapshot version when it was taken.
    pub snapshot_version: u32,
}

/// A committed checkpoint: metadata plus one state per worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Step, frontiers, version.
    pub meta: CheckpointMeta,
    /// Worker `w`'s snapshot at index `w`.
    pub states: Vec<Vec<u8>>,
}

/// Durable storage of checkpoints.
pub trait CheckpointStore: Send + Sync {
    /// Stores `checkpoint` and marks it committed, atomically and durably,
    /// then drops all but the [`KEPT`] newest. Refuses a step older than the
    /// newest committed checkpoint (writing the same step again replaces it).
    fn put(&self, checkpoint: &Checkpoint) -> Result<()>;

    /// The newest committed checkpoint's metadata.
    fn latest_meta(&self) -> Result<Option<CheckpointMeta>>;

    /// A committed checkpoint with its states.
    fn get(&self, step: u64) -> Result<Option<Checkpoint>>;

    /// Steps of the committed checkpoints, oldest first.
    fn list(&self) -> Result<Vec<u64>>;

    /// The newest committed checkpoint with its states.
    fn latest(&self) -> Result<Option<Checkpoint>> {
        match self.latest_meta()? {
            Some(meta) => self.get(meta.step),
            None => Ok(None),
        }
    }
}
