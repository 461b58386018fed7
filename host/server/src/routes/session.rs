//! Signed-in browsers of the console: [`Sessions`] (id → token, expiry,
//! held in the server's memory only) and the session a request's cookie
//! names.

use axum::http::{HeaderMap, header};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "sluice_session";
/// How long a session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at most (the oldest go first).
pub const MAX_SESSIONS: usize = 10_000;

/// Signed-in browsers: session id → (token, expiry).
#[derive(Default)]
pub struct Sessions(Mutex<HashMap<String, (String, Instant)>>);

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, Instant)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new session for `token`; its id.
    pub(super) fn create(&self, token: &str) -> Option<String> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).ok()?;
        let id = hex::encode(bytes);
        let mut map = self.lock();
        let now = Instant::now();
        map.retain(|_, (_, expires)| *expires > now);
        while map.len() >= MAX_SESSIONS {
            let oldest = map
                .iter()
                .min_by_key(|(_, (_, e))| *e)
                .map(|(k, _)| k.clone())?;
            map.remove(&oldest);
        }
        map.insert(id.clone(), (token.to_owned(), now + SESSION_TTL));
        Some(id)
    }

    /// The token of a live session.
    pub(super) fn token(&self, id: &str) -> Option<String> {
        let map = self.lock();
        let (token, expires) = map.get(id)?;
        (*expires > Instant::now()).then(|| token.clone())
    }

    pub(super) fn remove(&self, id: &str) {
        self.lock().remove(id);
    }
}

/// The token of the session a request's cookie names, if it is live.
pub(super) fn session_token(sessions: &Sessions, headers: &HeaderMap) -> Option<String> {
    session_id(headers).and_then(|id| sessions.token(id))
}

/// The session id a request's cookie names.
pub(super) fn session_id(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(SESSION_COOKIE)?.strip_prefix('='))
}
