//! `/tenants`: the admin creates tenants.

use super::{ApiResult, Shared, bearer, body, json};
use crate::types::{CreateTenant, ErrorBody, TenantCreated};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};

/// Creates a tenant and issues its token (admin only).
#[utoipa::path(post, path = "/tenants", request_body = CreateTenant,
    responses((status = 201, body = TenantCreated), (status = 409, body = ErrorBody)))]
pub(super) async fn create(
    State(state): Shared,
    headers: HeaderMap,
    b: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, axum::Json<TenantCreated>)> {
    state.service.admin(bearer(&headers))?;
    let req: CreateTenant = json(&body(b)?)?;
    let created = state.service.create_tenant(req)?;
    Ok((StatusCode::CREATED, axum::Json(created)))
}
