//! Checkpoints in an object store: a shared directory, or S3 (any
//! S3-protocol server) through the `object_store` crate.
//!
//! A host that runs a pipeline keeps its checkpoints here when another
//! machine must be able to take the pipeline over (its logs on Kafka):
//! nothing of the pipeline then lives only on one machine.
//!
//! # Layout
//!
//! Under the store's prefix:
//!
//! - `segments/{step:020}-{nonce:016x}-w{worker:05}`: the pieces worker
//!   `worker` wrote for checkpoint `step`, concatenated. Immutable: a
//!   checkpoint written again (same step) writes new segments (the nonce
//!   differs), so a manifest never points into bytes that changed.
//! - `manifests/{step:020}`: the commit mark of checkpoint `step` — its
//!   metadata and, per piece in restore order, the segment and byte range
//!   that hold it. A piece an incremental checkpoint carries is a reference
//!   to the segment an earlier checkpoint wrote, so it is stored once.
//!   Written last, in one PUT (atomic on S3 and on a local file system,
//!   which writes a temporary file and renames it).
//! - `manifests/{step:020}-{nonce:016x}`, instead, for a store whose commits
//!   a [`CheckpointLedger`] decides ([`ObjectCheckpointStore::with_ledger`]:
//!   a pipeline on Kafka). The PUT then commits nothing: the checkpoint is
//!   committed when the ledger records that manifest's name, which a
//!   committer another host has fenced cannot do. Names are never reused,
//!   so a fenced committer's late manifest overwrites nothing; it is an
//!   orphan, collected like the segments of a write that crashed.
//!
//! # Collection
//!
//! After committing a manifest, the store keeps the [`KEPT`] newest
//! manifests, deletes the others (and, with a ledger, every manifest of an
//! older step, recorded or not), then deletes every segment of a step
//! below the oldest kept checkpoint that no kept manifest references — the
//! segments of dropped checkpoints, and those of a write that crashed
//! before its manifest. Segments of newer steps are never collected: they
//! may belong to a checkpoint being written.
//!
//! # Reading some shards
//!
//! [`CheckpointStore::pieces`] with shards reads the manifest, then only the
//! byte ranges of those shards' pieces (ranged GETs, coalesced by the
//! client): a host taking a few shards over downloads only those.

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use sluice_storage::checkpoint::KEPT;
use sluice_storage::{
    Carried, Checkpoint, CheckpointLedger, CheckpointMeta, CheckpointStore, ReadBytes, Result,
    Staged, StatePiece, StorageError,
};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What backend errors are reported as.
const BACKEND: &str = "object store";

/// The manifest format this build writes and reads.
const FORMAT: u32 = 1;

/// The commit mark of one checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Manifest {
    /// [`FORMAT`].
    format: u32,
    meta: CheckpointMeta,
    /// The segments its pieces lie in (its own and earlier checkpoints').
    segments: Vec<String>,
    /// Its pieces, ordered by (shard, worker), several of one key in
    /// restore order (a whole piece, then deltas).
    pieces: Vec<PieceRef>,
}

/// Where one piece lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct PieceRef {
    shard: u32,
    worker: u32,
    /// Index into [`Manifest::segments`].
    segment: u32,
    offset: u64,
    len: u64,
}

