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

pub mod log;

pub use log::{
    FRONTIER_HEADER, KafkaConfig, KafkaLog, STEP_HEADER, WEIGHT_HEADER, WORKER_HEADER,
    delete_topics, parse_frontier, validate_topic,
};
