//! The errors of assembling and running a pipeline: the runtime's (which
//! include storage's and the guests'), ingest's, and writing output files.

use sluice_core::ConfigError;
use sluice_storage::StorageError;
use sluice_storage::ingest::IngestError;
use std::path::PathBuf;

/// Result with the pipeline's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong assembling or running a pipeline.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The runtime, storage, a guest or the configuration.
    #[error(transparent)]
    Runtime(#[from] sluice_runtime::Error),

    /// Appending an input file.
    #[error(transparent)]
    Ingest(#[from] IngestError),

    /// The membership of the hosts running the pipeline.
    #[error(transparent)]
    Membership(#[from] sluice_cluster::Error),

    /// The work stopped because another part of it failed (that part's
    /// error is the one to report).
    #[error("stopped: {0}")]
    Stopped(String),

    /// An upgrade (a change of the pipeline's component) that cannot be
    /// made; nothing was changed.
    #[error("upgrade refused: {0}")]
    UpgradeRefused(String),

    /// Writing an output file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl From<StorageError> for Error {
    fn from(e: StorageError) -> Self {
        Error::Runtime(e.into())
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Runtime(e.into())
    }
}

impl Error {
    /// Whether a retry (after recovering) may help; decided by the layer
    /// that made the error.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Runtime(e) => e.is_transient(),
            Error::Ingest(e) => e.is_transient(),
            Error::Membership(e) => matches!(e, sluice_cluster::Error::Backend { .. }),
            Error::Io { .. } | Error::Stopped(_) | Error::UpgradeRefused(_) => false,
        }
    }

    /// The runtime error inside, if this is one.
    pub fn as_runtime(&self) -> Option<&sluice_runtime::Error> {
        match self {
            Error::Runtime(e) => Some(e),
            _ => None,
        }
    }

    pub(crate) fn task(what: &str) -> impl FnOnce(tokio::task::JoinError) -> Error + '_ {
        move |source| {
            Error::Runtime(sluice_runtime::Error::Task {
                what: what.to_owned(),
                source,
            })
        }
    }
}
