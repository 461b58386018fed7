//! Local recovery: a shared checkpoint store with a copy of this host's
//! newest checkpoints on its own disk.
//!
//! The shared store (an [`ObjectCheckpointStore`](crate::ObjectCheckpointStore))
//! is the authority: what is committed, and where a host that takes the
//! pipeline over reads from. A host that restores a checkpoint it wrote
//! itself reads its local copy instead of downloading it (Flink's "local
//! recovery"); any other host, or a host whose copy is older, falls back to
//! the shared store.

use sluice_storage::{Carried, Checkpoint, CheckpointMeta, CheckpointStore, Result, StatePiece};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A shared checkpoint store and a local copy of what this host wrote.
pub struct CachedCheckpoints {
    shared: Arc<dyn CheckpointStore>,
    local: Arc<dyn CheckpointStore>,
    local_reads: AtomicU64,
    shared_reads: AtomicU64,
}

impl CachedCheckpoints {
    /// `shared` is the authority; `local` (e.g. the data directory's
    /// RocksDB store) keeps a copy of each checkpoint this host commits.
    pub fn new(shared: Arc<dyn CheckpointStore>, local: Arc<dyn CheckpointStore>) -> Self {
        CachedCheckpoints {
            shared,
            local,
            local_reads: AtomicU64::new(0),
            shared_reads: AtomicU64::new(0),
        }
    }

    /// Reads of pieces served from the local copy, and from the shared
    /// store, so far.
    pub fn reads(&self) -> (u64, u64) {
        (
            self.local_reads.load(Ordering::Relaxed),
            self.shared_reads.load(Ordering::Relaxed),
        )
    }

    /// Keeps the local copy after a commit to the shared store. A copy that
    /// cannot be written (the local store lacks the checkpoint an
    /// incremental one carries from, say after a restore from the shared
    /// store) is only a missed optimisation: reads go to the shared store.
    fn copy(&self, step: u64, write: impl FnOnce(&dyn CheckpointStore) -> Result<()>) {
        if let Err(e) = write(&*self.local) {
            tracing::debug!(step, error = %e, "no local copy of the checkpoint");
        }
    }
}

impl CheckpointStore for CachedCheckpoints {
    fn put(&self, checkpoint: &Checkpoint) -> Result<()> {
        self.shared.put(checkpoint)?;
        self.copy(checkpoint.meta.step, |l| l.put(checkpoint));
        Ok(())
    }

    fn put_carrying(&self, checkpoint: &Checkpoint, carried: &Carried) -> Result<()> {
        self.shared.put_carrying(checkpoint, carried)?;
        self.copy(checkpoint.meta.step, |l| {
            l.put_carrying(checkpoint, carried)
        });
        Ok(())
    }

    fn latest_meta(&self) -> Result<Option<CheckpointMeta>> {
        self.shared.latest_meta()
    }

    fn pieces(&self, step: u64, shards: Option<&[u32]>) -> Result<Option<Vec<StatePiece>>> {
        // The local copy serves only if it is of the very checkpoint the
        // shared store committed (same step, same metadata).
        let shared = self.shared.meta(step)?;
        if shared.is_some()
            && self.local.meta(step).ok().flatten() == shared
            && let Ok(Some(pieces)) = self.local.pieces(step, shards)
        {
            self.local_reads.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(pieces));
        }
        self.shared_reads.fetch_add(1, Ordering::Relaxed);
        self.shared.pieces(step, shards)
    }

    fn list(&self) -> Result<Vec<u64>> {
        self.shared.list()
    }

    fn meta(&self, step: u64) -> Result<Option<CheckpointMeta>> {
        self.shared.meta(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ObjectCheckpointStore;

    fn store() -> Arc<dyn CheckpointStore> {
        Arc::new(ObjectCheckpointStore::open("memory:///").unwrap())
    }

    #[test]
    fn passes_the_checkpoint_conformance_suite() {
        sluice_storage::conformance::checkpoint_store(&|| {
            Arc::new(CachedCheckpoints::new(store(), store()))
        });
    }

    #[test]
    fn the_writer_restores_locally_another_host_from_the_shared_store() {
        let shared = store();
        let mine = CachedCheckpoints::new(shared.clone(), store());
        let c = sluice_storage::conformance::sample_checkpoint(4, 2);
        mine.put(&c).unwrap();
        assert_eq!(mine.get(4).unwrap(), Some(c.clone()));
        assert_eq!(mine.reads(), (1, 0));
        // Another host: its local store has nothing.
        let other = CachedCheckpoints::new(shared.clone(), store());
        assert_eq!(other.get(4).unwrap(), Some(c.clone()));
        assert_eq!(other.reads(), (0, 1));
        // The other host commits the next checkpoint: the first host's copy
        // of step 4 no longer is the newest, and step 9 is read remotely.
        let next = sluice_storage::conformance::sample_checkpoint(9, 2);
        other.put(&next).unwrap();
        assert_eq!(mine.latest().unwrap(), Some(next));
        assert_eq!(mine.reads(), (1, 1));
    }
}
