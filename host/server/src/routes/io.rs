//! A pipeline's input and output over HTTP: durable pushes, reads after a
//! position (long-poll) and server-sent events.

use super::error::{ApiError, ApiResult};
use super::request::{AppState, Shared, read_body, token};
use crate::error::ServiceError;
use crate::limits::Permit;
use crate::runner::PipelineHandle;
use crate::types::{ErrorBody, ProducerInfo, PushAck};
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sluice_core::wire::{BodyError, parse_events_bounded, write_output_line};
use sluice_core::{OutputPosition, PositionedEvent};
use sluice_storage::{ProducerSeq, read_output};
use std::sync::Arc;
use std::time::Duration;

fn bad(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, code, message)
}

/// The handle of a tenant's pipeline whose `kind` port `port` exists.
fn port_of(
    state: &AppState,
    tenant: &str,
    name: &str,
    output: bool,
    port: &str,
) -> ApiResult<Arc<PipelineHandle>> {
    let h = state.service.pipeline(tenant, name)?;
    let ports = h.ports();
    let (known, kind) = if output {
        (&ports.outputs, "output port")
    } else {
        (&ports.inputs, "input port")
    };
    if !known.iter().any(|p| p == port) {
        return Err(ServiceError::not_found(kind, port).into());
    }
    Ok(h)
}

/// A producer id: 1–128 visible ASCII characters.
fn producer_id(id: &str) -> ApiResult<&str> {
    let ok = !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_graphic());
    ok.then_some(id).ok_or_else(|| {
        bad(
            "invalid_producer",
            "a producer id is 1-128 visible ASCII characters",
        )
    })
}

/// The producer of a push (`Sluice-Producer-Id` and `Sluice-Producer-Seq`,
/// both or neither; `Sluice-Producer-Epoch` optional, 0 by default) and its
/// mark (`Sluice-Producer-Mark`, optional: up to 4 KiB the producer gets
/// back from `GET …/producers/{id}`, stored with the append).
fn producer(headers: &HeaderMap) -> ApiResult<Option<(ProducerSeq, Option<String>)>> {
    let text = |name: &str| -> ApiResult<Option<&str>> {
        headers
            .get(name)
            .map(|v| {
                v.to_str()
                    .map_err(|_| bad("invalid_producer", format!("{name}: not visible ASCII")))
            })
            .transpose()
    };
    let number = |name: &str| -> ApiResult<Option<u64>> {
        text(name)?
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| bad("invalid_producer", format!("{name}: an unsigned integer")))
            })
            .transpose()
    };
    let (id, seq) = (text("sluice-producer-id")?, number("sluice-producer-seq")?);
    let (epoch, mark) = (
        number("sluice-producer-epoch")?,
        text("sluice-producer-mark")?,
    );
    match (id, seq) {
        (None, None) if epoch.is_none() && mark.is_none() => Ok(None),
        (Some(id), Some(seq)) => {
            if mark.is_some_and(|m| m.len() > 4096) {
                return Err(bad(
                    "invalid_producer",
                    "Sluice-Producer-Mark: at most 4096 bytes",
                ));
            }
            Ok(Some((
                ProducerSeq {
                    id: producer_id(id)?.to_owned(),
                    epoch: epoch.unwrap_or(0),
                    seq,
                },
                mark.map(str::to_owned),
            )))
        }
        _ => Err(bad(
            "invalid_producer",
            "send both Sluice-Producer-Id and Sluice-Producer-Seq (with, optionally, \
             Sluice-Producer-Epoch and Sluice-Producer-Mark), or none of them",
        )),
    }
}

/// Appends input: JSON lines, or one JSON array of events. Returns once the
/// events are durable.
///
/// A producer sends `Sluice-Producer-Id` and `Sluice-Producer-Seq`
/// (`Sluice-Producer-Epoch` to start a new session) and gets Kafka's
/// idempotent-producer rules per (producer, port): sequence numbers start at
/// 1 and go up by one; a retry of the last acknowledged push gets the
/// original acknowledgement and appends nothing; an older number answers
/// 409 `duplicate_sequence`, a gap 409 `out_of_order_sequence`, an older
/// epoch 409 `producer_fenced`.
///
/// A push is admitted before its body is read — within the tenant's
/// `max_concurrent_pushes` and the server's `max_pushes` (429), and with
/// disk left in the tenant's quota (507) — and its body may hold at most
/// `max_push_bytes` (413 `body_too_large`) and `max_push_events` (413
/// `too_many_events`).
#[utoipa::path(post, path = "/pipelines/{name}/input/{port}",
    params(("name" = String, Path, description = "pipeline name"), ("port" = String, Path, description = "input port"),
        ("Sluice-Producer-Id" = Option<String>, Header,
            description = "the producer: 1-128 visible ASCII characters (with Sluice-Producer-Seq)"),
        ("Sluice-Producer-Seq" = Option<u64>, Header,
            description = "the push's sequence number for this producer and port, from 1 (with Sluice-Producer-Id)"),
        ("Sluice-Producer-Epoch" = Option<u64>, Header,
            description = "the producer's session, 0 by default: a higher one fences the older"),
        ("Sluice-Producer-Mark" = Option<String>, Header,
            description = "up to 4096 bytes of visible ASCII stored with the append, returned by GET /pipelines/{name}/input/{port}/producers/{id}")),
    request_body(content = String, content_type = "application/x-ndjson"),
    responses((status = 200, body = PushAck), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 408, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 507, body = ErrorBody)))]
