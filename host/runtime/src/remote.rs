//! Workers on other hosts.
//!
//! A pipeline across several hosts runs one [`Coordinator`](crate::Coordinator)
//! (on the host that leads) and some of its W workers on each host. Every
//! other host runs a [`WorkerHost`]: it listens on TCP, and the coordinator
//! connects to it ([`RemoteHost::connect`]) and drives its workers there as
//! it drives its own — start, step, snapshot, restore, hand shards off —
//! through [`RemoteWorker`]s. The step protocol does not change: the
//! coordinator divides, every worker runs the step, the coordinator commits
//! every worker's output and the step record in one transaction (Kafka's,
//! fenced by the transactional id), so a host that is cut off, stalls or
//! comes back as a zombie can commit nothing.
//!
//! **The exchange** stays the coordinator's: a remote worker's `shuffle` is
//! sent to the coordinator, which runs it through the pipeline's
//! [`Exchange`] like a local worker's and sends the result back. Routing and
//! the order of received events (worker order) are therefore exactly those
//! of one host, and a replay on any placement of workers computes the same
//! outputs (I4). (Frames go through the coordinator: two hops, not one.)
//!
//! **Authentication**: both ends prove they know the pipeline's shared
//! secret (HMAC-SHA256 over the other's random nonce and the pipeline's
//! name) before anything else is read. Frames are not encrypted: run hosts
//! on a private network (or a tunnel) as with any cluster-internal port.
//!
//! **Liveness**: a host sends a heartbeat every [`HEARTBEAT`]; the
//! coordinator fails the connection — and every call in flight on it, which
//! fails the step — when nothing arrived for its session timeout. A host
//! accepts one coordinator at a time: a new connection replaces the one
//! before (its workers are dropped).

use crate::bindings::{Batch, KeyedEvents};
use crate::engine::{LoadedComponent, SluiceEngine};
use crate::error::{Error, Result};
use crate::exchange::{Exchange, ExchangeError, Reply, Shuffler};
use crate::worker::{Snapshot, Worker, WorkerInfo};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use sluice_core::StepLimits;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot};

/// How often a host tells the coordinator it is alive.
pub const HEARTBEAT: Duration = Duration::from_millis(500);

/// The largest frame either end accepts (a worker's whole snapshot travels
/// in one).
const MAX_FRAME: u64 = 8 << 30;

/// The protocol version both ends must speak.
const VERSION: u32 = 1;

/// A batch on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct WireBatch {
    port: u32,
    #[serde(with = "serde_bytes")]
    values: Vec<u8>,
    ends: Vec<u32>,
    weights: Vec<i64>,
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
struct WireKeyed {
    #[serde(with = "serde_bytes")]
    keys: Vec<u8>,
    key_ends: Vec<u32>,
    #[serde(with = "serde_bytes")]
    values: Vec<u8>,
    ends: Vec<u32>,
    weights: Vec<i64>,
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
struct WirePiece(u32, #[serde(with = "serde_bytes")] Vec<u8>);

fn to_wire(pieces: Vec<(u32, Vec<u8>)>) -> Vec<WirePiece> {
    pieces.into_iter().map(|(s, b)| WirePiece(s, b)).collect()
}

fn from_wire(pieces: Vec<WirePiece>) -> Vec<(u32, Vec<u8>)> {
    pieces.into_iter().map(|WirePiece(s, b)| (s, b)).collect()
}

/// An exchange failure on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum WireExchangeError {
    ContractViolation(String),
    Aborted(String),
}

impl From<ExchangeError> for WireExchangeError {
    fn from(e: ExchangeError) -> Self {
        match e {
            ExchangeError::ContractViolation(m) => WireExchangeError::ContractViolation(m),
            ExchangeError::Aborted(m) => WireExchangeError::Aborted(m),
        }
    }
}

impl From<WireExchangeError> for ExchangeError {
    fn from(e: WireExchangeError) -> Self {
        match e {
            WireExchangeError::ContractViolation(m) => ExchangeError::ContractViolation(m),
            WireExchangeError::Aborted(m) => ExchangeError::Aborted(m),
        }
    }
}

/// A call the coordinator makes on one of a host's workers.
#[derive(Debug, Serialize, Deserialize)]
enum Call {
    Start {
        workers: u32,
        pipeline: String,
        config: Vec<(String, String)>,
        inherit_stderr: bool,
    },
    Step {
        step: u64,
        time_ms: u64,
        inputs: Vec<WireBatch>,
    },
    Snapshot {
        changed_only: bool,
    },
    Restore {
        pieces: Vec<WirePiece>,
    },
    Export {
        shards: Vec<u32>,
    },
    Relayout {
        workers: u32,
    },
    Stop,
}

/// What a call returned.
#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    Done,
    Stepped {
        outputs: Vec<WireBatch>,
        fuel: u64,
    },
    Snapshot {
        pieces: Vec<WirePiece>,
        changed: Option<Vec<u32>>,
    },
    Pieces(Vec<WirePiece>),
}

