//! The [`Exchange`] itself: the rounds of a step (one per channel), each
//! complete when every worker — and, across hosts, every other host —
//! has contributed; delivery in worker order; failing every waiter when a
//! worker, a host or a link fails (or another slot goes silent), and
//! passing every failure on to the other hosts.
//!
//! **Replicas.** A worker may run on several slots at once (its primary
//! and followers, [`Placement::followers`]). Each replica contributes
//! what it sends; a receiver keeps the first copy of each `(source,
//! destination)` part and checks every later copy against it — the
//! copies are the same bytes by I4, and a difference is a finding
//! ([`ExchangeError::Diverged`]), never a silent choice. Frames of a
//! replicated exchange carry every pair, empty ones too, so that a replica
//! sending nothing where another sent events is caught as well.

use super::frame::{Frame, FrameBody, Link, Placement};
use super::liveness::Liveness;
use crate::bindings::KeyedEvents;
use crate::error::ExchangeError;
use crate::packed::{append, empty, push, unpack};
use sluice_core::{Layout, SHARDS, shard_of};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

pub(crate) type Reply = Result<KeyedEvents, ExchangeError>;

struct Round {
    /// Which local workers contributed.
    contributed: Vec<bool>,
    /// Which other slots' frames arrived.
    heard: Vec<bool>,
    /// `inbox[dest][src]`: what `src` sent to `dest` (for a `dest` on
    /// another host, until the frame to it leaves).
    inbox: Vec<Vec<KeyedEvents>>,
    /// With replicas: `filled[dest][src]`, whether a copy of that part
    /// arrived (a later copy is checked against it). Empty without.
    filled: Vec<Vec<bool>>,
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
    /// With replicas: the slots given up for this session (their host
    /// died, stalled or was cut off) while every worker still ran on
    /// another — rounds complete without them.
    lost: Vec<bool>,
}

