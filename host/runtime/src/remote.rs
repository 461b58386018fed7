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
//! **The exchange** runs on every host for its own workers, host to host:
//! each host's [`Exchange`] sends every other host one frame per round with
//! what its workers sent that host's workers — to the coordinator over its
//! connection, to any other host over a direct connection made for the
//! purpose (a *peer link*, opened when the coordinator places workers).
//! Received events are concatenated in global worker order, so routing and
//! order are exactly those of one host and a replay on any placement of
//! workers computes the same outputs (I4). Every exchange placement has a
//! session number: frames of an older one are dropped.
//!
//! **Backpressure**: every connection's outgoing queue is bounded
//! ([`QUEUE`] frames); a sender waits while it is full, so a slow host slows
//! its senders instead of growing their memory.
//!
//! **Authentication**: both ends prove they know the pipeline's shared
//! secret (HMAC-SHA256 over the other's random nonce, the prover's role and
//! the pipeline's name) before anything else is read. With [`Tls`] every
//! connection is also mutual TLS (rustls): encrypted, and both ends present
//! a certificate of the pipeline's certificate authority — for hosts on a
//! network you do not trust. Without it frames travel in the clear: run
//! hosts on a private network (or a tunnel).
//!
//! **Liveness**: a host sends a heartbeat every [`HEARTBEAT`]; the
//! coordinator fails the connection — and every call in flight on it, which
//! fails the step — when nothing arrived for its session timeout. A host
//! accepts one coordinator at a time: a new connection replaces the one
//! before (its workers are dropped).

use crate::bindings::{Batch, KeyedEvents};
use crate::coordinator::{InputRange, OutputChecks, convert_output, read_batches, share_error};
use crate::engine::{LoadedComponent, SluiceEngine};
use crate::error::{Error, Result};
use crate::exchange::{Exchange, ExchangeError, Frame, FrameBody, Link, Placement};
use crate::worker::{Snapshot, Worker, WorkerInfo};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use sluice_core::Layout;
use sluice_core::StepLimits;
use sluice_storage::{
    CheckpointStore, LogBackend, ReadBytes, Staged, WorkerCommit, WorkerCommitter,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// How often a host tells the coordinator it is alive.
pub const HEARTBEAT: Duration = Duration::from_millis(500);

/// How many frames a connection's outgoing queue holds before senders wait.
pub const QUEUE: usize = 64;

/// The largest frame either end accepts (a worker's whole snapshot travels
/// in one).
const MAX_FRAME: u64 = 8 << 30;

/// The protocol version both ends must speak.
const VERSION: u32 = 5;

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

/// An exchange [`Frame`] on the wire.
#[derive(Debug, Serialize, Deserialize)]
struct WireFrame {
    session: u64,
    step: u64,
    channel: u32,
    from: u32,
    body: WireFrameBody,
}

#[derive(Debug, Serialize, Deserialize)]
enum WireFrameBody {
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
struct WireMesh {
    session: u64,
    /// The host's slot.
    slot: u32,
    /// The slot of each worker.
    slots: Vec<u32>,
    /// Each slot's address (slot 0, the coordinator's, is reached over the
    /// coordinator's connection).
    addrs: Vec<String>,
    /// The owner of each shard.
    owners: Vec<u32>,
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
}

/// A worker's share of a divided step, committed by its host (or found
/// committed, with the same hash).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct ShareDone {
    /// The output's hash.
    pub hash: u128,
    /// Its events.
    pub events: u64,
}

/// What a worker's step gave.
pub(crate) struct Stepped {
    /// Its output (none when its host committed the share).
    pub outputs: Vec<Batch>,
    /// The input events its host read.
    pub events: u64,
    /// The share its host committed.
    pub shared: Option<ShareDone>,
}

/// A call the coordinator makes on one of a host's workers.
#[derive(Debug, Serialize, Deserialize)]
enum Call {
    Start {
        workers: u32,
        pipeline: String,
        config: Vec<(String, String)>,
        inherit_stderr: bool,
        mesh: WireMesh,
        /// The SHA-256 of the coordinator's component: a host running
        /// another refuses (two versions of a circuit in one pipeline
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
    },
    /// Restore the worker's pieces of committed checkpoint `step`, read
    /// from the host's checkpoint store (its own copy first).
    RestoreFrom {
        step: u64,
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
    Stop,
}

/// What a call returned.
#[derive(Debug, Serialize, Deserialize)]
enum Answer {
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
    /// The coordinator's exchange frame for the host's workers.
    Mesh(WireFrame),
    /// How much of each worker's state in checkpoint `step` the host has
    /// in its own copy (answered `Answer::Locality`).
    Locality { id: u64, step: u64 },
}

/// Host → coordinator.
#[derive(Debug, Serialize, Deserialize)]
enum FromHost {
    Answer {
        id: u64,
        result: Result<Answer, CallError>,
    },
    /// The host's exchange frame for the coordinator's workers.
    Mesh(WireFrame),
    Heartbeat,
}

/// The handshake: who speaks, for which pipeline, with which nonce.
#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    version: u32,
    pipeline: String,
    /// Who speaks: "coordinator", "peer" (another host's exchange) or
    /// "host" (the end that accepted).
    role: String,
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

/// Mutual TLS between the hosts of a pipeline: this host's certificate
/// and key, and the certificate authority every other host's certificate
/// must chain to (as client and as server).
#[derive(Clone)]
pub struct Tls {
    connector: tokio_rustls::TlsConnector,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads PEM files: `cert` (this host's certificate chain, leaf
    /// first), `key` (its private key) and `ca` (the authority's
    /// certificates). A host's certificate must name the address other
    /// hosts reach it at (an IP or DNS subject alternative name).
    pub fn from_pem_files(
        cert: &std::path::Path,
        key: &std::path::Path,
        ca: &std::path::Path,
    ) -> Result<Tls> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let bad = |what: &std::path::Path, e: &dyn std::fmt::Display| -> Error {
            sluice_core::ConfigError::Invalid(format!("TLS: {}: {e}", what.display())).into()
        };
        let certs = |path: &std::path::Path| -> Result<Vec<CertificateDer<'static>>> {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| bad(path, &e))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| bad(path, &e))?;
            if certs.is_empty() {
                return Err(bad(path, &"no certificate in it"));
            }
            Ok(certs)
        };
        let chain = certs(cert)?;
        let private = PrivateKeyDer::from_pem_file(key).map_err(|e| bad(key, &e))?;
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(ca)? {
            roots.add(c).map_err(|e| bad(ca, &e))?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| bad(ca, &e))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(cert, &e))?
            .with_client_cert_verifier(clients)
            .with_single_cert(chain.clone(), private.clone_key())
            .map_err(|e| bad(cert, &e))?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(cert, &e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, private)
            .map_err(|e| bad(cert, &e))?;
        Ok(Tls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
        })
    }
}

