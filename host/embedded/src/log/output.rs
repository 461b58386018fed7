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
//!
//! An ingested entry larger than [`PIECE_BYTES`] is stored as pieces: its
//! encoding cut into values of that size under keys
//! `[log][step][worker][piece][pieces]` (two big-endian `u32`s after the
//! entry's own key), which sort in order right after where the entry's key
//! would be. One 20 MB value had RocksDB's table builder grow a block to
//! 32 MiB and copy it again to finish it, in memory first touched for each
//! step (a third of a q0 run's page faults); a piece is a block of its own,
//! and the encoding is never one buffer either. A reader joins an entry's
//! pieces and checks that none is missing; the pieces are ingested in one
//! table file with the entry's step, atomically. A binary from before
//! pieces stops at such a key, as a malformed one.

use super::{EmbeddedLog, be_u64, output_key};
use crate::db::{self, CF_OUTPUT, CF_STEPS, rocks};
use rocksdb::{Direction, IteratorMode, WriteBatch};
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
    /// Writes a step's output entries (keys and their entries) as table
    /// files, one per log so that none spans another log's keys, an entry
    /// larger than a piece as pieces, and ingests them together (see the
    /// module's docs), having marked the output unsettled: until the step's
    /// record commits, the entries count as past the last step.
    pub(super) fn ingest_output(
        &self,
        step: u64,
        mut entries: Vec<(Vec<u8>, &OutputEntry)>,
    ) -> Result<()> {
        self.unsettled_output.store(true, Ordering::Release);
        // Latest first, sorted stably: the first of equal keys is the last
        // given (as a batch keeps the last put).
        entries.reverse();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|later, kept| later.0 == kept.0);
        // One table per log; a log's keys are its length-prefixed name and
        // 12 bytes. An entry's pieces sort right after its key, before the
        // next entry's.
        let mut tables: Vec<(&[u8], Vec<Row>)> = Vec::new();
        for (key, entry) in &entries {
            let mut pieces = postcard::serialize_with_flavor(*entry, Pieces(Vec::new()))
                .map_err(Error::corrupt("output entry"))?;
            let rows = if pieces.len() <= 1 {
                vec![(key.clone(), pieces.pop().unwrap_or_default())]
            } else {
                let count = u32::try_from(pieces.len()).map_err(|_| Error::Corrupt {
                    what: format!("the output of step {step}"),
                    message: format!("an entry of {} pieces", pieces.len()),
                })?;
                (0..count)
                    .zip(pieces)
                    .map(|(index, piece)| (piece_key(key, index, count), piece))
                    .collect()
            };
            let log = &key[..key.len().saturating_sub(12)];
            match tables.last_mut() {
                Some((l, table)) if *l == log => table.extend(rows),
                _ => tables.push((log, rows)),
            }
        }
        let tables = (tables.into_iter().enumerate())
            .map(|(i, (_, table))| (format!("{TABLE_PREFIX}{i}.sst"), table));
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

    /// Like [`LogBackend::scan_output`](sluice_storage::LogBackend::scan_output),
    /// also passing the step and worker that each entry's key says it
    /// belongs to.
    pub fn scan_output_keyed(
        &self,
        output: &str,
        from_step: u64,
        f: &mut dyn FnMut(u64, u32, OutputEntry) -> Result<std::ops::ControlFlow<()>>,
    ) -> Result<()> {
        let cf = db::cf(&self.db, CF_OUTPUT)?;
        let mut prefix = Vec::new();
        db::push_name(&mut prefix, output);
        let start = output_key(output, from_step, 0);
        // A divided step's shares are visible once all are.
        let end = self.visible_end()?;
        let place = || format!("output log `{output}`");
        let decode = |step: u64, value: &[u8]| -> Result<OutputEntry> {
            postcard::from_bytes(value).map_err(Error::corrupt(format!(
                "step {step}'s entry of output log `{output}`"
            )))
        };
        // An entry stored as pieces (see `output`), joined so far.
        let mut joined: Option<Joined> = None;
        // The last entry's (step, worker): a log holds one entry of each.
        let mut last = None;
        for item in self
            .db
            .iterator_cf(cf, IteratorMode::From(&start, Direction::Forward))
        {
            let (k, v) = item.map_err(rocks("reading output"))?;
            if !k.starts_with(&prefix) {
                break;
            }
            let rest = &k[prefix.len()..];
            let malformed = || Error::Corrupt {
                what: place(),
                message: "malformed key".into(),
            };
            let be_u32 = |at: usize| rest[at..at + 4].try_into().map(u32::from_be_bytes);
            if rest.len() != 12 && rest.len() != 20 {
                return Err(malformed());
            }
            let step = be_u64(&rest[..8], "output key")?;
            let worker = be_u32(8).map_err(|_| malformed())?;
            if step >= end {
                break;
            }
            let entry = if rest.len() == 12 {
                if let Some(j) = joined {
                    return Err(j.incomplete(place()));
                }
                decode(step, &v)?
            } else {
                let index = be_u32(12).map_err(|_| malformed())?;
                let count = be_u32(16).map_err(|_| malformed())?;
                if index >= count {
                    return Err(malformed());
                }
                let mut j = match joined.take() {
                    None if index == 0 => Joined {
                        step,
                        worker,
                        count,
                        next: 0,
                        // At most 64 MiB ahead: a corrupt count is found
                        // short of pieces, not as an allocation failure.
                        bytes: Vec::with_capacity(
                            v.len().saturating_mul(count as usize).min(64 << 20),
                        ),
                    },
                    Some(j)
                        if (j.step, j.worker, j.count, j.next) == (step, worker, count, index) =>
                    {
                        j
                    }
                    Some(j) => return Err(j.incomplete(place())),
                    None => {
                        let j = Joined {
                            step,
                            worker,
                            count,
                            next: 0,
                            bytes: Vec::new(),
                        };
                        return Err(j.incomplete(place()));
                    }
                };
                j.bytes.extend_from_slice(&v);
                j.next += 1;
                if j.next < j.count {
                    joined = Some(j);
                    continue;
                }
                decode(step, &j.bytes)?
            };
            if last.replace((step, worker)) == Some((step, worker)) {
                return Err(Error::Corrupt {
                    what: place(),
                    message: format!("step {step} holds two entries of worker {worker}"),
                });
            }
            if f(step, worker, entry)?.is_break() {
                break;
            }
        }
        match joined {
            Some(j) => Err(j.incomplete(place())),
            None => Ok(()),
        }
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
        // Each log's keys are its length-prefixed name, 12 bytes (step,
        // worker) and, for a piece, 8 more: one seek to past the last step,
        // one past the log.
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

/// An output entry stored as pieces (see `output`), joined up to piece
/// `next` of `count`.
struct Joined {
    step: u64,
    worker: u32,
    count: u32,
    next: u32,
    bytes: Vec<u8>,
}

impl Joined {
    /// The entry lacks a piece: the log (`what`) is corrupt.
    fn incomplete(&self, what: String) -> Error {
        Error::Corrupt {
            what,
            message: format!(
                "step {}'s entry of worker {} lacks piece {} of its {}",
                self.step, self.worker, self.next, self.count
            ),
        }
    }
}

/// A key and its value, as a table file holds them.
type Row = (Vec<u8>, Vec<u8>);

/// The size of an ingested entry's pieces (see the module's docs): a block
/// of the log's tables.
pub(super) const PIECE_BYTES: usize = 64 << 10;

/// The key of piece `index` of `count` of the entry whose key is `key`.
fn piece_key(key: &[u8], index: u32, count: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 8);
    k.extend_from_slice(key);
    k.extend_from_slice(&index.to_be_bytes());
    k.extend_from_slice(&count.to_be_bytes());
    k
}

