//! The Kafka log: a pipeline's input, output and step logs in Kafka topics.
//!
//! - **Inputs** are topics any Kafka producer may write. A record's value is
//!   the event's JSON; its weight is the `sluice-weight` header (a decimal
//!   integer, `1` when absent). Reads are `read_committed` and start at the
//!   requested offset by assigning the partition at that offset. Offsets are
//!   *sparse*: transaction markers and aborted records take offsets that hold
//!   no event, so a range `a..b` holds at most `b - a` events.
//! - **Outputs** go to output topics, one record per event, to partition
//!   `worker mod partitions`, with headers `sluice-step`, `sluice-worker`,
//!   `sluice-weight` and `sluice-frontier` (the input frontier the entry
//!   covers, as JSON `[[input, partition, offset], …]`).
//! - **Dead letters** (input records a step skipped as not events, under
//!   the input's policy `dead-letter`) are output records like any other,
//!   on the topic of the log `<port>.dead-letter` — by default
//!   `<pipeline>.<port>.dead-letter` — in the same transaction as the
//!   step's (or the worker's share's) outputs. Each value is a JSON object
//!   naming the record's position (`topic/partition@offset`) and why it is
//!   not an event, with the record's value ([`sluice_core::DeadLetter`]).
//! - **Step records** go to the pipeline's step topic (`<pipeline>.sluice-steps`,
//!   one partition). A step commits as **one Kafka transaction** holding every
//!   worker's output records and the step record, produced with the
//!   transactional id `sluice.<pipeline>.steps`: a second host opening the
//!   pipeline calls `init_transactions` with the same id, which bumps the
//!   producer epoch, aborts the zombie's open transaction and makes its next
//!   commit fail with [`StorageError::TransactionalProducerSuperseded`].
//! - **Divided steps** (a pipeline across hosts): the step record commits
//!   first, with no hashes (the division), in that transaction; each
//!   worker's share — its output records and a *done record*
//!   `(step, worker, output hash)` on the step topic, keyed by step and
//!   worker (12 bytes; a step record's key is the step, 8) — commits in a
//!   transaction of the worker's holder, transactional id
//!   `sluice.<pipeline>.w<worker>`, whose `init_transactions` fenced every
//!   earlier holder ([`LogBackend::take_worker`]). A step's output is read
//!   back once every done record is in.
//! - **Ingest marks and producer sequence numbers** (appends through Sluice)
//!   go to the pipeline's meta topic (`<pipeline>.sluice-meta`) in the same
//!   transaction as the events they cover (transactional id
//!   `sluice.<pipeline>.ingest`).
//! - **Trim** is `DeleteRecords`, which moves the partition's low watermark,
//!   on the pipeline's own input topics only (`<pipeline>.<port>`): a topic
//!   the user named may have other readers, and is trimmed only with
//!   [`KafkaConfig::trim_named_topics`].
//! - **Consumer-group offsets.** Each step's transaction also commits how far
//!   the step read every input partition as the offsets of the consumer
//!   group `sluice.<pipeline>`, so Kafka's tools show the pipeline's lag.
//!
//! - **Checkpoint records** (a pipeline whose checkpoints are in a shared
//!   store): the store's commits are decided here ([`CheckpointLedger`]): a
//!   record keyed `checkpoint:<step>` naming the manifest, on the step
//!   topic in a transaction of the step producer — fenced like the steps.
//! - The step topic is created with unlimited retention: it is the
//!   pipeline's history. (A topic created by hand needs the same.)
//!
//! Without a shared store, checkpoints stay in the data directory's RocksDB
//! (`sluice-embedded`).
//!
//! [`StorageError::TransactionalProducerSuperseded`]: sluice_storage::StorageError::TransactionalProducerSuperseded
//! [`LogBackend::take_worker`]: sluice_storage::LogBackend::take_worker
//! [`KafkaConfig::trim_named_topics`]: crate::KafkaConfig::trim_named_topics
//! [`CheckpointLedger`]: sluice_storage::CheckpointLedger

