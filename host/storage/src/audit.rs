//! The offline audit behind `sluice verify`: checks what the invariants
//! promise from what a backend stores, through the storage traits, so it
//! audits an embedded pipeline and a Kafka one alike.
//!
//! - step records are contiguous from 0, one frontier and one hash per
//!   worker of the step's layout, and chained (each holds the hash of the
//!   one before, so a step rewritten in place breaks the next link);
//!   frontiers never move backwards, never past the input, never drop a
//!   partition, and each partition is in the frontier of the worker its
//!   step's layout gives it to;
//! - every layout change is a valid layout (every shard and partition owned
//!   once, by a worker below W) with the next epoch;
//! - every output log holds exactly one entry per step per worker of the
//!   step's layout (I1), tagged with that step's frontier;
//! - no output exists for a step without a record (I3: the division is
//!   durable no later than the outputs);
//! - every dead-letter log (`<input>.dead-letter`) holds at most one entry
//!   per step per worker, of a recorded step, tagged with its frontier;
//!   each of its records names a position of its input that the worker
//!   read in that step (between the step before's frontier and its own),
//!   and no position is dead-lettered twice;
//! - each worker's outputs of a step hash to the hash in the step record
//!   (for a divided step, in the worker's done record); every step but the
//!   last is complete (a divided step has every worker's done record);
//! - committed checkpoints cover committed steps, with those steps'
//!   frontiers and layouts, and pieces only of that layout's workers;
//! - no input partition is trimmed above the newest committed checkpoint's
//!   frontier (I2).
//!
//! The first violation found is returned, named precisely. A backend may
//! add checks of its own layout first (the embedded log checks that every
//! entry is stored under its own key).

use crate::error::{Result, StorageError};
use crate::{CheckpointStore, LogBackend};
use sluice_core::{
    DeadLetter, Event, Frontier, Layout, PartitionId, PipelineShape, StepRecord, dead_letter_log,
    hash_outputs,
};
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
    /// Input records skipped into dead-letter logs.
    pub dead_letters: u64,
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
    audit_upgraded(log, checkpoints, shape, &[])
}

