//! Errors in what a user asked for: names, ports, worker counts, and a
//! pipeline reopened with another component, W or log than it was created
//! with. None of them goes away by retrying.

use crate::name::InvalidName;

/// A configuration the host refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A name breaks the naming rule.
    #[error(transparent)]
    InvalidName(#[from] InvalidName),

    /// A port the circuit does not have.
    #[error("unknown {kind} `{name}`; the circuit has [{}]", .known.join(", "))]
    UnknownPort {
        /// "input port" or "output port".
        kind: &'static str,
        /// The name given.
        name: String,
        /// The ports that exist.
        known: Vec<String>,
    },

    /// W = 0.
    #[error("a pipeline needs at least one worker")]
    NoWorkers,

    /// The data directory belongs to another component.
    #[error(
        "this data directory belongs to component {stored}, not {wanted}: `sluice upgrade` moves \
         the pipeline to another component (keeping the state it can), or use a new --data \
         directory"
    )]
    ComponentChanged {
        /// The stored component's hash (shortened).
        stored: String,
        /// The offered component's hash (shortened).
        wanted: String,
    },

    /// The pipeline was created with another number of workers.
    #[error(
        "this pipeline runs with {stored} workers, not {wanted}: W is fixed at a checkpoint \
         (changing it is a layout change, not supported yet)"
    )]
    WorkersChanged {
        /// W as created.
        stored: u32,
        /// W as asked now.
        wanted: u32,
    },

    /// The pipeline's logs live elsewhere.
    #[error(
        "this data directory's logs are `{stored}`, not `{wanted}`; use a new --data directory"
    )]
    LogChanged {
        /// Where they are.
        stored: String,
        /// Where they were asked to be.
        wanted: String,
    },

    /// An input log exists with another partition count.
    #[error("input log `{input}` exists with {stored} partitions, not {wanted}")]
    PartitionsChanged {
        /// The input log.
        input: String,
        /// Its partitions.
        stored: u32,
        /// The partitions asked for.
        wanted: u32,
    },

    /// Anything else the user must change, said in full.
    #[error("{0}")]
    Invalid(String),
}
