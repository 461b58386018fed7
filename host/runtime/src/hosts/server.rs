//! A host that serves workers for a pipeline's coordinator
//! ([`WorkerHost`]): it accepts the coordinator's connection (one at a
//! time: a new coordinator replaces the one before) and other hosts' peer
//! links, routes exchange frames to the exchange of their session, and
//! runs each worker's calls on a task of its own
//! ([`calls`](super::calls)). What it reaches of the pipeline's storage is
//! its [`Reach`]; how long a connection may be silent and how many it
//! serves at once, its [`HostOptions`].
//!
//! Every connection is read by progress: one that delivers nothing — no
//! frame, no heartbeat — for the session timeout is dropped, and the
//! exchanges it fed fail (and tell the other hosts).

use super::frames::{MAX_FRAME, read_frame_within, write_frame};
use super::kept::{Parkable, TaskMsg};
use super::links::{HostToCoordinator, PeerDial, PeerLink};
use super::listener::{Accepting, accept_loop};
use super::transport::{
    MAX_CONNECTIONS, QUEUE, Reader, SESSION_TIMEOUT, Tls, Writer, answer_on, handshake, heartbeat,
};
use super::wire::{
    Answer, Call, CallError, FromHost, StepMark, ToHost, ToPeer, WireFrame, WireMesh, WireParked,
};
use crate::engine::{LoadedComponent, SluiceEngine};
use crate::error::{Error, ExchangeError, Result};
use crate::exchange::{Exchange, Link, Placement};
use sluice_storage::{CheckpointStore, LogBackend, WorkerCommit};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// How long a host keeps the workers of a coordinator whose connection
/// ended, for the next coordinator to adopt, at least: a new leader is
/// chosen once the group's lease of the old one lapses.
const PARK_AT_LEAST: Duration = Duration::from_secs(60);

/// A host that runs workers for the coordinator of a pipeline: the other
/// hosts' end of [`RemoteHost`].
pub struct WorkerHost {
    pub(super) engine: SluiceEngine,
    /// The components it runs, the newest last (see `components.rs`).
    pub(super) components: Mutex<Vec<LoadedComponent>>,
    /// Where it fetches one a coordinator names that it does not run.
    pub(super) source: Option<super::ComponentSource>,
    /// One fetch at a time.
    pub(super) fetching: tokio::sync::Mutex<()>,
    /// The component a coordinator's `Start` last named, until taken
    /// ([`WorkerHost::take_started`]).
    pub(super) started: Mutex<Option<String>>,
    pipeline: String,
    secret: Vec<u8>,
    /// How its peer links dial the other hosts.
    dial: PeerDial,
    /// The connection being served: a new coordinator replaces it.
    /// (With what tells that the workers of the connection are kept, once
    /// it ended.)
    current: Mutex<Option<(tokio::task::AbortHandle, oneshot::Receiver<()>)>>,
    /// The exchanges of this host's workers, by session: where frames from
    /// other hosts go.
    exchanges: Mutex<HashMap<u64, Weak<Exchange>>>,
    /// Bytes sent to other hosts over peer links.
    peer_bytes: Arc<AtomicU64>,
    /// Mutual TLS on every connection, if set.
    tls: Option<Tls>,
    /// What this host reaches of the pipeline's storage (more, once a
    /// store or log out of reach at start answers: [`set_reach`]).
    ///
    /// [`set_reach`]: WorkerHost::set_reach
    reach: std::sync::RwLock<Reach>,
    /// A connection silent for this long is lost.
    session_timeout: Duration,
    /// How many connections it serves at once.
    max_connections: usize,
    /// Fault injection: this host's workers' output is altered
    /// ([`WorkerHost::alter_output`]).
    pub(super) alter_output: std::sync::atomic::AtomicBool,
    /// The workers of a coordinator whose connection ended, kept for the
    /// next coordinator to adopt ([`Call::Adopt`]) until one starts
    /// workers here or they have waited too long.
    parked: Mutex<Parked>,
    /// Its server ended (or was dropped): nothing is kept any more.
    closed: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for WorkerHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHost")
            .field("pipeline", &self.pipeline)
            .field("reach", &self.reach())
            .finish_non_exhaustive()
    }
}

