//! Changing a pipeline's component and keeping its state (`sluice
//! upgrade`).
//!
//! The change is made at a checkpoint of the pipeline's last committed
//! step, C, which the old component wrote:
//!
//! 1. the new component's instances start and take C's pieces through the
//!    circuit's `upgrade` (each worker its own, in C's layout): kept
//!    operators take their state, new ones and those named in
//!    `start_empty` start empty, a changed one not named refuses the whole
//!    upgrade — so far nothing is stored, and a refusal changes nothing;
//! 2. the pipeline's metadata is rewritten, durably, to name the new
//!    component and shape, with the change recorded ([`Upgrade`]): the
//!    commit point. On Kafka logs the change is first recorded on the
//!    pipeline's meta topic, in a transaction of the step producer (fenced
//!    like a step: the upgrade fences every host still running the
//!    pipeline before it reads the last step): that record is the commit
//!    point there, and every host opening the pipeline — another machine,
//!    a fresh data directory — follows it;
//! 3. the steps after C run the new component. Until its first checkpoint
//!    commits, every recovery takes C through `upgrade` again, with the
//!    same `start_empty` — the same call on the same pieces, so the same
//!    state — and replays the steps after C with the new component.
//!
//! No step ever replays under the old component: C covers every step it
//! ran. So the step log needs no record of the change (its records stay
//! as they are); the metadata is JSON, so the change is a field older
//! metadata simply lacks.
//!
//! [`Upgrade`]: sluice_embedded::meta::Upgrade

use crate::config::PipelineConfig;
use crate::error::{Error, Result};
use crate::pipeline::{Pipeline, stored_options};
use crate::storage::Storage;
use sluice_runtime::{Coordinator, LoadedComponent, SluiceEngine};
use std::sync::Arc;

/// What an upgrade did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeReport {
    /// The component before (SHA-256, hex).
    pub from: String,
    /// The component after.
    pub to: String,
    /// The step of the checkpoint the new component's instances took
    /// their state from (`None`: the pipeline had no step, so no state).
    pub checkpoint: Option<u64>,
    /// Output ports the new component added.
    pub outputs_added: Vec<String>,
    /// Output ports it no longer has (their logs stay, written no more).
    pub outputs_removed: Vec<String>,
    /// The operators rebuilt from the pipeline's input (`None`: no
    /// rebuild).
    pub rebuilt: Option<Vec<String>>,
}

impl Pipeline {
    /// Moves the pipeline in `config.data` to `component`, keeping the
    /// state the new circuit can take (see the [module](self)), and opens
    /// it: the pipeline and its coordinator, ready to run the steps after
    /// the change. `start_empty` names operators the new component starts
    /// empty. Refused, with nothing changed, when the new circuit refuses
    /// the old state (it names the operator) or the pipeline cannot be
    /// upgraded here (see `Storage::for_upgrade`: the data directory's own
    /// logs and checkpoints, the same inputs, a checkpoint of the last
    /// step).
    pub async fn upgrade(
        engine: Arc<SluiceEngine>,
        component: LoadedComponent,
        config: PipelineConfig,
        start_empty: Vec<String>,
        rebuild: bool,
    ) -> Result<(Pipeline, Coordinator, UpgradeReport)> {
        let ports = engine.describe(&component).await?;
        if let Some(missing) = start_empty
            .iter()
            .find(|name| !ports.operators.iter().any(|o| &o.id == *name))
        {
            return Err(Error::UpgradeRefused(format!(
                "--start-empty names {missing:?}, which is no operator of the new component"
            )));
        }
        let (c, p, hash, empty) = (
            config.clone(),
            ports.clone(),
            component.hash.clone(),
            start_empty.clone(),
        );
        let (storage, upgrade) = tokio::task::spawn_blocking(move || {
            Storage::for_upgrade(&c, &p, &hash, &empty, rebuild)
        })
        .await
        .map_err(Error::task("opening the pipeline's storage"))??;
        let options = stored_options(config.options, &storage.meta);
        let pipeline = Pipeline::assemble(engine, component, ports, storage, options, None);
        // The new instances take the old state: a refusal stops here, with
        // nothing stored.
        let coordinator = pipeline
            .coordinator_keeping_w(pipeline.options().clone(), Vec::new())
            .await
            .map_err(|e| match e {
                Error::Runtime(sluice_runtime::Error::Guest(g)) => Error::UpgradeRefused(format!(
                    "the new component's instances cannot take the pipeline's state: {g}"
                )),
                e => e,
            })?;
        // On a shared log (Kafka) the record there is the commit point:
        // every host opening the pipeline follows it, this data directory
        // too if the process stops before it stores its own. The new
        // instances' coordinator fenced the log: the step and checkpoint
        // the change is made at must still be the last (a host that took
        // the pipeline between the two fences and ran it makes the
        // upgrade fail, nothing recorded).
        let s = pipeline.storage().clone();
        let at = upgrade.checkpoint;
        tokio::task::spawn_blocking(move || {
            let last = s.log.last_step()?;
            let newest = s.checkpoints.latest_meta()?.map(|m| m.step);
            if last != at || newest != at {
                let show = |s: Option<u64>| s.map_or("none".to_owned(), |s| s.to_string());
                return Err(Error::UpgradeRefused(format!(
                    "another host ran the pipeline during the upgrade (its last step is now {}, \
                     its newest checkpoint {}, not {}): nothing changed; stop it, then upgrade \
                     again",
                    show(last),
                    show(newest),
                    show(at)
                )));
            }
            if s.record_upgrades()? {
                sluice_core::crash::crash_point(sluice_core::crash::CrashPoint::AfterUpgradeRecord);
            }
            Ok(s.store_meta()?)
        })
        .await
        .map_err(Error::task("storing the pipeline's metadata"))??;
        sluice_core::crash::crash_point(sluice_core::crash::CrashPoint::AfterUpgrade);
        let outputs = &pipeline.shape().outputs;
        let report = UpgradeReport {
            outputs_added: outputs
                .iter()
                .filter(|o| !upgrade.outputs_before.contains(o))
                .cloned()
                .collect(),
            outputs_removed: upgrade
                .outputs_before
                .iter()
                .filter(|o| !outputs.contains(o))
                .cloned()
                .collect(),
            from: upgrade.from,
            to: upgrade.to,
            checkpoint: upgrade.checkpoint,
            rebuilt: upgrade.rebuilt,
        };
        tracing::info!(
            pipeline = %pipeline.options().name,
            from = %report.from,
            to = %report.to,
            checkpoint = ?report.checkpoint,
            "upgraded"
        );
        Ok((pipeline, coordinator, report))
    }
}
