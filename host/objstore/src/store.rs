//! The store itself: [`ObjectCheckpointStore`], opening it (on a URL or
//! an object store), the id that gives it a location, the runtime its
//! requests run on, and the [`CheckpointStore`] methods, which call on the
//! other files' steps (writing, reading, the host's copy, collection).
//!
//! [`CheckpointStore`]: sluice_storage::CheckpointStore

use crate::error::{BACKEND, backend_error};
use crate::manifest::PieceRef;
use crate::segment::{nonce, segment};
use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sluice_storage::{
    Carried, Checkpoint, CheckpointLedger, CheckpointMeta, CheckpointStore, ReadBytes, Result,
    Staged, StatePiece, StorageError,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Checkpoints in an object store. See the [crate documentation](crate).
///
/// The trait is synchronous (the coordinator calls it off its async
/// workers); the store runs the object store's requests on a small runtime
/// of its own, so it may be called from any thread.
pub struct ObjectCheckpointStore {
    /// The object store the checkpoints are in.
    pub(crate) store: Arc<dyn ObjectStore>,
    /// Where in it (manifests, segments and the id lie under it).
    pub(crate) prefix: Path,
    /// Where the requests run. `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
    /// One write at a time (collection reads what a write committed).
    pub(crate) lock: Mutex<()>,
    /// What the store was opened on, for messages.
    pub(crate) describe: String,
    /// Where other hosts reach the same store (`None`: nowhere).
    location: Option<String>,
    /// This host's copy of the segments it wrote, if kept (a directory).
    pub(crate) cache: Option<PathBuf>,
    /// The last step whose staging collected the copy (once per step).
    stage_collected: AtomicU64,
    /// Where commits are recorded, if not by the manifest's PUT.
    pub(crate) ledger: Option<Arc<dyn CheckpointLedger>>,
}

impl std::fmt::Debug for ObjectCheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectCheckpointStore")
            .field("store", &self.describe)
            .finish()
    }
}

