//! # sluice-embedded: a pipeline's storage in one RocksDB
//!
//! The default backend: everything a pipeline stores lives in its data
//! directory's RocksDB database, one column family per kind, behind a lock
//! file so that two processes never open one pipeline.
//!
//! - [`db`]: opening the database, the data directory's lock.
//! - [`EmbeddedLog`] ([`log`]): input, output and step logs; a step commits
//!   as one synced `WriteBatch`, its output first ingested as table files
//!   when it is large (read only once the record is in).
//! - [`RocksCheckpointStore`] ([`checkpoint`]): checkpoints, also of
//!   pipelines whose logs are in Kafka.
//! - [`meta`]: the pipeline's identity and shape, checked on every open.
//! - [`audit`]: `sluice verify` of an embedded pipeline (the storage audit
//!   plus checks of this backend's keys).
//!
//! ```no_run
//! use sluice_embedded::{EmbeddedLog, db};
//! use sluice_storage::LogBackend;
//! let log = EmbeddedLog::open(db::open("/tmp/pipeline".as_ref())?)?;
//! println!("last step: {:?}", log.last_step()?);
//! # Ok::<_, sluice_storage::StorageError>(())
//! ```

pub mod audit;
pub mod checkpoint;
pub mod db;
pub mod log;
pub mod meta;

pub use checkpoint::RocksCheckpointStore;
pub use log::{EmbeddedLog, input_key, output_key};
pub use meta::PipelineMeta;
