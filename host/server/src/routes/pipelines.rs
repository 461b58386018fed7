//! `/pipelines`: create, inspect, control and delete a tenant's pipelines.

use super::error::ApiResult;
use super::request::{Shared, json_body, read_body, token};
use crate::types::{ErrorBody, PipelineSpec, PipelineStatus};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};

/// Lists the caller's pipelines with their status.
#[utoipa::path(get, path = "/pipelines", responses((status = 200, body = Vec<PipelineStatus>)))]
pub(super) async fn list(
    State(state): Shared,
    headers: HeaderMap,
) -> ApiResult<axum::Json<Vec<PipelineStatus>>> {
    let tenant = state.service.tenant(token(&state, &headers).as_deref())?;
    Ok(axum::Json(state.service.statuses(&tenant)))
}

/// Creates a pipeline from an uploaded component and starts it.
#[utoipa::path(post, path = "/pipelines", request_body = PipelineSpec,
    responses((status = 201, body = PipelineStatus), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub(super) async fn create(
    State(state): Shared,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<(StatusCode, axum::Json<PipelineStatus>)> {
    let tenant = state.service.tenant(token(&state, &headers).as_deref())?;
    let spec: PipelineSpec = json_body(&state, &headers, body).await?;
    let status = state.service.create_pipeline(&tenant, spec).await?;
    Ok((StatusCode::CREATED, axum::Json(status)))
}

/// One pipeline's status (in state `upgrading`, as it was when the
/// upgrade began, while it is being upgraded).
#[utoipa::path(get, path = "/pipelines/{name}", params(("name" = String, Path, description = "pipeline name")),
    responses((status = 200, body = PipelineStatus), (status = 404, body = ErrorBody)))]
pub(super) async fn get(
    State(state): Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<axum::Json<PipelineStatus>> {
    let tenant = state.service.tenant(token(&state, &headers).as_deref())?;
    Ok(axum::Json(state.service.status(&tenant, &name)?))
}

/// A pipeline's recent figures: one sample a second over the last ten
/// minutes it ran (rates, input lag, step latency percentiles), its last
/// checkpoints, and per worker its shards, partitions and lag.
#[utoipa::path(get, path = "/pipelines/{name}/metrics", params(("name" = String, Path, description = "pipeline name")),
    responses((status = 200, body = crate::history::PipelineMetrics), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(super) async fn metrics(
    State(state): Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<axum::Json<crate::history::PipelineMetrics>> {
    let tenant = state.service.tenant(token(&state, &headers).as_deref())?;
    Ok(axum::Json(
        state.service.pipeline(&tenant, &name)?.metrics(),
    ))
}

/// Changes a pipeline: `{"component": NAME, "start_empty": [ID…]}`
/// upgrades it to another uploaded component, keeping the state the new
/// version can take (503 `upgrading` meanwhile; 422 `upgrade_refused`,
/// the pipeline unchanged, if the new version refuses its state; across
/// hosts, the group's leader makes it while the pipeline runs on: 504
/// `upgrade_pending` says it did not answer in time, the request staying
/// asked, and 409 `upgrade_pending` refuses another meanwhile — 503
/// `upgrading` on the server still waiting for the answer);
/// `{"workers": W}` rescales it (a layout change between two steps that
/// moves only the shards the new balance needs; the status shows the new
/// W once it is done).
#[utoipa::path(patch, path = "/pipelines/{name}", params(("name" = String, Path, description = "pipeline name")),
    request_body = crate::types::PipelinePatch,
    responses((status = 200, body = PipelineStatus), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody), (status = 503, body = ErrorBody),
        (status = 504, body = ErrorBody)))]
