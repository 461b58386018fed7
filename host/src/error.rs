//! The host's error type.
//!
//! Every variant carries the context a user needs to act on it: which
//! worker, which step, which limit and its value.

use std::path::PathBuf;
use std::time::Duration;

/// Result with the host's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in the host.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A storage operation failed in RocksDB.
    #[error("storage ({what}): {source}")]
    Rocks {
        /// What the host was doing.
        what: String,
        /// RocksDB's error.
        #[source]
        source: rocksdb::Error,
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

    /// A commit from a host whose epoch was superseded (a zombie).
    #[error(
        "fenced: this host's epoch {epoch} was superseded by epoch {current}; another host has taken over \
         the pipeline, so this one must stop (its commit of step {step} was refused)"
    )]
    Fenced {
        /// The step whose commit was refused.
        step: u64,
        /// This host's epoch.
        epoch: u64,
        /// The log's current epoch.
        current: u64,
    },

    /// A Kafka operation failed (the broker was unreachable, timed out or
    /// refused); transient: recovery retries it.
    #[error("Kafka ({what}): {message}")]
    Kafka {
        /// What the host was doing.
        what: String,
        /// The client's or broker's error.
        message: String,
    },

    /// Kafka fenced this host's transactional producer: another host opened
    /// the pipeline (its producer with the same transactional id has a newer
    /// epoch), so this one must stop. Its open transaction was aborted.
    #[error(
        "fenced: another host has taken over the pipeline (Kafka transactional id `{transactional_id}` \
         has a newer producer epoch), so this one must stop{}",
        .step.map(|s| format!("; its commit of step {s} was aborted")).unwrap_or_default()
    )]
    KafkaFenced {
        /// The step whose commit was aborted, if a step commit.
        step: Option<u64>,
        /// The transactional id both hosts use.
        transactional_id: String,
    },

    /// A worker emitted more output in one step than its pipeline allows.
    #[error(
        "output limit: worker {worker} emitted {attempted} events in step {step}, above the \
         pipeline's limit of {limit} events per worker per step"
    )]
    OutputLimit {
        /// The worker.
        worker: u32,
        /// The step.
        step: u64,
        /// The limit.
        limit: u64,
        /// What the worker emitted.
        attempted: u64,
    },

    /// Stored data could not be decoded.
    #[error("corrupt {what}: {message}")]
    Corrupt {
        /// Which record.
        what: String,
        /// The decoder's complaint.
        message: String,
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

    /// A log or port name that does not exist.
    #[error("unknown {kind} `{name}`{hint}")]
    Unknown {
        /// "input log", "output port", ...
        kind: &'static str,
        /// The name given.
        name: String,
        /// Suggestions, e.g. the names that exist.
        hint: String,
    },

    /// I4: a replayed step produced different output than the committed one.
    #[error(
        "the circuit is not deterministic: replaying step {step} on worker {worker} produced \
         output with hash {replayed}, but the committed output of that step has hash {committed} \
         (invariant I4); the pipeline is stopped, nothing was written"
    )]
    Nondeterministic {
        /// Step replayed.
        step: u64,
        /// Worker whose output differs.
        worker: u32,
        /// Hash recorded at commit.
        committed: String,
        /// Hash of the replay.
        replayed: String,
    },

    /// The guest trapped.
    #[error("worker {worker} trapped in `{call}`: {trap}")]
    Trap {
        /// Worker index.
        worker: u32,
        /// Export being called.
        call: &'static str,
        /// The trap and its backtrace, as wasmtime reports it.
        trap: String,
    },

    /// The fuel limit per step (deterministic CPU bound) ran out.
    #[error(
        "worker {worker} exhausted its fuel limit of {limit} units in `{call}` (limit: fuel per step)"
    )]
    FuelExhausted {
        /// Worker index.
        worker: u32,
        /// Export being called.
        call: &'static str,
        /// Fuel granted per call.
        limit: u64,
    },

    /// The wall-clock deadline per call ran out.
    #[error(
        "worker {worker} exceeded its wall-clock deadline of {deadline:?} in `{call}` (limit: step deadline)"
    )]
    DeadlineExceeded {
        /// Worker index.
        worker: u32,
        /// Export being called.
        call: &'static str,
        /// The deadline.
        deadline: Duration,
    },

    /// The guest tried to grow its memory past the limit.
    #[error(
        "worker {worker} exceeded its memory limit in `{call}`: tried to grow linear memory to \
         {requested} bytes, limit is {limit} bytes (limit: memory per instance)"
    )]
    MemoryExceeded {
        /// Worker index.
        worker: u32,
        /// Export being called.
        call: &'static str,
        /// Size asked for.
        requested: usize,
        /// The limit.
        limit: usize,
    },

    /// The pooling allocator has no free slot for another instance.
    #[error(
        "no capacity for another instance: the engine's instance pool ({limit} instances) is full \
         (limit: instances per host); stop a pipeline or raise the pool size"
    )]
    PoolExhausted {
        /// The pool's size.
        limit: u32,
    },

    /// The circuit returned an error.
    #[error("worker {worker}: the circuit failed in `{call}`: {message}")]
    Guest {
        /// Worker index.
        worker: u32,
        /// Export being called.
        call: &'static str,
        /// The circuit's message.
        message: String,
    },

    /// A worker broke the exchange's calling contract.
    #[error("exchange: {0}")]
    Exchange(String),

    /// The component cannot be used.
    #[error("{path}: {message}")]
    InvalidComponent {
        /// Where it came from.
        path: PathBuf,
        /// Why it is refused.
        message: String,
    },

    /// The pipeline's stored configuration conflicts with what was asked.
    #[error("{0}")]
    Config(String),

    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A fault injected by [`storage::faults`](crate::storage::faults).
    #[error("injected fault in {op} ({})", if *after { "after it was done" } else { "nothing was done" })]
    Injected {
        /// The operation.
        op: &'static str,
        /// Whether the operation was done before the fault was reported.
        after: bool,
    },

    /// The WebAssembly engine failed outside a guest call.
    #[error("wasmtime: {0}")]
    Engine(String),
}

impl Error {
    /// Whether the error may go away on retry: storage and I/O failures are
    /// worth a recovery and another try; a guest failure, a limit, a
    /// nondeterministic replay or a fenced host are not.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Rocks { .. } | Error::Io { .. } | Error::Injected { .. } | Error::Kafka { .. }
        )
    }

    pub(crate) fn rocks(what: impl Into<String>) -> impl FnOnce(rocksdb::Error) -> Error {
        let what = what.into();
        move |source| Error::Rocks { what, source }
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }

    pub(crate) fn corrupt(what: impl Into<String>) -> impl FnOnce(postcard::Error) -> Error {
        let what = what.into();
        move |e| Error::Corrupt {
            what,
            message: e.to_string(),
        }
    }
}
