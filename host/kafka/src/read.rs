//! Reading topics: the partition readers (consumers kept assigned, read
//! committed), reads of input and output partitions, watermarks, and the
//! consumer group's offsets (the step's positions).

use crate::errors::{kafka, kafka_failure};
use crate::handle::{KafkaLog, PartitionReader, Quiet, QuietConsumer, lock};
use crate::records::{decode_record, output_headers};
use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use sluice_core::StepRecord;
use sluice_storage::{InputRecord, Result, StorageError as Error};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

impl ClientContext for Quiet {
    fn error(&self, error: KafkaError, reason: &str) {
        let eof = matches!(
            error,
            KafkaError::PartitionEOF(_) | KafkaError::Global(RDKafkaErrorCode::PartitionEOF)
        );
        if !eof {
            tracing::warn!("Kafka client: {error}: {reason}");
        }
    }
}

impl ConsumerContext for Quiet {}

impl KafkaLog {
    /// Reads offsets `range` of a partition, clipped to its end (reading
    /// past it would wait for records that may never come) — or, `exact`,
    /// failing when the range goes past it. The broker is asked for the
    /// end only when the range goes past the last one seen. Trimmed ranges
    /// fail in the read. A record that is not an event comes back as such.
    pub(crate) fn read_upto(
        &self,
        input: &str,
        partition: u32,
        range: Range<u64>,
        exact: bool,
    ) -> Result<Vec<InputRecord>> {
        let topic = self.check_partition(input, partition)?;
        let known = lock(&self.highs).get(&(topic.clone(), partition)).copied();
        let high = match known {
            Some(h) if h >= range.end => h,
            _ => self.topic_watermarks(&topic, partition)?.1,
        };
        if exact && high < range.end {
            return Err(sluice_storage::log::not_visible(
                input, partition, range.end, high,
            ));
        }
        let range = range.start..range.end.min(high);
        let mut events = Vec::new();
        self.read_records(&topic, partition, range, &mut |msg| {
            events.push(decode_record(&topic, partition, msg));
            Ok(())
        })?;
        Ok(events)
    }

    /// The offsets the pipeline's consumer group (`sluice.<pipeline>`) has
    /// committed on each partition of input `input` (`None`: none yet): how
    /// far committed steps read it, as Kafka's own tools see it.
    pub fn group_offsets(&self, input: &str) -> Result<Vec<Option<u64>>> {
        let (topic, n) = self.known_partitions(input)?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..n {
            tpl.add_partition(&topic, p as i32);
        }
        let committed = self
            .client
            .committed_offsets(tpl, self.config.timeout)
            .map_err(kafka(format!("reading the committed offsets of `{topic}`")))?;
        Ok((0..n)
            .map(|p| {
                match committed
                    .find_partition(&topic, p as i32)
                    .map(|e| e.offset())
                {
                    Some(Offset::Offset(o)) if o >= 0 => Some(o as u64),
                    _ => None,
                }
            })
            .collect())
    }

    /// The reader of one partition, created on first use.
    fn reader(&self, topic: &str, partition: u32) -> Result<Arc<Mutex<PartitionReader>>> {
        let mut readers = lock(&self.readers);
        if let Some(r) = readers.get(&(topic.to_owned(), partition)) {
            return Ok(r.clone());
        }
        let consumer: QuietConsumer = self
            .config
            .base()
            .set("group.id", format!("sluice.{}", self.config.pipeline))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .set("auto.offset.reset", "error")
            .set("fetch.wait.max.ms", "10")
            .set("queued.max.messages.kbytes", "16384")
            .create_with_context(Quiet)
            .map_err(kafka("creating a Kafka consumer"))?;
        let r = Arc::new(Mutex::new(PartitionReader {
            consumer,
            next: None,
            pending: None,
        }));
        readers.insert((topic.to_owned(), partition), r.clone());
        Ok(r)
    }

