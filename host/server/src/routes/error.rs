//! The one place where errors become HTTP statuses and stable codes:
//! [`ApiError`], made from every [`ServiceError`] (and the pipeline errors
//! it carries), answered as `{"error": {"code", "message"}}`.

use crate::error::ServiceError;
use crate::types::{ErrorBody, ErrorDetail};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// A handler's result: its answer, or an [`ApiError`].
pub(super) type ApiResult<T> = Result<T, ApiError>;

/// An API error: an HTTP status, a stable machine-readable code and a
/// message for people. Serialized as `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable code, e.g. `not_found`, `invalid_name`, `limit_exceeded`.
    pub code: &'static str,
    /// What went wrong, for people.
    pub message: String,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        use ServiceError as S;
        use StatusCode as C;
        let message = e.to_string();
        match e {
            S::Unauthorized => ApiError::new(C::UNAUTHORIZED, "unauthorized", message),
            S::Forbidden(_) => ApiError::new(C::FORBIDDEN, "forbidden", message),
            S::NotFound { .. } => ApiError::new(C::NOT_FOUND, "not_found", message),
            S::Exists { .. } => ApiError::new(C::CONFLICT, "exists", message),
            S::InvalidName(_) => ApiError::new(C::BAD_REQUEST, "invalid_name", message),
            S::Invalid { code, .. } => ApiError::new(C::BAD_REQUEST, code, message),
            S::LimitExceeded { .. } => {
                ApiError::new(C::UNPROCESSABLE_ENTITY, "limit_exceeded", message)
            }
            S::TooLarge { .. } => ApiError::new(C::PAYLOAD_TOO_LARGE, "limit_exceeded", message),
            S::InvalidComponent(_) => {
                ApiError::new(C::UNPROCESSABLE_ENTITY, "invalid_component", message)
            }
            S::NoKafka => ApiError::new(C::UNPROCESSABLE_ENTITY, "no_kafka", message),
            S::Upgrading { .. } => ApiError::new(C::SERVICE_UNAVAILABLE, "upgrading", message),
            S::UpgradePending { .. } => {
                ApiError::new(C::GATEWAY_TIMEOUT, "upgrade_pending", message)
            }
            S::OutOfRange { .. } => ApiError::new(C::BAD_REQUEST, "out_of_range", message),
            S::Busy { .. } => ApiError::new(C::TOO_MANY_REQUESTS, "too_many_requests", message),
            S::HostMemory { .. } => {
                ApiError::new(C::SERVICE_UNAVAILABLE, "host_memory_exhausted", message)
            }
            S::HostPool { .. } => {
                ApiError::new(C::SERVICE_UNAVAILABLE, "host_pool_exhausted", message)
            }
            S::QuotaExceeded { .. } => {
                ApiError::new(C::INSUFFICIENT_STORAGE, "quota_exceeded", message)
            }
            S::Pipeline(e) => pipeline_error(&e, message),
            S::Internal(_) => ApiError::new(C::INTERNAL_SERVER_ERROR, "internal", message),
        }
    }
}

/// A pipeline's error as the API answers it.
fn pipeline_error(e: &sluice_pipeline::Error, message: String) -> ApiError {
    use StatusCode as C;
    use sluice_runtime::Error as R;
    use sluice_storage::StorageError as S;
    if let sluice_pipeline::Error::UpgradeRefused(_) = e {
        return ApiError::new(C::UNPROCESSABLE_ENTITY, "upgrade_refused", message);
    }
    if let sluice_pipeline::Error::Membership(sluice_cluster::Error::UpgradePending { .. }) = e {
        return ApiError::new(C::CONFLICT, "upgrade_pending", message);
    }
    match e.as_runtime() {
        Some(R::Storage(S::Unknown { .. })) => ApiError::new(C::NOT_FOUND, "not_found", message),
        Some(R::Storage(S::DuplicateSequence { .. })) => {
            ApiError::new(C::CONFLICT, "duplicate_sequence", message)
        }
        Some(R::Storage(S::OutOfOrderSequence { .. })) => {
            ApiError::new(C::CONFLICT, "out_of_order_sequence", message)
        }
        Some(R::Storage(S::InputProducerSuperseded { .. })) => {
            ApiError::new(C::CONFLICT, "producer_fenced", message)
        }
        Some(R::Config(_) | R::InvalidComponent { .. } | R::Storage(S::Config(_))) => {
            ApiError::new(C::UNPROCESSABLE_ENTITY, "invalid", message)
        }
        Some(R::Guest(_)) => ApiError::new(C::UNPROCESSABLE_ENTITY, "guest_failed", message),
        _ => ApiError::new(C::INTERNAL_SERVER_ERROR, "internal", message),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.into(),
                message: self.message,
            },
        };
        (self.status, axum::Json(body)).into_response()
    }
}
