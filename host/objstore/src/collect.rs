//! Collection: once a checkpoint is committed, the manifests of all but
//! the [`KEPT`] newest checkpoints are deleted, then the segments below the
//! oldest kept step that no kept manifest references (those of dropped
//! checkpoints, and of writes that crashed before their manifest).
//! Nothing else under the prefix is listed or deleted: components stay.
//!
//! [`KEPT`]: sluice_storage::checkpoint::KEPT

use crate::error::backend_error;
use crate::manifest::step_of;
use crate::store::ObjectCheckpointStore;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use sluice_storage::Result;
use sluice_storage::checkpoint::KEPT;
use std::collections::BTreeSet;

impl ObjectCheckpointStore {
    /// Of the committed checkpoints `steps` (oldest first), the oldest
    /// step kept (the [`KEPT`] newest) and the segments their manifests
    /// reference; `None` when there is none.
    pub(crate) fn kept(&self, steps: &[u64]) -> Result<Option<(u64, BTreeSet<String>)>> {
        let kept = &steps[steps.len().saturating_sub(KEPT)..];
        let Some(oldest) = kept.first() else {
            return Ok(None);
        };
        let mut referenced = BTreeSet::new();
        for step in kept {
            if let Some(m) = self.manifest(*step)? {
                referenced.extend(m.segments);
            }
        }
        Ok(Some((*oldest, referenced)))
    }

    /// Deletes all but the [`KEPT`] newest manifests (every manifest of an
    /// older step), then every segment below the oldest kept step that none
    /// of them references.
    pub(crate) fn collect(&self) -> Result<()> {
        let steps = self.steps()?;
        let Some((oldest_kept, referenced)) = self.kept(&steps)? else {
            return Ok(());
        };
        self.cache_collect(oldest_kept, &referenced);
        let mut doomed: Vec<Path> = self
            .names("manifests")?
            .into_iter()
            .filter(|n| step_of(n).is_some_and(|s| s < oldest_kept))
            .map(|n| self.child("manifests", &n))
            .collect();
        let manifests = doomed.len();
        doomed.extend(
            self.names("segments")?
                .into_iter()
                .filter(|n| step_of(n).is_some_and(|s| s < oldest_kept))
                .filter(|n| !referenced.contains(n))
                .map(|n| self.child("segments", &n)),
        );
        if doomed.is_empty() {
            return Ok(());
        }
        let store = self.store.clone();
        self.run(async move {
            // Manifests first: a checkpoint is gone before its bytes are.
            for (i, path) in doomed.iter().enumerate() {
                if i == manifests {
                    break;
                }
                match store.delete(path).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(backend_error(format!("deleting {path}"))(e)),
                }
            }
            let deletes = doomed[manifests..].iter().map(|path| {
                let store = store.clone();
                async move {
                    match store.delete(path).await {
                        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                        Err(e) => Err(backend_error(format!("deleting {path}"))(e)),
                    }
                }
            });
            for r in futures::future::join_all(deletes).await {
                r?;
            }
            Ok(())
        })
    }
}