/// A failed call: the worker's error as text, and whether it was the
/// guest's doing (a retry on another host would fail the same way).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CallError {
    message: String,
    guest: bool,
    /// The worker failed because the exchange did.
    exchange: bool,
}

/// Coordinator → host.
#[derive(Debug, Serialize, Deserialize)]
enum ToHost {
    Call {
        id: u64,
        worker: u32,
        /// The deterministic limits the call runs under.
        limits: StepLimits,
        call: Call,
    },
    /// The answer to a [`FromHost::Shuffle`].
    Shuffled {
        id: u64,
        result: Result<WireKeyed, WireExchangeError>,
    },
}

/// Host → coordinator.
#[derive(Debug, Serialize, Deserialize)]
enum FromHost {
    Answer {
        id: u64,
        result: Result<Answer, CallError>,
    },
    /// A worker's shuffle, for the coordinator's exchange.
    Shuffle {
        id: u64,
        worker: u32,
        channel: u32,
        events: WireKeyed,
    },
    Heartbeat,
}

/// The handshake: who speaks, for which pipeline, with which nonce.
#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    version: u32,
    pipeline: String,
    nonce: [u8; 32],
}

/// Proves knowledge of the secret for the other end's nonce.
#[derive(Debug, Serialize, Deserialize)]
struct Proof {
    mac: Vec<u8>,
}

fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |e| Error::Remote {
        host: what,
        message: e.to_string(),
        guest: false,
        exchange: false,
    }
}

fn remote(host: &str, message: impl Into<String>) -> Error {
    Error::Remote {
        host: host.to_owned(),
        message: message.into(),
        guest: false,
        exchange: false,
    }
}

/// Writes one frame; returns its size on the wire.
async fn write_frame<T: Serialize>(w: &mut OwnedWriteHalf, value: &T) -> std::io::Result<u64> {
    let bytes = postcard::to_allocvec(value)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    w.write_all(&(bytes.len() as u64).to_le_bytes()).await?;
    w.write_all(&bytes).await?;
    w.flush().await?;
    Ok(bytes.len() as u64 + 8)
}

async fn read_frame<T: for<'de> Deserialize<'de>>(r: &mut OwnedReadHalf) -> std::io::Result<T> {
    read_sized(r).await.map(|(v, _)| v)
}

/// Reads one frame, with its size on the wire.
async fn read_sized<T: for<'de> Deserialize<'de>>(
    r: &mut OwnedReadHalf,
) -> std::io::Result<(T, u64)> {
    let mut len = [0u8; 8];
    r.read_exact(&mut len).await?;
    let len = u64::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes (at most {MAX_FRAME})"),
        ));
    }
    let mut bytes = vec![0u8; len as usize];
    r.read_exact(&mut bytes).await?;
    postcard::from_bytes(&bytes)
        .map(|v| (v, len + 8))
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The HMAC-SHA256, keyed by the pipeline's secret, of who proves (its
/// role), for which pipeline, over the other end's nonce.
fn keyed(secret: &[u8], role: &str, pipeline: &str, nonce: &[u8; 32]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key");
    for part in [role.as_bytes(), &[0], pipeline.as_bytes(), &[0], nonce] {
        m.update(part);
    }
    m
}

