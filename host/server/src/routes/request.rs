//! What every handler shares: the [`AppState`], and how a request is read
//! — the caller's token (bearer, or the console's session), a body within
//! the caller's limit and the server's body timeout, a JSON body.

use super::error::{ApiError, ApiResult};
use super::session::{Sessions, session_token};
use crate::service::Service;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use std::sync::Arc;

/// Largest JSON request body (tenant and pipeline specs).
pub const MAX_JSON_BODY: u64 = 1 << 20;

/// What every handler shares.
pub struct AppState {
    /// The domain layer.
    pub service: Arc<Service>,
    /// Renders `/metrics`.
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// Signed-in browsers of the status page.
    pub sessions: Sessions,
}

impl AppState {
    /// The state over `service`.
    pub fn new(
        service: Arc<Service>,
        metrics: metrics_exporter_prometheus::PrometheusHandle,
    ) -> Self {
        AppState {
            service,
            metrics,
            sessions: Default::default(),
        }
    }
}

/// The state a handler extracts.
pub(super) type Shared = axum::extract::State<Arc<AppState>>;

/// The header the console sends with every call: with it (and only with
/// it) the API accepts the console's session cookie. A cross-site page
/// cannot send a custom header without a preflight the server never
/// grants, and the cookie is `SameSite=Strict` besides.
pub const CONSOLE_HEADER: &str = "x-sluice-console";

/// The caller's token: the `Authorization` bearer token, or, for the
/// console (its header present), the token of its session cookie.
pub(super) fn token(state: &AppState, headers: &HeaderMap) -> Option<String> {
    if let Some(t) = bearer(headers) {
        return Some(t.to_owned());
    }
    if headers.contains_key(CONSOLE_HEADER) {
        return session_token(&state.sessions, headers);
    }
    None
}

/// The bearer token of a request, if any.
pub(super) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// Reads a request body of at most `limit` bytes (`limit_name` names the
/// limit in the error): 413 `body_too_large` at once when the declared
/// length is above it, or as soon as the bytes received pass it (nothing is
/// buffered past the limit); 408 `body_timeout` when the whole body has not
/// arrived within the server's body timeout. Call it only after the caller
/// is authenticated.
pub(super) async fn read_body(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    limit: u64,
    limit_name: &'static str,
) -> ApiResult<Bytes> {
    let too_large = |attempted: Option<u64>| {
        let asked = attempted.map_or(String::new(), |n| format!("; the request declared {n}"));
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the body may hold at most {limit} bytes (limit `{limit_name}`){asked}"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|n| *n > limit) {
        return Err(too_large(Some(n)));
    }
    let timeout = state.service.server_limits().body_timeout;
    let read = axum::body::to_bytes(body, usize::try_from(limit).unwrap_or(usize::MAX));
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => {
            let e = e.into_inner();
            if e.is::<http_body_util::LengthLimitError>() {
                Err(too_large(None))
            } else {
                Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad_body",
                    format!("reading the body: {e}"),
                ))
            }
        }
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!(
                "the body did not arrive within {} ms (the server's body timeout)",
                timeout.as_millis()
            ),
        )),
    }
}

/// A JSON body of at most [`MAX_JSON_BODY`] bytes, read and decoded.
pub(super) async fn json_body<T: serde::de::DeserializeOwned>(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<T> {
    json(&read_body(state, headers, body, MAX_JSON_BODY, "json body").await?)
}

/// A JSON request body, or 400 `invalid_json` / `invalid_request`.
fn json<T: serde::de::DeserializeOwned>(b: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(b).map_err(|e| {
        let code = if e.is_data() {
            "invalid_request"
        } else {
            "invalid_json"
        };
        ApiError::new(StatusCode::BAD_REQUEST, code, format!("request body: {e}"))
    })
}
