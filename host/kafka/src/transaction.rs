//! Kafka transactions: the transactional producers (one per role: steps,
//! ingest, each worker), one transaction's records and delivery reports, and
//! telling a fenced producer from a failed one.

use crate::errors::kafka;
use crate::handle::{Deliveries, KafkaLog, TxnProducer, lock};
use rdkafka::ClientContext;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext};
use sluice_core::crash::{CrashPoint, crash_point};
use sluice_storage::{Result, StorageError as Error};
use std::time::{Duration, Instant};

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, index: usize) {
        let r = match result {
            Ok(m) => Ok((m.partition(), m.offset())),
            Err((e, _)) => Err(e.to_string()),
        };
        if let Some(slot) = lock(&self.results).get_mut(index) {
            *slot = Some(r);
        }
    }
}

/// One record of a transaction.
pub(crate) struct Outgoing<'a> {
    /// The topic it goes to.
    pub(crate) topic: &'a str,
    /// The partition it goes to.
    pub(crate) partition: i32,
    /// Its key, if any.
    pub(crate) key: Option<&'a [u8]>,
    /// Its value.
    pub(crate) value: &'a [u8],
    /// Its headers, if any.
    pub(crate) headers: Option<OwnedHeaders>,
}

impl<'a> Outgoing<'a> {
    /// A record of the step log (one partition): a step record or a
    /// worker's done record.
    pub(crate) fn step_log(topic: &'a str, key: &'a [u8], value: &'a [u8]) -> Self {
        Outgoing {
            topic,
            partition: 0,
            key: Some(key),
            value,
            headers: None,
        }
    }

    /// The record to send, with `index` as its opaque: the slot of its
    /// delivery report in [`Deliveries`].
    pub(crate) fn into_record(self, index: usize) -> BaseRecord<'a, [u8], [u8], usize> {
        let mut record = BaseRecord::with_opaque_to(self.topic, index)
            .partition(self.partition)
            .payload(self.value);
        if let Some(k) = self.key {
            record = record.key(k);
        }
        if let Some(h) = self.headers {
            record = record.headers(h);
        }
        record
    }
}

impl KafkaLog {
    /// A transactional producer with id `sluice.<pipeline>.<role>`,
    /// initialised: that fences every earlier producer with the id.
    pub(crate) fn new_producer(&self, role: &str) -> Result<TxnProducer> {
        let id = format!("sluice.{}.{role}", self.config.pipeline);
        // A worker's share is small and quick: a dead holder's open
        // transaction (which holds back `read_committed` readers of the
        // step topic until the next holder aborts it) expires sooner.
        let timeout = match role.starts_with('w') {
            true => "15000",
            false => "60000",
        };
        let producer: TxnProducer = self
            .config
            .base()
            .set("transactional.id", &id)
            .set("enable.idempotence", "true")
            .set("transaction.timeout.ms", timeout)
            .set("linger.ms", "1")
            .set("queue.buffering.max.messages", "1000000")
            .create_with_context(Deliveries::default())
            .map_err(kafka(format!("creating the transactional producer `{id}`")))?;
        producer
            .init_transactions(self.config.timeout)
            .map_err(kafka(format!("initialising transactions of `{id}`")))?;
        Ok(producer)
    }

    /// Runs one transaction: sends `records`, waits for every delivery, and
    /// commits. Returns each record's `(partition, offset)`. On any failure
    /// the producer is dropped (the next use starts a fresh one, whose
    /// `init_transactions` resolves whatever this one left open), except that
    /// a fenced producer fails with [`StorageError::TransactionalProducerSuperseded`](Error::TransactionalProducerSuperseded).
    pub(crate) fn transact(
        &self,
        slot: &mut Option<TxnProducer>,
        role: &str,
        step: Option<u64>,
        records: Vec<Outgoing<'_>>,
        offsets: Option<&TopicPartitionList>,
    ) -> Result<Vec<(i32, i64)>> {
        let producer = match slot.take() {
            Some(p) => p,
            None => self.new_producer(role)?,
        };
        let result = self.transact_with(&producer, records, step.is_some(), offsets);
        match result {
            Ok(offsets) => {
                *slot = Some(producer);
                Ok(offsets)
            }
            Err(e) => Err(self.failed(&producer, e, role, step)),
        }
    }

