//! A pipeline across hosts when the network between two worker hosts
//! fails one way (issue #27, item 1): a tiny TCP forwarder in front of one
//! host passes the coordinator's connection but drops every byte another
//! host's peer link sends it. The step must fail within a bound — as a
//! transient failure, so the leader reopens without the host — and the
//! pipeline then commits everything exactly once.

use crate::support::{Harness, component, recount};
use sluice_runtime::{HostOptions, Limits, PipelineOptions, Reach, RemoteHost, WorkerHost};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SECRET: &[u8] = b"the hosts' shared secret";

/// The session timeout of every host and of the coordinator (the least
/// `sluice host` accepts).
const TIMEOUT: Duration = Duration::from_secs(2);

fn options() -> PipelineOptions {
    PipelineOptions {
        max_batch: 40,
        checkpoint_every_steps: 5,
        checkpoint_interval: Duration::from_secs(3600),
        ..PipelineOptions::default()
    }
}

/// A worker host of `h`'s pipeline on a loopback port, its workers reading
/// their own input, with the test's session timeout.
async fn start_host(h: &Harness, pipeline: &str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let host = WorkerHost::with_options(
        h.engine(),
        h.pipeline.component(),
        pipeline,
        SECRET,
        HostOptions {
            reach: Reach {
                checkpoints: None,
                log: Some(h.log.clone()),
                read_only_log: false,
            },
            session_timeout: TIMEOUT,
            ..HostOptions::default()
        },
    );
    let task = tokio::spawn(async move {
        let _ = host.serve(listener).await;
    });
    (addr, task)
}

/// Copies `from` to `to` until either ends; while `cut` is set, what it
/// reads is dropped instead (packets lost one way, the sender none the
/// wiser).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Option<Arc<AtomicBool>>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if cut.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A forwarder to `target`: the first connection through it (the
/// coordinator's) is never cut; every later one (other hosts' peer links)
/// loses everything it sends `target` once the returned flag is set.
async fn one_way_cut(target: SocketAddr) -> (String, Arc<AtomicBool>, tokio::task::JoinHandle<()>) {
    let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = front.local_addr().unwrap().to_string();
    let cut = Arc::new(AtomicBool::new(false));
    let flag = cut.clone();
    let task = tokio::spawn(async move {
        let mut pumps = tokio::task::JoinSet::new();
        let mut accepted = 0usize;
        while let Ok((client, _)) = front.accept().await {
            accepted += 1;
            let Ok(server) = TcpStream::connect(target).await else {
                continue;
            };
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            pumps.spawn(pump(cr, sw, (accepted > 1).then(|| flag.clone())));
            pumps.spawn(pump(sr, cw, None));
        }
    });
    (addr, cut, task)
}

async fn connect(addr: &str, pipeline: &str) -> Arc<RemoteHost> {
    RemoteHost::connect(addr, pipeline, SECRET, TIMEOUT)
        .await
        .unwrap()
}

/// Workers on the coordinator (slot 0), host B (slot 1) and host C
/// (slot 2); B's peer link to C then loses every byte while everything
/// else flows, heartbeats included. C's worker waits for B's part of a
/// round that never comes: C takes B for silent after the session
/// timeout, fails the step and tells the others; the coordinator's step
/// fails as *transient* (a network fault, not the guest's) within a few
/// timeouts. Reopened without C, the pipeline runs to the end, every
/// input counted once. (Before: C waited forever, heartbeating, and so
/// did the coordinator; and had it failed, every worker's error was an
/// exchange error reported as the guest's, so not transient.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_link_between_hosts_cut_one_way_fails_the_step_as_transient_and_the_pipeline_recovers() {
    let wasm = component("examples/wordcount");
    let input: Vec<String> = (0..1_500)
        .map(|i| format!("w{} w{} x{}", i % 37, (i * 7) % 101, i % 5))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(&dir.path().join("p"), &wasm, 3, Limits::default()).await;
    for (i, chunk) in input.chunks(50).enumerate() {
        let values: Vec<&str> = chunk.iter().map(String::as_str).collect();
        h.append("lines", (i % 4) as u32, &values);
    }
    let name = h.pipeline.options().name.clone();
    let (b, _tb) = start_host(&h, &name).await;
    let (c_real, _tc) = start_host(&h, &name).await;
    let (c, cut, _proxy) = one_way_cut(c_real).await;
    let b = b.to_string();
    let hosts = vec![connect(&b, &name).await, connect(&c, &name).await];
    let mut coordinator = h.pipeline.coordinator_on(options(), hosts).await.unwrap();
    for _ in 0..4 {
        assert!(coordinator.step().await.unwrap());
    }
    cut.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match coordinator.step().await {
                Ok(true) => continue,
                Ok(false) => panic!("the run finished without noticing the cut link"),
                Err(e) => break e,
            }
        }
    })
    .await
    .expect("the step fails within a bound instead of hanging");
    let took = started.elapsed();
    assert!(
        err.is_transient(),
        "a cut link is a network fault, worth a recovery: {err}"
    );
    assert!(
        took < TIMEOUT * 4,
        "failed {took:?} after the cut (session timeout {TIMEOUT:?})"
    );
    assert!(
        err.to_string().contains("slot 1"),
        "names the silent slot: {err}"
    );
    // ... in a form a leader acts on: it leaves that host out a while.
    assert_eq!(err.silent_slot(), Some(1), "{err:?}");
    drop(coordinator);
    // The leader reopens without the host it could not keep.
    let mut coordinator = h
        .pipeline
        .coordinator_on(options(), vec![connect(&b, &name).await])
        .await
        .unwrap();
    while coordinator.step().await.unwrap() {}
    coordinator.finish().await.unwrap();
    let expected = recount(input.iter().map(|l| (l.as_str(), 1)));
    assert_eq!(h.word_counts(), expected, "nothing lost, nothing twice");
    h.audit();
}
