//! The errors the store reports: failures of the object store (the
//! backend), told transient or not, and checkpoints it refuses to write.

use sluice_storage::StorageError;

/// What backend errors are reported as.
pub(crate) const BACKEND: &str = "object store";

/// Turns an object store error, met while doing `what`, into a backend
/// error (transient unless it is an answer: not found, not supported…).
pub(crate) fn backend_error(
    what: impl Into<String>,
) -> impl FnOnce(object_store::Error) -> StorageError {
    let what = what.into();
    move |e| {
        // Not found and precondition failures are answers, not outages;
        // everything else (network, throttling, server errors) may pass.
        let transient = !matches!(
            e,
            object_store::Error::NotFound { .. }
                | object_store::Error::InvalidPath { .. }
                | object_store::Error::NotSupported { .. }
                | object_store::Error::NotImplemented { .. }
                | object_store::Error::UnknownConfigurationKey { .. }
        );
        StorageError::backend(BACKEND, what, transient, e)
    }
}

/// Checkpoint `step` refused, for `message`.
pub(crate) fn invalid(step: u64, message: impl Into<String>) -> StorageError {
    StorageError::InvalidCheckpoint {
        step,
        message: message.into(),
    }
}
