//! # sluice-kafka: a pipeline's logs in Kafka
//!
//! [`KafkaLog`] implements [`LogBackend`](sluice_storage::LogBackend) on
//! Kafka topics: inputs any producer may write, output topics with Sluice's
//! headers, a step topic; each step commits as one Kafka transaction, and a
//! host that takes over fences the old one through the transactional id.
//! It passes the storage conformance suite against a real broker
//! (`tests/e2e/kafka.rs`). See [`log`] for the topics and headers.
//!
//! ```no_run
//! use sluice_kafka::{KafkaConfig, KafkaLog};
//! use sluice_storage::LogBackend;
//! let log = KafkaLog::open(KafkaConfig::new("127.0.0.1:9092", "wordcount"))?;
//! let epoch = log.fence()?; // take the pipeline over
//! # Ok::<_, sluice_storage::StorageError>(())
//! ```

/// Topic creation and description, and deleting a pipeline's topics.
mod admin;
/// [`KafkaConfig`]: brokers, topic names, client settings; topic name checks.
mod config;
/// Kafka client failures as transient storage errors.
mod errors;
/// Taking the logs over: the step log read to its true end, past workers'
/// dead holders' open transactions (fenced first).
mod fence;
/// The [`KafkaLog`] handle, the state behind its locks, and opening it.
mod handle;
/// A step history written fast, for benchmarks of what a take-over costs.
mod history;
/// Ingest marks and producer sequence numbers on the meta topic.
mod ingest;
/// The checkpoint ledger: checkpoint records on the step topic.
mod ledger;
/// The topics and headers, and `LogBackend` for [`KafkaLog`].
pub mod log;
/// Reads: partition readers, watermarks, consumer-group offsets.
mod read;
/// Record headers, event decoding, output-entry encoding, frontier JSON.
mod records;
/// The step topic as read: a window of its newest step, done and
/// checkpoint records, grown back only as far as asked.
mod steps;
/// Transactional producers, delivery reports, fencing detection.
mod transaction;
/// A worker's holder committing its share of divided steps.
mod worker;

pub use admin::delete_topics;
pub use config::{KafkaConfig, STEP_WINDOW, validate_topic};
pub use handle::KafkaLog;
pub use records::{FRONTIER_HEADER, STEP_HEADER, WEIGHT_HEADER, WORKER_HEADER, parse_frontier};