use crate::errors::kafka;
use crate::handle::{KafkaLog, lock};
use crate::ingest::{META_MARK, META_PRODUCER, ranges_of};
use crate::records::{EntryTexts, WEIGHT_HEADER, output_headers};
use crate::steps::lost_producer;
use crate::transaction::Outgoing;
use crate::worker::KafkaWorker;
use rdkafka::admin::AdminOptions;
use rdkafka::consumer::Consumer;
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::{Offset, TopicPartitionList};
use sluice_core::{ConfigError, Event, OutputEntry, StepCommit, StepRecord};
use sluice_storage::records::events_only;
use sluice_storage::{
    AppendBatch, InputRecord, LogBackend, ProducerCheck, ProducerState, Result,
    StorageError as Error, WorkerCommitter, check_producer,
};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl LogBackend for KafkaLog {
    /// The brokers, the pipeline's name and the topics its logs map to:
    /// every host with the same reads the same topics for the same names.
    fn location(&self) -> Option<String> {
        let mut topics: Vec<(&String, &String)> = self.config.topics.iter().collect();
        topics.sort();
        let topics: Vec<String> = topics.iter().map(|(l, t)| format!("{l}={t}")).collect();
        Some(format!(
            "kafka://{}/{}?{}",
            self.config.brokers,
            self.config.pipeline,
            topics.join("&")
        ))
    }

    /// The step topic's metadata, asked of the brokers with a short
    /// timeout.
    fn reachable(&self) -> Result<()> {
        let topic = self.config.steps_topic();
        let timeout = self.config.timeout.min(Duration::from_secs(3));
        self.client
            .fetch_metadata(Some(&topic), timeout)
            .map(|_| ())
            .map_err(kafka(format!("reaching the brokers for {topic}")))
    }

    fn create_input(&self, input: &str, partitions: u32) -> Result<()> {
        let topic = self.config.topic(input);
        let n = self.ensure_topic(&topic, partitions, &[])?;
        if !self.config.allow_compacted_inputs
            && let Some(policy) = self.topic_config(&topic, "cleanup.policy")?
            && policy.contains("compact")
        {
            return Err(ConfigError::Invalid(format!(
                "input `{input}`: Kafka topic `{topic}` has cleanup.policy={policy}; compaction \
                 may remove records a committed step read, and its replay would read fewer. Use a \
                 topic with cleanup.policy=delete, or --allow-compacted-inputs if its keys never \
                 repeat"
            ))
            .into());
        }
        if n != partitions {
            return Err(ConfigError::Invalid(format!(
                "input `{input}`: Kafka topic `{topic}` has {n} partitions, not {partitions}"
            ))
            .into());
        }
        Ok(())
    }

    fn partitions(&self, input: &str) -> Result<u32> {
        Ok(self.known_partitions(input)?.1)
    }

    fn append(&self, batch: AppendBatch) -> Result<Vec<Range<u64>>> {
        let producer_input = batch.producer_input()?.map(str::to_owned);
        let mut meta = lock(&self.meta);
        self.load_meta(&mut meta)?;
        if let (Some(p), Some(input)) = (&batch.producer, &producer_input) {
            let state = meta.producers.get(&(p.id.clone(), input.clone()));
            if let ProducerCheck::Duplicate(ranges) = check_producer(p, input, state)? {
                return Ok(ranges);
            }
        }
        let mut topics = Vec::with_capacity(batch.appends.len());
        for (input, partition, _) in &batch.appends {
            topics.push(self.check_partition(input, *partition)?);
        }
        let weights: Vec<Vec<String>> = batch
            .appends
            .iter()
            .map(|(_, _, events)| events.iter().map(|e| e.weight.to_string()).collect())
            .collect();
        let mut records = Vec::new();
        for (((_, partition, events), topic), weights) in
            batch.appends.iter().zip(&topics).zip(&weights)
        {
            for (e, w) in events.iter().zip(weights) {
                records.push(Outgoing {
                    topic,
                    partition: *partition as i32,
                    key: None,
                    value: &e.value,
                    headers: (e.weight != 1).then(|| {
                        OwnedHeaders::new().insert(Header {
                            key: WEIGHT_HEADER,
                            value: Some(w.as_bytes()),
                        })
                    }),
                });
            }
        }
        let n_events = records.len();
        let meta_topic = self.config.meta_topic();
        let mark_key = batch
            .mark
            .as_ref()
            .map(|m| format!("{META_MARK}{}", m.source));
        if let (Some(m), Some(k)) = (&batch.mark, &mark_key) {
            records.push(Outgoing {
                topic: &meta_topic,
                partition: 0,
                key: Some(k.as_bytes()),
                value: &m.state,
                headers: None,
            });
        }
        // The producer's state needs the offsets, known only after delivery,
        // so a producer append writes its state in a second record whose
        // value is filled in below. Kafka gives no read-your-writes inside a
        // transaction, so it is written with the offsets the events *will*
        // get: sent first, delivered before the state record is sent.
        let producer_key = match (&batch.producer, &producer_input) {
            (Some(p), Some(input)) => Some(format!("{META_PRODUCER}{input}/{}", p.id)),
            _ => None,
        };
        let sent = if let (Some(p), Some(key)) = (&batch.producer, &producer_key) {
            self.append_with_producer_state(&mut meta, records, n_events, p, key, &batch)
        } else {
            let slot = &mut meta.producer;
            self.transact(slot, "ingest", None, records, None)
                .map(|mut offsets| {
                    offsets.truncate(n_events);
                    offsets
                })
        };
        let offsets = match sent {
            Ok(offsets) => offsets,
            Err(e) => {
                // The commit may have taken effect even though it failed
                // (a timeout, a lost answer): read the marks and producer
                // states back before the next append, so a retry of this
                // one is recognised as a duplicate.
                meta.loaded = false;
                return Err(e);
            }
        };
        let ranges = ranges_of(&batch, &offsets);
        if let Some(m) = batch.mark {
            meta.marks.insert(m.source, m.state);
        }
        if let (Some(p), Some(input)) = (batch.producer, producer_input) {
            meta.producers.insert(
                (p.id, input),
                ProducerState {
                    epoch: p.epoch,
                    last_seq: p.seq,
                    ranges: ranges.clone(),
                },
            );
        }
        Ok(ranges)
    }

    fn producer(&self, id: &str, input: &str) -> Result<Option<ProducerState>> {
        let mut meta = lock(&self.meta);
        self.load_meta(&mut meta)?;
        Ok(meta
            .producers
            .get(&(id.to_owned(), input.to_owned()))
            .cloned())
    }

    fn ingest_mark(&self, source: &str) -> Result<Option<Vec<u8>>> {
        let mut meta = lock(&self.meta);
        self.load_meta(&mut meta)?;
        Ok(meta.marks.get(source).cloned())
    }

    fn watermarks(&self, input: &str, partition: u32) -> Result<(u64, u64)> {
        let topic = self.check_partition(input, partition)?;
        self.topic_watermarks(&topic, partition)
    }

    fn read(&self, input: &str, partition: u32, range: Range<u64>) -> Result<Vec<Event>> {
        events_only(self.read_upto(input, partition, range, false)?)
    }

    fn read_exact(&self, input: &str, partition: u32, range: Range<u64>) -> Result<Vec<Event>> {
        events_only(self.read_upto(input, partition, range, true)?)
    }

    fn read_records(
        &self,
        input: &str,
        partition: u32,
        range: Range<u64>,
        exact: bool,
    ) -> Result<Vec<InputRecord>> {
        self.read_upto(input, partition, range, exact)
    }

    fn record_upgrades(&self, upgrades: &[u8]) -> Result<bool> {
        self.record_upgrades_on_meta(upgrades)?;
        Ok(true)
    }

    fn upgrades(&self) -> Result<Option<Vec<u8>>> {
        let mut meta = lock(&self.meta);
        self.load_meta(&mut meta)?;
        Ok(meta.upgrades.clone())
    }

    fn fence(&self) -> Result<u64> {
        // A fresh step producer: `init_transactions` bumps the producer
        // epoch, fencing every older producer of this pipeline and aborting
        // its open transaction. The ingest producer is re-initialised too, so
        // a dead host's open ingest transaction cannot hold back reads.
        let mut s = lock(&self.steps);
        s.producer = None;
        s.lost = None;
        let producer = self.new_producer("steps")?;
        {
            let mut meta = lock(&self.meta);
            meta.producer = None;
            meta.producer = Some(self.new_producer("ingest")?);
            meta.loaded = false;
        }
        // To the step topic's true end: past transactions dead holders of
        // workers left open (their holders fenced first), so a checkpoint
        // or done record committed after one is not missed.
        self.reload_steps_to_true_end(&mut s)?;
        let last_epoch = s
            .records
            .iter()
            .flat_map(|r| r.values())
            .map(|r| r.epoch)
            .max()
            .unwrap_or(0);
        s.epoch = s.epoch.max(last_epoch) + 1;
        s.producer = Some(producer);
        Ok(s.epoch)
    }

    fn commit_step(&self, commit: &StepCommit) -> Result<()> {
        let step = commit.record.step;
        self.with_steps(|s| {
            let records = s.records.as_ref().expect("loaded by with_steps");
            let last = records.keys().next_back().copied();
            if let Some(fenced) = s.lost {
                return Err(lost_producer(&self.config, Some(step), fenced));
            }
            if s.epoch == 0 || s.producer.is_none() {
                return Err(Error::InvalidCommit {
                    step,
                    message: "the Kafka log was not fenced (call `fence` first)".into(),
                });
            }
            if commit.record.epoch != s.epoch {
                return Err(Error::HostEpochSuperseded {
                    step,
                    epoch: commit.record.epoch,
                    current: s.epoch,
                });
            }
            // The window holds the last step: every step up to it exists.
            if last.is_some_and(|l| step <= l) {
                return Err(Error::StepExists { step });
            }
            if Some(step) != last.map_or(Some(0), |l| l.checked_add(1)) {
                return Err(Error::StepGap { step, last });
            }
            let topics = self.output_topics(commit.logs().map(|(name, _)| name))?;
            let texts: Vec<Vec<EntryTexts>> = commit
                .logs()
                .map(|(_, entries)| entries.iter().map(EntryTexts::of).collect())
                .collect();
            let mut records_out = Vec::new();
            for (((_, entries), (topic, n)), texts) in commit.logs().zip(&topics).zip(&texts) {
                for (entry, texts) in entries.iter().zip(texts) {
                    Self::entry_records(topic, *n, entry, texts, &mut records_out);
                }
            }
            let record =
                postcard::to_allocvec(&commit.record).map_err(Error::corrupt("step record"))?;
            let key = step.to_be_bytes();
            let steps_topic = self.config.steps_topic();
            records_out.push(Outgoing::step_log(&steps_topic, &key, &record));
            let positions = self.positions(&commit.record)?;
            let result = self.transact(
                &mut s.producer,
                "steps",
                Some(step),
                records_out,
                positions.as_ref(),
            );
            match result {
                Ok(offsets) => {
                    s.records
                        .as_mut()
                        .expect("loaded")
                        .insert(step, commit.record.clone());
                    // The step record is the transaction's last.
                    if let Some((_, offset)) = offsets.last() {
                        s.offsets.insert(step, (*offset).max(0) as u64);
                    }
                    s.prune(self.config.step_window);
                    Ok(())
                }
                Err(e) => {
                    // Whether an ambiguous commit took effect is learnt by
                    // the next `fence`, which reloads the step log.
                    s.forget();
                    s.epoch = 0;
                    s.producer = None;
                    Err(e)
                }
            }
        })
    }

    fn last_step(&self) -> Result<Option<u64>> {
        self.with_steps(|s| {
            Ok(s.records
                .as_ref()
                .and_then(|r| r.keys().next_back().copied()))
        })
    }

    fn step_record(&self, step: u64) -> Result<Option<StepRecord>> {
        self.with_steps(|s| {
            self.ensure_step(s, step)?;
            Ok(s.records.as_ref().and_then(|r| r.get(&step).cloned()))
        })
    }

    fn worker_commits(&self) -> bool {
        true
    }

    fn take_worker(self: Arc<Self>, worker: u32) -> Result<Box<dyn WorkerCommitter>> {
        // Initialising the producer fences every earlier holder and resolves
        // its open transaction; what it committed is read after.
        // What they committed is read at the first commit, to the step
        // topic's true end (so takes of several workers need not wait on
        // each other's dead holders' open transactions).
        let producer = self.new_producer(&format!("w{worker}"))?;
        Ok(Box::new(KafkaWorker {
            log: self,
            worker,
            producer: Some(producer),
            synced: false,
        }))
    }

    fn output_hashes(&self, step: u64) -> Result<Option<Vec<u128>>> {
        self.with_steps(|s| {
            // A step's done records follow its record: the window that
            // holds the record holds them.
            self.ensure_step(s, step)?;
            Ok(match s.records.as_ref().and_then(|r| r.get(&step)) {
                Some(r) if r.is_division() => Self::complete(s, r),
                Some(r) => Some(r.output_hashes.clone()),
                None => None,
            })
        })
    }

    fn await_complete(&self, step: u64) -> Result<Vec<u128>> {
        // The shares were committed before their holders answered, but a
        // broker may show them a moment later: read until every one is
        // there, for a while.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (hashes, missing) = self.with_steps(|s| {
                self.ensure_step(s, step)?;
                let Some(r) = s.records.as_ref().and_then(|r| r.get(&step)).cloned() else {
                    return Err(Error::InvalidCommit {
                        step,
                        message: "the step is not recorded".into(),
                    });
                };
                if !r.is_division() {
                    return Ok((Some(r.output_hashes), None));
                }
                if let Some(h) = Self::complete(s, &r) {
                    return Ok((Some(h), None));
                }
                self.catch_up(s)?;
                let missing =
                    (0..r.frontiers.len() as u32).find(|w| !s.done.contains_key(&(step, *w)));
                Ok((Self::complete(s, &r), missing))
            })?;
            if let Some(h) = hashes {
                return Ok(h);
            }
            if Instant::now() > deadline {
                return Err(Error::backend(
                    "Kafka",
                    format!("completing step {step}"),
                    true,
                    format!(
                        "worker {}'s done record is not in the step topic",
                        missing.unwrap_or_default()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn scan_output(
        &self,
        output: &str,
        from_step: u64,
        f: &mut dyn FnMut(OutputEntry) -> Result<std::ops::ControlFlow<()>>,
    ) -> Result<()> {
        // The last step as it stands now: output of steps committed while
        // this read goes on is left for the next read. A divided step not
        // complete yet (the last one, at most) is left out: its shares are
        // visible only once all are.
        let (last, complete) = self.with_steps(|s| {
            let records = s.records.as_ref();
            let last = records.and_then(|r| r.values().next_back());
            let complete = last.is_none_or(|r| !r.is_division() || Self::complete(s, r).is_some());
            Ok((last.map(|r| r.step), complete))
        })?;
        let Some(mut last) = last else {
            return Ok(());
        };
        if !complete {
            match last.checked_sub(1) {
                Some(l) => last = l,
                None => return Ok(()),
            }
        }
        let topic = self.config.topic(output);
        let Some(n) = self.topic_partitions(&topic)? else {
            return Ok(());
        };
        let mut bounds = Vec::with_capacity(n as usize);
        for p in 0..n {
            bounds.push(self.topic_watermarks(&topic, p)?);
        }
        // Windows of steps, doubling up to a bound: a reader that stops
        // early read about what it got, found by bisection, not the topic's
        // history, and a reader of all of it holds one window at a time.
        let (mut from, mut window) = (from_step, 16u64);
        while from <= last {
            let to = from.saturating_add(window).min(last + 1);
            let records = self.steps_in(from..to)?;
            // (step, worker) → events of the window, from every partition.
            let mut events: BTreeMap<(u64, u32), Vec<Event>> = BTreeMap::new();
            for (p, &(low, high)) in bounds.iter().enumerate() {
                let p = p as u32;
                let start = match from {
                    0 => low,
                    _ => self.first_offset_of_step(&topic, p, low..high, from)?,
                };
                let end = match to > last {
                    true => high,
                    false => self.first_offset_of_step(&topic, p, start..high, to)?,
                };
                self.read_records(&topic, p, start..end, &mut |msg| {
                    let (step, worker, weight) = output_headers(&topic, p, msg)?;
                    if (from..to).contains(&step) {
                        events.entry((step, worker)).or_default().push(Event {
                            value: msg.payload().unwrap_or_default().to_vec(),
                            weight,
                        });
                    }
                    Ok(())
                })?;
            }
            // One entry per step per worker, the empty ones included.
            for record in &records {
                let step = &record.step;
                for (w, frontier) in record.frontiers.iter().enumerate() {
                    let flow = f(OutputEntry {
                        step: *step,
                        worker: w as u32,
                        frontier: frontier.clone(),
                        events: events.remove(&(*step, w as u32)).unwrap_or_default(),
                    })?;
                    if flow.is_break() {
                        return Ok(());
                    }
                }
            }
            if let Some(((step, worker), _)) = events.into_iter().next() {
                return Err(Error::Corrupt {
                    what: format!("output topic `{topic}`"),
                    message: format!(
                        "records of step {step} worker {worker} have no committed step record"
                    ),
                });
            }
            from = to;
            window = window.saturating_mul(2).min(SCAN_WINDOW);
        }
        Ok(())
    }

    fn trim_output(&self, _output: &str, _below_step: u64) -> Result<()> {
        // Output topics keep their records as long as the topic's own
        // retention says: Sluice deletes none (others may read them).
        Ok(())
    }

    fn output_low(&self, _output: &str) -> Result<u64> {
        Ok(0)
    }

    fn trim(&self, input: &str, partition: u32, below: u64) -> Result<()> {
        let topic = self.check_partition(input, partition)?;
        if self.config.topics.contains_key(input) && !self.config.trim_named_topics {
            // A topic the user named may have other readers: its records
            // stay (the checkpoint covers them all the same).
            return Ok(());
        }
        let (low, high) = self.topic_watermarks(&topic, partition)?;
        let below = below.min(high);
        if below <= low {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, partition as i32, Offset::Offset(below as i64))
            .map_err(kafka("building a DeleteRecords request"))?;
        let opts = AdminOptions::new().operation_timeout(Some(self.config.timeout));
        let result = futures_executor::block_on(self.admin.delete_records(&tpl, &opts))
            .map_err(kafka(format!("trimming {topic}/{partition} below {below}")))?;
        for e in result.elements() {
            e.error()
                .map_err(kafka(format!("trimming {topic}/{partition} below {below}")))?;
        }
        Ok(())
    }
}

/// The most steps [`LogBackend::scan_output`] reads at once on Kafka.
const SCAN_WINDOW: u64 = 1024;

impl KafkaLog {
    /// The records of steps `steps` (all committed): copied from the
    /// window if it holds them, else read from the step topic without
    /// growing it.
    fn steps_in(&self, steps: Range<u64>) -> Result<Vec<StepRecord>> {
        let held = self.with_steps(|s| {
            Ok(s.covers(steps.start).then(|| {
                s.records
                    .as_ref()
                    .map(|r| r.range(steps.clone()).map(|(_, r)| r.clone()).collect())
                    .unwrap_or_default()
            }))
        })?;
        match held {
            Some(records) => Ok(records),
            None => self.read_old_steps(steps),
        }
    }
}
