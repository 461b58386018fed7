//! Where a pipeline's logs live in Kafka: [`KafkaConfig`] (brokers, topic
//! names, client settings) and the check of a topic's name.

use rdkafka::config::ClientConfig;
use sluice_core::ConfigError;
use std::collections::HashMap;
use std::time::Duration;

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
    /// Replication factor of topics Sluice creates. `0` (the default): what
    /// the cluster offers, `min(3, brokers)` — with a warning when that is
    /// 1 (one broker's disk lost loses the step history, and the pipeline
    /// starts again at step 0); `-1` asks for the broker's default where
    /// the broker supports that.
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
    /// How many step records a handle keeps in memory at most (default
    /// [`STEP_WINDOW`]): the newest ones. An older record is read from the
    /// step topic again when asked for, so memory per pipeline does not
    /// grow with its history. At least 2.
    pub step_window: usize,
}

/// The default [`KafkaConfig::step_window`]: 4 096 step records, about 8 MB
/// at six workers.
pub const STEP_WINDOW: usize = 4096;

impl KafkaConfig {
    /// Logs of pipeline `pipeline` on `brokers`, with default topic names.
    pub fn new(brokers: impl Into<String>, pipeline: impl Into<String>) -> Self {
        KafkaConfig {
            brokers: brokers.into(),
            pipeline: pipeline.into(),
            topics: HashMap::new(),
            output_partitions: 1,
            replication: 0,
            timeout: Duration::from_secs(30),
            client: Vec::new(),
            inputs: Vec::new(),
            trim_named_topics: false,
            allow_compacted_inputs: false,
            step_window: STEP_WINDOW,
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

    /// The settings every client of the pipeline starts from: the brokers,
    /// Nagle's algorithm off, reconnecting within a second, then the extra
    /// [`client`](Self::client) settings.
    pub(crate) fn base(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        // Small requests (watermarks, commits) otherwise wait out delayed ACKs.
        c.set("socket.nagle.disable", "true");
        // A broker back after an outage is dialled again within a second
        // (the client's default backs off to 10 s between attempts, which
        // would hold every step that long after the broker answers).
        c.set("reconnect.backoff.max.ms", "1000");
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
