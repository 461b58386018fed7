//! Checkpoints in the pipeline's RocksDB database: the [`CheckpointStore`]
//! of every pipeline, whatever its log backend.

use crate::db::{self, CF_CHECKPOINTS, rocks};
use rocksdb::{Direction, IteratorMode, WriteBatch};
use sluice_storage::checkpoint::KEPT;
use sluice_storage::{Checkpoint, CheckpointMeta, CheckpointStore, Result, StorageError};
use std::sync::Arc;

/// Checkpoints in the pipeline's RocksDB database.
///
/// Keys: `m[step u64]` → postcard [`CheckpointMeta`] (its presence is the
/// commit mark: it is written in the same batch as the states) and
/// `s[step u64][worker u32]` → state.
pub struct RocksCheckpointStore {
    db: Arc<db::PipelineDb>,
    lock: std::sync::Mutex<()>,
}

fn meta_key(step: u64) -> Vec<u8> {
    [b"m".as_slice(), &step.to_be_bytes()].concat()
}

fn state_key(step: u64, worker: u32) -> Vec<u8> {
    [b"s".as_slice(), &step.to_be_bytes(), &worker.to_be_bytes()].concat()
}

impl RocksCheckpointStore {
    /// Opens the store in a database opened by [`db::open`].
    pub fn open(db: Arc<db::PipelineDb>) -> Self {
        RocksCheckpointStore {
            db,
            lock: std::sync::Mutex::new(()),
        }
    }

    fn metas(&self) -> Result<Vec<CheckpointMeta>> {
        let cf = db::cf(&self.db, CF_CHECKPOINTS)?;
        let mut out = Vec::new();
        for item in self
            .db
            .iterator_cf(cf, IteratorMode::From(b"m", Direction::Forward))
        {
            let (k, v) = item.map_err(rocks("listing checkpoints"))?;
            if !k.starts_with(b"m") {
                break;
            }
            out.push(
                postcard::from_bytes(&v).map_err(StorageError::corrupt("checkpoint metadata"))?,
            );
        }
        Ok(out)
    }
}

impl CheckpointStore for RocksCheckpointStore {
    fn put(&self, checkpoint: &Checkpoint) -> Result<()> {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let step = checkpoint.meta.step;
        if checkpoint.states.len() != checkpoint.meta.frontiers.len() {
            return Err(StorageError::InvalidCheckpoint {
                step,
                message: format!(
                    "{} states for {} workers",
                    checkpoint.states.len(),
                    checkpoint.meta.frontiers.len()
                ),
            });
        }
        let metas = self.metas()?;
        if let Some(newest) = metas.last()
            && step < newest.step
        {
            return Err(StorageError::InvalidCheckpoint {
                step,
                message: format!(
                    "it is older than the committed checkpoint of step {}",
                    newest.step
                ),
            });
        }
        let cf = db::cf(&self.db, CF_CHECKPOINTS)?;
        let mut wb = WriteBatch::default();
        // Replace any earlier write of this step, then drop the oldest.
        wb.delete_range_cf(cf, state_key(step, 0), state_key(step + 1, 0));
        for (w, state) in checkpoint.states.iter().enumerate() {
            wb.put_cf(cf, state_key(step, w as u32), state);
        }
        let meta = postcard::to_allocvec(&checkpoint.meta)
            .map_err(StorageError::corrupt("checkpoint metadata"))?;
        wb.put_cf(cf, meta_key(step), meta);
        let mut kept: Vec<u64> = metas
            .iter()
            .map(|m| m.step)
            .filter(|s| *s != step)
            .collect();
        kept.push(step);
        if kept.len() > KEPT {
            let oldest_kept = kept[kept.len() - KEPT];
            wb.delete_range_cf(cf, meta_key(0), meta_key(oldest_kept));
            wb.delete_range_cf(cf, state_key(0, 0), state_key(oldest_kept, 0));
        }
        self.db
            .write_opt(wb, &db::synced())
            .map_err(rocks(format!("committing checkpoint {step}")))
    }

    fn latest_meta(&self) -> Result<Option<CheckpointMeta>> {
        Ok(self.metas()?.pop())
    }

    fn get(&self, step: u64) -> Result<Option<Checkpoint>> {
        let cf = db::cf(&self.db, CF_CHECKPOINTS)?;
        let Some(meta) = self
            .db
            .get_cf(cf, meta_key(step))
            .map_err(rocks("reading a checkpoint"))?
        else {
            return Ok(None);
        };
        let meta: CheckpointMeta =
            postcard::from_bytes(&meta).map_err(StorageError::corrupt("checkpoint metadata"))?;
        let mut states = Vec::with_capacity(meta.frontiers.len());
        for w in 0..meta.frontiers.len() as u32 {
            let state = self
                .db
                .get_cf(cf, state_key(step, w))
                .map_err(rocks("reading a checkpoint"))?;
            states.push(state.ok_or_else(|| StorageError::Corrupt {
                what: format!("checkpoint of step {step}"),
                message: format!("state of worker {w} is missing"),
            })?);
        }
        Ok(Some(Checkpoint { meta, states }))
    }

    fn list(&self) -> Result<Vec<u64>> {
        Ok(self.metas()?.into_iter().map(|m| m.step).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_storage::conformance;
    use std::cell::RefCell;

    #[test]
    fn passes_the_checkpoint_conformance_suite() {
        let dirs = RefCell::new(Vec::new());
        conformance::checkpoint_store(&|| {
            let dir = tempfile::tempdir().unwrap();
            let store = RocksCheckpointStore::open(db::open(dir.path()).unwrap());
            dirs.borrow_mut().push(dir);
            Arc::new(store)
        });
    }
}
