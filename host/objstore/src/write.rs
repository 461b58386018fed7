//! Writing a checkpoint, in named steps: checked against its layout and
//! the committed checkpoints; its pieces resolved to segments (carried
//! ones to an earlier checkpoint's, staged ones to those other hosts
//! wrote, its own to new ones); the segments uploaded and the staged ones
//! checked; then its manifest written — the commit, or with a ledger, the
//! manifest the ledger's record commits; then collection.

use crate::error::{backend_error, invalid};
use crate::manifest::{FORMAT, Manifest, PieceRef, ledgered_name, plain_name};
use crate::segment::{is_segment_of, nonce, piece_refs, segment};
use crate::store::ObjectCheckpointStore;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sluice_storage::{Carried, Checkpoint, CheckpointMeta, Result, Staged, StorageError};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A segment to upload: where, and its bytes.
type Upload = (Path, Vec<u8>);

/// A staged segment to check: where, and how many bytes it must hold.
type Expected = (Path, u64);

/// A manifest being assembled: the segments its pieces lie in, each
/// listed once, and where each piece lies.
#[derive(Default)]
struct Draft {
    /// [`Manifest::segments`], in the order first named.
    segments: Vec<String>,
    /// Each segment's index in `segments`.
    index: BTreeMap<String, u32>,
    /// Where the pieces lie, in the order added.
    refs: Vec<PieceRef>,
}

impl Draft {
    /// The index of segment `name` in the list, added if new.
    fn intern(&mut self, name: &str) -> u32 {
        let segments = &mut self.segments;
        *self.index.entry(name.to_owned()).or_insert_with(|| {
            segments.push(name.to_owned());
            (segments.len() - 1) as u32
        })
    }

    /// The manifest of the checkpoint `meta` describes.
    fn into_manifest(mut self, meta: CheckpointMeta) -> Manifest {
        // Per (shard, worker): carried pieces first (oldest first), then
        // its own (a delta on top of them). The sort is stable.
        self.refs.sort_by_key(|r| (r.shard, r.worker));
        Manifest {
            format: FORMAT,
            meta,
            segments: self.segments,
            pieces: self.refs,
        }
    }
}

impl ObjectCheckpointStore {
    /// Writes and commits `checkpoint`: its own pieces, the pieces other
    /// hosts `staged`, and those it `carried` over from an earlier
    /// checkpoint; then collects what no kept checkpoint needs.
    pub(crate) fn write(
        &self,
        checkpoint: &Checkpoint,
        staged: &[Staged],
        carried: Option<&Carried>,
    ) -> Result<()> {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let step = checkpoint.meta.step;
        check_layout(checkpoint)?;
        let steps = self.steps()?;
        check_not_older(step, &steps)?;
        let mut draft = Draft::default();
        if let Some(carried) = carried {
            self.add_carried(step, &steps, carried, &mut draft)?;
        }
        let expected = self.add_staged(checkpoint, staged, &mut draft)?;
        let nonce = nonce();
        let uploads = self.add_own(checkpoint, nonce, &mut draft);
        let encoded = draft.into_manifest(checkpoint.meta.clone()).encode()?;
        let manifest_name = match self.ledger {
            Some(_) => ledgered_name(step, nonce),
            None => plain_name(step),
        };
        let manifest_path = self.child("manifests", &manifest_name);
        self.upload(step, uploads, expected, manifest_path, encoded)?;
        // With a ledger, the commit: refused to a fenced committer, whose
        // manifest is then an orphan (never read, collected later).
        if let Some(ledger) = &self.ledger {
            ledger.record_checkpoint(step, &manifest_name)?;
        }
        // Collection: a failure here leaves garbage, never a wrong
        // checkpoint; the next commit collects it.
        if let Err(e) = self.collect() {
            tracing::warn!(store = %self.describe, error = %e, "collecting old checkpoints failed");
        }
        Ok(())
    }

    /// Adds to `draft` the pieces `carried` names, resolved to the segments
    /// that hold them in the manifest of checkpoint `carried.from` — which
    /// must be one of the committed `steps`, other than `step`, and hold
    /// every one of them.
    fn add_carried(
        &self,
        step: u64,
        steps: &[u64],
        carried: &Carried,
        draft: &mut Draft,
    ) -> Result<()> {
        let not_committed = || {
            invalid(
                step,
                format!(
                    "it carries pieces of checkpoint {}, which is not an earlier committed \
                     checkpoint",
                    carried.from
                ),
            )
        };
        if carried.from == step || !steps.contains(&carried.from) {
            return Err(not_committed());
        }
        let base = self.manifest(carried.from)?.ok_or_else(not_committed)?;
        let wanted: BTreeSet<(u32, u32)> = carried.pieces.iter().copied().collect();
        let mut found = BTreeSet::new();
        for p in &base.pieces {
            if wanted.contains(&(p.shard, p.worker)) {
                let name =
                    base.segments
                        .get(p.segment as usize)
                        .ok_or_else(|| StorageError::Corrupt {
                            what: format!("manifest of checkpoint {}", carried.from),
                            message: "a piece in a segment it does not list".into(),
                        })?;
                let segment = draft.intern(name);
                draft.refs.push(PieceRef { segment, ..*p });
                found.insert((p.shard, p.worker));
            }
        }
        if let Some((shard, worker)) = wanted.difference(&found).next() {
            return Err(invalid(
                step,
                format!(
                    "it carries the piece of shard {shard} of worker {worker} of checkpoint \
                     {}, which has none",
                    carried.from
                ),
            ));
        }
        Ok(())
    }