/// The reading end of a connection (TCP, or TLS over it).
type Reader = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
/// The writing end of a connection.
type Writer = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// Opens a connection to `addr`: TCP, and TLS over it when `tls` is given
/// (the host's certificate must name `addr`'s host).
async fn dial(addr: &str, tls: Option<&Tls>) -> std::io::Result<(Reader, Writer)> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    match tls {
        None => {
            let (r, w) = stream.into_split();
            Ok((Box::new(r), Box::new(w)))
        }
        Some(tls) => {
            let host = addr
                .rsplit_once(':')
                .map_or(addr, |(h, _)| h)
                .trim_start_matches('[')
                .trim_end_matches(']');
            let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
            let s = tls.connector.connect(name, stream).await?;
            let (r, w) = tokio::io::split(s);
            Ok((Box::new(r), Box::new(w)))
        }
    }
}

/// Takes an accepted connection: TLS over it when `tls` is given.
async fn answer_on(stream: TcpStream, tls: Option<&Tls>) -> std::io::Result<(Reader, Writer)> {
    stream.set_nodelay(true)?;
    match tls {
        None => {
            let (r, w) = stream.into_split();
            Ok((Box::new(r), Box::new(w)))
        }
        Some(tls) => {
            let s = tls.acceptor.accept(stream).await?;
            let (r, w) = tokio::io::split(s);
            Ok((Box::new(r), Box::new(w)))
        }
    }
}

/// Writes one frame; returns its size on the wire.
async fn write_frame<T: Serialize>(w: &mut Writer, value: &T) -> std::io::Result<u64> {
    let bytes = postcard::to_allocvec(value)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    w.write_all(&(bytes.len() as u64).to_le_bytes()).await?;
    w.write_all(&bytes).await?;
    w.flush().await?;
    Ok(bytes.len() as u64 + 8)
}

async fn read_frame<T: for<'de> Deserialize<'de>>(r: &mut Reader) -> std::io::Result<T> {
    read_sized(r).await.map(|(v, _)| v)
}

