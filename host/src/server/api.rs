//! The HTTP API's routes and handlers. Every handler authorizes first; a
//! tenant's view of the world is its own components and pipelines, and any
//! other name answers 404.

use super::registry::{self, Desired, PipelineEntry, PipelineSpec, Tenant, TenantLimits, validate};
use super::runner::{PipelineHandle, PipelineStatus};
use super::{ApiError, AppState, lock};
use crate::runtime::engine::LoadedComponent;
use crate::runtime::pipeline::describe;
use crate::runtime::worker::CircuitShape;
use crate::spec::{parse_input_line, write_output_line};
use crate::storage::log::{AppendBatch, ProducerSeq};
use crate::storage::{OutputPosition, read_output};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use utoipa::OpenApi;

type Shared = State<Arc<AppState>>;
type ApiResult<T> = Result<T, ApiError>;

/// Largest request body outside component uploads.
pub const MAX_BODY: usize = 16 << 20;
/// Largest component upload the server reads at all (tenants' own limits
/// are lower or equal).
pub const MAX_UPLOAD: usize = 256 << 20;

/// The API's OpenAPI document.
#[derive(OpenApi)]
#[openapi(
    info(title = "Sluice", description = "Multi-tenant host for WebAssembly circuit pipelines"),
    paths(
        create_tenant,
        list_components,
        put_component,
        delete_component,
        list_pipelines,
        create_pipeline,
        get_pipeline,
        delete_pipeline,
        control_pipeline,
        push_input,
        read_output_route,
        stream_output,
        metrics_route
    ),
    components(schemas(
        CreateTenant,
        TenantCreated,
        TenantLimits,
        ComponentInfo,
        PipelineSpec,
        registry::PipelineLimits,
        registry::LogKind,
        PipelineStatus,
        PushAck,
        PartitionRange,
        ErrorBody,
        ErrorDetail
    )),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

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

/// Every error response: `{"error": {"code", "message"}}`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// An error's stable code and message.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Stable, machine-readable.
    pub code: String,
    /// For people.
    pub message: String,
}

/// The router with every route.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/openapi.json", get(openapi))
        .route("/metrics", get(metrics_route))
        .route("/tenants", post(create_tenant))
        .route("/components", get(list_components))
        .route(
            "/components/{name}",
            put(put_component)
                .delete(delete_component)
                .layer(DefaultBodyLimit::max(MAX_UPLOAD)),
        )
        .route("/pipelines", get(list_pipelines).post(create_pipeline))
        .route(
            "/pipelines/{name}",
            get(get_pipeline).delete(delete_pipeline),
        )
        .route("/pipelines/{name}/{action}", post(control_pipeline))
        .route("/pipelines/{name}/input/{port}", post(push_input))
        .route("/pipelines/{name}/output/{port}", get(read_output_route))
        .route("/pipelines/{name}/output/{port}/stream", get(stream_output))
        .fallback(|| async { ApiError::not_found("route", "this path") })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

// ---------------------------------------------------------------- auth ---

enum Caller {
    Admin,
    Tenant(String),
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

fn caller_from(state: &AppState, token: Option<&str>) -> ApiResult<Caller> {
    let token = token.ok_or_else(ApiError::unauthorized)?;
    if registry::constant_time_eq(
        registry::token_hash(token).as_bytes(),
        state.admin_hash.as_bytes(),
    ) {
        return Ok(Caller::Admin);
    }
    lock(&state.registry)
        .tenant_by_token(token)
        .map(|t| Caller::Tenant(t.to_owned()))
        .ok_or_else(ApiError::unauthorized)
}

fn admin(state: &AppState, headers: &HeaderMap) -> ApiResult<()> {
    match caller_from(state, bearer(headers))? {
        Caller::Admin => Ok(()),
        Caller::Tenant(_) => Err(ApiError {
            status: StatusCode::FORBIDDEN,
            code: "forbidden",
            message: "this route needs the admin token".into(),
        }),
    }
}

fn tenant(state: &AppState, headers: &HeaderMap) -> ApiResult<String> {
    match caller_from(state, bearer(headers))? {
        Caller::Tenant(t) => Ok(t),
        Caller::Admin => Err(ApiError {
            status: StatusCode::FORBIDDEN,
            code: "forbidden",
            message: "this route needs a tenant's token, not the admin token".into(),
        }),
    }
}

fn body(b: Result<Bytes, BytesRejection>) -> ApiResult<Bytes> {
    b.map_err(|r| ApiError {
        status: r.status(),
        code: if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            "body_too_large"
        } else {
            "bad_body"
        },
        message: r.body_text(),
    })
}

