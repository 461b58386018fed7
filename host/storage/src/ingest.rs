//! Appending JSON-lines files to input logs, exactly once.
//!
//! Only complete lines are appended: a last line without its newline (a
//! file still being written) is left for the next run. Each file is
//! appended in chunks; every chunk's append carries a mark
//! (bytes and lines consumed, a hash of the consumed prefix) stored
//! atomically with its events. The hash is XXH3-128: it tells a file
//! changed by accident, not one forged to collide (whoever can write the
//! file can write any events into it anyway); marks written before it
//! hold a SHA-256, which is still checked.
//!
//! A line that is not an event fails the ingest, naming the file and the
//! line — unless its input's bad-record policy is `dead-letter`: then it is
//! appended as written, *marked* as not an event (weight 0), and the step
//! that reads it skips it into the input's dead-letter log, with its
//! position and why ([`sluice_core::bad_records`]). Running again resumes after the last durable
//! chunk, skips a file already appended, appends only what was added to a
//! file that grew, and refuses a file whose appended part changed.

use crate::error::StorageError;
use crate::{AppendBatch, IngestMark, LogBackend};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sluice_core::crash::{CrashPoint, crash_point};
use sluice_core::wire::parse_input_line;
use sluice_core::{BadRecordPolicy, Event};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::Xxh3;

/// Why a file could not be appended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IngestError {
    /// The log refused or failed the append.
    #[error(transparent)]
    Storage(#[from] StorageError),

    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A line is not an event.
    #[error("{path}: line {line}: {message}")]
    BadLine {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: u64,
        /// What is wrong with it.
        message: String,
    },

    /// The part of the file appended before has changed since.
    #[error(
        "{path} changed since its first {bytes} bytes were appended to input `{input}`; \
         refusing to guess what is new (append to the file only, or use a new --data directory)"
    )]
    Changed {
        /// The file.
        path: PathBuf,
        /// How much of it was appended before.
        bytes: u64,
        /// The input it was appended to.
        input: String,
    },
}

impl IngestError {
    /// Whether a retry may help: only when the log's failure was transient.
    pub fn is_transient(&self) -> bool {
        matches!(self, IngestError::Storage(e) if e.is_transient())
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> IngestError + '_ {
    move |source| IngestError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Lines per append (and per mark).
const CHUNK_LINES: usize = 8192;
/// Consecutive lines that go to one partition.
pub(crate) const LINES_PER_PARTITION_BLOCK: u64 = 1024;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct FileMark {
    bytes: u64,
    lines: u64,
    /// XXH3-128 of the first `bytes` bytes, hex: what marks hold now.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    prefix_xxh3: String,
    /// SHA-256 of them, hex: what marks held before XXH3 (2026-12-05); read
    /// only, to check a file appended by an older version.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    prefix_sha256: String,
}

/// A prefix hash as marks hold it.
fn xxh3_hex(hasher: &Xxh3) -> String {
    format!("{:032x}", hasher.digest128())
}

/// Reads the part of `file` that `mark` says was appended and checks that
/// it is unchanged (against whichever hash the mark holds): the hasher of
/// that prefix, to go on with, or `Changed`.
fn check_prefix(
    file: &mut std::fs::File,
    mark: &FileMark,
    path: &Path,
    input: &str,
) -> Result<Xxh3, IngestError> {
    let mut hasher = Xxh3::new();
    if mark.bytes == 0 {
        return Ok(hasher);
    }
    if mark.prefix_xxh3.is_empty() && mark.prefix_sha256.is_empty() {
        return Err(StorageError::Corrupt {
            what: format!("ingest mark of {}", path.display()),
            message: format!("{} bytes appended, without a hash of them", mark.bytes),
        }
        .into());
    }
    // A mark from before XXH3: checked by its SHA-256.
    let mut older = mark.prefix_xxh3.is_empty().then(Sha256::new);
    let mut prefix = (&mut *file).take(mark.bytes);
    let mut buf = vec![0; 1 << 20];
    let mut copied = 0u64;
    loop {
        let n = match prefix.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(path)(e)),
        };
        hasher.update(&buf[..n]);
        if let Some(sha) = &mut older {
            sha.update(&buf[..n]);
        }
        copied += n as u64;
    }
    let same = match older {
        Some(sha) => hex::encode(sha.finalize()) == mark.prefix_sha256,
        None => xxh3_hex(&hasher) == mark.prefix_xxh3,
    };
    if copied != mark.bytes || !same {
        return Err(IngestError::Changed {
            path: path.to_owned(),
            bytes: mark.bytes,
            input: input.to_owned(),
        });
    }
    Ok(hasher)
}

/// What ingesting one file did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestReport {
    /// Events appended now.
    pub appended: u64,
    /// Lines appended by earlier runs (skipped now).
    pub already: u64,
    /// Lines that are not events, appended now as marked records (under
    /// the policy `dead-letter`), for the steps to dead-letter.
    pub bad_lines: u64,
    /// Whether the file is read in place ([`crate::in_place`]): its new
    /// lines were registered (counted in `appended`), not copied.
    pub in_place: bool,
}