    /// Adds to `draft` the pieces other hosts staged for `checkpoint`,
    /// each segment named for its worker and step; what their segments
    /// must be in the store (checked before the manifest names them).
    fn add_staged(
        &self,
        checkpoint: &Checkpoint,
        staged: &[Staged],
        draft: &mut Draft,
    ) -> Result<Vec<Expected>> {
        let step = checkpoint.meta.step;
        let workers = checkpoint.meta.layout.workers;
        let mut expected: Vec<Expected> = Vec::with_capacity(staged.len());
        for st in staged {
            // A worker with nothing to write staged no segment.
            if st.step == step && st.worker < workers && st.pieces.is_empty() {
                continue;
            }
            if st.step != step
                || st.worker >= workers
                || !is_segment_of(&st.segment, step, st.worker)
            {
                return Err(invalid(
                    step,
                    format!(
                        "a staged segment {:?} that is not worker {}'s of this step",
                        st.segment, st.worker
                    ),
                ));
            }
            let segment = draft.intern(&st.segment);
            draft.refs.extend(piece_refs(st, segment));
            expected.push((self.child("segments", &st.segment), st.bytes()));
        }
        Ok(expected)
    }

    /// Adds to `draft` the pieces `checkpoint` holds itself: one segment
    /// per worker (named with `nonce`), described as a host staging them
    /// would, and kept in this host's copy; the segments to upload.
    fn add_own(&self, checkpoint: &Checkpoint, nonce: u64, draft: &mut Draft) -> Vec<Upload> {
        let step = checkpoint.meta.step;
        let mut by_worker: BTreeMap<u32, Vec<(u32, &[u8])>> = BTreeMap::new();
        for p in &checkpoint.pieces {
            by_worker
                .entry(p.worker)
                .or_default()
                .push((p.shard, p.state.as_slice()));
        }
        let mut uploads = Vec::with_capacity(by_worker.len());
        for (worker, pieces) in by_worker {
            let (own, bytes) = segment(step, nonce, worker, &pieces);
            let index = draft.intern(&own.segment);
            draft.refs.extend(piece_refs(&own, index));
            self.cache_put(&own.segment, &bytes);
            uploads.push((self.child("segments", &own.segment), bytes));
        }
        uploads
    }

    /// Uploads the segments of checkpoint `step` and checks the staged
    /// ones, in parallel, then writes its manifest (`encoded`) at
    /// `manifest_path`: without a ledger, the commit.
    fn upload(
        &self,
        step: u64,
        uploads: Vec<Upload>,
        expected: Vec<Expected>,
        manifest_path: Path,
        encoded: Vec<u8>,
    ) -> Result<()> {
        let store = self.store.clone();
        self.run(async move {
            // The segments in parallel (and the staged ones checked), then
            // the manifest: the commit.
            let puts = uploads
                .into_iter()
                .map(|(path, bytes)| put_segment(store.clone(), path, bytes));
            let heads = expected
                .into_iter()
                .map(|(path, len)| check_staged(store.clone(), step, path, len));
            let (puts, heads) = futures::future::join(
                futures::future::join_all(puts),
                futures::future::join_all(heads),
            )
            .await;
            for r in puts.into_iter().chain(heads) {
                r?;
            }
            store
                .put(&manifest_path, PutPayload::from(encoded))
                .await
                .map_err(backend_error(format!(
                    "committing checkpoint {step} ({manifest_path})"
                )))?;
            Ok(())
        })
    }
}

/// Refuses a checkpoint whose frontiers or pieces do not fit its layout's
/// workers.
fn check_layout(checkpoint: &Checkpoint) -> Result<()> {
    let step = checkpoint.meta.step;
    let workers = checkpoint.meta.layout.workers;
    if checkpoint.meta.frontiers.len() != workers as usize {
        return Err(invalid(
            step,
            format!(
                "{} frontiers for {workers} workers",
                checkpoint.meta.frontiers.len()
            ),
        ));
    }
    if let Some(p) = checkpoint.pieces.iter().find(|p| p.worker >= workers) {
        return Err(invalid(
            step,
            format!("a piece of worker {} of {workers}", p.worker),
        ));
    }
    Ok(())
}

/// Refuses checkpoint `step` if it is older than the newest of the
/// committed `steps` (oldest first).
fn check_not_older(step: u64, steps: &[u64]) -> Result<()> {
    if let Some(newest) = steps.last()
        && step < *newest
    {
        return Err(invalid(
            step,
            format!("it is older than the committed checkpoint of step {newest}"),
        ));
    }
    Ok(())
}

/// Writes a segment's `bytes` at `path`.
async fn put_segment(store: Arc<dyn ObjectStore>, path: Path, bytes: Vec<u8>) -> Result<()> {
    store
        .put(&path, PutPayload::from(bytes))
        .await
        .map(|_| ())
        .map_err(backend_error(format!("writing {path}")))
}

/// Checks that the segment another host staged for checkpoint `step` is
/// at `path` and holds `len` bytes (the checkpoint is refused otherwise).
async fn check_staged(store: Arc<dyn ObjectStore>, step: u64, path: Path, len: u64) -> Result<()> {
    match store.head(&path).await {
        Ok(meta) if meta.size == len => Ok(()),
        Ok(meta) => Err(invalid(
            step,
            format!(
                "the staged segment {path} holds {} bytes, not {len}",
                meta.size
            ),
        )),
        Err(object_store::Error::NotFound { .. }) => Err(invalid(
            step,
            format!("the staged segment {path} is not in the store"),
        )),
        Err(e) => Err(backend_error(format!("checking {path}"))(e)),
    }
}
