//! The components a worker host runs: the one it started with, and those
//! a coordinator's `Start` names after an upgrade, fetched through its
//! [`ComponentSource`](super::ComponentSource) (the pipeline's shared store) when it has one.

use super::server::WorkerHost;
use crate::engine::LoadedComponent;
use crate::error::{Error, Result};

/// How many components a host keeps loaded: the one running and the ones
/// before it (instances kept across an upgrade may still run those).
const KEPT: usize = 3;

impl WorkerHost {
    /// Runs `component` from now on too: a coordinator's `Start` that names
    /// it is served (the host that upgraded, or followed an upgrade, adds
    /// the new version). The newest few are kept.
    pub fn add_component(&self, component: LoadedComponent) {
        let mut loaded = self.loaded();
        loaded.retain(|c| c.hash != component.hash);
        loaded.push(component);
        let excess = loaded.len().saturating_sub(KEPT);
        loaded.drain(..excess);
    }

    /// The component a coordinator's `Start` names: one this host runs,
    /// else fetched from its source (one fetch at a time: the workers of
    /// one session ask together), and recorded as the one started last
    /// ([`take_started`](Self::take_started)). Refused
    /// ([`Error::ComponentDiffers`]) if neither has it, or the fetch fails
    /// (logged here).
    pub(super) async fn component_for(&self, hash: &str) -> Result<LoadedComponent> {
        let found = self.find_or_fetch(hash).await?;
        *self.started.lock().unwrap_or_else(|p| p.into_inner()) = Some(hash.to_owned());
        Ok(found)
    }

    /// [`component_for`](Self::component_for), without recording it.
    async fn find_or_fetch(&self, hash: &str) -> Result<LoadedComponent> {
        if let Some(c) = self.find_component(hash) {
            return Ok(c);
        }
        let differs = || Error::ComponentDiffers {
            here: self.newest_component(),
            coordinator: hash.to_owned(),
        };
        let Some(source) = &self.source else {
            return Err(differs());
        };
        let _one = self.fetching.lock().await;
        if let Some(c) = self.find_component(hash) {
            return Ok(c);
        }
        let fetched = match source.fetch(hash).await {
            Ok(Some(c)) if c.hash == hash => c,
            Ok(Some(c)) => {
                tracing::warn!(wanted = %hash, got = %c.hash, "the component source returned another component");
                return Err(differs());
            }
            Ok(None) => return Err(differs()),
            // Refused like a component the source lacks: the leader leaves
            // this host out a while, then asks again.
            Err(e) => {
                tracing::warn!(component = %hash, error = %e, "fetching a component failed");
                return Err(differs());
            }
        };
        tracing::info!(component = %hash, "fetched the pipeline's new component");
        self.add_component(fetched.clone());
        Ok(fetched)
    }

    /// The loaded component of `hash`, if any.
    fn find_component(&self, hash: &str) -> Option<LoadedComponent> {
        self.loaded().iter().find(|c| c.hash == hash).cloned()
    }

    /// The component (SHA-256, hex) a coordinator's `Start` named last,
    /// since the last call: after an upgrade elsewhere, the pipeline's new
    /// version (a coordinator starts only the component the pipeline's
    /// log records). `None` if no worker was started since.
    pub fn take_started(&self) -> Option<String> {
        self.started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// The hash of the component added last.
    fn newest_component(&self) -> String {
        self.loaded()
            .last()
            .map(|c| c.hash.clone())
            .unwrap_or_default()
    }

    fn loaded(&self) -> std::sync::MutexGuard<'_, Vec<LoadedComponent>> {
        self.components.lock().unwrap_or_else(|p| p.into_inner())
    }
}