/// Checkpoints in an object store. See the [crate documentation](crate).
///
/// The trait is synchronous (the coordinator calls it off its async
/// workers); the store runs the object store's requests on a small runtime
/// of its own, so it may be called from any thread.
pub struct ObjectCheckpointStore {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    /// Where the requests run. `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
    /// One write at a time (collection reads what a write committed).
    lock: Mutex<()>,
    /// What the store was opened on, for messages.
    describe: String,
    /// Where other hosts reach the same store (`None`: nowhere).
    location: Option<String>,
    /// This host's copy of the segments it wrote, if kept (a directory).
    cache: Option<PathBuf>,
    /// The last step whose staging collected the copy (once per step).
    stage_collected: AtomicU64,
    /// Where commits are recorded, if not by the manifest's PUT.
    ledger: Option<Arc<dyn CheckpointLedger>>,
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

fn backend_error(what: impl Into<String>) -> impl FnOnce(object_store::Error) -> StorageError {
    let what = what.into();
    move |e| {
        // Not found and precondition failures are answers, not outages;
        // everything else (network, throttling, server errors) may pass.
        let transient = !matches!(
            e,
            object_store::Error::NotFound { .. }
                | object_store::Error::InvalidPath { .. }
                | object_store::Error::NotSupported { .. }
                | object_store::Error::NotImplemented { .. }
                | object_store::Error::UnknownConfigurationKey { .. }
        );
        StorageError::backend(BACKEND, what, transient, e)
    }
}

fn invalid(step: u64, message: impl Into<String>) -> StorageError {
    StorageError::InvalidCheckpoint {
        step,
        message: message.into(),
    }
}

/// The step a manifest or segment file name starts with.
fn step_of(name: &str) -> Option<u64> {
    name.get(..20)?.parse().ok()
}

/// The name of worker `worker`'s segment of checkpoint `step`.
fn segment_name(step: u64, nonce: u64, worker: u32) -> String {
    format!("{step:020}-{nonce:016x}-w{worker:05}")
}

/// Whether `name` is a segment name of `worker` in checkpoint `step`
/// (names from another host are checked before they go into a manifest).
fn is_segment_of(name: &str, step: u64, worker: u32) -> bool {
    name.len() == 44
        && name
            .get(21..37)
            .and_then(|n| u64::from_str_radix(n, 16).ok())
            .is_some_and(|nonce| segment_name(step, nonce, worker) == name)
}

/// Worker `worker`'s pieces (`(shard, bytes)`, in restore order) of
/// checkpoint `step` as one segment: how it is described, and its bytes.
fn segment(step: u64, nonce: u64, worker: u32, pieces: &[(u32, &[u8])]) -> (Staged, Vec<u8>) {
    let mut bytes = Vec::with_capacity(pieces.iter().map(|(_, b)| b.len()).sum());
    for (_, state) in pieces {
        bytes.extend_from_slice(state);
    }
    let staged = Staged {
        step,
        worker,
        segment: segment_name(step, nonce, worker),
        pieces: pieces
            .iter()
            .map(|(shard, state)| (*shard, state.len() as u64))
            .collect(),
    };
    (staged, bytes)
}

/// Where the pieces `staged` describes lie, its segment being number
/// `segment` of a manifest's list.
fn piece_refs(staged: &Staged, segment: u32) -> Vec<PieceRef> {
    let mut offset = 0;
    staged
        .pieces
        .iter()
        .map(|(shard, len)| {
            let r = PieceRef {
                shard: *shard,
                worker: staged.worker,
                segment,
                offset,
                len: *len,
            };
            offset += len;
            r
        })
        .collect()
}

/// A number no other write of the same step (on any host) draws: segments
/// are immutable, so a checkpoint written again never reuses a name — and a
/// host's copy of a segment is always that segment's bytes. 64 random bits
/// (the clock and a counter should the OS source fail).
fn nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    getrandom::u64().unwrap_or_else(|_| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let count = COUNTER.fetch_add(1, Ordering::Relaxed);
        nanos ^ (u64::from(std::process::id()) << 40) ^ count.rotate_right(8)
    })
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

    /// Keeps `bytes` as this host's copy of segment `name` (best effort: a
    /// copy that cannot be written is a download later, nothing worse).
    fn cache_put(&self, name: &str, bytes: &[u8]) {
        let Some(dir) = &self.cache else {
            return;
        };
        let tmp = dir.join(format!(".{name}.tmp"));
        // Synced before it is renamed into place: after a crash a copy is
        // either missing (fetched instead) or whole, never garbage.
        let written = (|| {
            use std::io::Write;
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(bytes)?;
            file.sync_data()?;
            std::fs::rename(&tmp, dir.join(name))
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            tracing::debug!(segment = name, error = %e, "no local copy of a segment");
        }
    }

    /// `ranges` of this host's copy of segment `name`, if it has a whole
    /// one.
    fn cache_read(&self, name: &str, ranges: &[Range<u64>]) -> Option<Vec<Vec<u8>>> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = std::fs::File::open(self.cache.as_ref()?.join(name)).ok()?;
        let len = file.metadata().ok()?.len();
        ranges
            .iter()
            .map(|r| {
                if r.end > len || r.start > r.end {
                    return None;
                }
                let mut buf = vec![0; (r.end - r.start) as usize];
                file.seek(SeekFrom::Start(r.start)).ok()?;
                file.read_exact(&mut buf).ok()?;
                Some(buf)
            })
            .collect()
    }

    /// Drops from this host's copy the segments of steps below
    /// `oldest_kept` that `referenced` does not name.
    fn cache_collect(&self, oldest_kept: u64, referenced: &BTreeSet<String>) {
        let Some(dir) = &self.cache else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let stale_tmp = name.starts_with('.') && name.ends_with(".tmp");
            let name_step = step_of(name.trim_start_matches('.'));
            if name_step.is_some_and(|s| s < oldest_kept)
                && (stale_tmp || !referenced.contains(&name))
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// Of the committed checkpoints `steps` (oldest first), the oldest
    /// step kept (the [`KEPT`] newest) and the segments their manifests
    /// reference; `None` when there is none.
    fn kept(&self, steps: &[u64]) -> Result<Option<(u64, BTreeSet<String>)>> {
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

    /// Runs `f` on the store's runtime and waits for it (from any thread).
    fn run<T: Send + 'static>(
        &self,
        f: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let runtime = self.runtime.as_ref().expect("present until dropped");
        futures::executor::block_on(runtime.spawn(f)).map_err(|e| {
            StorageError::backend(BACKEND, "an object store request", true, e.to_string())
        })?
    }

    fn child(&self, dir: &str, name: &str) -> Path {
        self.prefix.clone().join(dir).join(name)
    }

    /// The name of committed checkpoint `step`'s manifest: the ledger's
    /// record, else the step's own name (`None`: not committed).
    fn manifest_name(&self, step: u64) -> Result<Option<String>> {
        match &self.ledger {
            Some(ledger) => ledger.recorded_checkpoint(step),
            None => Ok(Some(format!("{step:020}"))),
        }
    }

    /// Names of the objects directly in `dir` (under the prefix).
    fn names(&self, dir: &'static str) -> Result<Vec<String>> {
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

    /// Steps of the committed checkpoints, oldest first (with a ledger,
    /// the [`KEPT`] newest it recorded: older ones are being collected).
    fn steps(&self) -> Result<Vec<u64>> {
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

    fn manifest(&self, step: u64) -> Result<Option<Manifest>> {
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
        let manifest: Manifest = postcard::from_bytes(&bytes).map_err(StorageError::corrupt(
            format!("manifest of checkpoint {step}"),
        ))?;
        if manifest.format != FORMAT || manifest.meta.step != step {
            return Err(StorageError::Corrupt {
                what: format!("manifest of checkpoint {step}"),
                message: format!(
                    "format {} of step {} (this build reads format {FORMAT})",
                    manifest.format, manifest.meta.step
                ),
            });
        }
        Ok(Some(manifest))
    }

    fn write(
        &self,
        checkpoint: &Checkpoint,
        staged: &[Staged],
        carried: Option<&Carried>,
    ) -> Result<()> {
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
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
        let steps = self.steps()?;
        if let Some(newest) = steps.last()
            && step < *newest
        {
            return Err(invalid(
                step,
                format!("it is older than the committed checkpoint of step {newest}"),
            ));
        }
        let mut segments: Vec<String> = Vec::new();
        let mut index: BTreeMap<String, u32> = BTreeMap::new();
        let mut intern = |name: &str, segments: &mut Vec<String>| -> u32 {
            *index.entry(name.to_owned()).or_insert_with(|| {
                segments.push(name.to_owned());
                (segments.len() - 1) as u32
            })
        };
        // The carried pieces, resolved to the segments that hold them.
        let mut refs: Vec<PieceRef> = Vec::new();
        if let Some(carried) = carried {
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
                    let name = base.segments.get(p.segment as usize).ok_or_else(|| {
                        StorageError::Corrupt {
                            what: format!("manifest of checkpoint {}", carried.from),
                            message: "a piece in a segment it does not list".into(),
                        }
                    })?;
                    refs.push(PieceRef {
                        segment: intern(name, &mut segments),
                        ..*p
                    });
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
        }
        // The pieces other hosts staged: their segments must be there, as
        // long as described (checked before the manifest names them).
        let mut expected: Vec<(Path, u64)> = Vec::with_capacity(staged.len());
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
            let segment = intern(&st.segment, &mut segments);
            refs.extend(piece_refs(st, segment));
            expected.push((self.child("segments", &st.segment), st.bytes()));
        }
        // Its own pieces: one segment per worker, described as a host
        // staging them would.
        let nonce = nonce();
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
            refs.extend(piece_refs(&own, intern(&own.segment, &mut segments)));
            self.cache_put(&own.segment, &bytes);
            uploads.push((self.child("segments", &own.segment), bytes));
        }
        // Per (shard, worker): carried pieces first (oldest first), then
        // its own (a delta on top of them). The sort is stable.
        refs.sort_by_key(|r| (r.shard, r.worker));
        let manifest = Manifest {
            format: FORMAT,
            meta: checkpoint.meta.clone(),
            segments,
            pieces: refs,
        };
        let encoded = postcard::to_allocvec(&manifest).map_err(StorageError::corrupt(format!(
            "manifest of checkpoint {step}"
        )))?;
        let store = self.store.clone();
        let manifest_name = match self.ledger {
            Some(_) => format!("{step:020}-{nonce:016x}"),
            None => format!("{step:020}"),
        };
        let manifest_path = self.child("manifests", &manifest_name);
        self.run(async move {
            // The segments in parallel (and the staged ones checked), then
            // the manifest: the commit.
            let puts = uploads.into_iter().map(|(path, bytes)| {
                let store = store.clone();
                async move {
                    store
                        .put(&path, PutPayload::from(bytes))
                        .await
                        .map(|_| ())
                        .map_err(backend_error(format!("writing {path}")))
                }
            });
            let heads = expected.into_iter().map(|(path, len)| {
                let store = store.clone();
                async move {
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
            });
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
        })?;
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

    /// Deletes all but the [`KEPT`] newest manifests (every manifest of an
    /// older step), then every segment below the oldest kept step that none
    /// of them references.
    fn collect(&self) -> Result<()> {
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

    /// Reads the pieces `refs` name from `manifest`'s segments, in order.
    fn read(
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

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_storage::conformance;

    #[test]
    fn passes_the_checkpoint_conformance_suite_in_memory() {
        conformance::checkpoint_store(&|| {
            Arc::new(ObjectCheckpointStore::open("memory:///").unwrap())
        });
    }

    #[test]
    fn passes_the_checkpoint_conformance_suite_with_a_ledger() {
        conformance::checkpoint_store(&|| {
            Arc::new(
                ObjectCheckpointStore::open("memory:///")
                    .unwrap()
                    .with_ledger(Arc::new(sluice_storage::MemoryLedger::default())),
            )
        });
    }

    /// Two committers of one pipeline on one store: once the ledger has
    /// fenced the first, it commits no checkpoint whatever it writes, its
    /// manifest overwrites nothing of the second's, and is collected.
    #[test]
    fn a_committer_the_ledger_fenced_commits_no_checkpoint() {
        let shared: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let ledger = sluice_storage::MemoryLedger::default();
        let open = |ledger: &sluice_storage::MemoryLedger| {
            ObjectCheckpointStore::new(shared.clone(), Path::default(), "memory")
                .unwrap()
                .with_ledger(Arc::new(ledger.fence()))
        };
        let old = open(&ledger);
        old.put(&checkpoint(1, vec![piece(0, 0, b"one")])).unwrap();
        let new = open(&ledger);
        assert_eq!(new.list().unwrap(), vec![1]);
        // The old committer wakes and writes checkpoint 2: refused.
        let stale = checkpoint(2, vec![piece(0, 0, b"stale")]);
        let err = old.put(&stale).unwrap_err();
        assert!(matches!(err, StorageError::FencedProducer { .. }), "{err}");
        assert_eq!(new.list().unwrap(), vec![1]);
        assert_eq!(new.latest_meta().unwrap().map(|m| m.step), Some(1));
        // The new committer writes step 2 too; the stale manifest (also of
        // step 2) changes nothing of it, before or after.
        let fresh = checkpoint(2, vec![piece(0, 0, b"fresh")]);
        new.put(&fresh).unwrap();
        assert_eq!(old.put(&stale).unwrap_err().to_string(), err.to_string());
        assert_eq!(new.get(2).unwrap(), Some(fresh.clone()));
        assert_eq!(
            old.get(2).unwrap(),
            Some(fresh),
            "every reader reads the record"
        );
        // A reader without the ledger reads none of them.
        let unledgered =
            ObjectCheckpointStore::new(shared.clone(), Path::default(), "memory").unwrap();
        assert_eq!(unledgered.list().unwrap(), Vec::<u64>::new());
        // Once the kept checkpoints are past step 2, its manifests (the
        // stale one too) are collected.
        new.put(&checkpoint(3, vec![piece(0, 0, b"three")]))
            .unwrap();
        new.put(&checkpoint(4, vec![piece(0, 0, b"four")])).unwrap();
        let manifests = new.names("manifests").unwrap();
        assert_eq!(manifests.len(), 2, "{manifests:?}");
        assert!(manifests.iter().all(|n| step_of(n).is_some_and(|s| s >= 3)));
        assert_eq!(new.list().unwrap(), vec![3, 4]);
    }

    #[test]
    fn passes_the_checkpoint_conformance_suite_in_a_directory() {
        let dirs: Mutex<Vec<tempfile::TempDir>> = Mutex::new(Vec::new());
        conformance::checkpoint_store(&|| {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("file://{}", dir.path().join("store").display());
            dirs.lock().unwrap().push(dir);
            Arc::new(ObjectCheckpointStore::open(&url).unwrap())
        });
    }

    /// An S3-protocol server (scripts/test.sh starts one and names it in
    /// `SLUICE_S3_ENDPOINT`): the same suite against real S3 requests.
    #[test]
    fn passes_the_checkpoint_conformance_suite_on_s3() {
        let Some(endpoint) = s3_endpoint() else {
            return;
        };
        let n = std::sync::atomic::AtomicU32::new(0);
        let run = std::process::id();
        conformance::checkpoint_store(&|| {
            let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Arc::new(s3_store(&endpoint, &format!("conformance-{run}-{i}")))
        });
    }

    /// Two hosts over the S3 server: one location (the id written once,
    /// conditionally), pieces staged by one committed by the other.
    #[test]
    fn hosts_stage_pieces_on_s3() {
        let Some(endpoint) = s3_endpoint() else {
            return;
        };
        let prefix = format!("staging-{}-{}", std::process::id(), nonce());
        let (a, b) = (s3_store(&endpoint, &prefix), s3_store(&endpoint, &prefix));
        assert!(a.location().is_some());
        assert_eq!(a.location(), b.location());
        let whole = conformance::sample_checkpoint(4, 2);
        let staged = b.stage(4, 1, &pieces_of(&whole, 1)).unwrap();
        a.put_staged(&only(&whole, 0), &[staged], None).unwrap();
        assert_eq!(b.get(4).unwrap(), Some(whole));
    }

    /// The S3-protocol server scripts/test.sh starts, or `None` (outside
    /// CI only) to skip.
    fn s3_endpoint() -> Option<String> {
        let endpoint = std::env::var("SLUICE_S3_ENDPOINT")
            .ok()
            .filter(|e| !e.is_empty());
        if endpoint.is_none() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must run the S3 tests (SLUICE_S3_ENDPOINT is unset)"
            );
            eprintln!("skipped: no S3-protocol server (set SLUICE_S3_ENDPOINT)");
        }
        endpoint
    }

    /// A store on the test server's bucket `sluice-tests`, under `prefix`.
    fn s3_store(endpoint: &str, prefix: &str) -> ObjectCheckpointStore {
        let s3 = object_store::aws::AmazonS3Builder::new()
            .with_endpoint(endpoint)
            .with_allow_http(true)
            .with_bucket_name("sluice-tests")
            .with_region("us-east-1")
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .build()
            .unwrap();
        ObjectCheckpointStore::new(Arc::new(s3), Path::from(prefix), endpoint).unwrap()
    }

    fn piece(shard: u32, worker: u32, state: &[u8]) -> StatePiece {
        StatePiece {
            shard,
            worker,
            state: state.to_vec(),
        }
    }

    fn checkpoint(step: u64, pieces: Vec<StatePiece>) -> Checkpoint {
        let shape = sluice_core::PipelineShape {
            workers: 2,
            inputs: vec![],
            outputs: vec![],
            snapshot_version: 1,
        };
        Checkpoint {
            meta: CheckpointMeta {
                step,
                frontiers: vec![Default::default(); 2],
                snapshot_version: 1,
                layout: sluice_core::Layout::initial(&shape),
            },
            pieces,
        }
    }

    #[test]
    fn carried_pieces_are_stored_once_and_segments_collected() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let store = ObjectCheckpointStore::open(&format!("file://{}", root.display())).unwrap();
        let segments = || -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(root.join("segments"))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        store
            .put(&checkpoint(
                1,
                vec![piece(3, 0, b"a"), piece(5, 1, b"bb"), piece(9, 1, b"c")],
            ))
            .unwrap();
        assert_eq!(segments().len(), 2, "one segment per worker");
        let carry = |from, pieces: &[(u32, u32)]| Carried {
            from,
            pieces: pieces.to_vec(),
        };
        // 2 and 3 change only worker 1's shard 9: worker 0's segment of
        // step 1 stays referenced after checkpoint 1 is dropped.
        store
            .put_carrying(
                &checkpoint(2, vec![piece(9, 1, b"c2")]),
                &carry(1, &[(3, 0), (5, 1)]),
            )
            .unwrap();
        store
            .put_carrying(
                &checkpoint(3, vec![piece(9, 1, b"c3")]),
                &carry(2, &[(3, 0), (5, 1)]),
            )
            .unwrap();
        assert_eq!(store.list().unwrap(), vec![2, 3]);
        let names = segments();
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(
            names
                .iter()
                .filter(|n| n.starts_with(&format!("{:020}", 1)))
                .count()
                == 2
        );
        assert_eq!(
            store.get(3).unwrap().unwrap().pieces,
            vec![piece(3, 0, b"a"), piece(5, 1, b"bb"), piece(9, 1, b"c3")]
        );
        // Only shard 5 is read: one ranged read of step 1's segment.
        assert_eq!(
            store.pieces(3, Some(&[5])).unwrap().unwrap(),
            vec![piece(5, 1, b"bb")]
        );
        // A whole checkpoint twice: everything older is collected.
        store.put(&checkpoint(4, vec![piece(3, 0, b"x")])).unwrap();
        store.put(&checkpoint(5, vec![piece(3, 0, b"y")])).unwrap();
        let names = segments();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.iter().all(|n| step_of(n).unwrap() >= 4));
    }

    #[test]
    fn a_write_that_crashed_before_its_manifest_is_collected_later() {
        let store = ObjectCheckpointStore::open("memory:///").unwrap();
        store.put(&checkpoint(1, vec![piece(1, 0, b"a")])).unwrap();
        // A segment of step 2 with no manifest: a crashed write.
        let orphan = store.child("segments", &format!("{:020}-{:016x}-w{:05}", 2, 7, 0));
        let s = store.store.clone();
        let o = orphan.clone();
        store
            .run(async move {
                s.put(&o, PutPayload::from(b"lost".to_vec()))
                    .await
                    .map_err(backend_error("test"))
            })
            .unwrap();
        assert!(store.names("segments").unwrap().len() == 2);
        store.put(&checkpoint(3, vec![piece(1, 0, b"b")])).unwrap();
        assert_eq!(store.list().unwrap(), vec![1, 3]);
        assert_eq!(
            store.names("segments").unwrap().len(),
            3,
            "step 2 ≥ oldest kept"
        );
        store.put(&checkpoint(4, vec![piece(1, 0, b"c")])).unwrap();
        let names = store.names("segments").unwrap();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(!names.iter().any(|n| step_of(n) == Some(2)));
    }

    /// Three hosts' stores over one shared object store, each with its
    /// own copy directory.
    fn hosts(n: usize) -> (Vec<ObjectCheckpointStore>, Vec<tempfile::TempDir>) {
        let shared: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let dirs: Vec<tempfile::TempDir> = (0..n).map(|_| tempfile::tempdir().unwrap()).collect();
        let stores = dirs
            .iter()
            .map(|d| {
                ObjectCheckpointStore::new(shared.clone(), Path::default(), "memory:///shared")
                    .unwrap()
                    .with_cache(d.path())
                    .unwrap()
            })
            .collect();
        (stores, dirs)
    }

    fn pieces_of(c: &Checkpoint, worker: u32) -> Vec<(u32, Vec<u8>)> {
        c.pieces
            .iter()
            .filter(|p| p.worker == worker)
            .map(|p| (p.shard, p.state.clone()))
            .collect()
    }

    fn only(c: &Checkpoint, worker: u32) -> Checkpoint {
        let mut own = c.clone();
        own.pieces.retain(|p| p.worker == worker);
        own
    }

    #[test]
    fn hosts_stage_their_workers_pieces_and_restore_from_their_own_copy() {
        let (h, _dirs) = hosts(3);
        assert!(h[0].location().is_some());
        assert_eq!(h[1].location(), h[0].location());
        // Worker 0 on the committing host, 1 and 2 on the others.
        let whole = conformance::sample_checkpoint(4, 3);
        let s1 = h[1].stage(4, 1, &pieces_of(&whole, 1)).unwrap();
        let s2 = h[2].stage(4, 2, &pieces_of(&whole, 2)).unwrap();
        assert_eq!(s1.bytes(), "state 4/7/1".len() as u64);
        assert_eq!(h[0].latest_meta().unwrap(), None, "staged is not committed");
        h[0].put_staged(&only(&whole, 0), &[s1, s2], None).unwrap();
        assert_eq!(h[0].get(4).unwrap(), Some(whole.clone()));
        // Each host holds what it wrote (what a new leader asks).
        let bytes = |w: u32| -> u64 {
            only(&whole, w)
                .pieces
                .iter()
                .map(|p| p.state.len() as u64)
                .sum()
        };
        for (w, host) in h.iter().enumerate() {
            let w = w as u32;
            assert_eq!(host.local_bytes(4).unwrap(), vec![(w, bytes(w))]);
        }
        assert_eq!(h[0].local_bytes(5).unwrap(), vec![], "no such checkpoint");
        for (host, worker, local) in [(1, 1, true), (2, 2, true), (0, 0, true), (1, 2, false)] {
            let (got, read) = h[host].worker_pieces(4, worker as u32).unwrap().unwrap();
            let want = only(&whole, worker as u32).pieces;
            let bytes: u64 = want.iter().map(|p| p.state.len() as u64).sum();
            assert_eq!(got, want);
            let expected = if local {
                ReadBytes {
                    local: bytes,
                    fetched: 0,
                }
            } else {
                ReadBytes {
                    local: 0,
                    fetched: bytes,
                }
            };
            assert_eq!(read, expected, "host {host} reading worker {worker}");
        }
        // A host that lost its copy fetches.
        for e in std::fs::read_dir(_dirs[1].path()).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        let (_, read) = h[1].worker_pieces(4, 1).unwrap().unwrap();
        assert_eq!(read.local, 0);
        assert!(read.fetched > 0);
    }

    #[test]
    fn stores_share_a_location_only_when_they_hold_the_same_id() {
        let (h, _dirs) = hosts(2);
        assert!(h[0].location().is_some());
        assert_eq!(h[0].location(), h[1].location());
        // The same description over another store: another location.
        let other = ObjectCheckpointStore::new(
            Arc::new(object_store::memory::InMemory::new()),
            Path::default(),
            "memory:///shared",
        )
        .unwrap();
        assert_ne!(other.location(), h[0].location());
        let memory = || {
            ObjectCheckpointStore::open("memory:///")
                .unwrap()
                .location()
        };
        assert_ne!(memory(), memory());
        // One directory opened twice: one store.
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().join("store").display());
        let a = ObjectCheckpointStore::open(&url).unwrap();
        let b = ObjectCheckpointStore::open(&url).unwrap();
        assert_eq!(a.location(), b.location());
        assert!(a.location().unwrap().starts_with(&url));
    }

    #[test]
    fn a_commit_refuses_staged_pieces_that_are_not_there_as_described() {
        let (h, _dirs) = hosts(2);
        let whole = conformance::sample_checkpoint(4, 2);
        let own = only(&whole, 0);
        let good = h[1].stage(4, 1, &pieces_of(&whole, 1)).unwrap();
        let refused = |staged: Staged, says: &str| {
            let e = h[0]
                .put_staged(&own, &[staged], None)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{e}");
            assert_eq!(h[0].latest_meta().unwrap(), None);
        };
        let mut longer = good.clone();
        longer.pieces[0].1 += 1;
        refused(longer, "holds");
        refused(
            Staged {
                segment: segment_name(4, 99, 1),
                ..good.clone()
            },
            "not in the store",
        );
        refused(
            Staged {
                worker: 0,
                ..good.clone()
            },
            "not worker 0's",
        );
        refused(
            Staged {
                segment: "../manifests/00000000000000000004".into(),
                ..good.clone()
            },
            "not worker 1's",
        );
        refused(
            Staged {
                step: 3,
                ..good.clone()
            },
            "not worker 1's",
        );
        h[0].put_staged(&own, &[good], None).unwrap();
        assert_eq!(h[0].get(4).unwrap(), Some(whole));
    }

    #[test]
    fn a_worker_with_nothing_to_write_stages_no_segment() {
        let (h, _dirs) = hosts(2);
        let whole = conformance::sample_checkpoint(4, 2);
        let empty = h[1].stage(4, 1, &[]).unwrap();
        assert!(empty.segment.is_empty() && empty.pieces.is_empty());
        h[0].put_staged(&only(&whole, 0), &[empty], None).unwrap();
        assert_eq!(h[0].get(4).unwrap(), Some(only(&whole, 0)));
        assert_eq!(h[0].names("segments").unwrap().len(), 1);
    }

    #[test]
    fn a_host_copy_keeps_only_what_kept_checkpoints_need() {
        let (h, dirs) = hosts(2);
        let copied = |i: usize| -> BTreeSet<u64> {
            std::fs::read_dir(dirs[i].path())
                .unwrap()
                .filter_map(|e| step_of(&e.unwrap().file_name().to_string_lossy()))
                .collect()
        };
        for step in 1..=5 {
            let c = conformance::sample_checkpoint(step, 2);
            let staged = h[1].stage(step, 1, &pieces_of(&c, 1)).unwrap();
            h[0].put_staged(&only(&c, 0), &[staged], None).unwrap();
        }
        // The committer collected after committing 5 (kept: 4, 5); the
        // other host when it staged 5 (kept then: 3, 4).
        assert_eq!(copied(0), BTreeSet::from([4, 5]));
        assert_eq!(copied(1), BTreeSet::from([3, 4, 5]));
        assert_eq!(h[0].list().unwrap(), vec![4, 5]);
        // Incremental: a carried piece's segment stays wherever it is
        // referenced.
        let c6 = conformance::sample_checkpoint(6, 2);
        let staged = h[1].stage(6, 1, &pieces_of(&c6, 1)).unwrap();
        let carried = Carried {
            from: 5,
            pieces: vec![(7, 0), (300, 1)],
        };
        let mut own = only(&c6, 0);
        own.pieces.retain(|p| p.shard != 7);
        h[0].put_staged(&own, &[staged], Some(&carried)).unwrap();
        let got = h[0].get(6).unwrap().unwrap();
        assert_eq!(got.pieces.len(), 4, "{:?}", got.pieces);
    }

    #[test]
    fn bad_urls_are_clear_errors() {
        for (url, says) in [
            ("nonsense", "use file:///dir"),
            ("ftp://x/y", "unknown scheme"),
            ("file://relative", "absolute"),
        ] {
            let err = ObjectCheckpointStore::open(url).unwrap_err().to_string();
            assert!(err.contains(says), "{url}: {err}");
        }
    }

    #[test]
    fn a_corrupt_manifest_is_reported_not_trusted() {
        let store = ObjectCheckpointStore::open("memory:///").unwrap();
        store.put(&checkpoint(1, vec![piece(1, 0, b"a")])).unwrap();
        let s = store.store.clone();
        let path = store.child("manifests", &format!("{:020}", 1));
        store
            .run(async move {
                s.put(&path, PutPayload::from(b"\xff\xff junk".to_vec()))
                    .await
                    .map_err(backend_error("test"))
            })
            .unwrap();
        let err = store.latest().unwrap_err().to_string();
        assert!(err.contains("manifest of checkpoint 1"), "{err}");
    }
}