/// [`audit`] of a pipeline whose component changed: `outputs_before` holds,
/// for each change in order, the last step before it and the output ports
/// the steps up to it wrote (the steps after the last change write
/// `shape.outputs`).
pub fn audit_upgraded(
    log: &dyn LogBackend,
    checkpoints: &dyn CheckpointStore,
    shape: &PipelineShape,
    outputs_before: &[(u64, Vec<String>)],
) -> Result<Verdict> {
    let run = || -> Check<Summary> {
        let highs = high_watermarks(log, shape)?;
        let steps = step_records(log, shape, &highs)?;
        let eras = OutputEras {
            before: outputs_before,
            now: &shape.outputs,
        };
        let entries = output_logs(log, &eras, &steps)?;
        let dead_letters = dead_letter_logs(log, shape, &steps)?;
        let checkpoints = checkpoints_and_trims(log, checkpoints, &steps, &highs)?;
        Ok(Summary {
            steps: steps.records.len() as u64,
            entries,
            dead_letters,
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

/// The step records with the layout each ran under.
struct Steps {
    records: Vec<StepRecord>,
    /// Every worker's output hash per step (from the record, or from a
    /// divided step's done records); `None` for the last step when it is
    /// a divided step not complete yet.
    hashes: Vec<Option<Vec<u128>>>,
    /// Every layout, in epoch order.
    layouts: Vec<Layout>,
    /// Per step, its layout's index in `layouts`.
    layout_of: Vec<usize>,
}

impl Steps {
    fn layout(&self, step: u64) -> &Layout {
        &self.layouts[self.layout_of[step as usize]]
    }
}

/// The step records, checked: contiguous, well-formed, chained, layouts
/// valid, frontiers moving forward, within the input and following the
/// layout.
fn step_records(
    log: &dyn LogBackend,
    shape: &PipelineShape,
    highs: &BTreeMap<PartitionId, (String, u64)>,
) -> Check<Steps> {
    let mut steps = Steps {
        records: Vec::new(),
        hashes: Vec::new(),
        layouts: vec![Layout::initial(shape)],
        layout_of: Vec::new(),
    };
    let Some(last) = log.last_step()? else {
        return Ok(steps);
    };
    let mut previous: BTreeMap<PartitionId, u64> = BTreeMap::new();
    for step in 0..=last {
        let Some(record) = log.step_record(step)? else {
            violation!("step records: step {step} is missing below the last committed step {last}");
        };
        if record.step != step {
            violation!("step {step}: its record says step {}", record.step);
        }
        if let Some(next) = &record.layout {
            let current = steps.layouts.last().expect("the initial layout");
            if let Err(m) = next.validate(shape) {
                violation!("step {step}: its layout is malformed: {m}");
            }
            if next.epoch != current.epoch + 1 {
                violation!(
                    "step {step}: its layout has epoch {}, after a layout of epoch {}",
                    next.epoch,
                    current.epoch
                );
            }
            steps.layouts.push(next.clone());
        }
        steps.layout_of.push(steps.layouts.len() - 1);
        let layout = steps.layouts.last().expect("the initial layout");
        let w = layout.workers as usize;
        // A divided step's hashes are in its workers' done records.
        let hashes = match record.is_division() {
            true => w,
            false => record.output_hashes.len(),
        };
        if record.frontiers.len() != w || hashes != w {
            violation!(
                "step {step}: {} frontiers and {} hashes for the {w} workers of its layout",
                record.frontiers.len(),
                record.output_hashes.len()
            );
        }
        let link = steps.records.last().map_or(0, StepRecord::chain_hash);
        if record.prev != link {
            violation!(
                "step {step}'s record does not chain to step {}'s: a step before it was rewritten \
                 after it was committed",
                step.saturating_sub(1)
            );
        }
        let mut now: BTreeMap<PartitionId, u64> = BTreeMap::new();
        for (worker, frontier) in record.frontiers.iter().enumerate() {
            for (id, offset) in frontier {
                let Some((name, high)) = highs.get(id) else {
                    violation!(
                        "step {step}: worker {worker} consumed an unknown input partition {id:?}"
                    );
                };
                if now.insert(*id, *offset).is_some() {
                    violation!(
                        "step {step}: `{name}` partition {} is in two workers' frontiers",
                        id.partition
                    );
                }
                let owner = layout.reader(id.input, id.partition);
                if owner != Some(worker as u32) {
                    violation!(
                        "step {step}: worker {worker} read `{name}` partition {}, which worker \
                         {} reads in the step's layout",
                        id.partition,
                        owner.map_or("none".into(), |o| o.to_string())
                    );
                }
                if offset > high {
                    violation!(
                        "step {step}: worker {worker} consumed `{name}` partition {} up to {offset}, past its end {high}",
                        id.partition
                    );
                }
                if previous.get(id).is_some_and(|b| b > offset) {
                    violation!(
                        "step {step}: the frontier on `{name}` partition {} moves backwards",
                        id.partition
                    );
                }
            }
        }
        if let Some(id) = previous.keys().find(|id| !now.contains_key(id)) {
            let name = highs.get(id).map_or("?", |(n, _)| n.as_str());
            violation!(
                "step {step}: the frontiers lost `{name}` partition {}, which they carried at the \
                 step before",
                id.partition
            );
        }
        previous = now;
        let hashes = log.output_hashes(step)?;
        match &hashes {
            None if step != last => violation!(
                "step {step} is a divided step missing a worker's share (done record), but step \
                 {} was recorded after it: a step is recorded only after the one before completes",
                step + 1
            ),
            Some(h) if h.len() != w => violation!(
                "step {step}: {} output hashes for the {w} workers of its layout",
                h.len()
            ),
            _ => {}
        }
        steps.hashes.push(hashes);
        steps.records.push(record);
    }
    Ok(steps)
}

/// The output logs, checked against the step records: one entry per step
/// per worker, the step's frontier, the recorded hash. Returns the number
/// of entries.
fn output_logs(log: &dyn LogBackend, eras: &OutputEras, steps: &Steps) -> Check<u64> {
    let records = &steps.records;
    let mut entries = 0u64;
    let mut outputs: BTreeMap<(u64, u32), Vec<Vec<Event>>> = BTreeMap::new();
    for name in eras.names() {
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
            } else if step as usize >= records.len() {
                Some(format!(
                    "output log `{name}` holds output of step {step}, which has no step record: a step's \
                     division must be durable no later than its outputs (I3)"
                ))
            } else if worker >= steps.layout(step).workers {
                Some(format!(
                    "output log `{name}`: an entry of worker {worker} in step {step}, whose layout has {} workers",
                    steps.layout(step).workers
                ))
            } else if entry.frontier != records[step as usize].frontiers[worker as usize] {
                Some(format!(
                    "output log `{name}`: the entry of step {step} worker {worker} is tagged with another \
                     frontier than its step record"
                ))
            } else if let Some(port) = eras.port(step, name) {
                let ports = outputs
                    .entry((step, worker))
                    .or_insert_with(|| vec![Vec::new(); eras.at(step).len()]);
                ports[port] = entry.events;
                None
            } else if entry.events.is_empty() {
                // Nothing written: a log that lists an entry for every
                // step from its step records (Kafka's) shows empty ones
                // for the steps of a component without this port.
                None
            } else {
                Some(format!(
                    "output log `{name}` holds output of step {step}, whose component has no such output"
                ))
            };
            Ok(std::ops::ControlFlow::Continue(()))
        })?;
        if let Some(p) = problem {
            violation!("{p}");
        }
        // A divided step not complete yet shows no output.
        let visible =
            records.len() as u64 - u64::from(steps.hashes.last().is_some_and(Option::is_none));
        for step in (low..visible).filter(|s| eras.port(*s, name).is_some()) {
            for worker in 0..steps.layout(step).workers {
                if !seen.contains_key(&(step, worker)) {
                    violation!(
                        "output log `{name}` has no entry for step {step} worker {worker}: every step writes one entry per worker"
                    );
                }
            }
        }
    }
    for ((step, worker), ports) in &outputs {
        let Some(recorded) = steps.hashes[*step as usize]
            .as_ref()
            .map(|h| h[*worker as usize])
        else {
            violation!(
                "step {step} worker {worker}: output of a divided step that is not complete is \
                 visible (a step's shares become visible together)"
            );
        };
        if hash_outputs(ports) != recorded {
            violation!(
                "step {step} worker {worker}: the stored outputs do not hash to the hash in the step record (altered or lost output)"
            );
        }
    }
    Ok(entries)
}

/// The output ports of each step: those of the component that ran it.
struct OutputEras<'a> {
    /// Per change of component, in order: the last step before it and the
    /// outputs up to it.
    before: &'a [(u64, Vec<String>)],
    /// The outputs after the last change.
    now: &'a [String],
}

