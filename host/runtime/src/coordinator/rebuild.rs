//! Rebuilding operators from the pipeline's input at an upgrade (issue
//! #31): the operators named ([`UpgradedAt::rebuilt`](super::UpgradedAt);
//! `sluice upgrade --rebuild` names every one of the new version) are
//! given the state they would hold had the new version run every step, and
//! each output port gets, in the first step after the switch, the
//! difference between what the new version would have written to it and
//! what its log holds — so that a reader integrating the log sees the new
//! version's output from then on.
//!
//! One instance of the new component (W = 1: the state is per shard, so
//! any layout can take it) runs through every committed step up to the
//! upgrade's checkpoint, from empty, on the same input with the same times
//! (its division among workers aside), its output integrated instead of
//! written. The workers, which took the checkpoint through `upgrade` with
//! the rebuilt operators started empty, then take the rebuilt operators'
//! state from its snapshot: a second `upgrade`, of pieces of their own
//! version, every other operator named to start empty (so that only the
//! rebuilt ones take anything). All of it is deterministic, and made again
//! on every recovery through the upgrade.

use super::Coordinator;
use crate::engine::{LoadedComponent, SluiceEngine};
use crate::error::{Error, Result};
use crate::exchange::Exchange;
use crate::step_io::{OutputChecks, Spare, blocking, convert_output, input_ranges, read_batches};
use crate::worker::{Worker, WorkerInfo};
use sluice_core::{BadRecordPolicy, Event, Frontier, PartitionId};
use sluice_storage::Guarded;
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;

/// What a rebuild gives: the new version's state after the last step,
/// what it would have written to each output port, integrated, and the
/// identities of its stateful operators.
struct Rebuilt {
    pieces: Vec<(u32, Vec<u8>)>,
    outputs: Vec<BTreeMap<Vec<u8>, i64>>,
    operators: Vec<String>,
}

impl Coordinator {
    /// Gives the operators `rebuilt` (started empty by the workers' first
    /// `upgrade`) the state a run of this component through every step up
    /// to `step` holds, and notes what step `step + 1` adds to each output
    /// port (see the [module](self)).
    pub(super) async fn rebuild(&mut self, step: u64, rebuilt: &[String]) -> Result<()> {
        let started = std::time::Instant::now();
        let run = rebuild_run(self.rebuild_inputs(), step).await?;
        let others: Vec<String> = run
            .operators
            .iter()
            .filter(|o| !rebuilt.contains(o))
            .cloned()
            .collect();
        let layout = self.placement.layout.clone();
        let mut by_worker: Vec<Vec<(u32, Vec<u8>)>> = vec![Vec::new(); layout.workers as usize];
        for (shard, piece) in run.pieces {
            by_worker[layout.owner(shard) as usize].push((shard, piece));
        }
        for (w, pieces) in by_worker.into_iter().enumerate() {
            if pieces.is_empty() {
                continue;
            }
            match self.placement.instances[w].as_mut() {
                Some(super::workers::AnyWorker::Local(local)) => {
                    local.upgrade(pieces, others.clone()).await?
                }
                Some(super::workers::AnyWorker::Remote(_)) => {
                    return Err(Error::UpgradeAcrossHosts);
                }
                None => return Err(Error::WorkersLost),
            }
        }
        let old = self.integrated_output_logs(step).await?;
        let switch: Vec<Vec<Event>> = run
            .outputs
            .into_iter()
            .zip(old)
            .map(|(new, old)| difference(new, old))
            .collect();
        tracing::info!(
            pipeline = %self.options.name,
            step,
            rebuilt = ?rebuilt,
            events = switch.iter().map(Vec::len).sum::<usize>(),
            took_ms = started.elapsed().as_millis() as u64,
            "rebuilt the state from the input; the switch's output goes out with the next step"
        );
        self.position.switch_output = Some((step + 1, switch));
        Ok(())
    }

    /// Each output port's log up to step `upto`, integrated (an output
    /// port the log has nothing of: empty). A future that holds no borrow
    /// of the coordinator, whose instances are not `Sync`.
    fn integrated_output_logs(
        &self,
        upto: u64,
    ) -> impl Future<Output = Result<Vec<BTreeMap<Vec<u8>, i64>>>> + use<> {
        let s = self.storage.clone();
        let outputs = self.shape.outputs.clone();
        blocking(move || {
            let mut all = Vec::with_capacity(outputs.len());
            for name in &outputs {
                let low = s.log().output_low(name)?;
                if low > 0 {
                    return Err(sluice_storage::StorageError::Corrupt {
                        what: format!("output `{name}`"),
                        message: format!(
                            "trimmed below step {low} while an upgrade that rebuilt operators \
                             needs all of it: the switch's output cannot be computed"
                        ),
                    }
                    .into());
                }
                let mut z = BTreeMap::new();
                s.log().scan_output(name, 0, &mut |entry| {
                    if entry.step > upto {
                        return Ok(ControlFlow::Break(()));
                    }
                    integrate(&mut z, entry.events);
                    Ok(ControlFlow::Continue(()))
                })?;
                all.push(z);
            }
            Ok::<_, Error>(all)
        })
    }

