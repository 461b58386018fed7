//! The router: every route to its handler, the fallback (404), and the
//! headers every response carries.

use super::error::ApiError;
use super::request::AppState;
use super::{components, io, observe, openapi, pipelines, tenants};
use crate::error::ServiceError;
use axum::Router;
use axum::http::{HeaderValue, header};
use axum::routing::{get, post, put};
use std::sync::Arc;
use tower_http::set_header::SetResponseHeaderLayer;

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
        .route("/openapi.json", get(openapi::openapi))
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
        .route("/pipelines/{name}/diff", post(pipelines::diff))
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
