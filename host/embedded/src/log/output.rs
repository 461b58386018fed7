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

impl EmbeddedLog {
    /// Writes a step's output entries (keys with their entries) as a table
    /// file and ingests it (see the module's docs). The caller has marked
    /// the output unsettled: until the step's record commits, the entries
    /// count as past the last step.
    pub(super) fn ingest_output(
        &self,
        step: u64,
        entries: Vec<(Vec<u8>, &OutputEntry)>,
    ) -> Result<()> {
        let mut encoded = Vec::with_capacity(entries.len());
        // Latest first, sorted stably: the first of equal keys is the last
        // given (as a batch keeps the last put).
        for (key, entry) in entries.into_iter().rev() {
            let value = postcard::to_allocvec(entry).map_err(Error::corrupt("output entry"))?;
            encoded.push((key, value));
        }
        encoded.sort_by(|a, b| a.0.cmp(&b.0));
        encoded.dedup_by(|later, kept| later.0 == kept.0);
        db::ingest_table(
            &self.db,
            CF_OUTPUT,
            "step-output.sst",
            encoded,
            &format!("the output of step {step}"),
        )
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
    use crate::log::output_key;
    use sluice_storage::LogBackend;
    use sluice_storage::conformance;

    /// Output ingested for a step whose record never committed (a crash
    /// between the two writes, or a failed record) is never read, and is
    /// gone before that step commits again, with fewer workers.
    #[test]
    fn ingested_output_without_its_record_is_deleted_before_the_step_commits() {
        let dir = tempfile::tempdir().unwrap();
        let wide = |step: u64| {
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
        };
        let raw_keys = |log: &EmbeddedLog| -> usize {
            let out = db::cf(&log.db, CF_OUTPUT).unwrap();
            log.db.iterator_cf(out, IteratorMode::Start).count()
        };
        let scanned = |log: &EmbeddedLog, name: &str| {
            let mut seen = Vec::new();
            log.scan_output_keyed(name, 0, &mut |step, worker, _| {
                seen.push((step, worker));
                Ok(std::ops::ControlFlow::Continue(()))
            })
            .unwrap();
            seen
        };
        {
            let mut log = EmbeddedLog::open(db::open(dir.path()).unwrap()).unwrap();
            log.ingest_output_at = 0;
            log.fence().unwrap();
            log.commit_step(&conformance::sample_commit(0, 2)).unwrap();
            // Step 1's output is in, its record is not.
            let commit = wide(1);
            let entries = commit
                .logs()
                .flat_map(|(name, es)| es.iter().map(move |e| (output_key(name, 1, e.worker), e)))
                .collect();
            log.unsettled_output.store(true, Ordering::Release);
            log.ingest_output(1, entries).unwrap();
            assert_eq!(raw_keys(&log), 5);
            assert_eq!(scanned(&log, "out"), [(0, 0)], "past the last step");
            assert!(scanned(&log, "in.dead-letter").is_empty());
        }
        let log = EmbeddedLog::open(db::open(dir.path()).unwrap()).unwrap();
        assert_eq!(scanned(&log, "out"), [(0, 0)]);
        // Step 1 again, with one worker, through the batch.
        log.commit_step(&conformance::sample_commit(1, 5)).unwrap();
        assert_eq!(scanned(&log, "out"), [(0, 0), (1, 0)]);
        assert!(scanned(&log, "in.dead-letter").is_empty());
        assert_eq!(raw_keys(&log), 2);
        // Settled: the next commits look no further.
        assert!(!log.unsettled_output.load(Ordering::Acquire));
        log.commit_step(&wide(2)).unwrap();
        assert_eq!(scanned(&log, "out").len(), 5);
        assert_eq!(scanned(&log, "in.dead-letter"), [(2, 0)]);
    }
}
