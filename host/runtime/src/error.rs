//! The runtime's errors: what a guest did ([`GuestError`], each naming the
//! worker, the call and the limit), what storage reported
//! ([`StorageError`]), what the configuration got wrong ([`ConfigError`]),
//! the runtime's own ([`Error`]), and why a shuffle failed
//! ([`ExchangeError`]). Whether a retry may help is decided
//! by the layer that made the error ([`Error::is_transient`]).

use sluice_core::ConfigError;
use sluice_storage::{BoxError, StorageError};
use std::path::PathBuf;
use std::time::Duration;

/// Result with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a shuffle failed; the guest sees it as the WIT `exchange-error`, the
/// host reports it as the step's failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExchangeError {
    /// A worker broke the exchange's calling contract.
    #[error("{0}")]
    ContractViolation(String),
    /// The step was abandoned before every worker contributed.
    #[error("{0}")]
    Aborted(String),
    /// The step was abandoned because slot `slot` (0: the coordinator's
    /// process, `i`: its `i`-th host) sent nothing, not even a heartbeat,
    /// for the session timeout while its part was awaited: a link from it
    /// is cut, or it stalled. A leader leaves that host out for a while
    /// ([`Error::silent_slot`]).
    #[error("{message}")]
    Silent {
        /// The silent slot.
        slot: u32,
        /// What was waited for, and how long.
        message: String,
    },
    /// Two replicas of a worker sent different events to one worker in one
    /// round: the circuit is not deterministic (I4). The pipeline stops.
    #[error("{0}")]
    Diverged(String),
}

