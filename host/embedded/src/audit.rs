//! `sluice verify` of a pipeline whose logs are embedded: the storage audit
//! ([`sluice_storage::audit`]) plus what only this backend's layout can
//! show, that every output entry (and dead letter) is stored under its own
//! (step, worker) key.

use crate::db::PipelineDb;
use crate::meta::{self, LogMeta};
use crate::{EmbeddedLog, RocksCheckpointStore};
use sluice_core::{PipelineShape, dead_letter_log};
use sluice_storage::audit::{Verdict, audit_upgraded};
use sluice_storage::{CheckpointStore, Result};
use std::sync::Arc;

/// Audits the embedded pipeline in an opened database. A directory without
/// a pipeline, or whose logs are in Kafka, is reported as such.
pub fn audit_embedded(database: &Arc<PipelineDb>) -> Result<Verdict> {
    audit_embedded_with(database, &RocksCheckpointStore::open(database.clone()))
}

/// [`audit_embedded`] of a pipeline that keeps its checkpoints in
/// `checkpoints` (a shared store) rather than in the database.
pub fn audit_embedded_with(
    database: &Arc<PipelineDb>,
    checkpoints: &dyn CheckpointStore,
) -> Result<Verdict> {
    let Some(meta) = meta::load(database)? else {
        return Ok(Verdict::Violation(
            "no pipeline metadata: this directory holds no Sluice pipeline".into(),
        ));
    };
    if let LogMeta::Kafka { pipeline, .. } = &meta.log {
        return Ok(Verdict::Violation(format!(
            "the logs of this pipeline are in Kafka (pipeline `{pipeline}`): audit it with --brokers"
        )));
    }
    let log = Arc::new(EmbeddedLog::open(database.clone())?);
    // Inputs read in place are read from their files, checked as a run
    // checks them.
    let inputs: Vec<(String, u32)> = (meta.shape.inputs.iter())
        .map(|i| (i.name.clone(), i.partitions))
        .collect();
    let read = sluice_storage::in_place::InPlaceLog::open(log.clone(), &inputs)?;
    let removed: Vec<String> = (meta.upgrades.iter())
        .flat_map(|u| &u.outputs_before)
        .filter(|o| !meta.shape.outputs.contains(o))
        .cloned()
        .collect();
    if let Some(v) = misplaced_entry(&log, &meta.shape, &removed)? {
        return Ok(Verdict::Violation(v));
    }
    audit_upgraded(&read, checkpoints, &meta.shape, &outputs_before(&meta))
}

/// Per change of the pipeline's component, the last step before it and
/// the outputs up to it (see [`audit_upgraded`]).
pub fn outputs_before(meta: &crate::PipelineMeta) -> Vec<(u64, Vec<String>)> {
    meta.upgrades
        .iter()
        .filter_map(|u| Some((u.checkpoint?, u.outputs_before.clone())))
        .collect()
}

/// The first output entry (or dead letter) stored under another step's or
/// worker's key (`removed`: outputs an upgrade dropped, whose logs stay).
fn misplaced_entry(
    log: &EmbeddedLog,
    shape: &PipelineShape,
    removed: &[String],
) -> Result<Option<String>> {
    let dead_letters = shape.inputs.iter().map(|i| dead_letter_log(&i.name));
    let outputs = shape.outputs.iter().chain(removed).cloned();
    for name in outputs.chain(dead_letters) {
        let mut found = None;
        log.scan_output_keyed(&name, 0, &mut |step, worker, entry| {
            if found.is_none() && (entry.step, entry.worker) != (step, worker) {
                found = Some(format!(
                    "output log `{name}` holds a second entry for step {} worker {} (stored as step {step} \
                     worker {worker}): an output log must never hold two entries for one step (I1)",
                    entry.step, entry.worker
                ));
            }
            Ok(std::ops::ControlFlow::Continue(()))
        })?;
        if found.is_some() {
            return Ok(found);
        }
    }
    Ok(None)
}
