//! The coordinator's side of the hosts: its connection to each host that
//! serves workers ([`RemoteHost`]: calls and answers, heartbeats, traffic
//! counts) and each worker running there ([`RemoteWorker`]), driven as a
//! local [`Worker`](crate::Worker) is.

use super::frames::{MAX_FRAME, read_frame_within, write_frame};
use super::links::{CoordinatorToHost, send_unless_gone};
use super::placement::MeshPlan;
use super::transport::{QUEUE, Tls, dial, handshake, heartbeat};
use super::wire::{
    Answer, Call, CallError, FromHost, ShareDone, ShareSpec, StepMark, ToHost, WireParked,
    from_wire, to_wire,
};
use crate::bindings::Batch;
use crate::error::{Error, Result};
use crate::exchange::{Exchange, Link};
use crate::step_io::{DeadLetters, InputRange, WorkerOutput};
use crate::worker::{Snapshot, WorkerInfo};
use sluice_core::StepLimits;
use sluice_storage::{ReadBytes, Staged};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// What a worker's step gave.
pub(crate) struct Stepped {
    /// Its output (none when its host committed the share).
    pub outputs: Vec<Batch>,
    /// The input events its host read.
    pub events: u64,
    /// The share its host committed.
    pub shared: Option<ShareDone>,
    /// The input records it skipped (committed with the share, when its
    /// host committed one).
    pub dead_letters: DeadLetters,
    /// Its output, checked and hashed on the worker's own task (then
    /// `outputs` is empty): a local worker's, so that workers' outputs are
    /// checked side by side.
    pub checked: Option<WorkerOutput>,
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

/// The exchange a host's frames go to, and the host's slot in it.
type HostExchange = Arc<Mutex<Option<(Arc<Exchange>, u32)>>>;

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
    /// The exchange the host's frames go to (the coordinator's current
    /// one), and the host's slot in it.
    exchange: HostExchange,
    /// The connection is lost when the host sends nothing for this long.
    session_timeout: Duration,
    /// Why the connection ended, once it has.
    closed: Arc<Mutex<Option<String>>>,
    /// Turns true when the connection ends: a sender waiting on the full
    /// queue gives up.
    gone: tokio::sync::watch::Receiver<bool>,
    /// Bytes sent to the host and received from it.
    traffic: Arc<Traffic>,
    tasks: Vec<tokio::task::AbortHandle>,
    /// Cut off as a dead coordinator's would be ([`sever`](Self::sever)):
    /// its workers are not told to stop.
    severed: std::sync::atomic::AtomicBool,
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
    ///
    /// Both ends heartbeat; a read that receives nothing — not a byte —
    /// for `session_timeout` fails the connection, while a large frame
    /// that keeps arriving is read however long it takes.
    pub async fn connect_with(
        addr: &str,
        pipeline: &str,
        secret: &[u8],
        tls: Option<&Tls>,
        session_timeout: Duration,
    ) -> Result<Arc<RemoteHost>> {
        let (mut r, mut w) = tokio::time::timeout(session_timeout, dial(addr, tls))
            .await
            .map_err(|_| Error::remote(addr, "connecting timed out"))?
            .map_err(Error::remote_io(addr))?;
        tokio::time::timeout(
            session_timeout,
            handshake(
                &mut r,
                &mut w,
                secret,
                pipeline,
                "coordinator",
                session_timeout,
            ),
        )
        .await
        .map_err(|_| Error::remote(addr, "the handshake timed out"))?
        .map_err(Error::remote_io(addr))?;
        let (out, mut queue) = mpsc::channel::<ToHost>(QUEUE);
        let pending: Pending = Arc::default();
        let closed: Arc<Mutex<Option<String>>> = Arc::default();
        let exchange: HostExchange = Arc::default();
        let (gone_tx, gone) = tokio::sync::watch::channel(false);
        let gone_tx = Arc::new(gone_tx);
        let close = {
            let (pending, closed) = (pending.clone(), closed.clone());
            let exchange = exchange.clone();
            let addr = addr.to_owned();
            move |why: String| {
                gone_tx.send_replace(true);
                // The exchange hears of it at once: without replicas (or
                // without another of its workers' replicas) the step fails.
                let x = exchange.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if let Some((x, slot)) = x {
                    let message = format!("host {addr}: {why}");
                    x.slot_lost(slot, crate::error::ExchangeError::Aborted(message));
                }
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
                        refused: false,
                        silent_slot: None,
                    }));
                }
            }
        };
        let traffic: Arc<Traffic> = Arc::default();
        let writer = {
            let (close, traffic) = (close.clone(), traffic.clone());
            tokio::spawn(async move {
                // The host drops a coordinator it hears nothing from.
                let mut beat = tokio::time::interval(heartbeat(session_timeout));
                loop {
                    let msg = tokio::select! {
                        m = queue.recv() => match m { Some(m) => m, None => return },
                        _ = beat.tick() => ToHost::Heartbeat,
                    };
                    match write_frame(&mut w, &msg, session_timeout).await {
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
                // Every byte from the host: its slot heard from.
                let mut heard = {
                    let exchange = exchange.clone();
                    move || {
                        let x = exchange.lock().unwrap_or_else(|p| p.into_inner()).clone();
                        if let Some((x, slot)) = x {
                            x.heard_from(slot);
                        }
                    }
                };
                loop {
                    let read = read_frame_within(&mut r, session_timeout, MAX_FRAME, &mut heard);
                    let msg = match read.await {
                        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                            close(format!(
                                "the host sent nothing for {session_timeout:?} (its session \
                                 timeout): it is stalled or cut off"
                            ));
                            return;
                        }
                        Err(e) => {
                            close(format!("the connection to the host ended: {e}"));
                            return;
                        }
                        Ok((msg, n)) => {
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
                            if let Some((x, _)) = x {
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
            session_timeout,
            closed,
            gone,
            traffic,
            tasks: vec![writer.abort_handle(), reader.abort_handle()],
            severed: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// Ends the connection as the death of the coordinator's process
    /// would: nothing more is sent (no worker is told to stop), and the
    /// host keeps its workers for the next coordinator. For fault
    /// campaigns and tests ([`Coordinator::crash`](crate::Coordinator::crash)).
    pub fn sever(&self) {
        self.severed.store(true, Ordering::SeqCst);
        for t in &self.tasks {
            t.abort();
        }
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

    /// Sends the host's exchange frames to `exchange` from now on, where
    /// the host is slot `slot`.
    pub(crate) fn set_exchange(&self, exchange: Arc<Exchange>, slot: u32) {
        *self.exchange.lock().unwrap_or_else(|p| p.into_inner()) = Some((exchange, slot));
    }

    /// How long the host may send nothing before it is taken for lost.
    pub fn session_timeout(&self) -> Duration {
        self.session_timeout
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
        match self.ask(|id| ToHost::Locality { id, step }).await? {
            Answer::Locality(held) => Ok(held),
            _ => Err(unexpected(self, "locality")),
        }
    }

    /// Asks the host itself (not one of its workers) what `msg` asks.
    async fn ask(&self, msg: impl FnOnce(u64) -> ToHost) -> Result<Answer> {
        if let Some(why) = self.closed() {
            return Err(Error::remote(&self.addr, why));
        }
        let (id, rx) = register(&self.pending, &self.next);
        let ended = || Error::remote(&self.addr, "the connection to the host has ended");
        if !send_unless_gone(&self.out, msg(id), &self.gone).await {
            return Err(ended());
        }
        match rx.await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(Error::remote(&self.addr, e.message)),
            Err(_) => Err(ended()),
        }
    }

    /// The workers the host kept when an earlier coordinator's connection
    /// ended, for this one to adopt ([`RemoteWorker::adopt`]).
    pub(crate) async fn parked(&self) -> Result<Vec<WireParked>> {
        match self.ask(|id| ToHost::Parked { id }).await? {
            Answer::Parked(kept) => Ok(kept),
            _ => Err(unexpected(self, "parked")),
        }
    }

    /// Has the host drop the workers it kept from an earlier coordinator
    /// (best effort: a host whose connection ended dropped them when
    /// another coordinator started workers there, or will when they have
    /// waited too long).
    pub(crate) async fn drop_parked(&self) {
        let _ = send_unless_gone(&self.out, ToHost::DropParked, &self.gone).await;
    }

    async fn call(&self, worker: u32, limits: StepLimits, call: Call) -> Result<Answer> {
        if let Some(why) = self.closed() {
            return Err(Error::remote(&self.addr, why));
        }
        let (id, rx) = register(&self.pending, &self.next);
        let msg = ToHost::Call {
            id,
            worker,
            limits,
            call: Box::new(call),
        };
        if !send_unless_gone(&self.out, msg, &self.gone).await {
            return Err(Error::remote(
                &self.addr,
                "the connection to the host has ended",
            ));
        }
        let answer = rx
            .await
            .map_err(|_| Error::remote(&self.addr, "the connection to the host has ended"))?;
        answer.map_err(|e| Error::Remote {
            host: self.addr.clone(),
            message: format!("worker {worker}: {}", e.message),
            guest: e.guest,
            exchange: e.exchange,
            refused: e.refused,
            silent_slot: e.silent_slot,
        })
    }
}

/// What a coordinator adopting a kept worker says of it
/// ([`RemoteWorker::adopt`]).
pub(crate) struct Adopt {
    /// The epoch this coordinator recorded the step the worker holds in,
    /// if it did (the step was in flight when the one before went).
    pub(crate) recorded: Option<u64>,
    /// Where the coordinator saw it.
    pub(crate) at: StepMark,
    /// The coordinator's component (its SHA-256) and the pipeline's
    /// settings.
    pub(crate) component: String,
    pub(crate) config: Vec<(String, String)>,
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
    Error::remote(&host.addr, format!("an answer that does not fit `{call}`"))
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
                    mesh: mesh.for_host(host.addr()),
                    component: component.to_owned(),
                },
            )
            .await?;
        Self::started(host, worker, limits, started, "start")
    }

    /// The worker a start or an adoption (`call`) answered with `answer`.
    fn started(
        host: Arc<RemoteHost>,
        worker: u32,
        limits: StepLimits,
        answer: Answer,
        call: &str,
    ) -> Result<Self> {
        let Answer::Started {
            store,
            log,
            commits,
        } = answer
        else {
            return Err(unexpected(&host, call));
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

    /// Adopts worker `worker`, which `host` kept from an earlier
    /// coordinator, exchanging as `mesh` places it, under `limits`.
    /// The host refuses if the instance is not as `adopt` says.
    pub(crate) async fn adopt(
        host: Arc<RemoteHost>,
        worker: u32,
        mesh: &MeshPlan,
        limits: StepLimits,
        adopt: Adopt,
    ) -> Result<Self> {
        let Adopt {
            recorded,
            at,
            component,
            config,
        } = adopt;
        let call = Call::Adopt {
            mesh: mesh.for_host(host.addr()),
            recorded,
            at,
            component,
            config,
        };
        let answer = host.call(worker, limits, call).await?;
        Self::started(host, worker, limits, answer, "adopt")
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

    /// Steps a follower (a replica beside the worker's primary) on
    /// `inputs` and on the offsets `read` its host reads itself: the host
    /// holds the output as a follower's share (`spec`) and reports only
    /// its hash.
    pub(crate) async fn step_follower(
        &mut self,
        step: u64,
        time_ms: u64,
        inputs: Vec<Batch>,
        read: Vec<InputRange>,
        spec: ShareSpec,
    ) -> Result<Stepped> {
        let call = Call::Step {
            step,
            time_ms,
            inputs: inputs.into_iter().map(Into::into).collect(),
            read,
            share: Some(ShareSpec {
                follow: true,
                ..spec
            }),
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
                dead_letters,
            } => {
                self.fuel_used += fuel;
                Ok(Stepped {
                    outputs: outputs.into_iter().map(Into::into).collect(),
                    events,
                    shared,
                    dead_letters,
                    checked: None,
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
    /// `step` from its checkpoint store (through the circuit's `upgrade`,
    /// these operators starting empty, with `upgrade`): what it read
    /// locally and fetched, or (inside) why the host could not read them —
    /// the instance is then untouched, and the pieces can be sent instead.
    pub(crate) async fn restore_from(
        &mut self,
        step: u64,
        upgrade: Option<Vec<String>>,
    ) -> Result<std::result::Result<ReadBytes, String>> {
        match self
            .host
            .call(
                self.worker,
                self.limits,
                Call::RestoreFrom { step, upgrade },
            )
            .await?
        {
            Answer::Restored { local, fetched } => Ok(Ok(ReadBytes { local, fetched })),
            Answer::Unread { message } => Ok(Err(message)),
            _ => Err(unexpected(&self.host, "restore (from the store)")),
        }
    }

    pub(crate) async fn restore(&mut self, pieces: Vec<(u32, Vec<u8>)>) -> Result<()> {
        self.restore_as(pieces, None).await
    }

    /// Has the worker take pieces another component snapshotted (an
    /// upgrade) through the circuit's `upgrade`, the operators in
    /// `start_empty` starting empty.
    pub(crate) async fn upgrade(
        &mut self,
        pieces: Vec<(u32, Vec<u8>)>,
        start_empty: Vec<String>,
    ) -> Result<()> {
        self.restore_as(pieces, Some(start_empty)).await
    }

    async fn restore_as(
        &mut self,
        pieces: Vec<(u32, Vec<u8>)>,
        upgrade: Option<Vec<String>>,
    ) -> Result<()> {
        let call = Call::Restore {
            pieces: to_wire(pieces),
            upgrade,
        };
        match self.host.call(self.worker, self.limits, call).await? {
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
            mesh: mesh.for_host(self.host.addr()),
        };
        match self.host.call(self.worker, self.limits, call).await? {
            Answer::Done => Ok(()),
            _ => Err(unexpected(&self.host, "set-workers")),
        }
    }

    pub(crate) async fn rewire(&mut self, mesh: &MeshPlan) -> Result<()> {
        let call = Call::Rewire {
            mesh: mesh.for_host(self.host.addr()),
        };
        match self.host.call(self.worker, self.limits, call).await? {
            Answer::Done => Ok(()),
            _ => Err(unexpected(&self.host, "rewire")),
        }
    }
}

impl Drop for RemoteWorker {
    fn drop(&mut self) {
        if self.host.severed.load(Ordering::SeqCst) {
            return;
        }
        // Best effort: a host whose connection ended dropped it already.
        let id = self.host.next.fetch_add(1, Ordering::Relaxed);
        let stop = ToHost::Call {
            id,
            worker: self.worker,
            limits: self.limits,
            call: Box::new(Call::Stop),
        };
        if let Err(mpsc::error::TrySendError::Full(stop)) = self.host.out.try_send(stop)
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let out = self.host.out.clone();
            rt.spawn(async move { out.send(stop).await });
        }
    }
}