    /// Reads the committed records of `topic`/`partition` with offsets in
    /// `range`, calling `f` with each. Continues the partition's reader when
    /// `range` starts where its last read ended and re-assigns it at
    /// `range.start` otherwise. Stops at the first record at or beyond
    /// `range.end` (kept for the next read) or when the reader's position
    /// passes `range.end` (transaction markers and aborted records are
    /// skipped by the client but still move its position).
    pub(crate) fn read_records(
        &self,
        topic: &str,
        partition: u32,
        range: Range<u64>,
        f: &mut dyn FnMut(&OwnedMessage) -> Result<()>,
    ) -> Result<()> {
        if range.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let reader = self.reader(topic, partition)?;
        let mut guard = lock(&reader);
        let r: &mut PartitionReader = &mut guard;
        if r.next != Some(range.start) {
            let (low, _) = self.topic_watermarks(topic, partition)?;
            if range.start < low {
                return Err(Error::Trimmed {
                    input: topic.to_owned(),
                    partition,
                    from: range.start,
                    low,
                });
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, partition as i32, Offset::Offset(range.start as i64))
                .map_err(kafka("assigning a partition"))?;
            r.consumer
                .assign(&tpl)
                .map_err(kafka(format!("assigning {topic}/{partition}")))?;
            r.pending = None;
        }
        // Until this read completes, the next one must re-assign.
        r.next = None;
        if let Some(m) = r.pending.take() {
            let offset = m.offset() as u64;
            if offset >= range.end {
                r.pending = Some(m);
                r.next = Some(range.end);
                return Ok(());
            }
            if offset >= range.start {
                f(&m)?;
            }
        }
        let deadline = Instant::now() + self.config.timeout.max(Duration::from_secs(60));
        // Everything below `range.end` may have been consumed already (the
        // last records of a partition are often transaction markers).
        let mut check_position = true;
        // Since when the client has reported only reconnecting.
        let mut reconnecting: Option<Instant> = None;
        loop {
            if check_position {
                if position(&r.consumer, topic, partition)? >= range.end {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(kafka_failure(
                        format!("reading {topic}/{partition} {range:?}"),
                        "timed out waiting for the records (an open transaction of \
                         another producer may hold them back)",
                    ));
                }
            }
            check_position = false;
            match r.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(msg)) => {
                    reconnecting = None;
                    let offset = msg.offset() as u64;
                    if offset < range.start {
                        continue;
                    }
                    let owned = msg.detach();
                    if offset >= range.end {
                        r.pending = Some(owned);
                        break;
                    }
                    f(&owned)?;
                }
                Some(Err(KafkaError::PartitionEOF(_))) | None => {
                    check_position = true;
                    self.still_reconnecting(&mut reconnecting, topic, partition)?;
                }
                // The client reports a lost connection as an event and
                // reconnects by itself; the events queue up while the broker
                // is away (one per attempt), so failing on the first would
                // fail read after read long after the broker is back.
                // `RECONNECT_GRACE` after one, with nothing read since, the
                // broker is asked directly: the read fails if it does not
                // answer.
                Some(Err(KafkaError::MessageConsumption(code))) if reconnects(code) => {
                    tracing::debug!(topic, partition, %code, "reading: the client reconnects");
                    reconnecting.get_or_insert_with(Instant::now);
                    check_position = true;
                    self.still_reconnecting(&mut reconnecting, topic, partition)?;
                }
                Some(Err(e)) => return Err(kafka(format!("reading {topic}/{partition}"))(e)),
            }
        }
        r.next = Some(range.end);
        tracing::trace!(topic, partition, ?range, took = ?started.elapsed(), "read");
        Ok(())
    }

    /// After the client reported reconnecting (`since`) and nothing was
    /// read for [`RECONNECT_GRACE`], asks the broker for `topic`/`partition`'s
    /// watermarks: the reports were old if it answers (the read goes on),
    /// and the read fails (transient) if it does not.
    fn still_reconnecting(
        &self,
        since: &mut Option<Instant>,
        topic: &str,
        partition: u32,
    ) -> Result<()> {
        if since.is_none_or(|s| s.elapsed() < RECONNECT_GRACE) {
            return Ok(());
        }
        self.client
            .fetch_watermarks(topic, partition as i32, RECONNECT_GRACE)
            .map_err(kafka(format!(
                "reading {topic}/{partition}: the broker does not answer"
            )))?;
        *since = None;
        Ok(())
    }

    /// The low and high watermarks of `topic`/`partition` (the high one
    /// remembered for later reads).
    pub(crate) fn topic_watermarks(&self, topic: &str, partition: u32) -> Result<(u64, u64)> {
        let t = Instant::now();
        let (low, high) = self
            .client
            .fetch_watermarks(topic, partition as i32, self.config.timeout)
            .map_err(kafka(format!(
                "reading the watermarks of {topic}/{partition}"
            )))?;
        tracing::trace!(topic, partition, took = ?t.elapsed(), "watermarks");
        let (low, high) = (low.max(0) as u64, high.max(0) as u64);
        lock(&self.highs).insert((topic.to_owned(), partition), high);
        Ok((low, high))
    }

    /// Reads a whole single-partition topic (committed records).
    pub(crate) fn read_all(
        &self,
        topic: &str,
        f: &mut dyn FnMut(&OwnedMessage) -> Result<()>,
    ) -> Result<()> {
        let (low, high) = self.topic_watermarks(topic, 0)?;
        self.read_records(topic, 0, low..high, f)
    }

    /// The input positions a step's record says were consumed, as the
    /// offsets the pipeline's consumer group commits with the step (none when
    /// the input logs were not named in the configuration).
    pub(crate) fn positions(&self, record: &StepRecord) -> Result<Option<TopicPartitionList>> {
        if self.config.inputs.is_empty() {
            return Ok(None);
        }
        let mut tpl = TopicPartitionList::new();
        for (id, offset) in record.frontiers.iter().flatten() {
            let Some(input) = self.config.inputs.get(id.input as usize) else {
                continue;
            };
            tpl.add_partition_offset(
                &self.config.topic(input),
                id.partition as i32,
                Offset::Offset(*offset as i64),
            )
            .map_err(kafka("building the step's consumer offsets"))?;
        }
        Ok(Some(tpl))
    }

    /// An offset of output partition `topic`/`p`, within `range`, at or
    /// before the first record of step `step` or later (records of a
    /// partition are in step order: steps commit one transaction after the
    /// other). Found by bisection, reading a few records at each probe, so a
    /// read near the end of a long topic does not scan it.
    pub(crate) fn first_offset_of_step(
        &self,
        topic: &str,
        p: u32,
        range: Range<u64>,
        step: u64,
    ) -> Result<u64> {
        let step_of = |msg: &OwnedMessage| output_headers(topic, p, msg).map(|(s, _, _)| Some(s));
        self.first_offset_of(topic, p, range, step, &step_of)
    }

    /// [`first_offset_of_step`](Self::first_offset_of_step) for any topic
    /// whose records `step_of` names the step of, in step order (`None`:
    /// a record that names none, passed over).
    pub(crate) fn first_offset_of(
        &self,
        topic: &str,
        p: u32,
        range: Range<u64>,
        step: u64,
        step_of: &dyn Fn(&OwnedMessage) -> Result<Option<u64>>,
    ) -> Result<u64> {
        let (mut lo, mut hi) = (range.start, range.end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.first_record_from(topic, p, mid..hi, step_of)? {
                Some((offset, s)) if s < step => lo = offset + 1,
                // Nothing at or after `mid` is older than `step`.
                _ => hi = mid,
            }
        }
        Ok(lo)
    }

    /// The offset and step of the first committed record of `topic`/`p` in
    /// `range` that names a step, reading a growing window from its start.
    fn first_record_from(
        &self,
        topic: &str,
        p: u32,
        range: Range<u64>,
        step_of: &dyn Fn(&OwnedMessage) -> Result<Option<u64>>,
    ) -> Result<Option<(u64, u64)>> {
        let mut window = 64;
        loop {
            let end = range.end.min(range.start.saturating_add(window));
            let mut first = None;
            self.read_records(topic, p, range.start..end, &mut |msg| {
                if first.is_none()
                    && let Some(step) = step_of(msg)?
                {
                    first = Some((msg.offset() as u64, step));
                }
                Ok(())
            })?;
            if first.is_some() || end == range.end {
                return Ok(first);
            }
            // Only transaction markers, aborted records and records that
            // name no step so far.
            window = window.saturating_mul(4);
        }
    }
}
fn position(consumer: &QuietConsumer, topic: &str, partition: u32) -> Result<u64> {
    let tpl = consumer
        .position()
        .map_err(kafka("reading a consumer position"))?;
    Ok(
        match tpl
            .find_partition(topic, partition as i32)
            .map(|e| e.offset())
        {
            Some(Offset::Offset(o)) if o >= 0 => o as u64,
            _ => 0,
        },
    )
}

/// How long a read waits through the client's reconnect events, nothing
/// read, before asking the broker whether it answers (and how long it waits
/// for that answer): longer than a burst of events queued during an outage
/// that is over, short against a step's patience.
const RECONNECT_GRACE: Duration = Duration::from_secs(2);

/// Whether a consumer's error event is one the client recovers from by
/// itself (it reconnects): a broker's connection lost or refused, or every
/// broker's.
fn reconnects(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::BrokerTransportFailure
            | C::AllBrokersDown
            | C::NetworkException
            | C::RequestTimedOut
            | C::OperationTimedOut
            | C::BrokerNotAvailable
            | C::LeaderNotAvailable
            | C::NotLeaderForPartition
    )
}
