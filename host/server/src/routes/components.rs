//! `/components`: a tenant's uploaded components.

use super::error::ApiResult;
use super::request::{Shared, read_body, token};
use crate::types::{ComponentInfo, ErrorBody};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};

/// Uploads (or replaces) a component: checked against the Sluice world,
/// precompiled (on a bounded pool, within the server's compile timeout)
/// and cached by content hash. Running pipelines keep the version they were
/// created with. The body is read only after the token is checked, and
/// only up to the tenant's `max_component_bytes`.
#[utoipa::path(put, path = "/components/{name}", request_body(content = Vec<u8>, content_type = "application/wasm"),
    params(("name" = String, Path, description = "component name")),
    responses((status = 201, body = ComponentInfo), (status = 408, body = ErrorBody), (status = 413, body = ErrorBody), (status = 422, body = ErrorBody), (status = 507, body = ErrorBody)))]
pub(super) async fn put(
    State(state): Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> ApiResult<(StatusCode, axum::Json<ComponentInfo>)> {
    let tenant = state.service.tenant(token(&state, &headers).as_deref())?;
    sluice_core::validate_name("component", &name).map_err(crate::error::ServiceError::from)?;
    let limit = state.service.limits(&tenant)?.max_component_bytes;
    let bytes = read_body(&state, &headers, body, limit, "max_component_bytes").await?;
    let info = state
        .service
        .put_component(&tenant, &name, bytes.into())
        .await?;
    Ok((StatusCode::CREATED, axum::Json(info)))
}

/// Lists the caller's components.
#[utoipa::path(get, path = "/components", responses((status = 200, body = Vec<ComponentInfo>)))]
pub(super) async fn list(
    State(state): Shared,
    headers: HeaderMap,
) -> ApiResult<axum::Json<Vec<ComponentInfo>>> {
    let tenant = state.service.tenant(token(&state, &headers).as_deref())?;
    Ok(axum::Json(state.service.list_components(&tenant)?))
}

/// Deletes a component name (pipelines created from it keep running).
#[utoipa::path(delete, path = "/components/{name}", params(("name" = String, Path, description = "component name")),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub(super) async fn delete(
    State(state): Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    let tenant = state.service.tenant(token(&state, &headers).as_deref())?;
    state.service.delete_component(&tenant, &name)?;
    Ok(StatusCode::NO_CONTENT)
}
