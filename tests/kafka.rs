//! The Kafka backend against a real Kafka-protocol broker.
//!
//! The broker's address comes from `SLUICE_KAFKA_BROKERS` (`.ci/run` starts
//! one and sets it). Without it these tests say so and pass, except under
//! `CI`, where a missing broker is a failure.
#![cfg(feature = "kafka")]

mod support;

use sluice::storage::conformance::{self, LogFlags};
use sluice::storage::{KafkaConfig, KafkaLog, LogBackend};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// The broker's address, or `None` (outside CI) to skip.
pub fn brokers() -> Option<String> {
    match std::env::var("SLUICE_KAFKA_BROKERS") {
        Ok(b) if !b.is_empty() => Some(b),
        _ if std::env::var_os("CI").is_some() => {
            panic!("CI is set but SLUICE_KAFKA_BROKERS is not: .ci/run must start the broker")
        }
        _ => {
            eprintln!("skipped: set SLUICE_KAFKA_BROKERS=host:port to run the Kafka tests");
            None
        }
    }
}

/// A pipeline name no earlier run used (topics outlive test runs).
fn fresh_name(what: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format!(
        "{what}-{now}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

#[test]
fn kafka_log_passes_the_log_conformance_suite() {
    let Some(brokers) = brokers() else { return };
    conformance::log_backend(
        &|| {
            let log = KafkaLog::open(KafkaConfig::new(&brokers, fresh_name("conf")))
                .expect("opening the Kafka log");
            Arc::new(log) as Arc<dyn LogBackend>
        },
        LogFlags {
            supports_trim: true,
            dense_offsets: false,
        },
    );
}
