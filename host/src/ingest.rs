//! Appending JSON-lines files to input logs, exactly once.
//!
//! Each file is appended in chunks; every chunk's append carries a mark
//! (bytes and lines consumed, SHA-256 of the consumed prefix) stored
//! atomically with its events. Running again resumes after the last durable
//! chunk, skips a file already appended, appends only what was added to a
//! file that grew, and refuses a file whose appended part changed.

use crate::error::{Error, Result};
use crate::spec::parse_input_line;
use crate::storage::{AppendBatch, Event, IngestMark, LogBackend};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

/// Lines per append (and per durable mark).
const CHUNK_LINES: usize = 8192;
/// Consecutive lines that go to one partition.
const LINES_PER_PARTITION_BLOCK: u64 = 1024;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct FileMark {
    bytes: u64,
    lines: u64,
    prefix_sha256: String,
}

/// What ingesting one file did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestReport {
    /// Events appended now.
    pub appended: u64,
    /// Lines appended by earlier runs (skipped now).
    pub already: u64,
}

/// Appends the JSON lines of `path` to input log `input` (with `partitions`
/// partitions), exactly once across runs and crashes.
pub fn ingest_file(
    log: &dyn LogBackend,
    input: &str,
    partitions: u32,
    path: &Path,
    progress: &ProgressBar,
) -> Result<IngestReport> {
    let canonical = path.canonicalize().map_err(Error::io(path))?;
    let source = format!("file:{input}:{}", canonical.display());
    let mut file = std::fs::File::open(&canonical).map_err(Error::io(path))?;
    let size = file.metadata().map_err(Error::io(path))?.len();
    let mark: FileMark = match log.ingest_mark(&source)? {
        Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
            what: format!("ingest mark of {}", path.display()),
            message: e.to_string(),
        })?,
        None => FileMark::default(),
    };
    progress.set_length(size);
    progress.set_position(0);

    // Check that what was appended before is still the file's prefix.
    let mut hasher = Sha256::new();
    if mark.bytes > 0 {
        let mut prefix = (&mut file).take(mark.bytes);
        let copied = std::io::copy(&mut prefix, &mut hasher).map_err(Error::io(path))?;
        if copied != mark.bytes || hex::encode(hasher.clone().finalize()) != mark.prefix_sha256 {
            return Err(Error::Config(format!(
                "{} changed since its first {} bytes were appended to input `{input}`; \
                 refusing to guess what is new (append to the file only, or use a new --data directory)",
                path.display(),
                mark.bytes
            )));
        }
        file.seek(SeekFrom::Start(mark.bytes))
            .map_err(Error::io(path))?;
    }
    progress.set_position(mark.bytes);
    let mut report = IngestReport {
        appended: 0,
        already: mark.lines,
    };
    let (mut bytes, mut lines) = (mark.bytes, mark.lines);
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut line = String::new();
    loop {
        let mut parts: Vec<Vec<Event>> = vec![Vec::new(); partitions as usize];
        let mut chunk_lines = 0;
        while chunk_lines < CHUNK_LINES {
            line.clear();
            let n = reader.read_line(&mut line).map_err(|e| {
                Error::Config(format!("{}: line {}: {e}", path.display(), lines + 1))
            })?;
            if n == 0 {
                break;
            }
            lines += 1;
            chunk_lines += 1;
            bytes += n as u64;
            hasher.update(line.as_bytes());
            let event = parse_input_line(&line)
                .map_err(|m| Error::Config(format!("{}: line {lines}: {m}", path.display())))?;
            if let Some(event) = event {
                let p = ((lines - 1) / LINES_PER_PARTITION_BLOCK) % partitions as u64;
                parts[p as usize].push(event);
            }
        }
        if chunk_lines == 0 {
            break;
        }
        let events: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let mark = FileMark {
            bytes,
            lines,
            prefix_sha256: hex::encode(hasher.clone().finalize()),
        };
        let state = serde_json::to_vec(&mark).map_err(|e| Error::Config(e.to_string()))?;
        log.append(AppendBatch {
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
        progress.set_position(bytes);
        crate::runtime::crash::crash_point(crate::runtime::crash::CrashPoint::MidIngest);
    }
    Ok(report)
}