/// The exchange of one pipeline, for one layout and placement: on one host,
/// or this host's part of it.
pub struct Exchange {
    workers: u32,
    /// The owner of each shard.
    owners: Vec<u32>,
    session: u64,
    slot: u32,
    /// The slot of each worker (its primary's).
    slots: Vec<u32>,
    /// The other slots each worker runs on (its followers').
    followers: Vec<Vec<u32>>,
    /// Whether any worker runs on more than one slot.
    replicated: bool,
    /// The number of slots (the highest that runs a worker, plus one).
    slot_count: usize,
    /// The other slots that run workers, with the way to each.
    peers: Vec<(u32, Arc<dyn Link>)>,
    state: Mutex<State>,
    /// Woken when a step fails: a sender waiting on a full link gives up.
    failed: tokio::sync::Notify,
    /// When each other slot was last heard from.
    liveness: Liveness,
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
            followers: Vec::new(),
            links: vec![None],
            silence: Duration::MAX,
        });
        let mut followers = placement.followers;
        followers.resize_with(workers as usize, Vec::new);
        let replicated = followers.iter().any(|f| !f.is_empty());
        let runs =
            |s: u32| placement.slots.contains(&s) || followers.iter().any(|f| f.contains(&s));
        let slot_count = placement
            .slots
            .iter()
            .chain(followers.iter().flatten())
            .max()
            .map_or(1, |m| *m as usize + 1);
        let liveness = Liveness::new(slot_count.max(placement.links.len()), placement.silence);
        let peers = placement
            .links
            .into_iter()
            .enumerate()
            .filter_map(|(s, l)| Some((s as u32, l?)))
            .filter(|(s, _)| *s != placement.slot && runs(*s))
            .collect();
        Arc::new(Exchange {
            liveness,
            workers,
            owners,
            session: placement.session,
            slot: placement.slot,
            slots: placement.slots,
            followers,
            replicated,
            slot_count,
            peers,
            state: Mutex::new(State {
                step: 0,
                rounds: BTreeMap::new(),
                finished: vec![false; workers as usize],
                failure: None,
                lost: vec![false; slot_count],
            }),
            failed: tokio::sync::Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether worker `w` (a replica of it) runs on slot `slot`.
    fn runs_on(&self, w: usize, slot: u32) -> bool {
        self.slots.get(w) == Some(&slot) || self.followers.get(w).is_some_and(|f| f.contains(&slot))
    }

    /// Whether worker `worker` (a replica of it) runs on this slot.
    fn local(&self, worker: usize) -> bool {
        self.runs_on(worker, self.slot)
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
            heard: vec![false; self.slot_count],
            inbox: (0..w).map(|_| (0..w).map(|_| empty()).collect()).collect(),
            filled: match self.replicated {
                true => vec![vec![false; w]; w],
                false => Vec::new(),
            },
            waiters: (0..w).map(|_| None).collect(),
        }
    }

    /// Whether every local worker contributed and every other host's frame
    /// arrived.
    fn complete(&self, round: &Round, lost: &[bool]) -> bool {
        round
            .contributed
            .iter()
            .enumerate()
            .all(|(w, c)| *c || !self.local(w))
            && self
                .peers
                .iter()
                .all(|(s, _)| round.heard[*s as usize] || lost[*s as usize])
    }

    /// Where round `key` stands after a contribution: complete (every
    /// local waiter but `me` handed its events, `me`'s returned), stuck on
    /// a local worker that finished without contributing, or waiting.
    fn settle(&self, s: &mut State, key: (u64, u32), me: Option<usize>) -> Settled {
        if s.rounds
            .get(&key)
            .is_some_and(|r| self.complete(r, &s.lost))
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
            let lost = s.lost.clone();
            let round = s.rounds.entry(key).or_insert_with(|| self.new_round());
            round.contributed[me] = true;
            if self.replicated {
                let mut parts: Vec<KeyedEvents> = (0..self.workers).map(|_| empty()).collect();
                for (key, value, weight) in sent {
                    let dest = self.owners[shard_of(key) as usize] as usize;
                    push(&mut parts[dest], key, value, weight);
                }
                let diverged = parts
                    .into_iter()
                    .enumerate()
                    .find(|(dest, part)| !file(round, *dest, me, part.clone()))
                    .map(|(dest, _)| dest);
                if let Some(dest) = diverged {
                    let e = self.diverged(step, channel, me, dest, "this host's replica");
                    return Err(self.fail(&mut s, e, true));
                }
            } else {
                for (key, value, weight) in sent {
                    let dest = self.owners[shard_of(key) as usize] as usize;
                    push(&mut round.inbox[dest][me], key, value, weight);
                }
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
                    if lost[*slot as usize] {
                        continue;
                    }
                    let mut parts = Vec::new();
                    for dest in 0..self.workers as usize {
                        if !self.runs_on(dest, *slot) {
                            continue;
                        }
                        for src in 0..self.workers as usize {
                            if self.replicated {
                                // Every pair of a local source, empty
                                // ones too: the receiver checks each copy.
                                if self.local(src) {
                                    let part = round.inbox[dest][src].clone();
                                    parts.push((src as u32, dest as u32, part));
                                }
                                continue;
                            }
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
                    frames.push((*slot, link.clone(), frame));
                }
                if self.replicated {
                    // What only other hosts' workers receive is sent.
                    for dest in (0..self.workers as usize).filter(|d| !self.local(*d)) {
                        round.inbox[dest].iter_mut().for_each(|p| *p = empty());
                    }
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
        for (slot, link, frame) in frames {
            // A link whose queue stays full (a stalled host) must not hold
            // this worker once the step has failed anyway, or once that
            // host is given up (with replicas).
            let send = link.send(frame);
            tokio::pin!(send);
            let sent = loop {
                let failed = self.failed.notified();
                tokio::pin!(failed);
                failed.as_mut().enable();
                if let Some(e) = self.failure_of(step) {
                    return Err(e);
                }
                if self.is_lost(slot) {
                    break Ok(());
                }
                tokio::select! {
                    sent = &mut send => break sent,
                    _ = failed => {}
                }
            };
            if let Err(why) = sent {
                let msg = format!(
                    "{} (slot {slot}) of the pipeline cannot be reached: {why}",
                    link.peer()
                );
                self.slot_lost(slot, ExchangeError::Aborted(msg));
                if let Some(e) = self.failure_of(step) {
                    return Err(e);
                }
            }
        }
        match outcome {
            Ok(mine) => Ok(mine),
            Err(rx) => self.wait(rx, step, channel).await,
        }
    }

    /// Waits for round `(step, channel)` to complete, looking every tick
    /// for another slot whose part is missing and that has been silent for
    /// the session timeout: that fails the step (here and, told, on every
    /// host). A slot still heard from is waited for, however long.
    async fn wait(&self, mut rx: oneshot::Receiver<Reply>, step: u64, channel: u32) -> Reply {
        let abandoned = |_| {
            Err(ExchangeError::Aborted(
                "the step was abandoned before every worker contributed".into(),
            ))
        };
        if self.peers.is_empty() {
            return rx.await.unwrap_or_else(abandoned);
        }
        loop {
            tokio::select! {
                r = &mut rx => return r.unwrap_or_else(abandoned),
                _ = tokio::time::sleep(self.liveness.tick()) => self.check_silence(step, channel),
            }
        }
    }

    /// Fails the step if round `(step, channel)` lacks the part of a slot
    /// that has been silent for the session timeout.
    fn check_silence(&self, step: u64, channel: u32) {
        let silent = {
            let s = self.lock();
            if s.step != step || s.failure.as_ref().is_some_and(|(at, _)| *at == step) {
                return;
            }
            let Some(round) = s.rounds.get(&(step, channel)) else {
                return;
            };
            self.peers
                .iter()
                .find(|(slot, _)| {
                    !round.heard[*slot as usize]
                        && !s.lost[*slot as usize]
                        && self.liveness.lost(*slot)
                })
                .map(|(slot, link)| (*slot, link.peer()))
        };
        if let Some((slot, peer)) = silent {
            let msg = format!(
                "{peer} (slot {slot}) sent nothing, not even a heartbeat, for {:?} (the session \
                 timeout) while channel {channel} of step {step} waited for its part: the link \
                 from it is cut or it is stalled",
                self.liveness.quiet(slot),
            );
            self.slot_lost(slot, ExchangeError::Silent { slot, message: msg });
        }
    }

    /// Whether slot `slot` was given up for this session.
    fn is_lost(&self, slot: u32) -> bool {
        self.lock()
            .lost
            .get(slot as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Slot `slot` is gone for this session: its host died, stalled or was
    /// cut off (`error` says how). With replicas, when every worker still
    /// runs on a slot not lost, the rounds go on without it — a waiting
    /// round completes from the other replicas' copies, and nothing more is
    /// sent to it. Otherwise (or without replicas) the step fails with
    /// `error`, here and on every host.
    pub(crate) fn slot_lost(&self, slot: u32, error: ExchangeError) {
        let mut s = self.lock();
        if !self.replicated || slot == self.slot || slot as usize >= s.lost.len() {
            self.fail(&mut s, error, true);
            return;
        }
        if s.lost[slot as usize] {
            return;
        }
        let mut lost = s.lost.clone();
        lost[slot as usize] = true;
        let covered = (0..self.workers as usize).all(|w| {
            std::iter::once(self.slots[w])
                .chain(self.followers[w].iter().copied())
                .any(|r| !lost[r as usize])
        });
        if !covered {
            self.fail(&mut s, error, true);
            return;
        }
        tracing::warn!(
            session = self.session,
            slot,
            error = %error,
            "a slot of the exchange is lost: its workers' other replicas go on"
        );
        s.lost = lost;
        // A sender stuck on its link gives up on it.
        self.failed.notify_waiters();
        let current = s.step;
        let waiting: Vec<(u64, u32)> = s
            .rounds
            .keys()
            .filter(|(at, _)| *at == current)
            .copied()
            .collect();
        for key in waiting {
            if let Settled::Stuck(done) = self.settle(&mut s, key, None) {
                let msg = format!(
                    "worker {done} finished its step without calling shuffle on channel {}, \
                     which other workers are waiting on; every worker must call shuffle on the \
                     same channels in each step",
                    key.1
                );
                self.fail(&mut s, ExchangeError::ContractViolation(msg), true);
                return;
            }
        }
    }

    /// Slot `slot` was heard from just now (a frame, a heartbeat, bytes of
    /// either on the connection it sends over).
    pub(crate) fn heard_from(&self, slot: u32) {
        self.liveness.heard(slot);
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
        self.liveness.heard(frame.from);
        let mut s = self.lock();
        // A slot given up is not listened to again in this session.
        if frame.step < s.step || s.lost.get(frame.from as usize) == Some(&true) {
            return;
        }
        let (step, channel, from) = (frame.step, frame.channel, frame.from as usize);
        let parts = match frame.body {
            // Passed on to the other hosts, once (the first time this host
            // hears of the step's failure): a host that the failing one
            // cannot reach learns of it from those that can.
            FrameBody::Abort(e) => {
                if step == s.step {
                    self.fail(&mut s, e, true);
                } else if s.failure.is_none() {
                    s.failure = Some((step, e.clone()));
                    self.tell(step, e);
                }
                return;
            }
            FrameBody::Parts(parts) => parts,
        };
        let key = (step, channel);
        let current = s.step;
        let round = s.rounds.entry(key).or_insert_with(|| self.new_round());
        let fits = |src: u32, dest: u32| {
            self.runs_on(src as usize, from as u32) && self.local(dest as usize)
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
        if self.replicated {
            // Every pair the sender's replicas owe this host, a missing one
            // as empty: each is the first copy or checked against it.
            let mut sent: BTreeMap<(usize, usize), KeyedEvents> = parts
                .into_iter()
                .map(|(src, dest, events)| ((src as usize, dest as usize), events))
                .collect();
            let w = self.workers as usize;
            let mut diverged = None;
            'pairs: for src in (0..w).filter(|src| self.runs_on(*src, from as u32)) {
                for dest in (0..w).filter(|dest| self.local(*dest)) {
                    let part = sent.remove(&(src, dest)).unwrap_or_else(empty);
                    if !file(round, dest, src, part) {
                        diverged = Some((src, dest));
                        break 'pairs;
                    }
                }
            }
            if let Some((src, dest)) = diverged {
                let e = self.diverged(step, channel, src, dest, &format!("slot {from}"));
                if step == current {
                    self.fail(&mut s, e, true);
                } else if s.failure.is_none() {
                    s.failure = Some((step, e.clone()));
                    self.tell(step, e);
                }
                return;
            }
        } else {
            for (src, dest, events) in parts {
                round.inbox[dest as usize][src as usize] = events;
            }
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

    /// The finding that two replicas of worker `src` sent worker `dest`
    /// different events on `channel` of `step` (`copy`: where the second
    /// copy came from).
    fn diverged(
        &self,
        step: u64,
        channel: u32,
        src: usize,
        dest: usize,
        copy: &str,
    ) -> ExchangeError {
        let mut at: Vec<String> = std::iter::once(self.slots[src])
            .chain(self.followers[src].iter().copied())
            .map(|s| format!("slot {s}"))
            .collect();
        at.dedup();
        ExchangeError::Diverged(format!(
            "the replicas of worker {src} (on {}) sent worker {dest} different events on \
             channel {channel} of step {step} (seen on slot {}, the copy from {copy} differs): \
             the circuit is not deterministic (I4)",
            at.join(", "),
            self.slot,
        ))
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

    /// The link from slot `slot` carried nothing for the session timeout:
    /// the current step fails here and on every host still reachable, as
    /// that slot's silence ([`ExchangeError::Silent`]).
    pub(crate) fn went_silent(&self, slot: u32, why: String) {
        self.slot_lost(slot, ExchangeError::Silent { slot, message: why });
    }

    /// Ends this host's links to the others for good: its session is over
    /// (its coordinator went), and the other hosts give this slot up
    /// rather than wait for parts it will never send.
    pub(crate) fn close_links(&self) {
        for (_, link) in &self.peers {
            link.close();
        }
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
        if tell {
            self.tell(s.step, error.clone());
        }
        error
    }

    /// Tells every other host that step `step` failed with `error`.
    fn tell(&self, step: u64, error: ExchangeError) {
        if self.peers.is_empty() {
            return;
        }
        // One task per host: a host that stalled (its link's queue full)
        // must not keep the abort from the others.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            for (_, link) in self.peers.clone() {
                let frame = Frame {
                    session: self.session,
                    step,
                    channel: 0,
                    from: self.slot,
                    body: FrameBody::Abort(error.clone()),
                };
                rt.spawn(async move { link.send(frame).await });
            }
        }
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

/// Files `part`, what worker `src` sent worker `dest`, in a replicated
/// `round`: the first copy is kept; a later one (from another replica of
/// `src`) must be the same bytes. Returns whether it was.
fn file(round: &mut Round, dest: usize, src: usize, part: KeyedEvents) -> bool {
    if !round.filled[dest][src] {
        round.filled[dest][src] = true;
        round.inbox[dest][src] = part;
        return true;
    }
    let kept = &round.inbox[dest][src];
    kept.keys == part.keys
        && kept.key_ends == part.key_ends
        && kept.values == part.values
        && kept.ends == part.ends
        && kept.weights == part.weights
}
