//! What the domain layer refuses, or fails at: [`ServiceError`] (and the
//! [`Result`] carrying it). Each variant has one meaning; only the HTTP
//! edge (`routes`) maps them to statuses and stable codes.

use sluice_core::InvalidName;

/// What the domain layer refuses, or fails at.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// No token, or one nobody holds.
    #[error("missing or unknown token: send `Authorization: Bearer <token>`")]
    Unauthorized,
    /// A valid token without the right to this.
    #[error("{0}")]
    Forbidden(&'static str),
    /// A resource the caller cannot see (missing or another tenant's: the
    /// answer is the same).
    #[error("no {kind} named {name:?}")]
    NotFound {
        /// "pipeline", "component", …
        kind: &'static str,
        /// The name asked for.
        name: String,
    },
    /// A resource that exists already.
    #[error("{kind} {name:?} exists")]
    Exists {
        /// "tenant", "pipeline".
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// A name that breaks the naming rule.
    #[error(transparent)]
    InvalidName(#[from] InvalidName),
    /// A request the caller must change, with a stable code.
    #[error("{message}")]
    Invalid {
        /// Stable, machine-readable.
        code: &'static str,
        /// For people.
        message: String,
    },
    /// A tenant limit refused the request.
    #[error("limit `{limit}` is {value}; the request asked for {attempted}")]
    LimitExceeded {
        /// The limit's name.
        limit: &'static str,
        /// Its value.
        value: u64,
        /// What was asked for.
        attempted: u64,
    },
    /// An upload larger than the tenant may store.
    #[error("limit `{limit}` is {value}; the request asked for {attempted}")]
    TooLarge {
        /// The limit's name.
        limit: &'static str,
        /// Its value.
        value: u64,
        /// The body's size.
        attempted: u64,
    },
    /// An uploaded component the host cannot run.
    #[error("{0}")]
    InvalidComponent(String),
    /// A numeric setting outside its range.
    #[error("`{name}` must be between {min} and {max}; the request asked for {value}")]
    OutOfRange {
        /// The setting.
        name: &'static str,
        /// What was asked for.
        value: u64,
        /// Smallest accepted.
        min: u64,
        /// Largest accepted.
        max: u64,
    },
    /// Too many requests of this kind at once: try again later.
    #[error("too many {what} at once (the {limit}'s limit is {value}); try again later")]
    Busy {
        /// "pushes", "streams", …
        what: &'static str,
        /// Whose limit: "tenant" or "server".
        limit: &'static str,
        /// The limit.
        value: u64,
    },
    /// The host cannot promise a pipeline the memory its workers may use.
    #[error(
        "the host's memory budget is {budget_mib} MiB with {free_mib} MiB not promised to \
         pipelines; this pipeline may use {needed_mib} MiB ({workers} workers × {per_worker_mib} \
         MiB, and its database's memtables and cache): stop another pipeline or ask for less memory"
    )]
    HostMemory {
        /// The host's budget.
        budget_mib: u64,
        /// What is not promised yet.
        free_mib: u64,
        /// What the pipeline needs.
        needed_mib: u64,
        /// Its workers.
        workers: u64,
        /// Memory per worker.
        per_worker_mib: u64,
    },
    /// The host's instance pool cannot hold a pipeline's workers.
    #[error(
        "the host's instance pool holds {pool} instances and {free} are not promised to \
         pipelines (one is kept for checking uploads); this pipeline needs {needed}"
    )]
    HostPool {
        /// The pool's size.
        pool: u32,
        /// Instances not promised.
        free: u64,
        /// Instances the pipeline needs.
        needed: u64,
    },
    /// The tenant's disk quota is used up.
    #[error(
        "the disk quota of {quota_mib} MiB is used up ({used_mib} MiB): delete pipelines or \
         components, or set output_retention_steps"
    )]
    QuotaExceeded {
        /// The quota.
        quota_mib: u64,
        /// What is used.
        used_mib: u64,
    },
    /// The pipeline's component is being changed: try again shortly.
    #[error("pipeline {name} is being upgraded to another component; try again shortly")]
    Upgrading {
        /// The pipeline.
        name: String,
    },
    /// An upgrade of a pipeline across hosts asked of its leader, not
    /// answered in time: it stays asked (the leader, or the next one,
    /// makes it), and the pipeline's status shows the component it runs.
    #[error(
        "the upgrade of pipeline {name} was asked of its hosts' leader, which did not answer \
         within {waited_secs} s: it stays asked (the leader, or the next one, makes it, and \
         the pipeline's status then shows the new component); asking again is refused meanwhile"
    )]
    UpgradePending {
        /// The pipeline.
        name: String,
        /// How long the server waited.
        waited_secs: u64,
    },
    /// A Kafka pipeline on a server started without brokers.
    #[error("this server has no Kafka brokers configured (sluice serve --kafka-brokers)")]
    NoKafka,
    /// Opening or running a pipeline failed.
    #[error(transparent)]
    Pipeline(#[from] sluice_pipeline::Error),
    /// The server itself failed.
    #[error("{0}")]
    Internal(String),
}

impl ServiceError {
    /// [`ServiceError::NotFound`].
    pub fn not_found(kind: &'static str, name: &str) -> Self {
        ServiceError::NotFound {
            kind,
            name: name.to_owned(),
        }
    }

    /// [`ServiceError::Invalid`].
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        ServiceError::Invalid {
            code,
            message: message.into(),
        }
    }
}

/// Result with a [`ServiceError`].
pub type Result<T, E = ServiceError> = std::result::Result<T, E>;
