//! Observability: Prometheus metrics, the OpenAPI document, the status page.

use super::{ApiDoc, ApiResult, Shared, bearer};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{Html, IntoResponse, Response};
use serde::Deserialize;
use utoipa::OpenApi;

/// Prometheus metrics (admin only).
#[utoipa::path(get, path = "/metrics", responses((status = 200, content_type = "text/plain", body = String)))]
pub(super) async fn metrics(State(state): Shared, headers: HeaderMap) -> ApiResult<Response> {
    state.service.admin(bearer(&headers))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        state.metrics.render(),
    )
        .into_response())
}

/// The OpenAPI document.
pub(super) async fn openapi() -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(ApiDoc::openapi())
}

#[derive(Deserialize)]
pub(super) struct PageQuery {
    token: Option<String>,
}

/// The status page: the caller's pipelines with live figures (the token in
/// the `Authorization` header or `?token=`).
pub(super) async fn page(
    State(state): Shared,
    headers: HeaderMap,
    Query(q): Query<PageQuery>,
) -> Response {
    use crate::service::Caller;
    let token = bearer(&headers).map(str::to_owned).or(q.token);
    match state.service.caller(token.as_deref()) {
        Ok(Caller::Tenant(t)) => {
            Html(crate::page::render(&t, &state.service.statuses(&t))).into_response()
        }
        Ok(Caller::Admin) => {
            let all: Vec<_> = state
                .service
                .tenants()
                .into_iter()
                .map(|t| {
                    let s = state.service.statuses(&t);
                    (t, s)
                })
                .collect();
            Html(crate::page::render_all(&all)).into_response()
        }
        Err(_) => Html(crate::page::login()).into_response(),
    }
}