/// Appends the JSON lines of `path` to input log `input` (with `partitions`
/// partitions), exactly once across runs and crashes. `progress` is called
/// with (bytes done, file size) as chunks are appended; they are durable
/// when this returns (a chunk is appended
/// [lazily](LogBackend::append_lazily), with its mark: a crash of the
/// machine may lose the last chunks, never part of one, and a step that
/// read them made them durable by committing; after an error, the chunks
/// before it are as durable as the next write makes them, and a run again
/// resumes after the last that is). A line that is
/// not an event fails the ingest under `bad_lines` = `fail`; under
/// `dead-letter` it is appended marked (see the module's docs).
pub fn ingest_file(
    log: &dyn LogBackend,
    input: &str,
    partitions: u32,
    path: &Path,
    bad_lines: BadRecordPolicy,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<IngestReport, IngestError> {
    let canonical = path.canonicalize().map_err(io(path))?;
    let source = format!("file:{input}:{}", canonical.display());
    let mut file = std::fs::File::open(&canonical).map_err(io(path))?;
    let size = file.metadata().map_err(io(path))?.len();
    let mark: FileMark = match log.ingest_mark(&source)? {
        Some(bytes) => serde_json::from_slice(&bytes).map_err(StorageError::corrupt(format!(
            "ingest mark of {}",
            path.display()
        )))?,
        None => FileMark::default(),
    };

    // Check that what was appended before is still the file's prefix.
    let hasher = check_prefix(&mut file, &mark, path, input)?;
    if mark.bytes > 0 {
        file.seek(SeekFrom::Start(mark.bytes)).map_err(io(path))?;
    }
    progress(mark.bytes, size);
    let mut report = IngestReport {
        appended: 0,
        already: mark.lines,
        bad_lines: 0,
        in_place: false,
    };
    let reader = Chunks {
        reader: BufReader::with_capacity(1 << 20, file),
        path,
        partitions,
        bad_lines,
        hasher,
        bytes: mark.bytes,
        lines: mark.lines,
        ended: false,
    };
    // The file is read, checked and hashed on a thread of its own while
    // the chunk before is appended:
    // one chunk ahead, no more (a rendezvous: the next chunk waits, built,
    // until the append before it is done).
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel(0);
        std::thread::Builder::new()
            .name("sluice-ingest".into())
            .spawn_scoped(scope, move || reader.send_all(&tx))
            .map_err(io(path))?;
        for chunk in rx {
            let Chunk {
                parts,
                events,
                bad_lines,
                mark,
            } = chunk?;
            let state = serde_json::to_vec(&mark).map_err(StorageError::corrupt("ingest mark"))?;
            log.append_lazily(AppendBatch {
                appends: parts
                    .into_iter()
                    .enumerate()
                    .filter(|(_, events)| !events.is_empty())
                    .map(|(p, events)| (input.to_owned(), p as u32, events))
                    .collect(),
                mark: Some(IngestMark {
                    source: source.clone(),
                    state,
                }),
                producer: None,
            })?;
            report.appended += events;
            report.bad_lines += bad_lines;
            progress(mark.bytes, size);
            crash_point(CrashPoint::MidIngest);
        }
        // Every chunk is durable before the file is reported appended.
        log.sync_appends()?;
        Ok(report)
    })
}

/// One append's worth of a file: its events by partition, and the mark
/// that says how far the file is appended once they are.
struct Chunk {
    parts: Vec<Vec<Event>>,
    /// Events among `parts` (not the lines kept as bad records).
    events: u64,
    /// Lines kept as bad records.
    bad_lines: u64,
    mark: FileMark,
}

/// A file read from a mark on: whole lines, checked and hashed, in chunks.
struct Chunks<'a> {
    reader: BufReader<std::fs::File>,
    path: &'a Path,
    partitions: u32,
    bad_lines: BadRecordPolicy,
    /// The XXH3-128 of the file up to `bytes`.
    hasher: Xxh3,
    /// Bytes and lines read so far.
    bytes: u64,
    lines: u64,
    /// Whether the end was reached, or a last line still being written:
    /// nothing more is read (its start is consumed, and the rest of it
    /// must not be taken for a line of its own).
    ended: bool,
}

