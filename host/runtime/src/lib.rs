//! # sluice-runtime: running a pipeline's circuit instances
//!
//! The WebAssembly side of Sluice and the step protocol, over storage's
//! [`Guarded`](sluice_storage::Guarded) (it never sees a backend):
//!
//! - [`error`]: the runtime's errors, by layer — the bottom of the crate.
//! - [`memory`]: the process's memory — the allocator set for a
//!   long-running host, freed heap handed back, resident figures.
//! - `bindings` (private): the WIT world's generated types, once;
//!   `packed`: batches packed as one buffer with their ends.
//! - [`determinism`]: the clock and random numbers a guest sees (I4).
//! - [`exchange`]: routing keyed events between the W workers in a step,
//!   deterministically — on one host, or each host its own workers' part,
//!   frames host to host.
//! - `instance` (private): what the host keeps per instance (its store's
//!   data: WASI, limits, exchange, clock).
//! - [`engine`]: the wasmtime engine (component model, fuel, epochs, NaN
//!   canonicalization, no threads), components validated against the
//!   `sluice:circuit` world and precompiled by content hash; [`Limits`].
//! - [`worker`]: one sandboxed instance; every call into the guest and
//!   every way it fails ([`GuestError`], naming the limit).
//! - `step_io` (private): a step's input ranges and output checks, the same
//!   for the coordinator and for a host serving workers.
//! - [`hosts`]: a pipeline across hosts — the wire protocol, transport
//!   (TCP, mutual TLS, the handshake), the coordinator's client
//!   ([`RemoteHost`]), the exchange's links, worker placement, and the
//!   hosts that serve workers ([`WorkerHost`]).
//! - [`coordinator`]: **the step protocol** — divide, run, commit,
//!   checkpoint, trim — and **recovery** (restore the newest checkpoint,
//!   replay the steps after it, comparing output hashes).
//!
//! Dependencies between these modules run one way, down this list
//! (`scripts/check-module-deps.py` checks it).
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
pub mod hosts;
mod instance;
pub mod memory;
mod packed;
mod step_io;
pub mod worker;

pub use coordinator::{
    COMMITTED_BY_KEPT, Coordinator, PipelineOptions, Relayout, Stats, UpgradedAt,
};
pub use engine::{Limits, LoadedComponent, SluiceEngine};
pub use error::{Error, ExchangeError, GuestError, Result};
pub use hosts::{ComponentSource, Fetched, HostOptions, Reach, RemoteHost, Tls, WorkerHost};
pub use worker::{Snapshot, Worker, WorkerInfo};
