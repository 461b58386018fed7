//! How hosts reach each other: TCP, optionally mutual TLS ([`Tls`]), the
//! HMAC-SHA256 handshake that proves both ends know the pipeline's secret
//! (its frames bounded small: nothing large is read before the proof), and
//! the timing and queue bounds of every connection. The frames themselves
//! are [`frames`](super::frames)'.

use super::frames::{HANDSHAKE_MAX, read_frame_within, write_frame};
use crate::error::{Error, Result};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// How often a host tells the coordinator it is alive (and the
/// coordinator, and a peer link, the other end): at most; see
/// [`heartbeat`].
pub const HEARTBEAT: Duration = Duration::from_millis(500);

/// The heartbeat of a connection lost after `session` of silence:
/// [`HEARTBEAT`], or a quarter of `session` when that is shorter — an idle
/// end must be heard from well within the other's timeout, or waiting on a
/// third host (a stalled one, given up after `session`) would lose the
/// healthy connections too.
pub fn heartbeat(session: Duration) -> Duration {
    HEARTBEAT.min(session / 4).max(Duration::from_millis(1))
}

/// How long a connection may deliver nothing — no frame, no heartbeat, not
/// one byte of a frame — before it is taken for lost, unless the host is
/// told otherwise (`sluice host --session-timeout-ms`).
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(3);

/// How many connections a worker host serves at once (coordinators, peer
/// links, and connections still proving themselves); one more is closed
/// at once.
pub const MAX_CONNECTIONS: usize = 256;

/// How many frames a connection's outgoing queue holds before senders wait.
pub const QUEUE: usize = 64;

/// The protocol version both ends must speak. (6: the coordinator
/// heartbeats to its hosts, and a peer link first says which exchange
/// session and slot it feeds. 7: an input range carries its bad-record
/// policy, and a step's answer the records its worker skipped. 8: an
/// exchange failure names the slot whose silence caused it. 9: a restore
/// may go through the circuit's `upgrade`, after a change of component.
/// 10: a kept instance names its component; a host runs several.)
pub(crate) const VERSION: u32 = 10;

/// The handshake: who speaks, for which pipeline, with which nonce.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Hello {
    version: u32,
    pipeline: String,
    /// Who speaks: "coordinator", "peer" (another host's exchange) or
    /// "host" (the end that accepted).
    role: String,
    nonce: [u8; 32],
}

/// Proves knowledge of the secret for the other end's nonce.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Proof {
    mac: Vec<u8>,
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
pub(crate) type Reader = Box<dyn tokio::io::AsyncRead + Send + Unpin>;

/// The writing end of a connection.
pub(crate) type Writer = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// Opens a connection to `addr`: TCP, and TLS over it when `tls` is given
/// (the host's certificate must name `addr`'s host).
pub(crate) async fn dial(addr: &str, tls: Option<&Tls>) -> std::io::Result<(Reader, Writer)> {
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
pub(crate) async fn answer_on(
    stream: TcpStream,
    tls: Option<&Tls>,
) -> std::io::Result<(Reader, Writer)> {
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

/// The HMAC-SHA256, keyed by the pipeline's secret, of who proves (its
/// role), for which pipeline, over the other end's nonce.
pub(crate) fn keyed(secret: &[u8], role: &str, pipeline: &str, nonce: &[u8; 32]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key");
    for part in [role.as_bytes(), &[0], pipeline.as_bytes(), &[0], nonce] {
        m.update(part);
    }
    m
}

pub(crate) fn mac(secret: &[u8], role: &str, pipeline: &str, nonce: &[u8; 32]) -> Vec<u8> {
    keyed(secret, role, pipeline, nonce)
        .finalize()
        .into_bytes()
        .to_vec()
}

pub(crate) fn verify(
    secret: &[u8],
    role: &str,
    pipeline: &str,
    nonce: &[u8; 32],
    proof: &[u8],
) -> bool {
    keyed(secret, role, pipeline, nonce)
        .verify_slice(proof)
        .is_ok()
}

pub(crate) fn nonce() -> std::io::Result<[u8; 32]> {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n)
        .map_err(|e| std::io::Error::other(format!("the OS random source: {e}")))?;
    Ok(n)
}

/// Mutual authentication over a fresh connection. `role` is this end's
/// ("coordinator" or "peer" dialing, "host" accepting); returns the other
/// end's role once both proofs checked. Every frame read is at most
/// [`HANDSHAKE_MAX`] bytes (a longer one is refused before it is read) and
/// each read fails when nothing arrives for `idle`.
pub(crate) async fn handshake<R, W>(
    r: &mut R,
    w: &mut W,
    secret: &[u8],
    pipeline: &str,
    role: &str,
    idle: Duration,
) -> std::io::Result<String>
where
    R: tokio::io::AsyncRead + Unpin + ?Sized,
    W: tokio::io::AsyncWrite + Unpin + ?Sized,
{
    let mine = nonce()?;
    write_frame(
        w,
        &Hello {
            version: VERSION,
            pipeline: pipeline.to_owned(),
            role: role.to_owned(),
            nonce: mine,
        },
        idle,
    )
    .await?;
    let (theirs, _): (Hello, u64) = read_frame_within(r, idle, HANDSHAKE_MAX, &mut || {}).await?;
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
        idle,
    )
    .await?;
    let (proof, _): (Proof, u64) = read_frame_within(r, idle, HANDSHAKE_MAX, &mut || {}).await?;
    if !verify(secret, &theirs.role, pipeline, &mine, &proof.mac) {
        return Err(refuse(
            "the other end does not know the pipeline's secret".into(),
        ));
    }
    Ok(theirs.role)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Whoever connects and announces a 1 GiB Hello is refused as soon as
    /// the length is read, the error naming the bound: nothing of it is
    /// awaited or allocated before any proof. (Before, the host allocated
    /// the length it was sent, up to 8 GiB, and waited for the body.)
    #[tokio::test]
    async fn a_huge_hello_is_refused_before_it_is_read() {
        let (mut near, far) = tokio::io::duplex(1 << 10);
        let (mut far_r, mut far_w) = tokio::io::split(far);
        far_w.write_all(&(1u64 << 30).to_le_bytes()).await.unwrap();
        // Drain what the host says, as a client would.
        let drain = tokio::spawn(async move {
            let mut sink = Vec::new();
            let _ = far_r.read_to_end(&mut sink).await;
        });
        let (mut r, mut w) = tokio::io::split(&mut near);
        let err = tokio::time::timeout(
            Duration::from_secs(5),
            handshake(
                &mut r,
                &mut w,
                b"secret",
                "p",
                "host",
                Duration::from_secs(60),
            ),
        )
        .await
        .expect("refused at once")
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("1073741824"), "{text}");
        assert!(text.contains(&format!("at most {HANDSHAKE_MAX}")), "{text}");
        drop(far_w);
        drain.abort();
    }
}
