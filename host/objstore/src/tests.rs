//! The store's tests: the checkpoint conformance suite (in memory, in a
//! directory, with a ledger, on an S3-protocol server when there is one),
//! fenced committers, collection, staging across hosts and their copies.

use crate::error::backend_error;
use crate::manifest::step_of;
use crate::segment::{nonce, segment_name};
use crate::store::ObjectCheckpointStore;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use sluice_storage::conformance;
use sluice_storage::{
    Carried, Checkpoint, CheckpointMeta, CheckpointStore, ReadBytes, Staged, StatePiece,
    StorageError,
};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

#[test]
fn passes_the_checkpoint_conformance_suite_in_memory() {
    conformance::checkpoint_store(&|| Arc::new(ObjectCheckpointStore::open("memory:///").unwrap()));
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
    assert!(
        matches!(err, StorageError::TransactionalProducerSuperseded { .. }),
        "{err}"
    );
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
    let unledgered = ObjectCheckpointStore::new(shared.clone(), Path::default(), "memory").unwrap();
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

/// A store in a fresh directory (`<dir>/store`), and the directory.
fn directory_store() -> (ObjectCheckpointStore, std::path::PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let store = ObjectCheckpointStore::open(&format!("file://{}", root.display())).unwrap();
    (store, root, dir)
}

/// The SHA-256 of `bytes` in lower-case hex, computed here.
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn a_published_component_is_read_back_by_its_hash() {
    let bytes = b"\0asm\x0d\0\x01\0 a component".to_vec();
    let (in_directory, _root, _dir) = directory_store();
    for store in [
        ObjectCheckpointStore::open("memory:///").unwrap(),
        in_directory,
    ] {
        let hash = store.put_component(&bytes).unwrap();
        assert_eq!(hash, sha256_hex(&bytes));
        assert_eq!(store.get_component(&hash).unwrap(), Some(bytes.clone()));
        // Publishing again is fine, and changes nothing.
        assert_eq!(store.put_component(&bytes).unwrap(), hash);
        assert_eq!(store.get_component(&hash).unwrap(), Some(bytes.clone()));
        // Another component has another name.
        let other = store.put_component(b"another").unwrap();
        assert_ne!(other, hash);
        assert_eq!(
            store.get_component(&other).unwrap(),
            Some(b"another".to_vec())
        );
        assert_eq!(store.get_component(&hash).unwrap(), Some(bytes.clone()));
    }
}

#[test]
fn a_component_published_by_one_host_is_read_by_another() {
    let (h, _dirs) = hosts(2);
    let hash = h[0].put_component(b"version 2").unwrap();
    assert_eq!(
        h[1].get_component(&hash).unwrap(),
        Some(b"version 2".to_vec())
    );
}

#[test]
fn an_unknown_component_is_none() {
    let (store, _root, _dir) = directory_store();
    assert_eq!(store.get_component(&sha256_hex(b"never")).unwrap(), None);
    store.put_component(b"some").unwrap();
    assert_eq!(store.get_component(&sha256_hex(b"never")).unwrap(), None);
}

#[test]
fn a_component_hash_that_is_not_a_sha256_is_refused() {
    let store = ObjectCheckpointStore::open("memory:///").unwrap();
    let good = sha256_hex(b"x");
    for hash in [
        String::new(),
        good[..63].to_owned(),
        format!("{good}0"),
        good.to_uppercase(),
        format!("../{}", &good[3..]),
        format!("{}/x", &good[..62]),
        format!("{}g", &good[..63]),
        format!("{}é", &good[..62]),
    ] {
        let err = store.get_component(&hash).unwrap_err();
        assert!(matches!(err, StorageError::Config(_)), "{hash:?}: {err}");
        assert!(!err.is_transient());
    }
}

#[test]
fn a_component_whose_bytes_changed_is_reported_not_trusted() {
    let (store, root, _dir) = directory_store();
    let hash = store.put_component(b"the circuit").unwrap();
    let file = root.join("components").join(format!("{hash}.wasm"));
    assert_eq!(std::fs::read(&file).unwrap(), b"the circuit");
    std::fs::write(&file, b"another circuit").unwrap();
    let err = store.get_component(&hash).unwrap_err();
    assert!(matches!(err, StorageError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains(&hash), "{err}");
    // Publishing the true bytes again leaves the object as it is (create
    // only), so it is still reported.
    assert_eq!(store.put_component(b"the circuit").unwrap(), hash);
    assert!(matches!(
        store.get_component(&hash).unwrap_err(),
        StorageError::Corrupt { .. }
    ));
}

#[test]
fn components_are_never_collected() {
    let (store, root, _dir) = directory_store();
    let hash = store.put_component(b"the circuit").unwrap();
    let steps = sluice_storage::checkpoint::KEPT as u64 + 3;
    for step in 1..=steps {
        store
            .put(&checkpoint(
                step,
                vec![piece(0, 0, b"s"), piece(1, 1, b"t")],
            ))
            .unwrap();
    }
    let kept: Vec<u64> = (steps + 1 - sluice_storage::checkpoint::KEPT as u64..=steps).collect();
    assert_eq!(store.list().unwrap(), kept, "collection ran");
    assert!(
        root.join("components")
            .join(format!("{hash}.wasm"))
            .is_file()
    );
    assert_eq!(
        store.get_component(&hash).unwrap(),
        Some(b"the circuit".to_vec())
    );
}