impl OutputEras<'_> {
    /// The outputs step `step` wrote, in port order.
    fn at(&self, step: u64) -> &[String] {
        self.before
            .iter()
            .find(|(last, _)| step <= *last)
            .map_or(self.now, |(_, outputs)| outputs)
    }

    /// The port `name` was in step `step`, if that step had it.
    fn port(&self, step: u64, name: &str) -> Option<usize> {
        self.at(step).iter().position(|o| o == name)
    }

    /// Every output any step had, once each.
    fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        let all = self.before.iter().flat_map(|(_, o)| o).chain(self.now);
        for name in all {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
        names
    }
}

/// The dead-letter logs, checked against the step records: at most one
/// entry per step per worker, the step's frontier, each record a position
/// the worker read in the step, no position twice. Returns the records.
fn dead_letter_logs(log: &dyn LogBackend, shape: &PipelineShape, steps: &Steps) -> Check<u64> {
    let records = &steps.records;
    let mut letters = 0u64;
    for (i, input) in shape.inputs.iter().enumerate() {
        let name = dead_letter_log(&input.name);
        let mut seen: BTreeMap<(u64, u32), ()> = BTreeMap::new();
        let mut positions: BTreeMap<(u32, u64), u64> = BTreeMap::new();
        let mut problem: Option<String> = None;
        let low = log.output_low(&name)?;
        log.scan_output(&name, low, &mut |entry| {
            if problem.is_some() {
                return Ok(std::ops::ControlFlow::Break(()));
            }
            let (step, worker) = (entry.step, entry.worker);
            problem = if seen.insert((step, worker), ()).is_some() {
                Some(format!(
                    "dead-letter log `{name}` holds a second entry for step {step} worker \
                     {worker} (I1)"
                ))
            } else if step as usize >= records.len() {
                Some(format!(
                    "dead-letter log `{name}` holds records of step {step}, which has no step \
                     record (I3)"
                ))
            } else if worker >= steps.layout(step).workers
                || entry.frontier != records[step as usize].frontiers[worker as usize]
            {
                Some(format!(
                    "dead-letter log `{name}`: the entry of step {step} worker {worker} is not \
                     tagged with a worker of the step and its frontier"
                ))
            } else {
                let before: Frontier = match step.checked_sub(1) {
                    Some(p) => records[p as usize]
                        .frontiers
                        .iter()
                        .flatten()
                        .map(|(k, v)| (*k, *v))
                        .collect(),
                    None => Frontier::new(),
                };
                entry.events.iter().find_map(|event| {
                    letters += 1;
                    let d = match DeadLetter::from_event(event) {
                        Ok(d) => d,
                        Err(e) => {
                            return Some(format!("dead-letter log `{name}`, step {step}: {e}"));
                        }
                    };
                    let id = PartitionId {
                        input: i as u32,
                        partition: d.partition,
                    };
                    let from = before.get(&id).copied().unwrap_or(0);
                    let read = entry
                        .frontier
                        .get(&id)
                        .is_some_and(|to| (from..*to).contains(&d.offset));
                    if d.input != input.name || !read {
                        Some(format!(
                            "dead-letter log `{name}`: step {step} worker {worker} skipped record \
                             {} (`{}` partition {} offset {}), which it did not read in that step",
                            d.position, d.input, d.partition, d.offset
                        ))
                    } else if let Some(first) = positions.insert((d.partition, d.offset), step) {
                        Some(format!(
                            "dead-letter log `{name}` holds record {} twice (steps {first} and \
                             {step}): a skipped record is dead-lettered once",
                            d.position
                        ))
                    } else {
                        None
                    }
                })
            };
            Ok(std::ops::ControlFlow::Continue(()))
        })?;
        if let Some(p) = problem {
            violation!("{p}");
        }
    }
    Ok(letters)
}

