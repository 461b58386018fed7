//! What the hosts of a pipeline say to each other: every message and its
//! serde form ([`postcard`] on the wire). The coordinator's calls on a
//! host's workers ([`Call`]) and their answers ([`Answer`]), the
//! connection's envelopes ([`ToHost`], [`FromHost`], [`ToPeer`]), and the
//! wire forms of batches, keyed events, state pieces and exchange frames,
//! converted from and to the runtime's own types at this edge.

use crate::bindings::{Batch, KeyedEvents};
use crate::error::ExchangeError;
use crate::exchange::{Frame, FrameBody};
use crate::step_io::{DeadLetters, InputRange, OutputChecks};
use serde::{Deserialize, Serialize};
use sluice_core::StepLimits;
use sluice_storage::Staged;

/// A batch on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WireBatch {
    pub(crate) port: u32,
    #[serde(with = "serde_bytes")]
    pub(crate) values: Vec<u8>,
    pub(crate) ends: Vec<u32>,
    pub(crate) weights: Vec<i64>,
}

impl From<Batch> for WireBatch {
    fn from(b: Batch) -> Self {
        WireBatch {
            port: b.port,
            values: b.values,
            ends: b.ends,
            weights: b.weights,
        }
    }
}

impl From<WireBatch> for Batch {
    fn from(b: WireBatch) -> Self {
        Batch {
            port: b.port,
            values: b.values,
            ends: b.ends,
            weights: b.weights,
        }
    }
}

/// Keyed events on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WireKeyed {
    #[serde(with = "serde_bytes")]
    pub(crate) keys: Vec<u8>,
    pub(crate) key_ends: Vec<u32>,
    #[serde(with = "serde_bytes")]
    pub(crate) values: Vec<u8>,
    pub(crate) ends: Vec<u32>,
    pub(crate) weights: Vec<i64>,
}

impl From<KeyedEvents> for WireKeyed {
    fn from(k: KeyedEvents) -> Self {
        WireKeyed {
            keys: k.keys,
            key_ends: k.key_ends,
            values: k.values,
            ends: k.ends,
            weights: k.weights,
        }
    }
}

impl From<WireKeyed> for KeyedEvents {
    fn from(k: WireKeyed) -> Self {
        KeyedEvents {
            keys: k.keys,
            key_ends: k.key_ends,
            values: k.values,
            ends: k.ends,
            weights: k.weights,
        }
    }
}

/// A shard's piece of state on the wire: `(shard, bytes)`, the bytes as
/// one run (not a sequence of numbers).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WirePiece(u32, #[serde(with = "serde_bytes")] Vec<u8>);

pub(crate) fn to_wire(pieces: Vec<(u32, Vec<u8>)>) -> Vec<WirePiece> {
    pieces.into_iter().map(|(s, b)| WirePiece(s, b)).collect()
}

pub(crate) fn from_wire(pieces: Vec<WirePiece>) -> Vec<(u32, Vec<u8>)> {
    pieces.into_iter().map(|WirePiece(s, b)| (s, b)).collect()
}

/// An exchange failure on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum WireExchangeError {
    ContractViolation(String),
    Aborted(String),
    Silent { slot: u32, message: String },
    Diverged(String),
}

impl From<ExchangeError> for WireExchangeError {
    fn from(e: ExchangeError) -> Self {
        match e {
            ExchangeError::ContractViolation(m) => WireExchangeError::ContractViolation(m),
            ExchangeError::Aborted(m) => WireExchangeError::Aborted(m),
            ExchangeError::Silent { slot, message } => WireExchangeError::Silent { slot, message },
            ExchangeError::Diverged(m) => WireExchangeError::Diverged(m),
        }
    }
}

impl From<WireExchangeError> for ExchangeError {
    fn from(e: WireExchangeError) -> Self {
        match e {
            WireExchangeError::ContractViolation(m) => ExchangeError::ContractViolation(m),
            WireExchangeError::Aborted(m) => ExchangeError::Aborted(m),
            WireExchangeError::Silent { slot, message } => ExchangeError::Silent { slot, message },
            WireExchangeError::Diverged(m) => ExchangeError::Diverged(m),
        }
    }
}

