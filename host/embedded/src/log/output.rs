//! How the embedded log writes a large step's output: as a table file,
//! ingested before the step's record, and collected if the record never
//! comes.
//!
//! A step's output in its commit batch went through the write-ahead log
//! and a memtable, and the memtable's flush wrote it again (a Nexmark q0
//! step at W = 1 is one 20 MB value). Past [`INGEST_AT`] bytes the entries
//! are written once, as a table file RocksDB syncs and ingests, and the
//! batch holds the step record alone. Ingested entries are visible before
//! the record is: output scans stop at the last recorded step, so no
//! reader sees them early, and whatever lies past the last recorded step
//! (a crash, or a failed record, between the two writes) is deleted before
//! the next commit, whole or divided, writes anything.

use super::EmbeddedLog;
use crate::db::{self, CF_OUTPUT, CF_STEPS, rocks};
use rocksdb::{IteratorMode, WriteBatch};
use sluice_core::OutputEntry;
use sluice_storage::{Result, StorageError as Error};
use std::sync::atomic::Ordering;

/// The size of a step's output, in bytes, from which it is ingested as a
/// table file (see the module's docs): a family's memtable. A smaller
/// output costs little in the write-ahead log; a larger one fills a
/// memtable by itself.
pub(super) const INGEST_AT: usize = db::FAMILY_BUFFER;

/// How the names of a step's output tables start, in the data directory
/// while they are written (`step-output-0.sst`, one per log).
const TABLE_PREFIX: &str = "step-output-";

