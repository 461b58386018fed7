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
//! - **Step records** go to the pipeline's step topic (`<pipeline>.sluice-steps`,
//!   one partition). A step commits as **one Kafka transaction** holding every
//!   worker's output records and the step record, produced with the
//!   transactional id `sluice.<pipeline>.steps`: a second host opening the
//!   pipeline calls `init_transactions` with the same id, which bumps the
//!   producer epoch, aborts the zombie's open transaction and makes its next
//!   commit fail with [`StorageError::FencedProducer`].
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

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use sluice_core::crash::{CrashPoint, crash_point};
use sluice_core::{ConfigError, Event, Frontier, OutputEntry, PartitionId, StepCommit, StepRecord};
use sluice_storage::{
    AppendBatch, CheckpointLedger, LogBackend, ProducerCheck, ProducerSeq, ProducerState, Result,
    StorageError as Error, WorkerCommit, WorkerCommitter, WorkerDone, check_producer, decide_share,
};
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Header carrying an event's weight (decimal; `1` when absent).
pub const WEIGHT_HEADER: &str = "sluice-weight";
/// Header carrying the step that produced an output record.
pub const STEP_HEADER: &str = "sluice-step";
/// Header carrying the worker that produced an output record.
pub const WORKER_HEADER: &str = "sluice-worker";
/// Header carrying the input frontier an output record's entry covers.
pub const FRONTIER_HEADER: &str = "sluice-frontier";

/// Where a pipeline's logs live in Kafka.
#[derive(Debug, Clone)]
pub struct KafkaConfig {
    /// Bootstrap servers, `host:port[,host:port…]`.
    pub brokers: String,
    /// The pipeline's name: it derives the transactional ids (so every host
    /// running this pipeline fences the others) and default topic names.
    pub pipeline: String,
    /// Log name → topic, for logs not named `<pipeline>.<log>`.
    pub topics: HashMap<String, String>,
    /// Partitions of output topics Sluice creates.
    pub output_partitions: u32,
    /// Replication factor of topics Sluice creates (1 by default: set it to
    /// the cluster's, e.g. 3, in production; `-1` asks for the broker's
    /// default where the broker supports that).
    pub replication: i32,
    /// How long one broker operation may take before it fails (transiently).
    pub timeout: Duration,
    /// Extra librdkafka settings for every client (security, etc.).
    pub client: Vec<(String, String)>,
    /// The pipeline's input logs, in port order: each step commits how far
    /// it read them as the consumer-group offsets of `sluice.<pipeline>`,
    /// so Kafka's own tools show the pipeline's lag (none: no offsets).
    pub inputs: Vec<String>,
    /// Trim input topics named in `topics` too. By default only the
    /// pipeline's own topics (`<pipeline>.<port>`) are trimmed: a topic the
    /// user named may have other readers.
    pub trim_named_topics: bool,
    /// Accept input topics with `cleanup.policy=compact`. Compaction may
    /// remove a record a committed step read, and its replay would then
    /// read fewer: only safe when keys never repeat.
    pub allow_compacted_inputs: bool,
}

impl KafkaConfig {
    /// Logs of pipeline `pipeline` on `brokers`, with default topic names.
    pub fn new(brokers: impl Into<String>, pipeline: impl Into<String>) -> Self {
        KafkaConfig {
            brokers: brokers.into(),
            pipeline: pipeline.into(),
            topics: HashMap::new(),
            output_partitions: 1,
            replication: 1,
            timeout: Duration::from_secs(30),
            client: Vec::new(),
            inputs: Vec::new(),
            trim_named_topics: false,
            allow_compacted_inputs: false,
        }
    }

    /// The consumer group whose offsets show the pipeline's progress.
    pub fn group(&self) -> String {
        format!("sluice.{}", self.pipeline)
    }

    /// The topic holding log `log`.
    pub fn topic(&self, log: &str) -> String {
        self.topics
            .get(log)
            .cloned()
            .unwrap_or_else(|| format!("{}.{log}", self.pipeline))
    }

    /// The topic holding the step records.
    pub fn steps_topic(&self) -> String {
        format!("{}.sluice-steps", self.pipeline)
    }

    /// The topic holding ingest marks and producer sequence numbers.
    pub fn meta_topic(&self) -> String {
        format!("{}.sluice-meta", self.pipeline)
    }

    fn base(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        // Small requests (watermarks, commits) otherwise wait out delayed ACKs.
        c.set("socket.nagle.disable", "true");
        for (k, v) in &self.client {
            c.set(k, v);
        }
        c
    }
}

/// A Kafka topic name: 1–249 characters of `[A-Za-z0-9._-]`, not `.` or `..`.
pub fn validate_topic(topic: &str) -> Result<(), ConfigError> {
    let ok = !topic.is_empty()
        && topic.len() <= 249
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "invalid Kafka topic name {topic:?}: use 1-249 characters of A-Z a-z 0-9 _ - ."
        )))
    }
}

/// A closure turning the Kafka client's error while doing `what` into a
/// transient backend error (the broker may answer after recovery).
fn kafka(what: impl Into<String>) -> impl FnOnce(KafkaError) -> Error {
    let what = what.into();
    move |e| Error::backend("Kafka", what, true, e)
}

