//! One pipeline on the server: its [`Pipeline`](sluice_pipeline::Pipeline),
//! the task that drives it and the status the API reports.
//!
//! The domain layer holds a [`PipelineHandle`] per loaded pipeline and
//! opens it with [`PipelineHandle::open`]: a pipeline this server runs
//! alone gets a task over its coordinator (`single`); a pipeline across
//! hosts gets a task running this server's host of it (`hosts`).

/// The handle of a loaded pipeline, the commands to its task, its options.
mod handle;
/// A pipeline across hosts, as one of its hosts.
#[cfg(feature = "kafka")]
mod hosts;
/// The entry: opening a pipeline alone or as one host of it.
mod open;
/// A pipeline this server runs alone, and the task that drives it.
mod single;

pub use crate::settings::{HostsSettings, KafkaSettings};
pub use handle::PipelineHandle;
pub(crate) use single::log_config;