/// A worker's task on this host: its queue of calls, and what it last did
/// (what a new coordinator checks before adopting it).
pub(super) struct WorkerTask {
    calls: mpsc::UnboundedSender<TaskMsg>,
    state: Arc<Mutex<Parkable>>,
    _task: AbortOnDrop,
}

/// Workers kept from a coordinator whose connection ended.
#[derive(Default)]
struct Parked {
    workers: HashMap<u32, WorkerTask>,
    since: Option<Instant>,
}

/// A connection's workers: parked on the host when the connection ends
/// (however it ends: the coordinator went, fell silent, or another
/// replaced it).
struct ParkOnDrop {
    host: Arc<WorkerHost>,
    workers: HashMap<u32, WorkerTask>,
    /// The exchange sessions the connection's coordinator began here.
    sessions: Arc<Mutex<std::collections::HashSet<u64>>>,
    /// Why the connection ended, when it ended by a failure (else another
    /// coordinator replaced it).
    why: String,
    /// Dropped once the workers are kept: a coordinator replacing this
    /// one waits for it.
    kept: Option<oneshot::Sender<()>>,
}

impl Drop for ParkOnDrop {
    fn drop(&mut self) {
        // The coordinator's slot is lost to its sessions' exchanges here
        // (a step going on without it where every worker runs elsewhere
        // too), and their links close once its steps end.
        let why = match self.why.is_empty() {
            true => "another coordinator replaced it",
            false => self.why.as_str(),
        };
        let sessions: Vec<u64> = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect();
        let ended = self.host.coordinator_lost(&sessions, why);
        let busy = self.workers.values().map(|t| t.state.clone()).collect();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(end_sessions_when_idle(
                ended,
                busy,
                self.host.session_timeout * 4,
            ));
        }
        self.host.park(std::mem::take(&mut self.workers));
        self.kept.take();
    }
}

/// How a [`WorkerHost`] serves: TLS, what it reaches, how long a
/// connection may be silent, how many it serves at once.
#[derive(Clone, Debug)]
pub struct HostOptions {
    /// Mutual TLS on every connection (those it accepts and the links it
    /// opens to other hosts), if set.
    pub tls: Option<Tls>,
    /// What it reaches of the pipeline's storage.
    pub reach: Reach,
    /// A connection (the coordinator's, another host's peer link) that
    /// delivers nothing — no frame, no heartbeat, no byte of a frame — for
    /// this long is lost: the exchanges it fed fail on every host. The
    /// handshake and every write are bounded by it too. (The pipeline's
    /// session timeout; default [`SESSION_TIMEOUT`].)
    pub session_timeout: Duration,
    /// At most this many connections at once (default
    /// [`MAX_CONNECTIONS`]); one more is closed at once.
    pub max_connections: usize,
    /// Where it fetches a component a coordinator names that it does not
    /// run (none: such a coordinator is refused).
    pub components: Option<super::ComponentSource>,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            tls: None,
            reach: Reach::default(),
            session_timeout: SESSION_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
            components: None,
        }
    }
}

/// What a worker host reaches of its pipeline's storage. A coordinator
/// whose own storage has the same location
/// ([`CheckpointStore::location`], [`LogBackend::location`]) lets the
/// host's workers use it directly, so their input and state never travel
/// through the coordinator.
#[derive(Clone, Default)]
pub struct Reach {
    /// The pipeline's shared checkpoint store: its workers write their
    /// pieces there themselves and restore from it (from this host's own
    /// copy first).
    pub checkpoints: Option<Arc<dyn CheckpointStore>>,
    /// The pipeline's logs: its workers read their own input (the
    /// coordinator sends offsets) and commit their shares of divided steps.
    pub log: Option<Arc<dyn LogBackend>>,
    /// This host may read the logs but not write them (Kafka ACLs that
    /// grant it no transactional id): its workers still read their own
    /// input, and the coordinator's host commits their shares.
    pub read_only_log: bool,
}