/// What can stop a pipeline's runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Storage failed or refused (an invariant, fencing, corruption).
    #[error(transparent)]
    Storage(#[from] StorageError),

    /// A guest trapped, exceeded a limit or failed.
    #[error(transparent)]
    Guest(#[from] GuestError),

    /// The configuration is not valid or conflicts with what is stored.
    #[error(transparent)]
    Config(#[from] ConfigError),

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

    /// The pooling allocator has no free slot for another instance.
    #[error(
        "no capacity for another instance: the engine's instance pool ({limit} instances) is full \
         (limit: instances per host); stop a pipeline or raise the pool size"
    )]
    PoolExhausted {
        /// The pool's size.
        limit: u32,
    },

    /// The component cannot be used.
    #[error("{path}: {message}")]
    InvalidComponent {
        /// Where it came from.
        path: PathBuf,
        /// Why it is refused.
        message: String,
    },

    /// The recovered state resumes reading an input below what was trimmed:
    /// the checkpoint the trim followed is not in this host's checkpoint
    /// store (another host, with another data directory, took it).
    #[error(
        "input `{input}` partition {partition} was trimmed below offset {trimmed_below} after a \
         checkpoint this host does not have (it {}, and would go on from offset {resumes_at}): \
         the pipeline was checkpointed by a host with another checkpoint store; run it with that \
         host's --data, or keep checkpoints where every host reaches them (--store)",
        .restored.map_or("has no checkpoint".to_owned(), |s| format!("restored the checkpoint of step {s}"))
    )]
    CheckpointElsewhere {
        /// The input log.
        input: String,
        /// Its partition.
        partition: u32,
        /// Its low watermark.
        trimmed_below: u64,
        /// The checkpoint this host restored, if any.
        restored: Option<u64>,
        /// The offset the recovered state reads from.
        resumes_at: u64,
    },

    /// A worker on another host failed, or the host did (its connection
    /// ended, it stalled past its session timeout).
    #[error("host {host}: {message}")]
    Remote {
        /// The host's address.
        host: String,
        /// What happened.
        message: String,
        /// The worker's guest failed (it would fail again anywhere); else
        /// the host or the network did, and recovery may go on without it.
        guest: bool,
        /// The worker failed because the exchange did: usually the echo of
        /// another worker's failure, which is the one to report.
        exchange: bool,
        /// The host refused the coordinator for good: it runs another
        /// component. Retrying with it fails the same way until it
        /// changes ([`Error::refusing_host`]).
        refused: bool,
        /// The exchange failed there because this slot went silent
        /// ([`ExchangeError::Silent`]).
        silent_slot: Option<u32>,
    },

    /// A worker host runs another component than its coordinator: it
    /// refuses the coordinator's workers (every host of a pipeline must run
    /// the same component) until it is restarted with the same.
    #[error(
        "this host runs component {here}, the coordinator {coordinator}: every host of a \
         pipeline must run the same"
    )]
    ComponentDiffers {
        /// The component this host runs (its hash).
        here: String,
        /// The coordinator's.
        coordinator: String,
    },

    /// A pipeline whose component changed with its state rebuilt from
    /// retained input (an upgrade with `rebuild`) opened with workers on
    /// other hosts before its first checkpoint under the new component:
    /// the rebuild (and the switch's output difference) runs in the
    /// coordinator's process only, for now. (Taking the old component's
    /// checkpoint through `upgrade` runs on every worker's host.)
    #[error(
        "this pipeline's component changed at its newest checkpoint, its new operators rebuilt \
         from retained input: that rebuild runs on one host only for now; open it once without \
         other hosts (it checkpoints under the new component), then across hosts"
    )]
    UpgradeAcrossHosts,

    /// I4, checked live: two replicas of a worker computed different
    /// output for one step. Nothing of the step was committed.
    #[error(
        "the circuit is not deterministic: the replicas of worker {worker} computed different \
         output for step {step} — hash {primary} on {primary_at}, hash {replica} on {replica_at} \
         (invariant I4); the pipeline is stopped, the step was not committed"
    )]
    ReplicasDiverged {
        /// The step.
        step: u64,
        /// The worker whose replicas differ.
        worker: u32,
        /// The primary's output hash.
        primary: String,
        /// Where the primary runs ("this host", or a host's address).
        primary_at: String,
        /// The other replica's output hash.
        replica: String,
        /// Where that replica runs.
        replica_at: String,
    },

    /// An earlier failure left the coordinator without its instances.
    #[error("the pipeline's workers were lost to an earlier failure; reopen it")]
    WorkersLost,

    /// The WebAssembly engine failed outside a guest call.
    #[error("wasmtime ({what}): {source}")]
    Engine {
        /// What the host was doing.
        what: String,
        /// wasmtime's error.
        #[source]
        source: BoxError,
    },

    /// A task of the runtime panicked or was cancelled.
    #[error("{what} failed: {source}")]
    Task {
        /// Which task.
        what: String,
        /// How it ended.
        #[source]
        source: tokio::task::JoinError,
    },
}