fn json<T: serde::de::DeserializeOwned>(b: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(b).map_err(|e| {
        let code = if e.is_data() {
            "invalid_request"
        } else {
            "invalid_json"
        };
        ApiError::bad_request(code, format!("request body: {e}"))
    })
}

/// The handle of a tenant's pipeline, or 404.
fn handle(state: &AppState, tenant: &str, name: &str) -> ApiResult<Arc<PipelineHandle>> {
    validate("pipeline", name).map_err(|_| ApiError::not_found("pipeline", name))?;
    lock(&state.pipelines)
        .get(&(tenant.to_owned(), name.to_owned()))
        .cloned()
        .ok_or_else(|| ApiError::not_found("pipeline", name))
}

// -------------------------------------------------------------- tenants --

/// `POST /tenants`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    /// The tenant's name.
    pub name: String,
    /// Its limits (omitted fields: defaults).
    #[serde(default)]
    pub limits: Option<TenantLimits>,
}

/// A created tenant and its API token (shown once; stored hashed).
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
pub struct TenantCreated {
    /// The tenant.
    pub name: String,
    /// Its API token.
    pub token: String,
    /// Its limits.
    pub limits: TenantLimits,
}

/// Creates a tenant and issues its token (admin only).
#[utoipa::path(post, path = "/tenants", request_body = CreateTenant,
    responses((status = 201, body = TenantCreated), (status = 409, body = ErrorBody)))]
async fn create_tenant(
    State(state): Shared,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, axum::Json<TenantCreated>)> {
    admin(&state, &headers)?;
    let req: CreateTenant = json(&body(b)?)?;
    validate("tenant", &req.name)?;
    let token = registry::new_token()?;
    let limits = req.limits.unwrap_or_default();
    {
        let mut reg = lock(&state.registry);
        if reg.tenants.contains_key(&req.name) {
            return Err(ApiError::conflict(
                "exists",
                format!("tenant {:?} exists", req.name),
            ));
        }
        reg.tenants.insert(
            req.name.clone(),
            Tenant {
                token_sha256: registry::token_hash(&token),
                limits,
                pipelines: Default::default(),
            },
        );
        reg.save(&state.data)?;
    }
    state
        .root
        .create_dir_all(format!("{}/components", state.tenant_dir(&req.name)))
        .and_then(|()| {
            state
                .root
                .create_dir_all(format!("{}/pipelines", state.tenant_dir(&req.name)))
        })
        .map_err(|e| ApiError::internal(format!("creating the tenant's directory: {e}")))?;
    Ok((
        StatusCode::CREATED,
        axum::Json(TenantCreated {
            name: req.name,
            token,
            limits,
        }),
    ))
}

// ----------------------------------------------------------- components --

/// An uploaded component.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
pub struct ComponentInfo {
    /// Its name.
    pub name: String,
    /// SHA-256 of its bytes.
    pub hash: String,
    /// Size in bytes.
    pub size: u64,
    /// Input ports.
    pub inputs: Vec<String>,
    /// Output ports.
    pub outputs: Vec<String>,
}

fn component_path(state: &AppState, tenant: &str, name: &str) -> String {
    format!("{}/components/{name}.wasm", state.tenant_dir(tenant))
}