impl std::fmt::Debug for Reach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reach")
            .field(
                "checkpoints",
                &self.checkpoints.as_ref().map(|c| c.location()),
            )
            .field("log", &self.log.as_ref().map(|l| l.location()))
            .field("read_only_log", &self.read_only_log)
            .finish()
    }
}

impl WorkerHost {
    /// A host running `component`'s workers for `pipeline`, for
    /// coordinators that know `secret`.
    pub fn new(
        engine: &SluiceEngine,
        component: &LoadedComponent,
        pipeline: &str,
        secret: &[u8],
    ) -> Arc<WorkerHost> {
        Self::new_with(engine, component, pipeline, secret, None, Reach::default())
    }

    /// [`new`](Self::new), speaking mutual TLS on every connection (those
    /// it accepts and the links it opens to other hosts) when `tls` is
    /// given, its workers using what it `reach`es of the pipeline's
    /// storage directly (see [`Reach`]).
    pub fn new_with(
        engine: &SluiceEngine,
        component: &LoadedComponent,
        pipeline: &str,
        secret: &[u8],
        tls: Option<Tls>,
        reach: Reach,
    ) -> Arc<WorkerHost> {
        let options = HostOptions {
            tls,
            reach,
            ..HostOptions::default()
        };
        Self::with_options(engine, component, pipeline, secret, options)
    }

    /// [`new`](Self::new), serving as `options` say.
    pub fn with_options(
        engine: &SluiceEngine,
        component: &LoadedComponent,
        pipeline: &str,
        secret: &[u8],
        options: HostOptions,
    ) -> Arc<WorkerHost> {
        let HostOptions {
            tls,
            reach,
            session_timeout,
            max_connections,
            components,
        } = options;
        let peer_bytes: Arc<AtomicU64> = Arc::default();
        Arc::new(WorkerHost {
            dial: PeerDial {
                pipeline: pipeline.to_owned(),
                secret: secret.to_vec(),
                tls: tls.clone(),
                sent: peer_bytes.clone(),
                timeout: session_timeout,
            },
            tls,
            reach: std::sync::RwLock::new(reach),
            session_timeout,
            max_connections: max_connections.max(1),
            engine: engine.with_limits(engine.limits()),
            components: Mutex::new(vec![component.clone()]),
            source: components,
            fetching: tokio::sync::Mutex::new(()),
            started: Mutex::default(),
            pipeline: pipeline.to_owned(),
            secret: secret.to_vec(),
            current: Mutex::new(None),
            exchanges: Mutex::default(),
            peer_bytes,
            alter_output: std::sync::atomic::AtomicBool::new(false),
            parked: Mutex::default(),
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Keeps the workers of a connection that ended for the next
    /// coordinator, for [`PARK_AT_LEAST`] (or ten session timeouts, if
    /// longer) after the last connection ended.
    fn park(self: &Arc<Self>, workers: HashMap<u32, WorkerTask>) {
        if workers.is_empty() || self.closed.load(Ordering::SeqCst) {
            return;
        }
        let mut parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        parked.workers.extend(workers);
        let since = Instant::now();
        parked.since = Some(since);
        let keep = PARK_AT_LEAST.max(self.session_timeout * 10);
        let host = Arc::downgrade(self);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                tokio::time::sleep(keep).await;
                if let Some(host) = host.upgrade() {
                    let mut parked = host.parked.lock().unwrap_or_else(|p| p.into_inner());
                    if parked.since == Some(since) {
                        let gone = std::mem::take(&mut parked.workers).len();
                        tracing::info!(pipeline = %host.pipeline, workers = gone, "no coordinator adopted the workers kept here: dropped");
                    }
                }
            });
        }
        tracing::info!(
            pipeline = %self.pipeline,
            workers = ?parked.workers.keys().collect::<Vec<_>>(),
            "the coordinator's connection ended: its workers here are kept for the next one"
        );
    }

