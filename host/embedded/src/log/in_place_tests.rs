//! The embedded log behind [`InPlaceLog`]: the wrapper passes the log
//! conformance suite (every call of an input not read in place is the
//! log's), and a registered file is read back, across a reopen, until it
//! changes — under a reader, or between two opens.

use super::*;
use sluice_storage::conformance::{self, LogFlags};
use sluice_storage::in_place::InPlaceLog;
use std::cell::RefCell;

/// A file of `lines` JSON lines, `"l0"`, `"l1"`, …
fn lines_file(dir: &std::path::Path, lines: usize) -> std::path::PathBuf {
    let path = dir.join("lines.jsonl");
    let text: String = (0..lines).map(|i| format!("\"l{i}\"\n")).collect();
    std::fs::write(&path, text).unwrap();
    path
}

/// Every value of partition `partition`, as text.
fn values(log: &dyn LogBackend, partition: u32) -> Result<Vec<String>> {
    let (_, high) = log.watermarks("in", partition)?;
    let events = log.read_exact("in", partition, 0..high)?;
    Ok(events
        .into_iter()
        .map(|e| String::from_utf8(e.value).unwrap())
        .collect())
}

#[test]
fn the_wrapper_passes_the_log_conformance_suite() {
    let dirs = RefCell::new(Vec::new());
    conformance::log_backend(
        &|| {
            let dir = tempfile::tempdir().unwrap();
            let log = Arc::new(EmbeddedLog::open(db::open(dir.path()).unwrap()).unwrap());
            dirs.borrow_mut().push(dir);
            Arc::new(InPlaceLog::open(log, &[]).unwrap())
        },
        LogFlags {
            supports_trim: true,
            dense_offsets: true,
            output_retention: true,
        },
    );
}

/// Lines dealt to two partitions in blocks of 1024, read back after a
/// reopen; a byte changed under the reader stops its next read of that
/// block, and the next open.
#[test]
fn a_registered_file_is_read_back_until_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let file = lines_file(dir.path(), 2500);
    let db_dir = dir.path().join("db");
    {
        let embedded = Arc::new(EmbeddedLog::open(db::open(&db_dir).unwrap()).unwrap());
        embedded.create_input("in", 2).unwrap();
        let log = InPlaceLog::open(embedded, &[("in".into(), 2)]).unwrap();
        let report = log.read_in_place("in", &file, &mut |_, _| {}).unwrap();
        assert_eq!((report.appended, report.in_place), (2500, true));
        assert_eq!(log.file_of("in"), Some(file.canonicalize().unwrap()));
    }
    let embedded = Arc::new(EmbeddedLog::open(db::open(&db_dir).unwrap()).unwrap());
    let log = InPlaceLog::open(embedded.clone(), &[("in".into(), 2)]).unwrap();
    // Blocks 0 and 2 (lines 0-1023, 2048-2499) in partition 0, block 1 in 1.
    let zero = values(&log, 0).unwrap();
    let one = values(&log, 1).unwrap();
    assert_eq!(zero.len(), 1024 + 452);
    assert_eq!(one.len(), 1024);
    assert_eq!(
        (zero[0].as_str(), zero[1024].as_str()),
        ("\"l0\"", "\"l2048\"")
    );
    assert_eq!(one[0], "\"l1024\"");
    // A partition the input does not have is refused, not served from
    // another partition's blocks.
    for refused in [
        log.read("in", 2, 0..10).map(|_| ()),
        log.watermarks("in", 2).map(|_| ()),
    ] {
        let err = refused.unwrap_err().to_string();
        assert!(err.contains("has 2 partitions"), "{err}");
    }
    // The log beneath holds none of them, and the wrapper takes no
    // appends to the input.
    assert_eq!(embedded.watermarks("in", 0).unwrap(), (0, 0));
    let append = log.append(AppendBatch {
        appends: vec![(
            "in".into(),
            0,
            vec![Event {
                value: b"1".to_vec(),
                weight: 1,
            }],
        )],
        ..AppendBatch::default()
    });
    assert!(matches!(append, Err(Error::Config(_))), "{append:?}");

    // `"l1030"` becomes `"l1031"`: block 1 (partition 1) changed.
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.windows(7).position(|w| w == b"\"l1030\"").unwrap() + 5;
    bytes[at] = b'1';
    std::fs::write(&file, &bytes).unwrap();
    assert_eq!(
        values(&log, 0).unwrap(),
        zero,
        "other blocks read as before"
    );
    let changed = values(&log, 1);
    assert!(
        matches!(&changed, Err(Error::InPlaceChanged { message, .. }) if message.contains("while the pipeline reads it")),
        "{changed:?}"
    );
    drop(log);
    let reopened = InPlaceLog::open(embedded, &[("in".into(), 2)]);
    assert!(
        matches!(&reopened, Err(Error::InPlaceChanged { message, .. }) if message.contains("no longer starts with")),
        "{:?}",
        reopened.err()
    );
}