/// A transient Kafka failure described by Sluice itself (no client error).
fn kafka_failure(what: impl Into<String>, message: impl Into<String>) -> Error {
    Error::backend("Kafka", what, true, message.into())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A record's delivery: `(partition, offset)` or the client's error.
type Delivery = std::result::Result<(i32, i64), String>;

/// The partition readers, by `(topic, partition)`.
type Readers = HashMap<(String, u32), Arc<Mutex<PartitionReader>>>;

/// Collects delivery reports of one transaction, indexed by the opaque the
/// record was sent with.
#[derive(Default)]
struct Deliveries {
    results: Mutex<Vec<Option<Delivery>>>,
}

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

type TxnProducer = BaseProducer<Deliveries>;

/// One record of a transaction.
struct Outgoing<'a> {
    topic: &'a str,
    partition: i32,
    key: Option<&'a [u8]>,
    value: &'a [u8],
    headers: Option<OwnedHeaders>,
}

impl<'a> Outgoing<'a> {
    /// A record of the step log (one partition): a step record or a
    /// worker's done record.
    fn step_log(topic: &'a str, key: &'a [u8], value: &'a [u8]) -> Self {
        Outgoing {
            topic,
            partition: 0,
            key: Some(key),
            value,
            headers: None,
        }
    }

    fn into_record(self, index: usize) -> BaseRecord<'a, [u8], [u8], usize> {
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

/// The context of Sluice's consumers: reaching the end of a partition is
/// how a read learns it is done, not an error worth logging.
struct Quiet;

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

type QuietConsumer = BaseConsumer<Quiet>;

/// A reader kept assigned to one partition, so consecutive reads continue
/// without re-assigning (which would refetch).
struct PartitionReader {
    consumer: QuietConsumer,
    /// The offset the next read is expected to start at.
    next: Option<u64>,
    /// A record already polled at or beyond the last read's end.
    pending: Option<OwnedMessage>,
}

/// What the ingest producer keeps: marks and producer sequence numbers.
#[derive(Default)]
struct MetaState {
    producer: Option<TxnProducer>,
    loaded: bool,
    marks: HashMap<String, Vec<u8>>,
    /// By (producer id, input log).
    producers: HashMap<(String, String), ProducerState>,
}

/// What the step producer keeps.
#[derive(Default)]
struct StepState {
    producer: Option<TxnProducer>,
    /// The epoch this handle's last `fence` took (0: none yet).
    epoch: u64,
    /// Every committed step record, once loaded.
    records: Option<BTreeMap<u64, StepRecord>>,
    /// Every worker's done record of divided steps seen so far: the hash,
    /// and the offset it was read at (`None`: committed through this
    /// handle, not read back yet).
    done: BTreeMap<(u64, u32), (u128, Option<u64>)>,
    /// Every checkpoint recorded as committed ([`CheckpointLedger`]): its
    /// manifest, by step.
    checkpoints: BTreeMap<u64, String>,
    /// The step topic's offset up to which `records`, `done` and
    /// `checkpoints` are read.
    read_to: u64,
    /// The step producer was lost in a failed checkpoint record (`true`:
    /// fenced): the next step commit says so instead of committing, and
    /// the next `fence` starts over.
    lost: Option<bool>,
}

/// Input, output and step logs of one pipeline in Kafka.
pub struct KafkaLog {
    config: KafkaConfig,
    admin: AdminClient<DefaultClientContext>,
    /// For metadata and watermark queries.
    client: BaseConsumer,
    /// For the true end of the step topic (`read_uncommitted`: the high
    /// watermark, past transactions still open), which a worker's new
    /// holder must read to.
    ends: BaseConsumer,
    partitions: Mutex<HashMap<String, u32>>,
    readers: Mutex<Readers>,
    /// The high watermark each partition had when last asked (they only
    /// grow), so a read below it needs no round trip.
    highs: Mutex<HashMap<(String, u32), u64>>,
    meta: Mutex<MetaState>,
    steps: Mutex<StepState>,
}

const META_MARK: &str = "mark:";
const META_PRODUCER: &str = "producer:";

impl KafkaLog {
    /// Connects to the brokers and creates the pipeline's step and meta
    /// topics if missing. Nothing is fenced until [`LogBackend::fence`].
    pub fn open(config: KafkaConfig) -> Result<Self> {
        // The name prefixes topic names and transactional ids.
        if config.pipeline.len() > 200 {
            return Err(ConfigError::Invalid(format!(
                "Kafka pipeline name {:?} is longer than 200 characters",
                config.pipeline
            ))
            .into());
        }
        validate_topic(&config.pipeline)?;
        let admin: AdminClient<DefaultClientContext> = config
            .base()
            .create()
            .map_err(kafka("creating the Kafka admin client"))?;
        // Read committed: its end offsets are the last stable offsets, so a
        // step is divided before another producer's open transaction and
        // never waits for it (a broker that answers the high watermark
        // instead makes the reads wait).
        let query_client = |isolation: &str| -> Result<BaseConsumer> {
            config
                .base()
                .set("enable.auto.commit", "false")
                .set("isolation.level", isolation)
                .set("group.id", config.group())
                .create()
                .map_err(kafka("creating a Kafka client"))
        };
        let client = query_client("read_committed")?;
        let ends = query_client("read_uncommitted")?;
        let log = KafkaLog {
            config,
            admin,
            client,
            ends,
            partitions: Mutex::new(HashMap::new()),
            readers: Mutex::new(HashMap::new()),
            highs: Mutex::new(HashMap::new()),
            meta: Mutex::new(MetaState::default()),
            steps: Mutex::new(StepState::default()),
        };
        // The step topic is the pipeline's history: kept whatever the
        // broker's default retention (a pipeline idle for a week must not
        // lose its step records and start again at step 0).
        let steps_topic = log.config.steps_topic();
        log.ensure_topic(
            &steps_topic,
            1,
            &[("retention.ms", "-1"), ("retention.bytes", "-1")],
        )?;
        // A topic created before (by hand, or by an older Sluice) may still
        // have a finite retention: say so, it would lose the history.
        match log.topic_config(&steps_topic, "retention.ms") {
            Ok(Some(ms)) if ms != "-1" => tracing::warn!(
                topic = %steps_topic,
                retention_ms = %ms,
                "the pipeline's step topic has a finite retention: its step and checkpoint \
                 records would expire (set retention.ms=-1 and retention.bytes=-1 on it)"
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(topic = %steps_topic, error = %e, "reading the step topic's retention")
            }
        }
        log.ensure_topic(
            &log.config.meta_topic(),
            1,
            &[("cleanup.policy", "compact")],
        )?;
        Ok(log)
    }