    /// Drops the workers kept from an earlier coordinator (a coordinator
    /// starts workers here: it adopted what it wanted).
    pub(crate) fn drop_parked(&self) {
        let gone = std::mem::take(
            &mut self
                .parked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .workers,
        );
        if !gone.is_empty() {
            tracing::debug!(pipeline = %self.pipeline, workers = gone.len(), "kept workers dropped");
        }
    }

    /// The workers kept from an earlier coordinator, as a new one sees them.
    pub(crate) fn parked(&self) -> Vec<WireParked> {
        let parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<WireParked> = parked
            .workers
            .iter()
            .map(|(w, t)| {
                t.state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .describe(*w)
            })
            .collect();
        all.sort_by_key(|p| p.worker);
        all
    }

    /// Takes kept worker `worker` out of its task, with the share it
    /// holds, for a coordinator in this process to run as its own instance
    /// — if it is still at `at` and runs `component` with `config` (`None`
    /// if not, or if it is not kept here).
    pub(crate) async fn unpark(
        &self,
        worker: u32,
        at: &StepMark,
        component: &str,
        config: &[(String, String)],
    ) -> Option<(crate::worker::Worker, Option<WorkerCommit>)> {
        let task = self
            .parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .workers
            .remove(&worker)?;
        let (to, rx) = oneshot::channel();
        let release = TaskMsg::Release {
            at: at.clone(),
            component: component.to_owned(),
            config: config.to_vec(),
            to,
        };
        task.calls.send(release).ok()?;
        rx.await.ok().flatten()
    }

    /// Fault injection, for tests of the replicas' determinism audit:
    /// while on, every step of this host's workers doubles the weight of
    /// the first event of its first non-empty output batch — as a circuit
    /// that is not deterministic would, on this host only. Never for a
    /// host serving real pipelines.
    pub fn alter_output(&self, on: bool) {
        self.alter_output.store(on, Ordering::Relaxed);
    }

