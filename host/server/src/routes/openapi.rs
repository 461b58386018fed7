//! The API's OpenAPI document: utoipa's [`ApiDoc`] over every handler,
//! [`document`] with the conventions every operation shares made explicit,
//! and the handler serving it at `/openapi.json`.

use super::{components, io, observe, pipelines, tenants};
use crate::types::{ErrorBody, ErrorDetail};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use utoipa::OpenApi;

/// The API's OpenAPI document.
#[derive(OpenApi)]
#[openapi(
    info(title = "Sluice", description = "Multi-tenant host for WebAssembly circuit pipelines"),
    paths(
        tenants::create,
        tenants::list,
        tenants::delete,
        tenants::rotate,
        tenants::usage,
        components::list,
        components::put,
        components::delete,
        pipelines::list,
        pipelines::create,
        pipelines::get,
        pipelines::patch,
        pipelines::metrics,
        pipelines::delete,
        pipelines::control,
        pipelines::diff,
        io::push,
        io::producer_state,
        io::read,
        io::stream,
        observe::metrics
    ),
    components(schemas(
        crate::types::CreateTenant,
        crate::types::TenantCreated,
        crate::types::TenantLimits,
        crate::types::TenantUsage,
        crate::types::HostUsage,
        crate::types::ComponentInfo,
        crate::types::PipelineSpec,
        crate::types::PipelineLimits,
        crate::types::PipelinePatch,
        crate::history::PipelineMetrics,
        crate::history::Sample,
        crate::history::CheckpointEntry,
        crate::history::WorkerFigures,
        crate::types::PipelineState,
        crate::types::PipelineStatus,
        crate::types::HostsStatus,
        crate::types::CommittedBy,
        crate::types::PushAck,
        crate::types::ProducerInfo,
        crate::types::PartitionRange,
        ErrorBody,
        ErrorDetail
    )),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