/// Loads a tenant's component and learns its ports, with the tenant's
/// memory and fuel limits.
async fn load_component(
    state: &AppState,
    tenant: &str,
    name: &str,
    bytes: &[u8],
) -> ApiResult<(LoadedComponent, CircuitShape)> {
    let limits = lock(&state.registry)
        .tenants
        .get(tenant)
        .map(|t| t.limits)
        .ok_or_else(|| ApiError::not_found("tenant", tenant))?;
    let engine = state.engine.with_limits(crate::runtime::engine::Limits {
        memory: (limits.memory_mib << 20) as usize,
        fuel_per_call: limits.fuel_per_step,
        deadline: Duration::from_millis(limits.deadline_ms),
    });
    let origin = std::path::PathBuf::from(format!("{name}.wasm"));
    let component = engine
        .load(&origin, bytes)
        .map_err(|e| ApiError::unprocessable("invalid_component", e.to_string()))?;
    let shape = describe(&engine, &component)
        .await
        .map_err(|e| ApiError::unprocessable("invalid_component", e.to_string()))?;
    for port in shape.inputs.iter().chain(&shape.outputs) {
        crate::storage::validate_name("port", port)
            .map_err(|e| ApiError::unprocessable("invalid_component", e.to_string()))?;
    }
    Ok((component, shape))
}

