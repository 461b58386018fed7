//! Reading committed checkpoints: which steps are committed, the manifest
//! of one (by the ledger's record or its own name), and the pieces it
//! names — from this host's copy of a segment when it has one, else by
//! ranged reads of the store.

use crate::error::backend_error;
use crate::manifest::{Manifest, PieceRef, plain_name, step_of};
use crate::store::ObjectCheckpointStore;
use object_store::ObjectStoreExt;
use sluice_storage::checkpoint::KEPT;
use sluice_storage::{ReadBytes, Result, StatePiece, StorageError};
use std::collections::BTreeMap;
use std::ops::Range;

impl ObjectCheckpointStore {
    /// The name of committed checkpoint `step`'s manifest: the ledger's
    /// record, else the step's own name (`None`: not committed).
    pub(crate) fn manifest_name(&self, step: u64) -> Result<Option<String>> {
        match &self.ledger {
            Some(ledger) => ledger.recorded_checkpoint(step),
            None => Ok(Some(plain_name(step))),
        }
    }

    /// Steps of the committed checkpoints, oldest first (with a ledger,
    /// the [`KEPT`] newest it recorded: older ones are being collected).
    pub(crate) fn steps(&self) -> Result<Vec<u64>> {
        if let Some(ledger) = &self.ledger {
            return Ok(ledger
                .recorded_checkpoints(KEPT)?
                .into_iter()
                .map(|(step, _)| step)
                .collect());
        }
        let mut steps: Vec<u64> = self
            .names("manifests")?
            .iter()
            .filter(|n| n.len() == 20)
            .filter_map(|n| step_of(n))
            .collect();
        steps.sort_unstable();
        Ok(steps)
    }

    /// The manifest of committed checkpoint `step` (`None`: not committed,
    /// or no longer there).
    pub(crate) fn manifest(&self, step: u64) -> Result<Option<Manifest>> {
        let Some(name) = self.manifest_name(step)? else {
            return Ok(None);
        };
        let store = self.store.clone();
        let path = self.child("manifests", &name);
        let bytes = self.run(async move {
            match store.get(&path).await {
                Ok(got) => Ok(Some(
                    got.bytes()
                        .await
                        .map_err(backend_error(format!("reading {path}")))?,
                )),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(backend_error(format!("reading {path}"))(e)),
            }
        })?;
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        Manifest::decode(step, &bytes).map(Some)
    }

    /// Reads the pieces `refs` name from `manifest`'s segments, in order.
    pub(crate) fn read(
        &self,
        step: u64,
        manifest: &Manifest,
        refs: Vec<PieceRef>,
    ) -> Result<(Vec<StatePiece>, ReadBytes)> {
        let mut read = ReadBytes::default();
        let mut by_segment: BTreeMap<u32, Vec<Range<u64>>> = BTreeMap::new();
        for r in &refs {
            by_segment
                .entry(r.segment)
                .or_default()
                .push(r.offset..r.offset + r.len);
        }
        let mut requests = Vec::with_capacity(by_segment.len());
        // Segments this host has a copy of are read from it.
        let mut local: BTreeMap<u32, BTreeMap<(u64, u64), Vec<u8>>> = BTreeMap::new();
        for (segment, ranges) in by_segment {
            let name =
                manifest
                    .segments
                    .get(segment as usize)
                    .ok_or_else(|| StorageError::Corrupt {
                        what: format!("manifest of checkpoint {step}"),
                        message: "a piece in a segment it does not list".into(),
                    })?;
            if let Some(got) = self.cache_read(name, &ranges) {
                read.local += got.iter().map(|b| b.len() as u64).sum::<u64>();
                local.insert(
                    segment,
                    ranges.iter().map(|r| (r.start, r.end)).zip(got).collect(),
                );
                continue;
            }
            requests.push((segment, self.child("segments", name), ranges));
        }
        let store = self.store.clone();
        let fetched = self.run(async move {
            let gets = requests.into_iter().map(|(segment, path, ranges)| {
                let store = store.clone();
                async move {
                    let got = if ranges.is_empty() {
                        Vec::new()
                    } else {
                        store
                            .get_ranges(&path, &ranges)
                            .await
                            .map_err(backend_error(format!("reading {path}")))?
                    };
                    Ok::<_, StorageError>((segment, ranges, got))
                }
            });
            let mut out = BTreeMap::new();
            for r in futures::future::join_all(gets).await {
                let (segment, ranges, got) = r?;
                let got: BTreeMap<(u64, u64), Vec<u8>> = ranges
                    .into_iter()
                    .map(|r| (r.start, r.end))
                    .zip(got.into_iter().map(|b| b.to_vec()))
                    .collect();
                out.insert(segment, got);
            }
            Ok(out)
        })?;
        read.fetched = fetched
            .values()
            .flat_map(|s| s.values())
            .map(|b| b.len() as u64)
            .sum();
        let mut fetched = fetched;
        fetched.extend(local);
        refs.into_iter()
            .map(|r| {
                let bytes = fetched
                    .get(&r.segment)
                    .and_then(|s| s.get(&(r.offset, r.offset + r.len)))
                    .filter(|b| b.len() as u64 == r.len)
                    .ok_or_else(|| StorageError::Corrupt {
                        what: format!("checkpoint of step {step}"),
                        message: format!(
                            "the piece of shard {} of worker {} is missing or short",
                            r.shard, r.worker
                        ),
                    })?;
                Ok(StatePiece {
                    shard: r.shard,
                    worker: r.worker,
                    state: bytes.clone(),
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(|pieces| (pieces, read))
    }
}