/// The API's OpenAPI document as served at `/openapi.json`: utoipa's
/// [`ApiDoc`] with the conventions every operation shares made explicit, so
/// that tools generating requests from it (schemathesis in CI) meet no
/// status it does not list:
///
/// - a unique `operationId` per operation (`get_pipelines_name`, …);
/// - 401 (no or an unknown token) and 403 (the other kind of token) on
///   every operation; 400 (a malformed name, query or body) on every one;
///   404 where the path names a resource; 408 and 413 where there is a
///   body; 503 where the host's budgets admit the request, and on every
///   route of one pipeline (it may be in the middle of an upgrade); each
///   with the error body;
/// - the bodies' media types: a component upload is `application/wasm`
///   bytes, a push `application/x-ndjson` lines or an `application/json`
///   array of events;
/// - links from a created pipeline to the routes that take its name.
pub fn document() -> serde_json::Value {
    use serde_json::{Value, json};
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document serializes");
    let error = |what: &str| {
        json!({
            "description": what,
            "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorBody" } } }
        })
    };
    let Some(paths) = doc["paths"].as_object_mut() else {
        return doc;
    };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, op) in item.iter_mut() {
            let Some(op) = op.as_object_mut() else {
                continue;
            };
            let id = format!(
                "{method}{}",
                path.split('/')
                    .filter(|s| !s.is_empty())
                    .map(|s| format!("_{}", s.trim_matches(|c| c == '{' || c == '}')))
                    .collect::<String>()
            );
            op.insert("operationId".into(), Value::String(id));
            let has_body = op.contains_key("requestBody");
            let responses = op
                .entry("responses")
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .expect("responses are an object");
            let mut add = |status: &str, what: &str| {
                responses
                    .entry(status.to_owned())
                    .or_insert_with(|| error(what));
            };
            add(
                "400",
                "A malformed name, query or body (`error.code` says which)",
            );
            add("401", "No token, or one nobody holds");
            add(
                "403",
                "A token of the other kind (a tenant's on an admin route, or the reverse)",
            );
            if path.contains('{') || (method == "post" && path == "/pipelines") {
                add("404", "No such resource (or another tenant's)");
            }
            if has_body {
                add(
                    "408",
                    "The body did not arrive within the server's body timeout",
                );
                add("413", "The body is larger than the caller's limit");
            }
            if matches!(
                (method.as_str(), path.as_str()),
                ("post", "/pipelines")
                    | ("patch", "/pipelines/{name}")
                    | ("post", "/pipelines/{name}/{action}")
            ) {
                add(
                    "503",
                    "The host's memory budget or instance pool cannot admit it",
                );
                add("422", "A tenant limit refuses it");
            }
            if path.starts_with("/pipelines/{name}") {
                add(
                    "503",
                    "The pipeline is being upgraded (`upgrading`): ask again once it runs the new version",
                );
            }
        }
    }
    // Names in paths follow the naming rule; numeric settings have ranges.
    let name_rule = "^[a-z0-9][a-z0-9_-]{0,63}$";
    if let Some(paths) = doc["paths"].as_object_mut() {
        for item in paths.values_mut() {
            for op in item
                .as_object_mut()
                .into_iter()
                .flat_map(|i| i.values_mut())
            {
                let parameters = op.get_mut("parameters").and_then(Value::as_array_mut);
                for p in parameters.into_iter().flatten() {
                    if p["in"] == "path" && matches!(p["name"].as_str(), Some("name" | "port")) {
                        p["schema"]["pattern"] = json!(name_rule);
                    }
                }
            }
        }
    }
    let ranges: [(&str, &[crate::limits::Range]); 2] = [
        (
            "PipelineSpec",
            &[
                crate::limits::pipeline::WORKERS,
                crate::limits::pipeline::PARTITIONS,
                crate::limits::pipeline::MAX_BATCH,
                crate::limits::pipeline::CHECKPOINT_EVERY_STEPS,
                crate::limits::pipeline::CHECKPOINT_INTERVAL_MS,
                crate::limits::pipeline::OUTPUT_RETENTION_STEPS,
            ],
        ),
        (
            "TenantLimits",
            &[
                crate::limits::tenant::MEMORY_MIB,
                crate::limits::tenant::FUEL_PER_STEP,
                crate::limits::tenant::DEADLINE_MS,
                crate::limits::tenant::MAX_PIPELINES,
                crate::limits::tenant::MAX_WORKERS,
                crate::limits::tenant::MAX_COMPONENT_BYTES,
                crate::limits::tenant::MAX_OUTPUT_PER_STEP,
                crate::limits::tenant::MAX_PUSH_BYTES,
                crate::limits::tenant::MAX_PUSH_EVENTS,
                crate::limits::tenant::MAX_CONCURRENT_PUSHES,
                crate::limits::tenant::MAX_STREAMS,
                crate::limits::tenant::DISK_QUOTA_MIB,
            ],
        ),
    ];
    for (schema, ranges) in ranges {
        for r in ranges {
            if let Some(prop) = doc.pointer_mut(&format!(
                "/components/schemas/{schema}/properties/{}",
                r.name
            )) {
                prop["minimum"] = json!(r.min);
                prop["maximum"] = json!(r.max);
            }
        }
    }
    for (schema, field) in [
        ("PipelineSpec", "name"),
        ("PipelineSpec", "component"),
        ("CreateTenant", "name"),
    ] {
        if let Some(prop) =
            doc.pointer_mut(&format!("/components/schemas/{schema}/properties/{field}"))
        {
            prop["pattern"] = json!(name_rule);
        }
    }
    // Bodies that are not JSON objects.
    if let Some(put) = doc.pointer_mut("/paths/~1components~1{name}/put") {
        put["requestBody"] = json!({
            "required": true,
            "description": "The component: a WebAssembly component (wasm32-wasip2) of the sluice:circuit world",
            "content": { "application/wasm": { "schema": { "type": "string", "format": "binary" } } }
        });
    }
    if let Some(post) = doc.pointer_mut("/paths/~1pipelines~1{name}~1diff/post") {
        post["requestBody"] = json!({
            "required": true,
            "description": "The new version: a WebAssembly component (wasm32-wasip2) of the sluice:circuit world",
            "content": { "application/wasm": { "schema": { "type": "string", "format": "binary" } } }
        });
    }
    if let Some(post) = doc.pointer_mut("/paths/~1pipelines~1{name}~1input~1{port}/post") {
        post["requestBody"] = json!({
            "required": true,
            "description": "Events: JSON lines (a bare value inserts it; {\"insert\": v} / {\"delete\": v}, optionally with \"weight\": n), or one JSON array of them",
            "content": {
                "application/x-ndjson": { "schema": { "type": "string" } },
                "application/json": { "schema": { "type": "array", "items": {} } }
            }
        });
    }
    // A created pipeline leads to the routes that take its name.
    if let Some(created) = doc.pointer_mut("/paths/~1pipelines/post/responses/201") {
        let name = json!({ "name": "$response.body#/name" });
        created["links"] = json!({
            "GetPipeline": { "operationId": "get_pipelines_name", "parameters": name },
            "PipelineMetrics": { "operationId": "get_pipelines_name_metrics", "parameters": name },
            "ScalePipeline": { "operationId": "patch_pipelines_name", "parameters": name },
            "ControlPipeline": { "operationId": "post_pipelines_name_action", "parameters": name },
            "DeletePipeline": { "operationId": "delete_pipelines_name", "parameters": name },
            "ReadOutput": { "operationId": "get_pipelines_name_output_port", "parameters": name },
            "PushInput": { "operationId": "post_pipelines_name_input_port", "parameters": name }
        });
    }
    doc
}

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

/// The OpenAPI document.
pub(super) async fn openapi() -> Response {
    static DOCUMENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let body = DOCUMENT.get_or_init(|| document().to_string());
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.as_str(),
    )
        .into_response()
}