fn mac(secret: &[u8], role: &str, pipeline: &str, nonce: &[u8; 32]) -> Vec<u8> {
    keyed(secret, role, pipeline, nonce)
        .finalize()
        .into_bytes()
        .to_vec()
}

fn verify(secret: &[u8], role: &str, pipeline: &str, nonce: &[u8; 32], proof: &[u8]) -> bool {
    keyed(secret, role, pipeline, nonce)
        .verify_slice(proof)
        .is_ok()
}

fn nonce() -> std::io::Result<[u8; 32]> {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n)
        .map_err(|e| std::io::Error::other(format!("the OS random source: {e}")))?;
    Ok(n)
}

/// Mutual authentication over a fresh connection. `role` is this end's
/// ("coordinator" or "host"); returns once both proofs checked.
async fn handshake(
    r: &mut OwnedReadHalf,
    w: &mut OwnedWriteHalf,
    secret: &[u8],
    pipeline: &str,
    role: &str,
) -> std::io::Result<()> {
    let other = if role == "coordinator" {
        "host"
    } else {
        "coordinator"
    };
    let mine = nonce()?;
    write_frame(
        w,
        &Hello {
            version: VERSION,
            pipeline: pipeline.to_owned(),
            nonce: mine,
        },
    )
    .await?;
    let theirs: Hello = read_frame(r).await?;
    let refuse = |m: String| std::io::Error::new(std::io::ErrorKind::PermissionDenied, m);
    if theirs.version != VERSION {
        return Err(refuse(format!(
            "protocol version {} (this host speaks {VERSION})",
            theirs.version
        )));
    }
    if theirs.pipeline != pipeline {
        return Err(refuse(format!(
            "the other end runs pipeline `{}`, not `{pipeline}`",
            theirs.pipeline
        )));
    }
    write_frame(
        w,
        &Proof {
            mac: mac(secret, role, pipeline, &theirs.nonce),
        },
    )
    .await?;
    let proof: Proof = read_frame(r).await?;
    if !verify(secret, other, pipeline, &mine, &proof.mac) {
        return Err(refuse(
            "the other end does not know the pipeline's secret".into(),
        ));
    }
    Ok(())
}

/// Registers a call awaiting its answer: a fresh id and where the answer
/// will arrive.
fn register<T>(
    pending: &Mutex<HashMap<u64, oneshot::Sender<T>>>,
    next: &AtomicU64,
) -> (u64, oneshot::Receiver<T>) {
    let id = next.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id, tx);
    (id, rx)
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Answer, CallError>>>>>;

