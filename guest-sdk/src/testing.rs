//! Running circuits natively, with W workers on threads and an in-process
//! exchange: how operators are tested against recomputation, W=1 against
//! W=N, and snapshot → restore → continue against an uninterrupted run.
//!
//! ```
//! use sluice_guest::testing::{events, integrate_port, run};
//! let steps = vec![vec![events(&[("a b a".to_string(), 1)])], vec![events(&[("a".to_string(), -1)])]];
//! let build = |c: &mut sluice_guest::Circuit| {
//!     c.input::<String>("lines")
//!         .flat_map(|l| l.split(' ').map(str::to_owned).collect::<Vec<_>>())
//!         .count_by(|w| w.clone())
//!         .output("counts");
//! };
//! let out = run(build, 3, &steps, None).unwrap();
//! let counts = integrate_port::<(String, i64)>(&out, 0);
//! assert_eq!(counts.into_iter().collect::<Vec<_>>(), vec![(("a".into(), 1), 1), (("b".into(), 1), 1)]);
//! ```

use crate::exchange::{Exchange, KeyedBatch, RawEvent};
use crate::state::{SHARDS, shard_of};
use crate::{Circuit, CircuitInstance, Error, Pieces, Result, Weight};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Encodes typed records as one port's JSON events.
pub fn events<T: Serialize>(zset: &[(T, Weight)]) -> Vec<RawEvent> {
    zset.iter()
        .map(|(v, w)| RawEvent {
            key: Vec::new(),
            value: serde_json::to_vec(v).expect("test values serialize"),
            weight: *w,
        })
        .collect()
}

/// Decodes one port's JSON events.
pub fn decode<T: DeserializeOwned>(events: &[RawEvent]) -> Vec<(T, Weight)> {
    events
        .iter()
        .map(|e| {
            (
                serde_json::from_slice(&e.value).expect("outputs are JSON of the port's type"),
                e.weight,
            )
        })
        .collect()
}

/// Integrates output port `port` over all steps of a [`run`]: record →
/// weight, zero weights dropped.
pub fn integrate_port<T: DeserializeOwned + Ord>(
    steps: &[Vec<Vec<RawEvent>>],
    port: usize,
) -> BTreeMap<T, Weight> {
    let mut z = BTreeMap::new();
    for step in steps {
        for (v, w) in decode::<T>(&step[port]) {
            *z.entry(v).or_insert(0) += w;
        }
    }
    z.retain(|_, w| *w != 0);
    z
}

/// A reusable rendezvous for W threads that gives up (and reports) instead
/// of waiting forever when a worker fails.
struct Rendezvous {
    state: Mutex<(usize, u64)>,
    cv: Condvar,
    parties: usize,
}

impl Rendezvous {
    fn wait(&self) -> Result<()> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let generation = s.1;
        s.0 += 1;
        if s.0 == self.parties {
            s.0 = 0;
            s.1 += 1;
            self.cv.notify_all();
            return Ok(());
        }
        let (s, timeout) = self
            .cv
            .wait_timeout_while(s, Duration::from_secs(30), |s| s.1 == generation)
            .unwrap_or_else(|p| p.into_inner());
        drop(s);
        if timeout.timed_out() {
            return Err(Error::Failed(
                "a worker did not reach the exchange (did another fail?)".into(),
            ));
        }
        Ok(())
    }
}

struct Shared {
    workers: usize,
    /// The owner of each shard.
    owners: Vec<u32>,
    /// `inbox[dest][src]`.
    inbox: Mutex<Vec<Vec<KeyedBatch>>>,
    rendezvous: Rendezvous,
}

/// The exchange of one worker thread: routes like the host's, by the
/// owner of the key's shard.
struct ThreadExchange {
    shared: Arc<Shared>,
    me: usize,
}

