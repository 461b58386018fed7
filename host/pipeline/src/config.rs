//! What a pipeline is made of: its data directory, W, where its logs live
//! and how it runs.

use sluice_runtime::PipelineOptions;
use std::path::PathBuf;

/// The configuration of one pipeline.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// The data directory: the pipeline's RocksDB (checkpoints, metadata,
    /// and the logs when they are embedded) and its lock.
    pub data: PathBuf,
    /// The number of workers W a new pipeline starts with.
    pub workers: u32,
    /// Run with this many workers: a pipeline stored with another W changes
    /// its layout to this many right after recovery (a live rescale that
    /// moves only the shards the new balance needs). `None`: keep the
    /// stored W.
    pub rescale_to: Option<u32>,
    /// Partitions of each input log of a new pipeline (default: W, at least
    /// [`DEFAULT_PARTITIONS`]), fixed for its life: a worker reads several
    /// or none, so W can change without re-partitioning. Existing Kafka
    /// topics keep theirs.
    pub partitions: Option<u32>,
    /// Where the input, output and step logs live.
    pub log: LogConfig,
    /// Where checkpoints live: `None`, the data directory's RocksDB; a URL
    /// (`file:///dir`, `s3://bucket/prefix`), an object store every host
    /// that may run the pipeline reaches, so another machine can take it
    /// over — with a copy of this host's newest checkpoints kept in the
    /// data directory, which a restart here restores from without
    /// downloading.
    pub checkpoint_store: Option<String>,
    /// Steps, checkpoints, output limits, and what a record that is not an
    /// event does, per input port (`options.bad_records`: `fail`, the
    /// default, or `dead-letter`, which skips it into the port's
    /// dead-letter log `<port>.dead-letter` — for Kafka the topic
    /// `<pipeline>.<port>.dead-letter` unless `sluice_kafka::KafkaConfig`'s
    /// `topics` names the log another; a port the circuit does not have is
    /// refused). `options.name` is replaced by the pipeline's stored
    /// identity when it opens.
    pub options: PipelineOptions,
    /// Prefix of a new pipeline's identity (the server uses
    /// `<tenant>/<pipeline>/`); ignored for Kafka logs, whose identity is
    /// the Kafka pipeline name every host shares.
    pub id_prefix: String,
}

impl PipelineConfig {
    /// A pipeline in `data` with `workers` workers, embedded logs and
    /// default options.
    pub fn new(data: impl Into<PathBuf>, workers: u32) -> Self {
        PipelineConfig {
            data: data.into(),
            workers,
            rescale_to: None,
            partitions: None,
            log: LogConfig::default(),
            checkpoint_store: None,
            options: PipelineOptions::default(),
            id_prefix: String::new(),
        }
    }
}

/// The fewest input partitions a new pipeline gets when none are asked
/// for: room to grow to this many workers, each reading its own.
pub const DEFAULT_PARTITIONS: u32 = 8;

impl PipelineConfig {
    /// The partitions a new input log gets.
    pub fn input_partitions(&self) -> u32 {
        self.partitions
            .unwrap_or(self.workers.max(DEFAULT_PARTITIONS))
            .max(1)
    }
}

/// Where a pipeline's input, output and step logs live (checkpoints: see
/// [`PipelineConfig::checkpoint_store`]).
#[derive(Debug, Clone)]
pub enum LogConfig {
    /// In the data directory's RocksDB (the default).
    Embedded {
        /// Whether step commits are fsynced. Always, except in benchmarks
        /// that measure what durability costs: an unsynced commit can be
        /// lost by a machine crash.
        sync_commits: bool,
    },
    /// In Kafka topics.
    #[cfg(feature = "kafka")]
    Kafka {
        /// Brokers, pipeline name (the identity every host shares) and topics.
        config: sluice_kafka::KafkaConfig,
    },
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig::Embedded { sync_commits: true }
    }
}

impl LogConfig {
    /// Which kind of log this is (what `--log` named), in builds with and
    /// without the Kafka backend alike.
    pub fn kind(&self) -> LogKind {
        match self {
            LogConfig::Embedded { .. } => LogKind::Embedded,
            #[cfg(feature = "kafka")]
            LogConfig::Kafka { .. } => LogKind::Kafka,
        }
    }
}

/// Where a pipeline's logs live, as a user names it: `sluice run --log`,
/// a server pipeline spec's `"log"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogKind {
    /// The data directory's RocksDB.
    #[default]
    Embedded,
    /// Kafka topics.
    Kafka,
}

impl std::str::FromStr for LogKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "embedded" => Ok(LogKind::Embedded),
            "kafka" => Ok(LogKind::Kafka),
            _ => Err(format!("unknown log kind {s:?}: use `embedded` or `kafka`")),
        }
    }
}

impl std::fmt::Display for LogKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogKind::Embedded => "embedded",
            LogKind::Kafka => "kafka",
        })
    }
}
