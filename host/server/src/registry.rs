//! The server's registry: tenants (with hashed tokens and limits) and each
//! tenant's pipelines (their specs and whether they should be running),
//! persisted as one JSON file replaced atomically on every change.

use crate::error::ServiceError;
use crate::types::{Desired, PipelineSpec, TenantLimits};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One pipeline's entry in the registry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PipelineEntry {
    /// As created.
    pub spec: PipelineSpec,
    /// What the tenant last asked for.
    pub desired: Desired,
    /// An upgrade under way: the component (name, SHA-256) the pipeline
    /// is being moved to. Its data directory says whether it was made
    /// (the server died before the spec followed): recovery settles it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrading_to: Option<(String, String)>,
}

/// One tenant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tenant {
    /// SHA-256 of the tenant's API token, hex (the token itself is never
    /// stored).
    pub token_sha256: String,
    /// What the tenant may use.
    pub limits: TenantLimits,
    /// The tenant's pipelines, by name.
    pub pipelines: BTreeMap<String, PipelineEntry>,
}

/// Everything the server must remember across restarts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Registry {
    /// Tenants by name.
    pub tenants: BTreeMap<String, Tenant>,
    /// Bumped by every change (not stored): the newest version is the one
    /// to write.
    #[serde(skip)]
    pub version: u64,
    /// Pipelines being created, by (tenant, name): the memory (bytes) and
    /// instances they will hold, counted by quotas until they are in
    /// `tenants`; and stopped pipelines being upgraded, whose trial holds
    /// instances meanwhile (not stored).
    #[serde(skip)]
    pub creating: BTreeMap<(String, String), (u64, u64)>,
}

/// The SHA-256 of a token, hex.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A fresh API token: 32 random bytes, hex.
pub fn new_token() -> Result<String, ServiceError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| ServiceError::Internal(format!("no randomness for a token: {e}")))?;
    Ok(format!("sl_{}", hex::encode(bytes)))
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Registry {
    /// The registry file in `dir`.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join("registry.json")
    }

    /// Reads the registry (empty if the file does not exist yet).
    pub fn load(dir: &Path) -> Result<Registry, ServiceError> {
        let path = Self::path(dir);
        let internal = |e: &dyn std::fmt::Display| {
            ServiceError::Internal(format!("reading {}: {e}", path.display()))
        };
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| internal(&e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Registry::default()),
            Err(e) => Err(internal(&e)),
        }
    }

    /// The registry as the bytes [`write`](Self::write) stores.
    pub fn to_bytes(&self) -> Result<Vec<u8>, ServiceError> {
        serde_json::to_vec_pretty(self)
            .map_err(|e| ServiceError::Internal(format!("encoding the registry: {e}")))
    }

    /// Writes registry bytes durably into `dir`: a temporary file, fsynced,
    /// renamed over the old one.
    pub fn write(dir: &Path, bytes: &[u8]) -> Result<(), ServiceError> {
        let write = || -> std::io::Result<()> {
            let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
            std::io::Write::write_all(tmp.as_file_mut(), bytes)?;
            tmp.as_file().sync_all()?;
            tmp.persist(Self::path(dir)).map_err(|e| e.error)?;
            std::fs::File::open(dir)?.sync_all()
        };
        write().map_err(|e| ServiceError::Internal(format!("saving the registry: {e}")))
    }

    /// The tenant whose token this is.
    pub fn tenant_by_token(&self, token: &str) -> Option<&str> {
        let hash = token_hash(token);
        self.tenants
            .iter()
            .find(|(_, t)| constant_time_eq(t.token_sha256.as_bytes(), hash.as_bytes()))
            .map(|(name, _)| name.as_str())
    }

    /// A tenant, or 404.
    pub fn tenant(&self, name: &str) -> Result<&Tenant, ServiceError> {
        self.tenants
            .get(name)
            .ok_or_else(|| ServiceError::not_found("tenant", name))
    }

    /// A tenant, mutably, or 404.
    pub fn tenant_mut(&mut self, name: &str) -> Result<&mut Tenant, ServiceError> {
        self.tenants
            .get_mut(name)
            .ok_or_else(|| ServiceError::not_found("tenant", name))
    }

    /// Every (tenant, pipeline entry), to recover on start.
    pub fn all_pipelines(&self) -> Vec<(String, PipelineEntry)> {
        self.tenants
            .iter()
            .flat_map(|(t, tenant)| {
                tenant
                    .pipelines
                    .values()
                    .map(move |p| (t.clone(), p.clone()))
            })
            .collect()
    }
}
