//! `sluice serve`: a long-running, multi-tenant host with an HTTP API.
//!
//! - An admin token (never a default) creates tenants and issues their API
//!   tokens, which are stored hashed ([`registry`]).
//! - Tenants upload components, create pipelines from them, push input with
//!   a durable acknowledgement and read output from a position
//!   ([`api`]); every route is authorized and a tenant sees only its own
//!   resources (another tenant's answer 404).
//! - Each pipeline runs in its own task ([`runner`]) with the tenant's
//!   limits; a failure (trap, fuel, deadline, memory, output limit) fails
//!   only that pipeline.
//! - Each tenant's files live under `DIR/tenants/<tenant>/`, created and
//!   written through a `cap-std` directory handle; every name from a
//!   request is validated before it becomes part of a path.
//! - On start the host recovers every pipeline that was running.

pub mod api;
mod page;
pub mod registry;
pub mod runner;

use crate::runtime::engine::{Limits, SluiceEngine};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use registry::Registry;
use runner::PipelineHandle;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The data directory (registry, components, pipelines).
    pub data: PathBuf,
    /// Where to listen.
    pub listen: SocketAddr,
    /// The admin token.
    pub admin_token: String,
    /// Size the pooling allocator for this many instances (0: allocate on
    /// demand).
    pub pool: u32,
    /// Kafka brokers for pipelines created with `"log": "kafka"`.
    pub kafka: Option<runner::KafkaSettings>,
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
    /// 400 with `code`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code,
            message: message.into(),
        }
    }

    /// 404 for a resource the caller cannot see (missing or another
    /// tenant's: the answer is the same).
    pub fn not_found(kind: &str, name: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: "not_found",
            message: format!("no {kind} named {name:?}"),
        }
    }

    /// 401: no or an unknown token.
    pub fn unauthorized() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            code: "unauthorized",
            message: "missing or unknown token: send `Authorization: Bearer <token>`".into(),
        }
    }

    /// 409.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::CONFLICT,
            code,
            message: message.into(),
        }
    }

    /// 422: the request is well-formed but its content is refused.
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code,
            message: message.into(),
        }
    }

    /// A tenant limit refused the request: names the limit, its value and
    /// what was attempted.
    pub fn limit(name: &str, limit: u64, attempted: u64) -> Self {
        ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "limit_exceeded",
            message: format!("limit `{name}` is {limit}; the request asked for {attempted}"),
        }
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "internal",
            message: message.into(),
        }
    }
}

impl From<crate::Error> for ApiError {
    fn from(e: crate::Error) -> Self {
        use crate::Error as E;
        match &e {
            E::Unknown { .. } => ApiError {
                status: StatusCode::NOT_FOUND,
                code: "not_found",
                message: e.to_string(),
            },
            E::Config(_) | E::InvalidComponent { .. } => {
                ApiError::unprocessable("invalid", e.to_string())
            }
            E::Trap { .. }
            | E::FuelExhausted { .. }
            | E::DeadlineExceeded { .. }
            | E::MemoryExceeded { .. }
            | E::Guest { .. } => ApiError::unprocessable("guest_failed", e.to_string()),
            _ => ApiError::internal(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": { "code": self.code, "message": self.message } });
        (self.status, axum::Json(body)).into_response()
    }
}

/// The server's shared state.
pub struct AppState {
    /// The data directory.
    pub data: PathBuf,
    /// The data directory as a capability: tenant files are created and
    /// written only through it.
    pub root: cap_std::fs::Dir,
    /// SHA-256 of the admin token.
    pub admin_hash: String,
    /// Tenants and pipeline specs.
    pub registry: Mutex<Registry>,
    /// Loaded pipelines by (tenant, name).
    pub pipelines: Mutex<BTreeMap<(String, String), Arc<PipelineHandle>>>,
    /// The engine every pipeline's engine derives from.
    pub engine: Arc<SluiceEngine>,
    /// Renders `/metrics`.
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    /// Kafka brokers for Kafka pipelines, if the admin configured them.
    pub kafka: Option<runner::KafkaSettings>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl AppState {
    /// The path of a tenant's directory (names validated by the caller).
    fn tenant_dir(&self, tenant: &str) -> String {
        format!("tenants/{tenant}")
    }
}

/// Runs the server until Ctrl-C / SIGTERM, then checkpoints every running
/// pipeline and exits.
pub async fn serve(opts: ServeOptions) -> anyhow::Result<()> {
    if opts.admin_token.trim().len() < 16 {
        anyhow::bail!("the admin token must be at least 16 characters");
    }
    std::fs::create_dir_all(&opts.data)?;
    let root = cap_std::fs::Dir::open_ambient_dir(&opts.data, cap_std::ambient_authority())?;
    root.create_dir_all("tenants")?;
    let registry = Registry::load(&opts.data)?;
    let engine = Arc::new(if opts.pool > 0 {
        SluiceEngine::with_pooling(
            Limits::default(),
            SluiceEngine::default_cache_dir(),
            opts.pool,
        )?
    } else {
        SluiceEngine::new(Limits::default(), SluiceEngine::default_cache_dir())?
    });
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&[
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ])?
        .build_recorder();
    let metrics = recorder.handle();
    if metrics::set_global_recorder(recorder).is_err() {
        tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
    }
    let state = Arc::new(AppState {
        data: opts.data.clone(),
        root,
        admin_hash: registry::token_hash(opts.admin_token.trim()),
        registry: Mutex::new(registry),
        pipelines: Mutex::new(BTreeMap::new()),
        engine,
        metrics,
        kafka: opts.kafka.clone(),
    });

    // Recover every pipeline: running ones resume (restore + replay).
    let entries: Vec<(String, registry::PipelineEntry)> = {
        let reg = lock(&state.registry);
        reg.tenants
            .iter()
            .flat_map(|(t, tenant)| {
                tenant
                    .pipelines
                    .values()
                    .map(move |p| (t.clone(), p.clone()))
            })
            .collect()
    };
    for (tenant, entry) in entries {
        match api::load_pipeline(&state, &tenant, entry.spec.clone(), entry.desired).await {
            Ok(handle) => {
                tracing::info!(tenant, pipeline = %entry.spec.name, desired = ?entry.desired, "recovered");
                lock(&state.pipelines).insert((tenant, entry.spec.name.clone()), handle);
            }
            Err(e) => tracing::error!(
                tenant,
                pipeline = %entry.spec.name,
                "could not recover: {}", e.message
            ),
        }
    }

    let app = api::router(state.clone());
    let listener = tokio::net::TcpListener::bind(opts.listen).await?;
    let addr = listener.local_addr()?;
    // Tests and scripts read this line to learn the port.
    println!("sluice: listening on http://{addr}");
    tracing::info!("listening on http://{addr}");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let ctrl_c = tokio::signal::ctrl_c();
            #[cfg(unix)]
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut term) => tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} },
                Err(e) => {
                    tracing::warn!("no SIGTERM handler ({e}); stop the server with Ctrl-C");
                    let _ = ctrl_c.await;
                }
            }
            #[cfg(not(unix))]
            let _ = ctrl_c.await;
        })
        .await?;
    let handles: Vec<Arc<PipelineHandle>> = lock(&state.pipelines).values().cloned().collect();
    for h in handles {
        h.shutdown(true).await;
    }
    Ok(())
}
