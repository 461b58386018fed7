//! Input files read where they are: an input log whose records are the
//! lines of a JSON-lines file, read from the file itself instead of
//! copied into the log (`sluice run --read-in-place`).
//!
//! A file read in place is *registered* for its input: the whole lines it
//! holds then (bytes, lines, an XXH3-128 of them) are recorded durably in
//! the log, after the file itself is synced; those lines are the input's
//! records, partitioned exactly as [`ingest`](crate::ingest) partitions a
//! copied file (blocks of 1024 lines, round robin), so a step reads the
//! same records at the same offsets either way. Registering the same file
//! again after lines were appended to it extends the input; anything else
//! that changed the registered part is refused.
//!
//! [`InPlaceLog`] wraps any [`LogBackend`] and serves the reads of
//! registered inputs from their files; everything else goes to the log
//! beneath. On every open the registered part of each file is read again,
//! checked against its hash and indexed (where each block of lines
//! starts, and a hash of each block); every read checks the blocks it
//! reads against those hashes, so a file changed under a running pipeline
//! stops it ([`StorageError::InPlaceChanged`]) instead of feeding a replay
//! other records than the first run read.
//!
//! What it costs the user: the file must stay as it was registered for as
//! long as the pipeline may replay it — the pipeline never trims it (a
//! trim of an input read in place discards nothing), and an input read in
//! place takes no appends from elsewhere (a producer, another file). A
//! line that is not an event is found when a step reads it, not before:
//! the step then fails on it, or dead-letters it, by the input's policy,
//! as it does a record kept by an ingest under `dead-letter` (so does a
//! line that is not UTF-8, which an ingest refuses with its whole file:
//! the one place the two differ). A blank line
//! is refused when the file is registered (a copy skips blank lines, which
//! would shift every offset after one).

mod index;

use crate::error::{Result, StorageError};
use crate::ingest::{IngestError, IngestReport};
use crate::log::{not_visible, unknown_partition};
use crate::{
    AppendBatch, BadRecord, IngestMark, InputRecord, LogBackend, ProducerState, RecordRef,
    WorkerCommitter,
};
use index::{BLOCK, Expect, Index, locate, partition_len, scan};
use serde::{Deserialize, Serialize};
use sluice_core::{ConfigError, Event, OutputEntry, StepCommit, StepRecord};
use std::collections::HashMap;
use std::ops::{ControlFlow, Range};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use xxhash_rust::xxh3::xxh3_64;

/// The name under which an input's registration is stored (an ingest
/// mark's source; copied files' marks are named `file:…`).
fn source(input: &str) -> String {
    format!("in-place:{input}")
}

/// What the log records of a file read in place, as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Registration {
    /// The file, canonical.
    path: PathBuf,
    /// Its whole lines registered: bytes and lines.
    bytes: u64,
    lines: u64,
    /// XXH3-128 of those bytes, hex.
    prefix_xxh3: String,
}

/// A registered file, indexed.
#[derive(Debug)]
struct InPlaceFile {
    path: PathBuf,
    file: std::fs::File,
    partitions: u32,
    /// What of it is registered, indexed; grows while it is registered.
    index: RwLock<Index>,
}

impl InPlaceFile {
    fn index(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Records of partition `partition`.
    fn partition_len(&self, partition: u32) -> u64 {
        partition_len(self.index().lines, self.partitions, partition)
    }
}

/// A log whose registered inputs are read from their files (see the
/// module's docs); everything else is the log beneath's.
pub struct InPlaceLog {
    inner: Arc<dyn LogBackend>,
    /// Input → its file.
    files: RwLock<HashMap<String, Arc<InPlaceFile>>>,
}

impl InPlaceLog {
    /// Wraps `inner`, whose inputs are `inputs` (name, partitions): an
    /// input registered to be read in place is read from its file from now
    /// on, which is checked and indexed here. Fails when such a file
    /// changed since (see [`StorageError::InPlaceChanged`]).
    pub fn open(inner: Arc<dyn LogBackend>, inputs: &[(String, u32)]) -> Result<InPlaceLog> {
        let log = InPlaceLog {
            inner,
            files: RwLock::new(HashMap::new()),
        };
        for (input, partitions) in inputs {
            let Some(reg) = log.registration(input)? else {
                continue;
            };
            let file = open_registered(input, *partitions, reg)?;
            log.write().insert(input.clone(), Arc::new(file));
        }
        Ok(log)
    }

