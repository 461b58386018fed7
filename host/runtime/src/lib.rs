//! # sluice-runtime: running a pipeline's circuit instances
//!
//! The WebAssembly side of Sluice and the step protocol, over storage's
//! [`Guarded`](sluice_storage::Guarded) (it never sees a backend):
//!
//! - [`engine`]: the wasmtime engine (component model, fuel, epochs, NaN
//!   canonicalization, no threads), components validated against the
//!   `sluice:circuit` world and precompiled by content hash; [`Limits`].
//! - [`worker`]: one sandboxed instance; every call into the guest and
//!   every way it fails ([`GuestError`], naming the limit).
//! - [`exchange`]: routing keyed events between the W workers in a step,
//!   deterministically — on one host, or each host its own workers' part,
//!   frames host to host.
//! - [`remote`]: workers on other hosts — the coordinator's connections,
//!   the hosts that serve workers ([`WorkerHost`]), peer links, optional
//!   mutual TLS ([`Tls`]).
//! - [`determinism`]: the clock and random numbers a guest sees (I4).
//! - [`coordinator`]: **the step protocol** — divide, run, commit,
//!   checkpoint, trim — and **recovery** (restore the newest checkpoint,
//!   replay the steps after it, comparing output hashes).
//! - [`error`]: the runtime's errors, by layer.
//!
//! Generated WIT bindings stay in a private module; the API speaks
//! [`sluice_core`]'s types.
//!
//! ```no_run
//! # async fn demo(storage: std::sync::Arc<sluice_storage::Guarded>) -> sluice_runtime::Result<()> {
//! use sluice_runtime::{Coordinator, Limits, PipelineOptions, SluiceEngine};
//! let engine = SluiceEngine::new(Limits::default(), SluiceEngine::default_cache_dir())?;
//! let component = engine.load_file("wordcount.wasm".as_ref())?;
//! let mut c = Coordinator::open(&engine, &component, storage, PipelineOptions::default()).await?;
//! while c.step().await? {}
//! c.finish().await?;
//! # Ok(()) }
//! ```

mod bindings;
pub mod coordinator;
pub mod determinism;
pub mod engine;
pub mod error;
pub mod exchange;
pub mod remote;
pub mod worker;

pub use coordinator::{Coordinator, PipelineOptions, Relayout, Stats};
pub use engine::{Limits, LoadedComponent, SluiceEngine};
pub use error::{Error, GuestError, Result};
pub use remote::{Reach, RemoteHost, Tls, WorkerHost};
pub use worker::{Snapshot, Worker, WorkerInfo};