impl Exchange for ThreadExchange {
    fn shuffle(&mut self, _channel: u32, events: KeyedBatch) -> Result<KeyedBatch> {
        let w = self.shared.workers;
        {
            let mut inbox = self.shared.inbox.lock().unwrap_or_else(|p| p.into_inner());
            for (key, value, weight) in events.iter() {
                let dest = self.shared.owners[shard_of(key) as usize] as usize;
                inbox[dest][self.me].push(key, value, weight)?;
            }
        }
        self.shared.rendezvous.wait()?;
        let mine = {
            let mut inbox = self.shared.inbox.lock().unwrap_or_else(|p| p.into_inner());
            let from = std::mem::replace(&mut inbox[self.me], vec![KeyedBatch::new(); w]);
            let mut mine = KeyedBatch::new();
            for batch in &from {
                mine.extend_from(batch)?;
            }
            mine
        };
        self.shared.rendezvous.wait()?;
        Ok(mine)
    }

    fn workers(&self) -> u32 {
        self.shared.workers as u32
    }
}

/// The owners of a `mod W` layout: shard `s` to worker `s mod W`.
pub fn modulo_owners(workers: usize) -> Vec<u32> {
    (0..SHARDS).map(|s| s % workers.max(1) as u32).collect()
}

/// A layout change in [`run_rescaled`]: before step `at`, every worker's
/// state (its snapshot pieces) goes to the owners of the pieces' shards
/// among `workers` freshly built workers, and from then on the exchange
/// routes by `owners` (shard → worker, `SHARDS` entries below `workers`).
#[derive(Debug, Clone)]
pub struct Rescale {
    /// The step before which the layout changes.
    pub at: usize,
    /// The number of workers from then on.
    pub workers: usize,
    /// The owner of each shard from then on.
    pub owners: Vec<u32>,
}

/// Runs `build` with `workers` workers over `steps` (each step: one event
/// list per input port; event `i` of a port goes to worker `i mod W`).
/// With `restore_at = Some(n)`, every worker snapshots before step `n` and
/// continues in a freshly built instance restored from it.
///
/// Returns, per step, every output port's events from all workers.
pub fn run(
    build: fn(&mut Circuit),
    workers: usize,
    steps: &[Vec<Vec<RawEvent>>],
    restore_at: Option<usize>,
) -> Result<Vec<Vec<Vec<RawEvent>>>> {
    let plan: Vec<Rescale> = restore_at
        .map(|at| Rescale {
            at,
            workers,
            owners: modulo_owners(workers),
        })
        .into_iter()
        .collect();
    run_rescaled(build, workers, steps, &plan)
}

/// Like [`run`], changing the layout as `plan` says (its entries in step
/// order): state moves as pieces, by shard, to the new owners — what the
/// host does when it restores a checkpoint into another layout.
pub fn run_rescaled(
    build: fn(&mut Circuit),
    workers: usize,
    steps: &[Vec<Vec<RawEvent>>],
    plan: &[Rescale],
) -> Result<Vec<Vec<Vec<RawEvent>>>> {
    let mut merged: Vec<Vec<Vec<RawEvent>>> = Vec::with_capacity(steps.len());
    let mut phase = Rescale {
        at: 0,
        workers: workers.max(1),
        owners: modulo_owners(workers.max(1)),
    };
    // Per worker of the phase, the pieces it starts from.
    let mut state: Vec<Pieces> = vec![Vec::new(); phase.workers];
    for (n, next) in plan.iter().map(Some).chain([None]).enumerate() {
        let end = next.map_or(steps.len(), |r| r.at.min(steps.len()));
        let (out, pieces) = run_phase(build, &phase, &steps[phase.at.min(end)..end], state)?;
        for (i, step) in out.into_iter().enumerate() {
            merged.push(step);
            debug_assert_eq!(merged.len(), phase.at.min(end) + i + 1);
        }
        let Some(next) = next else { break };
        if next.owners.len() != SHARDS as usize
            || next
                .owners
                .iter()
                .any(|&o| o as usize >= next.workers.max(1))
        {
            return Err(Error::Failed(format!("rescale {n}: a malformed layout")));
        }
        state = vec![Vec::new(); next.workers.max(1)];
        for (shard, piece) in pieces.into_iter().flatten() {
            state[next.owners[shard as usize] as usize].push((shard, piece));
        }
        phase = Rescale {
            at: end,
            workers: next.workers.max(1),
            owners: next.owners.clone(),
        };
    }
    Ok(merged)
}

