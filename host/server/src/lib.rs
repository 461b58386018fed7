//! # sluice-server: `sluice serve`, the multi-tenant host
//!
//! A long-running host with an HTTP API (axum, OpenAPI at `/openapi.json`):
//!
//! - [`error`]: [`ServiceError`](error::ServiceError), what the domain
//!   layer refuses or fails at.
//! - [`types`]: the API's wire types (request and response bodies, specs).
//! - [`limits`]: every bound the server enforces and the range of every
//!   numeric setting; **tenant limits** whole (their checks, the limits a
//!   pipeline runs with).
//! - [`settings`]: the server's Kafka and across-hosts settings, and the
//!   Kafka names of its pipelines.
//! - [`service`]: the domain layer — callers and tokens, tenants,
//!   components, pipelines, admission and quotas — returning
//!   [`ServiceError`](service::ServiceError); no HTTP in it.
//! - [`registry`]: tenants (hashed tokens, limits) and pipeline specs,
//!   persisted atomically.
//! - [`runner`]: one task per pipeline, a state machine over its
//!   coordinator, recovering as the pipeline's recovery policy says.
//! - [`routes`]: the HTTP edge, one module per resource, and the one
//!   mapping of errors to statuses and codes.
//! - [`page`]: the console.
//! - [`history`]: each pipeline's recent figures (for the console).
//! - [`serve()`]: runs the server — the accept loop with its timeouts and
//!   connection cap, and the shutdown that checkpoints every pipeline.
//!
//! Files import downwards only: `error`, then `types`, `limits`,
//! `settings`, `registry`, `history`, `page`, then `runner`, `service`,
//! `routes`, and `serve` on top.
//!
//! An admin token (never a default) creates tenants; a tenant sees only its
//! own resources (another tenant's answer 404). Each tenant's files live
//! under `DIR/tenants/<tenant>/`, created and written through a `cap-std`
//! directory handle, every name validated first. On start the host
//! recovers every pipeline that was running; on SIGTERM it checkpoints them.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! sluice_server::serve(sluice_server::ServeOptions {
//!     data: "/var/lib/sluice".into(),
//!     listen: "127.0.0.1:7878".parse()?,
//!     admin_token: std::env::var("SLUICE_ADMIN_TOKEN")?,
//!     pool: 0,
//!     kafka: None,
//!     limits: Default::default(),
//! })
//! .await
//! # }
//! ```

/// What the domain layer refuses, or fails at.
pub mod error;
/// Each pipeline's recent figures, for the console.
pub mod history;
/// Every bound the server enforces; tenant limits whole.
pub mod limits;
/// The console.
pub mod page;
/// Tenants and pipeline specs, persisted atomically.
pub mod registry;
/// The HTTP edge: router, handlers by resource, the error mapping.
pub mod routes;
/// One task per pipeline: alone, or as one host of it across hosts.
pub mod runner;
/// `sluice serve`: the accept loop and the shutdown.
mod serve;
/// The domain layer: tenants, components, pipelines, admission.
pub mod service;
/// The server's Kafka and across-hosts settings.
pub mod settings;
/// The API's wire types.
pub mod types;

pub use serve::{ServeOptions, serve};