    /// The configuration this log was opened with.
    pub fn config(&self) -> &KafkaConfig {
        &self.config
    }

    /// The last committed step as of now (read to the step topic's end:
    /// another host may be committing the steps).
    pub fn latest_step(&self) -> Result<Option<u64>> {
        self.with_fresh_steps(|s| {
            Ok(s.records
                .as_ref()
                .and_then(|r| r.keys().next_back().copied()))
        })
    }

    /// Reads offsets `range` of a partition, clipped to its end (reading
    /// past it would wait for records that may never come) — or, `exact`,
    /// failing when the range goes past it. The broker is asked for the
    /// end only when the range goes past the last one seen. Trimmed ranges
    /// fail in the read.
    fn read_upto(
        &self,
        input: &str,
        partition: u32,
        range: Range<u64>,
        exact: bool,
    ) -> Result<Vec<Event>> {
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
            events.push(decode_event(&topic, partition, msg)?);
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

    /// The partition count of `topic`, or `None` if it does not exist.
    fn topic_partitions(&self, topic: &str) -> Result<Option<u32>> {
        if let Some(n) = lock(&self.partitions).get(topic) {
            return Ok(Some(*n));
        }
        let md = self
            .client
            .fetch_metadata(Some(topic), self.config.timeout)
            .map_err(kafka(format!("reading metadata of topic `{topic}`")))?;
        let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
            return Ok(None);
        };
        match t.error() {
            None => {}
            Some(e) => {
                let code: RDKafkaErrorCode = e.into();
                if code == RDKafkaErrorCode::UnknownTopicOrPartition {
                    return Ok(None);
                }
                return Err(Error::backend(
                    "Kafka",
                    format!("reading metadata of topic `{topic}`"),
                    true,
                    KafkaError::MetadataFetch(code),
                ));
            }
        }
        if t.partitions().is_empty() {
            return Ok(None);
        }
        let n = t.partitions().len() as u32;
        lock(&self.partitions).insert(topic.to_owned(), n);
        Ok(Some(n))
    }