/// An exchange [`Frame`] on the wire.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct WireFrame {
    pub(crate) session: u64,
    pub(crate) step: u64,
    pub(crate) channel: u32,
    pub(crate) from: u32,
    pub(crate) body: WireFrameBody,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum WireFrameBody {
    Parts(Vec<(u32, u32, WireKeyed)>),
    Abort(WireExchangeError),
}

impl From<Frame> for WireFrame {
    fn from(f: Frame) -> Self {
        WireFrame {
            session: f.session,
            step: f.step,
            channel: f.channel,
            from: f.from,
            body: match f.body {
                FrameBody::Parts(p) => {
                    WireFrameBody::Parts(p.into_iter().map(|(s, d, e)| (s, d, e.into())).collect())
                }
                FrameBody::Abort(e) => WireFrameBody::Abort(e.into()),
            },
        }
    }
}

impl From<WireFrame> for Frame {
    fn from(f: WireFrame) -> Self {
        Frame {
            session: f.session,
            step: f.step,
            channel: f.channel,
            from: f.from,
            body: match f.body {
                WireFrameBody::Parts(p) => {
                    FrameBody::Parts(p.into_iter().map(|(s, d, e)| (s, d, e.into())).collect())
                }
                WireFrameBody::Abort(e) => FrameBody::Abort(e.into()),
            },
        }
    }
}

/// Where a host's workers exchange: the placement of every worker on the
/// pipeline's hosts, for one session.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WireMesh {
    pub(crate) session: u64,
    /// The host's slot.
    pub(crate) slot: u32,
    /// The slot of each worker (its primary's).
    pub(crate) slots: Vec<u32>,
    /// The other slots each worker runs on (its followers').
    pub(crate) followers: Vec<Vec<u32>>,
    /// Each slot's address (slot 0, the coordinator's, is reached over the
    /// coordinator's connection).
    pub(crate) addrs: Vec<String>,
    /// The owner of each shard.
    pub(crate) owners: Vec<u32>,
}

/// What a worker's host needs to commit the worker's share of a divided
/// step itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ShareSpec {
    /// The worker's frontier after the step (its entries are tagged with
    /// it).
    pub frontier: sluice_core::Frontier,
    /// The output logs, in the circuit's port order.
    pub outputs: Vec<String>,
    /// What the output is checked against before it is committed.
    pub checks: OutputChecks,
    /// Commit at once (the replay of a recorded division); else hold the
    /// share until [`Call::CommitShare`] (the division is recorded once
    /// every worker computed its share).
    pub now: bool,
    /// A follower's share (a replica beside the worker's primary): held
    /// and its hash reported, never committed and the worker never taken
    /// (that would fence the primary).
    pub follow: bool,
    /// The fencing epoch of the coordinator whose step this is (the epoch
    /// its division is recorded with): a worker left behind when its
    /// coordinator went is adopted by the next one only if the log's last
    /// step is this step, recorded in this epoch, on this frontier.
    pub epoch: u64,
    /// The host reads the step's input itself (the ranges of the call), so
    /// the share carries the input records it skipped; input the
    /// coordinator sends comes without them (they are committed with the
    /// primary's share), and such a share is only held, never committed
    /// by an adopting coordinator.
    pub own_input: bool,
}

/// The step a worker's instance last computed a share of (and so the state
/// it holds): what a new coordinator checks against the step log before
/// it adopts the instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StepMark {
    pub step: u64,
    /// The epoch of the coordinator that ran it.
    pub epoch: u64,
    /// The worker's frontier after it.
    pub frontier: sluice_core::Frontier,
    /// The step's time.
    pub time_ms: u64,
    /// The limits it ran under.
    pub limits: StepLimits,
    /// The host read the step's input itself (or there was none): the
    /// share it holds carries the input records it skipped, so it may be
    /// committed as it is (input sent by the coordinator comes without
    /// them).
    pub own_input: bool,
}

