//! How hosts reach each other: TCP, optionally mutual TLS ([`Tls`]), frames
//! of postcard with a length prefix, the HMAC-SHA256 handshake that proves
//! both ends know the pipeline's secret, and the timing and queue bounds of
//! every connection.

use crate::error::{Error, Result};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How often a host tells the coordinator it is alive.
pub const HEARTBEAT: Duration = Duration::from_millis(500);

/// How many frames a connection's outgoing queue holds before senders wait.
pub const QUEUE: usize = 64;

/// The largest frame either end accepts (a worker's whole snapshot travels
/// in one).
pub(crate) const MAX_FRAME: u64 = 8 << 30;

/// The protocol version both ends must speak.
pub(crate) const VERSION: u32 = 5;

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

/// Writes one frame; returns its size on the wire.
pub(crate) async fn write_frame<T: Serialize>(w: &mut Writer, value: &T) -> std::io::Result<u64> {
    let bytes = postcard::to_allocvec(value)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    w.write_all(&(bytes.len() as u64).to_le_bytes()).await?;
    w.write_all(&bytes).await?;
    w.flush().await?;
    Ok(bytes.len() as u64 + 8)
}

pub(crate) async fn read_frame<T: for<'de> Deserialize<'de>>(r: &mut Reader) -> std::io::Result<T> {
    read_sized(r).await.map(|(v, _)| v)
}

/// Reads one frame, with its size on the wire.
pub(crate) async fn read_sized<T: for<'de> Deserialize<'de>>(
    r: &mut Reader,
) -> std::io::Result<(T, u64)> {
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
/// end's role once both proofs checked.
pub(crate) async fn handshake(
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
