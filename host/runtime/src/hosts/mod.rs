//! Workers on other hosts.
//!
//! A pipeline across several hosts runs one [`Coordinator`](crate::Coordinator)
//! (on the host that leads) and some of its W workers on each host. Every
//! other host runs a [`WorkerHost`]: it listens on TCP, and the coordinator
//! connects to it ([`RemoteHost::connect`]) and drives its workers there as
//! it drives its own — start, step, snapshot, restore, hand shards off —
//! through [`RemoteWorker`]s. The step protocol does not change: the
//! coordinator divides, every worker runs the step, the coordinator commits
//! every worker's output and the step record in one transaction (Kafka's,
//! fenced by the transactional id), so a host that is cut off, stalls or
//! comes back as a zombie can commit nothing.
//!
//! **The exchange** runs on every host for its own workers, host to host:
//! each host's [`Exchange`] sends every other host one frame per round with
//! what its workers sent that host's workers — to the coordinator over its
//! connection, to any other host over a direct connection made for the
//! purpose (a *peer link*, opened when the coordinator places workers).
//! Received events are concatenated in global worker order, so routing and
//! order are exactly those of one host and a replay on any placement of
//! workers computes the same outputs (I4). Every exchange placement has a
//! session number: frames of an older one are dropped.
//!
//! **Backpressure**: every connection's outgoing queue is bounded
//! ([`QUEUE`] frames); a sender waits while it is full, so a slow host slows
//! its senders instead of growing their memory.
//!
//! **Authentication**: both ends prove they know the pipeline's shared
//! secret (HMAC-SHA256 over the other's random nonce, the prover's role and
//! the pipeline's name) before anything else is read. With [`Tls`] every
//! connection is also mutual TLS (rustls): encrypted, and both ends present
//! a certificate of the pipeline's certificate authority — for hosts on a
//! network you do not trust. Without it frames travel in the clear: run
//! hosts on a private network (or a tunnel).
//!
//! **Liveness**: both ends of every connection (the coordinator's, each
//! peer link) send a heartbeat every [`HEARTBEAT`], and every read is
//! bounded by progress: a connection that delivers nothing — no frame, no
//! heartbeat, not a byte of a large frame — for the session timeout is
//! lost. The coordinator then fails every call in flight on it (which
//! fails the step); a host fails the exchanges it fed, and they tell the
//! other hosts. A large frame that keeps arriving is never cut. A host
//! accepts one coordinator at a time: a new connection replaces the one
//! before. The workers of a connection that ended are kept for a while,
//! for the next coordinator to adopt ([`Coordinator::open_on`] checks each
//! against the step log: a new leader then restores and replays nothing);
//! a coordinator that starts workers on the host drops them.
//!
//! [`Coordinator::open_on`]: crate::Coordinator::open_on
//!
//! **The listener** reads at most [`HANDSHAKE_MAX`](frames::HANDSHAKE_MAX)
//! bytes a frame before the other end proved it knows the secret, serves
//! at most [`MAX_CONNECTIONS`] connections at once, and retries a failed
//! accept.
//!
//! The files, bottom up: `wire` (every message), `frames` (frames read and
//! written by progress, their bounds), `transport` (TLS, the handshake),
//! `links` (the exchange's ways between hosts), `listener` (the accept
//! loop),
//! `placement` (which slot each worker runs on), `client` (the
//! coordinator's [`RemoteHost`] and [`RemoteWorker`]), `server`
//! ([`WorkerHost`]), `kept` (what a worker's task takes, and what the host
//! keeps of it for the next coordinator) and `calls` (what each call does
//! to a worker there).

mod calls;
mod client;
mod components;
mod frames;
mod kept;
mod links;
mod listener;
pub(crate) mod placement;
mod server;
mod source;
mod transport;
pub(crate) mod wire;

pub(crate) use client::{Adopt, Stepped};
pub use client::{RemoteHost, RemoteWorker};
pub(crate) use placement::MeshPlan;
pub use server::{HostOptions, Reach, WorkerHost};
pub use source::{ComponentSource, Fetched};
pub use transport::{HEARTBEAT, MAX_CONNECTIONS, QUEUE, SESSION_TIMEOUT, Tls};
pub(crate) use wire::ShareSpec;