    /// The error for a failed transaction of `producer`, which is dropped
    /// after this (the next use starts a fresh one, whose
    /// `init_transactions` resolves whatever this one left open).
    pub(crate) fn failed(
        &self,
        producer: &TxnProducer,
        e: KafkaError,
        role: &str,
        step: Option<u64>,
    ) -> Error {
        // Fencing shows up as the transaction's error, or (when it struck
        // while records were queued) as purged deliveries with the
        // producer's fatal error saying why.
        let fatal = producer.client().fatal_error();
        let fenced = is_fenced(e.rdkafka_error_code(), &e.to_string())
            || fatal.is_some_and(|(code, message)| is_fenced(Some(code), &message));
        let transactional_id = format!("sluice.{}.{role}", self.config.pipeline);
        if fenced {
            return Error::TransactionalProducerSuperseded {
                step,
                transactional_id,
            };
        }
        // Best effort: the broker aborts it anyway when the next producer
        // with this id initialises.
        let _ = producer.abort_transaction(self.config.timeout);
        Error::backend(
            "Kafka",
            format!("a transaction of `{transactional_id}`"),
            true,
            e,
        )
    }

    fn transact_with(
        &self,
        producer: &TxnProducer,
        records: Vec<Outgoing<'_>>,
        step_commit: bool,
        offsets: Option<&TopicPartitionList>,
    ) -> std::result::Result<Vec<(i32, i64)>, KafkaError> {
        let n = records.len();
        *lock(&producer.context().results) = vec![None; n];
        producer.begin_transaction()?;
        for (i, r) in records.into_iter().enumerate() {
            send(producer, r.into_record(i))?;
        }
        let t = Instant::now();
        await_deliveries(producer, n, self.config.timeout)?;
        let delivered = delivered(producer, n)?;
        if let Some(tpl) = offsets
            && let Some(group) = self.client.group_metadata()
        {
            producer.send_offsets_to_transaction(tpl, &group, self.config.timeout)?;
        }
        let flushed = t.elapsed();
        if step_commit {
            crash_point(CrashPoint::InsideTransaction);
        }
        producer.commit_transaction(self.config.timeout)?;
        tracing::trace!(records = n, ?flushed, total = ?t.elapsed(), "transaction committed");
        Ok(delivered)
    }
}
/// Whether a Kafka error means another producer with the same
/// transactional id took over.
fn is_fenced(code: Option<RDKafkaErrorCode>, message: &str) -> bool {
    matches!(
        code,
        Some(
            RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::Fenced
        )
    ) || message.to_lowercase().contains("fenced")
}

fn fenced_code(message: &str) -> Option<RDKafkaErrorCode> {
    message
        .to_lowercase()
        .contains("fenced")
        .then_some(RDKafkaErrorCode::ProducerFenced)
}

/// Sends `record`, serving delivery reports while the producer's queue is
/// full.
pub(crate) fn send(
    producer: &TxnProducer,
    mut record: BaseRecord<'_, [u8], [u8], usize>,
) -> std::result::Result<(), KafkaError> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back;
                producer.poll(Duration::from_millis(5));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// Serves delivery reports until the first `n` records of the transaction
/// have theirs. (`flush` would too, but sleeps in 100 ms slices.)
pub(crate) fn await_deliveries(
    producer: &TxnProducer,
    n: usize,
    timeout: Duration,
) -> std::result::Result<(), KafkaError> {
    let deadline = Instant::now() + timeout;
    loop {
        let done = lock(&producer.context().results)
            .iter()
            .take(n)
            .all(Option::is_some);
        if done {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(KafkaError::Flush(RDKafkaErrorCode::MessageTimedOut));
        }
        producer.poll(Duration::from_millis(1));
    }
}

/// The `(partition, offset)` of each of the first `n` records, or the error
/// of the first that failed (fencing kept recognisable).
pub(crate) fn delivered(
    producer: &TxnProducer,
    n: usize,
) -> std::result::Result<Vec<(i32, i64)>, KafkaError> {
    let results = lock(&producer.context().results);
    let mut out = Vec::with_capacity(n);
    for r in results.iter().take(n) {
        match r {
            Some(Ok(po)) => out.push(*po),
            Some(Err(e)) => {
                tracing::warn!("a record of a transaction failed: {e}");
                return Err(KafkaError::MessageProduction(
                    fenced_code(e).unwrap_or(RDKafkaErrorCode::Fail),
                ));
            }
            None => return Err(KafkaError::Flush(RDKafkaErrorCode::MessageTimedOut)),
        }
    }
    Ok(out)
}
