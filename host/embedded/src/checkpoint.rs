//! Checkpoints in the pipeline's RocksDB database: the [`CheckpointStore`]
//! of every pipeline, whatever its log backend.

use crate::db::{self, CF_CHECKPOINTS, rocks};
use rocksdb::{Direction, IteratorMode, WriteBatch};
use sluice_storage::checkpoint::KEPT;
use sluice_storage::{
    Carried, Checkpoint, CheckpointMeta, CheckpointStore, Result, StatePiece, StorageError,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Checkpoints in the pipeline's RocksDB database.
///
/// Keys: `m[step u64]` → postcard [`CheckpointMeta`] (its presence is the
/// commit mark: it is written in the same batch as the pieces, or, for a
/// large checkpoint of a step not yet committed, after its pieces were
/// ingested as a table file: see `ingest_pieces`);
/// `s[step u64][shard u32][worker u32]` → a piece written by checkpoint
/// `step` (the pieces of a shard lie together, so reading some shards reads
/// only those); for an incremental checkpoint, `r[step][shard][worker]` →
/// the steps (u64 each) whose `s` keys hold the pieces it carries of that
/// shard and worker, oldest first (a whole piece, then deltas; the
/// checkpoint's own `s` piece of the same key, if any, is a delta that
/// follows them); and `w[step]` →
/// the `(shard, worker)` pairs of the `s` keys of `step` still stored (a
/// list per step, so that collecting needs no scan of the pieces). A
/// checkpoint of the format before incremental ones has `s` keys and no
/// `w` key.
pub struct RocksCheckpointStore {
    db: Arc<db::PipelineDb>,
    lock: std::sync::Mutex<()>,
    /// The size of a checkpoint's own pieces, in bytes, from which they are
    /// written as a table file of their own and ingested (see
    /// [`RocksCheckpointStore::ingest_pieces`]) rather than through the
    /// write-ahead log.
    ingest_at: usize,
}

/// [`RocksCheckpointStore::ingest_at`]: a family's memtable. Smaller
/// pieces cost little in the write-ahead log; larger ones would fill a
/// memtable by themselves and be written again by its flush.
const INGEST_AT: usize = db::FAMILY_BUFFER;

fn meta_key(step: u64) -> Vec<u8> {
    [b"m".as_slice(), &step.to_be_bytes()].concat()
}

fn piece_key(step: u64, shard: u32, worker: u32) -> Vec<u8> {
    keyed(b's', step, shard, worker)
}

fn ref_key(step: u64, shard: u32, worker: u32) -> Vec<u8> {
    keyed(b'r', step, shard, worker)
}

fn keyed(prefix: u8, step: u64, shard: u32, worker: u32) -> Vec<u8> {
    [
        [prefix].as_slice(),
        &step.to_be_bytes(),
        &shard.to_be_bytes(),
        &worker.to_be_bytes(),
    ]
    .concat()
}

fn written_key(step: u64) -> Vec<u8> {
    [b"w".as_slice(), &step.to_be_bytes()].concat()
}

/// The first key of step `step`'s pieces (and one past the last of the
/// step before).
fn step_start(step: u64) -> Vec<u8> {
    [b"s".as_slice(), &step.to_be_bytes()].concat()
}

/// Like [`step_start`], for the references of incremental checkpoints.
fn ref_start(step: u64) -> Vec<u8> {
    [b"r".as_slice(), &step.to_be_bytes()].concat()
}

/// A key (or its tail) and its value.
type KeyValue = (Box<[u8]>, Box<[u8]>);

impl RocksCheckpointStore {
    /// Opens the store in a database opened by [`db::open`].
    pub fn open(db: Arc<db::PipelineDb>) -> Self {
        RocksCheckpointStore {
            db,
            lock: std::sync::Mutex::new(()),
            ingest_at: INGEST_AT,
        }
    }

    /// Writes `pieces` (of checkpoint `step`, which must not be committed)
    /// as `s` keys in a table file and ingests it, durably, replacing
    /// whatever an earlier write of the same step left (that is deleted
    /// first, durably: a retry after a crash that ingested pieces but did
    /// not commit). Of two pieces of one shard and worker, the later is
    /// kept, as a batch keeps it. The checkpoint is not committed by this:
    /// its metadata, written after, is what makes it one; pieces ingested
    /// without it lie below every later checkpoint and are collected as
    /// any unlisted step's are. (A committed step written again goes
    /// through the batch, atomically: deleting its pieces first would
    /// leave it without them until the new ones are in.)
    ///
    /// The write-ahead log would take the pieces once and the flush of the
    /// memtable they fill once more (a Nexmark q9 run's final checkpoint:
    /// 129 MB, 274 ms in the batch, and the process's exit waited for the
    /// flush); the table file is written once, in the writes of
    /// [`db::WRITE_CHUNK`] bytes the database's own files use.
    fn ingest_pieces(&self, step: u64, pieces: &[StatePiece]) -> Result<()> {
        let cf = db::cf(&self.db, CF_CHECKPOINTS)?;
        let what = |doing: &str| format!("{doing} the pieces of checkpoint {step}");
        let mut earlier = self.db.iterator_cf(
            cf,
            IteratorMode::From(&step_start(step), Direction::Forward),
        );
        if let Some(item) = earlier.next() {
            let (key, _) = item.map_err(rocks(what("looking for earlier writes of")))?;
            if key.as_ref() < step_start(step + 1).as_slice() {
                let mut wb = WriteBatch::default();
                wb.delete_range_cf(cf, step_start(step), step_start(step + 1));
                self.db
                    .write_opt(wb, &db::synced())
                    .map_err(rocks(what("deleting an earlier write of")))?;
            }
        }
        drop(earlier);
        // Latest first, sorted stably: the first of equal keys is the last
        // given.
        let mut sorted: Vec<(Vec<u8>, &[u8])> = (pieces.iter().rev())
            .map(|p| (piece_key(step, p.shard, p.worker), p.state.as_slice()))
            .collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        sorted.dedup_by(|later, kept| later.0 == kept.0);
        db::ingest_tables(
            &self.db,
            CF_CHECKPOINTS,
            [("checkpoint-pieces.sst".to_owned(), sorted)],
            &format!("the pieces of checkpoint {step}"),
        )
    }

    /// Every `(key, value)` with `start <= key < end`, in key order.
    fn between(&self, start: &[u8], end: &[u8], what: &str) -> Result<Vec<KeyValue>> {
        let cf = db::cf(&self.db, CF_CHECKPOINTS)?;
        let mut out = Vec::new();
        for item in self
            .db
            .iterator_cf(cf, IteratorMode::From(start, Direction::Forward))
        {
            let (k, v) = item.map_err(rocks(what))?;
            if k.as_ref() >= end {
                break;
            }
            out.push((k, v));
        }
        Ok(out)
    }

    /// Every `(key without the prefix, value)` whose key starts with the
    /// one-byte `prefix`, in key order.
    fn prefixed(&self, prefix: u8, what: &str) -> Result<Vec<KeyValue>> {
        Ok(self
            .between(&[prefix], &[prefix + 1], what)?
            .into_iter()
            .map(|(k, v)| (k[1..].into(), v))
            .collect())
    }

    fn metas(&self) -> Result<Vec<CheckpointMeta>> {
        self.prefixed(b'm', "listing checkpoints")?
            .into_iter()
            .map(|(_, v)| {
                postcard::from_bytes(&v).map_err(StorageError::corrupt("checkpoint metadata"))
            })
            .collect()
    }

    /// The pieces of `step` with shards in `from..to`: those it wrote and
    /// those it carries from earlier checkpoints.
    fn range(&self, step: u64, from: u32, to: u64, out: &mut Vec<StatePiece>) -> Result<()> {
        let cf = db::cf(&self.db, CF_CHECKPOINTS)?;
        let first = out.len();
        // References first: a piece a checkpoint wrote of a (shard, worker)
        // it also carries is a delta, which follows the carried ones.
        for prefix in [b'r', b's'] {
            let start = keyed(prefix, step, from, 0);
            let end = match u32::try_from(to) {
                Ok(to) => keyed(prefix, step, to, 0),
                Err(_) => [[prefix].as_slice(), &(step + 1).to_be_bytes()].concat(),
            };
            for (k, v) in self.between(&start, &end, "reading a checkpoint")? {
                let corrupt = |message: &str| StorageError::Corrupt {
                    what: format!("checkpoint of step {step}"),
                    message: message.into(),
                };
                let (shard, worker) = match k.get(9..17) {
                    Some(rest) if k.len() == 17 => (
                        u32::from_be_bytes(rest[..4].try_into().expect("4 bytes")),
                        u32::from_be_bytes(rest[4..].try_into().expect("4 bytes")),
                    ),
                    _ => return Err(corrupt("malformed piece key")),
                };
                if prefix == b's' {
                    out.push(StatePiece {
                        shard,
                        worker,
                        state: v.into_vec(),
                    });
                    continue;
                }
                if v.is_empty() || v.len() % 8 != 0 {
                    return Err(corrupt("malformed piece reference"));
                }
                for origin in v.chunks_exact(8) {
                    let origin = u64::from_be_bytes(origin.try_into().expect("8 bytes"));
                    let state = self
                        .db
                        .get_cf(cf, piece_key(origin, shard, worker))
                        .map_err(rocks("reading a checkpoint"))?
                        .ok_or_else(|| {
                            corrupt(&format!(
                                "the piece of shard {shard} of worker {worker} it carries from \
                                 checkpoint {origin} is missing"
                            ))
                        })?;
                    out.push(StatePiece {
                        shard,
                        worker,
                        state,
                    });
                }
            }
        }
        // Stable: per (shard, worker), carried pieces oldest first, then
        // the checkpoint's own.
        out[first..].sort_by_key(|p| (p.shard, p.worker));
        Ok(())
    }

    /// Where the pieces of checkpoint `step` lie: per `(shard, worker)`,
    /// the steps whose `s` keys hold them, in restore order.
    fn origins(&self, step: u64) -> Result<BTreeMap<(u32, u32), Vec<u64>>> {
        let mut out: BTreeMap<(u32, u32), Vec<u64>> = BTreeMap::new();
        let (start, end) = (ref_start(step), ref_start(step + 1));
        for (k, v) in self.between(&start, &end, "reading a checkpoint")? {
            let malformed = || StorageError::Corrupt {
                what: format!("checkpoint of step {step}"),
                message: "malformed piece reference".into(),
            };
            let rest = k
                .get(9..17)
                .filter(|_| k.len() == 17)
                .ok_or_else(malformed)?;
            if v.is_empty() || v.len() % 8 != 0 {
                return Err(malformed());
            }
            out.insert(
                (
                    u32::from_be_bytes(rest[..4].try_into().expect("4 bytes")),
                    u32::from_be_bytes(rest[4..].try_into().expect("4 bytes")),
                ),
                v.chunks_exact(8)
                    .map(|c| u64::from_be_bytes(c.try_into().expect("8 bytes")))
                    .collect(),
            );
        }
        if let Some(written) = self.written(step)? {
            for key in written {
                out.entry(key).or_default().push(step);
            }
        }
        Ok(out)
    }

    /// The `(shard, worker)` pairs of the `s` keys of `step` still stored;
    /// `None` for a checkpoint of the format before incremental ones.
    fn written(&self, step: u64) -> Result<Option<Vec<(u32, u32)>>> {
        let cf = db::cf(&self.db, CF_CHECKPOINTS)?;
        self.db
            .get_cf(cf, written_key(step))
            .map_err(rocks("reading a checkpoint"))?
            .map(|v| {
                postcard::from_bytes(&v).map_err(StorageError::corrupt("checkpoint piece list"))
            })
            .transpose()
    }

    /// Writes checkpoint `checkpoint` — its own pieces, and references to
    /// the pieces `carried` names — then drops all but the [`KEPT`] newest
    /// checkpoints and every stored piece none of those refers to.
    fn write(&self, checkpoint: &Checkpoint, carried: Option<&Carried>) -> Result<()> {
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
        // Where the carried pieces lie (resolved now: a reference always
        // names the step that wrote the bytes, never another reference).
        let mut refs: BTreeMap<(u32, u32), Vec<u64>> = BTreeMap::new();
        if let Some(carried) = carried {
            if carried.from == step || !metas.iter().any(|m| m.step == carried.from) {
                return Err(StorageError::InvalidCheckpoint {
                    step,
                    message: format!(
                        "it carries pieces of checkpoint {}, which is not an earlier committed \
                         checkpoint",
                        carried.from
                    ),
                });
            }
            let base = self.origins(carried.from)?;
            for key in &carried.pieces {
                let origin = base
                    .get(key)
                    .ok_or_else(|| StorageError::InvalidCheckpoint {
                        step,
                        message: format!(
                            "it carries the piece of shard {} of worker {} of checkpoint {}, \
                         which has none",
                            key.0, key.1, carried.from
                        ),
                    })?;
                refs.insert(*key, origin.clone());
            }
        }
        let cf = db::cf(&self.db, CF_CHECKPOINTS)?;
        // Sized before it is filled (each piece with its key, lengths and
        // tag; the rest is small): grown by doubling, the batch would hold
        // up to twice the checkpoint again.
        let pieces: usize = checkpoint.pieces.iter().map(|p| p.state.len() + 32).sum();
        // A committed step written again goes through the batch (see
        // `ingest_pieces`).
        let ingest = pieces >= self.ingest_at
            && !checkpoint.pieces.is_empty()
            && !metas.iter().any(|m| m.step == step);
        let meta = postcard::to_allocvec(&checkpoint.meta)
            .map_err(StorageError::corrupt("checkpoint metadata"))?;
        let in_batch = if ingest { 0 } else { pieces };
        let mut wb = WriteBatch::with_capacity_bytes(
            in_batch + checkpoint.pieces.len() * 16 + refs.len() * 48 + meta.len() + 4096,
        );
        // Replace any earlier write of this step.
        wb.delete_range_cf(cf, ref_start(step), ref_start(step + 1));
        let written: Vec<(u32, u32)> = (checkpoint.pieces.iter())
            .map(|p| (p.shard, p.worker))
            .collect();
        if ingest {
            self.ingest_pieces(step, &checkpoint.pieces)?;
        } else {
            wb.delete_range_cf(cf, step_start(step), step_start(step + 1));
            for p in &checkpoint.pieces {
                wb.put_cf(cf, piece_key(step, p.shard, p.worker), &p.state);
            }
        }
        for ((shard, worker), origins) in &refs {
            let v: Vec<u8> = origins.iter().flat_map(|o| o.to_be_bytes()).collect();
            wb.put_cf(cf, ref_key(step, *shard, *worker), v);
        }
        let list = postcard::to_allocvec(&written)
            .map_err(StorageError::corrupt("checkpoint piece list"))?;
        wb.put_cf(cf, written_key(step), list);
        wb.put_cf(cf, meta_key(step), meta);
        let mut kept: Vec<u64> = metas
            .iter()
            .map(|m| m.step)
            .filter(|s| *s != step)
            .collect();
        kept.push(step);
        if kept.len() > KEPT {
            let oldest_kept = kept[kept.len() - KEPT];
            // Pieces the kept checkpoints still refer to, by the step that
            // wrote them.
            let mut referenced: BTreeMap<u64, std::collections::BTreeSet<(u32, u32)>> =
                BTreeMap::new();
            for s in &kept[kept.len() - KEPT..] {
                let origins = if *s == step {
                    refs.clone()
                } else {
                    self.origins(*s)?
                };
                for (key, origins) in origins {
                    for origin in origins {
                        if origin < oldest_kept {
                            referenced.entry(origin).or_default().insert(key);
                        }
                    }
                }
            }
            self.collect(&mut wb, oldest_kept, &referenced)?;
            wb.delete_range_cf(cf, meta_key(0), meta_key(oldest_kept));
            wb.delete_range_cf(cf, ref_start(0), ref_start(oldest_kept));
        }
        self.db
            .write_opt(wb, &db::synced())
            .map_err(rocks(format!("committing checkpoint {step}")))
    }

    /// Adds to `wb` the deletion of every piece written before
    /// `oldest_kept` that is not `referenced`.
    fn collect(
        &self,
        wb: &mut WriteBatch,
        oldest_kept: u64,
        referenced: &BTreeMap<u64, std::collections::BTreeSet<(u32, u32)>>,
    ) -> Result<()> {
        let cf = db::cf(&self.db, CF_CHECKPOINTS)?;
        // Steps below `oldest_kept` that still list stored pieces.
        let mut lists = Vec::new();
        for (k, v) in self.prefixed(b'w', "listing checkpoint pieces")? {
            let Ok(step) = <[u8; 8]>::try_from(&*k).map(u64::from_be_bytes) else {
                continue;
            };
            if step >= oldest_kept {
                break;
            }
            let list: Vec<(u32, u32)> =
                postcard::from_bytes(&v).map_err(StorageError::corrupt("checkpoint piece list"))?;
            lists.push((step, list));
        }
        let listed: std::collections::BTreeSet<u64> = lists.iter().map(|(s, _)| *s).collect();
        for (step, list) in lists {
            let keep = referenced.get(&step);
            let mut still = Vec::new();
            for key in list {
                if keep.is_some_and(|k| k.contains(&key)) {
                    still.push(key);
                } else {
                    wb.delete_cf(cf, piece_key(step, key.0, key.1));
                }
            }
            if still.is_empty() {
                wb.delete_cf(cf, written_key(step));
            } else {
                let v = postcard::to_allocvec(&still)
                    .map_err(StorageError::corrupt("checkpoint piece list"))?;
                wb.put_cf(cf, written_key(step), v);
            }
        }
        // Checkpoints of the format before incremental ones list nothing:
        // drop their pieces by range, as before (nothing refers to them).
        let mut from = 0;
        for step in listed.iter().copied().chain([oldest_kept]) {
            if from < step {
                wb.delete_range_cf(cf, step_start(from), step_start(step));
            }
            from = step + 1;
        }
        Ok(())
    }
}

impl CheckpointStore for RocksCheckpointStore {
    fn put(&self, checkpoint: &Checkpoint) -> Result<()> {
        self.write(checkpoint, None)
    }

    fn put_carrying(&self, checkpoint: &Checkpoint, carried: &Carried) -> Result<()> {
        self.write(checkpoint, Some(carried))
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
        // Pieces through the write-ahead log, and (every checkpoint with
        // any) through an ingested table.
        for ingest_at in [INGEST_AT, 0] {
            let dirs = RefCell::new(Vec::new());
            conformance::checkpoint_store(&|| {
                let dir = tempfile::tempdir().unwrap();
                let mut store = RocksCheckpointStore::open(db::open(dir.path()).unwrap());
                store.ingest_at = ingest_at;
                dirs.borrow_mut().push(dir);
                Arc::new(store)
            });
        }
    }

    /// A checkpoint written again at its step (a retry after a crash that
    /// ingested its pieces but did not commit it) holds only what the
    /// last write gave it; pieces ingested for a step never committed are
    /// collected once every kept checkpoint is later; the pieces survive a
    /// reopen; and no table file is left beside the database.
    #[test]
    fn ingested_pieces_are_replaced_collected_and_durable() {
        let dir = tempfile::tempdir().unwrap();
        let open = || {
            let mut store = RocksCheckpointStore::open(db::open(dir.path()).unwrap());
            store.ingest_at = 0;
            store
        };
        let store = open();
        let piece = |shard, state: &[u8]| StatePiece {
            shard,
            worker: 0,
            state: state.to_vec(),
        };
        let checkpoint = |step, pieces| {
            let mut meta = store_meta();
            meta.step = step;
            Checkpoint { meta, pieces }
        };
        // Step 3's pieces ingested, never committed (as a crash between
        // the ingestion and the metadata leaves them).
        store
            .ingest_pieces(3, &[piece(1, b"orphan"), piece(9, b"orphan")])
            .unwrap();
        assert_eq!(stored(&store).get(&3), Some(&2));
        // Written again at step 3: shard 9's orphan is gone; of two pieces
        // of shard 1, the later is kept (as a batch keeps it).
        store
            .put(&checkpoint(
                3,
                vec![piece(2, b"b"), piece(1, b"old"), piece(1, b"a")],
            ))
            .unwrap();
        let got = store.pieces(3, None).unwrap().unwrap();
        let got: Vec<(u32, &[u8])> = got.iter().map(|p| (p.shard, &p.state[..])).collect();
        assert_eq!(got, vec![(1, &b"a"[..]), (2, &b"b"[..])]);
        // An orphan below later checkpoints is collected with them.
        store.ingest_pieces(4, &[piece(5, b"orphan")]).unwrap();
        for step in 5..5 + KEPT as u64 {
            store.put(&checkpoint(step, vec![piece(0, b"x")])).unwrap();
        }
        assert_eq!(
            stored(&store).keys().min(),
            Some(&5),
            "{:?}",
            stored(&store)
        );
        drop(store);
        let store = open();
        let last = 4 + KEPT as u64;
        let got = store.pieces(last, None).unwrap().unwrap();
        assert_eq!((got.len(), &got[0].state[..]), (1, &b"x"[..]));
        let beside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            !beside.iter().any(|n| n.to_string_lossy().ends_with(".sst")),
            "{beside:?}"
        );
        // A committed step written again goes through the batch, never
        // deleting its pieces first: with the table file's place taken (a
        // directory, which no ingestion gets past), writing the newest
        // step again succeeds, and a new step fails, leaving it whole.
        std::fs::create_dir(dir.path().join("checkpoint-pieces.sst")).unwrap();
        let again = checkpoint(last, vec![piece(0, b"y"), piece(3, b"z")]);
        store.put(&again).unwrap();
        assert!(
            store
                .put(&checkpoint(last + 1, vec![piece(0, b"w")]))
                .is_err()
        );
        assert_eq!(store.latest_meta().unwrap().map(|m| m.step), Some(last));
        let got = store.pieces(last, None).unwrap().unwrap();
        let got: Vec<(u32, &[u8])> = got.iter().map(|p| (p.shard, &p.state[..])).collect();
        assert_eq!(got, vec![(0, &b"y"[..]), (3, &b"z"[..])]);
    }

    /// Stored pieces (`s` keys) per step.
    fn stored(store: &RocksCheckpointStore) -> BTreeMap<u64, usize> {
        let cf = db::cf(&store.db, CF_CHECKPOINTS).unwrap();
        let mut out = BTreeMap::new();
        for item in store
            .db
            .iterator_cf(cf, IteratorMode::From(b"s", Direction::Forward))
        {
            let (k, _) = item.unwrap();
            if !k.starts_with(b"s") {
                break;
            }
            *out.entry(u64::from_be_bytes(k[1..9].try_into().unwrap()))
                .or_default() += 1;
        }
        out
    }

    #[test]
    fn carried_pieces_are_stored_once_and_collected_when_unreferenced() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksCheckpointStore::open(db::open(dir.path()).unwrap());
        let meta = |step| {
            let mut m = store_meta();
            m.step = step;
            m
        };
        let piece = |shard, state: &str| StatePiece {
            shard,
            worker: 0,
            state: state.as_bytes().to_vec(),
        };
        store
            .put(&Checkpoint {
                meta: meta(1),
                pieces: (0..10).map(|s| piece(s, "base")).collect(),
            })
            .unwrap();
        // Each later checkpoint rewrites one shard and carries the rest.
        for step in 2..6u64 {
            let changed = step as u32;
            let base = store.get(step - 1).unwrap().unwrap();
            store
                .put_carrying(
                    &Checkpoint {
                        meta: meta(step),
                        pieces: vec![piece(changed, "new")],
                    },
                    &Carried {
                        from: step - 1,
                        pieces: base
                            .pieces
                            .iter()
                            .filter(|p| p.shard != changed)
                            .map(|p| (p.shard, p.worker))
                            .collect(),
                    },
                )
                .unwrap();
            let now = store.get(step).unwrap().unwrap();
            assert_eq!(now.pieces.len(), 10);
            assert_eq!(
                now.pieces.iter().filter(|p| p.state == b"new").count(),
                step as usize - 1
            );
        }
        // Kept: 4 and 5. Of step 1's pieces, shards 2..=4 were rewritten
        // before checkpoint 4 (collected); shard 5 is still carried by 4;
        // steps 2..=5 each wrote one shard, never rewritten since.
        let now = stored(&store);
        assert_eq!(now.get(&1), Some(&7), "shards 0, 1, 5..=9 of step 1");
        assert_eq!(now.get(&2), Some(&1));
        assert_eq!(now.get(&3), Some(&1));
        assert_eq!(now.get(&4), Some(&1));
        assert_eq!(now.get(&5), Some(&1));
        // A whole checkpoint, twice: nothing refers to the old pieces.
        let whole = store.get(5).unwrap().unwrap();
        for step in [6, 7] {
            store
                .put(&Checkpoint {
                    meta: meta(step),
                    pieces: whole.pieces.clone(),
                })
                .unwrap();
        }
        let now = stored(&store);
        assert_eq!(now.keys().copied().collect::<Vec<_>>(), vec![6, 7]);
    }

    fn store_meta() -> CheckpointMeta {
        let shape = sluice_core::PipelineShape::new(
            &sluice_core::CircuitPorts {
                inputs: vec!["in".into()],
                outputs: vec![],
                snapshot_version: 1,
                operators: Vec::new(),
            },
            1,
            |_| 1,
        )
        .unwrap();
        CheckpointMeta {
            step: 0,
            frontiers: vec![sluice_core::Frontier::default()],
            snapshot_version: 1,
            layout: sluice_core::Layout::initial(&shape),
        }
    }
}
