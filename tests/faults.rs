//! Storage faults: with errors injected into every kind of log and
//! checkpoint operation (before and after the operation took effect), a
//! pipeline that recovers and retries on each transient error still
//! produces every input's effect exactly once.

mod support;

use sluice::runtime::coordinator::{Coordinator, PipelineOptions};
use sluice::runtime::engine::{Limits, SluiceEngine};
use sluice::runtime::pipeline::describe;
use sluice::storage::faults::{FaultConfig, FaultyCheckpoints, FaultyLog};
use sluice::storage::{
    AppendBatch, EmbeddedLog, Event, Guarded, LogBackend, RocksCheckpointStore, db,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use support::{cache_dir, component};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_storage_faults_never_lose_or_duplicate_an_effect() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(SluiceEngine::new(Limits::default(), Some(cache_dir())).unwrap());
    let component = engine
        .load_file(&component("tests/guests/misbehave"))
        .unwrap();
    let shape = describe(&engine, &component).await.unwrap();
    let database = db::open(dir.path()).unwrap();
    const W: u32 = 2;

    // Input, appended before any fault can strike: 2000 words over 2 partitions.
    let words: Vec<String> = (0..2000)
        .map(|i| format!("{}{}", ["ant", "bee", "cat", "dog"][i % 4], i % 7))
        .collect();
    {
        let log = EmbeddedLog::open(database.clone()).unwrap();
        log.create_input("in", W).unwrap();
        for (p, chunk) in words.chunks(1000).enumerate() {
            let events = chunk
                .iter()
                .map(|w| Event {
                    value: serde_json::to_vec(w).unwrap(),
                    weight: 1,
                })
                .collect();
            log.append(AppendBatch {
                appends: vec![("in".into(), p as u32, events)],
                mark: None,
                producer: None,
            })
            .unwrap();
        }
    }

    let config = FaultConfig {
        seed: 7,
        fail_before: 0.08,
        fail_after: 0.08,
        fail_read: 0.02,
        ..FaultConfig::default()
    };
    let log = Arc::new(FaultyLog::new(
        EmbeddedLog::open(database.clone()).unwrap(),
        config,
    ));
    let checkpoints = Arc::new(FaultyCheckpoints::new(
        RocksCheckpointStore::open(database.clone()),
        FaultConfig { seed: 11, ..config },
    ));
    let options = PipelineOptions {
        max_batch: 20,
        checkpoint_every_steps: 3,
        ..PipelineOptions::default()
    };
    let (mut recoveries, mut done) = (0, false);
    'attempt: for _ in 0..500 {
        recoveries += 1;
        let storage = match Guarded::new(
            log.clone(),
            checkpoints.clone(),
            shape.inputs.clone(),
            shape.outputs.clone(),
            W as usize,
        ) {
            Ok(s) => Arc::new(s),
            Err(e) if e.is_transient() => continue,
            Err(e) => panic!("{e}"),
        };
        let opened = Coordinator::open(
            engine.clone(),
            &component,
            storage,
            sluice::runtime::Layout {
                inputs: vec![("in".into(), W)],
                outputs: shape.outputs.clone(),
                workers: W,
                snapshot_version: shape.snapshot_version,
            },
            options.clone(),
        )
        .await;
        let mut c = match opened {
            Ok(c) => c,
            Err(e) if e.is_transient() => continue,
            Err(e) => panic!("{e}"),
        };
        loop {
            match c.step().await {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) if e.is_transient() => continue 'attempt,
                Err(e) => panic!("{e}"),
            }
        }
        match c.finish().await {
            Ok(()) => {
                done = true;
                break;
            }
            Err(e) if e.is_transient() => continue,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(done, "the pipeline never got through");
    let injected = log.injected() + checkpoints.injected();
    eprintln!("faults: {injected} injected, {recoveries} openings");
    assert!(injected >= 20, "only {injected} faults were injected");
    assert!(recoveries > 5, "faults forced recoveries");

    // Read the result without faults.
    let clean = EmbeddedLog::open(database).unwrap();
    let integrate = |name: &str| {
        let mut z: BTreeMap<String, i64> = BTreeMap::new();
        clean
            .scan_output(name, 0, &mut |e| {
                for ev in e.events {
                    *z.entry(String::from_utf8(ev.value).unwrap()).or_default() += ev.weight;
                }
                Ok(())
            })
            .unwrap();
        z.retain(|_, w| *w != 0);
        z
    };
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
