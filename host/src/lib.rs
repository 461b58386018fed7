//! # Sluice host
//!
//! Runs incremental dataflow circuits, compiled to WebAssembly components,
//! as sandboxed pipelines of W workers with exactly-once semantics: durable
//! input logs, each step's output committed atomically with the input
//! frontier it covers, checkpoints of all instance state, recovery by
//! restore-and-replay, and trimming only what a checkpoint covers.
//!
//! ```no_run
//! # async fn demo() -> sluice::Result<()> {
//! use sluice::runtime::pipeline::{run, RunRequest};
//! let report = run(RunRequest {
//!     component: "wordcount.wasm".into(),
//!     data: "/tmp/wc".into(),
//!     workers: 2,
//!     inputs: vec![("lines".into(), "book.txt.jsonl".into())],
//!     outputs: vec![("counts".into(), "counts.jsonl".into())],
//!     options: Default::default(),
//!     limits: Default::default(),
//!     progress: false,
//!     log: Default::default(),
//! })
//! .await?;
//! println!("{} steps, {:.0} events/s", report.stats.steps, report.events_per_second());
//! # Ok(()) }
//! ```
//!
//! Modules, one per concept:

/// `sluice bench`: costs as ratios to same-run baselines.
pub mod bench;
/// `sluice chaos`: the crash campaign.
pub mod chaos;
/// The `sluice` command line.
pub mod cli;
/// The CLI client of `sluice serve`.
pub mod client;
/// `sluice build`: circuit crate → component.
pub mod compile;
/// The demo: word count over bundled text.
pub mod demo;
/// The error type.
pub mod error;
/// `sluice gen`: benchmark input (Nexmark) as JSON lines.
pub mod generate;
/// Appending JSON-lines files to input logs exactly once.
pub mod ingest;
/// Engine, workers, exchange, coordinator, pipeline.
pub mod runtime;
/// `sluice serve`: the multi-tenant HTTP host.
pub mod server;
/// Wire formats: input and output JSON lines.
pub mod spec;
/// Log backends, checkpoint store, invariant checks, conformance suites.
pub mod storage;

pub use error::{Error, Result};
pub use runtime::{Coordinator, Limits, PipelineOptions, SluiceEngine};
pub use storage::{CheckpointStore, Guarded, LogBackend};
