//! The Kafka step log's cost is bounded by what lies since the newest
//! checkpoint, not by the pipeline's history (#27 item 3): a handle holds
//! a window of the step topic, a take-over reads its tail and back to the
//! checkpoints it needs, and old output is read without growing it.
#![cfg(feature = "kafka")]

use crate::kafka::{brokers, fresh_name};
use sluice_kafka::{KafkaConfig, KafkaLog};
use sluice_storage::conformance::{self, LogFlags, sample_commit};
use sluice_storage::{CheckpointLedger, LogBackend, StorageError};
use std::ops::ControlFlow;
use std::sync::Arc;

/// A handle on pipeline `name` keeping at most `window` step records.
fn open(brokers: &str, name: &str, window: usize) -> KafkaLog {
    let mut config = KafkaConfig::new(brokers, name);
    config.step_window = window;
    KafkaLog::open(config).expect("opening the Kafka log")
}

/// Step `step`'s commit under fencing epoch `epoch`.
fn commit(step: u64, epoch: u64) -> sluice_core::StepCommit {
    let mut c = sample_commit(step, step + 1);
    c.record.epoch = epoch;
    c
}

#[test]
fn kafka_log_with_the_smallest_step_window_passes_the_log_conformance_suite() {
    let Some(brokers) = brokers() else { return };
    // Two records at most: every scenario prunes and reads back.
    conformance::log_backend(
        &|| Arc::new(open(&brokers, &fresh_name("win"), 2)) as Arc<dyn LogBackend>,
        LogFlags {
            supports_trim: true,
            dense_offsets: false,
            output_retention: false,
        },
    );
}

#[test]
fn a_takeover_reads_the_step_log_from_its_tail_not_its_history() {
    let Some(brokers) = brokers() else { return };
    let name = fresh_name("tail");
    const STEPS: u64 = 600;
    const WINDOW: usize = 16;
    let first = open(&brokers, &name, WINDOW);
    let epoch = first.fence().unwrap();
    for step in 0..STEPS {
        first.commit_step(&commit(step, epoch)).unwrap();
        if step == 500 || step == 550 {
            first.record_checkpoint(step, &format!("m{step}")).unwrap();
        }
    }
    assert!(
        first.steps_in_memory() <= WINDOW,
        "the committer held {} step records (window {WINDOW})",
        first.steps_in_memory()
    );

    // A take-over reads the tail, back to the checkpoints the store asks
    // for — not the 600 steps before.
    let second = open(&brokers, &name, WINDOW);
    let epoch2 = second.fence().unwrap();
    assert!(epoch2 > epoch);
    assert_eq!(second.last_step().unwrap(), Some(STEPS - 1));
    let held = second.steps_in_memory();
    assert!(
        (1..WINDOW).contains(&held),
        "a take-over held {held} step records"
    );
    assert_eq!(
        second.recorded_checkpoints(2).unwrap(),
        vec![(500, "m500".into()), (550, "m550".into())]
    );
    let held = second.steps_in_memory();
    assert!(
        held < 300,
        "reading back to the second newest checkpoint held {held} step records"
    );

    // Old output is read whole, in order, without taking the history in.
    let mut seen = 0u64;
    second
        .scan_output("out", 0, &mut |e| {
            assert_eq!(e.step, seen, "entries in step order, none skipped");
            assert_eq!(e.events.len(), 1);
            seen += 1;
            Ok(ControlFlow::Continue(()))
        })
        .unwrap();
    assert_eq!(seen, STEPS);
    assert!(second.steps_in_memory() <= held.max(WINDOW));

    // Any old record is still there when asked for.
    for step in [3, 4, 200] {
        let r = second.step_record(step).unwrap().expect("an old record");
        assert_eq!(r.step, step);
        assert_eq!(
            second.output_hashes(step).unwrap(),
            Some(vec![step as u128])
        );
    }
    // The taken-over log goes on. It keeps every step from the last one
    // asked for (a recovery replaying, a leader checking its newest
    // checkpoint), within four windows: memory is what lies since the
    // newest checkpoint, bounded.
    let commit_more = |n: u64| {
        for _ in 0..n {
            let next = second.last_step().unwrap().unwrap() + 1;
            second.commit_step(&commit(next, epoch2)).unwrap();
        }
    };
    commit_more(WINDOW as u64 * 5);
    let held = second.steps_in_memory();
    assert!(held <= WINDOW * 4, "{held} step records held");
    let newest = second.last_step().unwrap().unwrap();
    second
        .step_record(newest)
        .unwrap()
        .expect("the newest step");
    commit_more(WINDOW as u64 / 2);
    let held = second.steps_in_memory();
    assert!(
        held <= WINDOW,
        "{held} step records held {} steps after the last one asked for",
        WINDOW / 2
    );
    assert!(matches!(
        second.commit_step(&commit(5, epoch2)),
        Err(StorageError::StepExists { step: 5 })
    ));
    // The fenced handle commits nothing.
    let late = first.commit_step(&commit(STEPS, epoch));
    assert!(late.is_err(), "the fenced handle committed: {late:?}");
}