impl Chunks<'_> {
    /// Sends every chunk to `tx`, then stops: at the file's end (or its
    /// last line still being written), at an error (sent last), or when
    /// the receiver is gone.
    fn send_all(mut self, tx: &std::sync::mpsc::SyncSender<Result<Chunk, IngestError>>) {
        loop {
            match self.next_chunk() {
                Ok(None) => return,
                Ok(Some(chunk)) => {
                    if tx.send(Ok(chunk)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            }
        }
    }

    /// The next chunk of up to [`CHUNK_LINES`] lines, or `None` at the end.
    fn next_chunk(&mut self) -> Result<Option<Chunk>, IngestError> {
        let path = self.path;
        let mut parts: Vec<Vec<Event>> = vec![Vec::new(); self.partitions as usize];
        let (mut chunk_lines, mut bad) = (0, 0);
        let mut line = String::new();
        while chunk_lines < CHUNK_LINES && !self.ended {
            line.clear();
            let n = self
                .reader
                .read_line(&mut line)
                .map_err(|e| IngestError::BadLine {
                    path: path.to_owned(),
                    line: self.lines + 1,
                    message: e.to_string(),
                })?;
            if n == 0 || !line.ends_with('\n') {
                // The end, or a last line still being written: it is left
                // for the next run, whole.
                self.ended = true;
                break;
            }
            self.lines += 1;
            chunk_lines += 1;
            self.bytes += n as u64;
            self.hasher.update(line.as_bytes());
            let event = match (parse_input_line(&line), self.bad_lines) {
                (Ok(event), _) => event,
                (Err(m), BadRecordPolicy::Fail) => {
                    return Err(IngestError::BadLine {
                        path: path.to_owned(),
                        line: self.lines,
                        message: m.to_string(),
                    });
                }
                (Err(_), BadRecordPolicy::DeadLetter) => {
                    bad += 1;
                    Some(Event {
                        value: line.trim_end_matches(['\n', '\r']).as_bytes().to_vec(),
                        weight: 0,
                    })
                }
            };
            if let Some(event) = event {
                let p = ((self.lines - 1) / LINES_PER_PARTITION_BLOCK) % self.partitions as u64;
                parts[p as usize].push(event);
            }
        }
        if chunk_lines == 0 {
            return Ok(None);
        }
        let events = parts.iter().flatten().filter(|e| e.weight != 0).count() as u64;
        Ok(Some(Chunk {
            parts,
            events,
            bad_lines: bad,
            mark: FileMark {
                bytes: self.bytes,
                lines: self.lines,
                prefix_xxh3: xxh3_hex(&self.hasher),
                prefix_sha256: String::new(),
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A last line still being written ends the reading: when the writer
    /// finishes it between two chunks, its rest is not read as a line.
    #[test]
    fn a_line_finished_between_chunks_is_left_whole_for_the_next_run() {
        let path = std::env::temp_dir().join(format!(
            "sluice-ingest-test-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        std::fs::write(&path, "1\n2\n3\n12").unwrap();
        let mut chunks = Chunks {
            reader: BufReader::new(std::fs::File::open(&path).unwrap()),
            path: &path,
            partitions: 2,
            bad_lines: BadRecordPolicy::Fail,
            hasher: Xxh3::new(),
            bytes: 0,
            lines: 0,
            ended: false,
        };
        let chunk = chunks.next_chunk().unwrap().expect("the whole lines");
        assert_eq!(chunk.events, 3);
        assert_eq!((chunk.mark.bytes, chunk.mark.lines), (6, 3));
        assert_eq!(
            chunk.mark.prefix_xxh3,
            format!("{:032x}", xxhash_rust::xxh3::xxh3_128(b"1\n2\n3\n"))
        );
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(b"345\n").unwrap();
        let next = chunks.next_chunk();
        std::fs::remove_file(&path).unwrap();
        assert!(
            next.unwrap().is_none(),
            "the rest of a line read in part is no line of its own"
        );
    }

    /// A mark holds the hash of the prefix it covers: XXH3 now, SHA-256
    /// in marks written before; both are checked, and a changed prefix is
    /// refused either way.
    #[test]
    fn a_prefix_is_checked_by_the_hash_its_mark_holds() {
        let path = std::env::temp_dir().join(format!(
            "sluice-ingest-prefix-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        std::fs::write(&path, "1\n2\n3\n").unwrap();
        let check = |mark: &str| {
            let mark: FileMark = serde_json::from_str(mark).unwrap();
            let mut file = std::fs::File::open(&path).unwrap();
            check_prefix(&mut file, &mark, &path, "in").map(|h| xxh3_hex(&h))
        };
        let sha = hex::encode(Sha256::digest(b"1\n2\n"));
        let xxh = format!("{:032x}", xxhash_rust::xxh3::xxh3_128(b"1\n2\n"));
        let older = format!(r#"{{"bytes":4,"lines":2,"prefix_sha256":"{sha}"}}"#);
        let newer = format!(r#"{{"bytes":4,"lines":2,"prefix_xxh3":"{xxh}"}}"#);
        // Either way the hasher goes on from the prefix's XXH3.
        assert_eq!(check(&older).unwrap(), xxh);
        assert_eq!(check(&newer).unwrap(), xxh);
        std::fs::write(&path, "1\n7\n3\n").unwrap();
        let older = check(&older);
        let newer = check(&newer);
        std::fs::remove_file(&path).unwrap();
        assert!(
            matches!(older, Err(IngestError::Changed { .. })),
            "{older:?}"
        );
        assert!(
            matches!(newer, Err(IngestError::Changed { .. })),
            "{newer:?}"
        );
        // A new mark is written without the old field.
        let mark = FileMark {
            bytes: 4,
            lines: 2,
            prefix_xxh3: xxh,
            prefix_sha256: String::new(),
        };
        assert!(!serde_json::to_string(&mark).unwrap().contains("sha256"));
    }
}
