//! Pipeline metadata: who a data directory's pipeline is and what shape it
//! has, stored when it is created and checked on every open, so that a
//! pipeline is never resumed with another component, W or log.

use crate::db::{self, CF_META, rocks};
use rocksdb::DB;
use serde::{Deserialize, Serialize};
use sluice_core::{CircuitPorts, ConfigError, OperatorInfo, PipelineShape};
use sluice_storage::{Result, StorageError};
use std::collections::BTreeMap;

/// What a data directory's pipeline is, recorded when it is created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineMeta {
    /// The pipeline's identity, fixed at creation: seeds the guests'
    /// deterministic random numbers.
    pub id: String,
    /// SHA-256 of the component, hex.
    pub component: String,
    /// Inputs (with partitions), outputs, W, snapshot version.
    pub shape: PipelineShape,
    /// Where the logs live.
    pub log: LogMeta,
    /// The stateful operators of the component it runs, as the component
    /// describes them (what `sluice diff` compares a new version with);
    /// empty in metadata written before they were recorded, until the
    /// pipeline is next opened.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operators: Vec<OperatorInfo>,
    /// The changes of component the pipeline went through
    /// (`sluice upgrade`), oldest first; the last one's `to` is
    /// [`component`](Self::component).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upgrades: Vec<Upgrade>,
    /// The pipeline keeps all its input (`--retain-input`): no checkpoint
    /// trims it, so that an upgrade can rebuild operators from it. Once
    /// set, it stays.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retain_input: bool,
}

/// A change of a pipeline's component, at a checkpoint at its last
/// committed step: the new component's instances take that checkpoint's
/// pieces through the circuit's `upgrade` (until a checkpoint of the new
/// component is the newest), and every step after it runs the new one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upgrade {
    /// The component before (SHA-256, hex).
    pub from: String,
    /// The component after.
    pub to: String,
    /// The step of the checkpoint the change was made at (`None`: the
    /// pipeline had committed no step, so no state was carried).
    pub checkpoint: Option<u64>,
    /// The operators the new component started empty.
    pub start_empty: Vec<String>,
    /// The output ports before the change, in port order (the steps up to
    /// the checkpoint wrote these: the audit checks them so).
    pub outputs_before: Vec<String>,
    /// The operators rebuilt from the pipeline's input (`--rebuild`): the
    /// first step after the checkpoint also carries the difference between
    /// the new version's output, as the rebuild computed it, and the old
    /// version's (see `sluice_runtime::UpgradedAt::rebuilt`).
    /// `None`: no rebuild.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuilt: Option<Vec<String>>,
}

/// `upgrades` as a shared log records them
/// ([`LogBackend::record_upgrades`](sluice_storage::LogBackend::record_upgrades)):
/// JSON, as the metadata holds them.
pub fn encode_upgrades(upgrades: &[Upgrade]) -> Result<Vec<u8>> {
    serde_json::to_vec(upgrades).map_err(StorageError::corrupt("upgrade record"))
}

/// The changes of component a shared log recorded (see
/// [`encode_upgrades`]); none where it recorded none.
pub fn decode_upgrades(recorded: Option<&[u8]>) -> Result<Vec<Upgrade>> {
    match recorded {
        None => Ok(Vec::new()),
        Some(bytes) => {
            serde_json::from_slice(bytes).map_err(StorageError::corrupt("upgrade record"))
        }
    }
}

/// Where a pipeline's logs live, as recorded in its metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogMeta {
    /// In this data directory's RocksDB.
    Embedded,
    /// In Kafka topics of the pipeline named `pipeline`.
    Kafka {
        /// The pipeline's Kafka name (transactional ids, default topics).
        pipeline: String,
        /// Ports mapped to topics other than `<pipeline>.<port>`.
        topics: BTreeMap<String, String>,
    },
}

impl std::fmt::Display for LogMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogMeta::Embedded => write!(f, "embedded"),
            LogMeta::Kafka { pipeline, .. } => write!(f, "kafka:{pipeline}"),
        }
    }
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
        .map_err(rocks("reading pipeline metadata"))?
    {
        Some(v) => serde_json::from_slice(&v)
            .map(Some)
            .map_err(StorageError::corrupt("pipeline metadata")),
        None => Ok(None),
    }
}