pub(super) async fn push(
    State(state): Shared,
    headers: HeaderMap,
    Path((name, port)): Path<(String, String)>,
    body: Body,
) -> ApiResult<axum::Json<PushAck>> {
    let tenant = state.service.tenant(token(&state, &headers).as_deref())?;
    port_of(&state, &tenant, &name, false, &port)?;
    let producer = producer(&headers)?;
    let (_permit, limits) = state.service.admit_push(&tenant).await?;
    let bytes = read_body(
        &state,
        &headers,
        body,
        limits.max_push_bytes,
        "max_push_bytes",
    )
    .await?;
    // Counted in the tenant's host memory while the push holds it.
    let mut held = state.service.hold_push_bytes(&tenant, bytes.len() as u64);
    let text =
        std::str::from_utf8(&bytes).map_err(|_| bad("invalid_body", "the body is not UTF-8"))?;
    let max_events = usize::try_from(limits.max_push_events).unwrap_or(usize::MAX);
    let events = parse_events_bounded(text, max_events).map_err(|e| match e {
        BodyError::Json(_) => bad("invalid_json", e.to_string()),
        BodyError::Event(_) => bad("invalid_event", e.to_string()),
        BodyError::TooMany(_) => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_many_events",
            e.to_string(),
        ),
    })?;
    drop(bytes);
    held.set(
        events
            .iter()
            .map(|e| (e.value.capacity() + std::mem::size_of::<sluice_core::Event>()) as u64)
            .sum(),
    );
    let ack = state
        .service
        .push(&tenant, &name, &port, events, producer)
        .await?;
    drop(held);
    Ok(axum::Json(ack))
}

/// What the pipeline remembers of a producer on an input port: its session,
/// the last sequence number it acknowledged (0: none) and the producer's
/// mark stored with it, so a producer that restarts resumes after it.
#[utoipa::path(get, path = "/pipelines/{name}/input/{port}/producers/{id}",
    params(("name" = String, Path, description = "pipeline name"), ("port" = String, Path, description = "input port"),
           ("id" = String, Path, description = "producer id")),
    responses((status = 200, body = ProducerInfo), (status = 404, body = ErrorBody)))]
pub(super) async fn producer_state(
    State(state): Shared,
    headers: HeaderMap,
    Path((name, port, id)): Path<(String, String, String)>,
) -> ApiResult<axum::Json<ProducerInfo>> {
    let tenant = state.service.tenant(token(&state, &headers).as_deref())?;
    port_of(&state, &tenant, &name, false, &port)?;
    let id = producer_id(&id)?;
    Ok(axum::Json(
        state.service.producer(&tenant, &name, &port, id).await?,
    ))
}

fn position(s: &str) -> ApiResult<OutputPosition> {
    OutputPosition::parse(s).map_err(|m| bad("invalid_position", m))
}

/// Reads up to `limit` events of `port` after `after`, off the async workers.
async fn read_after(
    h: &PipelineHandle,
    port: &str,
    after: Option<OutputPosition>,
    limit: usize,
) -> ApiResult<Vec<PositionedEvent>> {
    let (log, port) = (h.log(), port.to_owned());
    tokio::task::spawn_blocking(move || read_output(&*log, &port, after, limit))
        .await
        .map_err(|e| ServiceError::Internal(e.to_string()))?
        .map_err(|e| ServiceError::Pipeline(e.into()).into())
}

/// `GET …/output/{port}` parameters.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OutputQuery {
    /// Return events after this position (`STEP:WORKER:INDEX`).
    after: Option<String>,
    /// At most this many events (default 10 000).
    limit: Option<usize>,
    /// Wait up to this many milliseconds for output when there is none yet.
    wait_ms: Option<u64>,
}

