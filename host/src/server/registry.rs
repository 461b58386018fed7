//! The server's registry: tenants (with hashed tokens and limits) and each
//! tenant's pipelines (their specs and whether they should be running),
//! persisted as one JSON file replaced atomically on every change.

use super::ApiError;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What a tenant may use; enforced by the host. Pipelines ask for their own
/// limits within these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TenantLimits {
    /// Maximum linear memory of one instance, in MiB.
    pub memory_mib: u64,
    /// Fuel per call into the guest (deterministic CPU bound per step).
    pub fuel_per_step: u64,
    /// Wall-clock deadline of one call into the guest, in milliseconds.
    pub deadline_ms: u64,
    /// Pipelines the tenant may have.
    pub max_pipelines: u32,
    /// Workers one pipeline may have.
    pub max_workers: u32,
    /// Size of one uploaded component, in bytes.
    pub max_component_bytes: u64,
    /// Output events one worker may emit in one step.
    pub max_output_per_step: u64,
}

impl Default for TenantLimits {
    fn default() -> Self {
        TenantLimits {
            memory_mib: 256,
            fuel_per_step: 10_000_000_000,
            deadline_ms: 30_000,
            max_pipelines: 16,
            max_workers: 8,
            max_component_bytes: 32 << 20,
            max_output_per_step: 1_000_000,
        }
    }
}

/// A pipeline as its tenant created it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// The pipeline's name (unique per tenant).
    pub name: String,
    /// The component it runs (a name the tenant uploaded).
    pub component: String,
    /// The component's SHA-256 when the pipeline was created: the pipeline
    /// keeps running that version even if the name is uploaded again.
    #[serde(default)]
    pub component_hash: String,
    /// Number of workers W.
    #[serde(default = "one")]
    pub workers: u32,
    /// At most this many events per input partition per step.
    #[serde(default = "max_batch")]
    pub max_batch: u64,
    /// Checkpoint after this many steps…
    #[serde(default = "checkpoint_every")]
    pub checkpoint_every_steps: u64,
    /// …or this many milliseconds, whichever comes first.
    #[serde(default = "checkpoint_interval")]
    pub checkpoint_interval_ms: u64,
    /// Limits for this pipeline; each at most the tenant's (omitted: the
    /// tenant's).
    #[serde(default)]
    pub limits: Option<PipelineLimits>,
    /// Where its logs live: `embedded` (default) or `kafka` (on the
    /// server's brokers, topics `<tenant>.<pipeline>.<port>`).
    #[serde(default)]
    pub log: LogKind,
}

/// Where a server pipeline's logs live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogKind {
    /// The pipeline's RocksDB on the server.
    #[default]
    Embedded,
    /// Kafka topics on the brokers the server was started with.
    Kafka,
}

fn one() -> u32 {
    1
}
fn max_batch() -> u64 {
    10_000
}
fn checkpoint_every() -> u64 {
    100
}
fn checkpoint_interval() -> u64 {
    10_000
}

/// A pipeline's own limits, each optional (the tenant's when omitted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineLimits {
    /// Maximum linear memory of one instance, in MiB.
    pub memory_mib: Option<u64>,
    /// Fuel per call into the guest.
    pub fuel_per_step: Option<u64>,
    /// Wall-clock deadline of one call, in milliseconds.
    pub deadline_ms: Option<u64>,
    /// Output events one worker may emit in one step.
    pub max_output_per_step: Option<u64>,
}

/// The limits a pipeline runs with: its own, checked against its tenant's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectiveLimits {
    /// Memory per instance, bytes.
    pub memory: u64,
    /// Fuel per call.
    pub fuel: u64,
    /// Deadline per call, ms.
    pub deadline_ms: u64,
    /// Output events per worker per step.
    pub max_output: u64,
}

impl PipelineSpec {
    /// The limits this pipeline runs with, or which of them exceeds the
    /// tenant's.
    pub fn effective_limits(&self, tenant: &TenantLimits) -> Result<EffectiveLimits, ApiError> {
        let own = self.limits.unwrap_or_default();
        let pick = |name: &str, asked: Option<u64>, max: u64| match asked {
            Some(0) => Err(ApiError::bad_request(
                "invalid_limit",
                format!("limit `{name}` must be above 0"),
            )),
            Some(v) if v > max => Err(ApiError::limit(name, max, v)),
            Some(v) => Ok(v),
            None => Ok(max),
        };
        Ok(EffectiveLimits {
            memory: pick("memory_mib", own.memory_mib, tenant.memory_mib)? << 20,
            fuel: pick("fuel_per_step", own.fuel_per_step, tenant.fuel_per_step)?,
            deadline_ms: pick("deadline_ms", own.deadline_ms, tenant.deadline_ms)?,
            max_output: pick(
                "max_output_per_step",
                own.max_output_per_step,
                tenant.max_output_per_step,
            )?,
        })
    }
}

/// Whether a pipeline should be running after a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Desired {
    /// Running steps.
    Running,
    /// Instances kept, no steps.
    Paused,
    /// Checkpointed and unloaded.
    Stopped,
}

/// One pipeline's entry in the registry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PipelineEntry {
    /// As created.
    pub spec: PipelineSpec,
    /// What the tenant last asked for.
    pub desired: Desired,
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
}

/// The SHA-256 of a token, hex.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A fresh API token: 32 random bytes, hex.
pub fn new_token() -> Result<String, ApiError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| ApiError::internal(format!("no randomness for a token: {e}")))?;
    Ok(format!("sl_{}", hex::encode(bytes)))
}

/// Validates a tenant, component or pipeline name from a request: 1–64
/// characters of `[a-z0-9_-]`, starting with a letter or digit. Names
/// become directory and file names, so nothing else is accepted.
pub fn validate(kind: &str, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        let shown: String = name.chars().take(80).collect();
        Err(ApiError::bad_request(
            "invalid_name",
            format!(
                "invalid {kind} name {shown:?}: use 1-64 characters of a-z 0-9 _ - (starting with a letter or digit)"
            ),
        ))
    }
}

impl Registry {
    /// The registry file in `dir`.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join("registry.json")
    }

    /// Reads the registry (empty if the file does not exist yet).
    pub fn load(dir: &Path) -> anyhow::Result<Registry> {
        let path = Self::path(dir);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(serde_json::from_slice(&bytes)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Registry::default()),
            Err(e) => Err(anyhow::anyhow!("{}: {e}", path.display())),
        }
    }

    /// Writes the registry durably: a temporary file, fsynced, renamed over
    /// the old one.
    pub fn save(&self, dir: &Path) -> Result<(), ApiError> {
        let write = || -> std::io::Result<()> {
            let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
            serde_json::to_writer_pretty(tmp.as_file_mut(), self)?;
            tmp.as_file().sync_all()?;
            tmp.persist(Self::path(dir)).map_err(|e| e.error)?;
            std::fs::File::open(dir)?.sync_all()
        };
        write().map_err(|e| ApiError::internal(format!("saving the registry: {e}")))
    }

    /// The tenant whose token this is.
    pub fn tenant_by_token(&self, token: &str) -> Option<&str> {
        let hash = token_hash(token);
        self.tenants
            .iter()
            .find(|(_, t)| constant_time_eq(t.token_sha256.as_bytes(), hash.as_bytes()))
            .map(|(name, _)| name.as_str())
    }
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
