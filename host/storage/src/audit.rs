//! The offline audit behind `sluice verify`: checks what the invariants
//! promise from what a backend stores, through the storage traits, so it
//! audits an embedded pipeline and a Kafka one alike.
//!
//! - step records are contiguous from 0, one frontier and one hash per
//!   worker, and chained (each holds the hash of the one before, so a step
//!   rewritten in place breaks the next link); frontiers never move
//!   backwards, never past the input, never drop a partition, and name only
//!   partitions their worker reads;
//! - every output log holds exactly one entry per step per worker (I1),
//!   tagged with that step's frontier;
//! - no output exists for a step without a record (I3: the division is
//!   durable no later than the outputs);
//! - each worker's outputs of a step hash to the hash in the step record;
//! - committed checkpoints cover committed steps, with those steps'
//!   frontiers and one state per worker;
//! - no input partition is trimmed above the newest committed checkpoint's
//!   frontier (I2).
//!
//! The first violation found is returned, named precisely. A backend may
//! add checks of its own layout first (the embedded log checks that every
//! entry is stored under its own key).

use crate::error::{Result, StorageError};
use crate::{CheckpointStore, LogBackend};
use sluice_core::{Event, Frontier, PartitionId, PipelineShape, StepRecord, hash_outputs};
use std::collections::BTreeMap;

/// What an audit found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every check passed.
    Consistent(Summary),
    /// The first violation, described.
    Violation(String),
}

/// What a consistent pipeline holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Committed steps.
    pub steps: u64,
    /// Output entries across all output logs.
    pub entries: u64,
    /// Committed checkpoints (their steps).
    pub checkpoints: Vec<u64>,
}

/// Why a check stopped: a violation found, or storage failing to answer.
enum Stop {
    Violation(String),
    Storage(StorageError),
}

impl From<StorageError> for Stop {
    fn from(e: StorageError) -> Self {
        match e {
            // Undecodable or self-contradicting data is a finding, not a
            // failure to look.
            StorageError::Corrupt { what, message } => {
                Stop::Violation(format!("corrupt {what}: {message}"))
            }
            e => Stop::Storage(e),
        }
    }
}

type Check<T> = std::result::Result<T, Stop>;

macro_rules! violation {
    ($($arg:tt)*) => { return Err(Stop::Violation(format!($($arg)*))) };
}

/// Audits a pipeline of shape `shape` stored in `log` and `checkpoints`.
/// Fails only when storage cannot be read; what it finds is the verdict.
pub fn audit(
    log: &dyn LogBackend,
    checkpoints: &dyn CheckpointStore,
    shape: &PipelineShape,
) -> Result<Verdict> {
    let run = || -> Check<Summary> {
        let highs = high_watermarks(log, shape)?;
        let records = step_records(log, shape, &highs)?;
        let entries = output_logs(log, shape, &records)?;
        let checkpoints = checkpoints_and_trims(log, checkpoints, shape, &records, &highs)?;
        Ok(Summary {
            steps: records.len() as u64,
            entries,
            checkpoints,
        })
    };
    match run() {
        Ok(summary) => Ok(Verdict::Consistent(summary)),
        Err(Stop::Violation(v)) => Ok(Verdict::Violation(v)),
        Err(Stop::Storage(e)) => Err(e),
    }
}

/// Every input partition with its log name and high watermark.
fn high_watermarks(
    log: &dyn LogBackend,
    shape: &PipelineShape,
) -> Check<BTreeMap<PartitionId, (String, u64)>> {
    let mut highs = BTreeMap::new();
    for (id, name) in shape.partitions() {
        let (_, high) = log.watermarks(name, id.partition)?;
        highs.insert(id, (name.to_owned(), high));
    }
    Ok(highs)
}

/// The step records, checked: contiguous, well-formed, frontiers moving
/// forward and within the input.
fn step_records(
    log: &dyn LogBackend,
    shape: &PipelineShape,
    highs: &BTreeMap<PartitionId, (String, u64)>,
) -> Check<Vec<StepRecord>> {
    let w = shape.workers as usize;
    let Some(last) = log.last_step()? else {
        return Ok(Vec::new());
    };
    let mut records: Vec<StepRecord> = Vec::new();
    for step in 0..=last {
        let Some(record) = log.step_record(step)? else {
            violation!("step records: step {step} is missing below the last committed step {last}");
        };
        if record.step != step {
            violation!("step {step}: its record says step {}", record.step);
        }
        if record.frontiers.len() != w || record.output_hashes.len() != w {
            violation!(
                "step {step}: {} frontiers and {} hashes for {w} workers",
                record.frontiers.len(),
                record.output_hashes.len()
            );
        }
        let link = records.last().map_or(0, StepRecord::chain_hash);
        if record.prev != link {
            violation!(
                "step {step}'s record does not chain to step {}'s: a step before it was rewritten \
                 after it was committed",
                step.saturating_sub(1)
            );
        }
        let previous = records
            .last()
            .map(|r| r.frontiers.clone())
            .unwrap_or_else(|| vec![Frontier::new(); w]);
        for (worker, (before, after)) in previous.iter().zip(&record.frontiers).enumerate() {
            if let Some((id, _)) = before.iter().find(|(id, _)| !after.contains_key(id)) {
                let name = highs.get(id).map_or("?", |(n, _)| n.as_str());
                violation!(
                    "step {step}: worker {worker}'s frontier lost `{name}` partition {}, which it \
                     carried at the step before",
                    id.partition
                );
            }
            for (id, offset) in after {
                let Some((name, high)) = highs.get(id) else {
                    violation!(
                        "step {step}: worker {worker} consumed an unknown input partition {id:?}"
                    );
                };
                let owner = shape.reader_of(id.partition);
                if owner != worker as u32 {
                    violation!(
                        "step {step}: worker {worker} read `{name}` partition {}, which worker \
                         {owner} reads",
                        id.partition
                    );
                }
                if offset > high {
                    violation!(
                        "step {step}: worker {worker} consumed `{name}` partition {} up to {offset}, past its end {high}",
                        id.partition
                    );
                }
                if before.get(id).is_some_and(|b| b > offset) {
                    violation!(
                        "step {step}: worker {worker}'s frontier on `{name}` partition {} moves backwards",
                        id.partition
                    );
                }
            }
        }
        records.push(record);
    }
    Ok(records)
}

