//! A worker host's accept loop: at most so many connections at once (one
//! more is closed at once, before a byte is read), and a failed `accept`
//! — out of file descriptors, a connection reset before it was taken — is
//! retried with a short backoff instead of ending the server. Only a
//! listener that is unusable (or fails every accept for
//! [`GIVE_UP`]) ends it, and then the caller hears of it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The first wait after a failed accept; doubled up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(10);

/// The longest wait between accepts that fail.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// A listener whose every accept failed for this long is broken: serving
/// ends (and the host leaves its group).
pub(crate) const GIVE_UP: Duration = Duration::from_secs(60);

/// Where connections come from (a [`tokio::net::TcpListener`]).
#[async_trait::async_trait]
pub(crate) trait Accepting: Send {
    async fn accept(&mut self) -> std::io::Result<(TcpStream, SocketAddr)>;
}

#[async_trait::async_trait]
impl Accepting for tokio::net::TcpListener {
    async fn accept(&mut self) -> std::io::Result<(TcpStream, SocketAddr)> {
        tokio::net::TcpListener::accept(self).await
    }
}

/// Whether a failed accept means the listener itself is unusable (not a
/// listening socket), rather than one connection or a passing shortage.
fn fatal(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::InvalidInput | std::io::ErrorKind::Unsupported
    )
}

/// Takes connections from `listener` and hands each to `handle` (with a
/// permit of `cap`, held while the connection is served) until the
/// listener is unusable; a connection over the cap is closed at once.
pub(crate) async fn accept_loop<A, F, Fut>(
    mut listener: A,
    cap: Arc<Semaphore>,
    limit: usize,
    handle: F,
) -> std::io::Result<()>
where
    A: Accepting,
    F: Fn(TcpStream, SocketAddr, OwnedSemaphorePermit) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut connections = tokio::task::JoinSet::new();
    let mut backoff = BACKOFF_MIN;
    let mut failing_since: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(a) => {
                backoff = BACKOFF_MIN;
                failing_since = None;
                a
            }
            Err(e) if fatal(&e) => return Err(e),
            Err(e) => {
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= GIVE_UP {
                    return Err(std::io::Error::new(
                        e.kind(),
                        format!("every accept failed for {:?}: {e}", since.elapsed()),
                    ));
                }
                tracing::warn!(error = %e, retry_in = ?backoff, "accepting a connection failed; serving on");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let Ok(permit) = cap.clone().try_acquire_owned() else {
            tracing::warn!(%peer, limit, "too many connections at once: one more closed");
            drop(stream);
            continue;
        };
        connections.spawn(handle(stream, peer, permit));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A listener whose first accepts fail as a process out of file
    /// descriptors does, then as a connection aborted before it was taken.
    struct Flaky {
        errors: Vec<std::io::Error>,
        real: tokio::net::TcpListener,
    }

    #[async_trait::async_trait]
    impl Accepting for Flaky {
        async fn accept(&mut self) -> std::io::Result<(TcpStream, SocketAddr)> {
            match self.errors.pop() {
                Some(e) => Err(e),
                None => self.real.accept().await,
            }
        }
    }

    /// Failed accepts (EMFILE, ECONNABORTED) do not end the server; a
    /// connection over the cap is closed at once while those under it
    /// are served. (Before, the first failed accept ended the server, and
    /// there was no cap.)
    #[tokio::test]
    async fn failed_accepts_are_retried_and_connections_over_the_cap_closed() {
        let real = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = real.local_addr().unwrap();
        let listener = Flaky {
            errors: vec![
                std::io::Error::from(std::io::ErrorKind::ConnectionAborted),
                std::io::Error::from_raw_os_error(24), // EMFILE
            ],
            real,
        };
        let server = tokio::spawn(accept_loop(
            listener,
            Arc::new(Semaphore::new(2)),
            2,
            |mut stream: TcpStream, _, permit| async move {
                // An echo held open until the client closes.
                let _permit = permit;
                let mut b = [0u8; 1];
                while let Ok(1) = stream.read(&mut b).await {
                    let _ = stream.write_all(&b).await;
                }
            },
        ));
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(b"x").await.unwrap();
            let mut b = [0u8; 1];
            tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut b))
                .await
                .expect("served")
                .unwrap();
            held.push(c);
        }
        let mut third = TcpStream::connect(addr).await.unwrap();
        let _ = third.write_all(b"x").await;
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut b))
            .await
            .expect("closed at once");
        assert!(
            matches!(n, Ok(0) | Err(_)),
            "the third is not served: {n:?}"
        );
        // One leaves: a new one is served again.
        drop(held.pop());
        let served = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let mut c = TcpStream::connect(addr).await.unwrap();
                c.write_all(b"x").await.unwrap();
                if let Ok(1) = c.read(&mut b).await {
                    return c;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(served.is_ok(), "served again once under the cap");
        assert!(!server.is_finished(), "the server still runs");
        server.abort();
    }
}
