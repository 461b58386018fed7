//! Storage faults: with errors injected into every kind of log and
//! checkpoint operation (before and after the operation took effect), from
//! the first append of input on, a producer that retries its appends with
//! the same sequence number and a pipeline that recovers on each transient
//! error still produce every input's effect exactly once — on the embedded
//! log and on Kafka.

use crate::support::{cache_dir, component};
use sluice_core::Event;
use sluice_pipeline::{LogConfig, Pipeline, PipelineConfig, RecoveryPolicy};
use sluice_runtime::{Limits, LoadedComponent, PipelineOptions, SluiceEngine};
use sluice_storage::faults::{FaultConfig, FaultyCheckpoints, FaultyLog};
use sluice_storage::{AppendBatch, LogBackend, ProducerSeq};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Appends `words` through `log` (which injects faults) as producer
/// `loader`, in chunks of 50 alternating over 2 partitions, retrying each
/// chunk with its sequence number until it is acknowledged. Returns the
/// retries.
fn append_through_faults(log: &dyn LogBackend, words: &[String]) -> u32 {
    let mut retries = 0;
    for (i, chunk) in words.chunks(50).enumerate() {
        let events: Vec<Event> = chunk
            .iter()
            .map(|w| Event {
                value: serde_json::to_vec(w).unwrap(),
                weight: 1,
            })
            .collect();
        let batch = AppendBatch {
            appends: vec![("in".into(), (i % 2) as u32, events)],
            mark: None,
            producer: Some(ProducerSeq {
                id: "loader".into(),
                epoch: 0,
                seq: i as u64 + 1,
            }),
        };
        loop {
            match log.append(batch.clone()) {
                Ok(_) => break,
                Err(e) if e.is_transient() && retries < 1_000 => retries += 1,
                Err(e) => panic!("append of chunk {i}: {e}"),
            }
        }
    }
    retries
}

/// Runs the fault test on a pipeline whose logs are where `log` says.
async fn faults_never_lose_or_duplicate(data: &std::path::Path, log: LogConfig) {
    let engine = Arc::new(SluiceEngine::new(Limits::default(), Some(cache_dir())).unwrap());
    let component = engine
        .load_file(&component("tests/guests/misbehave"))
        .unwrap();
    let config = PipelineConfig {
        log,
        options: PipelineOptions {
            max_batch: 20,
            checkpoint_every_steps: 3,
            ..PipelineOptions::default()
        },
        ..PipelineConfig::new(data, 2)
    };
    let mut pipeline = Pipeline::open(engine, component, config).await.unwrap();
    let clean = pipeline.storage().log.clone();

    let config = FaultConfig {
        seed: 7,
        fail_before: 0.08,
        fail_after: 0.08,
        fail_read: 0.02,
        ..FaultConfig::default()
    };
    let (mut log, mut checkpoints) = (None, None);
    pipeline.storage_mut().wrap(|l, c| {
        let l = Arc::new(FaultyLog::new(l, config));
        let c = Arc::new(FaultyCheckpoints::new(
            c,
            FaultConfig { seed: 11, ..config },
        ));
        log = Some(l.clone());
        checkpoints = Some(c.clone());
        (l, c)
    });
    let (log, checkpoints) = (log.unwrap(), checkpoints.unwrap());

    // Input, appended through the faults: 2000 words.
    let words: Vec<String> = (0..2000)
        .map(|i| format!("{}{}", ["ant", "bee", "cat", "dog"][i % 4], i % 7))
        .collect();
    let append_retries = append_through_faults(&*log, &words);
    // Every transient error recovers (many in a row, without pauses): the
    // same policy as production, only more patient.
    let patient = RecoveryPolicy {
        max_retries: 500,
        first_backoff: Duration::ZERO,
        max_backoff: Duration::ZERO,
    };
    let idle = pipeline.run_until_idle(&patient, |_| {}).await.unwrap();
    let injected = log.injected() + checkpoints.injected();
    eprintln!(
        "faults: {injected} injected, {append_retries} append retries, {} recoveries",
        idle.recoveries
    );
    assert!(injected >= 20, "only {injected} faults were injected");
    assert!(append_retries > 5, "faults struck the appends");
    assert!(idle.recoveries > 5, "faults forced recoveries");

    // Read the result without faults.
    let integrate = |name: &str| integrated(&*clean, name);
    let mut expected_out: BTreeMap<String, i64> = BTreeMap::new();
    for w in &words {
        *expected_out
            .entry(serde_json::to_string(w).unwrap())
            .or_default() += 1;
    }
    assert_eq!(integrate("out"), expected_out, "every word exactly once");
    let letters: BTreeMap<String, i64> = ["a", "b", "c", "d"]
        .iter()
        .map(|l| (format!("[\"{l}\",500]"), 1))
        .collect();
    assert_eq!(integrate("letters"), letters);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_storage_faults_never_lose_or_duplicate_an_effect() {
    let dir = tempfile::tempdir().unwrap();
    faults_never_lose_or_duplicate(dir.path(), LogConfig::default()).await;
}

#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_faults_on_kafka_never_lose_or_duplicate_an_effect() {
    let Some(brokers) = crate::kafka::brokers() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = sluice_kafka::KafkaConfig::new(brokers, crate::kafka::fresh_name("faults"));
    let log = LogConfig::Kafka { config };
    faults_never_lose_or_duplicate(dir.path(), log).await;
}

