//! The storage layer's error: what a backend or the invariant checks
//! report. Whether retrying can help ([`StorageError::is_transient`]) is
//! decided where the error is made: a backend marks its own failures.

use sluice_core::ConfigError;
use std::path::PathBuf;

/// Any error, boxed: a backend's own error type, kept as the source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result with a [`StorageError`].
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// What can go wrong in storage.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// A backend operation failed: RocksDB, a Kafka client or broker, an
    /// injected fault. The backend decides whether a retry may help.
    #[error("{backend} ({what}): {source}")]
    Backend {
        /// Which backend: "RocksDB", "Kafka", …
        backend: &'static str,
        /// What the host was doing.
        what: String,
        /// The backend's error.
        #[source]
        source: BoxError,
        /// Whether a retry (after recovering) may succeed.
        transient: bool,
    },

    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// Another process holds the pipeline's data directory.
    #[error(
        "data directory {dir} is in use by {holder}; stop that process first (two hosts must never run one pipeline)"
    )]
    Locked {
        /// The data directory.
        dir: PathBuf,
        /// Who holds it, as the holder recorded it.
        holder: String,
    },

    /// A commit from a host whose fencing epoch was superseded (a zombie):
    /// another host took the pipeline over with a newer epoch (the embedded
    /// log's fencing). (Called `Fenced` before.)
    #[error(
        "fenced: this host's epoch {epoch} was superseded by epoch {current}; another host has taken over \
         the pipeline, so this one must stop (its commit of step {step} was refused)"
    )]
    HostEpochSuperseded {
        /// The step whose commit was refused.
        step: u64,
        /// This host's epoch.
        epoch: u64,
        /// The log's current epoch.
        current: u64,
    },

    /// A transactional log (Kafka) fenced this host's transactional
    /// producer: another host opened the pipeline with the same
    /// transactional id and a newer producer epoch, so this one must stop.
    /// Its open transaction was aborted. (Called `FencedProducer` before.)
    #[error(
        "fenced: another host has taken over the pipeline (Kafka transactional id `{transactional_id}` \
         has a newer producer epoch), so this one must stop{}",
        .step.map(|s| format!("; its commit of step {s} was aborted")).unwrap_or_default()
    )]
    TransactionalProducerSuperseded {
        /// The step whose commit was aborted, if a step commit.
        step: Option<u64>,
        /// The transactional id both hosts use.
        transactional_id: String,
    },

    /// I1: an output log never holds two entries for one step.
    #[error("step {step} is already committed; refusing to write it again (invariant I1)")]
    StepExists {
        /// The step that was written twice.
        step: u64,
    },

    /// A step commit that does not directly follow the last committed step.
    #[error("step {step} cannot be committed after step {last:?}: steps commit in order")]
    StepGap {
        /// The step offered.
        step: u64,
        /// The last committed step, if any.
        last: Option<u64>,
    },

    /// A step commit whose shape or frontiers break the protocol.
    #[error("invalid commit of step {step}: {message}")]
    InvalidCommit {
        /// The step offered.
        step: u64,
        /// What is wrong with it.
        message: String,
    },

    /// A worker's commit of a step whose done record already exists with
    /// another output hash: the replay computed other output than the run
    /// that committed it.
    #[error(
        "step {step} worker {worker}: the output hashes to {replayed}, but the worker's committed \
         done record says {committed} (a replay must produce what was committed)"
    )]
    DoneDiffers {
        /// The step.
        step: u64,
        /// The worker.
        worker: u32,
        /// The hash in the done record.
        committed: String,
        /// The hash of the output offered now.
        replayed: String,
    },

    /// A worker's commit after another holder took the worker
    /// ([`LogBackend::take_worker`](crate::LogBackend::take_worker)): this
    /// holder is a zombie and must stop.
    #[error(
        "fenced: worker {worker} was taken by another holder, so this one must stop (its commit of \
         step {step} was refused)"
    )]
    WorkerTaken {
        /// The worker.
        worker: u32,
        /// The step whose commit was refused.
        step: u64,
    },

    /// A checkpoint the store or the invariant checks refuse.
    #[error("refusing a checkpoint of step {step}: {message}")]
    InvalidCheckpoint {
        /// The checkpoint's step.
        step: u64,
        /// What is wrong with it.
        message: String,
    },

    /// I2: input is trimmed only below a committed checkpoint's frontier.
    #[error(
        "refusing to trim input `{input}` partition {partition} below offset {requested}: \
         the newest committed checkpoint covers it only up to {allowed} (invariant I2)"
    )]
    TrimAboveCheckpoint {
        /// Input log.
        input: String,
        /// Partition.
        partition: u32,
        /// The offset asked for.
        requested: u64,
        /// The checkpoint's frontier (0 without a checkpoint).
        allowed: u64,
    },

    /// A read below the log's low watermark.
    #[error(
        "input `{input}` partition {partition}: offsets below {low} were trimmed, cannot read from {from}"
    )]
    Trimmed {
        /// Input log.
        input: String,
        /// Partition.
        partition: u32,
        /// First offset asked for.
        from: u64,
        /// The log's low watermark.
        low: u64,
    },

    /// An input that ends below where the pipeline has read it: a topic
    /// deleted and made again, or truncated, under the pipeline.
    #[error(
        "input `{input}` partition {partition} now ends at offset {end}, below offset {frontier} \
         that the pipeline has already read: the log was deleted, recreated or truncated under \
         the pipeline; its events cannot be matched to the committed steps"
    )]
    InputShrank {
        /// Input log.
        input: String,
        /// Partition.
        partition: u32,
        /// Its end (high watermark) now.
        end: u64,
        /// How far the pipeline read it.
        frontier: u64,
    },

    /// A log or partition that does not exist.
    #[error("unknown {kind} `{name}`{hint}")]
    Unknown {
        /// "input log", "partition", …
        kind: &'static str,
        /// The name given.
        name: String,
        /// More context, e.g. how many partitions there are.
        hint: String,
    },

    /// An input record that is not an event (not JSON, a malformed weight
    /// header), met where events only are read: under its input's
    /// bad-record policy `fail`, the step stops here, every time it runs.
    #[error(
        "input record {position} is not an event: {message}; the pipeline stops at it (its \
         input's bad-record policy is `fail`): skip such records into the input's dead-letter \
         log with the policy `dead-letter` (`--bad-records PORT=dead-letter`, or the pipeline \
         spec's `bad_records`)"
    )]
    BadRecord {
        /// Where the record is: `topic/partition@offset` (Kafka),
        /// `input/partition@offset` (embedded).
        position: String,
        /// Why it is not an event.
        message: String,
    },

    /// An input read in place ([`crate::in_place`]) whose file no longer
    /// holds the lines the pipeline took from it: deleted, truncated or
    /// rewritten. Its steps cannot be replayed from it.
    #[error(
        "input `{input}` is read in place from {path}, which {message}: the pipeline's steps \
         were taken from the file as it was; restore it (appending lines to it is fine), or \
         run the pipeline again in a new --data directory"
    )]
    InPlaceChanged {
        /// The input log.
        input: String,
        /// The file.
        path: PathBuf,
        /// What changed.
        message: String,
    },

    /// Stored data could not be decoded, or contradicts itself.
    #[error("corrupt {what}: {message}")]
    Corrupt {
        /// Which record.
        what: String,
        /// The decoder's complaint.
        message: String,
    },

    /// A producer's append whose sequence number is below its last one: a
    /// retry of an append older than the last (nothing was appended).
    #[error(
        "duplicate sequence: producer `{producer}` on input `{input}` sent sequence number {seq}, \
         but {last} was already acknowledged; nothing was appended"
    )]
    DuplicateSequence {
        /// The producer.
        producer: String,
        /// The input log.
        input: String,
        /// The sequence number sent.
        seq: u64,
        /// The last one acknowledged.
        last: u64,
    },

    /// A producer's append that skips sequence numbers (an earlier append
    /// is missing or still in flight); nothing was appended.
    #[error(
        "out-of-order sequence: producer `{producer}` on input `{input}` sent sequence number \
         {seq}, the next expected is {expected}; nothing was appended"
    )]
    OutOfOrderSequence {
        /// The producer.
        producer: String,
        /// The input log.
        input: String,
        /// The sequence number sent.
        seq: u64,
        /// The next one the input expects.
        expected: u64,
    },

    /// An append from an input producer's session older than the current
    /// one (exactly-once ingest): nothing was appended. (Called
    /// `ProducerFenced` before; the HTTP error code stays `producer_fenced`.)
    #[error(
        "fenced producer: producer `{producer}` on input `{input}` sent epoch {epoch}, but a newer \
         session (epoch {current}) has started; nothing was appended"
    )]
    InputProducerSuperseded {
        /// The producer.
        producer: String,
        /// The input log.
        input: String,
        /// The epoch sent.
        epoch: u64,
        /// The current epoch.
        current: u64,
    },

    /// What was asked conflicts with what is stored, or is not valid.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl StorageError {
    /// Whether the error may go away on retry (after recovering): a
    /// backend's transient failure or an I/O error. A violated invariant, a
    /// fenced host, corruption or a configuration conflict will not.
    pub fn is_transient(&self) -> bool {
        match self {
            StorageError::Backend { transient, .. } => *transient,
            StorageError::Io { .. } => true,
            // A worker's holder was fenced: a recovery takes it anew.
            StorageError::WorkerTaken { .. } => true,
            _ => false,
        }
    }

    /// An error of `backend` doing `what`, with its source.
    pub fn backend(
        backend: &'static str,
        what: impl Into<String>,
        transient: bool,
        source: impl Into<BoxError>,
    ) -> StorageError {
        StorageError::Backend {
            backend,
            what: what.into(),
            source: source.into(),
            transient,
        }
    }

    /// A closure turning an I/O error on `path` into a [`StorageError`].
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> StorageError {
        let path = path.into();
        move |source| StorageError::Io { path, source }
    }

    /// A closure turning a decoder's error about `what` into
    /// [`StorageError::Corrupt`].
    pub fn corrupt<E: std::fmt::Display>(
        what: impl Into<String>,
    ) -> impl FnOnce(E) -> StorageError {
        let what = what.into();
        move |e| StorageError::Corrupt {
            what,
            message: e.to_string(),
        }
    }
}
