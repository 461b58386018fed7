//! The exchange: routes keyed events between the W workers of a pipeline
//! within one step.
//!
//! A key is hashed into one of [`SHARDS`] shards ([`shard_of`], the hash the
//! guest SDK splits its state by); the pipeline's [`Layout`] says which
//! worker owns each shard. Every worker contributes once per channel per
//! step; when all have, each gets the events it owns, in worker order, so
//! the result is deterministic.
//!
//! **Across hosts** each host runs one [`Exchange`] for its own workers (a
//! *slot* of the pipeline's placement), joined to the others' by
//! links: once every local worker has contributed on a channel, the
//! host sends each other host one frame with everything its workers sent
//! that host's workers — frames batched per destination host, each host to
//! each host directly — and a round completes when the local workers and
//! every other host have contributed. Received events are concatenated in
//! global worker order whatever host they came from, so any placement of
//! the workers computes what one host computes. A failure (a broken
//! contract, a host that cannot be reached) fails the step on every host:
//! the failing host sends the others an abort frame.

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

/// One host's contribution to one round (or its abort), for another host.
#[derive(Debug)]
pub(crate) struct Frame {
    /// The exchange it belongs to (one per coordinator, layout and
    /// placement): frames of any other are stale and dropped.
    pub session: u64,
    /// The step.
    pub step: u64,
    /// The channel (the round within the step).
    pub channel: u32,
    /// The slot that sent it.
    pub from: u32,
    /// What it carries.
    pub body: FrameBody,
}

/// What a [`Frame`] carries.
#[derive(Debug)]
pub(crate) enum FrameBody {
    /// `(source worker, destination worker, events)`: everything the
    /// sender's workers sent the receiver's on this channel (pairs with no
    /// events left out).
    Parts(Vec<(u32, u32, KeyedEvents)>),
    /// The step failed on the sender.
    Abort(ExchangeError),
}

/// The way to another host's exchange. Sending waits while the link's queue
/// is full (backpressure); an error means the host cannot be reached.
#[async_trait::async_trait]
pub(crate) trait Link: Send + Sync {
    async fn send(&self, frame: Frame) -> Result<(), String>;
}

/// Where the workers run: the slot of each, this exchange's slot, and the
/// links to the other slots.
pub(crate) struct Placement {
    /// Tells this exchange's frames from stale ones.
    pub session: u64,
    /// This host's slot.
    pub slot: u32,
    /// The slot of each worker.
    pub slots: Vec<u32>,
    /// `links[s]`: the way to slot `s` (`None` for this slot and slots
    /// without workers).
    pub links: Vec<Option<Arc<dyn Link>>>,
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
    /// Which local workers contributed.
    contributed: Vec<bool>,
    /// Which other slots' frames arrived.
    heard: Vec<bool>,
    /// `inbox[dest][src]`: what `src` sent to `dest` (for a `dest` on
    /// another host, until the frame to it leaves).
    inbox: Vec<Vec<KeyedEvents>>,
    waiters: Vec<Option<oneshot::Sender<Reply>>>,
}

/// Where a round stands after a contribution.
enum Settled {
    /// Complete: the contributing worker's events.
    Delivered(KeyedEvents),
    /// This local worker finished its step without contributing.
    Stuck(usize),
    /// Waiting for more contributions.
    Waiting,
}

struct State {
    /// The step under way.
    step: u64,
    /// Rounds by (step, channel): another host's frame may arrive for a
    /// round no local worker reached yet.
    rounds: BTreeMap<(u64, u32), Round>,
    /// Which local workers finished the current step.
    finished: Vec<bool>,
    /// The step that failed, and why.
    failure: Option<(u64, ExchangeError)>,
}

/// The exchange of one pipeline, for one layout and placement: on one host,
/// or this host's part of it.
pub struct Exchange {
    workers: u32,
    /// The owner of each shard.
    owners: Vec<u32>,
    session: u64,
    slot: u32,
    /// The slot of each worker.
    slots: Vec<u32>,
    /// The other slots that run workers, with the way to each.
    peers: Vec<(u32, Arc<dyn Link>)>,
    state: Mutex<State>,
    /// Woken when a step fails: a sender waiting on a full link gives up.
    failed: tokio::sync::Notify,
}

