//! Appends through Sluice: the meta topic's ingest marks and producer
//! sequence numbers, and an append that commits a producer's new state in
//! the transaction of its events.

use crate::handle::{KafkaLog, MetaState, lock};
use crate::transaction::{Outgoing, await_deliveries, delivered, send};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer};
use sluice_storage::{AppendBatch, ProducerSeq, ProducerState, Result, StorageError as Error};
use std::collections::HashMap;
use std::ops::Range;

/// How an ingest mark's key starts on the meta topic (the source follows).
pub(crate) const META_MARK: &str = "mark:";
/// How a producer state's key starts on the meta topic (`<input>/<id>`
/// follows).
pub(crate) const META_PRODUCER: &str = "producer:";
/// The meta topic's key of the pipeline's changes of component (`sluice
/// upgrade`): the whole list, the newest record the one that counts.
pub(crate) const META_UPGRADES: &str = "upgrades";

impl KafkaLog {
    /// Reads the ingest marks and producer states from the meta topic, once
    /// (after the ingest producer is initialised).
    pub(crate) fn load_meta(&self, meta: &mut MetaState) -> Result<()> {
        if meta.loaded {
            return Ok(());
        }
        // The pipeline's ingest producer first: its `init_transactions`
        // aborts a dead predecessor's open ingest transaction, which would
        // otherwise hold back this read until the broker times it out.
        if meta.producer.is_none() {
            meta.producer = Some(self.new_producer("ingest")?);
        }
        let (mut marks, mut producers, mut upgrades) = (HashMap::new(), HashMap::new(), None);
        let topic = self.config.meta_topic();
        self.read_all(&topic, &mut |m| {
            let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            let value = m.payload().unwrap_or_default();
            if let Some(source) = key.strip_prefix(META_MARK) {
                marks.insert(source.to_owned(), value.to_vec());
            } else if key == META_UPGRADES {
                upgrades = Some(value.to_vec());
            } else if let Some((input, id)) = key
                .strip_prefix(META_PRODUCER)
                .and_then(|k| k.split_once('/'))
            {
                let (epoch, last_seq, pairs): (u64, u64, Vec<(u64, u64)>) =
                    postcard::from_bytes(value).map_err(Error::corrupt(format!(
                        "state of producer `{id}` on input `{input}` in `{topic}`"
                    )))?;
                producers.insert(
                    (id.to_owned(), input.to_owned()),
                    ProducerState {
                        epoch,
                        last_seq,
                        ranges: pairs.into_iter().map(|(a, b)| a..b).collect(),
                    },
                );
            }
            Ok(())
        })?;
        meta.marks = marks;
        meta.producers = producers;
        meta.upgrades = upgrades;
        meta.loaded = true;
        Ok(())
    }

    /// Records `upgrades` on the meta topic (key [`META_UPGRADES`]) in a
    /// transaction of the pipeline's ingest producer as the last
    /// [`fence`](sluice_storage::LogBackend::fence) made it. Fenced like a
    /// step commit: every take-over (and every open, through
    /// [`load_meta`](Self::load_meta)) initialises that producer's
    /// transactional id anew, so a host another took the pipeline from
    /// records nothing. And every reader's `load_meta` first aborts the
    /// transaction of an upgrade that died inside it (the same id), so no
    /// open waits on it.
    pub(crate) fn record_upgrades_on_meta(&self, upgrades: &[u8]) -> Result<()> {
        let topic = self.config.meta_topic();
        // (The step state first, released: `fence` locks it before the meta
        // state.)
        let fenced = lock(&self.steps).epoch != 0;
        let mut meta = lock(&self.meta);
        if meta.producer.is_none() || !fenced {
            return Err(sluice_core::ConfigError::Invalid(
                "the Kafka log was not fenced (call `fence` first), so it records no upgrade"
                    .into(),
            )
            .into());
        }
        let record = Outgoing::step_log(&topic, META_UPGRADES.as_bytes(), upgrades);
        // A producer fenced since is not replaced here (`transact` would
        // start a fresh one, fencing the host that took over): the record
        // fails instead.
        let mut slot = meta.producer.take();
        let result = self.transact(&mut slot, "ingest", None, vec![record], None);
        meta.producer = slot;
        result?;
        meta.upgrades = Some(upgrades.to_vec());
        Ok(())
    }

    /// An append by a producer with a sequence number: the events and the
    /// producer's new state in one transaction. The state records the
    /// offsets the events got, which Kafka assigns on delivery, so the events
    /// are sent and delivered first, inside the same open transaction.
    pub(crate) fn append_with_producer_state(
        &self,
        meta: &mut MetaState,
        records: Vec<Outgoing<'_>>,
        n_events: usize,
        p: &ProducerSeq,
        key: &str,
        batch: &AppendBatch,
    ) -> Result<Vec<(i32, i64)>> {
        let producer = match meta.producer.take() {
            Some(p) => p,
            None => self.new_producer("ingest")?,
        };
        let meta_topic = self.config.meta_topic();
        let run = || -> std::result::Result<Vec<(i32, i64)>, KafkaError> {
            let n = records.len();
            *lock(&producer.context().results) = vec![None; n + 1];
            producer.begin_transaction()?;
            for (i, r) in records.into_iter().enumerate() {
                send(&producer, r.into_record(i))?;
            }
            await_deliveries(&producer, n, self.config.timeout)?;
            let offsets = delivered(&producer, n)?;
            let ranges = ranges_of(batch, &offsets[..n_events]);
            let state = postcard::to_allocvec(&(
                p.epoch,
                p.seq,
                ranges.iter().map(|r| (r.start, r.end)).collect::<Vec<_>>(),
            ))
            .unwrap_or_default();
            let record: BaseRecord<'_, [u8], [u8], usize> =
                BaseRecord::with_opaque_to(&meta_topic, n)
                    .partition(0)
                    .key(key.as_bytes())
                    .payload(&state);
            send(&producer, record)?;
            await_deliveries(&producer, n + 1, self.config.timeout)?;
            delivered(&producer, n + 1)?;
            producer.commit_transaction(self.config.timeout)?;
            Ok(offsets[..n_events].to_vec())
        };
        match run() {
            Ok(o) => {
                meta.producer = Some(producer);
                Ok(o)
            }
            Err(e) => Err(self.failed(&producer, e, "ingest", None)),
        }
    }
}
/// Per append entry, the offsets its events got: from the first event's
/// offset to one past the last's (offsets within a transaction may skip).
pub(crate) fn ranges_of(batch: &AppendBatch, offsets: &[(i32, i64)]) -> Vec<Range<u64>> {
    let mut i = 0;
    batch
        .appends
        .iter()
        .map(|(_, _, events)| {
            let got = &offsets[i..i + events.len()];
            i += events.len();
            match (got.first(), got.last()) {
                (Some(a), Some(b)) => a.1 as u64..b.1 as u64 + 1,
                _ => 0..0,
            }
        })
        .collect()
}
