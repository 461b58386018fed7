//! The worker hosts of the campaign across hosts ([`hosts`](super::hosts)):
//! each a [`WorkerHost`] on loopback TCP behind a proxy the campaign
//! controls. The proxy can hold every byte (a stalled host), and — for the
//! network campaign — cut one direction (a one-way partition: the
//! connection stays up, nothing of that way arrives until it heals, then
//! all of it in order, as TCP retransmits it), delay every byte, reset every
//! connection, or leave the connections open now half-open for good (they
//! carry nothing, ever, and report nothing; new ones work).

use sluice_runtime::{HostOptions, LoadedComponent, Reach, SluiceEngine, WorkerHost};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The secret the hosts and the coordinator share.
pub(super) const SECRET: &[u8] = b"the campaign's shared secret";

/// What the proxy in front of a host does to its bytes now.
#[derive(Default)]
pub(super) struct Net {
    /// Set: the proxy holds every byte (the host stalls).
    pub(super) frozen: AtomicBool,
    /// Set: bytes into the host (from the coordinator and its peers) do
    /// not arrive until it is cleared (then they do, in order).
    pub(super) drop_in: AtomicBool,
    /// Set: bytes out of the host (its answers and heartbeats) do not
    /// arrive until it is cleared (then they do, in order).
    pub(super) drop_out: AtomicBool,
    /// Every byte is held this long before it goes on, ms.
    pub(super) delay_ms: AtomicU64,
    /// Bumped to reset every connection open now.
    pub(super) resets: AtomicU64,
    /// Bumped to leave every connection open now half-open: it carries
    /// nothing more and is never closed.
    pub(super) cuts: AtomicU64,
}

impl Net {
    /// Ends every fault but the half-open connections (which stay dead, as
    /// a peer's crashed kernel leaves them).
    pub(super) fn heal(&self) {
        self.frozen.store(false, Ordering::Relaxed);
        self.drop_in.store(false, Ordering::Relaxed);
        self.drop_out.store(false, Ordering::Relaxed);
        self.delay_ms.store(0, Ordering::Relaxed);
    }
}

/// A worker host behind a proxy the campaign controls.
pub(super) struct Host {
    /// The proxy's address: the host's as the coordinator sees it.
    pub(super) addr: String,
    /// Set: the proxy holds every byte (the host stalls).
    pub(super) frozen: Arc<AtomicBool>,
    /// The network faults the proxy applies.
    pub(super) net: Arc<Net>,
    server: tokio::task::JoinHandle<()>,
    proxy: tokio::task::JoinHandle<()>,
}

impl Drop for Host {
    fn drop(&mut self) {
        self.server.abort();
        self.proxy.abort();
    }
}

/// Which way a pump copies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    /// Into the host.
    In,
    /// Out of the host.
    Out,
}

/// Copies `from` to `to` until either ends, applying the faults `frozen`
/// and `net` say: held while frozen or while this way is cut, delayed,
/// ended by a reset, silent for good once cut.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
    net: Arc<Net>,
    way: Way,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (resets, cuts) = (
        net.resets.load(Ordering::Relaxed),
        net.cuts.load(Ordering::Relaxed),
    );
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let read = tokio::select! {
            r = from.read(&mut buf) => r,
            // A reset ends the connection even while nothing flows.
            _ = async {
                while net.resets.load(Ordering::Relaxed) == resets {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            } => return,
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while frozen.load(Ordering::Relaxed) || net.frozen.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let delay = net.delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if net.resets.load(Ordering::Relaxed) != resets {
            return;
        }
        // A one-way partition: TCP retransmits what the network drops, so
        // nothing of this way arrives until it heals, then all of it, in
        // order. (Discarding bytes mid-stream would model no real network:
        // the stream would go on misframed, which TCP and TLS rule out.)
        let held = || match way {
            Way::In => net.drop_in.load(Ordering::Relaxed),
            Way::Out => net.drop_out.load(Ordering::Relaxed),
        };
        while held() {
            if net.resets.load(Ordering::Relaxed) != resets {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Half-open: the connection carries nothing, ever again.
        if net.cuts.load(Ordering::Relaxed) != cuts {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Starts a worker host for `pipeline` (its storage as `reach` gives it,
/// its connections lost after `session` of silence, as the coordinator's)
/// behind a proxy of its own.
pub(super) async fn start_host(
    engine: &SluiceEngine,
    component: &LoadedComponent,
    pipeline: &str,
    reach: &dyn Fn() -> anyhow::Result<Reach>,
    session: Duration,
) -> anyhow::Result<Host> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let target = listener.local_addr()?;
    let options = HostOptions {
        reach: reach()?,
        session_timeout: session,
        ..HostOptions::default()
    };
    let host = WorkerHost::with_options(engine, component, pipeline, SECRET, options);
    let server = tokio::spawn(async move {
        let _ = host.serve(listener).await;
    });
    let front = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = front.local_addr()?.to_string();
    let frozen = Arc::new(AtomicBool::new(false));
    let net = Arc::new(Net::default());
    let (f, n) = (frozen.clone(), net.clone());
    let proxy = tokio::spawn(async move {
        let mut pumps = tokio::task::JoinSet::new();
        while let Ok((client, _)) = front.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(target).await else {
                continue;
            };
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            pumps.spawn(pump(cr, sw, f.clone(), n.clone(), Way::In));
            pumps.spawn(pump(sr, cw, f.clone(), n.clone(), Way::Out));
        }
    });
    Ok(Host {
        addr,
        frozen,
        net,
        server,
        proxy,
    })
}
