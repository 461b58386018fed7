//! The index of a file read in place: where each block of lines starts
//! and a hash of each, built by reading the file's whole lines once
//! ([`scan`]), and where a partition's records lie among the blocks.

use crate::ingest::{IngestError, LINES_PER_PARTITION_BLOCK};
use std::io::Read;
use std::path::Path;
use xxhash_rust::xxh3::Xxh3;

/// Lines per block: a block's lines all go to one partition.
pub(super) const BLOCK: u64 = LINES_PER_PARTITION_BLOCK;

/// The registered lines of a file: how many, and where each block of
/// [`BLOCK`] lines starts (then the end) with a hash of each block.
#[derive(Debug, Clone, Default)]
pub(super) struct Index {
    /// Bytes and lines indexed: whole lines.
    pub(super) bytes: u64,
    pub(super) lines: u64,
    /// Where each block starts, then where the last ends.
    pub(super) starts: Vec<u64>,
    /// XXH3-64 of each block's bytes.
    pub(super) hashes: Vec<u64>,
}

/// Records of partition `partition` of `partitions` when a file's `lines`
/// lines are dealt to them in blocks of [`BLOCK`], round robin.
pub(super) fn partition_len(lines: u64, partitions: u32, partition: u32) -> u64 {
    let (p, n) = (u64::from(partition), u64::from(partitions));
    let (full, rest) = (lines / BLOCK, lines % BLOCK);
    let full_here = if full > p { (full - p).div_ceil(n) } else { 0 };
    full_here * BLOCK + if full % n == p { rest } else { 0 }
}

/// The file's block and the line within it that hold record `offset` of
/// partition `partition` of `partitions`.
pub(super) fn locate(offset: u64, partitions: u32, partition: u32) -> (usize, u64) {
    let block = (offset / BLOCK) * u64::from(partitions) + u64::from(partition);
    (block as usize, offset % BLOCK)
}

/// Blocks a registration takes at a time: each chunk's registration is
/// written as the file is read, so the steps start on the first chunks.
pub(super) const CHUNK_BLOCKS: u64 = 16;

/// What a [`scan`] checks on its way.
pub(super) struct Expect<'a> {
    /// A registered part: `(bytes, XXH3-128 hex)` the file must still start
    /// with.
    pub(super) prefix: Option<(u64, &'a str)>,
    /// Read no further than this many bytes.
    pub(super) limit: Option<u64>,
}

/// Whether a line (without its newline) is blank as
/// [`parse_input_line`](sluice_core::wire::parse_input_line) sees it.
fn blank(line: &[u8]) -> bool {
    match line.first() {
        None => true,
        // `str::trim` also strips the vertical tab, which
        // `is_ascii_whitespace` does not count.
        Some(b) if b.is_ascii() && !b.is_ascii_whitespace() && *b != 0x0b => false,
        _ => std::str::from_utf8(line).is_ok_and(|s| s.trim().is_empty()),
    }
}

