//! Checkpoints: the state of every instance at the end of one step, as
//! pieces by shard, with that step's frontiers and layout, committed at
//! once. The [`CheckpointStore`] trait; the RocksDB implementation is
//! `sluice-embedded`'s (checkpoints stay in the data directory's RocksDB
//! whatever the log backend).

use crate::error::Result;
use serde::{Deserialize, Serialize};
use sluice_core::{Frontier, Layout};

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
    /// The layout that step ran under.
    pub layout: Layout,
}

/// One shard's part of one instance's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatePiece {
    /// The shard (below `SHARDS`; the guest's own encoding inside).
    pub shard: u32,
    /// The worker whose instance held it: a recovery gives it back to that
    /// worker, so a replay runs on exactly the state the step ran on.
    pub worker: u32,
    /// The bytes.
    pub state: Vec<u8>,
}

/// A committed checkpoint: metadata plus every instance's pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// Step, frontiers, version, layout.
    pub meta: CheckpointMeta,
    /// The pieces, ordered by (shard, worker). A (shard, worker) may have
    /// several — a whole piece and deltas an incremental checkpoint wrote
    /// after it, oldest first — which a restore adds up.
    pub pieces: Vec<StatePiece>,
}

impl Checkpoint {
    /// The bytes of all pieces.
    pub fn state_bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.state.len() as u64).sum()
    }
}

/// The pieces an incremental checkpoint takes unchanged from an earlier
/// committed checkpoint instead of writing them again.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Carried {
    /// The committed checkpoint they come from (same layout).
    pub from: u64,
    /// `(shard, worker)` of each piece taken, as keyed there.
    pub pieces: Vec<(u32, u32)>,
}

/// Durable storage of checkpoints: pieces stored by (checkpoint, shard,
/// worker), so a reader of some shards reads only those.
pub trait CheckpointStore: Send + Sync {
    /// Stores `checkpoint` and marks it committed, atomically and durably,
    /// then drops all but the [`KEPT`] newest. Refuses a step older than the
    /// newest committed checkpoint (writing the same step again replaces it).
    fn put(&self, checkpoint: &Checkpoint) -> Result<()>;

    /// Stores `checkpoint` like [`put`](Self::put), made whole by the
    /// pieces `carried` names from committed checkpoint `carried.from` —
    /// an incremental checkpoint: it reads back exactly as if those pieces
    /// had been written with it, before its own. (A piece of its own of a
    /// carried `(shard, worker)` is a delta: it reads back after them.) A store that can reference a piece keeps
    /// one copy of it (and collects it once no kept checkpoint refers to
    /// it); the default copies. Fails if `carried.from` is not committed
    /// or lacks a named piece.
    fn put_carrying(&self, checkpoint: &Checkpoint, carried: &Carried) -> Result<()> {
        let base = carried_pieces(self, checkpoint.meta.step, carried)?;
        let mut whole = checkpoint.clone();
        whole.pieces.extend(base);
        whole.pieces.sort_by_key(|p| (p.shard, p.worker));
        self.put(&whole)
    }

    /// The newest committed checkpoint's metadata.
    fn latest_meta(&self) -> Result<Option<CheckpointMeta>>;

    /// The pieces of committed checkpoint `step` whose shard is in
    /// `shards` (all when `None`), ordered by (shard, worker); `None` if
    /// there is no such checkpoint.
    fn pieces(&self, step: u64, shards: Option<&[u32]>) -> Result<Option<Vec<StatePiece>>>;

    /// Steps of the committed checkpoints, oldest first.
    fn list(&self) -> Result<Vec<u64>>;

    /// The metadata of committed checkpoint `step`.
    fn meta(&self, step: u64) -> Result<Option<CheckpointMeta>>;

    /// A committed checkpoint with all its pieces.
    fn get(&self, step: u64) -> Result<Option<Checkpoint>> {
        let Some(meta) = self.meta(step)? else {
            return Ok(None);
        };
        Ok(self
            .pieces(step, None)?
            .map(|pieces| Checkpoint { meta, pieces }))
    }

    /// The newest committed checkpoint with all its pieces.
    fn latest(&self) -> Result<Option<Checkpoint>> {
        match self.latest_meta()? {
            Some(meta) => self.get(meta.step),
            None => Ok(None),
        }
    }
}

/// The pieces `carried` names, read from its checkpoint; an error naming
/// checkpoint `step` if that checkpoint or a piece is missing.
pub fn carried_pieces<S: CheckpointStore + ?Sized>(
    store: &S,
    step: u64,
    carried: &Carried,
) -> Result<Vec<StatePiece>> {
    let missing = |message: String| crate::StorageError::InvalidCheckpoint { step, message };
    let mut wanted: Vec<(u32, u32)> = carried.pieces.clone();
    wanted.sort_unstable();
    wanted.dedup();
    let shards: Vec<u32> = wanted.iter().map(|(s, _)| *s).collect();
    let base = store.pieces(carried.from, Some(&shards))?.ok_or_else(|| {
        missing(format!(
            "it carries pieces of checkpoint {}, which is not committed",
            carried.from
        ))
    })?;
    let found: Vec<StatePiece> = base
        .into_iter()
        .filter(|p| wanted.binary_search(&(p.shard, p.worker)).is_ok())
        .collect();
    if found.len() != wanted.len() {
        return Err(missing(format!(
            "it carries {} pieces of checkpoint {}, which holds {} of them",
            wanted.len(),
            carried.from,
            found.len()
        )));
    }
    Ok(found)
}