/// A postcard flavor that writes an encoding as pieces of [`PIECE_BYTES`]
/// (the last one shorter), so no buffer is as large as the entry. Pieces
/// are small enough for the allocator to take from memory freed before
/// rather than map fresh pages for.
struct Pieces(Vec<Vec<u8>>);

impl postcard::ser_flavors::Flavor for Pieces {
    type Output = Vec<Vec<u8>>;

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.try_extend(&[byte])
    }

    fn try_extend(&mut self, mut data: &[u8]) -> postcard::Result<()> {
        while !data.is_empty() {
            match self.0.last_mut() {
                Some(piece) if piece.len() < PIECE_BYTES => {
                    let n = (PIECE_BYTES - piece.len()).min(data.len());
                    piece.extend_from_slice(&data[..n]);
                    data = &data[n..];
                }
                _ => self.0.push(Vec::with_capacity(PIECE_BYTES)),
            }
        }
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Vec<Vec<u8>>> {
        Ok(self.0)
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

    /// An entry larger than a piece is stored as pieces, under keys of
    /// its own, beside entries that are not, and reads back whole, after a
    /// reopen too; a missing piece is corruption, not a shorter entry.
    #[test]
    fn a_large_entry_is_stored_as_pieces_and_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let mut commit = wide(0);
        // Worker 1's entry: some 3.5 pieces of events of many lengths.
        commit.outputs[0].1[1].events = (0..380)
            .map(|i| sluice_core::Event {
                value: vec![b'a' + (i % 26) as u8; 1 + i * 3],
                weight: i as i64 - 7,
            })
            .collect();
        let size = postcard::to_allocvec(&commit.outputs[0].1[1])
            .unwrap()
            .len();
        assert!((3 * PIECE_BYTES..4 * PIECE_BYTES).contains(&size), "{size}");
        let read = |log: &EmbeddedLog| {
            let mut seen = Vec::new();
            log.scan_output_keyed("out", 0, &mut |step, worker, entry| {
                seen.push((step, worker, entry));
                Ok(std::ops::ControlFlow::Continue(()))
            })
            .map(|()| seen)
        };
        {
            let log = open(dir.path());
            log.fence().unwrap();
            log.commit_step(&commit).unwrap();
            log.commit_step(&wide(1)).unwrap();
            let seen = read(&log).unwrap();
            let expected: Vec<_> = (commit.outputs[0].1.iter())
                .chain(&wide(1).outputs[0].1)
                .map(|e| (e.step, e.worker, e.clone()))
                .collect();
            assert_eq!(seen, expected);
            // Two single entries and four pieces of step 0, a dead letter,
            // then step 1's four.
            assert_eq!(raw_keys(&log), 2 + 4 + 1 + 4);
        }
        let log = EmbeddedLog::open(db::open(dir.path()).unwrap()).unwrap();
        assert_eq!(read(&log).unwrap().len(), 6);
        assert_eq!(read(&log).unwrap()[1].2, commit.outputs[0].1[1]);
        // A piece gone, in the middle or at the end.
        let out = db::cf(&log.db, CF_OUTPUT).unwrap();
        let key = output_key("out", 0, 1);
        for (index, lacks) in [(3, "lacks piece 3 of its 4"), (1, "lacks piece 1 of its 4")] {
            log.db.delete_cf(out, piece_key(&key, index, 4)).unwrap();
            let err = read(&log).unwrap_err().to_string();
            assert!(err.contains(lacks) && err.contains("worker 1"), "{err}");
        }
        // From step 1 on, what is left reads.
        let mut later = 0;
        log.scan_output_keyed("out", 1, &mut |_, _, _| {
            later += 1;
            Ok(std::ops::ControlFlow::Continue(()))
        })
        .unwrap();
        assert_eq!(later, 3);
    }

    /// Pieces a failed record left are deleted before the step is written
    /// again with fewer of them; a trim deletes pieces with their step; an
    /// entry stored both whole and as pieces is corruption.
    #[test]
    fn pieces_are_settled_and_trimmed_with_their_step() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path());
        log.fence().unwrap();
        // A commit of `step` whose one entry holds `n` KB of events.
        let big = |step: u64, n: usize| {
            let mut c = conformance::sample_commit(step, 2 + 3 * step);
            c.outputs[0].1[0].events = (0..n)
                .map(|i| sluice_core::Event {
                    value: vec![b'x'; 1000],
                    weight: 1 + i as i64,
                })
                .collect();
            c
        };
        let events = |log: &EmbeddedLog| {
            let mut seen = Vec::new();
            log.scan_output_keyed("out", 0, &mut |step, _, entry| {
                seen.push((step, entry.events.len()));
                Ok(std::ops::ControlFlow::Continue(()))
            })
            .map(|()| seen)
        };
        log.commit_step(&big(0, 300)).unwrap();
        FAIL_RECORD.with(|f| f.set(true));
        assert!(log.commit_step(&big(1, 300)).is_err());
        assert_eq!(raw_keys(&log), 5 + 5, "step 1's pieces are left");
        log.commit_step(&big(1, 150)).unwrap();
        assert_eq!(events(&log).unwrap(), [(0, 300), (1, 150)]);
        assert_eq!(raw_keys(&log), 5 + 3);
        log.trim_output("out", 1).unwrap();
        assert_eq!(raw_keys(&log), 3);
        assert_eq!(events(&log).unwrap(), [(1, 150)]);
        // Step 1's entry written whole beside its pieces.
        let out = db::cf(&log.db, CF_OUTPUT).unwrap();
        let whole = postcard::to_allocvec(&big(1, 1).outputs[0].1[0]).unwrap();
        log.db.put_cf(out, output_key("out", 1, 0), whole).unwrap();
        let err = events(&log).unwrap_err().to_string();
        assert!(err.contains("two entries of worker 0"), "{err}");
    }

    /// An encoding is cut into pieces of exactly `PIECE_BYTES` (the last
    /// shorter) that join to postcard's own bytes.
    #[test]
    fn pieces_join_to_the_encoding() {
        for len in [0, 1, PIECE_BYTES - 3, PIECE_BYTES, 5 * PIECE_BYTES / 2] {
            let value = (vec![7u8; len], len as u64);
            let pieces = postcard::serialize_with_flavor(&value, Pieces(Vec::new())).unwrap();
            let (last, full) = pieces.split_last().unwrap();
            assert!(full.iter().all(|p| p.len() == PIECE_BYTES));
            assert!((1..=PIECE_BYTES).contains(&last.len()));
            assert_eq!(pieces.concat(), postcard::to_allocvec(&value).unwrap());
        }
    }
}
