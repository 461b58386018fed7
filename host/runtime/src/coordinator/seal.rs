//! A whole step's commit, sealed and written: its output checked and
//! hashed into the step record, its log entries and dead letters — on the
//! coordinator, or on the write's thread while the next step runs.

use crate::error::Result;
use crate::step_io::WorkerOutput;
use sluice_core::crash::{CrashPoint, crash_point};
use sluice_core::{Frontier, OutputEntry, StepCommit, StepRecord};
use sluice_storage::Guarded;

/// A whole step's commit, once its output is checked: what is written and
/// the figures counted for it.
pub(super) struct Sealed {
    /// The commit.
    pub(super) commit: StepCommit,
    /// Output events it writes.
    pub(super) events_out: u64,
    /// Input records it skipped into dead-letter logs.
    pub(super) skipped: u64,
}

/// A written [`Sealed`] commit: the chain hash of its record, which the
/// next record links to, and its figures.
pub(super) struct WrittenStep {
    /// The chain hash of its record.
    pub(super) link: u128,
    /// Output events it wrote.
    pub(super) events_out: u64,
    /// Input records it skipped into dead-letter logs.
    pub(super) skipped: u64,
}

/// The durable write of a step's commit: the record and every output in
/// one write, between its crash points.
pub(super) fn write_commit(storage: &Guarded, commit: &StepCommit) -> Result<()> {
    crash_point(CrashPoint::BeforeCommit);
    storage.commit_step(commit)?;
    if !commit.record.is_division() {
        crash_point(CrashPoint::AfterCommit);
    }
    Ok(())
}

/// A whole step's commit: `record` with the hash of each worker's output,
/// every output port's log entries and the dead letters. Checks output
/// that is not yet ([`WorkerOutput::check`]).
pub(super) fn seal(
    mut record: StepRecord,
    ports: &[String],
    mut outputs: Vec<WorkerOutput>,
) -> Result<Sealed> {
    for out in &mut outputs {
        out.check()?;
    }
    let (step, target) = (record.step, &record.frontiers);
    let mut events_out = 0;
    let mut logs = Vec::with_capacity(ports.len());
    for (port, name) in ports.iter().enumerate() {
        let entries: Vec<OutputEntry> = outputs
            .iter_mut()
            .enumerate()
            .map(|(w, out)| {
                let events = std::mem::take(&mut out.ports[port]);
                events_out += events.len() as u64;
                OutputEntry {
                    step,
                    worker: w as u32,
                    frontier: target[w].clone(),
                    events,
                }
            })
            .collect();
        logs.push((name.clone(), entries));
    }
    let dead_letters = dead_letter_entries(step, target, &mut outputs);
    let skipped = outputs.iter().map(|o| o.dead_count).sum();
    record.output_hashes = outputs.iter().map(|o| o.hash).collect();
    Ok(Sealed {
        commit: StepCommit {
            record,
            outputs: logs,
            dead_letters,
        },
        events_out,
        skipped,
    })
}

/// The dead letters of a whole step, taken from its workers' outputs: per
/// dead-letter log, an entry for each worker that skipped records (in
/// worker order), tagged with the step and the worker's frontier.
fn dead_letter_entries(
    step: u64,
    target: &[Frontier],
    outputs: &mut [WorkerOutput],
) -> Vec<(String, Vec<OutputEntry>)> {
    let mut logs: Vec<(String, Vec<OutputEntry>)> = Vec::new();
    for (w, out) in outputs.iter_mut().enumerate() {
        for (log, events) in std::mem::take(&mut out.dead_letters.0) {
            let entry = OutputEntry {
                step,
                worker: w as u32,
                frontier: target[w].clone(),
                events,
            };
            match logs.iter_mut().find(|(name, _)| *name == log) {
                Some((_, entries)) => entries.push(entry),
                None => logs.push((log, vec![entry])),
            }
        }
    }
    logs
}