impl Exchange {
    /// An exchange routing by `layout`, every worker in this process.
    pub fn new(layout: &Layout) -> Arc<Self> {
        Self::with_owners(layout.workers, layout.shards.clone(), None)
    }

    /// An exchange for one worker: everything stays with it.
    pub fn single() -> Arc<Self> {
        Self::with_owners(1, vec![0; SHARDS as usize], None)
    }

    /// This host's part of an exchange routing by `layout` across the
    /// hosts of `placement`.
    pub(crate) fn across(layout: &Layout, placement: Placement) -> Arc<Self> {
        Self::with_owners(layout.workers, layout.shards.clone(), Some(placement))
    }

    pub(crate) fn with_owners(
        workers: u32,
        owners: Vec<u32>,
        placement: Option<Placement>,
    ) -> Arc<Self> {
        let placement = placement.unwrap_or_else(|| Placement {
            session: 0,
            slot: 0,
            slots: vec![0; workers as usize],
            links: vec![None],
        });
        let peers = placement
            .links
            .into_iter()
            .enumerate()
            .filter_map(|(s, l)| Some((s as u32, l?)))
            .filter(|(s, _)| *s != placement.slot && placement.slots.contains(s))
            .collect();
        Arc::new(Exchange {
            workers,
            owners,
            session: placement.session,
            slot: placement.slot,
            slots: placement.slots,
            peers,
            state: Mutex::new(State {
                step: 0,
                rounds: BTreeMap::new(),
                finished: vec![false; workers as usize],
                failure: None,
            }),
            failed: tokio::sync::Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn local(&self, worker: usize) -> bool {
        self.slots.get(worker) == Some(&self.slot)
    }

    /// Starts step `step` (if it is not the current one): forgets the
    /// previous step's rounds and failure.
    pub fn begin_step(&self, step: u64) {
        let mut s = self.lock();
        self.advance(&mut s, step);
    }

    fn advance(&self, s: &mut State, step: u64) {
        if s.step == step {
            return;
        }
        s.step = step;
        s.rounds.retain(|(at, _), _| *at >= step);
        s.finished = vec![false; self.workers as usize];
        if s.failure.as_ref().is_some_and(|(at, _)| *at != step) {
            s.failure = None;
        }
    }

    fn new_round(&self) -> Round {
        let w = self.workers as usize;
        Round {
            contributed: vec![false; w],
            heard: vec![false; self.slots.iter().max().map_or(1, |m| *m as usize + 1)],
            inbox: (0..w).map(|_| (0..w).map(|_| empty()).collect()).collect(),
            waiters: (0..w).map(|_| None).collect(),
        }
    }

    /// Whether every local worker contributed and every other host's frame
    /// arrived.
    fn complete(&self, round: &Round) -> bool {
        round
            .contributed
            .iter()
            .enumerate()
            .all(|(w, c)| *c || !self.local(w))
            && self.peers.iter().all(|(s, _)| round.heard[*s as usize])
    }

    /// Where round `key` stands after a contribution: complete (every
    /// local waiter but `me` handed its events, `me`'s returned), stuck on
    /// a local worker that finished without contributing, or waiting.
    fn settle(&self, s: &mut State, key: (u64, u32), me: Option<usize>) -> Settled {
        if s.rounds.get(&key).is_some_and(|r| self.complete(r))
            && let Some(round) = s.rounds.remove(&key)
        {
            return Settled::Delivered(self.deliver(round, me));
        }
        let stuck = s.rounds.get(&key).and_then(|round| {
            (0..self.workers as usize).find(|w| s.finished[*w] && !round.contributed[*w])
        });
        match stuck {
            Some(done) => Settled::Stuck(done),
            None => Settled::Waiting,
        }
    }

    /// Hands every local worker but `me` its events; returns `me`'s.
    fn deliver(&self, round: Round, me: Option<usize>) -> KeyedEvents {
        let mut mine = empty();
        let mut waiters = round.waiters;
        for (dest, from) in round.inbox.into_iter().enumerate() {
            if !self.local(dest) {
                continue;
            }
            let mut events = empty();
            for part in from {
                append(&mut events, part);
            }
            if Some(dest) == me {
                mine = events;
            } else if let Some(tx) = waiters[dest].take() {
                let _ = tx.send(Ok(events));
            }
        }
        mine
    }

    /// Worker `worker` contributes `events` on `channel` in step `step`;
    /// resolves to the events it owns once every worker has contributed.
    pub(crate) async fn shuffle(
        &self,
        worker: u32,
        step: u64,
        channel: u32,
        events: KeyedEvents,
    ) -> Reply {
        let me = worker as usize;
        tracing::trace!(
            session = self.session,
            slot = self.slot,
            worker,
            step,
            channel,
            "shuffle"
        );
        let (frames, outcome) = {
            let mut s = self.lock();
            self.advance(&mut s, step);
            if let Some((_, f)) = &s.failure {
                return Err(f.clone());
            }
            if !self.local(me) {
                let msg = format!("worker {worker} does not run on this host");
                return Err(self.fail(&mut s, ExchangeError::ContractViolation(msg), true));
            }
            let key = (step, channel);
            if s.rounds.get(&key).is_some_and(|r| r.contributed[me]) {
                let msg = format!(
                    "worker {worker} called shuffle twice on channel {channel} in one step"
                );
                return Err(self.fail(&mut s, ExchangeError::ContractViolation(msg), true));
            }
            let Some(sent) = unpack(&events) else {
                let msg = format!(
                    "worker {worker} sent a malformed batch on channel {channel} (ends out of \
                     order or past the bytes, or lists of different lengths)"
                );
                return Err(self.fail(&mut s, ExchangeError::ContractViolation(msg), true));
            };
            let round = s.rounds.entry(key).or_insert_with(|| self.new_round());
            round.contributed[me] = true;
            for (key, value, weight) in sent {
                let dest = self.owners[shard_of(key) as usize] as usize;
                push(&mut round.inbox[dest][me], key, value, weight);
            }
            // Every local worker has contributed: what they sent the other
            // hosts' workers leaves, one frame per host.
            let all_local = round
                .contributed
                .iter()
                .enumerate()
                .all(|(w, c)| *c || !self.local(w));
            let mut frames = Vec::new();
            if all_local {
                for (slot, link) in &self.peers {
                    let mut parts = Vec::new();
                    for dest in 0..self.workers as usize {
                        if self.slots[dest] != *slot {
                            continue;
                        }
                        for src in 0..self.workers as usize {
                            let part = std::mem::replace(&mut round.inbox[dest][src], empty());
                            if !part.weights.is_empty() {
                                parts.push((src as u32, dest as u32, part));
                            }
                        }
                    }
                    let frame = Frame {
                        session: self.session,
                        step,
                        channel,
                        from: self.slot,
                        body: FrameBody::Parts(parts),
                    };
                    frames.push((link.clone(), frame));
                }
            }
            let outcome = match self.settle(&mut s, key, Some(me)) {
                Settled::Delivered(mine) => Ok(mine),
                Settled::Stuck(done) => {
                    let msg = format!(
                        "worker {worker} waits on channel {channel}, but worker {done} already finished its step without using it; \
                         every worker must call shuffle on the same channels in each step"
                    );
                    return Err(self.fail(&mut s, ExchangeError::ContractViolation(msg), true));
                }
                Settled::Waiting => {
                    // (Dropped unsent if the round is gone: the worker
                    // then hears the step was abandoned.)
                    let (tx, rx) = oneshot::channel();
                    if let Some(round) = s.rounds.get_mut(&key) {
                        round.waiters[me] = Some(tx);
                    }
                    Err(rx)
                }
            };
            (frames, outcome)
        };
        for (link, frame) in frames {
            // A link whose queue stays full (a stalled host) must not hold
            // this worker once the step has failed anyway.
            let failed = self.failed.notified();
            tokio::pin!(failed);
            failed.as_mut().enable();
            if let Some(e) = self.failure_of(step) {
                return Err(e);
            }
            let sent = tokio::select! {
                sent = link.send(frame) => sent,
                _ = failed => return Err(self.failure_of(step).unwrap_or_else(|| {
                    ExchangeError::Aborted("the step failed on another worker".into())
                })),
            };
            if let Err(why) = sent {
                let msg = format!("another host of the pipeline cannot be reached: {why}");
                let e = self.fail(&mut self.lock(), ExchangeError::Aborted(msg), true);
                return Err(e);
            }
        }
        match outcome {
            Ok(mine) => Ok(mine),
            Err(rx) => rx.await.unwrap_or_else(|_| {
                Err(ExchangeError::Aborted(
                    "the step was abandoned before every worker contributed".into(),
                ))
            }),
        }
    }

    /// Takes another host's frame.
    pub(crate) fn receive(&self, frame: Frame) {
        tracing::trace!(
            session = self.session,
            slot = self.slot,
            frame.session,
            frame.step,
            frame.channel,
            frame.from,
            "receive"
        );
        if frame.session != self.session {
            return;
        }
        let mut s = self.lock();
        if frame.step < s.step {
            return;
        }
        let (step, channel, from) = (frame.step, frame.channel, frame.from as usize);
        let parts = match frame.body {
            FrameBody::Abort(e) => {
                if step == s.step {
                    self.fail(&mut s, e, false);
                } else {
                    s.failure.get_or_insert((step, e));
                }
                return;
            }
            FrameBody::Parts(parts) => parts,
        };
        let key = (step, channel);
        let current = s.step;
        let round = s.rounds.entry(key).or_insert_with(|| self.new_round());
        let fits = |src: u32, dest: u32| {
            self.slots.get(src as usize) == Some(&(from as u32)) && self.local(dest as usize)
        };
        if round.heard.get(from).is_none_or(|h| *h)
            || parts.iter().any(|(src, dest, _)| !fits(*src, *dest))
        {
            let msg = format!(
                "slot {from} sent a frame that does not fit the placement (channel {channel} of step {step})"
            );
            if step == current {
                self.fail(&mut s, ExchangeError::Aborted(msg), true);
            }
            return;
        }
        round.heard[from] = true;
        for (src, dest, events) in parts {
            round.inbox[dest as usize][src as usize] = events;
        }
        if step != current {
            return;
        }
        if let Settled::Stuck(done) = self.settle(&mut s, key, None) {
            let msg = format!(
                "worker {done} finished its step without calling shuffle on channel {channel}, \
                 which other workers are waiting on; every worker must call shuffle on the same channels in each step"
            );
            self.fail(&mut s, ExchangeError::ContractViolation(msg), true);
        }
    }

    /// Worker `worker` returned from its step. Fails any round it never
    /// joined: the workers waiting there would otherwise wait forever. (A
    /// worker on another host is that host's to report.)
    pub fn worker_finished(&self, worker: u32) {
        if !self.local(worker as usize) {
            return;
        }
        let mut s = self.lock();
        s.finished[worker as usize] = true;
        let current = s.step;
        let stuck = s
            .rounds
            .iter()
            .find(|((at, _), r)| *at == current && !r.contributed[worker as usize])
            .map(|((_, c), _)| *c);
        if let Some(channel) = stuck {
            let msg = format!(
                "worker {worker} finished its step without calling shuffle on channel {channel}, \
                 which other workers are waiting on; every worker must call shuffle on the same channels in each step"
            );
            self.fail(&mut s, ExchangeError::ContractViolation(msg), true);
        }
    }

    fn failure_of(&self, step: u64) -> Option<ExchangeError> {
        let s = self.lock();
        s.failure
            .as_ref()
            .filter(|(at, _)| *at == step)
            .map(|(_, e)| e.clone())
    }

    /// Worker `worker`'s step failed (here, or its host was lost): the step
    /// fails on every host, so no worker waits on it.
    pub(crate) fn worker_failed(&self, worker: u32, why: &str) {
        let mut s = self.lock();
        let msg = format!("worker {worker} failed: {why}");
        self.fail(&mut s, ExchangeError::Aborted(msg), true);
    }

    /// A link to another host failed: the current step fails here and on
    /// every host still reachable.
    pub(crate) fn link_failed(&self, why: String) {
        let mut s = self.lock();
        self.fail(&mut s, ExchangeError::Aborted(why), true);
    }

    /// Records a failure of the current step and wakes every waiter with it;
    /// with `tell`, the other hosts hear of it too.
    fn fail(&self, s: &mut State, error: ExchangeError, tell: bool) -> ExchangeError {
        if let Some((at, e)) = &s.failure
            && *at == s.step
        {
            return e.clone();
        }
        s.failure = Some((s.step, error.clone()));
        self.failed.notify_waiters();
        for round in s.rounds.values_mut() {
            for tx in round.waiters.iter_mut().filter_map(Option::take) {
                let _ = tx.send(Err(error.clone()));
            }
        }
        if tell && !self.peers.is_empty() {
            let (peers, session, step, slot) =
                (self.peers.clone(), self.session, s.step, self.slot);
            let abort = error.clone();
            // One task per host: a host that stalled (its link's queue
            // full) must not keep the abort from the others.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                for (_, link) in peers {
                    let frame = Frame {
                        session,
                        step,
                        channel: 0,
                        from: slot,
                        body: FrameBody::Abort(abort.clone()),
                    };
                    rt.spawn(async move { link.send(frame).await });
                }
            }
        }
        error
    }

    /// The failure of the current step, if the exchange failed: the root
    /// cause, whatever the workers returned after seeing it.
    pub fn failure(&self) -> Option<ExchangeError> {
        let s = self.lock();
        s.failure
            .as_ref()
            .filter(|(at, _)| *at == s.step)
            .map(|(_, e)| e.clone())
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
        x.begin_step(1);
        let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
        let send = |w: u8| evs(keys.iter().map(|k| (k.as_str(), w)));
        let (a, b) = tokio::join!(x.shuffle(0, 1, 7, send(0)), x.shuffle(1, 1, 7, send(1)));
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
        x.begin_step(1);
        let waiting = x.shuffle(0, 1, 1, evs([("a", 0)]));
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
        x.begin_step(1);
        let mut bad = evs([("a", 0), ("b", 1)]);
        bad.ends.reverse();
        let err = x.shuffle(0, 1, 1, bad).await.unwrap_err();
        assert!(err.to_string().contains("malformed batch"), "{err}");
        let mut short = evs([("a", 0)]);
        short.weights.push(1);
        x.begin_step(2);
        assert!(x.shuffle(0, 2, 1, short).await.is_err());
    }

    /// A link straight into another exchange in this process.
    struct Direct(Arc<std::sync::OnceLock<std::sync::Weak<Exchange>>>);

    #[async_trait::async_trait]
    impl Link for Direct {
        async fn send(&self, frame: Frame) -> Result<(), String> {
            match self.0.get().and_then(std::sync::Weak::upgrade) {
                Some(x) => {
                    x.receive(frame);
                    Ok(())
                }
                None => Err("gone".into()),
            }
        }
    }

    /// A link that always fails.
    struct Broken;

    #[async_trait::async_trait]
    impl Link for Broken {
        async fn send(&self, _: Frame) -> Result<(), String> {
            Err("connection refused".into())
        }
    }

    /// The exchanges of `hosts` slots joined by direct links, worker `w` on
    /// slot `w mod hosts`.
    fn mesh(layout: &Layout, hosts: u32) -> Vec<Arc<Exchange>> {
        let cells: Vec<Arc<std::sync::OnceLock<std::sync::Weak<Exchange>>>> =
            (0..hosts).map(|_| Arc::default()).collect();
        let xs: Vec<Arc<Exchange>> = (0..hosts)
            .map(|slot| {
                let links = (0..hosts)
                    .map(|s| {
                        (s != slot)
                            .then(|| Arc::new(Direct(cells[s as usize].clone())) as Arc<dyn Link>)
                    })
                    .collect();
                Exchange::across(
                    layout,
                    Placement {
                        session: 7,
                        slot,
                        slots: (0..layout.workers).map(|w| w % hosts).collect(),
                        links,
                    },
                )
            })
            .collect();
        for (cell, x) in cells.iter().zip(&xs) {
            cell.set(Arc::downgrade(x)).unwrap();
        }
        xs
    }

    fn five_workers() -> Layout {
        Layout {
            epoch: 0,
            workers: 5,
            shards: (0..SHARDS).map(|s| (s * 13 / 7) % 5).collect(),
            partitions: vec![],
        }
    }

    /// Every worker shuffles distinct events on channels 3 and 9, for two
    /// steps; returns what each received, by (step, channel, worker).
    async fn run_rounds(xs: &[Arc<Exchange>], workers: u32) -> Vec<Vec<(Vec<u8>, Vec<u8>, i64)>> {
        let host = |w: u32| xs[(w as usize) % xs.len()].clone();
        let mut got = Vec::new();
        for step in 1..=2u64 {
            for x in xs {
                x.begin_step(step);
            }
            for channel in [3u32, 9] {
                let calls = (0..workers).map(|w| {
                    let x = host(w);
                    let mut events = empty();
                    for i in 0..40u32 {
                        let key = format!("k{}", (i * 7 + w * 3 + channel) % 23);
                        push(
                            &mut events,
                            key.as_bytes(),
                            &[w as u8, i as u8],
                            i64::from(step as u32),
                        );
                    }
                    tokio::spawn(async move { x.shuffle(w, step, channel, events).await })
                });
                let calls: Vec<_> = calls.collect();
                for call in calls {
                    let r = call.await.unwrap().unwrap();
                    got.push(
                        unpack(&r)
                            .unwrap()
                            .into_iter()
                            .map(|(k, v, w)| (k.to_vec(), v.to_vec(), w))
                            .collect(),
                    );
                }
            }
            for w in 0..workers {
                host(w).worker_finished(w);
            }
        }
        got
    }

    #[tokio::test]
    async fn across_hosts_each_worker_gets_what_one_host_gives_it() {
        let layout = five_workers();
        let one = run_rounds(&[Exchange::new(&layout)], 5).await;
        assert!(one.iter().any(|r| !r.is_empty()));
        for hosts in [2, 3, 5] {
            let across = run_rounds(&mesh(&layout, hosts), 5).await;
            assert_eq!(across, one, "on {hosts} hosts");
        }
    }

    #[tokio::test]
    async fn a_worker_on_another_host_that_skips_a_channel_fails_the_waiters() {
        let xs = mesh(&two_workers(), 2);
        for x in &xs {
            x.begin_step(1);
        }
        let waiting = xs[0].shuffle(0, 1, 1, evs([("a", 0)]));
        let finishing = async {
            tokio::task::yield_now().await;
            xs[1].worker_finished(1);
        };
        let (r, ()) = tokio::join!(waiting, finishing);
        let err = r.unwrap_err().to_string();
        assert!(
            err.contains("without calling shuffle on channel 1"),
            "{err}"
        );
        // The next step starts clean on both hosts.
        for x in &xs {
            x.begin_step(2);
        }
        let (a, b) = tokio::join!(
            xs[0].shuffle(0, 2, 1, evs([("a", 0)])),
            xs[1].shuffle(1, 2, 1, evs([("b", 1)]))
        );
        assert!(a.is_ok() && b.is_ok());
    }

    #[tokio::test]
    async fn an_unreachable_host_fails_the_step() {
        let layout = two_workers();
        let x = Exchange::across(
            &layout,
            Placement {
                session: 1,
                slot: 0,
                slots: vec![0, 1],
                links: vec![None, Some(Arc::new(Broken))],
            },
        );
        x.begin_step(1);
        let err = x.shuffle(0, 1, 1, evs([("a", 0)])).await.unwrap_err();
        assert!(err.to_string().contains("cannot be reached"), "{err}");
        assert!(x.failure().is_some());
    }

    /// A link whose queue stays full: sending never completes.
    struct Full;

    #[async_trait::async_trait]
    impl Link for Full {
        async fn send(&self, _: Frame) -> Result<(), String> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn a_sender_stuck_on_a_full_link_gives_up_when_the_step_fails() {
        let x = Exchange::across(
            &two_workers(),
            Placement {
                session: 1,
                slot: 0,
                slots: vec![0, 1],
                links: vec![None, Some(Arc::new(Full))],
            },
        );
        x.begin_step(1);
        let stuck = x.shuffle(0, 1, 1, evs([("a", 0)]));
        let failing = async {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            x.worker_failed(1, "its host was lost");
        };
        let limit = std::time::Duration::from_secs(5);
        let (r, ()) = tokio::join!(tokio::time::timeout(limit, stuck), failing);
        let err = r.expect("the sender gave up").unwrap_err().to_string();
        assert!(err.contains("its host was lost"), "{err}");
    }

    #[tokio::test]
    async fn frames_of_another_session_or_an_earlier_step_are_dropped() {
        let xs = mesh(&two_workers(), 2);
        xs[0].begin_step(5);
        for (session, step) in [(8, 5), (7, 4)] {
            xs[0].receive(Frame {
                session,
                step,
                channel: 1,
                from: 1,
                body: FrameBody::Abort(ExchangeError::Aborted("stale".into())),
            });
        }
        assert_eq!(xs[0].failure(), None);
    }
}