/// The coordinator's end of a connection to a [`WorkerHost`].
pub struct RemoteHost {
    addr: String,
    out: mpsc::UnboundedSender<ToHost>,
    pending: Pending,
    next: AtomicU64,
    /// The exchange remote shuffles go to (the coordinator's current one).
    exchange: Arc<Mutex<Option<Arc<Exchange>>>>,
    /// Why the connection ended, once it has.
    closed: Arc<Mutex<Option<String>>>,
    /// Bytes sent to the host and received from it.
    traffic: Arc<(AtomicU64, AtomicU64)>,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl std::fmt::Debug for RemoteHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteHost")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Drop for RemoteHost {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl RemoteHost {
    /// Connects to the worker host at `addr` for `pipeline`, proving the
    /// shared `secret`. The connection fails (and every call on it) when the
    /// host sends nothing for `session_timeout`.
    pub async fn connect(
        addr: &str,
        pipeline: &str,
        secret: &[u8],
        session_timeout: Duration,
    ) -> Result<Arc<RemoteHost>> {
        let stream = tokio::time::timeout(session_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| remote(addr, "connecting timed out"))?
            .map_err(io_error(addr))?;
        stream.set_nodelay(true).map_err(io_error(addr))?;
        let (mut r, mut w) = stream.into_split();
        tokio::time::timeout(
            session_timeout,
            handshake(&mut r, &mut w, secret, pipeline, "coordinator"),
        )
        .await
        .map_err(|_| remote(addr, "the handshake timed out"))?
        .map_err(io_error(addr))?;
        let (out, mut queue) = mpsc::unbounded_channel::<ToHost>();
        let pending: Pending = Arc::default();
        let closed: Arc<Mutex<Option<String>>> = Arc::default();
        let exchange: Arc<Mutex<Option<Arc<Exchange>>>> = Arc::default();
        let close = {
            let (pending, closed) = (pending.clone(), closed.clone());
            move |why: String| {
                closed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(why.clone());
                let waiting: Vec<_> = pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .drain()
                    .collect();
                for (_, tx) in waiting {
                    let _ = tx.send(Err(CallError {
                        message: why.clone(),
                        guest: false,
                        exchange: false,
                    }));
                }
            }
        };
        let traffic: Arc<(AtomicU64, AtomicU64)> = Arc::default();
        let writer = {
            let (close, traffic) = (close.clone(), traffic.clone());
            tokio::spawn(async move {
                while let Some(msg) = queue.recv().await {
                    match write_frame(&mut w, &msg).await {
                        Ok(n) => {
                            traffic.0.fetch_add(n, Ordering::Relaxed);
                        }
                        Err(e) => {
                            close(format!("sending to the host: {e}"));
                            return;
                        }
                    }
                }
            })
        };
        let reader = {
            let (pending, exchange, out) = (pending.clone(), exchange.clone(), out.clone());
            let traffic = traffic.clone();
            tokio::spawn(async move {
                loop {
                    let msg = match tokio::time::timeout(session_timeout, read_sized(&mut r)).await
                    {
                        Err(_) => {
                            close(format!(
                                "the host sent nothing for {session_timeout:?} (its session \
                                 timeout): it is stalled or cut off"
                            ));
                            return;
                        }
                        Ok(Err(e)) => {
                            close(format!("the connection to the host ended: {e}"));
                            return;
                        }
                        Ok(Ok((msg, n))) => {
                            traffic.1.fetch_add(n, Ordering::Relaxed);
                            msg
                        }
                    };
                    match msg {
                        FromHost::Heartbeat => {}
                        FromHost::Answer { id, result } => {
                            let tx = pending
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .remove(&id);
                            if let Some(tx) = tx {
                                let _ = tx.send(result);
                            }
                        }
                        FromHost::Shuffle {
                            id,
                            worker,
                            channel,
                            events,
                        } => {
                            let x = exchange.lock().unwrap_or_else(|p| p.into_inner()).clone();
                            let out = out.clone();
                            tokio::spawn(async move {
                                let result = match x {
                                    Some(x) => x.shuffle(worker, channel, events.into()).await,
                                    None => Err(ExchangeError::Aborted(
                                        "the coordinator has no exchange".into(),
                                    )),
                                };
                                let _ = out.send(ToHost::Shuffled {
                                    id,
                                    result: result.map(Into::into).map_err(Into::into),
                                });
                            });
                        }
                    }
                }
            })
        };
        Ok(Arc::new(RemoteHost {
            addr: addr.to_owned(),
            out,
            pending,
            next: AtomicU64::new(0),
            exchange,
            closed,
            traffic,
            tasks: vec![writer.abort_handle(), reader.abort_handle()],
        }))
    }

    /// The host's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Bytes sent to the host and received from it so far (frames with
    /// their length prefixes).
    pub fn traffic(&self) -> (u64, u64) {
        (
            self.traffic.0.load(Ordering::Relaxed),
            self.traffic.1.load(Ordering::Relaxed),
        )
    }

