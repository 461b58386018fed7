//! The conformance suite's part on records that are not events: a record
//! marked as not one reads back as a [`BadRecord`] at its offset (and fails
//! a plain read, naming its position), and dead letters commit with their
//! step — whole or as a worker's share — once.
//!
//! [`BadRecord`]: crate::BadRecord

use super::{ev, sample_commit, sample_division, sample_share};
use crate::error::StorageError as Error;
use crate::{AppendBatch, InputRecord, LogBackend, RecordRef, WorkerDone};
use sluice_core::{DeadLetter, Event, OutputEntry, StepCommit, dead_letter_log};
use std::sync::Arc;

/// A line an ingest kept as not an event: weight 0, the line as written.
fn marked(line: &str) -> Event {
    Event {
        value: line.as_bytes().to_vec(),
        weight: 0,
    }
}

/// A dead letter of input `in`, partition 0, at `offset`.
fn letter(offset: u64) -> Event {
    DeadLetter {
        input: "in".into(),
        partition: 0,
        offset,
        position: format!("in/0@{offset}"),
        error: "not JSON".into(),
        value: Some(b"{nope".to_vec()),
    }
    .to_event()
}

/// Every entry of `log`'s log `name` that holds events: `(step, worker,
/// events)` (a backend may show a worker that skipped nothing as an empty
/// entry: Kafka's scan gives every done worker one).
fn entries(log: &dyn LogBackend, name: &str) -> Vec<(u64, u32, Vec<Event>)> {
    let mut seen = Vec::new();
    log.scan_output(name, 0, &mut |e| {
        if !e.events.is_empty() {
            seen.push((e.step, e.worker, e.events));
        }
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    seen
}

/// A record marked as not an event (an ingest's kept line) reads back, by
/// `read_records`, as a bad record at its offset with the line's parse
/// error, between the events around it; a plain read of its range fails
/// naming its position, and one beside it reads as usual.
pub fn marked_records_read_back_as_bad(log: &dyn LogBackend) {
    log.create_input("in", 1).unwrap();
    let r = log
        .append(AppendBatch {
            appends: vec![("in".into(), 0, vec![ev(1), marked("{nope"), ev(2)])],
            mark: None,
            producer: None,
        })
        .unwrap();
    let records = log.read_records("in", 0, r[0].clone(), false).unwrap();
    assert_eq!(records.len(), 3, "{records:?}");
    assert_eq!(records[0], InputRecord::Event(ev(1)));
    assert_eq!(records[2], InputRecord::Event(ev(2)));
    let InputRecord::Bad(bad) = &records[1] else {
        panic!("the marked record read as {:?}", records[1]);
    };
    // Offsets may be sparse, but one writer's are consecutive.
    assert_eq!(bad.offset, r[0].start + 1);
    assert!(
        bad.position.ends_with(&format!("/0@{}", bad.offset)),
        "{}",
        bad.position
    );
    assert!(bad.error.contains("not JSON"), "{}", bad.error);
    assert_eq!(bad.value.as_deref(), Some(&b"{nope"[..]));
    assert_eq!(
        log.read_records("in", 0, r[0].clone(), true).unwrap(),
        records,
        "an exact read gives the same records"
    );
    for exact in [false, true] {
        let mut lent = Vec::new();
        let count = log
            .each_record("in", 0, r[0].clone(), exact, &mut |record| {
                lent.push(match record {
                    RecordRef::Event { value, weight } => InputRecord::Event(Event {
                        value: value.to_vec(),
                        weight,
                    }),
                    RecordRef::Bad(bad) => InputRecord::Bad(bad),
                });
                Ok(())
            })
            .unwrap();
        assert_eq!(count, 3);
        assert_eq!(lent, records, "each_record lends what read_records returns");
    }
    // Past the partition's end as this reader sees it (Kafka's offsets
    // are sparse: its transaction markers take offsets after the records).
    let (_, high) = log.watermarks("in", 0).unwrap();
    let past = r[0].start..high + 1;
    assert!(
        log.each_record("in", 0, past, true, &mut |_| Ok(()))
            .is_err(),
        "an exact read past the end fails"
    );
    let mut calls = 0;
    let stopped = log.each_record("in", 0, r[0].clone(), false, &mut |_| {
        calls += 1;
        Err(Error::Corrupt {
            what: "the reader".into(),
            message: "stops".into(),
        })
    });
    assert!(matches!(stopped, Err(Error::Corrupt { .. })), "{stopped:?}");
    assert_eq!(calls, 1, "an error from the reader stops the read");
    match log.read("in", 0, r[0].clone()) {
        Err(Error::BadRecord { position, message }) => {
            assert_eq!(position, bad.position);
            assert!(message.contains("not JSON"), "{message}");
        }
        other => panic!("a plain read of a bad record: {other:?}"),
    }
    assert_eq!(
        log.read("in", 0, r[0].start..r[0].start + 1).unwrap(),
        vec![ev(1)]
    );
}

/// A whole step's dead letters commit with it and read back as entries of
/// the input's dead-letter log, tagged with the step and the worker; a
/// second commit of the step is refused with them.
pub fn dead_letters_commit_with_their_step(log: &dyn LogBackend) {
    log.fence().unwrap();
    let mut commit = sample_commit(0, 3);
    commit.dead_letters = vec![(
        dead_letter_log("in"),
        vec![OutputEntry {
            step: 0,
            worker: 0,
            frontier: commit.record.frontiers[0].clone(),
            events: vec![letter(1)],
        }],
    )];
    log.commit_step(&commit).unwrap();
    assert!(matches!(
        log.commit_step(&commit),
        Err(Error::StepExists { step: 0 })
    ));
    assert_eq!(
        entries(log, &dead_letter_log("in")),
        vec![(0, 0, vec![letter(1)])]
    );
    assert_eq!(entries(log, "out").len(), 1, "the outputs are there too");
}

/// A worker's share of a divided step commits its dead letters with its
/// done record; a replay of the share (its done record there) writes none
/// again.
pub fn a_share_commits_its_dead_letters_once(log: Arc<dyn LogBackend>) {
    if !log.worker_commits() {
        return;
    }
    log.fence().unwrap();
    let division = sample_division(0, 5, 0);
    log.commit_step(&StepCommit::division(division.clone()))
        .unwrap();
    let share = |w: u32| {
        let with = sample_share(&division, w, vec![ev(u64::from(w))]);
        match w {
            0 => with.with_dead_letters(
                &division.frontiers[0],
                [(dead_letter_log("in"), vec![letter(2), letter(4)])],
            ),
            _ => with,
        }
    };
    let mut holder = log.clone().take_worker(0).unwrap();
    assert_eq!(holder.commit(&share(0)).unwrap(), WorkerDone::Committed);
    assert_eq!(holder.commit(&share(0)).unwrap(), WorkerDone::Already);
    let mut other = log.clone().take_worker(1).unwrap();
    assert_eq!(other.commit(&share(1)).unwrap(), WorkerDone::Committed);
    assert!(log.await_complete(0).is_ok());
    assert_eq!(
        entries(&*log, &dead_letter_log("in")),
        vec![(0, 0, vec![letter(2), letter(4)])],
        "the dead letters once, with worker 0's share"
    );
}
