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
    /// The pipeline's changes of component, as last recorded (key
    /// [`META_UPGRADES`](crate::ingest::META_UPGRADES)).
    pub(crate) upgrades: Option<Vec<u8>>,
}

/// What the step producer keeps: a *window* of the step topic, its newest
/// part, never the whole history.
///
/// The window holds every record at offsets `read_from..read_to` (and
/// possibly a few older checkpoint records): it starts at the tail — the
/// last step record and what follows — and grows downward only when an
/// older step is asked for (a recovery replaying the steps since its
/// checkpoint reads that far, and no further). Past
/// [`KafkaConfig::step_window`] records it drops its oldest half again.
///
/// [`KafkaConfig::step_window`]: crate::KafkaConfig::step_window
#[derive(Default)]
pub(crate) struct StepState {
    /// The step producer (`sluice.<pipeline>.steps`), once fenced.
    pub(crate) producer: Option<TxnProducer>,
    /// The epoch this handle's last `fence` took (0: none yet).
    pub(crate) epoch: u64,
    /// The step records in the window, once loaded (the last committed
    /// step's always among them).
    pub(crate) records: Option<BTreeMap<u64, StepRecord>>,
    /// The offset of each record in `records`, by step.
    pub(crate) offsets: BTreeMap<u64, u64>,
    /// Workers' done records of divided steps in the window: the hash, and
    /// the offset it was read at (`None`: committed through this handle,
    /// not read back yet).
    pub(crate) done: BTreeMap<(u64, u32), (u128, Option<u64>)>,
    /// Checkpoints recorded as committed ([`CheckpointLedger`]): their
    /// manifests, by step — every record in the window, and the newest few
    /// before it.
    ///
    /// [`CheckpointLedger`]: sluice_storage::CheckpointLedger
    pub(crate) checkpoints: BTreeMap<u64, String>,
    /// The step topic's offset from which the window is read.
    pub(crate) read_from: u64,
    /// The step topic's offset up to which the window is read.
    pub(crate) read_to: u64,
    /// The window starts at the topic's first record: no step is older
    /// than its first.
    pub(crate) whole: bool,
    /// The step last asked for by a reader of old records (a recovery
    /// replaying, an audit): pruning keeps it and every step after, up to
    /// [`HELD_AT_MOST`] times the cap, so a reader walking the history
    /// forward reads each record once.
    pub(crate) floor: Option<u64>,
    /// The step producer was lost in a failed checkpoint record (`true`:
    /// fenced): the next step commit says so instead of committing, and
    /// the next `fence` starts over.
    pub(crate) lost: Option<bool>,
}

impl StepState {
    /// Whether the window holds step `step`'s record if it is committed:
    /// it reaches back to `step` or to the topic's start.
    pub(crate) fn covers(&self, step: u64) -> bool {
        self.whole
            || self
                .records
                .as_ref()
                .and_then(|r| r.keys().next())
                .is_some_and(|first| *first <= step)
    }

    /// Forgets the window (the next use reads the tail again).
    pub(crate) fn forget(&mut self) {
        self.records = None;
        self.offsets.clear();
        self.done.clear();
        self.checkpoints.clear();
        self.read_from = 0;
        self.read_to = 0;
        self.whole = false;
        self.floor = None;
    }

    /// Drops the oldest records once the window holds more than `cap`,
    /// down to the newest `cap / 2` (at least the last step's) — or down
    /// to the [`floor`](Self::floor), if it is older, within
    /// [`HELD_AT_MOST`] times the cap: the window then starts at the first
    /// record kept. Checkpoint records older than it are kept, the newest
    /// [`CHECKPOINTS_KEPT`] of them.
    pub(crate) fn prune(&mut self, cap: usize) {
        let Some(records) = self.records.as_mut() else {
            return;
        };
        let cap = cap.max(2);
        if records.len() <= cap {
            return;
        }
        let newest = |n: usize| records.keys().rev().nth(n - 1).copied();
        let Some(half) = newest(cap / 2) else {
            return;
        };
        let first = match self.floor {
            Some(floor) if floor < half => match newest(cap * HELD_AT_MOST) {
                Some(most) => floor.max(most),
                None => floor,
            },
            _ => half,
        };
        if records.keys().next().is_none_or(|f| *f >= first) {
            return;
        }
        let Some(offset) = self.offsets.get(&first).copied() else {
            // Not known where it lies: keep the window as it is.
            return;
        };
        *records = records.split_off(&first);
        self.offsets = self.offsets.split_off(&first);
        self.done = self.done.split_off(&(first, 0));
        let older = self.checkpoints.range(..first).count();
        let drop = older.saturating_sub(CHECKPOINTS_KEPT);
        if let Some(keep_from) = self.checkpoints.keys().nth(drop).copied() {
            self.checkpoints = self.checkpoints.split_off(&keep_from);
        }
        self.read_from = offset;
        self.whole = false;
    }
}

/// How many times its cap a window may hold to keep a reader's
/// [`floor`](StepState::floor).
pub(crate) const HELD_AT_MOST: usize = 4;

/// How many checkpoint records older than the window a handle keeps (the
/// store asks for the [`KEPT`] newest).
///
/// [`KEPT`]: sluice_storage::checkpoint::KEPT
pub(crate) const CHECKPOINTS_KEPT: usize = 16;

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