impl Drop for ObjectCheckpointStore {
    fn drop(&mut self) {
        // Dropping a runtime blocks; a store may be dropped on an async
        // worker (the server drops pipelines there).
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl ObjectCheckpointStore {
    /// Opens the store a URL names:
    ///
    /// - `file:///absolute/dir`: a directory (created if missing), e.g. on
    ///   storage every host mounts;
    /// - `s3://bucket/prefix`: S3 or any S3-protocol server, configured by
    ///   the usual `AWS_*` variables (`AWS_ENDPOINT`, `AWS_ALLOW_HTTP`,
    ///   `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`);
    /// - `memory:///`: in this process only (tests).
    pub fn open(url: &str) -> Result<Self> {
        let bad = |message: String| {
            StorageError::Config(sluice_core::ConfigError::Invalid(format!(
                "checkpoint store {url:?}: {message}"
            )))
        };
        let parsed = url::Url::parse(url).map_err(|e| {
            bad(format!(
                "{e} (use file:///dir, s3://bucket/prefix or memory:///)"
            ))
        })?;
        let (store, prefix): (Arc<dyn ObjectStore>, Path) = match parsed.scheme() {
            "file" => {
                let dir = parsed
                    .to_file_path()
                    .map_err(|()| bad("not an absolute local path".into()))?;
                std::fs::create_dir_all(&dir).map_err(StorageError::io(&dir))?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                    .map_err(backend_error(format!("opening {}", dir.display())))?;
                (Arc::new(fs), Path::default())
            }
            "s3" | "s3a" => {
                let s3 = object_store::aws::AmazonS3Builder::from_env()
                    .with_url(url)
                    .build()
                    .map_err(|e| bad(e.to_string()))?;
                let prefix = Path::from_url_path(parsed.path()).map_err(|e| bad(e.to_string()))?;
                (Arc::new(s3), prefix)
            }
            "memory" => (
                Arc::new(object_store::memory::InMemory::new()),
                Path::default(),
            ),
            other => {
                return Err(bad(format!(
                    "unknown scheme {other:?} (use file:///dir, s3://bucket/prefix or memory:///)"
                )));
            }
        };
        Self::new(store, prefix, url)
    }

    /// A store over `store`, under `prefix`; `describe` names it in
    /// messages.
    ///
    /// Its [location](CheckpointStore::location) is `describe` and the id
    /// the store holds (`store-id` under the prefix, written by the first
    /// host that opens it): two hosts have the same location only if they
    /// read the same id — the same URL on two machines whose `file://`
    /// directories are not shared, or whose S3 settings differ, does not
    /// pass for one store. A store whose id cannot be read or written has
    /// no location (its hosts' workers then send their pieces).
    pub fn new(store: Arc<dyn ObjectStore>, prefix: Path, describe: &str) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sluice-objstore")
            .enable_all()
            .build()
            .map_err(StorageError::io("an object store runtime"))?;
        Ok(ObjectCheckpointStore {
            store,
            prefix,
            runtime: Some(runtime),
            lock: Mutex::new(()),
            describe: describe.to_owned(),
            location: None,
            cache: None,
            stage_collected: AtomicU64::new(0),
            ledger: None,
        })
        .map(|mut s: ObjectCheckpointStore| {
            s.location = match s.identify() {
                Ok(id) => Some(format!("{describe}#{id}")),
                Err(e) => {
                    tracing::warn!(store = describe, error = %e, "the store's id cannot be read: other hosts will send their checkpoint pieces here");
                    None
                }
            };
            s
        })
    }

    /// The id the store holds, written first if it holds none. Two hosts
    /// racing to write it may both succeed on a store without conditional
    /// writes; each reads back what is there, so at worst one of them sees
    /// another id than the other (and sends its pieces: slower, not wrong).
    fn identify(&self) -> Result<String> {
        let store = self.store.clone();
        let path = self.prefix.clone().join("store-id");
        let id = format!("{:016x}{:016x}", nonce(), nonce());
        self.run(async move {
            let read = |store: Arc<dyn ObjectStore>, path: Path| async move {
                match store.get(&path).await {
                    Ok(got) => got
                        .bytes()
                        .await
                        .map(|b| Some(String::from_utf8_lossy(&b).into_owned()))
                        .map_err(backend_error(format!("reading {path}"))),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(backend_error(format!("reading {path}"))(e)),
                }
            };
            if let Some(id) = read(store.clone(), path.clone()).await? {
                return Ok(id);
            }
            let create = object_store::PutOptions {
                mode: object_store::PutMode::Create,
                ..Default::default()
            };
            match store
                .put_opts(&path, PutPayload::from(id.clone().into_bytes()), create)
                .await
            {
                Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => {}
                // No conditional writes here: a plain one.
                Err(object_store::Error::NotImplemented { .. })
                | Err(object_store::Error::NotSupported { .. }) => {
                    store
                        .put(&path, PutPayload::from(id.into_bytes()))
                        .await
                        .map_err(backend_error(format!("writing {path}")))?;
                }
                Err(e) => return Err(backend_error(format!("writing {path}"))(e)),
            }
            read(store, path.clone()).await?.ok_or_else(|| {
                StorageError::backend(
                    BACKEND,
                    format!("reading {path}"),
                    true,
                    "gone after writing it",
                )
            })
        })
    }

    /// Keeps a copy of every segment this host writes in directory `dir`
    /// (created if missing), and reads a segment from there when it has it
    /// (Flink's "local recovery"): a surviving host restores its workers
    /// without downloading. Segments are immutable and their names unique,
    /// so a copy is always the segment's bytes; a missing or short copy
    /// falls back to the store. The copy drops what no kept checkpoint
    /// needs when the store collects (and after staging).
    pub fn with_cache(mut self, dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(StorageError::io(&dir))?;
        self.cache = Some(dir);
        Ok(self)
    }

    /// Commits checkpoints through `ledger`: a checkpoint is committed when
    /// the ledger records its manifest (written first, under a name of its
    /// own), and only recorded checkpoints are read — so a committer that
    /// the ledger fenced commits nothing, whatever it writes to the store.
    /// Every host of a pipeline must open its store with the same ledger
    /// (manifests written without one are not read with one, nor the other
    /// way round).
    pub fn with_ledger(mut self, ledger: Arc<dyn CheckpointLedger>) -> Self {
        self.ledger = Some(ledger);
        self
    }

    /// Runs `f` on the store's runtime and waits for it (from any thread).
    pub(crate) fn run<T: Send + 'static>(
        &self,
        f: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let runtime = self.runtime.as_ref().expect("present until dropped");
        futures::executor::block_on(runtime.spawn(f)).map_err(|e| {
            StorageError::backend(BACKEND, "an object store request", true, e.to_string())
        })?
    }

    /// The path of object `name` in directory `dir` (under the prefix).
    pub(crate) fn child(&self, dir: &str, name: &str) -> Path {
        self.prefix.clone().join(dir).join(name)
    }

    /// Names of the objects directly in `dir` (under the prefix).
    pub(crate) fn names(&self, dir: &'static str) -> Result<Vec<String>> {
        let store = self.store.clone();
        let path = self.prefix.clone().join(dir);
        self.run(async move {
            let mut out = Vec::new();
            let mut listing = store.list(Some(&path));
            while let Some(item) = listing.next().await {
                let meta = item.map_err(backend_error(format!("listing {path}")))?;
                if let Some(name) = meta.location.filename() {
                    out.push(name.to_owned());
                }
            }
            out.sort();
            Ok(out)
        })
    }
}