/// Uploads (or replaces) a component: validated against the Sluice world,
/// precompiled and cached by content hash. Running pipelines keep the
/// version they were created with.
#[utoipa::path(put, path = "/components/{name}", request_body(content = Vec<u8>, content_type = "application/wasm"),
    params(("name" = String, Path, description = "component name")),
    responses((status = 201, body = ComponentInfo), (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn put_component(
    State(state): Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
    b: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, axum::Json<ComponentInfo>)> {
    let tenant = tenant(&state, &headers)?;
    validate("component", &name)?;
    let bytes = body(b)?;
    let max = lock(&state.registry)
        .tenants
        .get(&tenant)
        .map_or(0, |t| t.limits.max_component_bytes);
    if bytes.len() as u64 > max {
        return Err(ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            ..ApiError::limit("max_component_bytes", max, bytes.len() as u64)
        });
    }
    let (component, shape) = load_component(&state, &tenant, &name, &bytes).await?;
    state
        .root
        .write(component_path(&state, &tenant, &name), &bytes)
        .map_err(|e| ApiError::internal(format!("storing the component: {e}")))?;
    // Pipelines refer to a component version by hash: keep every version.
    state
        .root
        .write(
            format!(
                "{}/components/{}.wasm",
                state.tenant_dir(&tenant),
                component.hash
            ),
            &bytes,
        )
        .map_err(|e| ApiError::internal(format!("storing the component: {e}")))?;
    Ok((
        StatusCode::CREATED,
        axum::Json(ComponentInfo {
            name,
            hash: component.hash,
            size: bytes.len() as u64,
            inputs: shape.inputs,
            outputs: shape.outputs,
        }),
    ))
}

/// Lists the caller's components.
#[utoipa::path(get, path = "/components", responses((status = 200, body = Vec<ComponentInfo>)))]
async fn list_components(
    State(state): Shared,
    headers: HeaderMap,
) -> ApiResult<axum::Json<Vec<ComponentInfo>>> {
    let tenant = tenant(&state, &headers)?;
    let dir = state
        .root
        .open_dir(format!("{}/components", state.tenant_dir(&tenant)))
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let mut out = Vec::new();
    for entry in dir
        .entries()
        .map_err(|e| ApiError::internal(e.to_string()))?
    {
        let entry = entry.map_err(|e| ApiError::internal(e.to_string()))?;
        let file = entry.file_name();
        let Some(name) = file
            .to_str()
            .and_then(|f| f.strip_suffix(".wasm"))
            .map(str::to_owned)
        else {
            continue;
        };
        // Hash-named copies are versions, not names.
        if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let bytes = dir
            .read(file)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        use sha2::Digest;
        out.push(ComponentInfo {
            name,
            hash: hex::encode(sha2::Sha256::digest(&bytes)),
            size: bytes.len() as u64,
            inputs: Vec::new(),
            outputs: Vec::new(),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(axum::Json(out))
}

/// Deletes a component name (pipelines created from it keep running).
#[utoipa::path(delete, path = "/components/{name}", params(("name" = String, Path, description = "component name")),
    responses((status = 204), (status = 404, body = ErrorBody)))]
async fn delete_component(
    State(state): Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    let tenant = tenant(&state, &headers)?;
    validate("component", &name).map_err(|_| ApiError::not_found("component", &name))?;
    state
        .root
        .remove_file(component_path(&state, &tenant, &name))
        .map_err(|_| ApiError::not_found("component", &name))?;
    Ok(StatusCode::NO_CONTENT)
}

// ------------------------------------------------------------ pipelines --

/// Opens a pipeline's storage and starts its task (creation, recovery).
pub(super) async fn load_pipeline(
    state: &Arc<AppState>,
    tenant: &str,
    spec: PipelineSpec,
    desired: Desired,
) -> ApiResult<Arc<PipelineHandle>> {
    let limits = lock(&state.registry)
        .tenants
        .get(tenant)
        .map(|t| t.limits)
        .ok_or_else(|| ApiError::not_found("tenant", tenant))?;
    let effective = spec.effective_limits(&limits)?;
    let file = format!(
        "{}/components/{}.wasm",
        state.tenant_dir(tenant),
        spec.component_hash
    );
    let bytes = state
        .root
        .read(&file)
        .map_err(|_| ApiError::not_found("component version", &spec.component_hash))?;
    let (component, shape) = load_component(state, tenant, &spec.component, &bytes).await?;
    let dir_rel = format!("{}/pipelines/{}", state.tenant_dir(tenant), spec.name);
    state
        .root
        .create_dir_all(&dir_rel)
        .map_err(|e| ApiError::internal(format!("creating the pipeline's directory: {e}")))?;
    let dir = state.data.join(&dir_rel);
    let kafka = match spec.log {
        registry::LogKind::Embedded => None,
        registry::LogKind::Kafka => Some(state.kafka.clone().ok_or_else(|| {
            ApiError::unprocessable(
                "no_kafka",
                "this server has no Kafka brokers configured (sluice serve --kafka-brokers)",
            )
        })?),
    };
    let (engine, tenant_owned) = (state.engine.clone(), tenant.to_owned());
    // Opening RocksDB blocks: off the async workers.
    tokio::task::spawn_blocking(move || {
        PipelineHandle::open(
            &engine,
            &tenant_owned,
            spec,
            component,
            shape,
            effective,
            &dir,
            desired,
            kafka,
        )
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(ApiError::from)
}

/// Lists the caller's pipelines with their status.
#[utoipa::path(get, path = "/pipelines", responses((status = 200, body = Vec<PipelineStatus>)))]
async fn list_pipelines(
    State(state): Shared,
    headers: HeaderMap,
) -> ApiResult<axum::Json<Vec<PipelineStatus>>> {
    let tenant = tenant(&state, &headers)?;
    Ok(axum::Json(statuses(&state, &tenant)))
}

fn statuses(state: &AppState, tenant: &str) -> Vec<PipelineStatus> {
    lock(&state.pipelines)
        .iter()
        .filter(|((t, _), _)| t == tenant)
        .map(|(_, h)| h.status())
        .collect()
}

/// Creates a pipeline from an uploaded component and starts it.
#[utoipa::path(post, path = "/pipelines", request_body = PipelineSpec,
    responses((status = 201, body = PipelineStatus), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn create_pipeline(
    State(state): Shared,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, axum::Json<PipelineStatus>)> {
    let tenant = tenant(&state, &headers)?;
    let mut spec: PipelineSpec = json(&body(b)?)?;
    validate("pipeline", &spec.name)?;
    validate("component", &spec.component)?;
    let limits = {
        let reg = lock(&state.registry);
        let t = reg
            .tenants
            .get(&tenant)
            .ok_or_else(|| ApiError::not_found("tenant", &tenant))?;
        if t.pipelines.contains_key(&spec.name) {
            return Err(ApiError::conflict(
                "exists",
                format!("pipeline {:?} exists", spec.name),
            ));
        }
        if t.pipelines.len() as u32 >= t.limits.max_pipelines {
            return Err(ApiError::limit(
                "max_pipelines",
                t.limits.max_pipelines as u64,
                t.pipelines.len() as u64 + 1,
            ));
        }
        t.limits
    };
    if spec.workers == 0 {
        return Err(ApiError::bad_request(
            "invalid_request",
            "workers must be at least 1",
        ));
    }
    if spec.workers > limits.max_workers {
        return Err(ApiError::limit(
            "max_workers",
            limits.max_workers as u64,
            spec.workers as u64,
        ));
    }
    spec.effective_limits(&limits)?;
    let bytes = state
        .root
        .read(component_path(&state, &tenant, &spec.component))
        .map_err(|_| ApiError::not_found("component", &spec.component))?;
    use sha2::Digest;
    spec.component_hash = hex::encode(sha2::Sha256::digest(&bytes));
    let handle = load_pipeline(&state, &tenant, spec.clone(), Desired::Running).await?;
    {
        let mut reg = lock(&state.registry);
        let Some(t) = reg.tenants.get_mut(&tenant) else {
            return Err(ApiError::not_found("tenant", &tenant));
        };
        t.pipelines.insert(
            spec.name.clone(),
            PipelineEntry {
                spec: spec.clone(),
                desired: Desired::Running,
            },
        );
        reg.save(&state.data)?;
    }
    let status = handle.status();
    lock(&state.pipelines).insert((tenant, spec.name), handle);
    Ok((StatusCode::CREATED, axum::Json(status)))
}

/// One pipeline's status.
#[utoipa::path(get, path = "/pipelines/{name}", params(("name" = String, Path, description = "pipeline name")),
    responses((status = 200, body = PipelineStatus), (status = 404, body = ErrorBody)))]
async fn get_pipeline(
    State(state): Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<axum::Json<PipelineStatus>> {
    let tenant = tenant(&state, &headers)?;
    Ok(axum::Json(handle(&state, &tenant, &name)?.status()))
}

/// Starts, pauses or stops a pipeline (`stop` checkpoints and unloads).
#[utoipa::path(post, path = "/pipelines/{name}/{action}",
    params(("name" = String, Path, description = "pipeline name"), ("action" = String, Path, description = "start, pause or stop")),
    responses((status = 200, body = PipelineStatus), (status = 404, body = ErrorBody)))]
async fn control_pipeline(
    State(state): Shared,
    headers: HeaderMap,
    Path((name, action)): Path<(String, String)>,
) -> ApiResult<axum::Json<PipelineStatus>> {
    let tenant = tenant(&state, &headers)?;
    let h = handle(&state, &tenant, &name)?;
    let desired = match action.as_str() {
        "start" => Desired::Running,
        "pause" => Desired::Paused,
        "stop" => Desired::Stopped,
        _ => return Err(ApiError::not_found("action", &action)),
    };
    {
        let mut reg = lock(&state.registry);
        if let Some(entry) = reg
            .tenants
            .get_mut(&tenant)
            .and_then(|t| t.pipelines.get_mut(&name))
        {
            entry.desired = desired;
        }
        reg.save(&state.data)?;
    }
    h.set(desired);
    // Let the task take the command before answering with its status.
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(axum::Json(h.status()))
}

/// Deletes a pipeline and its data.
#[utoipa::path(delete, path = "/pipelines/{name}", params(("name" = String, Path, description = "pipeline name")),
    responses((status = 204), (status = 404, body = ErrorBody)))]
