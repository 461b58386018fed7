//! Observability: Prometheus metrics, the status page and its sign-in (the
//! OpenAPI document is served by the `openapi` module).
//!
//! The page never takes a token in its URL. A browser signs in through a
//! form (`POST /login`) and gets a session cookie (`HttpOnly`,
//! `SameSite=Strict`); the session holds the token in the server's memory
//! only, so rotating or deleting a tenant ends its sessions at once. The
//! API itself takes only the `Authorization` header, never the cookie.

use super::error::{ApiError, ApiResult};
use super::request::{AppState, Shared, bearer, read_body, token};
use super::session::{SESSION_COOKIE, SESSION_TTL, session_id};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};

/// Prometheus metrics (admin only).
#[utoipa::path(get, path = "/metrics", responses((status = 200, content_type = "text/plain", body = String)))]
pub(super) async fn metrics(State(state): Shared, headers: HeaderMap) -> ApiResult<Response> {
    state.service.admin(token(&state, &headers).as_deref())?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        state.metrics.render(),
    )
        .into_response())
}

/// What the console may load, where it may connect and post forms.
const PAGE_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     connect-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; \
     base-uri 'none'";

/// The console's scripts and stylesheets (compiled in).
pub(super) async fn asset(axum::extract::Path(file): axum::extract::Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "console.js" => (crate::page::CONSOLE_JS, "text/javascript; charset=utf-8"),
        "console.css" => (crate::page::CONSOLE_CSS, "text/css; charset=utf-8"),
        "uplot.js" => (crate::page::UPLOT_JS, "text/javascript; charset=utf-8"),
        "uplot.css" => (crate::page::UPLOT_CSS, "text/css; charset=utf-8"),
        _ => {
            return ApiError::from(crate::error::ServiceError::not_found("asset", &file))
                .into_response();
        }
    };
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(kind))],
        body,
    )
        .into_response()
}

fn page_response(status: StatusCode, html: String) -> Response {
    (
        status,
        [(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(PAGE_POLICY),
        )],
        Html(html),
    )
        .into_response()
}

/// The status page: the caller's pipelines with live figures, for a
/// signed-in browser (or a client sending `Authorization`); else the
/// sign-in form.
pub(super) async fn page(State(state): Shared, headers: HeaderMap) -> Response {
    use crate::service::Caller;
    let token = match bearer(&headers) {
        Some(t) => Some(t.to_owned()),
        None => session_id(&headers).and_then(|id| state.sessions.token(id)),
    };
    let html = match state.service.caller(token.as_deref()) {
        Ok(Caller::Tenant(t)) => crate::page::render(&t, &state.service.statuses(&t)),
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
            crate::page::render_all(&all)
        }
        Err(_) => crate::page::login(None),
    };
    page_response(StatusCode::OK, html)
}

/// The sign-in form's target: `token=…` (form-encoded). A valid token gets
/// a session cookie and a redirect to the page.
pub(super) async fn login(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    match sign_in(&state, &headers, body).await {
        Ok(id) => (
            StatusCode::SEE_OTHER,
            [
                (header::LOCATION, "/".to_owned()),
                (
                    header::SET_COOKIE,
                    format!(
                        "{SESSION_COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
                        SESSION_TTL.as_secs()
                    ),
                ),
            ],
        )
            .into_response(),
        Err(message) => page_response(StatusCode::UNAUTHORIZED, crate::page::login(Some(&message))),
    }
}

async fn sign_in(state: &AppState, headers: &HeaderMap, body: Body) -> Result<String, String> {
    #[derive(serde::Deserialize)]
    struct Form {
        token: String,
    }
    let bytes = read_body(state, headers, body, 4096, "sign-in form")
        .await
        .map_err(|e| e.message)?;
    let form: Form = serde_urlencoded::from_bytes(&bytes)
        .map_err(|_| "send the form's token field".to_owned())?;
    let token = form.token.trim();
    state
        .service
        .caller(Some(token))
        .map_err(|_| "unknown token".to_owned())?;
    state
        .sessions
        .create(token)
        .ok_or_else(|| "no randomness for a session".to_owned())
}

/// Ends the browser's session.
pub(super) async fn logout(State(state): Shared, headers: HeaderMap) -> Response {
    if let Some(id) = session_id(&headers) {
        state.sessions.remove(id);
    }
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, "/".to_owned()),
            (
                header::SET_COOKIE,
                format!("{SESSION_COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
            ),
        ],
    )
        .into_response()
}
