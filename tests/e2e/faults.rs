//! Storage faults: with errors injected into every kind of log and
//! checkpoint operation (before and after the operation took effect), a
//! pipeline that recovers and retries on each transient error still
//! produces every input's effect exactly once.

use crate::support::{cache_dir, component};
use sluice_core::Event;
use sluice_pipeline::{Pipeline, PipelineConfig, RecoveryPolicy};
use sluice_runtime::{Limits, PipelineOptions, SluiceEngine};
use sluice_storage::AppendBatch;
use sluice_storage::faults::{FaultConfig, FaultyCheckpoints, FaultyLog};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_storage_faults_never_lose_or_duplicate_an_effect() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(SluiceEngine::new(Limits::default(), Some(cache_dir())).unwrap());
    let component = engine
        .load_file(&component("tests/guests/misbehave"))
        .unwrap();
    const W: u32 = 2;
    let config = PipelineConfig {
        options: PipelineOptions {
            max_batch: 20,
            checkpoint_every_steps: 3,
            ..PipelineOptions::default()
        },
        ..PipelineConfig::new(dir.path(), W)
    };
    let mut pipeline = Pipeline::open(engine, component, config).await.unwrap();

    // Input, appended before any fault can strike: 2000 words over 2 partitions.
    let words: Vec<String> = (0..2000)
        .map(|i| format!("{}{}", ["ant", "bee", "cat", "dog"][i % 4], i % 7))
        .collect();
    let clean = pipeline.storage().log.clone();
    for (p, chunk) in words.chunks(1000).enumerate() {
        let events = chunk
            .iter()
            .map(|w| Event {
                value: serde_json::to_vec(w).unwrap(),
                weight: 1,
            })
            .collect();
        clean
            .append(AppendBatch {
                appends: vec![("in".into(), p as u32, events)],
                mark: None,
                producer: None,
            })
            .unwrap();
    }

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
        "faults: {injected} injected, {} recoveries",
        idle.recoveries
    );
    assert!(injected >= 20, "only {injected} faults were injected");
    assert!(idle.recoveries > 5, "faults forced recoveries");

    // Read the result without faults.
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