    /// Why the connection ended, if it has.
    pub fn closed(&self) -> Option<String> {
        self.closed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_exchange(&self, exchange: Arc<Exchange>) {
        *self.exchange.lock().unwrap_or_else(|p| p.into_inner()) = Some(exchange);
    }

    async fn call(&self, worker: u32, limits: StepLimits, call: Call) -> Result<Answer> {
        if let Some(why) = self.closed() {
            return Err(remote(&self.addr, why));
        }
        let (id, rx) = register(&self.pending, &self.next);
        if self
            .out
            .send(ToHost::Call {
                id,
                worker,
                limits,
                call,
            })
            .is_err()
        {
            return Err(remote(&self.addr, "the connection to the host has ended"));
        }
        let answer = rx
            .await
            .map_err(|_| remote(&self.addr, "the connection to the host has ended"))?;
        answer.map_err(|e| Error::Remote {
            host: self.addr.clone(),
            message: format!("worker {worker}: {}", e.message),
            guest: e.guest,
            exchange: e.exchange,
        })
    }
}

/// A worker running on another host, driven through its [`RemoteHost`].
pub struct RemoteWorker {
    host: Arc<RemoteHost>,
    worker: u32,
    limits: StepLimits,
    fuel_used: u64,
}

fn unexpected(host: &RemoteHost, call: &str) -> Error {
    remote(&host.addr, format!("an answer that does not fit `{call}`"))
}

impl RemoteWorker {
    /// Starts worker `info.worker` on `host`, its shuffles going to
    /// `exchange`, under `limits`.
    pub(crate) async fn start(
        host: Arc<RemoteHost>,
        info: WorkerInfo,
        exchange: Arc<Exchange>,
        limits: StepLimits,
        inherit_stderr: bool,
    ) -> Result<Self> {
        host.set_exchange(exchange);
        let worker = info.worker;
        host.call(
            worker,
            limits,
            Call::Start {
                workers: info.workers,
                pipeline: info.pipeline,
                config: info.config,
                inherit_stderr,
            },
        )
        .await?;
        Ok(RemoteWorker {
            host,
            worker,
            limits,
            fuel_used: 0,
        })
    }

    /// The host it runs on.
    pub fn host(&self) -> &Arc<RemoteHost> {
        &self.host
    }

    pub(crate) async fn step(
        &mut self,
        step: u64,
        time_ms: u64,
        inputs: Vec<Batch>,
    ) -> Result<Vec<Batch>> {
        let call = Call::Step {
            step,
            time_ms,
            inputs: inputs.into_iter().map(Into::into).collect(),
        };
        match self.host.call(self.worker, self.limits, call).await? {
            Answer::Stepped { outputs, fuel } => {
                self.fuel_used += fuel;
                Ok(outputs.into_iter().map(Into::into).collect())
            }
            _ => Err(unexpected(&self.host, "step")),
        }
    }

    pub(crate) fn set_step_limits(&mut self, limits: StepLimits) {
        self.limits = limits;
    }

    pub(crate) fn take_fuel_used(&mut self) -> u64 {
        std::mem::take(&mut self.fuel_used)
    }

    pub(crate) async fn snapshot(&mut self, changed_only: bool) -> Result<Snapshot> {
        match self
            .host
            .call(self.worker, self.limits, Call::Snapshot { changed_only })
            .await?
        {
            Answer::Snapshot { pieces, changed } => Ok(Snapshot {
                pieces: from_wire(pieces),
                changed,
            }),
            _ => Err(unexpected(&self.host, "snapshot")),
        }
    }

    pub(crate) async fn restore(&mut self, pieces: Vec<(u32, Vec<u8>)>) -> Result<()> {
        match self
            .host
            .call(
                self.worker,
                self.limits,
                Call::Restore {
                    pieces: to_wire(pieces),
                },
            )
            .await?
        {
            Answer::Done => Ok(()),
            _ => Err(unexpected(&self.host, "restore")),
        }
    }