/// A checkpoint store that is down for a while (issue #27, item 9) delays
/// checkpoints and trims, never steps: the steps go on and commit while
/// every checkpoint write fails, the pipeline says its checkpoints are
/// behind and why, no input is trimmed meanwhile, and once the store is
/// back the next due checkpoint commits and trims — then a reopen restores
/// it and the output is every word exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_delays_checkpoints_not_steps() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, component, options, config) =
        misbehave(dir.path(), 2, 2, Duration::from_millis(300));
    let mut pipeline = Pipeline::open(engine, component, config).await.unwrap();
    let mut store = None;
    pipeline.storage_mut().wrap(|l, c| {
        let c = Arc::new(FaultyCheckpoints::new(c, FaultConfig::default()));
        store = Some(c.clone());
        (l, c)
    });
    let store = store.unwrap();
    let log = pipeline.storage().log.clone();
    let words: Vec<String> = (0..800).map(|i| format!("w{}", i % 37)).collect();
    append_through_faults(&*log, &words);

    let mut c = pipeline.coordinator_with(options).await.unwrap();
    // Two steps and a checkpoint with the store up.
    assert!(c.step().await.unwrap());
    assert!(c.step().await.unwrap());
    c.checkpoint().await.unwrap();
    let first = c.checkpointed_step().expect("a checkpoint");
    let low = |log: &Arc<dyn LogBackend>| {
        (0..2)
            .map(|p| log.watermarks("in", p).unwrap().0)
            .collect::<Vec<_>>()
    };
    let trimmed_before = low(&log);

    // The store goes away: steps go on, checkpoints fail and are reported.
    store.set_down(true);
    let mut steps = 0;
    let started = std::time::Instant::now();
    while steps < 12 {
        assert!(c.step().await.expect("a store outage must not fail a step"));
        steps += 1;
        // Let the retry time pass now and then, so a checkpoint is tried
        // more than once during the outage.
        if steps % 4 == 0 {
            tokio::time::sleep(Duration::from_millis(350)).await;
        }
    }
    c.settle().await.unwrap();
    assert!(
        c.stats().checkpoint_failures >= 2,
        "checkpoints were tried during the outage: {:?}",
        c.stats()
    );
    assert_eq!(
        c.checkpointed_step(),
        Some(first),
        "no checkpoint committed"
    );
    let behind = c.checkpoints_behind().expect("the checkpoints are behind");
    assert!(behind.contains("injected fault"), "{behind}");
    assert_eq!(
        low(&log),
        trimmed_before,
        "nothing trimmed during the outage"
    );
    assert!(started.elapsed() < Duration::from_secs(30));

    // The store is back: the next due checkpoint commits and trims.
    store.set_down(false);
    tokio::time::sleep(Duration::from_millis(350)).await;
    while c.step().await.unwrap() {
        if c.checkpointed_step() > Some(first) {
            break;
        }
    }
    c.checkpoint().await.unwrap();
    assert!(c.checkpointed_step() > Some(first));
    assert_eq!(c.checkpoints_behind(), None);
    assert!(
        low(&log).iter().zip(&trimmed_before).any(|(a, b)| a > b),
        "input trimmed after the store came back"
    );
    while c.step().await.unwrap() {}
    c.finish().await.unwrap();
    drop(c);

    // Every word exactly once.
    let z = integrated(&*log, "out");
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for w in &words {
        *expected
            .entry(serde_json::to_string(w).unwrap())
            .or_default() += 1;
    }
    assert_eq!(z, expected);
}

