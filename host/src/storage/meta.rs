//! Pipeline metadata: what a data directory holds, checked on every open so
//! that a pipeline is never resumed with another component or layout.

use crate::error::{Error, Result};
use crate::storage::db::{self, CF_META};
use rocksdb::DB;
use serde::{Deserialize, Serialize};

/// The fixed shape of a pipeline, recorded when it is created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineMeta {
    /// The pipeline's identity, fixed at creation: seeds the guests'
    /// deterministic random numbers.
    pub id: String,
    /// SHA-256 of the component, hex.
    pub component: String,
    /// Input port names and partition counts, in port order.
    pub inputs: Vec<(String, u32)>,
    /// Output port names, in port order.
    pub outputs: Vec<String>,
    /// The number of workers W.
    pub workers: u32,
    /// Where the logs live: `embedded`, or `kafka:<pipeline>`.
    #[serde(default = "embedded")]
    pub log: String,
}

fn embedded() -> String {
    "embedded".into()
}

const KEY: &[u8] = b"pipeline";

/// A fresh pipeline identity: unique per data directory and creation.
pub fn new_pipeline_id(dir: &std::path::Path) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(dir.to_string_lossy().as_bytes());
    h.update(&now.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    format!("p-{:016x}", h.digest())
}

/// Reads the pipeline's metadata, if it was created.
pub fn load(db: &DB) -> Result<Option<PipelineMeta>> {
    match db
        .get_cf(db::cf(db, CF_META)?, KEY)
        .map_err(Error::rocks("reading pipeline metadata"))?
    {
        Some(v) => serde_json::from_slice(&v)
            .map(Some)
            .map_err(|e| Error::Corrupt {
                what: "pipeline metadata".into(),
                message: e.to_string(),
            }),
        None => Ok(None),
    }
}

/// Records the pipeline's metadata (durably).
pub fn store(db: &DB, meta: &PipelineMeta) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(meta).map_err(|e| Error::Corrupt {
        what: "pipeline metadata".into(),
        message: e.to_string(),
    })?;
    db.put_cf_opt(db::cf(db, CF_META)?, KEY, bytes, &db::synced())
        .map_err(Error::rocks("writing pipeline metadata"))
}

/// The stored metadata if it is compatible with `wanted`, else `wanted`
/// after storing it (a new pipeline).
pub fn ensure(db: &DB, wanted: &PipelineMeta) -> Result<PipelineMeta> {
    match load(db)? {
        Some(stored) => {
            stored.check_compatible(wanted)?;
            Ok(stored)
        }
        None => {
            store(db, wanted)?;
            Ok(wanted.clone())
        }
    }
}

impl PipelineMeta {
    /// Explains why `self` (stored) cannot be resumed as `wanted`, if so.
    pub fn check_compatible(&self, wanted: &PipelineMeta) -> Result<()> {
        if self.component != wanted.component {
            return Err(Error::Config(format!(
                "this data directory belongs to component {}, not {}; use a new --data directory \
                 (changing a running pipeline's component is not supported yet)",
                short(&self.component),
                short(&wanted.component)
            )));
        }
        if self.log != wanted.log {
            return Err(Error::Config(format!(
                "this data directory's logs are `{}`, not `{}`; use a new --data directory",
                self.log, wanted.log
            )));
        }
        if self.workers != wanted.workers {
            return Err(Error::Config(format!(
                "this pipeline runs with {} workers, not {}: W is fixed at a checkpoint \
                 (changing it is a layout change, not supported yet)",
                self.workers, wanted.workers
            )));
        }
        Ok(())
    }
}

fn short(hash: &str) -> &str {
    &hash[..hash.len().min(12)]
}
