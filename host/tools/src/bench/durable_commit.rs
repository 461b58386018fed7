//! **Durable commit**: the runtime's step commits per second against raw
//! synced RocksDB write batches of the same bytes; and the sample commits
//! (also used by `benches/commit.rs`).

use super::report::{Row, rate};
use super::workloads::wordcount_ports;
use sluice_core::{Event, Frontier, OutputEntry, PartitionId, StepCommit, StepRecord};
use sluice_embedded::{db, output_key};
use sluice_pipeline::{PipelineConfig, Storage};
use std::time::Instant;

/// Step commits like the runtime's: W=2, one output log `counts`, `events`
/// events of ~30 bytes per worker, each record chained to the one before.
pub fn sample_commits(steps: u64, events: usize, epoch: u64) -> Vec<StepCommit> {
    let mut prev = 0;
    (0..steps)
        .map(|step| {
            let c = sample_commit(step, events, epoch, prev);
            prev = c.record.chain_hash();
            c
        })
        .collect()
}

/// One commit of [`sample_commits`], linked to the record whose chain hash
/// is `prev` (also used by `benches/commit.rs`).
pub fn sample_commit(step: u64, events: usize, epoch: u64, prev: u128) -> StepCommit {
    let frontiers: Vec<Frontier> = (0..2)
        .map(|w| {
            [(
                PartitionId {
                    input: 0,
                    partition: w,
                },
                (step + 1) * 1000,
            )]
            .into_iter()
            .collect()
        })
        .collect();
    let entries = (0..2u32)
        .map(|w| OutputEntry {
            step,
            worker: w,
            frontier: frontiers[w as usize].clone(),
            events: (0..events)
                .map(|i| Event {
                    value: format!("{{\"word\":\"w{i}\",\"count\":{step}}}").into_bytes(),
                    weight: 1,
                })
                .collect(),
        })
        .collect();
    StepCommit {
        record: StepRecord {
            step,
            epoch,
            time_ms: step,
            frontiers,
            output_hashes: vec![step as u128, 0],
            limits: Default::default(),
            prev,
            layout: None,
        },
        outputs: vec![("counts".into(), entries)],
        dead_letters: Vec::new(),
    }
}

/// The durable commit row: step commits through the runtime's guarded path
/// against raw synced RocksDB write batches of the same keys and bytes.
pub(super) fn durable_commit(quick: bool, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let (steps, events) = (if quick { 150 } else { 1000 }, 50);
    // The runtime's path: invariant checks, epoch check, one synced batch.
    let dir = tempfile::tempdir()?;
    let storage = Storage::open(
        &PipelineConfig::new(dir.path(), 2),
        &wordcount_ports(),
        "bench",
    )?;
    let guarded = storage.guarded();
    let epoch = guarded.fence()?;
    let commits = sample_commits(steps, events, epoch);
    let t = Instant::now();
    for c in &commits {
        guarded.commit_step(c)?;
    }
    let runtime = rate(steps, t.elapsed());
    // Raw RocksDB: the same keys and bytes, one synced batch per step.
    let dir = tempfile::tempdir()?;
    let database = db::open(dir.path())?;
    let (out, steps_cf) = (
        db::cf(&database, db::CF_OUTPUT)?,
        db::cf(&database, db::CF_STEPS)?,
    );
    let t = Instant::now();
    for c in &commits {
        let mut wb = rocksdb::WriteBatch::default();
        for (name, entries) in &c.outputs {
            for e in entries {
                wb.put_cf(
                    out,
                    output_key(name, e.step, e.worker),
                    postcard::to_allocvec(e)?,
                );
            }
        }
        wb.put_cf(
            steps_cf,
            c.record.step.to_be_bytes(),
            postcard::to_allocvec(&c.record)?,
        );
        database.write_opt(wb, &db::synced())?;
    }
    let raw = rate(steps, t.elapsed());
    rows.push(Row {
        scenario: "durable commit",
        case: format!("{steps} step commits, W=2, {events} events per worker"),
        measured: format!("{runtime:.0} steps/s (runtime)"),
        baseline: format!("{raw:.0} batches/s (raw synced WriteBatch)"),
        ratio: runtime / raw,
        goal: "≥ 0.8×",
        met: Some(runtime / raw >= 0.8),
    });
    Ok(())
}
