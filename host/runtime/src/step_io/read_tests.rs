//! A step's read split among threads ([`read_steps`]) gives each worker
//! what one read gives: the same batches, in the same order, and the same
//! records skipped.

use super::{InputRange, Spare, StepRead, read_batches, read_steps};
use sluice_core::{BadRecordPolicy, Event, PartitionId};
use sluice_embedded::{EmbeddedLog, db};
use sluice_storage::LogBackend;
use sluice_storage::in_place::InPlaceLog;
use std::sync::Arc;

/// Input `in` (port 0, 3 partitions) read in place from a file of 4 000
/// lines, every 97th of them not JSON; input `side` (port 1, 2
/// partitions) appended: 500 events to each partition.
fn logs(dir: &std::path::Path) -> InPlaceLog {
    let file = dir.join("in.jsonl");
    let text: String = (0..4_000)
        .map(|i| match i % 97 {
            0 => format!("not json {i}\n"),
            _ => format!("{{\"n\":{i}}}\n"),
        })
        .collect();
    std::fs::write(&file, text).unwrap();
    let embedded = Arc::new(EmbeddedLog::open(db::open(&dir.join("db")).unwrap()).unwrap());
    embedded.create_input("in", 3).unwrap();
    embedded.create_input("side", 2).unwrap();
    let log = InPlaceLog::open(embedded, &[("in".into(), 3)]).unwrap();
    log.read_in_place("in", &file, &mut |_, _| {}).unwrap();
    for partition in 0..2 {
        let events = (0..500)
            .map(|i| Event {
                value: format!("{{\"side\":{partition},\"i\":{i}}}").into_bytes(),
                weight: if i % 5 == 0 { -1 } else { 1 },
            })
            .collect();
        log.append(sluice_storage::AppendBatch {
            appends: vec![("side".into(), partition, events)],
            mark: None,
            producer: None,
        })
        .unwrap();
    }
    log
}

fn range(input: u32, name: &str, partition: u32, start: u64, end: u64) -> InputRange {
    InputRange {
        id: PartitionId { input, partition },
        name: name.into(),
        start,
        end,
        bad_records: BadRecordPolicy::DeadLetter,
    }
}

/// A batch as comparable values: its port, values, ends and weights.
type Parts = (u32, Vec<u8>, Vec<u32>, Vec<i64>);

/// A worker's read as comparable values: its batches; the dead letters.
fn parts(read: &StepRead) -> (Vec<Parts>, String) {
    let batches = (read.batches.iter())
        .map(|b| (b.port, b.values.clone(), b.ends.clone(), b.weights.clone()))
        .collect();
    (batches, format!("{:?}", read.dead_letters))
}

#[test]
fn a_split_read_gives_what_one_read_gives() {
    let dir = tempfile::tempdir().unwrap();
    let log = logs(dir.path());
    // Worker 0: two partitions of `in`, one of `side`, then `in` again;
    // worker 1: `side` first, then the third partition of `in`; worker 2
    // reads nothing.
    // (The file's lines are dealt to the partitions in blocks of 1 024:
    // partition 0 holds 1 952 of them, 1 and 2 hold 1 024 each.)
    let w0 = [
        range(0, "in", 0, 0, 900),
        range(0, "in", 1, 100, 1_024),
        range(1, "side", 0, 0, 500),
        range(0, "in", 0, 900, 1_952),
    ];
    let w1 = [range(1, "side", 1, 40, 500), range(0, "in", 2, 0, 1_000)];
    let ranges: Vec<&[InputRange]> = vec![&w0, &w1, &[]];
    let spare = Spare::default();
    let one: Vec<StepRead> = (ranges.iter())
        .map(|r| read_batches(&log, r, false, &spare).unwrap())
        .collect();
    let unsplit = read_steps(&log, &ranges, false, &spare, (u64::MAX, 4)).unwrap();
    for (w, (a, b)) in one.iter().zip(&unsplit).enumerate() {
        assert!(parts(a) == parts(b), "worker {w} below the threshold");
    }
    let dead: usize = one.iter().map(|r| r.dead_letters.count() as usize).sum();
    assert!(dead > 20, "{dead} records skipped");
    for threads in [2, 3, 4, 8] {
        let split = read_steps(&log, &ranges, false, &spare, (1, threads)).unwrap();
        assert_eq!(split.len(), 3);
        for (w, (a, b)) in one.iter().zip(&split).enumerate() {
            assert!(parts(a) == parts(b), "worker {w} with {threads} threads");
        }
    }
    // Under `fail`, the error is the first bad record's, as in one read,
    // though a later range's run fails too.
    let strict = [
        range(1, "side", 0, 0, 500),
        range(1, "side", 1, 0, 500),
        range(0, "in", 1, 100, 1_024),
        range(0, "in", 2, 0, 1_024),
    ]
    .map(|r| InputRange {
        bad_records: BadRecordPolicy::Fail,
        ..r
    });
    let ranges: Vec<&[InputRange]> = vec![&strict];
    let err = |split| match read_steps(&log, &ranges, false, &spare, split) {
        Ok(_) => panic!("a bad record was read under `fail`"),
        Err(e) => e.to_string(),
    };
    let first = err((u64::MAX, 1));
    assert!(first.contains("in/1@"), "{first}");
    assert_eq!(err((1, 4)), first);
}