/// One worker's checkpoint as pieces by shard, updated by incremental
/// snapshots: what the host composes from a base checkpoint and the
/// changed shards.
struct Checkpoint(BTreeMap<u32, Vec<Vec<u8>>>);

impl Checkpoint {
    fn from(pieces: Pieces) -> Self {
        let mut by_shard: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
        for (shard, piece) in pieces {
            by_shard.entry(shard).or_default().push(piece);
        }
        Checkpoint(by_shard)
    }

    /// Replaces the pieces of the shards that changed since the last
    /// snapshot.
    fn update(&mut self, circuit: &mut CircuitInstance) -> Result<()> {
        let (changed, pieces) = circuit.snapshot_changed()?;
        for shard in changed {
            self.0.remove(&shard);
        }
        for (shard, piece) in pieces {
            self.0.entry(shard).or_default().push(piece);
        }
        Ok(())
    }

    fn pieces(self) -> Pieces {
        self.0
            .into_iter()
            .flat_map(|(shard, pieces)| pieces.into_iter().map(move |p| (shard, p)))
            .collect()
    }
}

/// Runs `steps` with the phase's workers and layout, each worker restored
/// from its pieces first; returns the outputs per step and each worker's
/// pieces at the end.
#[allow(clippy::type_complexity)]
fn run_phase(
    build: fn(&mut Circuit),
    phase: &Rescale,
    steps: &[Vec<Vec<RawEvent>>],
    state: Vec<Pieces>,
) -> Result<(Vec<Vec<Vec<RawEvent>>>, Vec<Pieces>)> {
    let workers = phase.workers;
    let shared = Arc::new(Shared {
        workers,
        owners: phase.owners.clone(),
        inbox: Mutex::new(vec![vec![KeyedBatch::new(); workers]; workers]),
        rendezvous: Rendezvous {
            state: Mutex::new((0, 0)),
            cv: Condvar::new(),
            parties: workers,
        },
    });
    type WorkerRun = Result<(Vec<Vec<Vec<RawEvent>>>, Pieces)>;
    let per_worker: Vec<WorkerRun> = std::thread::scope(|scope| {
        let handles: Vec<_> = state
            .into_iter()
            .enumerate()
            .map(|(me, pieces)| {
                let shared = shared.clone();
                scope.spawn(move || -> WorkerRun {
                    let mut exchange = ThreadExchange { shared, me };
                    let mut circuit = CircuitInstance::build(build)?;
                    circuit.restore(&pieces)?;
                    // The worker's checkpoint, kept up to date by
                    // incremental snapshots (as the host keeps it): the
                    // pieces it handed over are what it started from.
                    let mut checkpoint = Checkpoint::from(pieces);
                    let mut outputs = Vec::with_capacity(steps.len());
                    for (i, step) in steps.iter().enumerate() {
                        let mine: Vec<Vec<RawEvent>> = step
                            .iter()
                            .map(|port| port.iter().skip(me).step_by(workers).cloned().collect())
                            .collect();
                        outputs.push(circuit.step(mine, &mut exchange)?);
                        if i % 2 == 1 {
                            checkpoint.update(&mut circuit)?;
                        }
                    }
                    checkpoint.update(&mut circuit)?;
                    Ok((outputs, checkpoint.pieces()))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Failed("a worker thread panicked".into())))
            })
            .collect()
    });
    let mut merged: Vec<Vec<Vec<RawEvent>>> = Vec::with_capacity(steps.len());
    let mut pieces = Vec::with_capacity(workers);
    for worker in per_worker {
        let (outputs, end) = worker?;
        pieces.push(end);
        for (i, step) in outputs.into_iter().enumerate() {
            if merged.len() <= i {
                merged.push(vec![Vec::new(); step.len()]);
            }
            for (port, events) in step.into_iter().enumerate() {
                merged[i][port].extend(events);
            }
        }
    }
    Ok((merged, pieces))
}