async fn delete_pipeline(
    State(state): Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    let tenant = tenant(&state, &headers)?;
    let h = handle(&state, &tenant, &name)?;
    h.shutdown(false).await;
    lock(&state.pipelines).remove(&(tenant.clone(), name.clone()));
    {
        let mut reg = lock(&state.registry);
        if let Some(t) = reg.tenants.get_mut(&tenant) {
            t.pipelines.remove(&name);
        }
        reg.save(&state.data)?;
    }
    // The task has ended; its database closes when the last handle goes.
    drop(h);
    let rel = format!("{}/pipelines/{name}", state.tenant_dir(&tenant));
    let mut removed = Err(std::io::Error::other("not tried"));
    for _ in 0..50 {
        removed = state.root.remove_dir_all(&rel);
        if removed.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Err(e) = removed {
        // The pipeline is gone from the registry; only its files remain.
        tracing::warn!(tenant, pipeline = %name, "could not remove the pipeline's data: {e}");
    }
    Ok(StatusCode::NO_CONTENT)
}

// -------------------------------------------------------------------- I/O --

/// Where a push's events went.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
pub struct PartitionRange {
    /// Input partition.
    pub partition: u32,
    /// First offset.
    pub start: u64,
    /// One past the last offset.
    pub end: u64,
}

/// A durable acknowledgement of a push.
#[derive(Serialize, Deserialize, utoipa::ToSchema)]
pub struct PushAck {
    /// Events acknowledged (a retry of an acknowledged push gets the
    /// original acknowledgement; nothing is appended twice).
    pub events: u64,
    /// Offsets per partition.
    pub offsets: Vec<PartitionRange>,
}

/// Appends input: JSON lines, or one JSON array of events. Returns once the
/// events are durable. With `Sluice-Producer-Id` and `Sluice-Producer-Seq`
/// headers, a retry of an acknowledged push appends nothing and gets the
/// same offsets.
#[utoipa::path(post, path = "/pipelines/{name}/input/{port}",
    params(("name" = String, Path, description = "pipeline name"), ("port" = String, Path, description = "input port")),
    request_body(content = String, content_type = "application/x-ndjson"),
    responses((status = 200, body = PushAck), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn push_input(
    State(state): Shared,
    headers: HeaderMap,
    Path((name, port)): Path<(String, String)>,
    b: Result<Bytes, BytesRejection>,
) -> ApiResult<axum::Json<PushAck>> {
    let tenant = tenant(&state, &headers)?;
    let h = handle(&state, &tenant, &name)?;
    if !h.shape.inputs.contains(&port) {
        return Err(ApiError::not_found("input port", &port));
    }
    let bytes = body(b)?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| ApiError::bad_request("invalid_body", "the body is not UTF-8"))?;
    let mut events = Vec::new();
    if text.trim_start().starts_with('[') {
        let values: Vec<serde_json::Value> = json(text.as_bytes())?;
        for (i, v) in values.iter().enumerate() {
            let line = v.to_string();
            match parse_input_line(&line) {
                Ok(Some(e)) => events.push(e),
                Ok(None) => {}
                Err(m) => {
                    return Err(ApiError::bad_request(
                        "invalid_event",
                        format!("element {i}: {m}"),
                    ));
                }
            }
        }
    } else {
        for (i, line) in text.lines().enumerate() {
            match parse_input_line(line) {
                Ok(Some(e)) => events.push(e),
                Ok(None) => {}
                Err(m) => {
                    return Err(ApiError::bad_request(
                        "invalid_event",
                        format!("line {}: {m}", i + 1),
                    ));
                }
            }
        }
    }
    let producer = match (
        headers.get("sluice-producer-id"),
        headers.get("sluice-producer-seq"),
    ) {
        (None, None) => None,
        (Some(id), Some(seq)) => {
            let id = id
                .to_str()
                .ok()
                .filter(|s| !s.is_empty() && s.len() <= 128)
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "invalid_producer",
                        "Sluice-Producer-Id: 1-128 visible characters",
                    )
                })?;
            let seq = seq
                .to_str()
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "invalid_producer",
                        "Sluice-Producer-Seq: an unsigned integer",
                    )
                })?;
            Some(ProducerSeq {
                id: id.to_owned(),
                seq,
            })
        }
        _ => {
            return Err(ApiError::bad_request(
                "invalid_producer",
                "send both Sluice-Producer-Id and Sluice-Producer-Seq, or neither",
            ));
        }
    };
    let n = events.len() as u64;
    let partitions = h.spec.workers;
    // Spread the push over the partitions in contiguous chunks, starting
    // at a rotating partition so small pushes spread too.
    // A producer's push goes to the partitions its (id, seq) picks, so a
    // retry's acknowledgement (the original offsets) names the same ones.
    let first = match &producer {
        Some(p) => {
            let h = xxhash_rust::xxh3::xxh3_64(format!("{}/{}", p.id, p.seq).as_bytes());
            (h % partitions as u64) as u32
        }
        None => h
            .next_partition
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    };
    let chunk = events.len().div_ceil(partitions as usize).max(1);
    let mut appends = Vec::new();
    let mut rest = events;
    let mut p = first % partitions;
    while !rest.is_empty() {
        let tail = rest.split_off(chunk.min(rest.len()));
        appends.push((port.clone(), p, rest));
        rest = tail;
        p = (p + 1) % partitions;
    }
    let parts: Vec<u32> = appends.iter().map(|(_, p, _)| *p).collect();
    let log = h.log.clone();
    let ranges = tokio::task::spawn_blocking(move || {
        log.append(AppendBatch {
            appends,
            mark: None,
            producer,
        })
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    h.input.notify_one();
    let appended: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    Ok(axum::Json(PushAck {
        events: appended.min(n),
        offsets: parts
            .into_iter()
            .zip(ranges)
            .map(|(partition, r)| PartitionRange {
                partition,
                start: r.start,
                end: r.end,
            })
            .collect(),
    }))
}

/// `GET …/output/{port}` parameters.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputQuery {
    /// Return events after this position (`STEP:WORKER:INDEX`).
    after: Option<String>,
    /// At most this many events (default 10 000).
    limit: Option<usize>,
    /// Wait up to this many milliseconds for output when there is none yet.
    wait_ms: Option<u64>,
}