    pub(crate) async fn export_shards(&mut self, shards: &[u32]) -> Result<Vec<(u32, Vec<u8>)>> {
        let call = Call::Export {
            shards: shards.to_vec(),
        };
        match self.host.call(self.worker, self.limits, call).await? {
            Answer::Pieces(p) => Ok(from_wire(p)),
            _ => Err(unexpected(&self.host, "export-shards")),
        }
    }

    pub(crate) async fn relayout(&mut self, workers: u32, exchange: Arc<Exchange>) -> Result<()> {
        self.host.set_exchange(exchange);
        match self
            .host
            .call(self.worker, self.limits, Call::Relayout { workers })
            .await?
        {
            Answer::Done => Ok(()),
            _ => Err(unexpected(&self.host, "set-workers")),
        }
    }
}

impl Drop for RemoteWorker {
    fn drop(&mut self) {
        // Best effort: a host whose connection ended dropped it already.
        let id = self.host.next.fetch_add(1, Ordering::Relaxed);
        let _ = self.host.out.send(ToHost::Call {
            id,
            worker: self.worker,
            limits: self.limits,
            call: Call::Stop,
        });
    }
}

/// A worker in this process or on another host: what the coordinator
/// drives.
pub(crate) enum AnyWorker {
    Local(Box<Worker>),
    Remote(RemoteWorker),
}

impl AnyWorker {
    pub(crate) async fn step(
        &mut self,
        step: u64,
        time_ms: u64,
        inputs: Vec<Batch>,
    ) -> Result<Vec<Batch>> {
        match self {
            AnyWorker::Local(w) => w.step(step, time_ms, inputs).await,
            AnyWorker::Remote(w) => w.step(step, time_ms, inputs).await,
        }
    }

    pub(crate) fn set_step_limits(&mut self, limits: StepLimits) {
        match self {
            AnyWorker::Local(w) => w.set_step_limits(limits),
            AnyWorker::Remote(w) => w.set_step_limits(limits),
        }
    }

    pub(crate) fn take_fuel_used(&mut self) -> u64 {
        match self {
            AnyWorker::Local(w) => w.take_fuel_used(),
            AnyWorker::Remote(w) => w.take_fuel_used(),
        }
    }

    pub(crate) async fn snapshot(&mut self, changed_only: bool) -> Result<Snapshot> {
        match self {
            AnyWorker::Local(w) => w.snapshot(changed_only).await,
            AnyWorker::Remote(w) => w.snapshot(changed_only).await,
        }
    }

    pub(crate) async fn restore(&mut self, pieces: Vec<(u32, Vec<u8>)>) -> Result<()> {
        match self {
            AnyWorker::Local(w) => w.restore(pieces).await,
            AnyWorker::Remote(w) => w.restore(pieces).await,
        }
    }

    pub(crate) async fn export_shards(&mut self, shards: &[u32]) -> Result<Vec<(u32, Vec<u8>)>> {
        match self {
            AnyWorker::Local(w) => w.export_shards(shards).await,
            AnyWorker::Remote(w) => w.export_shards(shards).await,
        }
    }

