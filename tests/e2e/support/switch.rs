//! A TCP forwarder in front of a server the tests share (etcd), that can
//! be switched off: while off it ends every connection it carries and
//! every new one at once, as a server that went away — without stopping
//! the server the other tests use.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A forwarder on a loopback port to one upstream address.
pub struct Switch {
    addr: String,
    off: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Switch {
    /// Forwards a fresh loopback port to `upstream` (`host:port`).
    pub fn start(upstream: &str) -> Switch {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        listener.set_nonblocking(true).unwrap();
        let (off, stop) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (upstream, flags) = (upstream.to_owned(), (off.clone(), stop.clone()));
        std::thread::spawn(move || {
            let (off, stop) = flags;
            while !stop.load(Ordering::SeqCst) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    Err(_) => continue,
                };
                if off.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let (off, stop) = (off.clone(), stop.clone());
                    std::thread::spawn(move || pump(from, to, &off, &stop));
                }
            }
        });
        Switch { addr, off, stop }
    }

    /// The forwarder's address, `127.0.0.1:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Switches it off (every connection ends, new ones too) or on.
    pub fn set_off(&self, off: bool) {
        self.off.store(off, Ordering::SeqCst);
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either ends or the switch goes off (then
/// both are shut down).
fn pump(mut from: TcpStream, mut to: TcpStream, off: &AtomicBool, stop: &AtomicBool) {
    from.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut buf = [0u8; 16 * 1024];
    loop {
        if off.load(Ordering::SeqCst) || stop.load(Ordering::SeqCst) {
            break;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
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