fn parse_position(s: &str) -> ApiResult<OutputPosition> {
    let parts: Vec<&str> = s.split(':').collect();
    let bad = || {
        ApiError::bad_request(
            "invalid_position",
            format!("expected STEP:WORKER:INDEX, got {s:?}"),
        )
    };
    match parts.as_slice() {
        [a, b, c] => Ok(OutputPosition {
            step: a.parse().map_err(|_| bad())?,
            worker: b.parse().map_err(|_| bad())?,
            index: c.parse().map_err(|_| bad())?,
        }),
        _ => Err(bad()),
    }
}

/// Reads output after a position as NDJSON, each line
/// `{"position": "S:W:I", "insert"|"delete": value, "weight"?: n}`; long-polls
/// with `wait_ms` when nothing is there yet.
#[utoipa::path(get, path = "/pipelines/{name}/output/{port}",
    params(("name" = String, Path, description = "pipeline name"), ("port" = String, Path, description = "output port"),
           ("after" = Option<String>, Query, description = "STEP:WORKER:INDEX"),
           ("limit" = Option<usize>, Query, description = "max events"),
           ("wait_ms" = Option<u64>, Query, description = "long-poll wait")),
    responses((status = 200, content_type = "application/x-ndjson", body = String), (status = 404, body = ErrorBody)))]
