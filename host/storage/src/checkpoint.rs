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

/// One worker's pieces of a checkpoint, written to a shared store by the
/// host that runs the worker before the checkpoint commits
/// ([`CheckpointStore::stage`]), so the bytes never travel to the host
/// that commits it. The commit ([`CheckpointStore::put_staged`]) names
/// them and checks they are there; until then they are invisible, and a
/// checkpoint that never commits leaves them to be collected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staged {
    /// The checkpoint's step.
    pub step: u64,
    /// The worker whose pieces they are.
    pub worker: u32,
    /// Where they lie in the store (its own naming).
    pub segment: String,
    /// `(shard, length in bytes)` of each piece, in the order they lie.
    pub pieces: Vec<(u32, u64)>,
}

impl Staged {
    /// The bytes of all its pieces.
    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|(_, len)| len).sum()
    }
}

/// Where a shared store's checkpoint commits are decided when the store
/// cannot decide them safely itself: a record in the pipeline's log,
/// written by its fenced step committer.
///
/// An object store's PUT cannot be fenced: a committer that stalls after
/// uploading a checkpoint and wakes after another host took over could
/// still write it. With a ledger, a store writes each checkpoint's manifest
/// under a name of its own (never overwriting one) and the checkpoint is
/// committed only when the ledger has recorded that name — which a
/// superseded committer cannot do. The Kafka log is one: its marks are
/// records on the step topic in a transaction of the step producer,
/// fenced by `init_transactions` like every step.
pub trait CheckpointLedger: Send + Sync {
    /// Records checkpoint `step` as committed by the manifest `manifest`
    /// (the store's own name for it); a later record of the same step
    /// replaces it. Fails, recording nothing, if this handle is not (or no
    /// longer) the pipeline's committer; a failure of the transport may
    /// leave it unknown whether the record took effect (it is then either
    /// recorded whole or not at all).
    fn record_checkpoint(&self, step: u64, manifest: &str) -> Result<()>;

    /// The `newest` most recently committed checkpoints (by step, oldest
    /// first) with their manifests, as recorded up to now.
    fn recorded_checkpoints(&self, newest: usize) -> Result<Vec<(u64, String)>>;

    /// The manifest recorded for checkpoint `step`, if any.
    fn recorded_checkpoint(&self, step: u64) -> Result<Option<String>>;
}

/// A [`CheckpointLedger`] in memory, for tests: one committer at a time,
/// and [`fence`](MemoryLedger::fence) hands the right to commit to a new
/// handle, refusing every earlier one from then on.
#[derive(Debug, Clone, Default)]
pub struct MemoryLedger {
    shared: std::sync::Arc<std::sync::Mutex<(u64, std::collections::BTreeMap<u64, String>)>>,
    epoch: u64,
}

impl MemoryLedger {
    /// A handle on the same records that takes the right to commit from
    /// every earlier handle.
    pub fn fence(&self) -> MemoryLedger {
        let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        shared.0 += 1;
        MemoryLedger {
            shared: self.shared.clone(),
            epoch: shared.0,
        }
    }
}

impl CheckpointLedger for MemoryLedger {
    fn record_checkpoint(&self, step: u64, manifest: &str) -> Result<()> {
        let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        if shared.0 != self.epoch {
            return Err(crate::StorageError::TransactionalProducerSuperseded {
                step: None,
                transactional_id: "a memory ledger".into(),
            });
        }
        shared.1.insert(step, manifest.to_owned());
        Ok(())
    }

    fn recorded_checkpoints(&self, newest: usize) -> Result<Vec<(u64, String)>> {
        let shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<(u64, String)> = shared
            .1
            .iter()
            .rev()
            .take(newest)
            .map(|(s, m)| (*s, m.clone()))
            .collect();
        out.reverse();
        Ok(out)
    }

    fn recorded_checkpoint(&self, step: u64) -> Result<Option<String>> {
        let shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        Ok(shared.1.get(&step).cloned())
    }
}

/// Bytes of pieces a read took: from this host's own copy, and fetched
/// from the shared store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadBytes {
    /// Read from this host's own copy (no download).
    pub local: u64,
    /// Fetched from the shared store.
    pub fetched: u64,
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

    /// `(shard, worker)` of each piece of committed checkpoint `step`, in
    /// the order [`pieces`](Self::pieces) returns them; `None` if there is
    /// no such checkpoint. (A store that keeps an index reads only that.)
    fn keys(&self, step: u64) -> Result<Option<Vec<(u32, u32)>>> {
        Ok(self
            .pieces(step, None)?
            .map(|ps| ps.iter().map(|p| (p.shard, p.worker)).collect()))
    }

    /// The pieces of committed checkpoint `step` that worker `worker`
    /// held, in restore order, and where their bytes came from; `None` if
    /// there is no such checkpoint. (The default reads every piece and
    /// counts them local: a store without a location is this host's.)
    fn worker_pieces(
        &self,
        step: u64,
        worker: u32,
    ) -> Result<Option<(Vec<StatePiece>, ReadBytes)>> {
        Ok(self.pieces(step, None)?.map(|ps| {
            let mine: Vec<StatePiece> = ps.into_iter().filter(|p| p.worker == worker).collect();
            let local = mine.iter().map(|p| p.state.len() as u64).sum();
            (mine, ReadBytes { local, fetched: 0 })
        }))
    }

    /// Where the store keeps its checkpoints, if other hosts can reach
    /// it: two stores with the same location see the same checkpoints, so
    /// a host may [`stage`](Self::stage) pieces for another's commit and
    /// read what another committed. `None` (the default) for a store only
    /// this host sees.
    fn location(&self) -> Option<String> {
        None
    }

    /// Writes worker `worker`'s pieces (`(shard, bytes)`, in restore
    /// order) of checkpoint `step` ahead of its commit, for another host's
    /// [`put_staged`](Self::put_staged) on a store of the same
    /// [`location`](Self::location). A store without a location refuses.
    fn stage(&self, step: u64, worker: u32, pieces: &[(u32, Vec<u8>)]) -> Result<Staged> {
        let _ = (worker, pieces);
        Err(crate::StorageError::InvalidCheckpoint {
            step,
            message: "this checkpoint store takes no pieces apart from their commit".into(),
        })
    }

    /// Bytes of each worker's pieces of committed checkpoint `step` that
    /// this host has in its own copy, as `(worker, bytes)` for the workers
    /// it has any of: where restoring that worker costs no download. Empty
    /// (the default) for a store without copies.
    fn local_bytes(&self, step: u64) -> Result<Vec<(u32, u64)>> {
        let _ = step;
        Ok(Vec::new())
    }

    /// Commits `checkpoint` like [`put`](Self::put) (or
    /// [`put_carrying`](Self::put_carrying) with `carried`), its pieces
    /// together with those `staged` — as if they had been written with
    /// it. Fails, committing nothing, if a staged segment is missing or
    /// differs from its description.
    fn put_staged(
        &self,
        checkpoint: &Checkpoint,
        staged: &[Staged],
        carried: Option<&Carried>,
    ) -> Result<()> {
        if let Some(s) = staged.first() {
            return Err(crate::StorageError::InvalidCheckpoint {
                step: checkpoint.meta.step,
                message: format!(
                    "it names pieces staged in {}, and this checkpoint store takes none",
                    s.segment
                ),
            });
        }
        match carried {
            Some(carried) => self.put_carrying(checkpoint, carried),
            None => self.put(checkpoint),
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