/// A worker instance a host kept when its coordinator's connection ended
/// ([`ToHost::Parked`]): what a new coordinator needs to decide whether it
/// may adopt it instead of restoring and replaying.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WireParked {
    pub worker: u32,
    /// W of the layout it is in.
    pub workers: u32,
    /// The owner of each shard in that layout.
    pub owners: Vec<u32>,
    /// The SHA-256 of the component it runs: a coordinator adopts only
    /// instances of its own (a host runs several across an upgrade).
    pub component: String,
    /// The step it last computed a share of, unless a call since changed
    /// its state otherwise (a restore, a hand-off, a layout change).
    pub at: Option<StepMark>,
    /// The step it computed a share of before that one, if nothing else
    /// changed its state in between.
    pub before: Option<StepMark>,
    /// The hash of the share it holds.
    pub held_hash: Option<u128>,
    /// Every call it took succeeded (a failed call may have left the
    /// instance half-way).
    pub clean: bool,
    /// A call is still running (a step its coordinator started before it
    /// went, going on without it).
    pub busy: bool,
    /// The step whose share it holds, not committed.
    pub held: Option<u64>,
    /// The step whose share it last committed.
    pub committed: Option<u64>,
}

/// A worker's share of a divided step, committed by its host (or found
/// committed, with the same hash).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct ShareDone {
    /// The output's hash.
    pub hash: u128,
    /// Its events.
    pub events: u64,
    /// The input records skipped into dead-letter logs with it.
    pub dead_letters: u64,
}

/// A call the coordinator makes on one of a host's workers.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Call {
    Start {
        workers: u32,
        pipeline: String,
        config: Vec<(String, String)>,
        inherit_stderr: bool,
        mesh: WireMesh,
        /// The SHA-256 of the coordinator's component: a host that does
        /// not run it fetches it from its component source (after an
        /// upgrade), or refuses (two versions of a circuit in one pipeline
        /// would route and compute differently).
        component: String,
    },
    /// Step on `inputs`, after reading `read` (offsets of the logs the
    /// host reads itself) into batches in front of them.
    Step {
        step: u64,
        time_ms: u64,
        inputs: Vec<WireBatch>,
        read: Vec<InputRange>,
        /// In a divided step: commit the worker's share here (unless its
        /// done record exists) instead of returning the output.
        share: Option<ShareSpec>,
    },
    /// Commit the share of divided step `step` the worker holds.
    CommitShare {
        step: u64,
    },
    /// Snapshot; with `stage`, write the pieces to the host's checkpoint
    /// store for checkpoint `stage` instead of returning them.
    Snapshot {
        changed_only: bool,
        stage: Option<u64>,
    },
    Restore {
        pieces: Vec<WirePiece>,
        /// The pieces are another component's (an upgrade): taken through
        /// the circuit's `upgrade`, these operators starting empty.
        upgrade: Option<Vec<String>>,
    },
    /// Restore the worker's pieces of committed checkpoint `step`, read
    /// from the host's checkpoint store (its own copy first); through the
    /// circuit's `upgrade` with `upgrade`, as [`Call::Restore`].
    RestoreFrom {
        step: u64,
        upgrade: Option<Vec<String>>,
    },
    Export {
        shards: Vec<u32>,
    },
    Relayout {
        workers: u32,
        mesh: WireMesh,
    },
    /// Same layout, workers placed anew: shuffle through a new exchange.
    Rewire {
        mesh: WireMesh,
    },
    /// Take over the worker this host kept from an earlier coordinator
    /// ([`ToHost::Parked`]), shuffling as `mesh` says (answered
    /// [`Answer::Started`]).
    Adopt {
        mesh: WireMesh,
        /// The adopting coordinator recorded the step the worker holds
        /// (it was in flight when the one before went), in this epoch.
        recorded: Option<u64>,
        /// What the coordinator saw kept: refused if the instance is not
        /// there any more (a call still queued from the coordinator before
        /// ran since).
        at: StepMark,
        /// The SHA-256 of the coordinator's component and the pipeline's
        /// settings: refused where they are not the kept instance's.
        component: String,
        config: Vec<(String, String)>,
    },
    Stop,
}

