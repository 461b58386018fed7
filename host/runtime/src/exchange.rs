//! The exchange: routes keyed events between the W workers of a pipeline
//! within one step.
//!
//! A key is hashed into one of [`SHARDS`] shards ([`shard_of`], the hash the
//! guest SDK splits its state by); the pipeline's [`Layout`] says which
//! worker owns each shard. Every worker contributes once per channel per
//! step; when all have, each gets the events it owns, in worker order, so
//! the result is deterministic.

use crate::bindings::KeyedEvents;
pub use sluice_core::{Layout, SHARDS, shard_of};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Why a shuffle failed; the guest sees it as the WIT `exchange-error`, the
/// host reports it as the step's failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExchangeError {
    /// A worker broke the exchange's calling contract.
    #[error("{0}")]
    ContractViolation(String),
    /// The step was abandoned before every worker contributed.
    #[error("{0}")]
    Aborted(String),
}

pub(crate) type Reply = Result<KeyedEvents, ExchangeError>;

/// Where a worker's shuffles go: the pipeline's [`Exchange`] in this
/// process, or (on a host running some of another host's pipeline's
/// workers) a proxy to the coordinator's exchange.
#[async_trait::async_trait]
pub(crate) trait Shuffler: Send + Sync {
    /// Worker `worker` contributes `events` on `channel`; resolves to the
    /// events it owns once every worker has contributed.
    async fn shuffle(&self, worker: u32, channel: u32, events: KeyedEvents) -> Reply;
}

#[async_trait::async_trait]
impl Shuffler for Exchange {
    async fn shuffle(&self, worker: u32, channel: u32, events: KeyedEvents) -> Reply {
        Exchange::shuffle(self, worker, channel, events).await
    }
}

/// No events.
pub(crate) fn empty() -> KeyedEvents {
    KeyedEvents {
        keys: Vec::new(),
        key_ends: Vec::new(),
        values: Vec::new(),
        ends: Vec::new(),
        weights: Vec::new(),
    }
}

/// One event of a [`KeyedEvents`]: key, value, weight.
pub(crate) type Unpacked<'a> = (&'a [u8], &'a [u8], i64);

/// The `(key, value, weight)` of each event of `events`, or `None` if the
/// packing is malformed (lengths differ, ends descend or overrun).
pub(crate) fn unpack(events: &KeyedEvents) -> Option<Vec<Unpacked<'_>>> {
    let n = events.weights.len();
    let keys = crate::worker::slices(&events.keys, &events.key_ends, n)?;
    let values = crate::worker::slices(&events.values, &events.ends, n)?;
    Some(
        keys.into_iter()
            .zip(values)
            .zip(&events.weights)
            .map(|((k, v), w)| (k, v, *w))
            .collect(),
    )
}

/// Appends one event to `to`.
fn push(to: &mut KeyedEvents, key: &[u8], value: &[u8], weight: i64) {
    to.keys.extend_from_slice(key);
    to.key_ends.push(to.keys.len() as u32);
    to.values.extend_from_slice(value);
    to.ends.push(to.values.len() as u32);
    to.weights.push(weight);
}

/// Appends every event of `from` to `to`.
fn append(to: &mut KeyedEvents, from: KeyedEvents) {
    let (k, v) = (to.keys.len() as u32, to.values.len() as u32);
    to.keys.extend_from_slice(&from.keys);
    to.key_ends.extend(from.key_ends.iter().map(|e| e + k));
    to.values.extend_from_slice(&from.values);
    to.ends.extend(from.ends.iter().map(|e| e + v));
    to.weights.extend_from_slice(&from.weights);
}

struct Round {
    contributed: Vec<bool>,
    /// `inbox[dest][src]`: what `src` sent to `dest`.
    inbox: Vec<Vec<KeyedEvents>>,
    waiters: Vec<Option<oneshot::Sender<Reply>>>,
}

struct State {
    rounds: BTreeMap<u32, Round>,
    finished: Vec<bool>,
    failure: Option<ExchangeError>,
}