impl CheckpointStore for ObjectCheckpointStore {
    fn put(&self, checkpoint: &Checkpoint) -> Result<()> {
        self.write(checkpoint, &[], None)
    }

    fn put_carrying(&self, checkpoint: &Checkpoint, carried: &Carried) -> Result<()> {
        self.write(checkpoint, &[], Some(carried))
    }

    fn put_staged(
        &self,
        checkpoint: &Checkpoint,
        staged: &[Staged],
        carried: Option<&Carried>,
    ) -> Result<()> {
        self.write(checkpoint, staged, carried)
    }

    fn location(&self) -> Option<String> {
        self.location.clone()
    }

    fn stage(&self, step: u64, worker: u32, pieces: &[(u32, Vec<u8>)]) -> Result<Staged> {
        if pieces.is_empty() {
            // Nothing changed (an incremental checkpoint): no segment.
            return Ok(Staged {
                step,
                worker,
                segment: String::new(),
                pieces: Vec::new(),
            });
        }
        let pieces: Vec<(u32, &[u8])> = pieces.iter().map(|(s, b)| (*s, b.as_slice())).collect();
        let (staged, bytes) = segment(step, nonce(), worker, &pieces);
        self.cache_put(&staged.segment, &bytes);
        let store = self.store.clone();
        let path = self.child("segments", &staged.segment);
        self.run(async move {
            store
                .put(&path, PutPayload::from(bytes))
                .await
                .map(|_| ())
                .map_err(backend_error(format!("writing {path}")))
        })?;
        // Once per step, drop from the copy what no kept checkpoint needs
        // (this host may never commit one, so never collect otherwise).
        let due =
            self.cache.is_some() && self.stage_collected.fetch_max(step, Ordering::Relaxed) < step;
        if due {
            let collected = self.steps().and_then(|steps| self.kept(&steps));
            match collected {
                Ok(Some((oldest, referenced))) => self.cache_collect(oldest, &referenced),
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(store = %self.describe, error = %e, "collecting the local copy failed")
                }
            }
        }
        Ok(staged)
    }

    fn local_bytes(&self, step: u64) -> Result<Vec<(u32, u64)>> {
        let (Some(dir), Some(manifest)) = (&self.cache, self.manifest(step)?) else {
            return Ok(Vec::new());
        };
        let sizes: Vec<Option<u64>> = manifest
            .segments
            .iter()
            .map(|name| std::fs::metadata(dir.join(name)).ok().map(|m| m.len()))
            .collect();
        let mut bytes: BTreeMap<u32, u64> = BTreeMap::new();
        for p in &manifest.pieces {
            let held = sizes.get(p.segment as usize).copied().flatten();
            if held.is_some_and(|len| len >= p.offset + p.len) {
                *bytes.entry(p.worker).or_default() += p.len;
            }
        }
        Ok(bytes.into_iter().collect())
    }

    fn keys(&self, step: u64) -> Result<Option<Vec<(u32, u32)>>> {
        Ok(self
            .manifest(step)?
            .map(|m| m.pieces.iter().map(|p| (p.shard, p.worker)).collect()))
    }

    fn worker_pieces(
        &self,
        step: u64,
        worker: u32,
    ) -> Result<Option<(Vec<StatePiece>, ReadBytes)>> {
        let Some(manifest) = self.manifest(step)? else {
            return Ok(None);
        };
        let refs: Vec<PieceRef> = manifest
            .pieces
            .iter()
            .filter(|p| p.worker == worker)
            .copied()
            .collect();
        self.read(step, &manifest, refs).map(Some)
    }

    fn latest_meta(&self) -> Result<Option<CheckpointMeta>> {
        // Newest first: a manifest collected between the listing and the
        // read (another writer) falls back to the one before.
        for step in self.steps()?.into_iter().rev() {
            if let Some(m) = self.manifest(step)? {
                return Ok(Some(m.meta));
            }
        }
        Ok(None)
    }

    fn meta(&self, step: u64) -> Result<Option<CheckpointMeta>> {
        Ok(self.manifest(step)?.map(|m| m.meta))
    }

    fn pieces(&self, step: u64, shards: Option<&[u32]>) -> Result<Option<Vec<StatePiece>>> {
        let Some(manifest) = self.manifest(step)? else {
            return Ok(None);
        };
        let wanted: Option<BTreeSet<u32>> = shards.map(|s| s.iter().copied().collect());
        let refs: Vec<PieceRef> = manifest
            .pieces
            .iter()
            .filter(|p| wanted.as_ref().is_none_or(|w| w.contains(&p.shard)))
            .copied()
            .collect();
        self.read(step, &manifest, refs)
            .map(|(pieces, _)| Some(pieces))
    }

    fn list(&self) -> Result<Vec<u64>> {
        self.steps()
    }
}