/// Reads one frame, with its size on the wire.
async fn read_sized<T: for<'de> Deserialize<'de>>(r: &mut Reader) -> std::io::Result<(T, u64)> {
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
/// ("coordinator" or "peer" dialing, "host" accepting); returns the other
/// end's role once both proofs checked.
async fn handshake(
    r: &mut Reader,
    w: &mut Writer,
    secret: &[u8],
    pipeline: &str,
    role: &str,
) -> std::io::Result<String> {
    let mine = nonce()?;
    write_frame(
        w,
        &Hello {
            version: VERSION,
            pipeline: pipeline.to_owned(),
            role: role.to_owned(),
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
    let expected: &[&str] = if role == "host" {
        &["coordinator", "peer"]
    } else {
        &["host"]
    };
    if !expected.contains(&theirs.role.as_str()) {
        return Err(refuse(format!(
            "the other end speaks as `{}` to a `{role}`",
            theirs.role
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
    if !verify(secret, &theirs.role, pipeline, &mine, &proof.mac) {
        return Err(refuse(
            "the other end does not know the pipeline's secret".into(),
        ));
    }
    Ok(theirs.role)
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

/// Bytes over one connection.
#[derive(Debug, Default)]
struct Traffic {
    sent: AtomicU64,
    received: AtomicU64,
    /// Of both, exchange frames.
    exchange: AtomicU64,
}

/// The coordinator's end of a connection to a [`WorkerHost`].
pub struct RemoteHost {
    addr: String,
    out: mpsc::Sender<ToHost>,
    pending: Pending,
    next: AtomicU64,
    /// The exchange the host's frames go to (the coordinator's current one).
    exchange: Arc<Mutex<Option<Arc<Exchange>>>>,
    /// Why the connection ended, once it has.
    closed: Arc<Mutex<Option<String>>>,
    /// Turns true when the connection ends: a sender waiting on the full
    /// queue gives up.
    gone: tokio::sync::watch::Receiver<bool>,
    /// Bytes sent to the host and received from it.
    traffic: Arc<Traffic>,
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
        Self::connect_with(addr, pipeline, secret, None, session_timeout).await
    }

    /// [`connect`](Self::connect), over mutual TLS when `tls` is given.
    pub async fn connect_with(
        addr: &str,
        pipeline: &str,
        secret: &[u8],
        tls: Option<&Tls>,
        session_timeout: Duration,
    ) -> Result<Arc<RemoteHost>> {
        let (mut r, mut w) = tokio::time::timeout(session_timeout, dial(addr, tls))
            .await
            .map_err(|_| remote(addr, "connecting timed out"))?
            .map_err(io_error(addr))?;
        tokio::time::timeout(
            session_timeout,
            handshake(&mut r, &mut w, secret, pipeline, "coordinator"),
        )
        .await
        .map_err(|_| remote(addr, "the handshake timed out"))?
        .map_err(io_error(addr))?;
        let (out, mut queue) = mpsc::channel::<ToHost>(QUEUE);
        let pending: Pending = Arc::default();
        let closed: Arc<Mutex<Option<String>>> = Arc::default();
        let exchange: Arc<Mutex<Option<Arc<Exchange>>>> = Arc::default();
        let (gone_tx, gone) = tokio::sync::watch::channel(false);
        let gone_tx = Arc::new(gone_tx);
        let close = {
            let (pending, closed) = (pending.clone(), closed.clone());
            move |why: String| {
                gone_tx.send_replace(true);
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
        let traffic: Arc<Traffic> = Arc::default();
        let writer = {
            let (close, traffic) = (close.clone(), traffic.clone());
            tokio::spawn(async move {
                while let Some(msg) = queue.recv().await {
                    match write_frame(&mut w, &msg).await {
                        Ok(n) => {
                            traffic.sent.fetch_add(n, Ordering::Relaxed);
                            if let ToHost::Mesh(_) = msg {
                                traffic.exchange.fetch_add(n, Ordering::Relaxed);
                            }
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
            let (pending, exchange) = (pending.clone(), exchange.clone());
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
                            traffic.received.fetch_add(n, Ordering::Relaxed);
                            if let FromHost::Mesh(_) = msg {
                                traffic.exchange.fetch_add(n, Ordering::Relaxed);
                            }
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
                        FromHost::Mesh(frame) => {
                            let x = exchange.lock().unwrap_or_else(|p| p.into_inner()).clone();
                            if let Some(x) = x {
                                x.receive(frame.into());
                            }
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
            gone,
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
            self.traffic.sent.load(Ordering::Relaxed),
            self.traffic.received.load(Ordering::Relaxed),
        )
    }

    /// Of [`traffic`](Self::traffic), the bytes of exchange frames (both
    /// ways).
    pub fn exchange_traffic(&self) -> u64 {
        self.traffic.exchange.load(Ordering::Relaxed)
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

    /// The way from the coordinator's exchange to this host's.
    pub(crate) fn link(&self) -> Arc<dyn Link> {
        Arc::new(CoordinatorToHost {
            out: self.out.clone(),
            gone: self.gone.clone(),
            addr: self.addr.clone(),
        })
    }

    /// `(worker, bytes)`: how much of each worker's state in committed
    /// checkpoint `step` the host has in its own copy (nothing when it
    /// keeps no copy): where a worker restores without downloading.
    pub(crate) async fn locality(&self, step: u64) -> Result<Vec<(u32, u64)>> {
        if let Some(why) = self.closed() {
            return Err(remote(&self.addr, why));
        }
        let (id, rx) = register(&self.pending, &self.next);
        if !send_unless_gone(&self.out, ToHost::Locality { id, step }, &self.gone).await {
            return Err(remote(&self.addr, "the connection to the host has ended"));
        }
        match rx.await {
            Ok(Ok(Answer::Locality(held))) => Ok(held),
            Ok(_) => Err(unexpected(self, "locality")),
            Err(_) => Err(remote(&self.addr, "the connection to the host has ended")),
        }
    }

    async fn call(&self, worker: u32, limits: StepLimits, call: Call) -> Result<Answer> {
        if let Some(why) = self.closed() {
            return Err(remote(&self.addr, why));
        }
        let (id, rx) = register(&self.pending, &self.next);
        let msg = ToHost::Call {
            id,
            worker,
            limits,
            call,
        };
        if !send_unless_gone(&self.out, msg, &self.gone).await {
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
    /// Where its host keeps checkpoints, if it has a store.
    store: Option<String>,
    /// Where its host reads the pipeline's logs, if it does.
    log: Option<String>,
    /// Its host may write the logs too: it commits the worker's shares.
    commits: bool,
}

fn unexpected(host: &RemoteHost, call: &str) -> Error {
    remote(&host.addr, format!("an answer that does not fit `{call}`"))
}

impl RemoteWorker {
    /// Starts worker `info.worker` on `host`, exchanging as `mesh` places
    /// it, under `limits`.
    pub(crate) async fn start(
        host: Arc<RemoteHost>,
        info: WorkerInfo,
        component: &str,
        mesh: &MeshPlan,
        limits: StepLimits,
        inherit_stderr: bool,
    ) -> Result<Self> {
        let worker = info.worker;
        let started = host
            .call(
                worker,
                limits,
                Call::Start {
                    workers: info.workers,
                    pipeline: info.pipeline,
                    config: info.config,
                    inherit_stderr,
                    mesh: mesh.for_worker(worker),
                    component: component.to_owned(),
                },
            )
            .await?;
        let Answer::Started {
            store,
            log,
            commits,
        } = started
        else {
            return Err(unexpected(&host, "start"));
        };
        Ok(RemoteWorker {
            host,
            worker,
            limits,
            fuel_used: 0,
            store,
            commits: commits && log.is_some(),
            log,
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
            read: Vec::new(),
            share: None,
        };
        self.step_call(call).await.map(|s| s.outputs)
    }

    /// Steps on the input its host reads itself: offsets `read`; with
    /// `share`, the host commits the worker's share of the divided step
    /// itself.
    pub(crate) async fn step_reading(
        &mut self,
        step: u64,
        time_ms: u64,
        read: Vec<InputRange>,
        share: Option<ShareSpec>,
    ) -> Result<Stepped> {
        let call = Call::Step {
            step,
            time_ms,
            inputs: Vec::new(),
            read,
            share,
        };
        self.step_call(call).await
    }

    async fn step_call(&mut self, call: Call) -> Result<Stepped> {
        match self.host.call(self.worker, self.limits, call).await? {
            Answer::Stepped {
                outputs,
                fuel,
                events,
                shared,
            } => {
                self.fuel_used += fuel;
                Ok(Stepped {
                    outputs: outputs.into_iter().map(Into::into).collect(),
                    events,
                    shared,
                })
            }
            _ => Err(unexpected(&self.host, "step")),
        }
    }

    /// Has its host commit the share of divided step `step` it holds (a
    /// future that borrows nothing, so the shares commit side by side).
    pub(crate) fn commit_share(
        &self,
        step: u64,
    ) -> impl Future<Output = Result<ShareDone>> + Send + use<> {
        let (host, worker, limits) = (self.host.clone(), self.worker, self.limits);
        async move {
            match host
                .call(worker, limits, Call::CommitShare { step })
                .await?
            {
                Answer::Shared(done) => Ok(done),
                _ => Err(unexpected(&host, "commit-share")),
            }
        }
    }

    /// Where its host reads the pipeline's logs, if it does.
    pub(crate) fn log(&self) -> Option<&str> {
        self.log.as_deref()
    }

    /// Whether its host commits the worker's shares of divided steps (it
    /// may write the logs it reads).
    pub(crate) fn commits(&self) -> bool {
        self.commits
    }

    pub(crate) fn set_step_limits(&mut self, limits: StepLimits) {
        self.limits = limits;
    }

    pub(crate) fn take_fuel_used(&mut self) -> u64 {
        std::mem::take(&mut self.fuel_used)
    }

    /// Where its host keeps checkpoints, if it has a store.
    pub(crate) fn store(&self) -> Option<&str> {
        self.store.as_deref()
    }

    pub(crate) async fn snapshot(&mut self, changed_only: bool) -> Result<Snapshot> {
        let call = Call::Snapshot {
            changed_only,
            stage: None,
        };
        match self.host.call(self.worker, self.limits, call).await? {
            Answer::Snapshot { pieces, changed } => Ok(Snapshot {
                pieces: from_wire(pieces),
                changed,
            }),
            _ => Err(unexpected(&self.host, "snapshot")),
        }
    }

    /// Snapshots and has its host write the pieces to its checkpoint
    /// store for checkpoint `step`: where they lie, and which shards
    /// changed (with `changed_only`).
    pub(crate) async fn stage(
        &mut self,
        changed_only: bool,
        step: u64,
    ) -> Result<(Staged, Option<Vec<u32>>)> {
        let call = Call::Snapshot {
            changed_only,
            stage: Some(step),
        };
        match self.host.call(self.worker, self.limits, call).await? {
            Answer::Staged { staged, changed }
                if staged.step == step && staged.worker == self.worker =>
            {
                Ok((staged, changed))
            }
            _ => Err(unexpected(&self.host, "snapshot (staged)")),
        }
    }

    /// Has its host restore the worker's pieces of committed checkpoint
    /// `step` from its checkpoint store: what it read locally and fetched,
    /// or (inside) why the host could not read them — the instance is then
    /// untouched, and the pieces can be sent instead.
    pub(crate) async fn restore_from(
        &mut self,
        step: u64,
    ) -> Result<std::result::Result<ReadBytes, String>> {
        match self
            .host
            .call(self.worker, self.limits, Call::RestoreFrom { step })
            .await?
        {
            Answer::Restored { local, fetched } => Ok(Ok(ReadBytes { local, fetched })),
            Answer::Unread { message } => Ok(Err(message)),
            _ => Err(unexpected(&self.host, "restore (from the store)")),
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

    pub(crate) async fn relayout(&mut self, workers: u32, mesh: &MeshPlan) -> Result<()> {
        let call = Call::Relayout {
            workers,
            mesh: mesh.for_worker(self.worker),
        };
        match self.host.call(self.worker, self.limits, call).await? {
            Answer::Done => Ok(()),
            _ => Err(unexpected(&self.host, "set-workers")),
        }
    }

    pub(crate) async fn rewire(&mut self, mesh: &MeshPlan) -> Result<()> {
        let call = Call::Rewire {
            mesh: mesh.for_worker(self.worker),
        };
        match self.host.call(self.worker, self.limits, call).await? {
            Answer::Done => Ok(()),
            _ => Err(unexpected(&self.host, "rewire")),
        }
    }
}

impl Drop for RemoteWorker {
    fn drop(&mut self) {
        // Best effort: a host whose connection ended dropped it already.
        let id = self.host.next.fetch_add(1, Ordering::Relaxed);
        let stop = ToHost::Call {
            id,
            worker: self.worker,
            limits: self.limits,
            call: Call::Stop,
        };
        if let Err(mpsc::error::TrySendError::Full(stop)) = self.host.out.try_send(stop)
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let out = self.host.out.clone();
            rt.spawn(async move { out.send(stop).await });
        }
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

    pub(crate) async fn relayout(
        &mut self,
        workers: u32,
        exchange: &Arc<Exchange>,
        mesh: &MeshPlan,
    ) -> Result<()> {
        match self {
            AnyWorker::Local(w) => w.relayout(workers, exchange.clone()).await,
            AnyWorker::Remote(w) => w.relayout(workers, mesh).await,
        }
    }

    /// Shuffles through `exchange` (here) or as `mesh` says (there) from
    /// the next step on.
    pub(crate) async fn rewire(&mut self, exchange: &Arc<Exchange>, mesh: &MeshPlan) -> Result<()> {
        match self {
            AnyWorker::Local(w) => {
                w.rewire(exchange.clone());
                Ok(())
            }
            AnyWorker::Remote(w) => w.rewire(mesh).await,
        }
    }
}

/// Where a pipeline's workers run, for one exchange session: what the
/// coordinator tells each host it places workers on.
#[derive(Debug, Clone)]
pub(crate) struct MeshPlan {
    session: u64,
    slots: Vec<u32>,
    addrs: Vec<String>,
    owners: Vec<u32>,
}

impl MeshPlan {
    /// The slot worker `w` runs on.
    pub(crate) fn slot(&self, w: u32) -> u32 {
        self.slots.get(w as usize).copied().unwrap_or(0)
    }

    /// What the host of `worker` is told.
    fn for_worker(&self, worker: u32) -> WireMesh {
        WireMesh {
            session: self.session,
            slot: self.slots.get(worker as usize).copied().unwrap_or(0),
            slots: self.slots.clone(),
            addrs: self.addrs.clone(),
            owners: self.owners.clone(),
        }
    }
}

/// The first placement of `workers` workers with `hosts` other hosts:
/// worker `w` on slot `w mod (hosts + 1)` — slot 0 the coordinator's
/// process, slot `i` `hosts[i - 1]`.
pub(crate) fn round_robin(workers: u32, hosts: usize) -> Vec<u32> {
    (0..workers).map(|w| w % (hosts as u32 + 1)).collect()
}

/// The slot with the least workers (ties: the highest, so the
/// coordinator's own process is the last to take more).
fn least_loaded(load: &[u32]) -> usize {
    let min = load.iter().min().copied().unwrap_or(0);
    load.iter().rposition(|l| *l == min).unwrap_or(0)
}

/// The placement after the hosts change from `from` to `to` (addresses;
/// slot 0, this process, stays): every worker whose host stays keeps it,
/// the workers of hosts that left go to the least loaded slots, then
/// workers move from the most to the least loaded slot until no two slots
/// differ by more than one worker. So a host leaving moves only its own
/// workers, and a host joining takes only its share.
pub(crate) fn replace_placement(placement: &[u32], from: &[&str], to: &[&str]) -> Vec<u32> {
    let slots = to.len() + 1;
    let mut next: Vec<Option<usize>> = placement
        .iter()
        .map(|s| match *s as usize {
            0 => Some(0),
            s => from
                .get(s - 1)
                .and_then(|addr| to.iter().position(|a| a == addr))
                .map(|i| i + 1),
        })
        .collect();
    let mut load = vec![0u32; slots];
    for s in next.iter().flatten() {
        load[*s] += 1;
    }
    for slot in next.iter_mut().filter(|s| s.is_none()) {
        let s = least_loaded(&load);
        *slot = Some(s);
        load[s] += 1;
    }
    loop {
        let max = load.iter().max().copied().unwrap_or(0);
        let low = least_loaded(&load);
        if max <= load[low] + 1 {
            break;
        }
        let high = load.iter().rposition(|l| *l == max).unwrap_or(0);
        // The highest-numbered worker of the fullest slot moves.
        let Some(w) = next.iter().rposition(|s| *s == Some(high)) else {
            break;
        };
        next[w] = Some(low);
        load[high] -= 1;
        load[low] += 1;
    }
    next.into_iter().map(|s| s.unwrap_or(0) as u32).collect()
}

/// A slot for one more worker on `slots` slots placed as `placement`.
pub(crate) fn place_one(placement: &[u32], slots: usize) -> u32 {
    let mut load = vec![0u32; slots.max(1)];
    for s in placement {
        if let Some(l) = load.get_mut(*s as usize) {
            *l += 1;
        }
    }
    least_loaded(&load) as u32
}

/// The coordinator's exchange for `layout` with workers placed on slots
/// `placement` (slot 0 here, slot `i` `hosts[i - 1]`; a fresh session),
/// and the plan the hosts are told; the hosts' frames go to it from now on.
pub(crate) fn coordinator_exchange(
    layout: &Layout,
    hosts: &[Arc<RemoteHost>],
    placement: &[u32],
) -> Result<(Arc<Exchange>, MeshPlan)> {
    let slots: Vec<u32> = placement.to_vec();
    let session = if hosts.is_empty() {
        0
    } else {
        getrandom::u64()
            .map_err(|e| remote("the coordinator", format!("the OS random source: {e}")))?
    };
    let plan = MeshPlan {
        session,
        slots: slots.clone(),
        addrs: std::iter::once(String::new())
            .chain(hosts.iter().map(|h| h.addr.clone()))
            .collect(),
        owners: layout.shards.clone(),
    };
    let exchange = if hosts.is_empty() {
        Exchange::new(layout)
    } else {
        let links = std::iter::once(None)
            .chain(hosts.iter().map(|h| Some(h.link())))
            .collect();
        Exchange::across(
            layout,
            Placement {
                session,
                slot: 0,
                slots,
                links,
            },
        )
    };
    for h in hosts {
        h.set_exchange(exchange.clone());
    }
    Ok((exchange, plan))
}

/// Queues `msg` on `out`, waiting while the queue is full; `false` if the
/// connection ended (before or while waiting).
async fn send_unless_gone(
    out: &mpsc::Sender<ToHost>,
    msg: ToHost,
    gone: &tokio::sync::watch::Receiver<bool>,
) -> bool {
    let mut gone = gone.clone();
    tokio::select! {
        sent = out.send(msg) => sent.is_ok(),
        _ = gone.wait_for(|g| *g) => false,
    }
}

/// The coordinator's way to a host's exchange: its connection.
struct CoordinatorToHost {
    out: mpsc::Sender<ToHost>,
    gone: tokio::sync::watch::Receiver<bool>,
    addr: String,
}

#[async_trait::async_trait]
impl Link for CoordinatorToHost {
    async fn send(&self, frame: Frame) -> std::result::Result<(), String> {
        if send_unless_gone(&self.out, ToHost::Mesh(frame.into()), &self.gone).await {
            Ok(())
        } else {
            Err(format!("the connection to host {} has ended", self.addr))
        }
    }
}

/// A host's way to the coordinator's exchange: the coordinator's
/// connection.
struct HostToCoordinator {
    out: mpsc::Sender<FromHost>,
}

#[async_trait::async_trait]
impl Link for HostToCoordinator {
    async fn send(&self, frame: Frame) -> std::result::Result<(), String> {
        self.out
            .send(FromHost::Mesh(frame.into()))
            .await
            .map_err(|_| "the coordinator's connection has ended".to_owned())
    }
}

/// What a peer link carries.
#[derive(Debug, Serialize, Deserialize)]
enum ToPeer {
    Mesh(WireFrame),
    Heartbeat,
}

/// A host's direct way to another host's exchange: a connection of its
/// own, opened when the exchange is made, carrying frames one way. If it
/// fails, the exchange fails (and tells the others).
struct PeerLink {
    queue: mpsc::Sender<Frame>,
    addr: String,
    task: tokio::task::AbortHandle,
}

impl Drop for PeerLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PeerLink {
    fn open(
        addr: String,
        host: &WorkerHost,
        exchange: Arc<OnceLock<Weak<Exchange>>>,
    ) -> Arc<PeerLink> {
        let (queue, mut frames) = mpsc::channel::<Frame>(QUEUE);
        let (pipeline, secret, sent, tls) = (
            host.pipeline.clone(),
            host.secret.clone(),
            host.peer_bytes.clone(),
            host.tls.clone(),
        );
        let to = addr.clone();
        let task = tokio::spawn(async move {
            let run = async {
                let (mut r, mut w) =
                    tokio::time::timeout(Duration::from_secs(10), dial(&to, tls.as_ref()))
                        .await
                        .map_err(|_| std::io::Error::other("connecting timed out"))??;
                tokio::time::timeout(
                    Duration::from_secs(10),
                    handshake(&mut r, &mut w, &secret, &pipeline, "peer"),
                )
                .await
                .map_err(|_| std::io::Error::other("the handshake timed out"))??;
                let mut beat = tokio::time::interval(HEARTBEAT);
                loop {
                    let msg = tokio::select! {
                        f = frames.recv() => match f {
                            Some(f) => ToPeer::Mesh(f.into()),
                            None => return Ok(()),
                        },
                        _ = beat.tick() => ToPeer::Heartbeat,
                    };
                    let n = write_frame(&mut w, &msg).await?;
                    sent.fetch_add(n, Ordering::Relaxed);
                }
            };
            let result: std::io::Result<()> = run.await;
            if let Err(e) = result
                && let Some(x) = exchange.get().and_then(Weak::upgrade)
            {
                x.link_failed(format!("the link to host {to}: {e}"));
            }
        });
        Arc::new(PeerLink {
            queue,
            addr,
            task: task.abort_handle(),
        })
    }
}

#[async_trait::async_trait]
impl Link for PeerLink {
    async fn send(&self, frame: Frame) -> std::result::Result<(), String> {
        self.queue
            .send(frame)
            .await
            .map_err(|_| format!("the link to host {} is down", self.addr))
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
    /// The exchanges of this host's workers, by session: where frames from
    /// other hosts go.
    exchanges: Mutex<HashMap<u64, Weak<Exchange>>>,
    /// Bytes sent to other hosts over peer links.
    peer_bytes: Arc<AtomicU64>,
    /// Mutual TLS on every connection, if set.
    tls: Option<Tls>,
    /// What this host reaches of the pipeline's storage.
    reach: Reach,
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
        Arc::new(WorkerHost {
            tls,
            reach,
            engine: engine.with_limits(engine.limits()),
            component: component.clone(),
            pipeline: pipeline.to_owned(),
            secret: secret.to_vec(),
            current: Mutex::new(None),
            exchanges: Mutex::default(),
            peer_bytes: Arc::default(),
        })
    }

    /// Bytes this host sent other hosts' exchanges directly (frames with
    /// their length prefixes), so far.
    pub fn peer_traffic(&self) -> u64 {
        self.peer_bytes.load(Ordering::Relaxed)
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
                    tracing::warn!(%peer, error = %e, "a connection failed");
                }
            });
        }
    }

    async fn accept(self: Arc<Self>, stream: TcpStream) -> Result<()> {
        let (mut r, mut w) = tokio::time::timeout(
            Duration::from_secs(10),
            answer_on(stream, self.tls.as_ref()),
        )
        .await
        .map_err(|_| remote("a coordinator", "the TLS handshake timed out"))?
        .map_err(io_error("a coordinator"))?;
        let role = tokio::time::timeout(
            Duration::from_secs(10),
            handshake(&mut r, &mut w, &self.secret, &self.pipeline, "host"),
        )
        .await
        .map_err(|_| remote("a coordinator", "the handshake timed out"))?
        .map_err(io_error("a coordinator"))?;
        if role == "peer" {
            return self.serve_peer(r).await;
        }
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

    /// Takes another host's exchange frames until it goes quiet for a
    /// while or closes the link.
    async fn serve_peer(&self, mut r: Reader) -> Result<()> {
        loop {
            let msg = match tokio::time::timeout(HEARTBEAT * 20, read_frame::<ToPeer>(&mut r)).await
            {
                Ok(Ok(m)) => m,
                Ok(Err(_)) | Err(_) => return Ok(()),
            };
            if let ToPeer::Mesh(frame) = msg {
                self.route(frame);
            }
        }
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
    fn exchange_for(
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
                if slot == mesh.slot || !mesh.slots.contains(&slot) {
                    None
                } else if slot == 0 {
                    Some(Arc::new(HostToCoordinator {
                        out: to_coordinator.clone(),
                    }))
                } else {
                    Some(PeerLink::open(addr.clone(), self, cell.clone()))
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
                links,
            }),
        );
        let _ = cell.set(Arc::downgrade(&x));
        all.insert(mesh.session, Arc::downgrade(&x));
        x
    }

    async fn serve_connection(self: Arc<Self>, mut r: Reader, mut w: Writer) -> Result<()> {
        let (out, mut queue) = mpsc::channel::<FromHost>(QUEUE);
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
                ToHost::Mesh(frame) => self.route(frame),
                ToHost::Locality { id, step } => {
                    let (store, out) = (self.reach.checkpoints.clone(), out.clone());
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
                    if let Call::Stop = call {
                        workers.remove(&worker);
                        continue;
                    }
                    if let Call::Start { .. } = call {
                        let (tx, rx) = mpsc::unbounded_channel();
                        workers.insert(worker, tx);
                        let task = tokio::spawn(self.clone().run_worker(worker, rx, out.clone()));
                        tasks.push(AbortOnDrop(task.abort_handle()));
                    }
                    match workers.get(&worker) {
                        Some(tx) => {
                            let _ = tx.send((id, limits, call));
                        }
                        None => {
                            let answer = FromHost::Answer {
                                id,
                                result: Err(CallError {
                                    message: format!("worker {worker} is not running here"),
                                    guest: false,
                                    exchange: false,
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

    /// Runs one worker's calls in order until the coordinator stops it or
    /// goes away.
    async fn run_worker(
        self: Arc<Self>,
        index: u32,
        mut calls: mpsc::UnboundedReceiver<(u64, StepLimits, Call)>,
        out: mpsc::Sender<FromHost>,
    ) {
        let mut worker: Option<Worker> = None;
        let mut share = Share::default();
        while let Some((id, limits, call)) = calls.recv().await {
            let result = self
                .answer(index, &mut worker, &mut share, limits, call, &out)
                .await;
            let result = result.map_err(|e| CallError {
                // Either would fail again anywhere.
                guest: matches!(e, Error::Guest(_) | Error::Nondeterministic { .. }),
                exchange: e.kind() == "exchange",
                message: e.to_string(),
            });
            if out.send(FromHost::Answer { id, result }).await.is_err() {
                return;
            }
        }
    }

    async fn answer(
        &self,
        index: u32,
        worker: &mut Option<Worker>,
        share: &mut Share,
        limits: StepLimits,
        call: Call,
        out: &mpsc::Sender<FromHost>,
    ) -> Result<Answer> {
        if let Call::Start {
            workers,
            pipeline,
            config,
            inherit_stderr,
            mesh,
            component,
        } = call
        {
            if component != self.component.hash {
                return Err(Error::Config(sluice_core::ConfigError::Invalid(format!(
                    "this host runs component {}, the coordinator {component}: every host of \
                     a pipeline must run the same",
                    self.component.hash
                ))));
            }
            let info = WorkerInfo {
                worker: index,
                workers,
                pipeline,
                config,
            };
            let exchange = self.exchange_for(mesh, out);
            let mut started = Worker::start(
                &self.engine,
                &self.component,
                info,
                Some(exchange),
                inherit_stderr,
            )
            .await?;
            if limits != StepLimits::default() {
                started.set_step_limits(limits);
            }
            *worker = Some(started);
            // A new session: the worker is taken anew when it first commits.
            *share = Share::default();
            return Ok(Answer::Started {
                store: self.reach.checkpoints.as_ref().and_then(|c| c.location()),
                log: self.reach.log.as_ref().and_then(|l| l.location()),
                commits: !self.reach.read_only_log,
            });
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
                read,
                share: spec,
            } => {
                let exchange = w.exchange();
                if let Some(x) = &exchange {
                    x.begin_step(step);
                }
                let mut batches: Vec<Batch> = Vec::new();
                let mut read_failed = None;
                if !read.is_empty() {
                    match self.read_input(read).await {
                        Ok(b) => batches = b,
                        Err(e) => read_failed = Some(e),
                    }
                }
                let events: u64 = batches.iter().map(|b| b.weights.len() as u64).sum();
                batches.extend(inputs.into_iter().map(Into::into));
                let stepped = match read_failed {
                    // The exchange learns of it below, like a step failure.
                    Some(e) => Err(e),
                    None => w.step(step, time_ms, batches).await,
                };
                if let Some(x) = &exchange {
                    x.worker_finished(index);
                    if let Err(e) = &stepped {
                        x.worker_failed(index, &e.to_string());
                    }
                }
                let fuel = w.take_fuel_used();
                match spec {
                    None => Answer::Stepped {
                        outputs: stepped?.into_iter().map(Into::into).collect(),
                        fuel,
                        events,
                        shared: None,
                    },
                    Some(spec) => {
                        let now = spec.now;
                        let commit = share_of(index, step, spec, stepped?)?;
                        let done = ShareDone::of(&commit);
                        // Taken now (which ends an earlier holder's open
                        // transaction), committed now or when told.
                        self.take(index, share).await?;
                        share.held = Some(commit);
                        if now {
                            self.commit_held(index, step, share).await?;
                        }
                        Answer::Stepped {
                            outputs: Vec::new(),
                            fuel,
                            events,
                            shared: Some(done),
                        }
                    }
                }
            }
            Call::CommitShare { step } => {
                let done = self.commit_held(index, step, share).await?;
                Answer::Shared(done)
            }
            Call::Snapshot {
                changed_only,
                stage: None,
            } => {
                let s = w.snapshot(changed_only).await?;
                Answer::Snapshot {
                    pieces: to_wire(s.pieces),
                    changed: s.changed,
                }
            }
            Call::Snapshot {
                changed_only,
                stage: Some(step),
            } => {
                let store = self.store()?;
                let s = w.snapshot(changed_only).await?;
                let staged =
                    tokio::task::spawn_blocking(move || store.stage(step, index, &s.pieces))
                        .await
                        .map_err(Error::task("staging a checkpoint"))??;
                Answer::Staged {
                    staged,
                    changed: s.changed,
                }
            }
            Call::RestoreFrom { step } => {
                // A read that fails leaves the instance untouched: say so,
                // and the coordinator sends the pieces instead.
                let read = match self.store() {
                    Ok(store) => {
                        tokio::task::spawn_blocking(move || store.worker_pieces(step, index))
                            .await
                            .map_err(Error::task("reading a checkpoint"))
                            .and_then(|r| r.map_err(Error::from))
                    }
                    Err(e) => Err(e),
                };
                let (pieces, ReadBytes { local, fetched }) = match read {
                    Ok(Some(read)) => read,
                    Ok(None) => {
                        return Ok(Answer::Unread {
                            message: format!(
                                "checkpoint {step} is not in this host's checkpoint store"
                            ),
                        });
                    }
                    Err(e) => {
                        return Ok(Answer::Unread {
                            message: e.to_string(),
                        });
                    }
                };
                let pieces: Vec<(u32, Vec<u8>)> =
                    pieces.into_iter().map(|p| (p.shard, p.state)).collect();
                if !pieces.is_empty() {
                    w.restore(pieces).await?;
                }
                Answer::Restored { local, fetched }
            }
            Call::Restore { pieces } => {
                w.restore(from_wire(pieces)).await?;
                Answer::Done
            }
            Call::Export { shards } => Answer::Pieces(to_wire(w.export_shards(&shards).await?)),
            Call::Relayout { workers, mesh } => {
                let exchange = self.exchange_for(mesh, out);
                w.relayout(workers, exchange).await?;
                Answer::Done
            }
            Call::Rewire { mesh } => {
                w.rewire(self.exchange_for(mesh, out));
                Answer::Done
            }
        })
    }
}

impl WorkerHost {
    /// Takes the worker for its shares of divided steps, unless this
    /// session took it already: fences every earlier holder.
    async fn take(&self, index: u32, share: &mut Share) -> Result<()> {
        if share.holder.is_some() {
            return Ok(());
        }
        if self.reach.read_only_log {
            return Err(Error::Storage(sluice_storage::StorageError::Config(
                sluice_core::ConfigError::Invalid(format!(
                    "worker {index}'s share was sent to a host that may not write the \
                     pipeline's logs (--read-only-log)"
                )),
            )));
        }
        let log = self.log()?;
        let holder = tokio::task::spawn_blocking(move || log.take_worker(index))
            .await
            .map_err(Error::task("taking a worker"))??;
        share.holder = Some(holder);
        Ok(())
    }

    /// Commits the share of divided step `step` the worker holds (unless
    /// its done record exists: then checked against it).
    async fn commit_held(&self, index: u32, step: u64, share: &mut Share) -> Result<ShareDone> {
        let Some(commit) = share.held.take().filter(|c| c.step == step) else {
            return Err(Error::Storage(
                sluice_storage::StorageError::InvalidCommit {
                    step,
                    message: format!("worker {index} holds no share of step {step}"),
                },
            ));
        };
        // The step that computed the share took the worker.
        let Some(mut holder) = share.holder.take() else {
            return Err(Error::WorkersLost);
        };
        let done = ShareDone::of(&commit);
        let (holder, committed) = tokio::task::spawn_blocking(move || {
            let committed = holder.commit(&commit);
            (holder, committed)
        })
        .await
        .map_err(Error::task("committing a worker's share"))?;
        // Kept whatever happened: a holder that failed stays failed (it
        // never takes the worker back by itself); a new session takes anew.
        share.holder = Some(holder);
        committed.map_err(share_error)?;
        Ok(done)
    }

    /// The pipeline's logs, or why a call that needs them fails.
    fn log(&self) -> Result<Arc<dyn LogBackend>> {
        self.reach.log.clone().ok_or_else(|| {
            Error::Storage(sluice_storage::StorageError::Config(
                sluice_core::ConfigError::Invalid(
                    "this host reads none of the pipeline's logs (start it with the pipeline's \
                     --brokers)"
                        .into(),
                ),
            ))
        })
    }

    /// Reads a worker's input ranges from the pipeline's logs.
    async fn read_input(&self, read: Vec<InputRange>) -> Result<Vec<Batch>> {
        let log = self.log()?;
        tokio::task::spawn_blocking(move || read_batches(&*log, &read, true))
            .await
            .map_err(Error::task("reading input"))?
    }

    /// The checkpoint store, or why a call that needs one fails.
    fn store(&self) -> Result<Arc<dyn CheckpointStore>> {
        self.reach.checkpoints.clone().ok_or_else(|| {
            Error::Storage(sluice_storage::StorageError::Config(
                sluice_core::ConfigError::Invalid(
                    "this host reaches no checkpoint store (start it with the pipeline's --store)"
                        .into(),
                ),
            ))
        })
    }
}

/// A worker's share of divided steps on its host: the holder of the
/// worker (taken at the session's first divided step) and the share
/// computed but not committed yet.
#[derive(Default)]
struct Share {
    holder: Option<Box<dyn WorkerCommitter>>,
    held: Option<WorkerCommit>,
}

/// A worker's output of divided step `step` as its share: checked, hashed,
/// its entries tagged with the step, the worker and its frontier.
fn share_of(index: u32, step: u64, spec: ShareSpec, batches: Vec<Batch>) -> Result<WorkerCommit> {
    let out = convert_output(&spec.checks, index, step, batches)?;
    let outputs = spec.outputs.into_iter().zip(out.ports);
    Ok(WorkerCommit::new(
        step,
        index,
        &spec.frontier,
        outputs,
        out.hash,
    ))
}

impl ShareDone {
    /// What a share reports back: its hash and its events.
    fn of(commit: &WorkerCommit) -> Self {
        ShareDone {
            hash: commit.hash,
            events: commit.events(),
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loads(placement: &[u32], slots: usize) -> Vec<u32> {
        let mut l = vec![0; slots];
        for s in placement {
            l[*s as usize] += 1;
        }
        l
    }

    fn moved(a: &[u32], from: &[&str], b: &[u32], to: &[&str]) -> usize {
        let addr = |s: u32, hosts: &[&str]| (s > 0).then(|| hosts[s as usize - 1].to_owned());
        a.iter()
            .zip(b)
            .filter(|(x, y)| addr(**x, from) != addr(**y, to))
            .count()
    }

    #[test]
    fn a_joining_host_takes_its_share_and_a_leaving_one_gives_only_its_own() {
        // W = 6 on the coordinator and one host: 3 and 3.
        let two = round_robin(6, 1);
        assert_eq!(loads(&two, 2), [3, 3]);
        // A host joins: it takes two workers, one from each.
        let three = replace_placement(&two, &["a"], &["a", "b"]);
        assert_eq!(loads(&three, 3), [2, 2, 2]);
        assert_eq!(moved(&two, &["a"], &three, &["a", "b"]), 2);
        // Another joins: 6 on 4 slots moves one (the ideal is 1.5).
        let four = replace_placement(&three, &["a", "b"], &["a", "b", "c"]);
        assert_eq!(loads(&four, 4).iter().max(), Some(&2));
        assert_eq!(moved(&three, &["a", "b"], &four, &["a", "b", "c"]), 1);
        // Host "a" leaves: only its workers move.
        let left = replace_placement(&four, &["a", "b", "c"], &["b", "c"]);
        let a_had = four.iter().filter(|s| **s == 1).count();
        assert_eq!(moved(&four, &["a", "b", "c"], &left, &["b", "c"]), a_had);
        assert_eq!(loads(&left, 3), [2, 2, 2]);
        // The same hosts: nothing moves.
        assert_eq!(replace_placement(&left, &["b", "c"], &["b", "c"]), left);
    }

    #[test]
    fn an_added_worker_goes_to_the_least_loaded_slot() {
        assert_eq!(place_one(&[0, 1, 0], 3), 2);
        assert_eq!(place_one(&[0, 1, 2], 3), 2);
        assert_eq!(place_one(&[], 1), 0);
    }
}