    pub(crate) async fn relayout(&mut self, workers: u32, exchange: Arc<Exchange>) -> Result<()> {
        match self {
            AnyWorker::Local(w) => w.relayout(workers, exchange).await,
            AnyWorker::Remote(w) => w.relayout(workers, exchange).await,
        }
    }
}

/// The shuffles of a host's workers, sent to the coordinator.
struct ShuffleProxy {
    out: mpsc::UnboundedSender<FromHost>,
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>,
    next: AtomicU64,
}

#[async_trait::async_trait]
impl Shuffler for ShuffleProxy {
    async fn shuffle(&self, worker: u32, channel: u32, events: KeyedEvents) -> Reply {
        let (id, rx) = register(&self.pending, &self.next);
        let sent = self.out.send(FromHost::Shuffle {
            id,
            worker,
            channel,
            events: events.into(),
        });
        if sent.is_err() {
            return Err(ExchangeError::Aborted(
                "the coordinator's connection has ended".into(),
            ));
        }
        rx.await.unwrap_or_else(|_| {
            Err(ExchangeError::Aborted(
                "the coordinator's connection has ended".into(),
            ))
        })
    }
}

/// A host that runs workers for the coordinator of a pipeline: the other
/// hosts' end of [`RemoteHost`].
pub struct WorkerHost {
    engine: SluiceEngine,
    component: LoadedComponent,
    pipeline: String,
    secret: Vec<u8>,
    /// The connection being served: a new coordinator replaces it.
    current: Mutex<Option<tokio::task::AbortHandle>>,
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
        Arc::new(WorkerHost {
            engine: engine.with_limits(engine.limits()),
            component: component.clone(),
            pipeline: pipeline.to_owned(),
            secret: secret.to_vec(),
            current: Mutex::new(None),
        })
    }