pub(super) async fn patch(
    State(state): Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> ApiResult<axum::Json<PipelineStatus>> {
    let tenant = state.service.tenant(token(&state, &headers).as_deref())?;
    let patch: crate::types::PipelinePatch = json_body(&state, &headers, body).await?;
    let mut status = state.service.pipeline(&tenant, &name)?.status();
    if patch.start_empty.is_some() && patch.component.is_none() {
        return Err(crate::error::ServiceError::invalid(
            "invalid_start_empty",
            "`start_empty` goes with `component` (an upgrade)",
        )
        .into());
    }
    if let Some(component) = patch.component {
        status = state
            .service
            .upgrade_pipeline(
                &tenant,
                &name,
                &component,
                patch.start_empty.unwrap_or_default(),
                patch.rebuild,
            )
            .await?;
    }
    if let Some(workers) = patch.workers {
        status = state
            .service
            .scale_pipeline(&tenant, &name, workers)
            .await?;
    }
    Ok(axum::Json(status))
}

/// `POST /pipelines/{name}/diff` parameters.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DiffQuery {
    /// Changed operators to start empty, comma-separated.
    start_empty: Option<String>,
    /// The diff of an upgrade that rebuilds the state from the retained
    /// input (`PATCH` with `"rebuild": true`).
    rebuild: Option<bool>,
}

/// Compares the pipeline's circuit with a new version of it (the body, a
/// component; checked and probed as an upload is, not stored): every
/// stateful operator kept, migrated, changed, new or removed, the ports
/// added or removed, and whether an upgrade to it would be accepted (no
/// operator changed, or each changed one named in `start_empty`; with
/// `rebuild`, every operator rebuilt from the retained input).
#[utoipa::path(post, path = "/pipelines/{name}/diff",
    params(("name" = String, Path, description = "pipeline name"),
           ("start_empty" = Option<String>, Query, description = "changed operators to start empty, comma-separated"),
           ("rebuild" = Option<bool>, Query, description = "the diff of an upgrade that rebuilds the state from the retained input")),
    request_body(content = Vec<u8>, content_type = "application/wasm"),
    responses((status = 200, body = Object, description = "the diff (`sluice_core::CircuitDiff`)"),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(super) async fn diff(
    State(state): Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
    query: Result<axum::extract::Query<DiffQuery>, axum::extract::rejection::QueryRejection>,
    body: Body,
) -> ApiResult<axum::Json<sluice_core::CircuitDiff>> {
    let tenant = state.service.tenant(token(&state, &headers).as_deref())?;
    let axum::extract::Query(q) = query.map_err(|e| crate::error::ServiceError::Invalid {
        code: "invalid_query",
        message: e.body_text(),
    })?;
    state.service.pipeline(&tenant, &name)?;
    let start_empty: Vec<String> = q
        .start_empty
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let limit = state.service.limits(&tenant)?.max_component_bytes;
    let bytes = read_body(&state, &headers, body, limit, "max_component_bytes").await?;
    let diff = state
        .service
        .diff_pipeline(&tenant, &name, bytes.into(), &start_empty)
        .await?;
    Ok(axum::Json(match q.rebuild {
        Some(true) => diff.rebuilding(),
        _ => diff,
    }))
}

/// Starts, pauses or stops a pipeline (`stop` checkpoints and unloads).
#[utoipa::path(post, path = "/pipelines/{name}/{action}",
    params(("name" = String, Path, description = "pipeline name"), ("action" = String, Path, description = "start, pause or stop")),
    responses((status = 200, body = PipelineStatus), (status = 404, body = ErrorBody)))]
pub(super) async fn control(
    State(state): Shared,
    headers: HeaderMap,
    Path((name, action)): Path<(String, String)>,
) -> ApiResult<axum::Json<PipelineStatus>> {
    let tenant = state.service.tenant(token(&state, &headers).as_deref())?;
    Ok(axum::Json(
        state.service.control(&tenant, &name, &action).await?,
    ))
}

/// Deletes a pipeline and its data.
#[utoipa::path(delete, path = "/pipelines/{name}", params(("name" = String, Path, description = "pipeline name")),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub(super) async fn delete(
    State(state): Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    let tenant = state.service.tenant(token(&state, &headers).as_deref())?;
    state.service.delete_pipeline(&tenant, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