    /// What this host reaches of the pipeline's storage now.
    pub fn reach(&self) -> Reach {
        self.reach.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Changes what this host reaches of the pipeline's storage — the logs
    /// (and the store, whose commits the logs record) answering after they
    /// did not at start. Coordinators learn it at their sessions' start:
    /// the session running goes on as it began.
    pub fn set_reach(&self, reach: Reach) {
        *self.reach.write().unwrap_or_else(|p| p.into_inner()) = reach;
    }

    /// Bytes this host sent other hosts' exchanges directly (frames with
    /// their length prefixes), so far.
    pub fn peer_traffic(&self) -> u64 {
        self.peer_bytes.load(Ordering::Relaxed)
    }

    /// Serves coordinators (and other hosts' peer links) connecting to
    /// `listener`, at most `max_connections` at once, until the listener is
    /// unusable (a failed accept is retried: see
    /// [`GIVE_UP`](super::listener::GIVE_UP)). Dropping (aborting) the
    /// future ends every connection and drops every worker: the host is
    /// gone.
    pub async fn serve(self: Arc<Self>, listener: tokio::net::TcpListener) -> Result<()> {
        self.serve_from(listener).await
    }

    pub(super) async fn serve_from(self: Arc<Self>, listener: impl Accepting) -> Result<()> {
        // However serving ends, the host keeps no worker after it.
        let _closing = CloseOnDrop(self.clone());
        let cap = Arc::new(tokio::sync::Semaphore::new(self.max_connections));
        let host = self.clone();
        accept_loop(
            listener,
            cap,
            self.max_connections,
            move |stream, peer, permit| {
                let host = host.clone();
                async move {
                    let _permit = permit;
                    if let Err(e) = host.accept(stream).await {
                        tracing::warn!(%peer, error = %e, "a connection failed");
                    }
                }
            },
        )
        .await
        .map_err(Error::remote_io("accepting connections"))
    }

    async fn accept(self: Arc<Self>, stream: TcpStream) -> Result<()> {
        let (mut r, mut w) =
            tokio::time::timeout(self.session_timeout, answer_on(stream, self.tls.as_ref()))
                .await
                .map_err(|_| Error::remote("a coordinator", "the TLS handshake timed out"))?
                .map_err(Error::remote_io("a coordinator"))?;
        let role = tokio::time::timeout(
            self.session_timeout,
            handshake(
                &mut r,
                &mut w,
                &self.secret,
                &self.pipeline,
                "host",
                self.session_timeout,
            ),
        )
        .await
        .map_err(|_| Error::remote("a coordinator", "the handshake timed out"))?
        .map_err(Error::remote_io("a coordinator"))?;
        if role == "peer" {
            return self.serve_peer(r).await;
        }
        let previous = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some((previous, kept)) = previous {
            previous.abort();
            // Its workers are kept before this coordinator asks what is
            // kept (a new leader adopting them).
            let _ = tokio::time::timeout(self.session_timeout, kept).await;
            tracing::info!(pipeline = %self.pipeline, "a new coordinator replaced the one before");
        }
        let (kept_tx, kept_rx) = oneshot::channel();
        let served = tokio::spawn(self.clone().serve_connection(r, w, kept_tx));
        let _served = AbortOnDrop(served.abort_handle());
        let replaced = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace((served.abort_handle(), kept_rx));
        if let Some((other, _)) = replaced {
            // Another coordinator's connection came in meanwhile: the
            // newest one is served.
            other.abort();
        }
        match served.await {
            Ok(r) => r,
            Err(e) if e.is_cancelled() => Ok(()),
            Err(e) => Err(Error::task("a coordinator's connection")(e)),
        }
    }

    /// Takes another host's exchange frames: the link first says which
    /// session and slot it feeds; every byte after counts as that slot
    /// heard from there. When the link ends, fails or delivers nothing for
    /// the session timeout, that exchange fails (and tells the other
    /// hosts): its rounds can no longer complete.
    async fn serve_peer(&self, mut r: Reader) -> Result<()> {
        let idle = self.session_timeout;
        let opened = read_frame_within::<_, ToPeer>(&mut r, idle, MAX_FRAME, &mut || {}).await;
        let (session, from) = match opened {
            Ok((ToPeer::Open { session, from }, _)) => (session, from),
            Ok(_) => {
                return Err(Error::remote(
                    "a peer link",
                    "its first message does not say which exchange it feeds",
                ));
            }
            Err(e) => return Err(Error::remote_io("a peer link")(e)),
        };
        let exchange = || {
            self.exchanges
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&session)
                .and_then(Weak::upgrade)
        };
        let heard = || {
            if let Some(x) = exchange() {
                x.heard_from(from);
            }
        };
        heard();
        loop {
            let mut progress = heard;
            match read_frame_within::<_, ToPeer>(&mut r, idle, MAX_FRAME, &mut progress).await {
                Ok((ToPeer::Mesh(frame), _)) => self.route(frame),
                Ok(_) => {}
                Err(e) => {
                    if let Some(x) = exchange() {
                        let why = format!("the link from slot {from} of the exchange ended: {e}");
                        match e.kind() {
                            // Silent (cut one way, or the host stalled).
                            std::io::ErrorKind::TimedOut => x.went_silent(from, why),
                            _ => x.slot_lost(from, ExchangeError::Aborted(why)),
                        }
                    }
                    return Ok(());
                }
            }
        }
    }

    /// The coordinator (slot 0 of every exchange here) was heard from.
    fn heard_from_coordinator(&self, sessions: &Mutex<std::collections::HashSet<u64>>) {
        let sessions = sessions.lock().unwrap_or_else(|p| p.into_inner());
        let all = self.exchanges.lock().unwrap_or_else(|p| p.into_inner());
        for x in sessions
            .iter()
            .filter_map(|s| all.get(s))
            .filter_map(Weak::upgrade)
        {
            x.heard_from(0);
        }
    }

