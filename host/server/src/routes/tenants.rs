//! `/tenants` (admin): create, list with usage, rotate a token, delete a
//! tenant with its data; `/usage`: a tenant's own usage.

use super::error::ApiResult;
use super::request::{Shared, json_body, token};
use crate::types::{CreateTenant, ErrorBody, HostUsage, TenantCreated, TenantUsage};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};

/// Creates a tenant and issues its token (admin only).
#[utoipa::path(post, path = "/tenants", request_body = CreateTenant,
    responses((status = 201, body = TenantCreated), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(super) async fn create(
    State(state): Shared,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, axum::Json<TenantCreated>)> {
    state.service.admin(token(&state, &headers).as_deref())?;
    let req: CreateTenant = json_body(&state, &headers, body).await?;
    let created = state.service.create_tenant(req).await?;
    Ok((StatusCode::CREATED, axum::Json(created)))
}

/// The host's budgets and every tenant's usage against its limits (admin
/// only).
#[utoipa::path(get, path = "/tenants", responses((status = 200, body = HostUsage)))]
pub(super) async fn list(
    State(state): Shared,
    headers: HeaderMap,
) -> ApiResult<axum::Json<HostUsage>> {
    state.service.admin(token(&state, &headers).as_deref())?;
    Ok(axum::Json(state.service.host_usage().await?))
}

/// Issues a new token for a tenant; the old one stops working at once
/// (admin only).
#[utoipa::path(post, path = "/tenants/{name}/token", params(("name" = String, Path, description = "tenant name")),
    responses((status = 200, body = TenantCreated), (status = 404, body = ErrorBody)))]
pub(super) async fn rotate(
    State(state): Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<axum::Json<TenantCreated>> {
    state.service.admin(token(&state, &headers).as_deref())?;
    let rotated = state.service.rotate_token(&name).await?;
    Ok(axum::Json(rotated))
}

/// Deletes a tenant with its pipelines, components, logs, checkpoints and
/// Kafka topics (admin only).
#[utoipa::path(delete, path = "/tenants/{name}", params(("name" = String, Path, description = "tenant name")),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub(super) async fn delete(
    State(state): Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    state.service.admin(token(&state, &headers).as_deref())?;
    state.service.delete_tenant(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// What the caller uses against its limits: pipelines, disk, memory.
#[utoipa::path(get, path = "/usage", responses((status = 200, body = TenantUsage)))]
pub(super) async fn usage(
    State(state): Shared,
    headers: HeaderMap,
) -> ApiResult<axum::Json<TenantUsage>> {
    let tenant = state.service.tenant(token(&state, &headers).as_deref())?;
    Ok(axum::Json(state.service.usage(&tenant).await?))
}
