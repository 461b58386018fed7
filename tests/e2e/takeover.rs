//! A new leader takes a Kafka pipeline over past what a dead worker host
//! left open (issue #27, item 2). A worker's holder that dies while it
//! commits its share leaves a transaction open on the step topic; a
//! `read_committed` read stops before it, so a checkpoint record committed
//! after it was missed: the new leader restored the older checkpoint,
//! whose input the newer one had trimmed, and exited — and only the
//! worker's next holder, taken after that read, would have ended the
//! transaction. The holder dies here for real: a child process takes the
//! worker (`LogBackend::take_worker`) and aborts at the crash point inside
//! its share's transaction. The test broker (patched, as Kafka) reports the
//! last stable offset to `read_committed` clients and aborts a transaction
//! open longer than its timeout (15 s for a worker's holder).
#![cfg(feature = "kafka")]

use crate::kafka::{brokers, fresh_name};
use crate::support::{Harness, component, recount};
use sluice_core::{StepCommit, StepRecord};
use sluice_kafka::{KafkaConfig, KafkaLog};
use sluice_pipeline::LogConfig;
use sluice_runtime::{Limits, PipelineOptions, Reach, RemoteHost, WorkerHost};
use sluice_storage::{CheckpointLedger, LogBackend, WorkerCommit};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRET: &[u8] = b"the hosts' shared secret";

/// Names the share the child process commits (and dies in):
/// `BROKERS PIPELINE STEP WORKER OUTPUT[,OUTPUT…]`.
const DEAD_HOLDER: &str = "SLUICE_TEST_DEAD_HOLDER";

/// A worker's holder's transactions time out after this long (the Kafka
/// log's setting for worker producers).
const HOLDER_TIMEOUT: Duration = Duration::from_secs(15);

/// Not a test: the child process [`holder_dies_mid_commit`] runs, with
/// `SLUICE_CRASH_AT=inside-transaction:1`. Takes the worker [`DEAD_HOLDER`]
/// names and commits its (empty) share of the step: the process aborts
/// with the share's transaction open.
#[test]
#[ignore = "a child process of the tests in this file"]
fn dead_holder() {
    let Ok(spec) = std::env::var(DEAD_HOLDER) else {
        return;
    };
    let parts: Vec<&str> = spec.split(' ').collect();
    let [brokers, pipeline, step, worker, outputs] = parts[..] else {
        panic!("{DEAD_HOLDER}={spec}");
    };
    let (step, worker): (u64, u32) = (step.parse().unwrap(), worker.parse().unwrap());
    let log = Arc::new(KafkaLog::open(KafkaConfig::new(brokers, pipeline)).unwrap());
    let record = log
        .step_record(step)
        .unwrap()
        .expect("the step is recorded");
    let outputs: Vec<(String, Vec<sluice_core::Event>)> = outputs
        .split(',')
        .map(|name| (name.to_owned(), Vec::new()))
        .collect();
    let hash = sluice_core::hash_outputs(&vec![Vec::new(); outputs.len()]);
    let share = WorkerCommit::new(
        step,
        worker,
        &record.frontiers[worker as usize],
        outputs,
        hash,
    );
    let mut holder = log.clone().take_worker(worker).unwrap();
    holder.commit(&share).unwrap();
    panic!("the crash point inside the share's transaction did not fire");
}

/// Kills a holder of worker `worker` of `pipeline` inside the transaction
/// of its share of step `step`, in a child process: when this returns, the
/// transaction is open (until its timeout, or the worker's next holder).
fn holder_dies_mid_commit(
    brokers: &str,
    pipeline: &str,
    step: u64,
    worker: u32,
    outputs: &[String],
) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "takeover::dead_holder",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(
            DEAD_HOLDER,
            format!("{brokers} {pipeline} {step} {worker} {}", outputs.join(",")),
        )
        .env("SLUICE_CRASH_AT", "inside-transaction:1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("crash point inside-transaction #1"),
        "the holder dies inside its transaction: {}\n{stderr}",
        out.status
    );
}

