//! A TCP fault proxy: a forwarder on a loopback port in front of one
//! server (a host's worker server, etcd, the S3 server) that can fail the
//! network between its clients and that server the ways a real one fails:
//!
//! - **off**: every connection it carries ends, and every new one is
//!   closed at once, as a server that went away (closed, not refused: the
//!   proxy still accepts);
//! - **hold** one direction: nothing of that way arrives until it heals,
//!   then all of it in order (a one-way partition under TCP, which
//!   retransmits: bytes are never lost or misframed, only late; new
//!   connections still complete their handshake);
//! - **delay**: every chunk arrives this much after it was sent (the
//!   latency, not the throughput);
//! - **reset**: every connection open now ends (new ones pass);
//! - **half-open**: every connection open now goes silent for good, both
//!   ways, its sockets left open (new ones pass).
//!
//! Threads and blocking sockets: the proxy must not share a runtime with
//! what it tests. Its threads end when it is dropped.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What the proxy does to the bytes now.
#[derive(Default)]
struct Faults {
    /// Ends every connection, closes new ones.
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

impl Faults {
    /// Whether connection `number` is to end now.
    fn ends(&self, number: u64) -> bool {
        self.off.load(Ordering::SeqCst)
            || self.stop.load(Ordering::SeqCst)
            || number < self.reset_below.load(Ordering::SeqCst)
    }
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
        let addr = listener.local_addr().unwrap().to_string();
        listener.set_nonblocking(true).unwrap();
        let faults = Arc::new(Faults::default());
        let (upstream, f) = (upstream.to_owned(), faults.clone());
        std::thread::spawn(move || {
            while !f.stop.load(Ordering::SeqCst) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                };
                // Numbered at once: a reset or half-open cut after this
                // accept covers it.
                let number = f.next.fetch_add(1, Ordering::SeqCst);
                if f.off.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let (f, upstream) = (f.clone(), upstream.clone());
                std::thread::spawn(move || {
                    let _ = client.set_nonblocking(false);
                    let Ok(server) = TcpStream::connect(&upstream) else {
                        let _ = client.shutdown(Shutdown::Both);
                        return;
                    };
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                        return;
                    };
                    for (from, to, inward) in [(c2, s2, true), (server, client, false)] {
                        let f = f.clone();
                        std::thread::spawn(move || pump(from, to, inward, number, &f));
                    }
                });
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

    /// Delays every chunk read from now on, both ways, by `delay` (zero:
    /// none; chunks on their way keep theirs).
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
/// TCP's would); a silent one is never read again nor closed. Each chunk
/// is written by a second thread when it is due (read + the delay then).
fn pump(mut from: TcpStream, to: TcpStream, inward: bool, number: u64, f: &Arc<Faults>) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
    let held = if inward { &f.hold_in } else { &f.hold_out };
    let (chunks, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = {
        let (f, to) = (f.clone(), to.try_clone());
        std::thread::spawn(move || {
            if let Ok(to) = to {
                deliver(to, &due, number, &f);
            }
        })
    };
    let mut buf = vec![0u8; 64 * 1024];
    while !f.ends(number) {
        if held.load(Ordering::SeqCst) || number < f.silent_below.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let delay = Duration::from_millis(f.delay_ms.load(Ordering::SeqCst));
                if chunks
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    // The writer delivers what was read (unless the connection ends), then
    // both sides close.
    drop(chunks);
    let _ = writer.join();
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Writes each chunk from `due` to `to` when it is due, until the channel
/// closes or connection `number` is to end; a write that blocks (a peer
/// that reads nothing) is retried, never stuck past the end.
fn deliver(mut to: TcpStream, due: &mpsc::Receiver<(Instant, Vec<u8>)>, number: u64, f: &Faults) {
    let _ = to.set_write_timeout(Some(Duration::from_millis(50)));
    while let Ok((at, chunk)) = due.recv() {
        while Instant::now() < at {
            if f.ends(number) {
                return;
            }
            std::thread::sleep((at - Instant::now()).min(Duration::from_millis(20)));
        }
        let mut written = 0;
        while written < chunk.len() {
            if f.ends(number) {
                return;
            }
            match to.write(&chunk[written..]) {
                Ok(0) => return,
                Ok(n) => written += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => return,
            }
        }
    }
}
