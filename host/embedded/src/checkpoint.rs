//! Checkpoints in the pipeline's RocksDB database: the [`CheckpointStore`]
//! of every pipeline, whatever its log backend.

use crate::db::{self, CF_CHECKPOINTS, rocks};
use rocksdb::{Direction, IteratorMode, WriteBatch};
use sluice_storage::checkpoint::KEPT;
use sluice_storage::{
    Checkpoint, CheckpointMeta, CheckpointStore, Result, StatePiece, StorageError,
};
use std::sync::Arc;

/// Checkpoints in the pipeline's RocksDB database.
///
/// Keys: `m[step u64]` → postcard [`CheckpointMeta`] (its presence is the
/// commit mark: it is written in the same batch as the pieces) and
/// `s[step u64][shard u32][worker u32]` → a piece: the pieces of a shard lie
/// together, so reading some shards reads only those.
pub struct RocksCheckpointStore {
    db: Arc<db::PipelineDb>,
    lock: std::sync::Mutex<()>,
}

fn meta_key(step: u64) -> Vec<u8> {
    [b"m".as_slice(), &step.to_be_bytes()].concat()
}

fn piece_key(step: u64, shard: u32, worker: u32) -> Vec<u8> {
    [
        b"s".as_slice(),
        &step.to_be_bytes(),
        &shard.to_be_bytes(),
        &worker.to_be_bytes(),
    ]
    .concat()
}

/// The first key of step `step`'s pieces (and one past the last of the
/// step before).
fn step_start(step: u64) -> Vec<u8> {
    [b"s".as_slice(), &step.to_be_bytes()].concat()
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

    /// The pieces of `step` with shards in `from..to`.
    fn range(&self, step: u64, from: u32, to: u64, out: &mut Vec<StatePiece>) -> Result<()> {
        let cf = db::cf(&self.db, CF_CHECKPOINTS)?;
        let start = piece_key(step, from, 0);
        let end = match u32::try_from(to) {
            Ok(to) => piece_key(step, to, 0),
            Err(_) => step_start(step + 1),
        };
        for item in self
            .db
            .iterator_cf(cf, IteratorMode::From(&start, Direction::Forward))
        {
            let (k, v) = item.map_err(rocks("reading a checkpoint"))?;
            if k.as_ref() >= end.as_slice() {
                break;
            }
            let (shard, worker) = match k.get(9..17) {
                Some(rest) if k.len() == 17 => (
                    u32::from_be_bytes(rest[..4].try_into().expect("4 bytes")),
                    u32::from_be_bytes(rest[4..].try_into().expect("4 bytes")),
                ),
                _ => {
                    return Err(StorageError::Corrupt {
                        what: format!("checkpoint of step {step}"),
                        message: "malformed piece key".into(),
                    });
                }
            };
            out.push(StatePiece {
                shard,
                worker,
                state: v.to_vec(),
            });
        }
        Ok(())
    }
}

impl CheckpointStore for RocksCheckpointStore {
    fn put(&self, checkpoint: &Checkpoint) -> Result<()> {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let step = checkpoint.meta.step;
        let workers = checkpoint.meta.layout.workers;
        if checkpoint.meta.frontiers.len() != workers as usize {
            return Err(StorageError::InvalidCheckpoint {
                step,
                message: format!(
                    "{} frontiers for {workers} workers",
                    checkpoint.meta.frontiers.len()
                ),
            });
        }
        if let Some(p) = checkpoint.pieces.iter().find(|p| p.worker >= workers) {
            return Err(StorageError::InvalidCheckpoint {
                step,
                message: format!("a piece of worker {} of {workers}", p.worker),
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
        wb.delete_range_cf(cf, step_start(step), step_start(step + 1));
        for p in &checkpoint.pieces {
            wb.put_cf(cf, piece_key(step, p.shard, p.worker), &p.state);
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
            wb.delete_range_cf(cf, step_start(0), step_start(oldest_kept));
        }
        self.db
            .write_opt(wb, &db::synced())
            .map_err(rocks(format!("committing checkpoint {step}")))
    }

    fn latest_meta(&self) -> Result<Option<CheckpointMeta>> {
        Ok(self.metas()?.pop())
    }

    fn meta(&self, step: u64) -> Result<Option<CheckpointMeta>> {
        let cf = db::cf(&self.db, CF_CHECKPOINTS)?;
        match self
            .db
            .get_cf(cf, meta_key(step))
            .map_err(rocks("reading a checkpoint"))?
        {
            Some(meta) => Ok(Some(
                postcard::from_bytes(&meta)
                    .map_err(StorageError::corrupt("checkpoint metadata"))?,
            )),
            None => Ok(None),
        }
    }

    fn pieces(&self, step: u64, shards: Option<&[u32]>) -> Result<Option<Vec<StatePiece>>> {
        if self.meta(step)?.is_none() {
            return Ok(None);
        }
        let mut out = Vec::new();
        match shards {
            None => self.range(step, 0, u64::from(u32::MAX) + 1, &mut out)?,
            Some(shards) => {
                let mut sorted = shards.to_vec();
                sorted.sort_unstable();
                sorted.dedup();
                for s in sorted {
                    self.range(step, s, u64::from(s) + 1, &mut out)?;
                }
            }
        }
        Ok(Some(out))
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