/// The checkpoints, checked against the step records, and the input's low
/// watermarks against the newest checkpoint (I2). Returns the checkpoints.
fn checkpoints_and_trims(
    log: &dyn LogBackend,
    checkpoints: &dyn CheckpointStore,
    all: &Steps,
    highs: &BTreeMap<PartitionId, (String, u64)>,
) -> Check<Vec<u64>> {
    let records = &all.records;
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
        let layout = all.layout(*step);
        if &c.meta.layout != layout {
            violation!(
                "checkpoint {step}: its layout (epoch {}) is not the one step {step} ran under (epoch {})",
                c.meta.layout.epoch,
                layout.epoch
            );
        }
        if let Some(p) = c.pieces.iter().find(|p| p.worker >= layout.workers) {
            violation!(
                "checkpoint {step}: a piece of worker {}, but its layout has {} workers",
                p.worker,
                layout.workers
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

#[cfg(test)]
mod tests {
    use super::OutputEras;

    /// A step up to and including an upgrade's checkpoint step wrote the
    /// outputs before it; with two upgrades, each range its own.
    #[test]
    fn each_step_is_checked_against_the_outputs_of_the_version_that_ran_it() {
        let v = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let before = [(4, v(&["counts"])), (9, v(&["counts", "lengths"]))];
        let now = v(&["lengths", "totals"]);
        let eras = OutputEras {
            before: &before,
            now: &now,
        };
        assert_eq!(eras.at(0), ["counts"]);
        assert_eq!(eras.at(4), ["counts"]);
        assert_eq!(eras.at(5), ["counts", "lengths"]);
        assert_eq!(eras.at(9), ["counts", "lengths"]);
        assert_eq!(eras.at(10), ["lengths", "totals"]);
        assert_eq!(eras.port(5, "lengths"), Some(1));
        assert_eq!(eras.port(10, "lengths"), Some(0));
        assert_eq!(eras.port(4, "lengths"), None);
        assert_eq!(eras.names(), ["counts", "lengths", "totals"]);
    }
}