    /// The coordinator's connection ended or fell silent: its slot (0) is
    /// lost to every exchange here — which fails (and tells the other
    /// hosts) unless every worker runs on another slot too: then the step
    /// goes on without the coordinator, and its instances here are kept
    /// with the step's share for the next coordinator to adopt.
    /// Returns those exchanges (their sessions end once their steps do).
    fn coordinator_lost(&self, sessions: &[u64], why: &str) -> Vec<Weak<Exchange>> {
        let all: Vec<Arc<Exchange>> = {
            let exchanges = self.exchanges.lock().unwrap_or_else(|p| p.into_inner());
            sessions
                .iter()
                .filter_map(|s| exchanges.get(s))
                .filter_map(Weak::upgrade)
                .collect()
        };
        for x in &all {
            let why = format!("the coordinator's connection: {why}");
            x.slot_lost(0, ExchangeError::Aborted(why));
        }
        all.iter().map(Arc::downgrade).collect()
    }

    /// Hands a frame to the exchange of its session (a frame of a session
    /// this host no longer has is stale).
    fn route(&self, frame: WireFrame) {
        let x = self
            .exchanges
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&frame.session)
            .and_then(Weak::upgrade);
        if let Some(x) = x {
            x.receive(frame.into());
        }
    }

    /// The exchange of `mesh`'s session on this host, made (with its links
    /// to the other hosts) by the first of its workers to ask.
    pub(super) fn exchange_for(
        &self,
        mesh: WireMesh,
        to_coordinator: &mpsc::Sender<FromHost>,
    ) -> Arc<Exchange> {
        let mut all = self.exchanges.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(x) = all.get(&mesh.session).and_then(Weak::upgrade) {
            return x;
        }
        all.retain(|_, x| x.strong_count() > 0);
        let cell: Arc<OnceLock<Weak<Exchange>>> = Arc::default();
        let links: Vec<Option<Arc<dyn Link>>> = mesh
            .addrs
            .iter()
            .enumerate()
            .map(|(slot, addr)| -> Option<Arc<dyn Link>> {
                let slot = slot as u32;
                let runs =
                    mesh.slots.contains(&slot) || mesh.followers.iter().any(|f| f.contains(&slot));
                if slot == mesh.slot || !runs {
                    None
                } else if slot == 0 {
                    Some(Arc::new(HostToCoordinator {
                        out: to_coordinator.clone(),
                    }))
                } else {
                    Some(PeerLink::open(
                        addr.clone(),
                        slot,
                        &self.dial,
                        cell.clone(),
                        mesh.session,
                        mesh.slot,
                    ))
                }
            })
            .collect();
        let x = Exchange::with_owners(
            mesh.slots.len() as u32,
            mesh.owners,
            Some(Placement {
                session: mesh.session,
                slot: mesh.slot,
                slots: mesh.slots,
                followers: mesh.followers,
                links,
                silence: self.session_timeout,
            }),
        );
        let _ = cell.set(Arc::downgrade(&x));
        all.insert(mesh.session, Arc::downgrade(&x));
        x
    }

    async fn serve_connection(
        self: Arc<Self>,
        mut r: Reader,
        mut w: Writer,
        kept: oneshot::Sender<()>,
    ) -> Result<()> {
        let (out, mut queue) = mpsc::channel::<FromHost>(QUEUE);
        let idle = self.session_timeout;
        let writer = tokio::spawn(async move {
            let mut beat = tokio::time::interval(heartbeat(idle));
            loop {
                let msg = tokio::select! {
                    m = queue.recv() => match m { Some(m) => m, None => return },
                    _ = beat.tick() => FromHost::Heartbeat,
                };
                if write_frame(&mut w, &msg, idle).await.is_err() {
                    return;
                }
            }
        });
        let _writer = AbortOnDrop(writer.abort_handle());
        // One task per worker, taking its calls in order; kept for the
        // next coordinator when this connection ends.
        let sessions: Arc<Mutex<std::collections::HashSet<u64>>> = Arc::default();
        let mut mine = ParkOnDrop {
            host: self.clone(),
            workers: HashMap::new(),
            sessions: sessions.clone(),
            why: String::new(),
            kept: Some(kept),
        };
        loop {
            let (host, heard) = (self.clone(), sessions.clone());
            let mut progress = move || host.heard_from_coordinator(&heard);
            let msg: ToHost = match read_frame_within(&mut r, idle, MAX_FRAME, &mut progress).await
            {
                Ok((m, _)) => m,
                Err(e) => {
                    mine.why = e.to_string();
                    break;
                }
            };
            if let ToHost::Call { call, .. } = &msg
                && let Some(session) = call.session()
            {
                sessions
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(session);
            }
            let workers = &mut mine.workers;
            match msg {
                ToHost::Heartbeat => {}
                ToHost::Mesh(frame) => self.route(frame),
                ToHost::DropParked => self.drop_parked(),
                ToHost::Parked { id } => {
                    let answer = FromHost::Answer {
                        id,
                        result: Ok(Answer::Parked(self.parked())),
                    };
                    if out.send(answer).await.is_err() {
                        break;
                    }
                }
                ToHost::Locality { id, step } => {
                    let (store, out) = (self.reach().checkpoints, out.clone());
                    tokio::spawn(async move {
                        let held = match store {
                            Some(s) => tokio::task::spawn_blocking(move || s.local_bytes(step))
                                .await
                                .ok()
                                .and_then(|r| r.ok())
                                .unwrap_or_default(),
                            None => Vec::new(),
                        };
                        let answer = FromHost::Answer {
                            id,
                            result: Ok(Answer::Locality(held)),
                        };
                        let _ = out.send(answer).await;
                    });
                }
                ToHost::Call {
                    id,
                    worker,
                    limits,
                    call,
                } => {
                    if let Call::Stop = *call {
                        workers.remove(&worker);
                        continue;
                    }
                    if let Call::Start { .. } = *call {
                        // A coordinator that starts workers adopted what
                        // it wanted of those kept here.
                        self.drop_parked();
                        let (tx, rx) = mpsc::unbounded_channel();
                        let state: Arc<Mutex<Parkable>> = Arc::default();
                        let task = tokio::spawn(self.clone().run_worker(worker, rx, state.clone()));
                        workers.insert(
                            worker,
                            WorkerTask {
                                calls: tx,
                                state,
                                _task: AbortOnDrop(task.abort_handle()),
                            },
                        );
                    }
                    if let Call::Adopt { .. } = *call {
                        let kept = self
                            .parked
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .workers
                            .remove(&worker);
                        if let Some(kept) = kept {
                            workers.insert(worker, kept);
                        }
                    }
                    match workers.get(&worker) {
                        Some(task) => {
                            let _ = task.calls.send(TaskMsg::Call {
                                id,
                                limits,
                                call,
                                out: out.clone(),
                            });
                        }
                        None => {
                            let answer = FromHost::Answer {
                                id,
                                result: Err(CallError {
                                    message: format!("worker {worker} is not running here"),
                                    guest: false,
                                    exchange: false,
                                    refused: false,
                                    silent_slot: None,
                                }),
                            };
                            if out.send(answer).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Once none of the workers whose coordinator went is in a call (a step
/// going on without it ends), or after `at_most` (a step that waits for a
/// host that never began it does not end), the coordinator's sessions are
/// over here: their exchanges' links to the other hosts close, and those
/// hosts give this one up instead of waiting for parts it will never send
/// (the links would otherwise go on beating for the workers kept here).
/// A session a new coordinator began meanwhile is not among them.
async fn end_sessions_when_idle(
    sessions: Vec<Weak<Exchange>>,
    workers: Vec<Arc<Mutex<Parkable>>>,
    at_most: Duration,
) {
    let until = tokio::time::Instant::now() + at_most;
    let busy = || {
        workers
            .iter()
            .any(|w| w.lock().unwrap_or_else(|p| p.into_inner()).is_busy())
    };
    while busy() && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for x in sessions.iter().filter_map(Weak::upgrade) {
        x.close_links();
    }
}

/// Closes a host when its server ends: what it kept goes, and it keeps
/// nothing more (the workers' tasks hold the host: kept, they would keep
/// it, and the pipeline's storage it reaches, alive).
struct CloseOnDrop(Arc<WorkerHost>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::SeqCst);
        self.0.drop_parked();
    }
}

/// Aborts a task when dropped.
pub(super) struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
