//! **Step log**: what a take-over of a Kafka pipeline costs, and what a
//! host holds of its step log, against the length of its history.
//!
//! For each history length (10 k, 100 k and 1 M steps; 1 k and 10 k with
//! `--quick`), a fresh pipeline's step topic gets the records that many
//! divided steps of a three-worker pipeline leave — the division, three
//! done records, and a checkpoint record every 1 000 steps — written in
//! large transactions ([`KafkaLog::write_history_for_benchmarks`]: running
//! a million steps one transaction each takes hours here). Then:
//!
//! - **open**: a new leader's handle opens the log and does what recovery
//!   asks of it — fence (the tail, to the true end), the last step, the
//!   store's newest checkpoints, and every step record from the newest
//!   checkpoint on (the layout walk and the replay);
//! - **whole read** (the baseline, what every open did before the step log
//!   was windowed): a handle that keeps every record reads the history from
//!   its first step.
//!
//! Each row gives both times and the records each handle holds, with the
//! resident memory the process gained while the handle was open. The last
//! row is the ratio of the open at the longest history to the open at the
//! shortest: flat is about 1.

use super::Row;
use super::report::fmt_time;
use indicatif::{ProgressBar, ProgressStyle};
use sluice_core::{Frontier, PartitionId, StepRecord};
use sluice_kafka::{KafkaConfig, KafkaLog};
use sluice_storage::checkpoint::KEPT;
use sluice_storage::{CheckpointLedger, LogBackend};
use std::time::{Duration, Instant};

/// Workers of the pipeline whose history is written (three hosts).
const WORKERS: u32 = 3;

/// Steps between checkpoints.
const CHECKPOINT_EVERY: u64 = 1_000;

/// What one history length measured.
struct Measured {
    steps: u64,
    open: Duration,
    open_held: usize,
    open_rss: u64,
    whole: Duration,
    whole_held: usize,
    whole_rss: u64,
}

/// Runs the scenario against the brokers at `brokers`, deleting its topics
/// afterwards.
pub fn step_log(brokers: &str, quick: bool, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let lengths: &[u64] = match quick {
        true => &[1_000, 10_000],
        false => &[10_000, 100_000, 1_000_000],
    };
    let mut measured = Vec::new();
    for &steps in lengths {
        let pipeline = format!(
            "bench-steplog-{steps}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis())
                .unwrap_or_default()
        );
        let config = KafkaConfig::new(brokers, &pipeline);
        let result = measure(&config, steps);
        let deleted = sluice_kafka::delete_topics(&config);
        let m = result?;
        if let Err(e) = deleted {
            eprintln!("bench: deleting the topics of {pipeline}: {e}");
        }
        rows.push(Row {
            scenario: "step log",
            case: format!(
                "leader open at {} steps (holds {} records, +{} MiB; whole read holds {}, +{} MiB)",
                thousands(m.steps),
                m.open_held,
                m.open_rss >> 20,
                m.whole_held,
                m.whole_rss >> 20,
            ),
            measured: fmt_time(m.open),
            baseline: format!("{} whole read", fmt_time(m.whole)),
            ratio: m.open.as_secs_f64() / m.whole.as_secs_f64().max(1e-9),
            goal: "informational",
            met: None,
        });
        measured.push(m);
    }
    if let (Some(first), Some(last)) = (measured.first(), measured.last()) {
        let ratio = last.open.as_secs_f64() / first.open.as_secs_f64().max(1e-9);
        rows.push(Row {
            scenario: "step log",
            case: format!(
                "leader open, {} steps against {} (flat in the history)",
                thousands(last.steps),
                thousands(first.steps)
            ),
            measured: fmt_time(last.open),
            baseline: fmt_time(first.open),
            ratio,
            goal: "≤ 2×",
            met: Some(ratio <= 2.0 && last.open_held <= first.open_held.max(1) * 2),
        });
    }
    Ok(())
}

/// Writes a history of `steps` steps to a fresh pipeline, then measures
/// the windowed open and the whole read.
fn measure(config: &KafkaConfig, steps: u64) -> anyhow::Result<Measured> {
    let writer = KafkaLog::open(config.clone())?;
    let epoch = writer.fence()?;
    let bar = ProgressBar::new(steps).with_style(
        ProgressStyle::with_template("bench: writing {pos}/{len} steps {wide_bar} {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    writer.write_history_for_benchmarks(
        0..steps,
        &|step| division(step, epoch),
        CHECKPOINT_EVERY,
        &mut |n| bar.set_position(n),
    )?;
    bar.finish_and_clear();
    drop(writer);

    let rss = sluice_runtime::memory::resident_bytes();
    let started = Instant::now();
    let leader = KafkaLog::open(config.clone())?;
    leader.fence()?;
    let last = leader.last_step()?.unwrap_or_default();
    let newest = leader
        .recorded_checkpoints(KEPT)?
        .last()
        .map_or(0, |(step, _)| *step);
    for step in newest..=last {
        anyhow::ensure!(
            leader.step_record(step)?.is_some(),
            "step {step} of {last} is missing"
        );
    }
    let open = started.elapsed();
    let open_held = leader.steps_in_memory();
    let open_rss = sluice_runtime::memory::resident_bytes().saturating_sub(rss);
    drop(leader);

    let rss = sluice_runtime::memory::resident_bytes();
    let started = Instant::now();
    let mut whole_config = config.clone();
    whole_config.step_window = usize::MAX;
    let whole = KafkaLog::open(whole_config)?;
    whole.fence()?;
    anyhow::ensure!(whole.step_record(0)?.is_some(), "step 0 is missing");
    let whole_time = started.elapsed();
    let whole_held = whole.steps_in_memory();
    let whole_rss = sluice_runtime::memory::resident_bytes().saturating_sub(rss);
    Ok(Measured {
        steps,
        open,
        open_held,
        open_rss,
        whole: whole_time,
        whole_held,
        whole_rss,
    })
}

/// Step `step`'s division among three workers, each reading two partitions
/// of one input.
fn division(step: u64, epoch: u64) -> StepRecord {
    let frontiers = (0..WORKERS)
        .map(|w| {
            (0..2)
                .map(|p| {
                    let id = PartitionId {
                        input: 0,
                        partition: w * 2 + p,
                    };
                    (id, (step + 1) * 10)
                })
                .collect::<Frontier>()
        })
        .collect();
    StepRecord {
        step,
        epoch,
        time_ms: 1_700_000_000_000 + step,
        frontiers,
        output_hashes: Vec::new(),
        limits: Default::default(),
        prev: 0,
        layout: None,
    }
}

/// `n` with thin spaces between thousands.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}