async fn read_output_route(
    State(state): Shared,
    headers: HeaderMap,
    Path((name, port)): Path<(String, String)>,
    query: Result<Query<OutputQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Response> {
    let tenant = tenant(&state, &headers)?;
    let h = handle(&state, &tenant, &name)?;
    if !h.shape.outputs.contains(&port) {
        return Err(ApiError::not_found("output port", &port));
    }
    let Query(q) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let after = q.after.as_deref().map(parse_position).transpose()?;
    let limit = q.limit.unwrap_or(10_000).clamp(1, 100_000);
    let wait = Duration::from_millis(q.wait_ms.unwrap_or(0).min(60_000));
    let deadline = tokio::time::Instant::now() + wait;
    let mut committed = h.committed.clone();
    let events = loop {
        committed.borrow_and_update();
        let (log, port2) = (h.log.clone(), port.clone());
        let events = tokio::task::spawn_blocking(move || read_output(&*log, &port2, after, limit))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))??;
        if !events.is_empty() || tokio::time::Instant::now() >= deadline {
            break events;
        }
        if tokio::time::timeout_at(deadline, committed.changed())
            .await
            .is_err()
        {
            continue;
        }
    };
    let mut out = Vec::new();
    let mut line = Vec::new();
    for e in events {
        line.clear();
        write_output_line(&mut line, &e.event);
        let p = e.position;
        // `{"insert":…}` → `{"position":"S:W:I","insert":…}`
        out.extend_from_slice(
            format!("{{\"position\":\"{}:{}:{}\",", p.step, p.worker, p.index).as_bytes(),
        );
        out.extend_from_slice(&line[1..]);
    }
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        )],
        out,
    )
        .into_response())
}

/// `GET …/output/{port}/stream` parameters.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamQuery {
    /// Start after this position (`STEP:WORKER:INDEX`); a reconnecting
    /// client's `Last-Event-ID` header does the same.
    after: Option<String>,
}

