//! `sluice gen`: generating standard benchmark input as JSON lines, offline.
//!
//! Nexmark (an online auction: people, auctions, bids) comes from the
//! `nexmark` crate's deterministic generator, so anyone can run the
//! standard queries on the same data without a network.

use anyhow::{Context, Result, bail};
use nexmark::EventGenerator;
use nexmark::config::NexmarkConfig;
use nexmark::event::Event;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The files `gen_nexmark` wrote and how many events each holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NexmarkFiles {
    /// `person.jsonl` and its event count.
    pub person: (PathBuf, u64),
    /// `auction.jsonl` and its event count.
    pub auction: (PathBuf, u64),
    /// `bid.jsonl` and its event count.
    pub bid: (PathBuf, u64),
}

/// The generator's base time (ms since the epoch, 2023-11-14T22:13:20Z):
/// fixed, so the same `--events` always gives the same files.
pub const NEXMARK_BASE_TIME: u64 = 1_700_000_000_000;

/// Writes the first `events` Nexmark events (default configuration, base
/// time [`NEXMARK_BASE_TIME`]) to
/// `person.jsonl`, `auction.jsonl` and `bid.jsonl` in `out`, one JSON
/// object per line.
/// `rate` is the event rate (events per second of event time) that spaces
/// the timestamps: 10 000 is the generator's default. `progress` gets the
/// number of events written so far.
pub fn gen_nexmark(
    events: u64,
    rate: u32,
    out: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<NexmarkFiles> {
    if rate == 0 {
        bail!("the Nexmark event rate must be positive");
    }
    std::fs::create_dir_all(out).with_context(|| out.display().to_string())?;
    let open = |name: &str| -> Result<(PathBuf, BufWriter<std::fs::File>)> {
        let path = out.join(name);
        let file = std::fs::File::create(&path).with_context(|| path.display().to_string())?;
        Ok((path, BufWriter::with_capacity(1 << 20, file)))
    };
    let (mut person, mut auction, mut bid) = (
        open("person.jsonl")?,
        open("auction.jsonl")?,
        open("bid.jsonl")?,
    );
    let mut counts = [0u64; 3];
    let config = NexmarkConfig {
        base_time: NEXMARK_BASE_TIME,
        first_rate: rate as usize,
        next_rate: rate as usize,
        ..NexmarkConfig::default()
    };
    for (i, event) in EventGenerator::new(config)
        .take(events as usize)
        .enumerate()
    {
        let (slot, (path, writer)) = match &event {
            Event::Person(_) => (0, &mut person),
            Event::Auction(_) => (1, &mut auction),
            Event::Bid(_) => (2, &mut bid),
        };
        let written = match &event {
            Event::Person(p) => serde_json::to_writer(&mut *writer, p),
            Event::Auction(a) => serde_json::to_writer(&mut *writer, a),
            Event::Bid(b) => serde_json::to_writer(&mut *writer, b),
        };
        written.with_context(|| path.display().to_string())?;
        writer
            .write_all(b"\n")
            .with_context(|| path.display().to_string())?;
        counts[slot] += 1;
        if i % 4096 == 0 {
            progress(i as u64);
        }
    }
    for (path, writer) in [&mut person, &mut auction, &mut bid] {
        writer.flush().with_context(|| path.display().to_string())?;
    }
    progress(events);
    Ok(NexmarkFiles {
        person: (person.0, counts[0]),
        auction: (auction.0, counts[1]),
        bid: (bid.0, counts[2]),
    })
}