/// Word count of `lines` on Kafka pipeline `pipeline` with checkpoints in
/// `store`, its data directory `dir` (each leader its own, as on its own
/// machine).
async fn leader(dir: &std::path::Path, brokers: &str, pipeline: &str, store: &str) -> Harness {
    let wasm = component("examples/wordcount");
    Harness::open_with(dir, &wasm, 2, Limits::default(), |c| {
        c.log = LogConfig::Kafka {
            config: KafkaConfig::new(brokers, pipeline),
        };
        c.checkpoint_store = Some(store.to_owned());
    })
    .await
}

fn options() -> PipelineOptions {
    PipelineOptions {
        max_batch: 10,
        checkpoint_every_steps: u64::MAX,
        checkpoint_interval: Duration::from_secs(3600),
        ..PipelineOptions::default()
    }
}

/// A recorded division of step `last.step + 1` that reads nothing more
/// than step `last` (as its leader recorded it just before a worker's
/// holder died).
fn next_division(last: &StepRecord) -> StepCommit {
    StepCommit::division(StepRecord {
        step: last.step + 1,
        epoch: last.epoch,
        time_ms: last.time_ms,
        frontiers: last.frontiers.clone(),
        output_hashes: Vec::new(),
        limits: last.limits,
        prev: last.chain_hash(),
        layout: None,
    })
}

/// The holder of worker 1 (on another host) dies inside its share's
/// transaction of the last recorded step; the leader then commits a
/// checkpoint of the step before (which trims the input below it) and goes
/// away. A new leader, on another machine, must restore that checkpoint —
/// not the older one before the open transaction, whose input is gone —
/// complete the step and go on, without waiting for the transaction to
/// time out. (Before: it restored the older checkpoint and failed with
/// "restored a checkpoint whose input was trimmed", as every leader after
/// it; on a broker reporting the high watermark as the last stable offset,
/// it waited 60 s on the read and failed, over and over.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_leader_reads_past_a_dead_holders_open_transaction() {
    let Some(brokers) = brokers() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pipeline = fresh_name("deadholder");
    let store = format!("file://{}", dir.path().join("store").display());
    let lines: Vec<String> = (0..600)
        .map(|i| format!("w{} w{} x{}", i % 37, (i * 7) % 101, i % 5))
        .collect();
    let first = leader(&dir.path().join("a"), &brokers, &pipeline, &store).await;
    for (i, chunk) in lines.chunks(25).enumerate() {
        let values: Vec<&str> = chunk.iter().map(String::as_str).collect();
        first.append("lines", (i % 4) as u32, &values);
    }
    // The worker host that survives: its own handle of the logs, as on its
    // own machine; it commits its workers' shares (the steps are divided).
    let identity = first.pipeline.options().name.clone();
    let host_log: Arc<dyn LogBackend> =
        Arc::new(KafkaLog::open(KafkaConfig::new(&brokers, &pipeline)).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let host = WorkerHost::new_with(
        first.engine(),
        first.pipeline.component(),
        &identity,
        SECRET,
        None,
        Reach {
            checkpoints: None,
            log: Some(host_log),
            read_only_log: false,
        },
    );
    let _serving = tokio::spawn(async move {
        let _ = host.serve(listener).await;
    });
    let connect = || async {
        RemoteHost::connect(&addr, &identity, SECRET, Duration::from_secs(3))
            .await
            .unwrap()
    };

    let mut c = first
        .pipeline
        .coordinator_on(options(), vec![connect().await])
        .await
        .unwrap();
    for _ in 0..3 {
        assert!(c.step().await.unwrap());
    }
    c.checkpoint().await.unwrap();
    let older = c.checkpointed_step().unwrap();
    for _ in 0..3 {
        assert!(c.step().await.unwrap());
    }
    assert!(first.divided_steps() >= 6, "the steps are divided");
    let last = first.log.last_step().unwrap().unwrap();
    let record = first.log.step_record(last).unwrap().unwrap();
    first.storage.commit_step(&next_division(&record)).unwrap();
    holder_dies_mid_commit(&brokers, &pipeline, last + 1, 1, &first.outputs);
    let died = Instant::now();
    // The leader's checkpoint of the last complete step is recorded after
    // the open transaction, and trims the input below it.
    c.checkpoint().await.unwrap();
    assert_eq!(c.checkpointed_step(), Some(last));
    drop(c);

    let second = leader(&dir.path().join("b"), &brokers, &pipeline, &store).await;
    let opening = Instant::now();
    let mut c = second
        .pipeline
        .coordinator_on(options(), vec![connect().await])
        .await
        .unwrap_or_else(|e| panic!("the new leader opens: {e}"));
    let took = opening.elapsed();
    eprintln!(
        "a new leader past a dead holder's open transaction: opened in {took:.2?} (restored \
         checkpoint {:?}, replayed {} steps; the transaction was {:.2?} old)",
        c.stats().restored_checkpoint,
        c.stats().replayed_steps,
        died.elapsed()
    );
    assert_eq!(
        c.stats().restored_checkpoint,
        Some(last),
        "the newest checkpoint (not {older}, before the open transaction)"
    );
    assert!(
        died.elapsed() < HOLDER_TIMEOUT,
        "the new leader did not wait for the holder's transaction to time out ({took:.2?})"
    );
    while c.step().await.unwrap() {}
    c.finish().await.unwrap();
    assert_eq!(
        second.word_counts(),
        recount(lines.iter().map(|l| (l.as_str(), 1)))
    );
    assert!(second.audit() > last + 1);
    // The checkpoint the new leader took is recorded past the aborted
    // transaction, for whoever reads the log next.
    let reader = KafkaLog::open(KafkaConfig::new(&brokers, &pipeline)).unwrap();
    assert!(!reader.recorded_checkpoints(1).unwrap().is_empty());
}