    /// What [`rebuild_run`] needs of the coordinator, owned.
    fn rebuild_inputs(&self) -> RebuildInputs {
        RebuildInputs {
            engine: self.engine.with_limits(self.engine.limits()),
            component: self.component.clone(),
            name: self.options.name.clone(),
            storage: self.storage.clone(),
            // Every partition, read by the one instance.
            partitions: self
                .placement
                .layout
                .assignment(&self.shape)
                .into_iter()
                .flatten()
                .collect(),
            outputs: self.shape.outputs.len(),
            config: self.options.config.clone(),
            check_json: self.options.check_output_json,
        }
    }
}

/// What a rebuild runs on.
struct RebuildInputs {
    engine: SluiceEngine,
    component: LoadedComponent,
    name: String,
    storage: Arc<Guarded>,
    partitions: Vec<(PartitionId, String)>,
    outputs: usize,
    /// The pipeline's settings, as its workers get them.
    config: Vec<(String, String)>,
    /// Whether every output value must be JSON.
    check_json: bool,
}

/// Runs one fresh instance of the component through steps `0..=upto`
/// (see the [module](self)).
async fn rebuild_run(i: RebuildInputs, upto: u64) -> Result<Rebuilt> {
    let info = WorkerInfo {
        worker: 0,
        workers: 1,
        pipeline: i.name.clone(),
        config: i.config.clone(),
    };
    let mut worker = Worker::start(
        &i.engine,
        &i.component,
        info,
        Some(Exchange::single()),
        false,
    )
    .await?;
    let operators = worker.describe().await?.operators;
    let checks = OutputChecks {
        ports: i.outputs,
        max_output: None,
        check_json: i.check_json,
    };
    let mut outputs = vec![BTreeMap::new(); i.outputs];
    let mut from = Frontier::new();
    // Each step reads into the buffers of the step before.
    let spare = Spare::default();
    for step in 0..=upto {
        let s = i.storage.clone();
        let record = blocking(move || s.log().step_record(step))
            .await?
            .ok_or_else(|| sluice_storage::StorageError::Corrupt {
                what: "step log".into(),
                message: format!("the record of committed step {step} is missing"),
            })?;
        // Offsets only grow: a partition's frontier is the furthest any
        // worker has it (its reader, before and after layout changes).
        let mut to = from.clone();
        for f in &record.frontiers {
            for (id, offset) in f {
                let at = to.entry(*id).or_insert(0);
                *at = (*at).max(*offset);
            }
        }
        // A recorded step skipped its bad records, or it had none.
        let ranges = input_ranges(
            std::slice::from_ref(&i.partitions),
            std::slice::from_ref(&from),
            std::slice::from_ref(&to),
            &|_| BadRecordPolicy::DeadLetter,
        )
        .pop()
        .unwrap_or_default();
        let (s, into) = (i.storage.clone(), spare.clone());
        let read = blocking(move || read_batches(s.log(), &ranges, false, &into)).await?;
        let batches = worker.step(step, record.time_ms, &read.batches).await?;
        spare.keep(read.batches);
        let out = convert_output(&checks, 0, step, batches)?;
        for (port, events) in out.ports.into_iter().enumerate() {
            integrate(&mut outputs[port], events);
        }
        from = to;
    }
    let snapshot = worker.snapshot(false).await?;
    Ok(Rebuilt {
        pieces: snapshot.pieces,
        outputs,
        operators: operators.into_iter().map(|o| o.id).collect(),
    })
}

/// Adds `events` to the Z-set `into`, dropping what cancels out.
fn integrate(into: &mut BTreeMap<Vec<u8>, i64>, events: Vec<Event>) {
    use std::collections::btree_map::Entry;
    for e in events {
        match into.entry(e.value) {
            Entry::Vacant(v) => {
                v.insert(e.weight);
            }
            Entry::Occupied(mut o) => {
                *o.get_mut() += e.weight;
                if *o.get() == 0 {
                    o.remove();
                }
            }
        }
    }
}

/// `new − old`, as events (in value order).
fn difference(new: BTreeMap<Vec<u8>, i64>, mut old: BTreeMap<Vec<u8>, i64>) -> Vec<Event> {
    let mut out = Vec::new();
    for (value, w) in new {
        let d = w - old.remove(&value).unwrap_or(0);
        if d != 0 {
            out.push(Event { value, weight: d });
        }
    }
    out.extend(
        old.into_iter()
            .map(|(value, w)| Event { value, weight: -w }),
    );
    out.sort_by(|a, b| a.value.cmp(&b.value));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn z(pairs: &[(&str, i64)]) -> BTreeMap<Vec<u8>, i64> {
        pairs
            .iter()
            .map(|(v, w)| (v.as_bytes().to_vec(), *w))
            .collect()
    }

    #[test]
    fn the_difference_retracts_what_only_the_log_holds_and_adds_what_only_the_rebuild_does() {
        let got = difference(
            z(&[("a", 1), ("b", 2), ("c", 1)]),
            z(&[("b", 1), ("c", 1), ("d", 1)]),
        );
        let got: Vec<(String, i64)> = got
            .into_iter()
            .map(|e| (String::from_utf8(e.value).unwrap(), e.weight))
            .collect();
        assert_eq!(got, [("a".into(), 1), ("b".into(), 1), ("d".into(), -1)]);
        let mut into = z(&[("a", 1)]);
        integrate(
            &mut into,
            vec![
                Event {
                    value: b"a".to_vec(),
                    weight: -1,
                },
                Event {
                    value: b"b".to_vec(),
                    weight: 2,
                },
            ],
        );
        assert_eq!(into, z(&[("b", 2)]));
    }
}
