//! A tenant's components: uploads checked cheaply first, compiled on a
//! bounded pool with a time limit, probed under small fixed limits; names
//! and versions kept apart on disk.
//!
//! On disk, under the tenant's directory: `components/<name>.wasm` for each
//! name, and `components/versions/<sha256>.wasm` for each version a
//! pipeline runs (written when the pipeline is created, deleted when no
//! pipeline runs it any more). No name can reach a version's file.

use super::state::{Service, lock, tenant_dir};
use crate::error::{Result, ServiceError};
use crate::limits::PROBE_LIMITS;
use crate::types::ComponentInfo;
use sha2::Digest;
use sluice_core::{CircuitPorts, validate_name};
use sluice_runtime::LoadedComponent;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

/// A component name's file.
fn name_file(tenant: &str, name: &str) -> String {
    format!("{}/components/{name}.wasm", tenant_dir(tenant))
}

/// The directory of a tenant's component versions.
fn versions_dir(tenant: &str) -> String {
    format!("{}/components/versions", tenant_dir(tenant))
}

/// A component version's file.
fn version_file(tenant: &str, hash: &str) -> String {
    format!("{}/{hash}.wasm", versions_dir(tenant))
}

/// Whether `s` is a SHA-256 in hex.
fn is_hash(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Writes `bytes` to `path` under `root` whole: to a file of its own, then
/// renamed over `path`, so that a reader (a create running beside an
/// upload or another create) sees the old bytes or the new, never a file
/// still being written — seen under 30 parallel creates as "bad header".
fn write_whole(root: &cap_std::fs::Dir, path: &str, bytes: &[u8]) -> std::io::Result<()> {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = format!("{path}.{}-{n}.tmp", std::process::id());
    root.write(&tmp, bytes)?;
    root.rename(&tmp, root, path).inspect_err(|_| {
        let _ = root.remove_file(&tmp);
    })
}

/// SHA-256 of `bytes`, hex.
pub(crate) fn sha256(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

impl Service {
    /// Validates, precompiles and stores a component under `name`
    /// (replacing the name; pipelines keep the version they were created
    /// with).
    pub async fn put_component(
        &self,
        tenant: &str,
        name: &str,
        bytes: Vec<u8>,
    ) -> Result<ComponentInfo> {
        validate_name("component", name)?;
        let max = self.limits(tenant)?.max_component_bytes;
        if bytes.len() as u64 > max {
            return Err(ServiceError::TooLarge {
                limit: "max_component_bytes",
                value: max,
                attempted: bytes.len() as u64,
            });
        }
        self.check_disk(tenant, bytes.len() as u64).await?;
        let bytes: Arc<[u8]> = bytes.into();
        let (component, ports) = self.load_component(tenant, name, bytes.clone()).await?;
        write_whole(&self.root, &name_file(tenant, name), &bytes)
            .map_err(|e| ServiceError::Internal(format!("storing the component: {e}")))?;
        lock(&self.disk).remove(tenant);
        Ok(ComponentInfo {
            name: name.to_owned(),
            hash: component.hash,
            size: bytes.len() as u64,
            inputs: ports.inputs,
            outputs: ports.outputs,
        })
    }

    /// The tenant's components (names, hashes, sizes).
    pub fn list_components(&self, tenant: &str) -> Result<Vec<ComponentInfo>> {
        let internal = |e: std::io::Error| ServiceError::Internal(e.to_string());
        let dir = self
            .root
            .open_dir(format!("{}/components", tenant_dir(tenant)))
            .map_err(internal)?;
        let mut out = Vec::new();
        for entry in dir.entries().map_err(internal)? {
            let entry = entry.map_err(internal)?;
            if entry.file_type().map_err(internal)?.is_dir() {
                continue;
            }
            let file = entry.file_name();
            let Some(name) = file.to_str().and_then(|f| f.strip_suffix(".wasm")) else {
                continue;
            };
            let bytes = dir.read(&file).map_err(internal)?;
            let hash = sha256(&bytes);
            // A copy an older server kept of a version under its hash.
            if is_hash(name) && hash == name {
                continue;
            }
            out.push(ComponentInfo {
                name: name.to_owned(),
                hash,
                size: bytes.len() as u64,
                inputs: Vec::new(),
                outputs: Vec::new(),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Deletes a component name (pipelines created from it keep running).
    pub fn delete_component(&self, tenant: &str, name: &str) -> Result<()> {
        validate_name("component", name).map_err(|_| ServiceError::not_found("component", name))?;
        self.root
            .remove_file(name_file(tenant, name))
            .map_err(|_| ServiceError::not_found("component", name))?;
        lock(&self.disk).remove(tenant);
        Ok(())
    }

    /// Compares pipeline `pipeline`'s circuit with the component `bytes`
    /// — checked, compiled and probed as an upload is, but not stored —
    /// operator by operator and port by port: what an upgrade to it would
    /// carry over, start empty, drop or refuse. The changed operators in
    /// `start_empty` start empty instead of refusing it.
    pub async fn diff_pipeline(
        &self,
        tenant: &str,
        pipeline: &str,
        bytes: Vec<u8>,
        start_empty: &[String],
    ) -> Result<sluice_core::CircuitDiff> {
        let old = self.pipeline(tenant, pipeline)?.ports().clone();
        let (_, new) = self.load_component(tenant, pipeline, bytes.into()).await?;
        sluice_core::CircuitDiff::between(&old, &new, start_empty).map_err(|message| {
            ServiceError::Invalid {
                code: "invalid_start_empty",
                message,
            }
        })
    }

    /// The bytes of a component name.
    pub(crate) fn component_bytes(&self, tenant: &str, name: &str) -> Result<Vec<u8>> {
        self.root
            .read(name_file(tenant, name))
            .map_err(|_| ServiceError::not_found("component", name))
    }

    /// The bytes of a component version (also where an older server kept
    /// it, beside the names, if the bytes are that version).
    pub(crate) fn version_bytes(&self, tenant: &str, hash: &str) -> Result<Vec<u8>> {
        let missing = || ServiceError::not_found("component version", hash);
        if !is_hash(hash) {
            return Err(missing());
        }
        if let Ok(bytes) = self.root.read(version_file(tenant, hash)) {
            return Ok(bytes);
        }
        match self.root.read(name_file(tenant, hash)) {
            Ok(bytes) if sha256(&bytes) == hash => Ok(bytes),
            _ => Err(missing()),
        }
    }

    /// Keeps version `hash` of a component for a pipeline that runs it.
    pub(crate) fn keep_version(&self, tenant: &str, hash: &str, bytes: &[u8]) -> Result<()> {
        let internal = |e: std::io::Error| {
            ServiceError::Internal(format!("storing the component version: {e}"))
        };
        self.root
            .create_dir_all(versions_dir(tenant))
            .map_err(internal)?;
        if !self.root.exists(version_file(tenant, hash)) {
            write_whole(&self.root, &version_file(tenant, hash), bytes).map_err(internal)?;
        }
        Ok(())
    }

    /// Deletes the tenant's component versions no pipeline runs.
    pub(crate) fn collect_versions(&self, tenant: &str) {
        let used: BTreeSet<String> = match lock(&self.registry).tenants.get(tenant) {
            // A version an upgrade under way moves to is in use too.
            Some(t) => t
                .pipelines
                .values()
                .flat_map(|p| {
                    let to = p.upgrading_to.as_ref().map(|(_, hash)| hash.clone());
                    std::iter::once(p.spec.component_hash.clone()).chain(to)
                })
                .collect(),
            None => return,
        };
        let Ok(dir) = self.root.open_dir(versions_dir(tenant)) else {
            return;
        };
        let Ok(entries) = dir.entries() else { return };
        for entry in entries.flatten() {
            let file = entry.file_name();
            let Some(hash) = file.to_str().and_then(|f| f.strip_suffix(".wasm")) else {
                continue;
            };
            if !used.contains(hash) {
                match dir.remove_file(&file) {
                    Ok(()) => tracing::info!(
                        tenant,
                        version = hash,
                        "deleted an unused component version"
                    ),
                    Err(e) => tracing::warn!(
                        tenant,
                        version = hash,
                        "could not delete an unused component version: {e}"
                    ),
                }
            }
        }
        lock(&self.disk).remove(tenant);
    }

    /// Deletes unused component versions of every tenant, and compiled
    /// components in the cache that no name or version uses and that were
    /// not used for a day.
    pub(crate) fn collect_garbage(&self) {
        let mut keep = BTreeSet::new();
        for tenant in self.tenants() {
            self.collect_versions(&tenant);
            if let Ok(list) = self.list_components(&tenant) {
                keep.extend(list.into_iter().map(|c| c.hash));
            }
            if let Some(t) = lock(&self.registry).tenants.get(&tenant) {
                keep.extend(t.pipelines.values().map(|p| p.spec.component_hash.clone()));
            }
        }
        match self
            .engine
            .prune_cache(&keep, std::time::Duration::from_secs(24 * 3600))
        {
            Ok((0, _)) => {}
            Ok((files, bytes)) => {
                tracing::info!(files, bytes, "pruned the compiled-component cache")
            }
            Err(e) => tracing::warn!("could not prune the compiled-component cache: {e}"),
        }
    }

    /// Loads a tenant's component: the cheap structural checks first (a
    /// component that cannot be a circuit is refused before it is
    /// compiled), then the compile on the blocking pool — one of the
    /// tenant's at a time, at most the server's `max_compiles` at once,
    /// within its `compile_timeout` — then its ports from a probe under
    /// [`PROBE_LIMITS`].
    pub(crate) async fn load_component(
        &self,
        tenant: &str,
        name: &str,
        bytes: Arc<[u8]>,
    ) -> Result<(LoadedComponent, CircuitPorts)> {
        let origin = PathBuf::from(format!("{name}.wasm"));
        let invalid = |e: &dyn std::fmt::Display| {
            ServiceError::InvalidComponent(sluice_core::text::guest_message(&e.to_string()))
        };
        self.engine
            .precheck(&origin, &bytes)
            .map_err(|e| invalid(&e))?;
        let permit = self.gates.compiles.enter(tenant, 1).await;
        let engine = self.engine.clone();
        let job = tokio::task::spawn_blocking(move || {
            // The permit is held until the compile ends, even if the
            // request stopped waiting for it.
            let _permit = permit;
            engine.load(&origin, &bytes)
        });
        let timeout = self.limits.compile_timeout;
        let component = match tokio::time::timeout(timeout, job).await {
            Err(_) => {
                return Err(ServiceError::InvalidComponent(format!(
                    "compiling it took longer than the server's compile timeout of {} ms",
                    timeout.as_millis()
                )));
            }
            Ok(Err(e)) => return Err(ServiceError::Internal(format!("compiling: {e}"))),
            Ok(Ok(loaded)) => loaded.map_err(|e| invalid(&e))?,
        };
        let ports = self
            .engine
            .with_limits(PROBE_LIMITS)
            .describe(&component)
            .await
            .map_err(|e| invalid(&e))?;
        ports.validate().map_err(|e| invalid(&e))?;
        Ok((component, ports))
    }
}