    /// Creates `topic` with `partitions` partitions if it does not exist;
    /// returns its partition count.
    fn ensure_topic(&self, topic: &str, partitions: u32, config: &[(&str, &str)]) -> Result<u32> {
        validate_topic(topic)?;
        if let Some(n) = self.topic_partitions(topic)? {
            return Ok(n);
        }
        let mut new = NewTopic::new(
            topic,
            partitions as i32,
            TopicReplication::Fixed(self.config.replication),
        );
        for (k, v) in config {
            new = new.set(k, v);
        }
        let opts = AdminOptions::new().operation_timeout(Some(self.config.timeout));
        let results = futures_executor::block_on(self.admin.create_topics([&new], &opts))
            .map_err(kafka(format!("creating topic `{topic}`")))?;
        for r in results {
            match r {
                Ok(_) => {}
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(ConfigError::Invalid(format!(
                        "the Kafka broker refused to create topic `{name}` with {partitions} \
                         partitions: {code}"
                    ))
                    .into());
                }
            }
        }
        // Metadata can lag the creation briefly.
        let deadline = Instant::now() + self.config.timeout;
        loop {
            if let Some(n) = self.topic_partitions(topic)? {
                return Ok(n);
            }
            if Instant::now() > deadline {
                return Err(kafka_failure(
                    format!("creating topic `{topic}`"),
                    "the topic did not appear in the metadata",
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The value of configuration `key` of `topic`, as the broker reports it.
    fn topic_config(&self, topic: &str, key: &str) -> Result<Option<String>> {
        let opts = AdminOptions::new().request_timeout(Some(self.config.timeout));
        let results = futures_executor::block_on(
            self.admin
                .describe_configs([&ResourceSpecifier::Topic(topic)], &opts),
        )
        .map_err(kafka(format!("describing topic `{topic}`")))?;
        for r in results {
            let resource = r.map_err(|code| {
                kafka(format!("describing topic `{topic}`"))(KafkaError::AdminOp(code))
            })?;
            if let Some(entry) = resource.get(key) {
                return Ok(entry.value.clone());
            }
        }
        Ok(None)
    }

    /// The partition count of an existing topic of log `log`, or an error.
    fn known_partitions(&self, log: &str) -> Result<(String, u32)> {
        let topic = self.config.topic(log);
        match self.topic_partitions(&topic)? {
            Some(n) => Ok((topic, n)),
            None => Err(Error::Unknown {
                kind: "log",
                name: log.to_owned(),
                hint: format!(" (Kafka topic `{topic}` does not exist)"),
            }),
        }
    }

    fn check_partition(&self, log: &str, partition: u32) -> Result<String> {
        let (topic, n) = self.known_partitions(log)?;
        if partition >= n {
            return Err(Error::Unknown {
                kind: "partition",
                name: format!("{log}/{partition}"),
                hint: format!(" (topic `{topic}` has {n} partitions)"),
            });
        }
        Ok(topic)
    }

    fn new_producer(&self, role: &str) -> Result<TxnProducer> {
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
    /// a fenced producer fails with [`StorageError::FencedProducer`](Error::FencedProducer).
    fn transact(
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
    fn failed(
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
            return Error::FencedProducer {
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
    fn read_records(
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
                Some(Err(KafkaError::PartitionEOF(_))) | None => check_position = true,
                Some(Err(e)) => return Err(kafka(format!("reading {topic}/{partition}"))(e)),
            }
        }
        r.next = Some(range.end);
        tracing::trace!(topic, partition, ?range, took = ?started.elapsed(), "read");
        Ok(())
    }

    fn topic_watermarks(&self, topic: &str, partition: u32) -> Result<(u64, u64)> {
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
    fn read_all(&self, topic: &str, f: &mut dyn FnMut(&OwnedMessage) -> Result<()>) -> Result<()> {
        let (low, high) = self.topic_watermarks(topic, 0)?;
        self.read_records(topic, 0, low..high, f)
    }

    fn load_meta(&self, meta: &mut MetaState) -> Result<()> {
        if meta.loaded {
            return Ok(());
        }
        // The pipeline's ingest producer first: its `init_transactions`
        // aborts a dead predecessor's open ingest transaction, which would
        // otherwise hold back this read until the broker times it out.
        if meta.producer.is_none() {
            meta.producer = Some(self.new_producer("ingest")?);
        }
        let (mut marks, mut producers) = (HashMap::new(), HashMap::new());
        let topic = self.config.meta_topic();
        self.read_all(&topic, &mut |m| {
            let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            let value = m.payload().unwrap_or_default();
            if let Some(source) = key.strip_prefix(META_MARK) {
                marks.insert(source.to_owned(), value.to_vec());
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
        meta.loaded = true;
        Ok(())
    }

    /// Reads the step topic from where `s` was read up to its end
    /// (committed records): step records (keyed by the step) and done
    /// records (keyed by step and worker). A second done record of one
    /// (step, worker) is corrupt: the worker's share was committed twice.
    fn catch_up(&self, s: &mut StepState) -> Result<()> {
        let topic = self.config.steps_topic();
        let bounds = self.topic_watermarks(&topic, 0)?;
        self.read_steps(s, &topic, bounds)
    }

    /// [`catch_up`](Self::catch_up) to the step topic's true end: past
    /// every transaction open now, waiting until each is committed or
    /// aborted. A worker's new holder reads this far before its first
    /// commit, so it sees every done record any earlier holder of any
    /// worker may still commit (a `read_committed` end stops at the first
    /// open transaction, possibly another worker's, before a done record of
    /// this one).
    fn catch_up_to_end(&self, s: &mut StepState) -> Result<()> {
        let topic = self.config.steps_topic();
        let (low, end) = self
            .ends
            .fetch_watermarks(&topic, 0, self.config.timeout)
            .map_err(kafka(format!("reading the end of {topic}")))?;
        self.read_steps(s, &topic, (low.max(0) as u64, end.max(0) as u64))
    }

    /// Reads the step topic from where `s` was read (or its low watermark)
    /// up to `end`, with the `read_committed` reader.
    fn read_steps(&self, s: &mut StepState, topic: &str, (low, end): (u64, u64)) -> Result<()> {
        let from = s.read_to.max(low);
        let records = s.records.get_or_insert_with(BTreeMap::new);
        let (done, checkpoints) = (&mut s.done, &mut s.checkpoints);
        self.read_records(topic, 0, from..end, &mut |m| {
            step_topic_record(topic, m, records, done, checkpoints)
        })?;
        s.read_to = s.read_to.max(end);
        Ok(())
    }

    /// Forgets what `s` holds of the step topic and reads it again from the
    /// start (left unloaded if that fails).
    fn reload_steps(&self, s: &mut StepState) -> Result<()> {
        s.records = None;
        s.done.clear();
        s.checkpoints.clear();
        s.read_to = 0;
        let read = self.catch_up(s);
        if read.is_err() {
            s.records = None;
        }
        read
    }

    fn with_steps<T>(&self, f: impl FnOnce(&mut StepState) -> Result<T>) -> Result<T> {
        let mut s = lock(&self.steps);
        if s.records.is_none() {
            self.reload_steps(&mut s)?;
        }
        f(&mut s)
    }

    /// [`with_steps`](Self::with_steps), having read what other hosts
    /// committed since — unless this handle is the committer: its view is
    /// whole (it read everything when it fenced, and no one else commits
    /// steps or records checkpoints without fencing it), and a committer
    /// that was fenced unawares must keep its own view, so that its next
    /// commit fails as fenced rather than as a gap.
    fn with_fresh_steps<T>(&self, f: impl FnOnce(&mut StepState) -> Result<T>) -> Result<T> {
        let mut s = lock(&self.steps);
        if s.records.is_none() {
            self.reload_steps(&mut s)?;
        } else if s.epoch == 0 {
            self.catch_up(&mut s)?;
        }
        f(&mut s)
    }

    /// Every worker's hash of step `step` if each done record is seen.
    fn complete(s: &StepState, record: &StepRecord) -> Option<Vec<u128>> {
        (0..record.frontiers.len() as u32)
            .map(|w| s.done.get(&(record.step, w)).map(|(h, _)| *h))
            .collect()
    }

    /// Each output log's topic (created if missing) and its partitions.
    fn output_topics<'n>(
        &self,
        names: impl Iterator<Item = &'n str>,
    ) -> Result<Vec<(String, u32)>> {
        names
            .map(|name| {
                let topic = self.config.topic(name);
                let n = self.ensure_topic(&topic, self.config.output_partitions, &[])?;
                Ok((topic, n))
            })
            .collect()
    }

    /// The output records of one entry (one per event) into `out`.
    fn entry_records<'a>(
        topic: &'a str,
        partitions: u32,
        entry: &'a OutputEntry,
        texts: &'a EntryTexts,
        out: &mut Vec<Outgoing<'a>>,
    ) {
        for (event, w) in entry.events.iter().zip(&texts.weights) {
            let headers = OwnedHeaders::new_with_capacity(4)
                .insert(Header {
                    key: STEP_HEADER,
                    value: Some(texts.step.as_bytes()),
                })
                .insert(Header {
                    key: WORKER_HEADER,
                    value: Some(texts.worker.as_bytes()),
                })
                .insert(Header {
                    key: WEIGHT_HEADER,
                    value: Some(w.as_bytes()),
                })
                .insert(Header {
                    key: FRONTIER_HEADER,
                    value: Some(texts.frontier.as_slice()),
                });
            out.push(Outgoing {
                topic,
                partition: (entry.worker % partitions) as i32,
                key: None,
                value: &event.value,
                headers: Some(headers),
            });
        }
    }
}

/// Takes in one record of the step topic: a step record (keyed by the
/// step), a worker's done record (keyed by step and worker) or a
/// checkpoint's commit (keyed `checkpoint:` and the step). A second done
/// record of one (step, worker) is corrupt: the worker's share was
/// committed twice.
fn step_topic_record(
    topic: &str,
    m: &OwnedMessage,
    records: &mut BTreeMap<u64, StepRecord>,
    done: &mut BTreeMap<(u64, u32), (u128, Option<u64>)>,
    checkpoints: &mut BTreeMap<u64, String>,
) -> Result<()> {
    let key = m.key().unwrap_or_default();
    let offset = m.offset() as u64;
    if key.starts_with(CHECKPOINT_KEY.as_bytes()) {
        let (step, manifest): (u64, String) = postcard::from_bytes(m.payload().unwrap_or_default())
            .map_err(Error::corrupt(format!("checkpoint record in `{topic}`")))?;
        checkpoints.insert(step, manifest);
        return Ok(());
    }
    if key.len() == DONE_KEY_LEN {
        let (step, worker, hash): (u64, u32, u128) =
            postcard::from_bytes(m.payload().unwrap_or_default())
                .map_err(Error::corrupt(format!("done record in `{topic}`")))?;
        match done.get_mut(&(step, worker)) {
            Some((h, at)) if *h == hash && at.is_none_or(|a| a == offset) => *at = Some(offset),
            Some(_) => {
                return Err(Error::Corrupt {
                    what: format!("step topic `{topic}`"),
                    message: format!(
                        "a second done record of step {step} worker {worker} (offset {offset}): \
                         the worker's share was committed twice (I1)"
                    ),
                });
            }
            None => {
                done.insert((step, worker), (hash, Some(offset)));
            }
        }
        return Ok(());
    }
    let record: StepRecord = postcard::from_bytes(m.payload().unwrap_or_default())
        .map_err(Error::corrupt(format!("step record in `{topic}`")))?;
    records.insert(record.step, record);
    Ok(())
}

/// The header texts of one output entry.
struct EntryTexts {
    step: String,
    worker: String,
    frontier: Vec<u8>,
    weights: Vec<String>,
}

impl EntryTexts {
    fn of(entry: &OutputEntry) -> Self {
        EntryTexts {
            step: entry.step.to_string(),
            worker: entry.worker.to_string(),
            frontier: frontier_json(&entry.frontier),
            weights: entry.events.iter().map(|e| e.weight.to_string()).collect(),
        }
    }
}

/// The error for a commit through a step producer a failed checkpoint
/// record lost: fenced, or a transient failure (a recovery fences again).
fn lost_producer(config: &KafkaConfig, step: Option<u64>, fenced: bool) -> Error {
    let transactional_id = format!("sluice.{}.steps", config.pipeline);
    match fenced {
        true => Error::FencedProducer {
            step,
            transactional_id,
        },
        false => Error::backend(
            "Kafka",
            format!("a transaction of `{transactional_id}`"),
            true,
            "the step producer was lost with a failed checkpoint record; reopen to fence again",
        ),
    }
}

/// A done record's key: the step and the worker, big-endian (a step
/// record's key is the step alone, 8 bytes).
const DONE_KEY_LEN: usize = 12;

/// How a checkpoint record's key starts (the step follows, in decimal: the
/// record is meant to be read with Kafka's tools too).
const CHECKPOINT_KEY: &str = "checkpoint:";

fn done_key(step: u64, worker: u32) -> [u8; DONE_KEY_LEN] {
    let mut key = [0; DONE_KEY_LEN];
    key[..8].copy_from_slice(&step.to_be_bytes());
    key[8..].copy_from_slice(&worker.to_be_bytes());
    key
}

/// One worker of a Kafka pipeline's divided steps, taken: its producer
/// (transactional id `sluice.<pipeline>.w<worker>`) was initialised after
/// every earlier holder's, which fenced them.
struct KafkaWorker {
    log: Arc<KafkaLog>,
    worker: u32,
    /// `None` once a transaction failed: a holder never re-initialises
    /// (that would fence whoever took the worker since); it is taken anew.
    producer: Option<TxnProducer>,
    /// Whether it read the step topic to its true end since it was taken.
    synced: bool,
}

impl sluice_storage::WorkerCommitter for KafkaWorker {
    fn worker(&self) -> u32 {
        self.worker
    }

    fn commit(&mut self, commit: &WorkerCommit) -> Result<WorkerDone> {
        let (step, worker) = (commit.step, commit.worker);
        let log = &self.log;
        // Everything any earlier holder committed, once (taking the worker
        // ended their transactions); then the division, read from the step
        // topic if this handle has not seen it yet (another host recorded
        // it).
        let synced = self.synced;
        let (record, done) = log.with_steps(|s| {
            if !synced {
                log.catch_up_to_end(s)?;
            }
            let known = s.records.as_ref().and_then(|r| r.get(&step)).is_some();
            if !known {
                log.catch_up(s)?;
            }
            Ok((
                s.records.as_ref().and_then(|r| r.get(&step)).cloned(),
                s.done.get(&(step, worker)).map(|(h, _)| *h),
            ))
        })?;
        self.synced = true;
        if let Some(done) = decide_share(self.worker, record.as_ref(), done, commit)? {
            return Ok(done);
        }
        let role = format!("w{worker}");
        if self.producer.is_none() {
            return Err(Error::backend(
                "Kafka",
                format!("committing worker {worker}'s share of step {step}"),
                true,
                "an earlier transaction of this holder failed: the worker must be taken again",
            ));
        }
        let topics = log.output_topics(commit.outputs.iter().map(|(name, _)| name.as_str()))?;
        let texts: Vec<EntryTexts> = commit
            .outputs
            .iter()
            .map(|(_, e)| EntryTexts::of(e))
            .collect();
        let mut records = Vec::new();
        for (((_, entry), (topic, n)), texts) in commit.outputs.iter().zip(&topics).zip(&texts) {
            KafkaLog::entry_records(topic, *n, entry, texts, &mut records);
        }
        let value = postcard::to_allocvec(&(step, worker, commit.hash))
            .map_err(Error::corrupt("done record"))?;
        let key = done_key(step, worker);
        let steps_topic = log.config.steps_topic();
        records.push(Outgoing::step_log(&steps_topic, &key, &value));
        log.transact(&mut self.producer, &role, Some(step), records, None)
            .map_err(|e| match e {
                // Another holder took the worker: this one is a zombie, the
                // pipeline is not taken over (a recovery takes it anew).
                Error::FencedProducer { .. } => Error::WorkerTaken { worker, step },
                e => e,
            })?;
        log.with_steps(|s| {
            s.done.entry((step, worker)).or_insert((commit.hash, None));
            Ok(())
        })?;
        Ok(WorkerDone::Committed)
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

/// The step, worker and weight headers of an output record.
fn output_headers(topic: &str, p: u32, msg: &OwnedMessage) -> Result<(u64, u32, i64)> {
    let step = header(msg, STEP_HEADER).and_then(number::<u64>);
    let worker = header(msg, WORKER_HEADER).and_then(number::<u32>);
    let weight = header(msg, WEIGHT_HEADER).and_then(number::<i64>);
    match (step, worker, weight) {
        (Some(step), Some(worker), Some(weight)) => Ok((step, worker, weight)),
        _ => Err(Error::Corrupt {
            what: format!("output record {topic}/{p}@{}", msg.offset()),
            message: format!(
                "missing or malformed `{STEP_HEADER}`, `{WORKER_HEADER}` or `{WEIGHT_HEADER}` \
                 header (was the topic written by another producer?)"
            ),
        }),
    }
}

fn header<'a>(msg: &'a OwnedMessage, key: &str) -> Option<&'a [u8]> {
    let headers = msg.headers()?;
    (0..headers.count())
        .filter_map(|i| headers.try_get(i))
        .find(|h| h.key == key)
        .and_then(|h| h.value)
}

fn number<T: std::str::FromStr>(bytes: &[u8]) -> Option<T> {
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

/// Decodes an input record: the value must be JSON; the weight header, if
/// present, a non-zero integer.
fn decode_event(topic: &str, partition: u32, msg: &OwnedMessage) -> Result<Event> {
    let at = || format!("record {topic}/{partition}@{}", msg.offset());
    let value = msg.payload().ok_or_else(|| Error::Corrupt {
        what: at(),
        message: "the record has no value (Sluice input records carry a JSON value)".into(),
    })?;
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(value) {
        return Err(Error::Corrupt {
            what: at(),
            message: format!("the value is not JSON: {e}"),
        });
    }
    let weight = match header(msg, WEIGHT_HEADER) {
        None => 1,
        Some(w) => match number::<i64>(w) {
            Some(n) if n != 0 => n,
            _ => {
                return Err(Error::Corrupt {
                    what: at(),
                    message: format!(
                        "header `{WEIGHT_HEADER}` must be a non-zero integer, got {:?}",
                        String::from_utf8_lossy(w)
                    ),
                });
            }
        },
    };
    Ok(Event {
        value: value.to_vec(),
        weight,
    })
}

fn frontier_json(f: &Frontier) -> Vec<u8> {
    let v: Vec<[u64; 3]> = f
        .iter()
        .map(|(id, o)| [id.input as u64, id.partition as u64, *o])
        .collect();
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Parses a `sluice-frontier` header (for consumers and tests).
pub fn parse_frontier(bytes: &[u8]) -> Option<Frontier> {
    let v: Vec<[u64; 3]> = serde_json::from_slice(bytes).ok()?;
    Some(
        v.into_iter()
            .map(|[i, p, o]| {
                (
                    PartitionId {
                        input: i as u32,
                        partition: p as u32,
                    },
                    o,
                )
            })
            .collect(),
    )
}

/// Checkpoint commits as records on the step topic (key `checkpoint:` and
/// the step, value `(step, manifest)`), each in a transaction of the step
/// producer: a host whose producer another's `init_transactions` fenced
/// records none ([`StorageError::FencedProducer`](Error::FencedProducer)),
/// exactly as it commits no step.
impl CheckpointLedger for KafkaLog {
    fn record_checkpoint(&self, step: u64, manifest: &str) -> Result<()> {
        self.with_steps(|s| {
            if let Some(fenced) = s.lost {
                return Err(lost_producer(&self.config, None, fenced));
            }
            if s.epoch == 0 || s.producer.is_none() {
                return Err(Error::InvalidCommit {
                    step,
                    message: "the Kafka log was not fenced (call `fence` first), so it records \
                              no checkpoint"
                        .into(),
                });
            }
            let value = postcard::to_allocvec(&(step, manifest))
                .map_err(Error::corrupt("checkpoint record"))?;
            let key = format!("{CHECKPOINT_KEY}{step}");
            let topic = self.config.steps_topic();
            let record = Outgoing::step_log(&topic, key.as_bytes(), &value);
            match self.transact(&mut s.producer, "steps", None, vec![record], None) {
                Ok(_) => {
                    s.checkpoints.insert(step, manifest.to_owned());
                    Ok(())
                }
                Err(e) => {
                    // The producer is gone (whether the record took effect
                    // the next `fence` learns): the steps this coordinator
                    // still tries fail the same way — fenced, or worth a
                    // recovery — rather than as a misuse.
                    s.lost = Some(matches!(e, Error::FencedProducer { .. }));
                    s.producer = None;
                    Err(e)
                }
            }
        })
    }

    fn recorded_checkpoints(&self, newest: usize) -> Result<Vec<(u64, String)>> {
        self.with_fresh_steps(|s| {
            let mut out: Vec<(u64, String)> = s
                .checkpoints
                .iter()
                .rev()
                .take(newest)
                .map(|(step, m)| (*step, m.clone()))
                .collect();
            out.reverse();
            Ok(out)
        })
    }

    fn recorded_checkpoint(&self, step: u64) -> Result<Option<String>> {
        if let Some(m) = lock(&self.steps).checkpoints.get(&step) {
            return Ok(Some(m.clone()));
        }
        self.with_fresh_steps(|s| Ok(s.checkpoints.get(&step).cloned()))
    }
}

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
        self.read_upto(input, partition, range, false)
    }

    fn read_exact(&self, input: &str, partition: u32, range: Range<u64>) -> Result<Vec<Event>> {
        self.read_upto(input, partition, range, true)
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
        self.reload_steps(&mut s)?;
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
                return Err(Error::Fenced {
                    step,
                    epoch: commit.record.epoch,
                    current: s.epoch,
                });
            }
            if records.contains_key(&step) {
                return Err(Error::StepExists { step });
            }
            if Some(step) != last.map_or(Some(0), |l| l.checked_add(1)) {
                return Err(Error::StepGap { step, last });
            }
            let topics =
                self.output_topics(commit.outputs.iter().map(|(name, _)| name.as_str()))?;
            let texts: Vec<Vec<EntryTexts>> = commit
                .outputs
                .iter()
                .map(|(_, entries)| entries.iter().map(EntryTexts::of).collect())
                .collect();
            let mut records_out = Vec::new();
            for (((_, entries), (topic, n)), texts) in
                commit.outputs.iter().zip(&topics).zip(&texts)
            {
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
                Ok(_) => {
                    s.records
                        .as_mut()
                        .expect("loaded")
                        .insert(step, commit.record.clone());
                    Ok(())
                }
                Err(e) => {
                    // Whether an ambiguous commit took effect is learnt by
                    // the next `fence`, which reloads the step log.
                    s.records = None;
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
        self.with_steps(|s| Ok(s.records.as_ref().and_then(|r| r.get(&step).cloned())))
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
        // The step records as they stand now: output of steps committed
        // while this read goes on is left for the next read.
        // A divided step not complete yet (the last one, at most) is left
        // out: its shares are visible only once all are.
        let (records, complete) = self.with_steps(|s| {
            let records = s.records.clone().unwrap_or_default();
            let complete = records
                .values()
                .next_back()
                .is_none_or(|r| !r.is_division() || Self::complete(s, r).is_some());
            Ok((records, complete))
        })?;
        let Some(mut last) = records.keys().next_back().copied() else {
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
        // Windows of steps, doubling: a reader that stops early read about
        // what it got, found by bisection, not the topic's history.
        let (mut from, mut window) = (from_step, 16u64);
        while from <= last {
            let to = from.saturating_add(window).min(last + 1);
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
            for (step, record) in records.range(from..to) {
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
            window = window.saturating_mul(2);
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

impl KafkaLog {
    /// The input positions a step's record says were consumed, as the
    /// offsets the pipeline's consumer group commits with the step (none when
    /// the input logs were not named in the configuration).
    fn positions(&self, record: &StepRecord) -> Result<Option<TopicPartitionList>> {
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
    fn first_offset_of_step(
        &self,
        topic: &str,
        p: u32,
        range: Range<u64>,
        step: u64,
    ) -> Result<u64> {
        let (mut lo, mut hi) = (range.start, range.end);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.first_record_from(topic, p, mid..hi)? {
                Some((offset, s)) if s < step => lo = offset + 1,
                // Nothing at or after `mid` is older than `step`.
                _ => hi = mid,
            }
        }
        Ok(lo)
    }

    /// The offset and step of the first committed record of `topic`/`p` in
    /// `range`, reading a growing window from its start.
    fn first_record_from(
        &self,
        topic: &str,
        p: u32,
        range: Range<u64>,
    ) -> Result<Option<(u64, u64)>> {
        let mut window = 64;
        loop {
            let end = range.end.min(range.start.saturating_add(window));
            let mut first = None;
            self.read_records(topic, p, range.start..end, &mut |msg| {
                if first.is_none() {
                    let (step, _, _) = output_headers(topic, p, msg)?;
                    first = Some((msg.offset() as u64, step));
                }
                Ok(())
            })?;
            if first.is_some() || end == range.end {
                return Ok(first);
            }
            // Only transaction markers and aborted records so far.
            window = window.saturating_mul(4);
        }
    }

    /// An append by a producer with a sequence number: the events and the
    /// producer's new state in one transaction. The state records the
    /// offsets the events got, which Kafka assigns on delivery, so the events
    /// are sent and delivered first, inside the same open transaction.
    fn append_with_producer_state(
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

fn send(
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
fn await_deliveries(
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

fn delivered(producer: &TxnProducer, n: usize) -> std::result::Result<Vec<(i32, i64)>, KafkaError> {
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

/// Per append entry, the offsets its events got: from the first event's
/// offset to one past the last's (offsets within a transaction may skip).
fn ranges_of(batch: &AppendBatch, offsets: &[(i32, i64)]) -> Vec<Range<u64>> {
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

/// Deletes the topics a pipeline owns — its step and meta topics and every
/// `<pipeline>.<log>` topic (logs named to other topics in
/// [`KafkaConfig::topics`] are not the pipeline's and stay) — and its
/// consumer group. Returns the topics deleted.
pub fn delete_topics(config: &KafkaConfig) -> Result<Vec<String>> {
    let admin: AdminClient<DefaultClientContext> = config
        .base()
        .create()
        .map_err(kafka("creating the Kafka admin client"))?;
    let client: BaseConsumer = config
        .base()
        .create()
        .map_err(kafka("creating a Kafka client"))?;
    let md = client
        .fetch_metadata(None, config.timeout)
        .map_err(kafka("listing topics"))?;
    let prefix = format!("{}.", config.pipeline);
    let named: std::collections::HashSet<&String> = config.topics.values().collect();
    // Log names hold no `.`: a topic with one more is another pipeline's.
    let owned: Vec<String> = md
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|t| {
            t.strip_prefix(&prefix)
                .is_some_and(|rest| !rest.is_empty() && !rest.contains('.'))
                && !named.contains(t)
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(config.timeout));
    if !owned.is_empty() {
        let names: Vec<&str> = owned.iter().map(String::as_str).collect();
        let results = futures_executor::block_on(admin.delete_topics(&names, &opts))
            .map_err(kafka("deleting the pipeline's topics"))?;
        for r in results {
            if let Err((topic, code)) = r
                && code != RDKafkaErrorCode::UnknownTopicOrPartition
            {
                return Err(kafka_failure(
                    format!("deleting topic `{topic}`"),
                    code.to_string(),
                ));
            }
        }
    }
    // The group only shows progress; a broker without it is fine.
    let _ = futures_executor::block_on(admin.delete_groups(&[&config.group()], &opts));
    Ok(owned)
}
