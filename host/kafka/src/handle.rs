//! The [`KafkaLog`] handle: its clients, the state it keeps behind its locks
//! (partition readers, the ingest and step producers with what they read of
//! the meta and step topics), and [`KafkaLog::open`].

use crate::config::{KafkaConfig, validate_topic};
use crate::errors::kafka;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::BaseConsumer;
use rdkafka::message::OwnedMessage;
use rdkafka::producer::BaseProducer;
use sluice_core::{ConfigError, StepRecord};
use sluice_storage::{ProducerState, Result};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

/// Locks `m`, taking its data as it is when a holder panicked (poisoning is
/// ignored).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A record's delivery: `(partition, offset)` or the client's error.
pub(crate) type Delivery = std::result::Result<(i32, i64), String>;

/// The partition readers, by `(topic, partition)`.
pub(crate) type Readers = HashMap<(String, u32), Arc<Mutex<PartitionReader>>>;

/// Collects delivery reports of one transaction, indexed by the opaque the
/// record was sent with.
#[derive(Default)]
pub(crate) struct Deliveries {
    /// One slot per record of the transaction, filled as its report comes.
    pub(crate) results: Mutex<Vec<Option<Delivery>>>,
}

/// The transactional producer of a role (steps, ingest, a worker).
pub(crate) type TxnProducer = BaseProducer<Deliveries>;

/// The context of Sluice's consumers: reaching the end of a partition is
/// how a read learns it is done, not an error worth logging.
pub(crate) struct Quiet;

/// A consumer with the [`Quiet`] context, as the partition readers use.
pub(crate) type QuietConsumer = BaseConsumer<Quiet>;

/// A reader kept assigned to one partition, so consecutive reads continue
/// without re-assigning (which would refetch).
pub(crate) struct PartitionReader {
    /// The consumer, assigned to the partition alone.
    pub(crate) consumer: QuietConsumer,
    /// The offset the next read is expected to start at.
    pub(crate) next: Option<u64>,
    /// A record already polled at or beyond the last read's end.
    pub(crate) pending: Option<OwnedMessage>,
}

/// What the ingest producer keeps: marks and producer sequence numbers.
#[derive(Default)]
pub(crate) struct MetaState {
    /// The ingest producer (`sluice.<pipeline>.ingest`), once created.
    pub(crate) producer: Option<TxnProducer>,
    /// Whether `marks` and `producers` were read from the meta topic.
    pub(crate) loaded: bool,
    /// Every source's ingest mark, by source.
    pub(crate) marks: HashMap<String, Vec<u8>>,
    /// By (producer id, input log).
    pub(crate) producers: HashMap<(String, String), ProducerState>,
}

/// What the step producer keeps.
#[derive(Default)]
pub(crate) struct StepState {
    /// The step producer (`sluice.<pipeline>.steps`), once fenced.
    pub(crate) producer: Option<TxnProducer>,
    /// The epoch this handle's last `fence` took (0: none yet).
    pub(crate) epoch: u64,
    /// Every committed step record, once loaded.
    pub(crate) records: Option<BTreeMap<u64, StepRecord>>,
    /// Every worker's done record of divided steps seen so far: the hash,
    /// and the offset it was read at (`None`: committed through this
    /// handle, not read back yet).
    pub(crate) done: BTreeMap<(u64, u32), (u128, Option<u64>)>,
    /// Every checkpoint recorded as committed ([`CheckpointLedger`]): its
    /// manifest, by step.
    ///
    /// [`CheckpointLedger`]: sluice_storage::CheckpointLedger
    pub(crate) checkpoints: BTreeMap<u64, String>,
    /// The step topic's offset up to which `records`, `done` and
    /// `checkpoints` are read.
    pub(crate) read_to: u64,
    /// The step producer was lost in a failed checkpoint record (`true`:
    /// fenced): the next step commit says so instead of committing, and
    /// the next `fence` starts over.
    pub(crate) lost: Option<bool>,
}

/// Input, output and step logs of one pipeline in Kafka.
pub struct KafkaLog {
    /// The configuration it was opened with.
    pub(crate) config: KafkaConfig,
    /// For creating, describing and trimming topics.
    pub(crate) admin: AdminClient<DefaultClientContext>,
    /// For metadata and watermark queries.
    pub(crate) client: BaseConsumer,
    /// For the true end of the step topic (`read_uncommitted`: the high
    /// watermark, past transactions still open), which a worker's new
    /// holder must read to.
    pub(crate) ends: BaseConsumer,
    /// Each topic's partition count, once known.
    pub(crate) partitions: Mutex<HashMap<String, u32>>,
    /// The partition readers, created on first use.
    pub(crate) readers: Mutex<Readers>,
    /// The high watermark each partition had when last asked (they only
    /// grow), so a read below it needs no round trip.
    pub(crate) highs: Mutex<HashMap<(String, u32), u64>>,
    /// The ingest producer and the meta topic as read.
    pub(crate) meta: Mutex<MetaState>,
    /// The step producer and the step topic as read.
    pub(crate) steps: Mutex<StepState>,
}

impl KafkaLog {
    /// Connects to the brokers and creates the pipeline's step and meta
    /// topics if missing. Nothing is fenced until [`LogBackend::fence`].
    ///
    /// [`LogBackend::fence`]: sluice_storage::LogBackend::fence
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
}