/// The exchange of one pipeline, for one layout.
pub struct Exchange {
    workers: u32,
    /// The owner of each shard.
    owners: Vec<u32>,
    state: Mutex<State>,
}

impl Exchange {
    /// An exchange routing by `layout`.
    pub fn new(layout: &Layout) -> Arc<Self> {
        Self::with_owners(layout.workers, layout.shards.clone())
    }

    /// An exchange for one worker: everything stays with it.
    pub fn single() -> Arc<Self> {
        Self::with_owners(1, vec![0; SHARDS as usize])
    }

    fn with_owners(workers: u32, owners: Vec<u32>) -> Arc<Self> {
        Arc::new(Exchange {
            workers,
            owners,
            state: Mutex::new(State {
                rounds: BTreeMap::new(),
                finished: vec![false; workers as usize],
                failure: None,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a step: forgets the previous step's rounds and failures.
    pub fn begin_step(&self) {
        let mut s = self.lock();
        s.rounds.clear();
        s.finished = vec![false; self.workers as usize];
        s.failure = None;
    }

    /// Worker `worker` contributes `events` on `channel`; resolves to the
    /// events it owns once every worker has contributed.
    pub(crate) async fn shuffle(&self, worker: u32, channel: u32, events: KeyedEvents) -> Reply {
        let receiver = {
            let mut s = self.lock();
            if let Some(f) = &s.failure {
                return Err(f.clone());
            }
            let w = self.workers as usize;
            let round = s.rounds.entry(channel).or_insert_with(|| Round {
                contributed: vec![false; w],
                inbox: (0..w).map(|_| (0..w).map(|_| empty()).collect()).collect(),
                waiters: (0..w).map(|_| None).collect(),
            });
            let me = worker as usize;
            if round.contributed[me] {
                let msg = format!(
                    "worker {worker} called shuffle twice on channel {channel} in one step"
                );
                return Err(self.fail(&mut s, ExchangeError::ContractViolation(msg)));
            }
            let Some(sent) = unpack(&events) else {
                let msg = format!(
                    "worker {worker} sent a malformed batch on channel {channel} (ends out of \
                     order or past the bytes, or lists of different lengths)"
                );
                return Err(self.fail(&mut s, ExchangeError::ContractViolation(msg)));
            };
            let round = s.rounds.get_mut(&channel).expect("round exists");
            round.contributed[me] = true;
            for (key, value, weight) in sent {
                let dest = self.owners[shard_of(key) as usize] as usize;
                push(&mut round.inbox[dest][me], key, value, weight);
            }
            if round.contributed.iter().all(|c| *c) {
                let mut round = s.rounds.remove(&channel).expect("round exists");
                let mut mine = empty();
                for (dest, from) in round.inbox.into_iter().enumerate() {
                    let mut events = empty();
                    for part in from {
                        append(&mut events, part);
                    }
                    if dest == me {
                        mine = events;
                    } else if let Some(tx) = round.waiters[dest].take() {
                        let _ = tx.send(Ok(events));
                    }
                }
                return Ok(mine);
            }
            if let Some(done) = s.finished.iter().position(|f| *f) {
                let msg = format!(
                    "worker {worker} waits on channel {channel}, but worker {done} already finished its step without using it; \
                     every worker must call shuffle on the same channels in each step"
                );
                return Err(self.fail(&mut s, ExchangeError::ContractViolation(msg)));
            }
            let (tx, rx) = oneshot::channel();
            s.rounds.get_mut(&channel).expect("round exists").waiters[me] = Some(tx);
            rx
        };
        receiver.await.unwrap_or_else(|_| {
            Err(ExchangeError::Aborted(
                "the step was abandoned before every worker contributed".into(),
            ))
        })
    }

    /// Worker `worker` returned from its step. Fails any round it never
    /// joined: the workers waiting there would otherwise wait forever.
    pub fn worker_finished(&self, worker: u32) {
        let mut s = self.lock();
        s.finished[worker as usize] = true;
        let stuck: Vec<u32> = s
            .rounds
            .iter()
            .filter(|(_, r)| !r.contributed[worker as usize])
            .map(|(c, _)| *c)
            .collect();
        if let Some(channel) = stuck.first() {
            let msg = format!(
                "worker {worker} finished its step without calling shuffle on channel {channel}, \
                 which other workers are waiting on; every worker must call shuffle on the same channels in each step"
            );
            self.fail(&mut s, ExchangeError::ContractViolation(msg));
        }
    }

    /// Records a failure and wakes every waiter with it.
    fn fail(&self, s: &mut State, error: ExchangeError) -> ExchangeError {
        s.failure.get_or_insert(error.clone());
        for round in s.rounds.values_mut() {
            for tx in round.waiters.iter_mut().filter_map(Option::take) {
                let _ = tx.send(Err(error.clone()));
            }
        }
        error
    }

    /// The failure of the current step, if the exchange failed: the root
    /// cause, whatever the workers returned after seeing it.
    pub fn failure(&self) -> Option<ExchangeError> {
        self.lock().failure.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packs `(key, value)` events of weight 1.
    fn evs<'a>(events: impl IntoIterator<Item = (&'a str, u8)>) -> KeyedEvents {
        let mut out = empty();
        for (k, v) in events {
            push(&mut out, k.as_bytes(), &[v], 1);
        }
        out
    }

    fn owner(key: &[u8], layout: &Layout) -> u32 {
        layout.owner(shard_of(key))
    }

    fn two_workers() -> Layout {
        Layout {
            epoch: 0,
            workers: 2,
            shards: (0..SHARDS).map(|s| (s * 7 / 3) % 2).collect(),
            partitions: vec![],
        }
    }

    #[tokio::test]
    async fn routes_by_key_owner_in_worker_order() {
        let layout = two_workers();
        let x = Exchange::new(&layout);
        x.begin_step();
        let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
        let send = |w: u8| evs(keys.iter().map(|k| (k.as_str(), w)));
        let (a, b) = tokio::join!(x.shuffle(0, 7, send(0)), x.shuffle(1, 7, send(1)));
        for (w, got) in [a.unwrap(), b.unwrap()].into_iter().enumerate() {
            let got = unpack(&got).unwrap();
            assert!(got.iter().all(|(k, _, _)| owner(k, &layout) == w as u32));
            // Worker 0's contributions come first.
            let sources: Vec<u8> = got.iter().map(|(_, v, _)| v[0]).collect();
            assert!(sources.windows(2).all(|p| p[0] <= p[1]));
            assert_eq!(
                got.len(),
                2 * keys
                    .iter()
                    .filter(|k| owner(k.as_bytes(), &layout) == w as u32)
                    .count()
            );
        }
    }

    #[tokio::test]
    async fn a_worker_that_skips_a_channel_fails_the_waiters() {
        let x = Exchange::new(&two_workers());
        x.begin_step();
        let waiting = x.shuffle(0, 1, evs([("a", 0)]));
        let finishing = async {
            tokio::task::yield_now().await;
            x.worker_finished(1);
        };
        let (r, ()) = tokio::join!(waiting, finishing);
        assert!(
            r.unwrap_err()
                .to_string()
                .contains("without calling shuffle on channel 1")
        );
    }

    #[tokio::test]
    async fn a_malformed_batch_fails_the_step() {
        let x = Exchange::new(&two_workers());
        x.begin_step();
        let mut bad = evs([("a", 0), ("b", 1)]);
        bad.ends.reverse();
        let err = x.shuffle(0, 1, bad).await.unwrap_err();
        assert!(err.to_string().contains("malformed batch"), "{err}");
        let mut short = evs([("a", 0)]);
        short.weights.push(1);
        x.begin_step();
        assert!(x.shuffle(0, 1, short).await.is_err());
    }
}