/// Reads output after a position as NDJSON, each line
/// `{"position": "S:W:I", "insert"|"delete": value, "weight"?: n}`; long-polls
/// with `wait_ms` when nothing is there yet.
#[utoipa::path(get, path = "/pipelines/{name}/output/{port}",
    params(("name" = String, Path, description = "pipeline name"), ("port" = String, Path, description = "output port"),
           ("after" = Option<String>, Query, description = "STEP:WORKER:INDEX"),
           ("limit" = Option<usize>, Query, description = "max events"),
           ("wait_ms" = Option<u64>, Query, description = "long-poll wait")),
    responses((status = 200, content_type = "application/x-ndjson", body = String), (status = 404, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub(super) async fn read(
    State(state): Shared,
    headers: HeaderMap,
    Path((name, port)): Path<(String, String)>,
    query: Result<Query<OutputQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let tenant = state.service.tenant(token(&state, &headers).as_deref())?;
    let h = port_of(&state, &tenant, &name, true, &port)?;
    let Query(q) = query.map_err(|e| bad("invalid_query", e.body_text()))?;
    let after = q.after.as_deref().map(position).transpose()?;
    let limit = q.limit.unwrap_or(10_000).clamp(1, 100_000);
    let wait = Duration::from_millis(q.wait_ms.unwrap_or(0).min(60_000));
    // A long-poll holds a stream permit while it waits (429 past the
    // tenant's or the server's bound).
    let _permit = if wait.is_zero() {
        None
    } else {
        Some(state.service.admit_stream(&tenant)?)
    };
    let deadline = tokio::time::Instant::now() + wait;
    let mut committed = h.committed();
    let events = loop {
        committed.borrow_and_update();
        let events = read_after(&h, &port, after, limit).await?;
        if !events.is_empty() || tokio::time::Instant::now() >= deadline {
            break events;
        }
        // A timeout ends the wait; the next read then returns what there is.
        // So does the pipeline's task ending (unloaded: stopped, deleted or
        // being upgraded), which no commit will follow.
        if let Ok(Err(_)) = tokio::time::timeout_at(deadline, committed.changed()).await {
            break read_after(&h, &port, after, limit).await?;
        }
    };
    let mut out = Vec::new();
    let mut line = Vec::new();
    for e in events {
        line.clear();
        write_output_line(&mut line, &e.event);
        // `{"insert":…}` → `{"position":"S:W:I","insert":…}`
        out.extend_from_slice(format!("{{\"position\":\"{}\",", e.position).as_bytes());
        out.extend_from_slice(&line[1..]);
    }
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        )],
        out,
    )
        .into_response())
}

/// `GET …/output/{port}/stream` parameters.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StreamQuery {
    /// Start after this position (`STEP:WORKER:INDEX`); a reconnecting
    /// client's `Last-Event-ID` header does the same.
    after: Option<String>,
}

/// What the output stream carries between reads.
struct StreamState {
    handle: Arc<PipelineHandle>,
    port: String,
    after: Option<OutputPosition>,
    committed: tokio::sync::watch::Receiver<u64>,
    ready: std::collections::VecDeque<SseEvent>,
    /// Held while the stream is open.
    _permit: Permit,
}

/// Streams output as server-sent events, from a position on and then as
/// steps commit: each event's `id` is its position (`STEP:WORKER:INDEX`, so
/// a reconnecting client resumes with `Last-Event-ID`) and its `data` the
/// line `{"insert"|"delete": value, "weight"?: n}`. A stream counts
/// against the tenant's `max_streams` and the server's (429 past either).
#[utoipa::path(get, path = "/pipelines/{name}/output/{port}/stream",
    params(("name" = String, Path, description = "pipeline name"), ("port" = String, Path, description = "output port"),
           ("after" = Option<String>, Query, description = "STEP:WORKER:INDEX")),
    responses((status = 200, content_type = "text/event-stream", body = String), (status = 404, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub(super) async fn stream(
    State(state): Shared,
    headers: HeaderMap,
    Path((name, port)): Path<(String, String)>,
    query: Result<Query<StreamQuery>, QueryRejection>,
) -> ApiResult<Sse<impl futures_util::Stream<Item = Result<SseEvent, std::convert::Infallible>>>> {
    let tenant = state.service.tenant(token(&state, &headers).as_deref())?;
    let h = port_of(&state, &tenant, &name, true, &port)?;
    let Query(q) = query.map_err(|e| bad("invalid_query", e.body_text()))?;
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let after = q.after.or(resume).as_deref().map(position).transpose()?;
    let permit = state.service.admit_stream(&tenant)?;
    let init = StreamState {
        _permit: permit,
        committed: h.committed(),
        handle: h,
        port,
        after,
        ready: Default::default(),
    };
    let stream = futures_util::stream::unfold(init, |mut st| async move {
        loop {
            if let Some(event) = st.ready.pop_front() {
                return Some((Ok(event), st));
            }
            st.committed.borrow_and_update();
            // The pipeline is gone or its storage failed: end the stream;
            // the client reconnects with `Last-Event-ID`.
            let events = read_after(&st.handle, &st.port, st.after, 1_000)
                .await
                .ok()?;
            if events.is_empty() {
                st.committed.changed().await.ok()?;
                continue;
            }
            let mut line = Vec::new();
            for e in events {
                line.clear();
                write_output_line(&mut line, &e.event);
                st.after = Some(e.position);
                let data = String::from_utf8_lossy(line.trim_ascii_end()).into_owned();
                st.ready
                    .push_back(SseEvent::default().id(e.position.to_string()).data(data));
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
