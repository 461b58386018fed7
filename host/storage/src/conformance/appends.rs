//! The conformance suite's part on appends: offsets and reads, their
//! order within a batch, ingest marks stored with their events, and lazy
//! appends read like any other.

use super::{LogFlags, ev};
use crate::{AppendBatch, IngestMark, LogBackend};

/// Appends return the offsets their events got; reads return what was
/// appended.
pub fn append_read_watermarks(log: &dyn LogBackend, flags: LogFlags) {
    log.create_input("in", 2).unwrap();
    log.create_input("in", 2).unwrap();
    assert!(
        log.create_input("in", 3).is_err(),
        "partition count is fixed"
    );
    assert_eq!(log.partitions("in").unwrap(), 2);
    assert_eq!(log.watermarks("in", 0).unwrap(), (0, 0));
    let r = log
        .append(AppendBatch {
            appends: vec![
                ("in".into(), 0, (0..5).map(ev).collect()),
                ("in".into(), 1, vec![ev(9)]),
            ],
            mark: None,
            producer: None,
        })
        .unwrap();
    if flags.dense_offsets {
        assert_eq!(r, vec![0..5, 0..1]);
    }
    assert_eq!(
        r[0].end - r[0].start,
        5,
        "a single writer's offsets are consecutive"
    );
    assert_eq!(r[1].end - r[1].start, 1);
    let r2 = log
        .append(AppendBatch {
            appends: vec![("in".into(), 0, vec![ev(5)])],
            mark: None,
            producer: None,
        })
        .unwrap();
    if flags.dense_offsets {
        assert_eq!(r2, vec![5..6]);
    }
    assert!(r2[0].start >= r[0].end, "offsets increase");
    let (low, high) = log.watermarks("in", 0).unwrap();
    assert_eq!(low, 0);
    assert!(high >= r2[0].end);
    if flags.dense_offsets {
        assert_eq!(high, 6);
    }
    assert_eq!(
        log.read("in", 0, 0..r2[0].end).unwrap(),
        (0..6).map(ev).collect::<Vec<_>>()
    );
    let at = |i: u64| r[0].start + i;
    assert_eq!(log.read("in", 0, at(2)..at(4)).unwrap(), vec![ev(2), ev(3)]);
    assert_eq!(
        log.read("in", 0, at(4)..high + 100).unwrap(),
        vec![ev(4), ev(5)],
        "reads stop at the high watermark"
    );
    assert_eq!(
        log.read("in", 0, at(1)..at(2)).unwrap(),
        vec![ev(1)],
        "reads go back"
    );
    assert_eq!(log.read("in", 1, r[1].clone()).unwrap(), vec![ev(9)]);
    // An exact read reads the same, and never short.
    assert_eq!(
        log.read_exact("in", 0, at(2)..at(4)).unwrap(),
        vec![ev(2), ev(3)]
    );
    assert_eq!(
        log.read_exact("in", 0, at(4)..high).unwrap(),
        vec![ev(4), ev(5)]
    );
    let short = log.read_exact("in", 0, at(4)..high + 100).unwrap_err();
    assert!(short.is_transient(), "{short}");
}

/// Two appends to one partition in one batch keep their order.
pub fn appends_are_ordered_per_partition(log: &dyn LogBackend) {
    log.create_input("in", 1).unwrap();
    let r = log
        .append(AppendBatch {
            appends: vec![
                ("in".into(), 0, vec![ev(1), ev(2)]),
                ("in".into(), 0, vec![ev(3)]),
            ],
            mark: None,
            producer: None,
        })
        .unwrap();
    assert_eq!(r, vec![0..2, 2..3]);
    assert_eq!(log.read("in", 0, 0..3).unwrap(), vec![ev(1), ev(2), ev(3)]);
}

/// An ingest mark is stored with the events of its batch.
pub fn ingest_marks_are_atomic_with_appends(log: &dyn LogBackend) {
    log.create_input("in", 1).unwrap();
    assert_eq!(log.ingest_mark("file-a").unwrap(), None);
    let mark = IngestMark {
        source: "file-a".into(),
        state: b"10".to_vec(),
    };
    log.append(AppendBatch {
        appends: vec![("in".into(), 0, vec![ev(1)])],
        mark: Some(mark),
        producer: None,
    })
    .unwrap();
    assert_eq!(log.ingest_mark("file-a").unwrap(), Some(b"10".to_vec()));
    assert_eq!(log.ingest_mark("file-b").unwrap(), None);
}

/// A lazy append is an append, its durability aside: read back, in order
/// with the appends around it, with its mark; then synced.
pub fn lazy_appends_are_read_like_appends(log: &dyn LogBackend, flags: LogFlags) {
    log.create_input("in", 1).unwrap();
    let batch = |events, mark: &str| AppendBatch {
        appends: vec![("in".into(), 0, events)],
        mark: Some(IngestMark {
            source: "file-a".into(),
            state: mark.as_bytes().to_vec(),
        }),
        producer: None,
    };
    let first = log.append_lazily(batch(vec![ev(1), ev(2)], "2")).unwrap();
    let second = log.append(batch(vec![ev(3)], "3")).unwrap();
    let third = log.append_lazily(batch(vec![ev(4)], "4")).unwrap();
    log.sync_appends().unwrap();
    if flags.dense_offsets {
        let ranges = [first[0].clone(), second[0].clone(), third[0].clone()];
        assert_eq!(ranges, [0..2, 2..3, 3..4]);
    }
    assert_eq!(first[0].end - first[0].start, 2);
    assert!(
        second[0].start >= first[0].end && third[0].start >= second[0].end,
        "in order with the appends around them"
    );
    let high = log.watermarks("in", 0).unwrap().1;
    assert!(high >= third[0].end);
    assert_eq!(
        log.read("in", 0, 0..high).unwrap(),
        vec![ev(1), ev(2), ev(3), ev(4)]
    );
    assert_eq!(log.ingest_mark("file-a").unwrap(), Some(b"4".to_vec()));
}
