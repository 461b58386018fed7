//! Errors a circuit reports to the host.

use std::fmt;

/// An expected failure inside a circuit. It crosses the WIT boundary as
/// `circuit-error`; the host stops the pipeline and shows the message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// An input value could not be decoded for its port's type.
    BadInput {
        /// The input port's name.
        port: String,
        /// Position of the event within this step's batch.
        index: usize,
        /// What the decoder said.
        message: String,
    },
    /// `restore` was handed state this circuit cannot read.
    IncompatibleSnapshot(String),
    /// The host broke the calling contract (e.g. `step` before `init`).
    Protocol(String),
    /// Any other failure.
    Failed(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::BadInput {
                port,
                index,
                message,
            } => {
                write!(f, "input port `{port}`, event {index}: {message}")
            }
            Error::IncompatibleSnapshot(m) => write!(f, "incompatible snapshot: {m}"),
            Error::Protocol(m) => write!(f, "protocol error: {m}"),
            Error::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for Error {}

/// Result with the SDK's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
