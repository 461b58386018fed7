//! The ways between hosts' exchanges ([`Link`]s): the coordinator's
//! connection to a host, a host's connection back to the coordinator, and
//! the direct link a host opens to another host (a *peer link*). Each
//! sends frames through a bounded queue (backpressure), and a peer link that
//! fails fails its exchange.

use super::frames::write_frame;
use super::transport::{QUEUE, Tls, dial, handshake, heartbeat};
use super::wire::{FromHost, ToHost, ToPeer};
use crate::exchange::{Exchange, Frame, Link};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;
use tokio::sync::mpsc;

/// Queues `msg` on `out`, waiting while the queue is full; `false` if the
/// connection ended (before or while waiting).
pub(crate) async fn send_unless_gone(
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
pub(crate) struct CoordinatorToHost {
    pub(crate) out: mpsc::Sender<ToHost>,
    pub(crate) gone: tokio::sync::watch::Receiver<bool>,
    pub(crate) addr: String,
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

    fn peer(&self) -> String {
        format!("host {}", self.addr)
    }
}

/// A host's way to the coordinator's exchange: the coordinator's
/// connection.
pub(crate) struct HostToCoordinator {
    pub(crate) out: mpsc::Sender<FromHost>,
}

#[async_trait::async_trait]
impl Link for HostToCoordinator {
    async fn send(&self, frame: Frame) -> std::result::Result<(), String> {
        self.out
            .send(FromHost::Mesh(frame.into()))
            .await
            .map_err(|_| "the coordinator's connection has ended".to_owned())
    }

    fn peer(&self) -> String {
        "the coordinator".into()
    }
}

/// How a host dials its peers: as a host of `pipeline`, proving `secret`,
/// over `tls` if set; the bytes it sends are counted in `sent`.
#[derive(Clone)]
pub(crate) struct PeerDial {
    /// The pipeline's name.
    pub(crate) pipeline: String,
    /// The pipeline's shared secret.
    pub(crate) secret: Vec<u8>,
    /// Mutual TLS, if the hosts speak it.
    pub(crate) tls: Option<Tls>,
    /// Bytes sent over peer links so far.
    pub(crate) sent: Arc<AtomicU64>,
    /// Connecting, the handshake and every write fail when they make no
    /// progress for this long (the session timeout).
    pub(crate) timeout: Duration,
}

/// A host's direct way to another host's exchange: a connection of its
/// own, opened when the exchange is made, carrying frames one way. If it
/// fails, the exchange fails (and tells the others).
pub(crate) struct PeerLink {
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
    /// Opens the link to the host at `addr` (slot `to_slot`) as `dial`
    /// says, feeding its exchange of `session` from slot `from`, its frames
    /// counted in `dial.sent`; a failure loses that slot in the exchange in
    /// `exchange` (set once that exchange exists): the step fails, unless
    /// other replicas of its workers go on ([`Exchange::slot_lost`]).
    pub(crate) fn open(
        addr: String,
        to_slot: u32,
        dial_as: &PeerDial,
        exchange: Arc<OnceLock<Weak<Exchange>>>,
        session: u64,
        from: u32,
    ) -> Arc<PeerLink> {
        let (queue, mut frames) = mpsc::channel::<Frame>(QUEUE);
        let PeerDial {
            pipeline,
            secret,
            tls,
            sent,
            timeout,
        } = dial_as.clone();
        let to = addr.clone();
        let task = tokio::spawn(async move {
            let run = async {
                let (mut r, mut w) = tokio::time::timeout(timeout, dial(&to, tls.as_ref()))
                    .await
                    .map_err(|_| std::io::Error::other("connecting timed out"))??;
                tokio::time::timeout(
                    timeout,
                    handshake(&mut r, &mut w, &secret, &pipeline, "peer", timeout),
                )
                .await
                .map_err(|_| std::io::Error::other("the handshake timed out"))??;
                let mut msg = ToPeer::Open { session, from };
                let mut beat = tokio::time::interval(heartbeat(timeout));
                beat.tick().await;
                loop {
                    let n = write_frame(&mut w, &msg, timeout).await?;
                    sent.fetch_add(n, Ordering::Relaxed);
                    msg = tokio::select! {
                        f = frames.recv() => match f {
                            Some(f) => ToPeer::Mesh(f.into()),
                            None => return Ok(()),
                        },
                        _ = beat.tick() => ToPeer::Heartbeat,
                    };
                }
            };
            let result: std::io::Result<()> = run.await;
            if let Err(e) = result
                && let Some(x) = exchange.get().and_then(Weak::upgrade)
            {
                let why = format!("the link to host {to}: {e}");
                x.slot_lost(to_slot, crate::error::ExchangeError::Aborted(why));
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

    fn close(&self) {
        self.task.abort();
    }

    fn peer(&self) -> String {
        format!("host {}", self.addr)
    }
}