/// The `misbehave` guest on a fresh engine, and a pipeline of `workers` in
/// `dir` stepping 20 events per partition, checkpointing every
/// `every_steps` steps or `interval`.
fn misbehave(
    dir: &std::path::Path,
    workers: u32,
    every_steps: u64,
    interval: Duration,
) -> (
    Arc<SluiceEngine>,
    LoadedComponent,
    PipelineOptions,
    PipelineConfig,
) {
    let engine = Arc::new(SluiceEngine::new(Limits::default(), Some(cache_dir())).unwrap());
    let component = engine
        .load_file(&component("tests/guests/misbehave"))
        .unwrap();
    let options = PipelineOptions {
        max_batch: 20,
        checkpoint_every_steps: every_steps,
        checkpoint_interval: interval,
        ..PipelineOptions::default()
    };
    let config = PipelineConfig {
        options: options.clone(),
        ..PipelineConfig::new(dir, workers)
    };
    (engine, component, options, config)
}

/// The output log integrated: each value's total weight, zeros dropped.
fn integrated(log: &dyn LogBackend, port: &str) -> BTreeMap<String, i64> {
    let mut z: BTreeMap<String, i64> = BTreeMap::new();
    log.scan_output(port, 0, &mut |e| {
        for ev in e.events {
            *z.entry(String::from_utf8(ev.value).unwrap()).or_default() += ev.weight;
        }
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    z.retain(|_, w| *w != 0);
    z
}

/// A step's commit that fails while the next step runs
/// (`Coordinator::step_overlapped`) is the error of the call that awaits
/// it: nothing of that step or after it is committed, the coordinator goes
/// back to before the step (a plain `step` then fails for want of
/// instances, rather than taking the pipeline for idle past input it never
/// committed), and a reopen commits every word exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_overlapped_commit_fails_the_next_step_and_nothing_after_it_commits() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, component, options, config) =
        misbehave(dir.path(), 1, 1_000, Duration::from_secs(3_600));
    let words: Vec<String> = (0..200).map(|i| format!("w{}", i % 13)).collect();
    let mut pipeline = Pipeline::open(engine.clone(), component.clone(), config.clone())
        .await
        .unwrap();
    let clean = pipeline.storage().log.clone();
    append_through_faults(&*clean, &words);
    // Every log operation waits first: a commit left writing is still
    // waiting when the log goes down right after the step returns.
    let mut faulty = None;
    pipeline.storage_mut().wrap(|l, c| {
        let l = Arc::new(FaultyLog::new(
            l,
            FaultConfig {
                delay: Duration::from_millis(150),
                ..FaultConfig::default()
            },
        ));
        faulty = Some(l.clone());
        (l, c)
    });
    let faulty = faulty.unwrap();

    let mut c = pipeline.coordinator_with(options).await.unwrap();
    assert!(c.step_overlapped().await.unwrap(), "step 0 ran");
    assert_eq!(c.next_step(), 1, "the position counts a step under way");
    faulty.set_down(true);
    let e = c
        .step_overlapped()
        .await
        .expect_err("step 0's commit failed, and step 1 could not divide");
    assert!(e.to_string().contains("injected fault"), "{e}");
    assert_eq!(c.stats().steps, 0, "no step counts as committed");
    assert_eq!(c.next_step(), 0, "back to before the failed step");
    assert!(
        c.frontiers().iter().all(|f| f.values().all(|o| *o == 0)),
        "the frontiers too: {:?}",
        c.frontiers()
    );
    faulty.set_down(false);
    assert!(
        c.step().await.is_err(),
        "the instances held the failed step's effects: they are gone"
    );
    drop(c);
    assert!(
        integrated(&*clean, "out").is_empty(),
        "nothing was committed"
    );
    // (Every handle on the data directory goes before it is opened again.)
    drop((pipeline, clean, faulty));

    // Reopened without faults: every word exactly once.
    let pipeline = Pipeline::open(engine, component, config).await.unwrap();
    pipeline
        .run_until_idle(&RecoveryPolicy::default(), |_| {})
        .await
        .unwrap();
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for w in &words {
        *expected
            .entry(serde_json::to_string(w).unwrap())
            .or_default() += 1;
    }
    assert_eq!(integrated(&*pipeline.storage().log, "out"), expected);
}
