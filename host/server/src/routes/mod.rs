//! The HTTP edge: the router, one module of handlers per resource, and the
//! one place where errors become HTTP statuses and stable codes
//! ([`ApiError`]). Every handler authorizes first (through the service); a
//! tenant's view of the world is its own components and pipelines, and any
//! other name answers 404.

/// Components: upload, list, delete.
mod components;
/// Errors as HTTP statuses and stable codes.
mod error;
/// A pipeline's input and output: pushes, reads, streams.
mod io;
/// Observability: metrics, the status page and its sign-in.
mod observe;
/// The OpenAPI document and its route.
mod openapi;
/// Pipelines: create, list, get, scale, control, delete, metrics.
mod pipelines;
/// What every handler shares: the state, the caller's token, bodies.
mod request;
/// The router: every route to its handler.
mod router;
/// The console's sessions.
mod session;
/// Tenants (admin) and a tenant's usage.
mod tenants;

pub use error::ApiError;
pub use openapi::{ApiDoc, document};
pub use request::{AppState, CONSOLE_HEADER, MAX_JSON_BODY};
pub use router::router;
