//! `sluice verify`: an offline audit of a pipeline's logs on the embedded
//! backend. It checks what the invariants promise, from the stored bytes:
//!
//! - step records are contiguous from 0, one frontier and one hash per
//!   worker, frontiers never move backwards and never past the input;
//! - every output log holds exactly one entry per step per worker (I1), each
//!   stored under its own step and worker, tagged with that step's frontier;
//! - no output exists for a step without a record (I3: the division is
//!   durable no later than the outputs);
//! - each worker's outputs of a step hash to the hash in the step record;
//! - committed checkpoints cover committed steps, with those steps'
//!   frontiers and one state per worker;
//! - no input partition is trimmed above the newest committed checkpoint's
//!   frontier (I2).
//!
//! The first violation found is returned, named precisely.

use crate::error::Result;
use crate::runtime::coordinator::hash_outputs;
use crate::storage::db::{self, CF_STEPS, PipelineDb};
use crate::storage::meta;
use crate::storage::{
    CheckpointStore, EmbeddedLog, Frontier, LogBackend, PartitionId, RocksCheckpointStore,
    StepRecord,
};
use std::collections::BTreeMap;
use std::sync::Arc;

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

macro_rules! violation {
    ($($arg:tt)*) => { return Ok(Verdict::Violation(format!($($arg)*))) };
}

/// Audits the pipeline in an opened database.
pub fn verify(database: &Arc<PipelineDb>) -> Result<Verdict> {
    let Some(meta) = meta::load(database)? else {
        violation!("no pipeline metadata: this directory holds no Sluice pipeline");
    };
    let w = meta.workers as usize;
    let log = EmbeddedLog::open(database.clone())?;
    let input_index: BTreeMap<PartitionId, (String, u64)> = {
        let mut m = BTreeMap::new();
        for (i, (name, partitions)) in meta.inputs.iter().enumerate() {
            for p in 0..*partitions {
                let (_, high) = log.watermarks(name, p)?;
                m.insert(
                    PartitionId {
                        input: i as u32,
                        partition: p,
                    },
                    (name.clone(), high),
                );
            }
        }
        m
    };

    // Step records.
    let mut records: Vec<StepRecord> = Vec::new();
    let cf = db::cf(database, CF_STEPS)?;
    for item in database.iterator_cf(cf, rocksdb::IteratorMode::Start) {
        let (k, v) = item.map_err(crate::Error::rocks("reading step records"))?;
        let expected = records.len() as u64;
        let key = k
            .as_ref()
            .try_into()
            .map(u64::from_be_bytes)
            .unwrap_or(u64::MAX);
        if key != expected {
            violation!(
                "step records: step {expected} is missing (the next record is for step {key})"
            );
        }
        let record: StepRecord = match postcard::from_bytes(&v) {
            Ok(r) => r,
            Err(e) => violation!("step {key}: unreadable record ({e})"),
        };
        if record.step != key {
            violation!("step {key}: its record says step {}", record.step);
        }
        if record.frontiers.len() != w || record.output_hashes.len() != w {
            violation!(
                "step {key}: {} frontiers and {} hashes for {w} workers",
                record.frontiers.len(),
                record.output_hashes.len()
            );
        }
        let previous = records
            .last()
            .map(|r| r.frontiers.clone())
            .unwrap_or_else(|| vec![Frontier::new(); w]);
        for (worker, (before, after)) in previous.iter().zip(&record.frontiers).enumerate() {
            for (id, offset) in after {
                let Some((name, high)) = input_index.get(id) else {
                    violation!(
                        "step {key}: worker {worker} consumed an unknown input partition {id:?}"
                    );
                };
                if offset > high {
                    violation!(
                        "step {key}: worker {worker} consumed `{name}` partition {} up to {offset}, past its end {high}",
                        id.partition
                    );
                }
                if before.get(id).is_some_and(|b| b > offset) {
                    violation!(
                        "step {key}: worker {worker}'s frontier on `{name}` partition {} moves backwards",
                        id.partition
                    );
                }
            }
        }
        records.push(record);
    }

    // Output logs.
    let mut entries = 0u64;
    let mut outputs_by_worker: BTreeMap<(u64, u32), Vec<Vec<crate::storage::Event>>> =
        BTreeMap::new();
    for (port, name) in meta.outputs.iter().enumerate() {
        let mut seen: BTreeMap<(u64, u32), u32> = BTreeMap::new();
        let mut problem: Option<String> = None;
        log.scan_output_keyed(name, 0, &mut |step, worker, entry| {
            entries += 1;
            if problem.is_some() {
                return Ok(());
            }
            let n = seen.entry((entry.step, entry.worker)).or_insert(0);
            *n += 1;
            if *n > 1 || entry.step != step || entry.worker != worker {
                problem = Some(format!(
                    "output log `{name}` holds a second entry for step {} worker {} (stored as step {step} worker {worker}): \
                     an output log must never hold two entries for one step (I1)",
                    entry.step, entry.worker
                ));
            } else if worker as usize >= w {
                problem = Some(format!("output log `{name}`: an entry of worker {worker}, but the pipeline has {w} workers"));
            } else if step as usize >= records.len() {
                problem = Some(format!(
                    "output log `{name}` holds output of step {step}, which has no step record: a step's division must be \
                     durable no later than its outputs (I3)"
                ));
            } else if entry.frontier != records[step as usize].frontiers[worker as usize] {
                problem = Some(format!("output log `{name}`: the entry of step {step} worker {worker} is tagged with another frontier than its step record"));
            } else {
                let ports = outputs_by_worker.entry((step, worker)).or_insert_with(|| vec![Vec::new(); meta.outputs.len()]);
                ports[port] = entry.events;
            }
            Ok(())
        })?;
        if let Some(p) = problem {
            violation!("{p}");
        }
        for step in 0..records.len() as u64 {
            for worker in 0..w as u32 {
                if !seen.contains_key(&(step, worker)) {
                    violation!(
                        "output log `{name}` has no entry for step {step} worker {worker}: every step writes one entry per worker"
                    );
                }
            }
        }
    }
    for ((step, worker), ports) in &outputs_by_worker {
        let recorded = records[*step as usize].output_hashes[*worker as usize];
        if hash_outputs(ports) != recorded {
            violation!(
                "step {step} worker {worker}: the stored outputs do not hash to the hash in the step record (altered or lost output)"
            );
        }
    }

    // Checkpoints and trims.
    let checkpoints = RocksCheckpointStore::open(database.clone());
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
    for (id, (name, _)) in &input_index {
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
    Ok(Verdict::Consistent(Summary {
        steps: records.len() as u64,
        entries,
        checkpoints: steps,
    }))
}
