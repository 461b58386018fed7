//! The Kafka client's failures as Sluice's storage errors: transient backend
//! errors (the broker may answer after recovery).

use rdkafka::error::KafkaError;
use sluice_storage::StorageError as Error;

/// A closure turning the Kafka client's error while doing `what` into a
/// transient backend error (the broker may answer after recovery).
pub(crate) fn kafka(what: impl Into<String>) -> impl FnOnce(KafkaError) -> Error {
    let what = what.into();
    move |e| Error::backend("Kafka", what, true, e)
}

/// A transient Kafka failure described by Sluice itself (no client error).
pub(crate) fn kafka_failure(what: impl Into<String>, message: impl Into<String>) -> Error {
    Error::backend("Kafka", what, true, message.into())
}
