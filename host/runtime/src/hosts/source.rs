//! Where a worker host fetches a component it does not run yet
//! ([`ComponentSource`]).

use crate::engine::LoadedComponent;
use crate::error::Result;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What a [`ComponentSource`] fetch returns: the component of that hash,
/// loaded, or `None` if the source does not have it.
pub type Fetched = Pin<Box<dyn Future<Output = Result<Option<LoadedComponent>>> + Send>>;

/// Where a worker host fetches a component it does not run yet, by its
/// SHA-256 (hex) — after an upgrade, the new version, published where
/// every host of the pipeline reaches it. The fetch must return a
/// component of that hash (the host checks it).
#[derive(Clone)]
pub struct ComponentSource(Arc<dyn Fn(String) -> Fetched + Send + Sync>);

impl ComponentSource {
    /// A source that fetches with `fetch`.
    pub fn new(fetch: impl Fn(String) -> Fetched + Send + Sync + 'static) -> Self {
        ComponentSource(Arc::new(fetch))
    }

    /// Fetches component `hash`.
    pub(super) fn fetch(&self, hash: &str) -> Fetched {
        (self.0)(hash.to_owned())
    }
}

impl std::fmt::Debug for ComponentSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ComponentSource")
    }
}