impl Call {
    /// The exchange session a call places the worker in, if it does.
    pub(crate) fn session(&self) -> Option<u64> {
        match self {
            Call::Start { mesh, .. }
            | Call::Relayout { mesh, .. }
            | Call::Rewire { mesh }
            | Call::Adopt { mesh, .. } => Some(mesh.session),
            _ => None,
        }
    }
}

/// What a call returned.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Answer {
    Done,
    /// A worker started; its host's checkpoint store is at `store`.
    Started {
        store: Option<String>,
        /// Where its host reads the pipeline's logs, if it does.
        log: Option<String>,
        /// Whether its host may also write them (commit the worker's
        /// shares of divided steps); else the coordinator's host does.
        commits: bool,
    },
    Stepped {
        outputs: Vec<WireBatch>,
        fuel: u64,
        /// Input events the host read for the step.
        events: u64,
        /// The share the host committed (then `outputs` is empty).
        shared: Option<ShareDone>,
        /// The input records the host skipped reading the step's input,
        /// for the coordinator to commit with `outputs` (empty when the
        /// host committed the share: they went with it).
        dead_letters: DeadLetters,
    },
    Snapshot {
        pieces: Vec<WirePiece>,
        changed: Option<Vec<u32>>,
    },
    /// The held share is committed (or its done record was there).
    Shared(ShareDone),
    Pieces(Vec<WirePiece>),
    /// The snapshot's pieces are in the host's checkpoint store.
    Staged {
        staged: Staged,
        changed: Option<Vec<u32>>,
    },
    /// Restored from the store: bytes read from the host's own copy, and
    /// fetched.
    Restored {
        local: u64,
        fetched: u64,
    },
    /// The host could not read the worker's pieces; the instance is
    /// untouched.
    Unread {
        message: String,
    },
    /// `(worker, bytes)` of a checkpoint's state in the host's own copy.
    Locality(Vec<(u32, u64)>),
    /// The workers the host kept from an earlier coordinator.
    Parked(Vec<WireParked>),
}

/// A failed call: the worker's error as text, and whether it was the
/// guest's doing (a retry on another host would fail the same way).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CallError {
    pub(crate) message: String,
    pub(crate) guest: bool,
    /// The worker failed because the exchange did.
    pub(crate) exchange: bool,
    /// The host refuses the coordinator for good (it runs another
    /// component).
    pub(crate) refused: bool,
    /// The exchange failed there because this slot went silent.
    pub(crate) silent_slot: Option<u32>,
}

/// Coordinator → host.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum ToHost {
    Call {
        id: u64,
        worker: u32,
        /// The deterministic limits the call runs under.
        limits: StepLimits,
        call: Box<Call>,
    },
    /// The coordinator's exchange frame for the host's workers.
    Mesh(WireFrame),
    /// How much of each worker's state in checkpoint `step` the host has
    /// in its own copy (answered `Answer::Locality`).
    Locality { id: u64, step: u64 },
    /// Which worker instances the host kept when an earlier coordinator's
    /// connection ended (answered [`Answer::Parked`]).
    Parked { id: u64 },
    /// Drop the worker instances kept from an earlier coordinator (this one
    /// adopted what it wanted).
    DropParked,
    /// The coordinator is alive (sent every [`HEARTBEAT`](super::HEARTBEAT)):
    /// a host that hears nothing for its session timeout drops the
    /// connection and fails its exchanges.
    Heartbeat,
}

/// Host → coordinator.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum FromHost {
    Answer {
        id: u64,
        result: Result<Answer, CallError>,
    },
    /// The host's exchange frame for the coordinator's workers.
    Mesh(WireFrame),
    Heartbeat,
}

/// What a peer link carries.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum ToPeer {
    Mesh(WireFrame),
    Heartbeat,
    /// The first message on a peer link: which exchange session it feeds
    /// and from which slot, so its heartbeats (and its silence) count for
    /// that slot there.
    Open {
        session: u64,
        from: u32,
    },
}
