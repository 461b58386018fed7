//! # sluice-pipeline: one way to assemble and supervise a pipeline
//!
//! Everything that runs a pipeline — `sluice run`, `sluice serve`, the
//! bench and the tests — assembles it here, from a [`PipelineConfig`]:
//!
//! - [`config`]: the configuration; where the logs live ([`LogConfig`]).
//! - [`storage`]: opening a pipeline's storage — the data directory's
//!   RocksDB (checkpoints, metadata), its logs (embedded or Kafka) — and
//!   checking it against what was asked ([`Storage`]).
//! - [`pipeline`]: a component and its storage, ready to open a
//!   coordinator (which recovers) and to ingest files ([`Pipeline`]).
//! - [`supervise`]: **the recovery policy** — which errors are retried, how
//!   often, how long to wait ([`RecoveryPolicy`]) — and running until idle
//!   under it.
//! - [`run`]: `sluice run` as a library call: ingest files exactly once,
//!   run to completion, export the output logs; progress reported through a
//!   callback ([`RunEvent`]).
//! - [`hosts`]: one host of a pipeline across several (`sluice host`):
//!   membership, leading, recovery when the group changes.
//! - [`error`]: the errors of all of the above.
//!
//! ```no_run
//! # async fn demo() -> Result<(), sluice_pipeline::Error> {
//! use sluice_pipeline::{Pipeline, PipelineConfig, RecoveryPolicy};
//! use sluice_runtime::{Limits, SluiceEngine};
//! use std::sync::Arc;
//! let engine = Arc::new(SluiceEngine::new(Limits::default(), None)?);
//! let component = engine.load_file("wordcount.wasm".as_ref())?;
//! let pipeline = Pipeline::open(engine, component, PipelineConfig::new("/tmp/wc", 2)).await?;
//! let done = pipeline.run_until_idle(&RecoveryPolicy::default(), |_| {}).await?;
//! println!("{} steps", done.coordinator.next_step());
//! # Ok(()) }
//! ```

pub mod config;
pub mod error;
pub mod hosts;
pub mod pipeline;
pub mod run;
pub mod storage;
pub mod supervise;
pub mod upgrade;

pub use config::{LogConfig, LogKind, PipelineConfig};
pub use error::{Error, Result};
pub use hosts::{HostConfig, HostEvent, run_host};
pub use pipeline::Pipeline;
pub use run::{RunEvent, RunReport, RunRequest, export_output, run};
pub use storage::Storage;
pub use supervise::{Idle, RecoveryPolicy};
pub use upgrade::UpgradeReport;
