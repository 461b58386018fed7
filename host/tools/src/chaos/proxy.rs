//! The worker hosts of the campaign across hosts ([`hosts`](super::hosts)):
//! each a [`WorkerHost`] on loopback TCP behind a proxy that can hold its
//! bytes (a stalled host).

use sluice_runtime::{LoadedComponent, Reach, SluiceEngine, WorkerHost};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The secret the hosts and the coordinator share.
pub(super) const SECRET: &[u8] = b"the campaign's shared secret";

/// A worker host behind a proxy that can hold its bytes.
pub(super) struct Host {
    /// The proxy's address: the host's as the coordinator sees it.
    pub(super) addr: String,
    /// Set: the proxy holds every byte (the host stalls).
    pub(super) frozen: Arc<AtomicBool>,
    server: tokio::task::JoinHandle<()>,
    proxy: tokio::task::JoinHandle<()>,
}

impl Drop for Host {
    fn drop(&mut self) {
        self.server.abort();
        self.proxy.abort();
    }
}

/// Copies `from` to `to` until either ends, holding the bytes while
/// `frozen` is set.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while frozen.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Starts a worker host for `pipeline` (its storage as `reach` gives it)
/// behind a proxy of its own.
pub(super) async fn start_host(
    engine: &SluiceEngine,
    component: &LoadedComponent,
    pipeline: &str,
    reach: &dyn Fn() -> anyhow::Result<Reach>,
) -> anyhow::Result<Host> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let target = listener.local_addr()?;
    let host = WorkerHost::new_with(engine, component, pipeline, SECRET, None, reach()?);
    let server = tokio::spawn(async move {
        let _ = host.serve(listener).await;
    });
    let front = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = front.local_addr()?.to_string();
    let frozen = Arc::new(AtomicBool::new(false));
    let f = frozen.clone();
    let proxy = tokio::spawn(async move {
        let mut pumps = tokio::task::JoinSet::new();
        while let Ok((client, _)) = front.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(target).await else {
                continue;
            };
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            pumps.spawn(pump(cr, sw, f.clone()));
            pumps.spawn(pump(sr, cw, f.clone()));
        }
    });
    Ok(Host {
        addr,
        frozen,
        server,
        proxy,
    })
}
