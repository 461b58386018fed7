//! A pipeline across several hosts: the coordinator drives workers on
//! other hosts ([`WorkerHost`]s on loopback TCP), their shuffles going host
//! to host. What the workers compute must not depend on where
//! they run: every step's output hashes equal those of the same pipeline
//! on one host.

use crate::support::{Harness, component, recount};
use sluice_runtime::{Limits, PipelineOptions, Reach, RemoteHost, Tls, WorkerHost};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub(crate) const SECRET: &[u8] = b"the hosts' shared secret";

pub(crate) fn options() -> PipelineOptions {
    PipelineOptions {
        max_batch: 40,
        checkpoint_every_steps: 5,
        checkpoint_interval: Duration::from_secs(3600),
        ..PipelineOptions::default()
    }
}

/// Lines of words over a small vocabulary.
pub(crate) fn lines(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("w{} w{} x{}", i % 37, (i * 7) % 101, i % 5))
        .collect()
}

/// A worker host for `harness`'s pipeline on a loopback port, reading its
/// workers' input from the pipeline's log itself (the coordinator sends
/// offsets); returns its address and the task serving it (abort it to kill
/// the host).
pub(crate) async fn start_host(
    harness: &Harness,
    pipeline: &str,
) -> (String, tokio::task::JoinHandle<()>) {
    let reach = Reach {
        checkpoints: None,
        log: Some(harness.log.clone()),
        read_only_log: false,
    };
    start_host_reaching(harness, pipeline, reach).await
}

/// [`start_host`], its workers using what `reach` gives them.
async fn start_host_reaching(
    harness: &Harness,
    pipeline: &str,
    reach: Reach,
) -> (String, tokio::task::JoinHandle<()>) {
    let (addr, task, _) = start_host_with(harness, pipeline, reach).await;
    (addr, task)
}

/// [`start_host_reaching`], and the host itself.
pub(crate) async fn start_host_with(
    harness: &Harness,
    pipeline: &str,
    reach: Reach,
) -> (String, tokio::task::JoinHandle<()>, Arc<WorkerHost>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let host = WorkerHost::new_with(
        harness.engine(),
        harness.pipeline.component(),
        pipeline,
        SECRET,
        None,
        reach,
    );
    let serving = host.clone();
    let task = tokio::spawn(async move {
        let _ = serving.serve(listener).await;
    });
    (addr, task, host)
}

/// A worker host of `h`'s pipeline using what `reach` gives it, and a
/// coordinator on it (and on itself): the host's address, its serving
/// task (abort it to kill the host) and the coordinator.
async fn on_a_host_reaching(
    h: &Harness,
    pipeline: &str,
    reach: Reach,
) -> (
    String,
    tokio::task::JoinHandle<()>,
    sluice_runtime::Coordinator,
) {
    let (addr, serving) = start_host_reaching(h, pipeline, reach).await;
    let c = h
        .pipeline
        .coordinator_on(options(), vec![connect(&addr, pipeline).await])
        .await
        .unwrap();
    (addr, serving, c)
}

pub(crate) async fn connect(addr: &str, pipeline: &str) -> Arc<RemoteHost> {
    RemoteHost::connect(addr, pipeline, SECRET, Duration::from_secs(3))
        .await
        .unwrap()
}

/// Every committed step's output hashes, by step (a divided step's from
/// its workers' done records).
pub(crate) fn hashes(h: &Harness) -> BTreeMap<u64, Vec<u128>> {
    let last = h.log.last_step().unwrap().unwrap();
    (0..=last)
        .map(|s| (s, h.log.output_hashes(s).unwrap().unwrap()))
        .collect()
}

pub(crate) async fn fill(h: &Harness, lines: &[String]) {
    for (i, chunk) in lines.chunks(50).enumerate() {
        let values: Vec<&str> = chunk.iter().map(String::as_str).collect();
        h.append("lines", (i % 4) as u32, &values);
    }
}