/// Reads `file`'s whole lines from its start (up to `expect.limit`),
/// hashing and indexing them; fails on a blank line and when the file no
/// longer starts with `expect.prefix`. Calls `chunk` with the index so far
/// and the XXH3-128 (hex) of its bytes once the prefix is checked, every
/// [`CHUNK_BLOCKS`] blocks and at the end, and `progress` with (bytes
/// read, bytes to read). Returns the whole index and its hash.
pub(super) fn scan(
    file: &mut std::fs::File,
    path: &Path,
    input: &str,
    expect: Expect<'_>,
    chunk: &mut dyn FnMut(&Index, String) -> Result<(), IngestError>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(Index, String), IngestError> {
    let io = |source| IngestError::Io {
        path: path.to_owned(),
        source,
    };
    let size = file.metadata().map_err(io)?.len();
    let size = expect.limit.map_or(size, |l| l.min(size));
    let mut out = Index {
        starts: vec![0],
        ..Index::default()
    };
    let mut hashing = Hashing {
        whole: Xxh3::new(),
        block: Xxh3::new(),
        prefix: expect.prefix.filter(|(bytes, _)| *bytes > 0),
    };
    let changed = |bytes: u64| IngestError::Changed {
        path: path.to_owned(),
        bytes,
        input: input.to_owned(),
    };
    let mut buf = vec![0u8; 1 << 20];
    // `buf[..filled]` holds bytes read but not yet taken as lines.
    let (mut filled, mut read) = (0usize, 0u64);
    while read < size {
        if filled == buf.len() {
            // A line longer than the buffer.
            buf.resize(buf.len() * 2, 0);
        }
        let want = (buf.len() - filled).min((size - read) as usize);
        let n = match file.read(&mut buf[filled..filled + want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(e)),
        };
        read += n as u64;
        let (start, end) = (filled, filled + n);
        filled = end;
        // The lines that end in what was just read (a line's start may
        // have been read before).
        let (mut taken, mut line_start) = (0usize, 0usize);
        for nl in memchr::memchr_iter(b'\n', &buf[start..end]).map(|i| start + i) {
            let line = &buf[line_start..nl];
            if blank(line.strip_suffix(b"\r").unwrap_or(line)) {
                return Err(IngestError::BadLine {
                    path: path.to_owned(),
                    line: out.lines + 1,
                    message: "a blank line: an input read in place takes one event per line \
                              (without --read-in-place the file is copied, blank lines skipped)"
                        .into(),
                });
            }
            out.lines += 1;
            line_start = nl + 1;
            if out.lines.is_multiple_of(BLOCK) {
                hashing
                    .feed(&mut out, &buf[taken..line_start])
                    .map_err(changed)?;
                taken = line_start;
                out.hashes.push(hashing.block.digest());
                hashing.block = Xxh3::new();
                out.starts.push(out.bytes);
                if out.lines.is_multiple_of(BLOCK * CHUNK_BLOCKS) && hashing.prefix.is_none() {
                    chunk(&out, format!("{:032x}", hashing.whole.digest128()))?;
                }
            }
        }
        hashing
            .feed(&mut out, &buf[taken..line_start])
            .map_err(changed)?;
        buf.copy_within(line_start..filled, 0);
        filled -= line_start;
        progress(read, size);
    }
    if let Some((bytes, _)) = hashing.prefix {
        // The file is now shorter than its registered part.
        return Err(changed(bytes));
    }
    if !out.lines.is_multiple_of(BLOCK) {
        out.hashes.push(hashing.block.digest());
        out.starts.push(out.bytes);
    }
    let hash = format!("{:032x}", hashing.whole.digest128());
    chunk(&out, hash.clone())?;
    Ok((out, hash))
}

/// The hashers of a [`scan`]: the file's, the block's, and the registered
/// prefix still to check (its end and hash).
struct Hashing<'a> {
    whole: Xxh3,
    block: Xxh3,
    prefix: Option<(u64, &'a str)>,
}

impl Hashing<'_> {
    /// Hashes `bytes` (whole lines, the next of the file), checking the
    /// registered prefix where it ends among them: `Err(its end)` if the
    /// file no longer starts with it.
    fn feed(&mut self, out: &mut Index, mut bytes: &[u8]) -> Result<(), u64> {
        if let Some((end, hash)) = self.prefix
            && out.bytes + bytes.len() as u64 >= end
        {
            let (head, tail) = bytes.split_at((end - out.bytes) as usize);
            self.whole.update(head);
            self.block.update(head);
            if format!("{:032x}", self.whole.digest128()) != hash {
                return Err(end);
            }
            self.prefix = None;
            out.bytes = end;
            bytes = tail;
        }
        self.whole.update(bytes);
        self.block.update(bytes);
        out.bytes += bytes.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dealing lines in blocks of 1024, round robin: every line lands at
    /// one (partition, offset), and [`locate`] finds it there.
    #[test]
    fn every_line_has_one_offset_and_is_found_there() {
        for lines in [0, 1, 1023, 1024, 1025, 5000, 8192, 9000] {
            for partitions in [1, 2, 3, 8] {
                let mut next = vec![0u64; partitions as usize];
                for line in 0..lines {
                    let p = ((line / BLOCK) % u64::from(partitions)) as u32;
                    let offset = next[p as usize];
                    next[p as usize] += 1;
                    let (block, within) = locate(offset, partitions, p);
                    assert_eq!(block as u64 * BLOCK + within, line);
                }
                for p in 0..partitions {
                    assert_eq!(
                        partition_len(lines, partitions, p),
                        next[p as usize],
                        "{lines} lines, {partitions} partitions, partition {p}"
                    );
                }
            }
        }
    }

    fn scan_of(bytes: &[u8], expect: Expect<'_>) -> Result<(Index, String), IngestError> {
        let path = std::env::temp_dir().join(format!(
            "sluice-in-place-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&path, bytes).unwrap();
        let mut file = std::fs::File::open(&path).unwrap();
        let mut chunks = Vec::new();
        let scanned = scan(
            &mut file,
            &path,
            "in",
            expect,
            &mut |index, _| {
                chunks.push(index.lines);
                Ok(())
            },
            &mut |_, _| {},
        );
        std::fs::remove_file(&path).unwrap();
        if let Ok((index, _)) = &scanned {
            // A chunk every CHUNK_BLOCKS blocks, and one at the end.
            assert_eq!(chunks.last(), Some(&index.lines));
            let whole = index.lines / (BLOCK * CHUNK_BLOCKS);
            assert!(chunks.len() as u64 == whole + 1, "{chunks:?}");
        }
        scanned
    }

    const NONE: Expect<'static> = Expect {
        prefix: None,
        limit: None,
    };

    /// A scan takes whole lines only, indexes blocks where they start and
    /// hashes what it took.
    #[test]
    fn a_scan_takes_whole_lines_and_indexes_blocks() {
        let mut text = String::new();
        for i in 0..2500 {
            text.push_str(&format!("{i}\n"));
        }
        let whole = text.len() as u64;
        text.push_str("25"); // a last line still being written
        let (scan, hash) = scan_of(text.as_bytes(), NONE).unwrap();
        assert_eq!((scan.bytes, scan.lines), (whole, 2500));
        assert_eq!(scan.starts.len(), 4);
        assert_eq!(scan.starts[0], 0);
        assert_eq!(scan.starts[1], text.find("1024\n").unwrap() as u64);
        assert_eq!(scan.starts[3], whole);
        assert_eq!(
            hash,
            format!(
                "{:032x}",
                xxhash_rust::xxh3::xxh3_128(&text.as_bytes()[..whole as usize])
            )
        );
        let block = &text.as_bytes()[scan.starts[2] as usize..whole as usize];
        assert_eq!(scan.hashes[2], xxhash_rust::xxh3::xxh3_64(block));
    }

    /// A registered prefix is checked; a changed or shorter file, and a
    /// blank line, are refused.
    #[test]
    fn a_changed_prefix_and_a_blank_line_are_refused() {
        let first = b"1\n2\n3\n";
        let hash = format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&first[..4]));
        let grown = scan_of(
            b"1\n2\n3\n4\n",
            Expect {
                prefix: Some((4, &hash)),
                limit: None,
            },
        )
        .unwrap();
        assert_eq!(grown.0.lines, 4);
        let changed = scan_of(
            b"1\n7\n3\n",
            Expect {
                prefix: Some((4, &hash)),
                limit: None,
            },
        );
        assert!(
            matches!(changed, Err(IngestError::Changed { .. })),
            "{changed:?}"
        );
        let shorter = scan_of(
            b"1\n",
            Expect {
                prefix: Some((4, &hash)),
                limit: None,
            },
        );
        assert!(
            matches!(shorter, Err(IngestError::Changed { .. })),
            "{shorter:?}"
        );
        for line in [&b" \r"[..], b"\x0b", b"\t\x0c \xc2\xa0"] {
            let file = [&b"1\n"[..], line, b"\n3\n"].concat();
            let blank = scan_of(&file, NONE);
            assert!(
                matches!(blank, Err(IngestError::BadLine { line: 2, .. })),
                "{line:?}: {blank:?}"
            );
        }
    }

    /// A line is blank to the scan exactly when the parser skips it: a
    /// line the scan let through and the parser skipped would shift every
    /// later offset against a copy.
    #[test]
    fn blank_is_the_parsers_blank() {
        let mut lines: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        lines.extend((0..128u8).map(|b| vec![b' ', b]));
        lines.extend(
            [&b""[..], b"\xc2\xa0", b"\xe3\x80\x80 x", b"\xe2\x80\xa8"].map(<[u8]>::to_vec),
        );
        for line in lines {
            let parsed = std::str::from_utf8(&line)
                .is_ok_and(|s| matches!(sluice_core::wire::parse_input_line(s), Ok(None)));
            assert_eq!(blank(&line), parsed, "{line:?}");
        }
    }
}