/// The output logs, checked against the step records: one entry per step
/// per worker, the step's frontier, the recorded hash. Returns the number
/// of entries.
fn output_logs(log: &dyn LogBackend, shape: &PipelineShape, records: &[StepRecord]) -> Check<u64> {
    let w = shape.workers as usize;
    let mut entries = 0u64;
    let mut outputs: BTreeMap<(u64, u32), Vec<Vec<Event>>> = BTreeMap::new();
    for (port, name) in shape.outputs.iter().enumerate() {
        let mut seen: BTreeMap<(u64, u32), u32> = BTreeMap::new();
        let mut problem: Option<String> = None;
        // Output below `low` was deleted by retention: nothing to check.
        let low = log.output_low(name)?;
        log.scan_output(name, low, &mut |entry| {
            entries += 1;
            if problem.is_some() {
                return Ok(std::ops::ControlFlow::Continue(()));
            }
            let (step, worker) = (entry.step, entry.worker);
            let n = seen.entry((step, worker)).or_insert(0);
            *n += 1;
            problem = if *n > 1 {
                Some(format!(
                    "output log `{name}` holds a second entry for step {step} worker {worker}: \
                     an output log must never hold two entries for one step (I1)"
                ))
            } else if worker as usize >= w {
                Some(format!(
                    "output log `{name}`: an entry of worker {worker}, but the pipeline has {w} workers"
                ))
            } else if step as usize >= records.len() {
                Some(format!(
                    "output log `{name}` holds output of step {step}, which has no step record: a step's \
                     division must be durable no later than its outputs (I3)"
                ))
            } else if entry.frontier != records[step as usize].frontiers[worker as usize] {
                Some(format!(
                    "output log `{name}`: the entry of step {step} worker {worker} is tagged with another \
                     frontier than its step record"
                ))
            } else {
                let ports = outputs
                    .entry((step, worker))
                    .or_insert_with(|| vec![Vec::new(); shape.outputs.len()]);
                ports[port] = entry.events;
                None
            };
            Ok(std::ops::ControlFlow::Continue(()))
        })?;
        if let Some(p) = problem {
            violation!("{p}");
        }
        for step in low..records.len() as u64 {
            for worker in 0..w as u32 {
                if !seen.contains_key(&(step, worker)) {
                    violation!(
                        "output log `{name}` has no entry for step {step} worker {worker}: every step writes one entry per worker"
                    );
                }
            }
        }
    }
    for ((step, worker), ports) in &outputs {
        let recorded = records[*step as usize].output_hashes[*worker as usize];
        if hash_outputs(ports) != recorded {
            violation!(
                "step {step} worker {worker}: the stored outputs do not hash to the hash in the step record (altered or lost output)"
            );
        }
    }
    Ok(entries)
}

/// The checkpoints, checked against the step records, and the input's low
/// watermarks against the newest checkpoint (I2). Returns the checkpoints.
fn checkpoints_and_trims(
    log: &dyn LogBackend,
    checkpoints: &dyn CheckpointStore,
    shape: &PipelineShape,
    records: &[StepRecord],
    highs: &BTreeMap<PartitionId, (String, u64)>,
) -> Check<Vec<u64>> {
    let w = shape.workers as usize;
    let steps = checkpoints.list()?;
    for step in &steps {
        let Some(c) = checkpoints.get(*step)? else {
            violation!("checkpoint {step} is listed but cannot be read");
        };
        let Some(record) = records.get(*step as usize) else {
            violation!("checkpoint {step} covers a step that was never committed");
        };
        if c.meta.frontiers != record.frontiers {
            violation!("checkpoint {step}: its frontiers differ from step {step}'s record");
        }
        if c.states.len() != w {
            violation!(
                "checkpoint {step}: {} states for {w} workers",
                c.states.len()
            );
        }
    }
    let newest: Frontier = match steps.last() {
        Some(step) => records[*step as usize]
            .frontiers
            .iter()
            .flatten()
            .map(|(k, v)| (*k, *v))
            .collect(),
        None => Frontier::new(),
    };
    for (id, (name, _)) in highs {
        let (low, _) = log.watermarks(name, id.partition)?;
        let allowed = newest.get(id).copied().unwrap_or(0);
        if low > allowed {
            violation!(
                "input `{name}` partition {} is trimmed below offset {low}, above the newest committed checkpoint's \
                 frontier {allowed}: input may be trimmed only below a committed checkpoint (I2)",
                id.partition
            );
        }
    }
    Ok(steps)
}