/// The test broker ends a dead holder's transaction after its timeout, as
/// Kafka does: the step topic's last stable offset, held back until then,
/// reaches its end between the timeout and a few seconds after it.
#[test]
fn the_broker_aborts_a_dead_holders_transaction_after_its_timeout() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use sluice_storage::conformance::{sample_division, sample_share};
    let Some(brokers) = brokers() else { return };
    let pipeline = fresh_name("txn-timeout");
    let log = Arc::new(KafkaLog::open(KafkaConfig::new(&brokers, &pipeline)).unwrap());
    log.fence().unwrap();
    let division = sample_division(0, 5, 0);
    log.commit_step(&StepCommit::division(division.clone()))
        .unwrap();
    let mut holder0 = log.clone().take_worker(0).unwrap();
    holder0
        .commit(&sample_share(&division, 0, Vec::new()))
        .unwrap();
    holder_dies_mid_commit(&brokers, &pipeline, 0, 1, &["out".to_owned()]);
    let died = Instant::now();
    let client = |isolation: &str| -> BaseConsumer {
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("isolation.level", isolation)
            .create()
            .unwrap()
    };
    let (committed, uncommitted) = (client("read_committed"), client("read_uncommitted"));
    let topic = format!("{pipeline}.sluice-steps");
    let end = |c: &BaseConsumer| {
        c.fetch_watermarks(&topic, 0, Duration::from_secs(10))
            .unwrap()
            .1
    };
    assert!(
        end(&committed) < end(&uncommitted),
        "the open transaction holds the last stable offset back"
    );
    while end(&committed) < end(&uncommitted) {
        assert!(
            died.elapsed() < HOLDER_TIMEOUT + Duration::from_secs(10),
            "the transaction is still open {:.2?} after its holder died",
            died.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let ended = died.elapsed();
    eprintln!("the broker aborted a dead holder's transaction {ended:.2?} after it died");
    assert!(
        ended >= HOLDER_TIMEOUT - Duration::from_secs(2),
        "ended by its timeout, not before ({ended:.2?})"
    );
    // Aborted: a new holder commits the worker's share once.
    let mut holder1 = log.clone().take_worker(1).unwrap();
    assert_eq!(
        holder1
            .commit(&sample_share(&division, 1, Vec::new()))
            .unwrap(),
        sluice_storage::WorkerDone::Committed
    );
}