/// Records the pipeline's metadata (durably).
pub fn store(db: &DB, meta: &PipelineMeta) -> Result<()> {
    let bytes =
        serde_json::to_vec_pretty(meta).map_err(StorageError::corrupt("pipeline metadata"))?;
    db.put_cf_opt(db::cf(db, CF_META)?, KEY, bytes, &db::synced())
        .map_err(rocks("writing pipeline metadata"))
}

/// The stored metadata if it is compatible with `wanted`, else `wanted`
/// after storing it (a new pipeline).
pub fn ensure(db: &DB, wanted: &PipelineMeta) -> Result<PipelineMeta> {
    match load(db)? {
        Some(mut stored) => {
            stored.check_compatible(wanted)?;
            // Metadata from before operators were recorded gets them once;
            // input retention, once asked for, is kept.
            let operators = stored.operators.is_empty() && !wanted.operators.is_empty();
            let retain = wanted.retain_input && !stored.retain_input;
            if operators {
                stored.operators = wanted.operators.clone();
            }
            stored.retain_input |= retain;
            if operators || retain {
                store(db, &stored)?;
            }
            Ok(stored)
        }
        None => {
            store(db, wanted)?;
            Ok(wanted.clone())
        }
    }
}

impl PipelineMeta {
    /// The ports and operators of the component the pipeline runs, as
    /// stored (its operators are empty in metadata from before they were
    /// recorded).
    pub fn ports(&self) -> CircuitPorts {
        CircuitPorts {
            inputs: self.shape.inputs.iter().map(|i| i.name.clone()).collect(),
            outputs: self.shape.outputs.clone(),
            snapshot_version: self.shape.snapshot_version,
            operators: self.operators.clone(),
        }
    }

    /// Explains why `self` (stored) cannot be resumed as `wanted`, if so.
    pub fn check_compatible(&self, wanted: &PipelineMeta) -> Result<(), ConfigError> {
        if self.component != wanted.component {
            return Err(ConfigError::ComponentChanged {
                stored: short_hash(&self.component).into(),
                wanted: short_hash(&wanted.component).into(),
            });
        }
        if self.log.to_string() != wanted.log.to_string() {
            return Err(ConfigError::LogChanged {
                stored: self.log.to_string(),
                wanted: wanted.log.to_string(),
            });
        }
        // W is not compared: changing it is a layout change (the stored
        // shape keeps the W the pipeline was created with).
        Ok(())
    }
}

/// A component hash (SHA-256, hex) as messages show it: its first 12
/// digits.
pub fn short_hash(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::InputLog;

    fn meta() -> PipelineMeta {
        PipelineMeta {
            id: "p-1".into(),
            component: "a".repeat(64),
            shape: PipelineShape {
                inputs: vec![InputLog {
                    name: "lines".into(),
                    partitions: 2,
                }],
                outputs: vec!["counts".into()],
                workers: 2,
                snapshot_version: 1,
            },
            log: LogMeta::Embedded,
            operators: Vec::new(),
            upgrades: Vec::new(),
            retain_input: false,
        }
    }

    /// Metadata stored before upgrades existed has no `upgrades` field and
    /// still loads; a pipeline never upgraded stores none; one upgraded
    /// reads its changes back.
    #[test]
    fn metadata_without_upgrades_loads_and_upgrades_round_trip() {
        let mut m = meta();
        let json = serde_json::to_string(&m).unwrap();
        assert!(!json.contains("upgrades"), "{json}");
        assert_eq!(serde_json::from_str::<PipelineMeta>(&json).unwrap(), m);
        m.upgrades.push(Upgrade {
            from: "a".repeat(64),
            to: "b".repeat(64),
            checkpoint: Some(41),
            start_empty: vec!["counts".into()],
            outputs_before: vec!["counts".into()],
            rebuilt: Some(vec!["lengths".into()]),
        });
        m.component = "b".repeat(64);
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<PipelineMeta>(&json).unwrap(), m);
    }
}