impl Error {
    /// Whether the error may go away on retry (after recovering):
    /// storage's transient failures, a host or the network to it failing,
    /// and an exchange aborted because something else failed (when that
    /// is what a step reports, the cause was a host or a link: a worker's
    /// own failure is reported before any echo of it). A guest failure, a
    /// broken exchange contract, a limit, a nondeterministic replay, a
    /// configuration conflict or a fenced host will not.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Storage(e) => e.is_transient(),
            Error::Remote { guest, .. } => !guest,
            Error::Guest(GuestError::Exchange {
                source: ExchangeError::Aborted(_) | ExchangeError::Silent { .. },
                ..
            }) => true,
            _ => false,
        }
    }

    /// The exchange slot whose silence failed the step (a link from it cut
    /// one way, or its host stalled), if that is what failed — here or, as
    /// a worker's host reported it, there.
    pub fn silent_slot(&self) -> Option<u32> {
        match self {
            Error::Guest(GuestError::Exchange {
                source: ExchangeError::Silent { slot, .. },
                ..
            }) => Some(*slot),
            Error::Remote { silent_slot, .. } => *silent_slot,
            _ => None,
        }
    }

    /// Whether the error is the echo of an exchange failure (another
    /// worker's, a host's or a link's), not a cause of its own.
    pub fn is_exchange_echo(&self) -> bool {
        matches!(
            self,
            Error::Guest(GuestError::Exchange { .. }) | Error::Remote { exchange: true, .. }
        )
    }

    /// A short, stable name of the error's kind, for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Guest(g) => g.kind(),
            Error::Nondeterministic { .. } | Error::ReplicasDiverged { .. } => "nondeterministic",
            Error::Storage(e) if e.is_transient() => "storage",
            Error::Storage(
                StorageError::HostEpochSuperseded { .. }
                | StorageError::TransactionalProducerSuperseded { .. },
            ) => "fenced",
            Error::Storage(StorageError::BadRecord { .. }) => "bad_record",
            Error::Storage(_) => "storage_refused",
            Error::Config(_)
            | Error::InvalidComponent { .. }
            | Error::ComponentDiffers { .. }
            | Error::UpgradeAcrossHosts => "config",
            Error::PoolExhausted { .. } => "capacity",
            Error::CheckpointElsewhere { .. } => "config",
            Error::Remote { guest: true, .. } => "guest_remote",
            Error::Remote { .. } => "host_lost",
            Error::WorkersLost | Error::Engine { .. } | Error::Task { .. } => "other",
        }
    }

    pub(crate) fn engine(what: impl Into<String>) -> impl FnOnce(wasmtime::Error) -> Error {
        let what = what.into();
        move |e| Error::Engine {
            what,
            source: e.into(),
        }
    }

    pub(crate) fn task(what: impl Into<String>) -> impl FnOnce(tokio::task::JoinError) -> Error {
        let what = what.into();
        move |source| Error::Task { what, source }
    }

    /// A host (or the network to it) failed: [`Error::Remote`], not the
    /// guest's doing.
    pub(crate) fn remote(host: &str, message: impl Into<String>) -> Error {
        Error::Remote {
            host: host.to_owned(),
            message: message.into(),
            guest: false,
            exchange: false,
            refused: false,
            silent_slot: None,
        }
    }

    /// The address of the host that refused the coordinator for good (it
    /// runs another component), if that is what failed: a leader leaves
    /// such a host out rather than reopening with it again and again.
    pub fn refusing_host(&self) -> Option<&str> {
        match self {
            Error::Remote {
                host,
                refused: true,
                ..
            } => Some(host),
            _ => None,
        }
    }

    /// [`remote`](Self::remote) for an I/O error talking to `what`.
    pub(crate) fn remote_io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |e| Error::remote(&what, e.to_string())
    }
}

/// What a guest did: each variant names the worker and the call, and a
/// limit names its value (invariant I6).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuestError {
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

    /// The fuel limit per call (deterministic CPU bound) ran out.
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
        "worker {worker} exceeded its memory limit in `{call}`: tried to hold {requested} bytes \
         (all linear memories and tables together), limit is {limit} bytes (limit: memory per \
         instance)"
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

    /// The circuit returned an error, or output the host refuses.
    #[error("worker {worker}: the circuit failed in `{call}`: {message}")]
    Failed {
        /// Worker index.
        worker: u32,
        /// Export being called.
        call: &'static str,
        /// The circuit's message.
        message: String,
    },

    /// A worker broke the exchange's calling contract, or the exchange was
    /// abandoned.
    #[error("exchange: worker {worker} in `{call}`: {source}")]
    Exchange {
        /// Worker index.
        worker: u32,
        /// Export being called.
        call: &'static str,
        /// What went wrong.
        #[source]
        source: ExchangeError,
    },
}

impl GuestError {
    /// A short, stable name of the kind, for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            GuestError::Trap { .. } => "trap",
            GuestError::FuelExhausted { .. } => "fuel",
            GuestError::DeadlineExceeded { .. } => "deadline",
            GuestError::MemoryExceeded { .. } => "memory",
            GuestError::OutputLimit { .. } => "output_limit",
            GuestError::Failed { .. } => "guest",
            GuestError::Exchange { .. } => "exchange",
        }
    }
}