/// What the output stream carries between reads.
struct StreamState {
    handle: Arc<PipelineHandle>,
    port: String,
    after: Option<OutputPosition>,
    committed: tokio::sync::watch::Receiver<u64>,
    ready: std::collections::VecDeque<axum::response::sse::Event>,
}

/// Streams output as server-sent events, from a position on and then as
/// steps commit: each event's `id` is its position (`STEP:WORKER:INDEX`, so
/// a reconnecting client resumes with `Last-Event-ID`) and its `data` the
/// line `{"insert"|"delete": value, "weight"?: n}`.
#[utoipa::path(get, path = "/pipelines/{name}/output/{port}/stream",
    params(("name" = String, Path, description = "pipeline name"), ("port" = String, Path, description = "output port"),
           ("after" = Option<String>, Query, description = "STEP:WORKER:INDEX")),
    responses((status = 200, content_type = "text/event-stream", body = String), (status = 404, body = ErrorBody)))]
async fn stream_output(
    State(state): Shared,
    headers: HeaderMap,
    Path((name, port)): Path<(String, String)>,
    query: Result<Query<StreamQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<
    axum::response::sse::Sse<
        impl futures_util::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>>,
    >,
> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let tenant = tenant(&state, &headers)?;
    let h = handle(&state, &tenant, &name)?;
    if !h.shape.outputs.contains(&port) {
        return Err(ApiError::not_found("output port", &port));
    }
    let Query(q) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let after = q
        .after
        .or(resume)
        .as_deref()
        .map(parse_position)
        .transpose()?;
    let init = StreamState {
        committed: h.committed.clone(),
        handle: h,
        port,
        after,
        ready: Default::default(),
    };
    let stream = futures_util::stream::unfold(init, |mut st| async move {
        loop {
            if let Some(event) = st.ready.pop_front() {
                return Some((Ok(event), st));
            }
            st.committed.borrow_and_update();
            let (log, port, after) = (st.handle.log.clone(), st.port.clone(), st.after);
            let read =
                tokio::task::spawn_blocking(move || read_output(&*log, &port, after, 1_000)).await;
            let events = match read {
                Ok(Ok(events)) => events,
                // The pipeline is gone or its storage failed: end the stream;
                // the client reconnects with `Last-Event-ID`.
                _ => return None,
            };
            if events.is_empty() {
                st.committed.changed().await.ok()?;
                continue;
            }
            let mut line = Vec::new();
            for e in events {
                line.clear();
                write_output_line(&mut line, &e.event);
                let p = e.position;
                st.after = Some(p);
                let data = String::from_utf8_lossy(line.trim_ascii_end()).into_owned();
                st.ready.push_back(
                    Event::default()
                        .id(format!("{}:{}:{}", p.step, p.worker, p.index))
                        .data(data),
                );
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

// ------------------------------------------------------- observability --

/// Prometheus metrics (admin only).
#[utoipa::path(get, path = "/metrics", responses((status = 200, content_type = "text/plain", body = String)))]
async fn metrics_route(State(state): Shared, headers: HeaderMap) -> ApiResult<Response> {
    admin(&state, &headers)?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        state.metrics.render(),
    )
        .into_response())
}

async fn openapi() -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(ApiDoc::openapi())
}

#[derive(Deserialize)]
struct PageQuery {
    token: Option<String>,
}

/// The status page: the caller's pipelines with live figures (the token in
/// the `Authorization` header or `?token=`).
async fn page(State(state): Shared, headers: HeaderMap, Query(q): Query<PageQuery>) -> Response {
    let token = bearer(&headers).map(str::to_owned).or(q.token);
    match caller_from(&state, token.as_deref()) {
        Ok(Caller::Tenant(t)) => {
            Html(super::page::render(&t, &statuses(&state, &t))).into_response()
        }
        Ok(Caller::Admin) => {
            let all: Vec<(String, Vec<PipelineStatus>)> = {
                let tenants: Vec<String> = lock(&state.registry).tenants.keys().cloned().collect();
                tenants
                    .into_iter()
                    .map(|t| {
                        let s = statuses(&state, &t);
                        (t, s)
                    })
                    .collect()
            };
            Html(super::page::render_all(&all)).into_response()
        }
        Err(_) => Html(super::page::login()).into_response(),
    }
}