    /// Serves coordinators connecting to `listener`, until the listener
    /// fails. Dropping (aborting) the future ends every connection and
    /// drops every worker: the host is gone.
    pub async fn serve(self: Arc<Self>, listener: tokio::net::TcpListener) -> Result<()> {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => {
                    accepted.map_err(io_error("accepting a coordinator"))?
                }
                Some(_) = connections.join_next() => continue,
            };
            let host = self.clone();
            connections.spawn(async move {
                if let Err(e) = host.clone().accept(stream).await {
                    tracing::warn!(%peer, error = %e, "a coordinator's connection failed");
                }
            });
        }
    }

    async fn accept(self: Arc<Self>, stream: TcpStream) -> Result<()> {
        stream
            .set_nodelay(true)
            .map_err(io_error("a coordinator"))?;
        let (mut r, mut w) = stream.into_split();
        tokio::time::timeout(
            Duration::from_secs(10),
            handshake(&mut r, &mut w, &self.secret, &self.pipeline, "host"),
        )
        .await
        .map_err(|_| remote("a coordinator", "the handshake timed out"))?
        .map_err(io_error("a coordinator"))?;
        let served = tokio::spawn(self.clone().serve_connection(r, w));
        let _served = AbortOnDrop(served.abort_handle());
        let previous = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(served.abort_handle());
        if let Some(previous) = previous {
            previous.abort();
            tracing::info!(pipeline = %self.pipeline, "a new coordinator replaced the one before");
        }
        match served.await {
            Ok(r) => r,
            Err(e) if e.is_cancelled() => Ok(()),
            Err(e) => Err(Error::task("a coordinator's connection")(e)),
        }
    }

    async fn serve_connection(
        self: Arc<Self>,
        mut r: OwnedReadHalf,
        mut w: OwnedWriteHalf,
    ) -> Result<()> {
        let (out, mut queue) = mpsc::unbounded_channel::<FromHost>();
        let writer = tokio::spawn(async move {
            let mut beat = tokio::time::interval(HEARTBEAT);
            loop {
                let msg = tokio::select! {
                    m = queue.recv() => match m { Some(m) => m, None => return },
                    _ = beat.tick() => FromHost::Heartbeat,
                };
                if write_frame(&mut w, &msg).await.is_err() {
                    return;
                }
            }
        });
        let _writer = AbortOnDrop(writer.abort_handle());
        let proxy = Arc::new(ShuffleProxy {
            out: out.clone(),
            pending: Arc::default(),
            next: AtomicU64::new(0),
        });
        // One task per worker, taking its calls in order.
        let mut workers: HashMap<u32, mpsc::UnboundedSender<(u64, StepLimits, Call)>> =
            HashMap::new();
        let mut tasks = Vec::new();
        loop {
            let msg: ToHost = match read_frame(&mut r).await {
                Ok(m) => m,
                Err(_) => break,
            };
            match msg {
                ToHost::Shuffled { id, result } => {
                    let tx = proxy
                        .pending
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&id);
                    if let Some(tx) = tx {
                        let _ = tx.send(result.map(Into::into).map_err(Into::into));
                    }
                }
                ToHost::Call {
                    id,
                    worker,
                    limits,
                    call,
                } => {
                    if let Call::Stop = call {
                        workers.remove(&worker);
                        continue;
                    }
                    if let Call::Start { .. } = call {
                        let (tx, rx) = mpsc::unbounded_channel();
                        workers.insert(worker, tx);
                        let task = tokio::spawn(self.clone().run_worker(
                            worker,
                            rx,
                            out.clone(),
                            proxy.clone(),
                        ));
                        tasks.push(AbortOnDrop(task.abort_handle()));
                    }
                    match workers.get(&worker) {
                        Some(tx) => {
                            let _ = tx.send((id, limits, call));
                        }
                        None => {
                            let _ = out.send(FromHost::Answer {
                                id,
                                result: Err(CallError {
                                    message: format!("worker {worker} is not running here"),
                                    guest: false,
                                    exchange: false,
                                }),
                            });
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs one worker's calls in order until the coordinator stops it or
    /// goes away.
    async fn run_worker(
        self: Arc<Self>,
        index: u32,
        mut calls: mpsc::UnboundedReceiver<(u64, StepLimits, Call)>,
        out: mpsc::UnboundedSender<FromHost>,
        proxy: Arc<ShuffleProxy>,
    ) {
        let mut worker: Option<Worker> = None;
        while let Some((id, limits, call)) = calls.recv().await {
            let result = self.answer(index, &mut worker, limits, call, &proxy).await;
            let result = result.map_err(|e| CallError {
                guest: matches!(e, Error::Guest(_)),
                exchange: e.kind() == "exchange",
                message: e.to_string(),
            });
            if out.send(FromHost::Answer { id, result }).is_err() {
                return;
            }
        }
    }

    async fn answer(
        &self,
        index: u32,
        worker: &mut Option<Worker>,
        limits: StepLimits,
        call: Call,
        proxy: &Arc<ShuffleProxy>,
    ) -> Result<Answer> {
        if let Call::Start {
            workers,
            pipeline,
            config,
            inherit_stderr,
        } = call
        {
            let info = WorkerInfo {
                worker: index,
                workers,
                pipeline,
                config,
            };
            let mut started = Worker::start_with(
                &self.engine,
                &self.component,
                info,
                Some(proxy.clone() as Arc<dyn Shuffler>),
                inherit_stderr,
            )
            .await?;
            if limits != StepLimits::default() {
                started.set_step_limits(limits);
            }
            *worker = Some(started);
            return Ok(Answer::Done);
        }
        let w = worker.as_mut().ok_or(Error::WorkersLost)?;
        if limits != StepLimits::default() {
            w.set_step_limits(limits);
        }
        Ok(match call {
            Call::Start { .. } | Call::Stop => Answer::Done,
            Call::Step {
                step,
                time_ms,
                inputs,
            } => {
                let outputs = w
                    .step(step, time_ms, inputs.into_iter().map(Into::into).collect())
                    .await?;
                Answer::Stepped {
                    outputs: outputs.into_iter().map(Into::into).collect(),
                    fuel: w.take_fuel_used(),
                }
            }
            Call::Snapshot { changed_only } => {
                let s = w.snapshot(changed_only).await?;
                Answer::Snapshot {
                    pieces: to_wire(s.pieces),
                    changed: s.changed,
                }
            }
            Call::Restore { pieces } => {
                w.restore(from_wire(pieces)).await?;
                Answer::Done
            }
            Call::Export { shards } => Answer::Pieces(to_wire(w.export_shards(&shards).await?)),
            Call::Relayout { workers } => {
                w.relayout_with(workers, proxy.clone() as Arc<dyn Shuffler>)
                    .await?;
                Answer::Done
            }
        })
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