/// Removes output tables a crash left in `dir`, the data directory, while
/// they were written or ingested (a name left after the ingestion is a
/// second name of a live table, holding its blocks on disk after the
/// database drops it). Best effort: one that cannot be removed is
/// unlinked before its name is written again.
pub(super) fn remove_left_tables(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(TABLE_PREFIX) && name.ends_with(".sst") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
thread_local! {
    /// A test's request that the next ingested output's record fail (after
    /// the ingestion), as a write can.
    pub(super) static FAIL_RECORD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl EmbeddedLog {
    /// Writes a step's output entries (keys and their entries, with their
    /// encodings' sizes) as table files, one per log so that none spans
    /// another log's keys, and ingests them together (see the module's
    /// docs), having marked the output unsettled: until the step's record
    /// commits, the entries count as past the last step.
    pub(super) fn ingest_output(
        &self,
        step: u64,
        entries: Vec<(Vec<u8>, &OutputEntry)>,
        sizes: Vec<usize>,
    ) -> Result<()> {
        self.unsettled_output.store(true, Ordering::Release);
        let mut encoded = Vec::with_capacity(entries.len());
        // Latest first, sorted stably: the first of equal keys is the last
        // given (as a batch keeps the last put).
        for ((key, entry), size) in entries.into_iter().zip(sizes).rev() {
            let value = postcard::to_io(entry, Vec::with_capacity(size))
                .map_err(Error::corrupt("output entry"))?;
            encoded.push((key, value));
        }
        encoded.sort_by(|a, b| a.0.cmp(&b.0));
        encoded.dedup_by(|later, kept| later.0 == kept.0);
        // A log's keys are its length-prefixed name and 12 bytes.
        let mut tables: Vec<Vec<(Vec<u8>, Vec<u8>)>> = Vec::new();
        fn log(key: &[u8]) -> &[u8] {
            &key[..key.len().saturating_sub(12)]
        }
        for (key, value) in encoded {
            match tables.last_mut() {
                Some(t) if log(&t[0].0) == log(&key) => t.push((key, value)),
                _ => tables.push(vec![(key, value)]),
            }
        }
        let tables = (tables.into_iter().enumerate())
            .map(|(i, table)| (format!("{TABLE_PREFIX}{i}.sst"), table));
        db::ingest_tables(
            &self.db,
            CF_OUTPUT,
            tables,
            &format!("the output of step {step}"),
        )?;
        #[cfg(test)]
        if FAIL_RECORD.with(|f| f.replace(false)) {
            return Err(Error::Corrupt {
                what: format!("the record of step {step}"),
                message: "its write failed (a test's)".into(),
            });
        }
        Ok(())
    }

    /// If output may lie past the last recorded step (since the log was
    /// opened, or since an ingested output whose record did not commit),
    /// deletes it, durably, and notes that none does. The last step is the
    /// database's, not this handle's: an output is never deleted under a
    /// record that is written.
    pub(super) fn settle_output(&self) -> Result<()> {
        if !self.unsettled_output.load(Ordering::Acquire) {
            return Ok(());
        }
        let steps = db::cf(&self.db, CF_STEPS)?;
        let from = match self.db.iterator_cf(steps, IteratorMode::End).next() {
            Some(item) => {
                let (k, _) = item.map_err(rocks("reading the last step"))?;
                super::be_u64(&k, "step key")? + 1
            }
            None => 0,
        };
        let out = db::cf(&self.db, CF_OUTPUT)?;
        let mut wb = WriteBatch::default();
        let mut it = self.db.raw_iterator_cf(out);
        it.seek_to_first();
        // Each log's keys are its length-prefixed name and 12 bytes (step,
        // worker): one seek to past the last step, one past the log.
        while let Some(key) = it.key() {
            let malformed = || Error::Corrupt {
                what: "output logs".into(),
                message: "malformed key".into(),
            };
            let len = 1 + usize::from(*key.first().ok_or_else(malformed)?);
            let prefix = key.get(..len).ok_or_else(malformed)?;
            let (start, end) = (at_step(prefix, from), past_log(prefix));
            it.seek(&start);
            if it.key().is_some_and(|k| k < end.as_slice()) {
                wb.delete_range_cf(out, start.as_slice(), end.as_slice());
            }
            it.seek(&end);
        }
        it.status()
            .map_err(rocks("looking for output past the last step"))?;
        if !wb.is_empty() {
            self.db
                .write_opt(wb, &db::synced())
                .map_err(rocks("deleting output past the last step"))?;
        }
        self.unsettled_output.store(false, Ordering::Release);
        Ok(())
    }
}

/// The first key of step `step` in the log whose length-prefixed name is
/// `prefix` (as [`output_key`](super::output_key) makes it).
fn at_step(prefix: &[u8], step: u64) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(&step.to_be_bytes());
    k.extend_from_slice(&0u32.to_be_bytes());
    k
}

/// A key past every key of the log whose length-prefixed name is `prefix`.
fn past_log(prefix: &[u8]) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(&[0xFF; 13]);
    k
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_storage::LogBackend;
    use sluice_storage::conformance;

    /// A commit of `step` with three workers' output and a dead-letter log.
    fn wide(step: u64) -> sluice_core::StepCommit {
        let mut c = conformance::sample_commit(step, 5);
        let entry = c.outputs[0].1[0].clone();
        c.outputs[0].1 = (0..3)
            .map(|worker| OutputEntry {
                worker,
                ..entry.clone()
            })
            .collect();
        c.dead_letters = vec![("in.dead-letter".into(), vec![entry])];
        c
    }

    /// Entries in the output family, read or not.
    fn raw_keys(log: &EmbeddedLog) -> usize {
        let out = db::cf(&log.db, CF_OUTPUT).unwrap();
        log.db.iterator_cf(out, IteratorMode::Start).count()
    }

    /// (step, worker) of every entry a scan of `name` reads.
    fn scanned(log: &EmbeddedLog, name: &str) -> Vec<(u64, u32)> {
        let mut seen = Vec::new();
        log.scan_output_keyed(name, 0, &mut |step, worker, _| {
            seen.push((step, worker));
            Ok(std::ops::ControlFlow::Continue(()))
        })
        .unwrap();
        seen
    }

    fn open(dir: &std::path::Path) -> EmbeddedLog {
        let mut log = EmbeddedLog::open(db::open(dir).unwrap()).unwrap();
        log.ingest_output_at = 0;
        log
    }

    /// Commits step 0 on a fresh log, then step 1 (three workers and a
    /// dead letter) whose record fails after its output was ingested.
    fn fail_step_1(log: &EmbeddedLog) {
        log.fence().unwrap();
        log.commit_step(&conformance::sample_commit(0, 2)).unwrap();
        assert!(!log.unsettled_output.load(Ordering::Acquire));
        FAIL_RECORD.with(|f| f.set(true));
        assert!(log.commit_step(&wide(1)).is_err());
        assert_eq!(raw_keys(log), 5);
        assert_eq!(scanned(log, "out"), [(0, 0)], "past the last step");
        assert!(scanned(log, "in.dead-letter").is_empty());
    }

    /// Output ingested for a step whose record never committed (a crash
    /// between the two writes) is never read, and is gone before that step
    /// commits again, with fewer workers; table files left behind go when
    /// the log opens.
    #[test]
    fn ingested_output_without_its_record_is_deleted_before_the_step_commits() {
        let dir = tempfile::tempdir().unwrap();
        fail_step_1(&open(dir.path()));
        let left = dir.path().join(format!("{TABLE_PREFIX}7.sst"));
        std::fs::write(&left, b"a table a crash left").unwrap();
        let log = EmbeddedLog::open(db::open(dir.path()).unwrap()).unwrap();
        assert!(!left.exists());
        assert_eq!(scanned(&log, "out"), [(0, 0)]);
        // Step 1 again, with one worker, through the batch.
        log.commit_step(&conformance::sample_commit(1, 5)).unwrap();
        assert_eq!(scanned(&log, "out"), [(0, 0), (1, 0)]);
        assert!(scanned(&log, "in.dead-letter").is_empty());
        assert_eq!(raw_keys(&log), 2);
        // Settled: the next commits look no further.
        assert!(!log.unsettled_output.load(Ordering::Acquire));
    }

    /// The same when the record's write fails and the step is retried on
    /// the same handle: the next commit deletes what the failed one left.
    /// Each log's entries are a table of their own.
    #[test]
    fn a_failed_record_s_output_is_deleted_before_the_retry() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path());
        fail_step_1(&log);
        log.commit_step(&conformance::sample_commit(1, 5)).unwrap();
        assert_eq!(scanned(&log, "out"), [(0, 0), (1, 0)]);
        assert!(scanned(&log, "in.dead-letter").is_empty());
        log.commit_step(&wide(2)).unwrap();
        assert_eq!(scanned(&log, "out").len(), 5);
        assert_eq!(scanned(&log, "in.dead-letter"), [(2, 0)]);
        // Step 2's tables (the files that start at a key of step 2; a
        // flush the ingestion caused holds step 1's).
        let step = |k: &[u8]| u64::from_be_bytes(k[k.len() - 12..k.len() - 4].try_into().unwrap());
        let tables: Vec<_> = (log.db.live_files().unwrap().into_iter())
            .filter(|f| f.column_family_name == CF_OUTPUT)
            .map(|f| (f.start_key.unwrap(), f.end_key.unwrap()))
            .filter(|(start, _)| step(start) == 2)
            .collect();
        assert_eq!(tables.len(), 2, "one table a log");
        for (start, end) in tables {
            assert_eq!(start[..start.len() - 12], end[..end.len() - 12]);
        }
    }
}
