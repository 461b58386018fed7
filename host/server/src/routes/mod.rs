//! The HTTP edge: the router, one module of handlers per resource, and the
//! one place where errors become HTTP statuses and stable codes
//! ([`ApiError`]). Every handler authorizes first (through the service); a
//! tenant's view of the world is its own components and pipelines, and any
//! other name answers 404.

mod components;
mod io;
mod observe;
mod pipelines;
mod tenants;

use crate::service::{Service, ServiceError};
use crate::types::{ErrorBody, ErrorDetail};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use std::sync::Arc;
use tower_http::set_header::SetResponseHeaderLayer;
use utoipa::OpenApi;

/// Largest JSON request body (tenant and pipeline specs).
pub const MAX_JSON_BODY: u64 = 1 << 20;

/// What every handler shares.
pub struct AppState {
    /// The domain layer.
    pub service: Arc<Service>,
    /// Renders `/metrics`.
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// Signed-in browsers of the status page.
    pub sessions: observe::Sessions,
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

type Shared = axum::extract::State<Arc<AppState>>;
type ApiResult<T> = Result<T, ApiError>;

/// The router with every route. Handlers authenticate from the headers
/// before they read a body, and read it only up to the caller's limit.
/// Every response says `Cache-Control: no-store` and
/// `Referrer-Policy: no-referrer`.
pub fn router(state: Arc<AppState>) -> Router {
    let no_store = SetResponseHeaderLayer::overriding(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    let no_referrer = SetResponseHeaderLayer::overriding(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    let nosniff = SetResponseHeaderLayer::overriding(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    Router::new()
        .route("/", get(observe::page))
        .route("/assets/{file}", get(observe::asset))
        .route("/login", post(observe::login))
        .route("/logout", post(observe::logout))
        .route("/openapi.json", get(observe::openapi))
        .route("/metrics", get(observe::metrics))
        .route("/tenants", get(tenants::list).post(tenants::create))
        .route("/tenants/{name}", axum::routing::delete(tenants::delete))
        .route("/tenants/{name}/token", post(tenants::rotate))
        .route("/usage", get(tenants::usage))
        .route("/components", get(components::list))
        .route(
            "/components/{name}",
            put(components::put).delete(components::delete),
        )
        .route("/pipelines", get(pipelines::list).post(pipelines::create))
        .route(
            "/pipelines/{name}",
            get(pipelines::get)
                .patch(pipelines::patch)
                .delete(pipelines::delete),
        )
        .route("/pipelines/{name}/metrics", get(pipelines::metrics))
        .route("/pipelines/{name}/{action}", post(pipelines::control))
        .route("/pipelines/{name}/input/{port}", post(io::push))
        .route(
            "/pipelines/{name}/input/{port}/producers/{id}",
            get(io::producer_state),
        )
        .route("/pipelines/{name}/output/{port}", get(io::read))
        .route("/pipelines/{name}/output/{port}/stream", get(io::stream))
        .fallback(|| async { ApiError::from(ServiceError::not_found("route", "this path")) })
        .layer(no_store)
        .layer(no_referrer)
        .layer(nosniff)
        .with_state(state)
}

/// The API's OpenAPI document.
#[derive(OpenApi)]
#[openapi(
    info(title = "Sluice", description = "Multi-tenant host for WebAssembly circuit pipelines"),
    paths(
        tenants::create,
        tenants::list,
        tenants::delete,
        tenants::rotate,
        tenants::usage,
        components::list,
        components::put,
        components::delete,
        pipelines::list,
        pipelines::create,
        pipelines::get,
        pipelines::patch,
        pipelines::metrics,
        pipelines::delete,
        pipelines::control,
        io::push,
        io::producer_state,
        io::read,
        io::stream,
        observe::metrics
    ),
    components(schemas(
        crate::types::CreateTenant,
        crate::types::TenantCreated,
        crate::types::TenantLimits,
        crate::types::TenantUsage,
        crate::types::HostUsage,
        crate::types::ComponentInfo,
        crate::types::PipelineSpec,
        crate::types::PipelineLimits,
        crate::types::PipelinePatch,
        crate::history::PipelineMetrics,
        crate::history::Sample,
        crate::history::CheckpointEntry,
        crate::history::WorkerFigures,
        crate::types::PipelineState,
        crate::types::PipelineStatus,
        crate::types::HostsStatus,
        crate::types::PushAck,
        crate::types::ProducerInfo,
        crate::types::PartitionRange,
        ErrorBody,
        ErrorDetail
    )),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

/// The API's OpenAPI document as served at `/openapi.json`: utoipa's
/// [`ApiDoc`] with the conventions every operation shares made explicit, so
/// that tools generating requests from it (schemathesis in CI) meet no
/// status it does not list:
///
/// - a unique `operationId` per operation (`get_pipelines_name`, …);
/// - 401 (no or an unknown token) and 403 (the other kind of token) on
///   every operation; 400 (a malformed name, query or body) on every one;
///   404 where the path names a resource; 408 and 413 where there is a
///   body; 503 where the host's budgets admit the request; each with the
///   error body;
/// - the bodies' media types: a component upload is `application/wasm`
///   bytes, a push `application/x-ndjson` lines or an `application/json`
///   array of events;
/// - links from a created pipeline to the routes that take its name.
pub fn document() -> serde_json::Value {
    use serde_json::{Value, json};
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
    let error = |what: &str| {
        json!({
            "description": what,
            "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } }
        })
    };
    let Some(paths) = doc["paths"].as_object_mut() else {
        return doc;
    };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, op) in item.iter_mut() {
            let Some(op) = op.as_object_mut() else {
                continue;
            };
            let id = format!(
                "{method}{}",
                path.split('/')
                    .filter(|s| !s.is_empty())
                    .map(|s| format!("_{}", s.trim_matches(|c| c == '{' || c == '}')))
                    .collect::<String>()
            );
            op.insert("operationId".into(), Value::String(id));
            let has_body = op.contains_key("requestBody");
            let responses = op
                .entry("responses")
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .expect("responses are an object");
            let mut add = |status: &str, what: &str| {
                responses
                    .entry(status.to_owned())
                    .or_insert_with(|| error(what));
            };
            add(
                "400",
                "A malformed name, query or body (`error.code` says which)",
            );
            add("401", "No token, or one nobody holds");
            add(
                "403",
                "A token of the other kind (a tenant's on an admin route, or the reverse)",
            );
            if path.contains('{') || (method == "post" && path == "/pipelines") {
                add("404", "No such resource (or another tenant's)");
            }
            if has_body {
                add(
                    "408",
                    "The body did not arrive within the server's body timeout",
                );
                add("413", "The body is larger than the caller's limit");
            }
            if matches!(
                (method.as_str(), path.as_str()),
                ("post", "/pipelines")
                    | ("patch", "/pipelines/{name}")
                    | ("post", "/pipelines/{name}/{action}")
            ) {
                add(
                    "503",
                    "The host's memory budget or instance pool cannot admit it",
                );
                add("422", "A tenant limit refuses it");
            }
        }
    }
    // Names in paths follow the naming rule; numeric settings have ranges.
    let name_rule = "^[a-z0-9][a-z0-9_-]{0,63}$";
    if let Some(paths) = doc["paths"].as_object_mut() {
        for item in paths.values_mut() {
            for op in item
                .as_object_mut()
                .into_iter()
                .flat_map(|i| i.values_mut())
            {
                let parameters = op.get_mut("parameters").and_then(Value::as_array_mut);
                for p in parameters.into_iter().flatten() {
                    if p["in"] == "path" && matches!(p["name"].as_str(), Some("name" | "port")) {
                        p["schema"]["pattern"] = json!(name_rule);
                    }
                }
            }
        }
    }
    let ranges: [(&str, &[crate::limits::Range]); 2] = [
        (
            "PipelineSpec",
            &[
                crate::limits::pipeline::WORKERS,
                crate::limits::pipeline::PARTITIONS,
                crate::limits::pipeline::MAX_BATCH,
                crate::limits::pipeline::CHECKPOINT_EVERY_STEPS,
                crate::limits::pipeline::CHECKPOINT_INTERVAL_MS,
                crate::limits::pipeline::OUTPUT_RETENTION_STEPS,
            ],
        ),
        (
            "TenantLimits",
            &[
                crate::limits::tenant::MEMORY_MIB,
                crate::limits::tenant::FUEL_PER_STEP,
                crate::limits::tenant::DEADLINE_MS,
                crate::limits::tenant::MAX_PIPELINES,
                crate::limits::tenant::MAX_WORKERS,
                crate::limits::tenant::MAX_COMPONENT_BYTES,
                crate::limits::tenant::MAX_OUTPUT_PER_STEP,
                crate::limits::tenant::MAX_PUSH_BYTES,
                crate::limits::tenant::MAX_PUSH_EVENTS,
                crate::limits::tenant::MAX_CONCURRENT_PUSHES,
                crate::limits::tenant::MAX_STREAMS,
                crate::limits::tenant::DISK_QUOTA_MIB,
            ],
        ),
    ];
    for (schema, ranges) in ranges {
        for r in ranges {
            if let Some(prop) = doc.pointer_mut(&format!(
                "/components/schemas/{schema}/properties/{}",
                r.name
            )) {
                prop["minimum"] = json!(r.min);
                prop["maximum"] = json!(r.max);
            }
        }
    }
    for (schema, field) in [
        ("PipelineSpec", "name"),
        ("PipelineSpec", "component"),
        ("CreateTenant", "name"),
    ] {
        if let Some(prop) =
            doc.pointer_mut(&format!("/components/schemas/{schema}/properties/{field}"))
        {
            prop["pattern"] = json!(name_rule);
        }
    }
    // Bodies that are not JSON objects.
    if let Some(put) = doc.pointer_mut("/paths/~1components~1{name}/put") {
        put["requestBody"] = json!({
            "required": true,
            "description": "The component: a WebAssembly component (wasm32-wasip2) of the sluice:circuit world",
            "content": { "application/wasm": { "schema": { "type": "string", "format": "binary" } } }
        });
    }
    if let Some(post) = doc.pointer_mut("/paths/~1pipelines~1{name}~1input~1{port}/post") {
        post["requestBody"] = json!({
            "required": true,
            "description": "Events: JSON lines (a bare value inserts it; {\"insert\": v} / {\"delete\": v}, optionally with \"weight\": n), or one JSON array of them",
            "content": {
                "application/x-ndjson": { "schema": { "type": "string" } },
                "application/json": { "schema": { "type": "array", "items": {} } }
            }
        });
    }
    // A created pipeline leads to the routes that take its name.
    if let Some(created) = doc.pointer_mut("/paths/~1pipelines/post/responses/201") {
        let name = json!({ "name": "$response.body#/name" });
        created["links"] = json!({
            "GetPipeline": { "operationId": "get_pipelines_name", "parameters": name },
            "PipelineMetrics": { "operationId": "get_pipelines_name_metrics", "parameters": name },
            "ScalePipeline": { "operationId": "patch_pipelines_name", "parameters": name },
            "ControlPipeline": { "operationId": "post_pipelines_name_action", "parameters": name },
            "DeletePipeline": { "operationId": "delete_pipelines_name", "parameters": name },
            "ReadOutput": { "operationId": "get_pipelines_name_output_port", "parameters": name },
            "PushInput": { "operationId": "post_pipelines_name_input_port", "parameters": name }
        });
    }
    doc
}

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        openapi.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new(
            "bearer",
            Vec::<String>::new(),
        )]);
    }
}

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
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
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
    match e.as_runtime() {
        Some(R::Storage(S::Unknown { .. })) => ApiError::new(C::NOT_FOUND, "not_found", message),
        Some(R::Storage(S::DuplicateSequence { .. })) => {
            ApiError::new(C::CONFLICT, "duplicate_sequence", message)
        }
        Some(R::Storage(S::OutOfOrderSequence { .. })) => {
            ApiError::new(C::CONFLICT, "out_of_order_sequence", message)
        }
        Some(R::Storage(S::ProducerFenced { .. })) => {
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

/// The header the console sends with every call: with it (and only with
/// it) the API accepts the console's session cookie. A cross-site page
/// cannot send a custom header without a preflight the server never
/// grants, and the cookie is `SameSite=Strict` besides.
pub const CONSOLE_HEADER: &str = "x-sluice-console";

/// The caller's token: the `Authorization` bearer token, or, for the
/// console (its header present), the token of its session cookie.
fn token(state: &AppState, headers: &HeaderMap) -> Option<String> {
    if let Some(t) = bearer(headers) {
        return Some(t.to_owned());
    }
    if headers.contains_key(CONSOLE_HEADER) {
        return observe::session_token(&state.sessions, headers);
    }
    None
}

/// The bearer token of a request, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
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
async fn read_body(
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
async fn json_body<T: serde::de::DeserializeOwned>(
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