/// Runs `input` through the pipeline with `workers` workers on one host
/// (in `dir/one`), to the end: the reference the runs across hosts must
/// match step by step.
async fn run_on_one_host(
    dir: &std::path::Path,
    wasm: &std::path::Path,
    workers: u32,
    input: &[String],
) -> Harness {
    let one = Harness::open(&dir.join("one"), wasm, workers, Limits::default()).await;
    fill(&one, input).await;
    let mut c = one.coordinator(options()).await.unwrap();
    while c.step().await.unwrap() {}
    c.finish().await.unwrap();
    one
}

/// Word count of `input` with `workers` workers run to the end on one
/// host (in `dir/one`), and the same pipeline opened afresh with the input
/// (in `dir/hosts`) for a run across hosts to match.
pub(crate) async fn with_a_reference(
    dir: &std::path::Path,
    workers: u32,
    input: &[String],
) -> (Harness, Harness) {
    let wasm = component("examples/wordcount");
    let one = run_on_one_host(dir, &wasm, workers, input).await;
    let h = Harness::open(&dir.join("hosts"), &wasm, workers, Limits::default()).await;
    fill(&h, input).await;
    (one, h)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_on_other_hosts_compute_what_one_host_computes() {
    let input = lines(2_000);
    let dir = tempfile::tempdir().unwrap();
    let (one, three) = with_a_reference(dir.path(), 3, &input).await;
    let name = three.pipeline.options().name.clone();
    let (a, _ta) = start_host(&three, &name).await;
    let (b, _tb) = start_host(&three, &name).await;
    // Two hosts first; a third joins mid-run and takes its worker live.
    let ha = connect(&a, &name).await;
    let mut c = three
        .pipeline
        .coordinator_on(options(), vec![ha.clone()])
        .await
        .unwrap();
    for _ in 0..12 {
        assert!(c.step().await.unwrap());
    }
    let moved = c
        .replace_hosts(vec![ha, connect(&b, &name).await])
        .await
        .unwrap();
    assert!(moved > 0, "worker 2 moved to the new host with its state");
    while c.step().await.unwrap() {}
    c.finish().await.unwrap();
    assert!(
        c.stats().checkpoints >= 2,
        "checkpoints took remote snapshots"
    );
    let stats = c.stats().clone();
    assert!(
        stats.events_in_read_by_hosts > 0 && stats.events_in_read_by_hosts < stats.events_in,
        "the hosts read their workers' input, the leader its own: {stats:?}"
    );
    drop(c);

    assert_eq!(one.divided_steps(), 0, "one host commits its steps whole");
    assert!(
        three.divided_steps() > 0,
        "hosts writing to the logs commit their workers' shares"
    );
    assert_eq!(
        hashes(&one),
        hashes(&three),
        "every step's output, worker by worker, is the same on one host and on three"
    );
    three.audit();
    let expected = recount(input.iter().map(|l| (l.as_str(), 1)));
    assert_eq!(three.word_counts(), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_joining_takes_its_share_and_one_leaving_hands_over_only_its_own() {
    let input = lines(6_000);
    let dir = tempfile::tempdir().unwrap();
    let (one, h) = with_a_reference(dir.path(), 6, &input).await;
    let name = h.pipeline.options().name.clone();
    let (a, _ta) = start_host(&h, &name).await;
    let (b, _tb) = start_host(&h, &name).await;
    let (ha, hb) = (connect(&a, &name).await, connect(&b, &name).await);
    // W = 6 on this process and a: three each.
    let mut c = h
        .pipeline
        .coordinator_on(options(), vec![ha.clone()])
        .await
        .unwrap();
    for _ in 0..10 {
        assert!(c.step().await.unwrap());
    }
    // b joins: it takes two workers (one from each), nothing else moves.
    c.replace_hosts(vec![ha.clone(), hb.clone()]).await.unwrap();
    assert_eq!(c.stats().workers_moved, 2);
    for _ in 0..10 {
        assert!(c.step().await.unwrap());
    }
    // a leaves: only its two workers move, to this process and b.
    let moved = c.replace_hosts(vec![hb.clone()]).await.unwrap();
    assert_eq!(c.stats().workers_moved, 4);
    assert!(moved > 0);
    drop(ha);
    while c.step().await.unwrap() {}
    c.finish().await.unwrap();
    drop(c);

    assert_eq!(
        hashes(&one),
        hashes(&h),
        "every step's output is the same on one host and while hosts come and go"
    );
    h.audit();
    let expected = recount(input.iter().map(|l| (l.as_str(), 1)));
    assert_eq!(h.word_counts(), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_lost_mid_run_fails_the_step_and_the_pipeline_recovers_without_it() {
    let wasm = component("examples/wordcount");
    let input = lines(1_500);
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(&dir.path().join("p"), &wasm, 3, Limits::default()).await;
    fill(&h, &input).await;
    let name = h.pipeline.options().name.clone();
    let (a, ta) = start_host(&h, &name).await;
    let (b, _tb) = start_host(&h, &name).await;
    let hosts = vec![connect(&a, &name).await, connect(&b, &name).await];
    let mut c = h.pipeline.coordinator_on(options(), hosts).await.unwrap();
    for _ in 0..8 {
        assert!(c.step().await.unwrap());
    }
    // Host a dies: its listener and every connection go with the task.
    ta.abort();
    let _ = ta.await;
    let err = loop {
        match c.step().await {
            Ok(true) => continue,
            Ok(false) => panic!("the run finished without noticing the lost host"),
            Err(e) => break e,
        }
    };
    assert!(err.is_transient(), "a lost host is worth a recovery: {err}");
    assert!(err.to_string().contains(&a), "{err}");
    drop(c);
    // Recovery on the hosts still alive: b takes a's workers.
    let mut c = h
        .pipeline
        .coordinator_on(options(), vec![connect(&b, &name).await])
        .await
        .unwrap();
    assert!(c.stats().restored_checkpoint.is_some());
    while c.step().await.unwrap() {}
    c.finish().await.unwrap();
    let expected = recount(input.iter().map(|l| (l.as_str(), 1)));
    assert_eq!(h.word_counts(), expected, "nothing lost, nothing twice");
    assert!(h.divided_steps() > 0);
    h.audit();
}

/// Word count with `workers` workers in `dir/p`, its checkpoints in a
/// store in `dir/store` (returned) that hosts can share, `input` in its
/// log.
async fn with_a_shared_store(
    dir: &std::path::Path,
    workers: u32,
    input: &[String],
) -> (Harness, String) {
    let wasm = component("examples/wordcount");
    let store = format!("file://{}", dir.join("store").display());
    let h = Harness::open_with(&dir.join("p"), &wasm, workers, Limits::default(), |c| {
        c.checkpoint_store = Some(store.clone())
    })
    .await;
    fill(&h, input).await;
    (h, store)
}

/// A coordinator opened on `hosts` with the workers placed as `hint` says
/// where it can (a leader reopening after a failure).
async fn reopen(
    h: &Harness,
    hint: Vec<String>,
    hosts: Vec<Arc<RemoteHost>>,
) -> sluice_runtime::Coordinator {
    let options = PipelineOptions {
        placement_hint: hint,
        ..options()
    };
    h.pipeline.coordinator_on(options, hosts).await.unwrap()
}

/// Worker hosts that reach the pipeline's checkpoint store write their
/// workers' pieces there themselves (they never travel to the leader); a
/// new leader places every worker where its state is; after a host dies, a
/// coordinator reopened with the old placement as its hint keeps the
/// survivors' workers where they were and they restore from their own
/// copies: only the dead host's workers' state is fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosts_write_their_own_checkpoint_pieces_and_survivors_restore_locally() {
    use sluice_storage::CheckpointStore;
    let input = lines(2_000);
    let dir = tempfile::tempdir().unwrap();
    let (h, store) = with_a_shared_store(dir.path(), 4, &input).await;
    let name = h.pipeline.options().name.clone();
    let mut addrs = Vec::new();
    let mut tasks = Vec::new();
    for host in ["a", "b"] {
        let checkpoints: Arc<dyn CheckpointStore> = Arc::new(
            sluice_objstore::ObjectCheckpointStore::open(&store)
                .unwrap()
                .with_cache(dir.path().join(host))
                .unwrap(),
        );
        let reach = Reach {
            checkpoints: Some(checkpoints),
            log: None,
            read_only_log: false,
        };
        let (addr, task) = start_host_reaching(&h, &name, reach).await;
        addrs.push(addr);
        tasks.push(task);
    }
    let (a, b) = (addrs[0].clone(), addrs[1].clone());
    let hosts = vec![connect(&a, &name).await, connect(&b, &name).await];
    let mut c = h.pipeline.coordinator_on(options(), hosts).await.unwrap();
    for _ in 0..12 {
        assert!(c.step().await.unwrap());
    }
    c.checkpoint().await.unwrap();
    let stats = c.stats().clone();
    assert!(stats.checkpoints >= 2, "{stats:?}");
    // Workers 1 (on a) and 2 (on b) wrote their own; 0 and 3 run here.
    let hint = c.placement_addrs();
    assert_eq!(hint, ["", a.as_str(), b.as_str(), ""]);
    assert!(stats.checkpoint_bytes_staged > 0, "{stats:?}");
    assert!(
        stats.checkpoint_bytes_staged < stats.checkpoint_bytes_written,
        "{stats:?}"
    );
    // A new leader knows no placement: it asks the hosts what they hold,
    // and every worker goes back where its state is (whatever the order
    // the hosts come in) — nothing is fetched.
    drop(c);
    let mut c = reopen(
        &h,
        Vec::new(),
        vec![connect(&b, &name).await, connect(&a, &name).await],
    )
    .await;
    assert_eq!(c.placement_addrs(), hint);
    let stats = c.stats().clone();
    assert!(stats.restored_checkpoint.is_some());
    assert_eq!(stats.restored_fetched_bytes, 0, "{stats:?}");
    assert!(stats.restored_local_bytes > 0, "{stats:?}");
    // Host a dies mid-run.
    tasks[0].abort();
    let _ = (&mut tasks[0]).await;
    loop {
        match c.step().await {
            Ok(true) => continue,
            Ok(false) => panic!("the run finished without noticing the lost host"),
            Err(_) => break,
        }
    }
    drop(c);
    let mut c = reopen(&h, hint, vec![connect(&b, &name).await]).await;
    let placed = c.placement_addrs();
    assert_eq!(
        (placed[0].as_str(), placed[2].as_str(), placed[3].as_str()),
        ("", b.as_str(), "")
    );
    // What the checkpoint holds of worker 1 (a's) was fetched; the rest
    // was read where it was written.
    let step = c.stats().restored_checkpoint.expect("a checkpoint");
    let shared = sluice_objstore::ObjectCheckpointStore::open(&store).unwrap();
    let bytes = |w: u32| -> u64 {
        let (pieces, _) = shared.worker_pieces(step, w).unwrap().unwrap();
        pieces.iter().map(|p| p.state.len() as u64).sum()
    };
    let stats = c.stats().clone();
    assert_eq!(stats.restored_fetched_bytes, bytes(1), "{stats:?}");
    assert_eq!(
        stats.restored_local_bytes,
        bytes(0) + bytes(2) + bytes(3),
        "{stats:?}"
    );
    assert!(stats.restored_local_bytes > 0);
    while c.step().await.unwrap() {}
    c.finish().await.unwrap();
    let expected = recount(input.iter().map(|l| (l.as_str(), 1)));
    assert_eq!(h.word_counts(), expected, "nothing lost, nothing twice");
}

/// A host's view of the pipeline's store that names it but cannot write
/// or read it (say, a credential it lacks).
struct Denied(Option<String>);

impl sluice_storage::CheckpointStore for Denied {
    fn put(&self, _: &sluice_storage::Checkpoint) -> sluice_storage::Result<()> {
        Err(self.denied())
    }
    fn latest_meta(&self) -> sluice_storage::Result<Option<sluice_storage::CheckpointMeta>> {
        Err(self.denied())
    }
    fn pieces(
        &self,
        _: u64,
        _: Option<&[u32]>,
    ) -> sluice_storage::Result<Option<Vec<sluice_storage::StatePiece>>> {
        Err(self.denied())
    }
    fn list(&self) -> sluice_storage::Result<Vec<u64>> {
        Err(self.denied())
    }
    fn meta(&self, _: u64) -> sluice_storage::Result<Option<sluice_storage::CheckpointMeta>> {
        Err(self.denied())
    }
    fn location(&self) -> Option<String> {
        self.0.clone()
    }
    fn stage(
        &self,
        _: u64,
        _: u32,
        _: &[(u32, Vec<u8>)],
    ) -> sluice_storage::Result<sluice_storage::Staged> {
        Err(self.denied())
    }
}

impl Denied {
    fn denied(&self) -> sluice_storage::StorageError {
        sluice_storage::StorageError::backend("object store", "a request", true, "access denied")
    }
}

/// A host that names the pipeline's store but cannot use it: its worker's
/// pieces come to the leader at checkpoints and go back to it at restores,
/// and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_that_cannot_use_the_store_sends_and_gets_its_pieces() {
    let input = lines(2_000);
    let dir = tempfile::tempdir().unwrap();
    let (h, _) = with_a_shared_store(dir.path(), 3, &input).await;
    let name = h.pipeline.options().name.clone();
    let location = h.pipeline.storage().checkpoints.location();
    assert!(location.is_some());
    let reach = Reach {
        checkpoints: Some(Arc::new(Denied(location))),
        log: Some(h.log.clone()),
        read_only_log: false,
    };
    let (addr, _serving, mut c) = on_a_host_reaching(&h, &name, reach).await;
    for _ in 0..12 {
        assert!(c.step().await.unwrap());
    }
    c.checkpoint().await.unwrap();
    let stats = c.stats().clone();
    assert!(stats.checkpoints >= 2, "{stats:?}");
    assert_eq!(stats.checkpoint_bytes_staged, 0, "{stats:?}");
    let hint = c.placement_addrs();
    assert_eq!(hint[1], addr);
    drop(c);
    // Reopened with its worker kept there: the host cannot read its
    // pieces, so they are sent.
    let mut c = reopen(&h, hint, vec![connect(&addr, &name).await]).await;
    let stats = c.stats().clone();
    assert!(stats.restored_checkpoint.is_some());
    assert!(stats.restored_fetched_bytes > 0, "{stats:?}");
    while c.step().await.unwrap() {}
    c.finish().await.unwrap();
    let expected = recount(input.iter().map(|l| (l.as_str(), 1)));
    assert_eq!(h.word_counts(), expected, "nothing lost, nothing twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_without_the_secret_or_of_another_pipeline_is_refused() {
    let wasm = component("examples/wordcount");
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(&dir.path().join("p"), &wasm, 2, Limits::default()).await;
    let name = h.pipeline.options().name.clone();
    let (a, _ta) = start_host(&h, &name).await;
    let wrong = RemoteHost::connect(&a, &name, b"not the secret", Duration::from_secs(3)).await;
    let e = wrong.unwrap_err().to_string();
    assert!(e.contains("secret"), "{e}");
    let other = RemoteHost::connect(&a, "another", SECRET, Duration::from_secs(3)).await;
    let e = other.unwrap_err().to_string();
    assert!(e.contains("another"), "{e}");
}

/// TLS credentials from the test fixtures: `who`'s host certificate and
/// key, trusting `who`'s authority (`sluice`, or `rogue` — another CA).
fn tls(who: &str) -> Tls {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2e/fixtures/tls");
    Tls::from_pem_files(
        &dir.join(format!("{who}-host.pem")),
        &dir.join(format!("{who}-host.key")),
        &dir.join(format!("{who}-ca.pem")),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosts_speak_mutual_tls_and_refuse_whoever_does_not() {
    let wasm = component("examples/wordcount");
    let input = lines(1_500);
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(&dir.path().join("p"), &wasm, 3, Limits::default()).await;
    fill(&h, &input).await;
    let name = h.pipeline.options().name.clone();
    let mut hosts = Vec::new();
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap().to_string());
        let host = WorkerHost::new_with(
            h.engine(),
            h.pipeline.component(),
            &name,
            SECRET,
            Some(tls("sluice")),
            Reach::default(),
        );
        let serving = host.clone();
        tokio::spawn(async move {
            let _ = serving.serve(listener).await;
        });
        hosts.push(host);
    }
    let timeout = Duration::from_secs(3);
    // Without TLS, or with a certificate of another authority: refused.
    let plain = RemoteHost::connect(&addrs[0], &name, SECRET, timeout).await;
    assert!(plain.is_err(), "a coordinator without TLS got in");
    let rogue =
        RemoteHost::connect_with(&addrs[0], &name, SECRET, Some(&tls("rogue")), timeout).await;
    assert!(rogue.is_err(), "a coordinator of another CA got in");
    // With the pipeline's authority: the pipeline runs on both hosts, their
    // exchange frames going host to host over TLS too.
    let mine = tls("sluice");
    let mut remote = Vec::new();
    for addr in &addrs {
        remote.push(
            RemoteHost::connect_with(addr, &name, SECRET, Some(&mine), timeout)
                .await
                .unwrap(),
        );
    }
    let mut c = h.pipeline.coordinator_on(options(), remote).await.unwrap();
    while c.step().await.unwrap() {}
    c.finish().await.unwrap();
    drop(c);
    assert!(
        hosts.iter().all(|x| x.peer_traffic() > 0),
        "the hosts exchanged directly"
    );
    let expected = recount(input.iter().map(|l| (l.as_str(), 1)));
    assert_eq!(h.word_counts(), expected);
}

/// A host that may read the pipeline's logs but not write them (Kafka ACLs
/// granting it no transactional id) reads its workers' input itself and
/// leaves their output to the leader, which commits those shares; the
/// hosts that may write commit their own. Without saying so, the same host
/// fails the step (its log refuses the take).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_that_may_not_write_the_logs_reads_and_the_leader_commits_for_it() {
    use sluice_storage::faults::{FaultConfig, FaultyLog};
    let wasm = component("examples/wordcount");
    let input = lines(3_000);
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(&dir.path().join("p"), &wasm, 3, Limits::default()).await;
    fill(&h, &input).await;
    let name = h.pipeline.options().name.clone();
    // Its log refuses every write, as Kafka refuses a transactional id the
    // ACLs do not grant; reads pass.
    let refusing = FaultConfig {
        fail_before: 1.0,
        ..FaultConfig::default()
    };
    let read_only = |declared: bool| Reach {
        checkpoints: None,
        log: Some(Arc::new(FaultyLog::new(h.log.clone(), refusing))),
        read_only_log: declared,
    };
    let (a, _ta) = start_host(&h, &name).await;
    let (undeclared, _tu) = start_host_reaching(&h, &name, read_only(false)).await;
    let hosts = vec![connect(&a, &name).await, connect(&undeclared, &name).await];
    let mut c = h.pipeline.coordinator_on(options(), hosts).await.unwrap();
    let err = c.step().await.unwrap_err();
    assert!(err.to_string().contains(&undeclared), "{err}");
    drop(c);

    let (b, _tb) = start_host_reaching(&h, &name, read_only(true)).await;
    let hosts = vec![connect(&a, &name).await, connect(&b, &name).await];
    let mut c = h.pipeline.coordinator_on(options(), hosts).await.unwrap();
    let placed = c.placement_addrs();
    assert!(placed.contains(&b) && placed.contains(&a), "{placed:?}");
    while c.step().await.unwrap() {}
    c.finish().await.unwrap();
    let stats = c.stats().clone();
    // Every remote worker read its own input, b's included.
    let remote = placed.iter().filter(|p| !p.is_empty()).count() as u64;
    assert!(stats.events_in_read_by_hosts > 0, "{stats:?}");
    if remote == 3 {
        assert_eq!(stats.events_in_read_by_hosts, stats.events_in, "{stats:?}");
    }
    let expected = recount(input.iter().map(|l| (l.as_str(), 1)));
    assert_eq!(h.word_counts(), expected, "nothing lost, nothing twice");
    assert!(h.divided_steps() > 0, "a commits its own shares");
    h.audit();
}

/// Every host of a pipeline must run the coordinator's component: a host
/// started with another one (an older version, say) refuses its workers,
/// naming both, rather than run a second circuit in the pipeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_running_another_component_refuses_the_workers() {
    let wasm = component("examples/wordcount");
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(&dir.path().join("p"), &wasm, 2, Limits::default()).await;
    fill(&h, &lines(100)).await;
    let name = h.pipeline.options().name.clone();
    let other = h
        .engine()
        .load_file(&component("examples/orders-join"))
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let host = WorkerHost::new_with(h.engine(), &other, &name, SECRET, None, Reach::default());
    let _serving = tokio::spawn(async move {
        let _ = host.serve(listener).await;
    });
    let Err(err) = h
        .pipeline
        .coordinator_on(options(), vec![connect(&addr, &name).await])
        .await
    else {
        panic!("a host of another component ran the pipeline's workers");
    };
    let err = err.to_string();
    assert!(err.contains("must run the same"), "{err}");
    assert!(err.contains(&h.pipeline.component().hash), "{err}");
    assert!(err.contains(&other.hash), "{err}");
}

/// Issue #27, item 5: a host's reach of the logs is checked again at each
/// session's start. A host that read its workers' input itself loses the
/// logs (they stop answering it): the step fails, and the reopened
/// coordinator finds the host does not reach them now, sends its workers
/// their input, and the pipeline finishes. Before, the host claimed the
/// reach it opened with, was given reads again, and every reopen failed
/// the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_that_loses_the_logs_is_sent_its_input() {
    use sluice_storage::faults::{FaultConfig, FaultyLog};
    let input = lines(2_000);
    let dir = tempfile::tempdir().unwrap();
    let wasm = component("examples/wordcount");
    let h = Harness::open(&dir.path().join("p"), &wasm, 2, Limits::default()).await;
    fill(&h, &input).await;
    let name = h.pipeline.options().name.clone();
    let lost = Arc::new(FaultyLog::new(h.log.clone(), FaultConfig::default()));
    let reach = Reach {
        checkpoints: None,
        log: Some(lost.clone()),
        read_only_log: false,
    };
    let (addr, _serving, mut c) = on_a_host_reaching(&h, &name, reach).await;
    for _ in 0..3 {
        assert!(c.step().await.unwrap());
    }
    assert!(
        c.stats().events_in_read_by_hosts > 0,
        "the host read its worker's input itself: {:?}",
        c.stats()
    );
    lost.set_down(true);
    let failed = c.step().await;
    assert!(
        matches!(&failed, Err(e) if e.is_transient()),
        "a host that lost the logs fails the step (transiently): {failed:?}"
    );
    let hint = c.placement_addrs();
    drop(c);
    let mut c = reopen(&h, hint, vec![connect(&addr, &name).await]).await;
    while c.step().await.unwrap() {}
    let stats = c.stats().clone();
    assert!(
        stats.events_in > 0 && stats.events_in_read_by_hosts == 0,
        "the reopened coordinator sent the host its worker's input: {stats:?}"
    );
    c.finish().await.unwrap();
    let expected = recount(input.iter().map(|l| (l.as_str(), 1)));
    assert_eq!(h.word_counts(), expected, "nothing lost, nothing twice");
}
