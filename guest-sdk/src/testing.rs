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

use crate::exchange::{Exchange, RawEvent};
use crate::{Circuit, CircuitInstance, Error, Result, Weight};
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
    /// `inbox[dest][src]`.
    inbox: Mutex<Vec<Vec<Vec<RawEvent>>>>,
    rendezvous: Rendezvous,
}

/// The exchange of one worker thread.
struct ThreadExchange {
    shared: Arc<Shared>,
    me: usize,
}

fn route(key: &[u8], workers: usize) -> usize {
    // FNV-1a: any deterministic hash routes correctly.
    let h = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    });
    (h % workers as u64) as usize
}

impl Exchange for ThreadExchange {
    fn shuffle(&mut self, _channel: u32, events: Vec<RawEvent>) -> Result<Vec<RawEvent>> {
        let w = self.shared.workers;
        {
            let mut inbox = self.shared.inbox.lock().unwrap_or_else(|p| p.into_inner());
            for e in events {
                let dest = route(&e.key, w);
                inbox[dest][self.me].push(e);
            }
        }
        self.shared.rendezvous.wait()?;
        let mine: Vec<RawEvent> = {
            let mut inbox = self.shared.inbox.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::replace(&mut inbox[self.me], vec![Vec::new(); w])
                .into_iter()
                .flatten()
                .collect()
        };
        self.shared.rendezvous.wait()?;
        Ok(mine)
    }

    fn workers(&self) -> u32 {
        self.shared.workers as u32
    }
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
    let workers = workers.max(1);
    let shared = Arc::new(Shared {
        workers,
        inbox: Mutex::new(vec![vec![Vec::new(); workers]; workers]),
        rendezvous: Rendezvous {
            state: Mutex::new((0, 0)),
            cv: Condvar::new(),
            parties: workers,
        },
    });
    let per_worker: Vec<Result<Vec<Vec<Vec<RawEvent>>>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|me| {
                let shared = shared.clone();
                scope.spawn(move || -> Result<Vec<Vec<Vec<RawEvent>>>> {
                    let mut exchange = ThreadExchange { shared, me };
                    let mut circuit = CircuitInstance::build(build)?;
                    let mut outputs = Vec::with_capacity(steps.len());
                    for (i, step) in steps.iter().enumerate() {
                        if restore_at == Some(i) {
                            let state = circuit.snapshot()?;
                            circuit = CircuitInstance::build(build)?;
                            circuit.restore(&state)?;
                        }
                        let mine: Vec<Vec<RawEvent>> = step
                            .iter()
                            .map(|port| port.iter().skip(me).step_by(workers).cloned().collect())
                            .collect();
                        outputs.push(circuit.step(mine, &mut exchange)?);
                    }
                    Ok(outputs)
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
    for worker in per_worker {
        for (i, step) in worker?.into_iter().enumerate() {
            if merged.len() <= i {
                merged.push(vec![Vec::new(); step.len()]);
            }
            for (port, events) in step.into_iter().enumerate() {
                merged[i][port].extend(events);
            }
        }
    }
    Ok(merged)
}
