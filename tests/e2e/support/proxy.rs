//! A TCP fault proxy: a forwarder on a loopback port in front of one
//! server (a host's worker server, etcd, the S3 server, a broker) that can
//! fail the network between its clients and that server the ways a real
//! one fails:
//!
//! - **off**: every connection it carries ends, and every new one at once,
//!   as a server that went away;
//! - **hold** one direction: nothing of that way arrives until it heals,
//!   then all of it in order (a one-way partition under TCP, which
//!   retransmits: bytes are never lost or misframed, only late);
//! - **delay**: every chunk arrives this much later;
//! - **reset**: every connection open now ends (new ones pass);
//! - **half-open**: every connection open now goes silent for good, both
//!   ways, its sockets left open (new ones pass).
//!
//! Threads and blocking sockets: the proxy must not share a runtime with
//! what it tests.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// What the proxy does to the bytes now.
#[derive(Default)]
struct Faults {
    /// Ends every connection, refuses new ones.
    off: AtomicBool,
    /// Holds the client → server direction.
    hold_in: AtomicBool,
    /// Holds the server → client direction.
    hold_out: AtomicBool,
    /// Delays every chunk by this many milliseconds (0: none).
    delay_ms: AtomicU64,
    /// Connections numbered below this end (reset).
    reset_below: AtomicU64,
    /// Connections numbered below this go silent for good (half-open).
    silent_below: AtomicU64,
    /// The number of the next connection.
    next: AtomicU64,
    /// The proxy is dropped.
    stop: AtomicBool,
}

/// A forwarder on a loopback port to one upstream address.
pub struct Proxy {
    addr: String,
    faults: Arc<Faults>,
}

impl Proxy {
    /// Forwards a fresh loopback port to `upstream` (`host:port`).
    pub fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        Self::serve(listener, upstream)
    }

    /// Forwards `listener`'s connections to `upstream`.
    pub fn serve(listener: TcpListener, upstream: &str) -> Proxy {
        let addr = listener.local_addr().unwrap().to_string();
        listener.set_nonblocking(true).unwrap();
        let faults = Arc::new(Faults::default());
        let (upstream, f) = (upstream.to_owned(), faults.clone());
        std::thread::spawn(move || {
            while !f.stop.load(Ordering::SeqCst) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    Err(_) => continue,
                };
                if f.off.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let _ = client.set_nonblocking(false);
                let Ok(server) = TcpStream::connect(&upstream) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let number = f.next.fetch_add(1, Ordering::SeqCst);
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                for (from, to, inward) in [(c2, s2, true), (server, client, false)] {
                    let f = f.clone();
                    std::thread::spawn(move || pump(from, to, inward, number, &f));
                }
            }
        });
        Proxy { addr, faults }
    }

    /// The proxy's address, `127.0.0.1:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Switches it off (every connection ends, new ones too) or on.
    pub fn set_off(&self, off: bool) {
        self.faults.off.store(off, Ordering::SeqCst);
    }

    /// Holds (or releases) the client → server direction.
    pub fn hold_in(&self, hold: bool) {
        self.faults.hold_in.store(hold, Ordering::SeqCst);
    }

    /// Holds (or releases) the server → client direction.
    pub fn hold_out(&self, hold: bool) {
        self.faults.hold_out.store(hold, Ordering::SeqCst);
    }

    /// Delays every chunk both ways by `delay` (zero: none).
    pub fn delay(&self, delay: Duration) {
        let ms = delay.as_millis() as u64;
        self.faults.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Ends every connection open now; new ones pass.
    pub fn reset(&self) {
        let now = self.faults.next.load(Ordering::SeqCst);
        self.faults.reset_below.fetch_max(now, Ordering::SeqCst);
    }

    /// Every connection open now goes silent for good, its sockets open;
    /// new ones pass.
    pub fn half_open(&self) {
        let now = self.faults.next.load(Ordering::SeqCst);
        self.faults.silent_below.fetch_max(now, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.faults.stop.store(true, Ordering::SeqCst);
    }
}

/// Copies one direction of connection `number` (`inward`: client to
/// server) until either side ends, the proxy is switched off or the
/// connection reset (then both sides are shut down). A held direction is
/// not read (its bytes wait in the kernel and the sender's buffers, as
/// TCP's would); a silent one is never read again nor closed.
fn pump(mut from: TcpStream, mut to: TcpStream, inward: bool, number: u64, f: &Faults) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
    let held = if inward { &f.hold_in } else { &f.hold_out };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if f.off.load(Ordering::SeqCst)
            || f.stop.load(Ordering::SeqCst)
            || number < f.reset_below.load(Ordering::SeqCst)
        {
            break;
        }
        if held.load(Ordering::SeqCst) || number < f.silent_below.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let delay = f.delay_ms.load(Ordering::SeqCst);
                if delay > 0 {
                    std::thread::sleep(Duration::from_millis(delay));
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