    /// The file input `input` is read from, if it is read in place.
    pub fn file_of(&self, input: &str) -> Option<PathBuf> {
        self.file(input).map(|f| f.path.clone())
    }

    /// Reads the whole lines of `path` in place as input `input`'s records
    /// from now on: registers the file (or, registered before, the lines
    /// appended to it since), chunk by chunk as it is read, the steps
    /// reading each chunk once it is registered. Every chunk's
    /// registration is written like an ingest's chunk
    /// ([`append_lazily`](LogBackend::append_lazily), after the file is
    /// synced): durable once a step that read it commits, and all of them
    /// before this returns. `progress` gets (bytes checked, bytes to
    /// check). Refused, with nothing changed, when the input holds events
    /// appended otherwise or is read from another file, or the file's
    /// registered part changed; a blank line stops it (the whole chunks of 16
    /// blocks of lines before it stay registered).
    pub fn read_in_place(
        &self,
        input: &str,
        path: &Path,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<IngestReport, IngestError> {
        let refuse = |message: String| {
            IngestError::Storage(StorageError::Config(ConfigError::Invalid(format!(
                "{}: cannot read it in place as input `{input}`: {message}",
                path.display()
            ))))
        };
        let io = |source| IngestError::Io {
            path: path.to_owned(),
            source,
        };
        let canonical = path.canonicalize().map_err(io)?;
        let partitions = self.inner.partitions(input)?;
        let before = self.registration(input)?;
        match &before {
            Some(reg) if reg.path != canonical => {
                return Err(refuse(format!(
                    "the input is read in place from {} (an input is read from one file)",
                    reg.path.display()
                )));
            }
            Some(_) => {}
            None => {
                let appended: u64 = (0..partitions)
                    .map(|p| self.inner.watermarks(input, p).map(|(_, high)| high))
                    .sum::<Result<u64>>()?;
                if appended > 0 {
                    return Err(refuse(format!(
                        "the input holds {appended} events appended to its log (run without \
                         --read-in-place to append the file to them)"
                    )));
                }
            }
        }
        let mut file = std::fs::File::open(&canonical).map_err(io)?;
        // What is registered must outlive a crash of the machine: the file
        // is synced first, and only what it held then is registered.
        let size = file.metadata().map_err(io)?.len();
        file.sync_data().map_err(io)?;
        let indexed = match self.file(input) {
            Some(f) => f,
            None => {
                let f = Arc::new(InPlaceFile {
                    path: canonical.clone(),
                    file: file.try_clone().map_err(io)?,
                    partitions,
                    index: RwLock::new(Index {
                        starts: vec![0],
                        ..Index::default()
                    }),
                });
                self.write().insert(input.to_owned(), f.clone());
                f
            }
        };
        let already = before.as_ref().map_or(0, |r| r.lines);
        let mut chunk = |index: &Index, prefix_xxh3: String| {
            if index.lines <= indexed.index().lines {
                return Ok(());
            }
            let registration = Registration {
                path: canonical.clone(),
                bytes: index.bytes,
                lines: index.lines,
                prefix_xxh3,
            };
            let state =
                serde_json::to_vec(&registration).map_err(StorageError::corrupt("in-place"))?;
            self.inner.append_lazily(AppendBatch {
                appends: Vec::new(),
                mark: Some(IngestMark {
                    source: source(input),
                    state,
                }),
                producer: None,
            })?;
            *indexed.index.write().unwrap_or_else(|p| p.into_inner()) = index.clone();
            Ok(())
        };
        let expect = Expect {
            prefix: before.as_ref().map(|r| (r.bytes, r.prefix_xxh3.as_str())),
            limit: Some(size),
        };
        let scanned = scan(&mut file, path, input, expect, &mut chunk, progress);
        let index = match scanned {
            Ok((index, _)) => index,
            Err(e) => {
                if before.is_none() && indexed.index().lines == 0 {
                    self.write().remove(input);
                }
                return Err(match e {
                    // The ingest's wording speaks of appends; this file
                    // was registered to be read where it is.
                    IngestError::Changed { bytes, .. } => {
                        IngestError::Storage(StorageError::InPlaceChanged {
                            input: input.to_owned(),
                            path: canonical,
                            message: format!("no longer starts with the {bytes} bytes registered"),
                        })
                    }
                    e => e,
                });
            }
        };
        self.inner.sync_appends()?;
        Ok(IngestReport {
            appended: index.lines.saturating_sub(already),
            already,
            bad_lines: 0,
            in_place: true,
        })
    }

    /// The registration stored for `input`, if any.
    fn registration(&self, input: &str) -> Result<Option<Registration>> {
        self.inner
            .ingest_mark(&source(input))?
            .map(|bytes| {
                serde_json::from_slice(&bytes).map_err(StorageError::corrupt(format!(
                    "registration of input `{input}`'s file"
                )))
            })
            .transpose()
    }

    fn file(&self, input: &str) -> Option<Arc<InPlaceFile>> {
        let files = self.files.read().unwrap_or_else(|p| p.into_inner());
        if files.is_empty() {
            return None;
        }
        files.get(input).cloned()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Arc<InPlaceFile>>> {
        self.files.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Lends records `range` of partition `partition` of `f`, read from
    /// the file.
    fn each_in_file(
        f: &InPlaceFile,
        input: &str,
        partition: u32,
        range: Range<u64>,
        exact: bool,
        each: &mut dyn FnMut(RecordRef<'_>) -> Result<()>,
    ) -> Result<u64> {
        if partition >= f.partitions {
            return Err(unknown_partition(input, partition, f.partitions));
        }
        let lines = f.index().lines;
        let len = partition_len(lines, f.partitions, partition);
        if exact && range.end > len {
            return Err(not_visible(input, partition, range.end, len));
        }
        let path = &f.path;
        let changed = |message: String| StorageError::InPlaceChanged {
            input: input.to_owned(),
            path: path.clone(),
            message,
        };
        let end = range.end.min(len);
        let (mut offset, mut buf) = (range.start, Vec::new());
        while offset < end {
            let (block, within) = locate(offset, f.partitions, partition);
            let (start, stop, hash) = {
                let index = f.index();
                (
                    index.starts[block],
                    index.starts[block + 1],
                    index.hashes[block],
                )
            };
            buf.resize((stop - start) as usize, 0);
            match f.file.read_exact_at(&mut buf, start) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Err(changed(format!("now ends before byte {stop}")));
                }
                Err(e) => return Err(StorageError::io(path.clone())(e)),
            }
            if xxh3_64(&buf) != hash {
                return Err(changed(format!(
                    "changed between bytes {start} and {stop} while the pipeline reads it"
                )));
            }
            let first_line = block as u64 * BLOCK;
            let block_lines = BLOCK.min(lines - first_line);
            let take = (end - offset).min(block_lines - within);
            let lines = buf.split(|b| *b == b'\n').skip(within as usize);
            for (i, line) in lines.take(take as usize).enumerate() {
                let at = offset + i as u64;
                // As a copy keeps a line: without its line ending.
                let end = line.iter().rposition(|b| *b != b'\r').map_or(0, |e| e + 1);
                let line = &line[..end];
                let bad = |error: String| {
                    RecordRef::Bad(BadRecord {
                        offset: at,
                        position: format!(
                            "{input}/{partition}@{at} ({} line {})",
                            path.display(),
                            first_line + within + i as u64 + 1
                        ),
                        error,
                        value: Some(line.to_vec()),
                    })
                };
                match std::str::from_utf8(line) {
                    Err(e) => each(bad(format!("the line is not UTF-8: {e}")))?,
                    Ok(text) => match sluice_core::wire::parse_input_line_ref(text) {
                        Ok(Some((value, weight))) => each(RecordRef::Event {
                            value: &value,
                            weight,
                        })?,
                        Ok(None) => {
                            return Err(changed(format!(
                                "line {} is blank",
                                first_line + within + i as u64 + 1
                            )));
                        }
                        Err(e) => each(bad(e.0))?,
                    },
                }
            }
            offset += take;
        }
        Ok(end.saturating_sub(range.start))
    }

    /// Fails an append to an input read in place.
    fn check_append(&self, batch: &AppendBatch) -> Result<()> {
        for (input, _, events) in &batch.appends {
            if let (false, Some(f)) = (events.is_empty(), self.file(input)) {
                return Err(StorageError::Config(ConfigError::Invalid(format!(
                    "input `{input}` is read in place from {}: it takes no appends (append \
                     lines to the file and run it again)",
                    f.path.display()
                ))));
            }
        }
        Ok(())
    }
}

/// Opens and indexes the file of `reg`, checking it still starts with the
/// registered lines.
fn open_registered(input: &str, partitions: u32, reg: Registration) -> Result<InPlaceFile> {
    let changed = |message: String| StorageError::InPlaceChanged {
        input: input.to_owned(),
        path: reg.path.clone(),
        message,
    };
    let mut file =
        std::fs::File::open(&reg.path).map_err(|e| changed(format!("cannot be opened: {e}")))?;
    let expect = Expect {
        prefix: Some((reg.bytes, &reg.prefix_xxh3)),
        limit: Some(reg.bytes),
    };
    let scanned = scan(
        &mut file,
        &reg.path,
        input,
        expect,
        &mut |_, _| Ok(()),
        &mut |_, _| {},
    );
    let index = match scanned {
        Ok((index, _)) if index.lines == reg.lines => index,
        Ok((index, _)) => {
            return Err(changed(format!(
                "holds {} lines in its first {} bytes, not the {} registered",
                index.lines, reg.bytes, reg.lines
            )));
        }
        Err(IngestError::Changed { .. }) => {
            return Err(changed(format!(
                "no longer starts with the {} bytes registered",
                reg.bytes
            )));
        }
        Err(IngestError::Io { source, .. }) => {
            return Err(changed(format!("cannot be read: {source}")));
        }
        Err(IngestError::BadLine { line, .. }) => {
            return Err(changed(format!("line {line} is blank")));
        }
        Err(IngestError::Storage(e)) => return Err(e),
    };
    Ok(InPlaceFile {
        path: reg.path.clone(),
        file,
        partitions,
        index: RwLock::new(index),
    })
}

impl LogBackend for InPlaceLog {
    fn create_input(&self, input: &str, partitions: u32) -> Result<()> {
        self.inner.create_input(input, partitions)
    }

    fn partitions(&self, input: &str) -> Result<u32> {
        self.inner.partitions(input)
    }

    fn append(&self, batch: AppendBatch) -> Result<Vec<Range<u64>>> {
        self.check_append(&batch)?;
        self.inner.append(batch)
    }

    fn append_lazily(&self, batch: AppendBatch) -> Result<Vec<Range<u64>>> {
        self.check_append(&batch)?;
        self.inner.append_lazily(batch)
    }

    fn sync_appends(&self) -> Result<()> {
        self.inner.sync_appends()
    }

    fn producer(&self, id: &str, input: &str) -> Result<Option<ProducerState>> {
        self.inner.producer(id, input)
    }

    fn ingest_mark(&self, source: &str) -> Result<Option<Vec<u8>>> {
        self.inner.ingest_mark(source)
    }

    fn watermarks(&self, input: &str, partition: u32) -> Result<(u64, u64)> {
        match self.file(input) {
            Some(f) if partition >= f.partitions => {
                Err(unknown_partition(input, partition, f.partitions))
            }
            Some(f) => Ok((0, f.partition_len(partition))),
            None => self.inner.watermarks(input, partition),
        }
    }

    fn read(&self, input: &str, partition: u32, range: Range<u64>) -> Result<Vec<Event>> {
        match self.file(input) {
            Some(_) => {
                crate::records::events_only(self.read_records(input, partition, range, false)?)
            }
            None => self.inner.read(input, partition, range),
        }
    }

    fn read_records(
        &self,
        input: &str,
        partition: u32,
        range: Range<u64>,
        exact: bool,
    ) -> Result<Vec<InputRecord>> {
        let Some(f) = self.file(input) else {
            return self.inner.read_records(input, partition, range, exact);
        };
        let mut records = Vec::new();
        Self::each_in_file(&f, input, partition, range, exact, &mut |r| {
            records.push(r.into_record());
            Ok(())
        })?;
        Ok(records)
    }

    fn each_record(
        &self,
        input: &str,
        partition: u32,
        range: Range<u64>,
        exact: bool,
        each: &mut dyn FnMut(RecordRef<'_>) -> Result<()>,
    ) -> Result<u64> {
        match self.file(input) {
            Some(f) => Self::each_in_file(&f, input, partition, range, exact, each),
            None => self.inner.each_record(input, partition, range, exact, each),
        }
    }

    fn read_exact(&self, input: &str, partition: u32, range: Range<u64>) -> Result<Vec<Event>> {
        match self.file(input) {
            Some(_) => {
                crate::records::events_only(self.read_records(input, partition, range, true)?)
            }
            None => self.inner.read_exact(input, partition, range),
        }
    }

    fn location(&self) -> Option<String> {
        // Only workers handed this log (not the one beneath) read the
        // files as it does.
        (self.inner.location()).map(|at| format!("{at}, files read in place by {self:p}"))
    }

    fn reachable(&self) -> Result<()> {
        self.inner.reachable()
    }

    fn record_upgrades(&self, upgrades: &[u8]) -> Result<bool> {
        self.inner.record_upgrades(upgrades)
    }

    fn upgrades(&self) -> Result<Option<Vec<u8>>> {
        self.inner.upgrades()
    }

    fn fence(&self) -> Result<u64> {
        self.inner.fence()
    }

    fn commit_step(&self, commit: &StepCommit) -> Result<()> {
        self.inner.commit_step(commit)
    }

    fn worker_commits(&self) -> bool {
        self.inner.worker_commits()
    }

    fn take_worker(self: Arc<Self>, worker: u32) -> Result<Box<dyn WorkerCommitter>> {
        self.inner.clone().take_worker(worker)
    }

    fn output_hashes(&self, step: u64) -> Result<Option<Vec<u128>>> {
        self.inner.output_hashes(step)
    }

    fn await_complete(&self, step: u64) -> Result<Vec<u128>> {
        self.inner.await_complete(step)
    }

    fn last_step(&self) -> Result<Option<u64>> {
        self.inner.last_step()
    }

    fn step_record(&self, step: u64) -> Result<Option<StepRecord>> {
        self.inner.step_record(step)
    }

    fn scan_output(
        &self,
        output: &str,
        from_step: u64,
        f: &mut dyn FnMut(OutputEntry) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        self.inner.scan_output(output, from_step, f)
    }

    fn trim(&self, input: &str, partition: u32, below: u64) -> Result<()> {
        match self.file(input) {
            // The file is the user's: nothing of it is discarded.
            Some(_) => Ok(()),
            None => self.inner.trim(input, partition, below),
        }
    }

    fn trim_output(&self, output: &str, below_step: u64) -> Result<()> {
        self.inner.trim_output(output, below_step)
    }

    fn output_low(&self, output: &str) -> Result<u64> {
        self.inner.output_low(output)
    }

    fn memory_bytes(&self) -> u64 {
        let files = self.files.read().unwrap_or_else(|p| p.into_inner());
        let index: usize = files.values().map(|f| 16 * f.index().starts.len()).sum();
        self.inner.memory_bytes() + index as u64
    }
}
