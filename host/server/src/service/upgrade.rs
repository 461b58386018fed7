//! Changing a pipeline's component on this server (`PATCH
//! /pipelines/{name}` with `component`), keeping its state: the pipeline
//! is unloaded (it checkpoints its last step), its data directory is
//! upgraded as `sluice upgrade` does ([`Pipeline::upgrade`]), and it is
//! loaded again with the new component, in the state it was wanted in. A
//! refused upgrade loads it again as it was. Meanwhile its status (and
//! the listing) shows it in state `upgrading`, and every other request for
//! it answers 503 (`upgrading`).

use super::components::sha256;
use super::state::{OnDrop, Reservation, Service, lock, tenant_dir};
use crate::error::{Result, ServiceError};
use crate::limits::effective_limits;
use crate::registry::PipelineEntry;
use crate::types::{Desired, PipelineSpec, PipelineState, PipelineStatus};
use sluice_core::validate_name;
use sluice_pipeline::storage::HOST_MEMORY_BOUND;
use sluice_pipeline::{LogKind, Pipeline, PipelineConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long an upgrade waits for the unloaded pipeline's database to close
/// (a request that held its handle, a stream of its output, ends first).
const CLOSE_WAIT: Duration = Duration::from_secs(10);

impl Service {
    /// Moves a tenant's pipeline to its uploaded component `component`,
    /// keeping the state the new version can take (operators named in
    /// `start_empty` start empty; with `rebuild`, every operator's
    /// state is computed anew from the pipeline's retained input). Refused — the pipeline running on as
    /// before — when it rebuilds on Kafka (not built yet), already runs
    /// that component, or the new version refuses its state (naming the
    /// operator). A pipeline across hosts is moved by its hosts' leader,
    /// asked through etcd (see the `upgrade_hosts` module).
    pub async fn upgrade_pipeline(
        &self,
        tenant: &str,
        name: &str,
        component: &str,
        start_empty: Vec<String>,
        rebuild: bool,
    ) -> Result<PipelineStatus> {
        let loaded = self.pipeline(tenant, name)?;
        validate_name("component", component)?;
        let bytes = self.component_bytes(tenant, component)?;
        let hash = sha256(&bytes);
        if loaded.across_hosts() {
            if rebuild {
                return Err(ServiceError::invalid(
                    "upgrade_unsupported",
                    format!(
                        "pipeline {name} runs across hosts: rebuilding its state from its input \
                         is built for a pipeline on the embedded log only, so far"
                    ),
                ));
            }
            return self
                .upgrade_across_hosts(&loaded, tenant, name, component, bytes, &hash, start_empty)
                .await;
        }
        drop(loaded);
        // Marked first: from here every other request for the pipeline
        // (a scale, a stop, a delete, another upgrade) answers 503, so the
        // handle and the entry read next stay the pipeline's.
        let key = (tenant.to_owned(), name.to_owned());
        if lock(&self.upgrading).insert(key.clone(), None).is_some() {
            return Err(ServiceError::Upgrading { name: name.into() });
        }
        let _upgrading = OnDrop(|| {
            lock(&self.upgrading).remove(&key);
        });
        let h = lock(&self.pipelines)
            .get(&key)
            .cloned()
            .ok_or_else(|| ServiceError::not_found("pipeline", name))?;
        let mut listed = h.status();
        listed.state = PipelineState::Upgrading;
        lock(&self.upgrading).insert(key.clone(), Some(listed));
        let entry = self.registered(tenant, name)?;
        if entry.spec.log != LogKind::Embedded && rebuild {
            return Err(ServiceError::invalid(
                "upgrade_unsupported",
                format!(
                    "pipeline {name} keeps its logs in Kafka: rebuilding its state from its \
                     input is built for the embedded log only, so far"
                ),
            ));
        }
        let log = self.log_config(tenant, &entry.spec)?;
        if hash == entry.spec.component_hash {
            return Err(ServiceError::invalid(
                "same_component",
                format!("pipeline {name} already runs this version of component {component}"),
            ));
        }
        if h.status().state == PipelineState::Failed {
            return Err(ServiceError::invalid(
                "pipeline_failed",
                format!(
                    "pipeline {name} failed: start it (it recovers and checkpoints when it is \
                     unloaded), then upgrade it"
                ),
            ));
        }
        let (loaded, _) = self
            .load_component(tenant, component, bytes.clone().into())
            .await?;
        let dir = self
            .data
            .join(format!("{}/pipelines/{name}", tenant_dir(tenant)));
        let effective = effective_limits(&entry.spec, &self.limits(tenant)?)?;
        let engine = Arc::new(self.engine.with_limits(effective.instance));
        // A stopped pipeline holds no memory of the host's budget, but its
        // trial starts its instances: they are reserved for it (as for a
        // pipeline being created) until the upgrade ends, or it is refused.
        let _trial = if entry.desired == Desired::Stopped {
            let memory = effective.instance.memory as u64;
            let mut reg = lock(&self.registry);
            self.admit(&reg, None, entry.spec.workers, memory)?;
            reg.creating.insert(
                key.clone(),
                (
                    memory * u64::from(entry.spec.workers) + HOST_MEMORY_BOUND,
                    entry.spec.workers.into(),
                ),
            );
            Some(Reservation {
                service: self,
                key: key.clone(),
            })
        } else {
            None
        };
        // Recorded before the data directory changes: a server that dies
        // after the change and before the spec follows settles it when it
        // starts again (`settle_upgrade`).
        self.keep_version(tenant, &hash, &bytes)?;
        self.set_upgrading_to(tenant, name, Some((component.to_owned(), hash.clone())))
            .await?;
        // Unloaded, it checkpoints its last step (the upgrade's point).
        h.shutdown(true).await;
        {
            let mut loaded = lock(&self.pipelines);
            if loaded.get(&key).is_some_and(|l| Arc::ptr_eq(l, &h)) {
                loaded.remove(&key);
            }
        }
        drop(h);

        let started = Instant::now();
        let upgraded = loop {
            let config = PipelineConfig {
                log: log.clone(),
                ..PipelineConfig::new(dir.clone(), entry.spec.workers)
            };
            match Pipeline::upgrade(
                engine.clone(),
                loaded.clone(),
                config,
                start_empty.clone(),
                rebuild,
            )
            .await
            {
                Err(e) if is_locked(&e) && started.elapsed() < CLOSE_WAIT => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                // The upgrade's coordinator is dropped unused: the
                // pipeline's task opens its own.
                other => break other.map(|(_, _, report)| report),
            }
        };
        // Only a refusal surely changed nothing; after another error the
        // data directory (on Kafka, the log's record) says whether the
        // change was made. When that cannot be read either (`None`), the
        // pipeline loads as it was and the record of the upgrade under way
        // stays, for the server's next start to settle.
        let made = match &upgraded {
            Ok(_) => Some(true),
            Err(sluice_pipeline::Error::UpgradeRefused(_)) => Some(false),
            Err(_) => match read_upgraded(dir.clone(), log).await {
                Ok(stored) => Some(stored.as_deref() == Some(hash.as_str())),
                Err(e) => {
                    tracing::error!(
                        tenant,
                        pipeline = name,
                        "an upgrade failed and whether it was made cannot be read ({e}): \
                         the server's next start settles it"
                    );
                    None
                }
            },
        };
        let settled = made.is_some();
        let made = made == Some(true);
        // The spec as it is now, the new component's where the change was
        // made (the rest of it, and the state wanted, as the registry has
        // them).
        let current = self
            .update(|reg| {
                let e = reg
                    .tenant_mut(tenant)?
                    .pipelines
                    .get_mut(name)
                    .ok_or_else(|| ServiceError::not_found("pipeline", name))?;
                if made {
                    e.spec.component = component.to_owned();
                    e.spec.component_hash = hash.clone();
                }
                if settled {
                    e.upgrading_to = None;
                }
                Ok(e.clone())
            })
            .await;
        let reloaded = match current {
            Ok(current) => {
                if made && let Err(e) = self.keep_version(tenant, &hash, &bytes) {
                    // (Kept again: a collection may have run meanwhile.)
                    tracing::warn!(
                        tenant,
                        pipeline = name,
                        "could not keep the new version: {e}"
                    );
                }
                self.reload(tenant, current.spec, current.desired).await
            }
            // The registry could not be written: the pipeline loads as
            // it was (the record of the upgrade stays for a restart).
            Err(e) => {
                tracing::error!(tenant, pipeline = name, "could not record an upgrade: {e}");
                let spec = if made {
                    PipelineSpec {
                        component: component.to_owned(),
                        component_hash: hash.clone(),
                        ..entry.spec.clone()
                    }
                } else {
                    entry.spec.clone()
                };
                self.reload(tenant, spec, entry.desired).await
            }
        };
        let status = reloaded?;
        match upgraded {
            Ok(report) => {
                tracing::info!(
                    tenant,
                    pipeline = name,
                    from = %report.from,
                    to = %report.to,
                    checkpoint = ?report.checkpoint,
                    "upgraded"
                );
                self.collect_versions(tenant);
                Ok(status)
            }
            Err(e) if made => {
                tracing::warn!(tenant, pipeline = name, "upgraded, but: {e}");
                self.collect_versions(tenant);
                Ok(status)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Loads a pipeline again after an upgrade (or its refusal), waiting up
    /// to [`CLOSE_WAIT`] for its database to close; its status.
    async fn reload(
        &self,
        tenant: &str,
        spec: PipelineSpec,
        desired: Desired,
    ) -> Result<PipelineStatus> {
        let name = spec.name.clone();
        let started = Instant::now();
        let handle = loop {
            match self.load_pipeline(tenant, spec.clone(), desired).await {
                Err(ServiceError::Pipeline(e))
                    if is_locked(&e) && started.elapsed() < CLOSE_WAIT =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => break other?,
            }
        };
        let status = handle.status();
        lock(&self.pipelines).insert((tenant.to_owned(), name), handle);
        Ok(status)
    }
}

impl Service {
    /// The logs of a tenant's pipeline: its Kafka topics on this server's
    /// brokers, or the embedded log.
    fn log_config(&self, tenant: &str, spec: &PipelineSpec) -> Result<sluice_pipeline::LogConfig> {
        let kafka = match spec.log {
            LogKind::Embedded => None,
            LogKind::Kafka => Some(self.kafka.clone().ok_or(ServiceError::NoKafka)?),
        };
        Ok(crate::runner::log_config(tenant, spec, kafka)?)
    }

    /// Records (or clears) the upgrade under way of a tenant's pipeline.
    pub(super) async fn set_upgrading_to(
        &self,
        tenant: &str,
        name: &str,
        to: Option<(String, String)>,
    ) -> Result<()> {
        self.update(|reg| {
            if let Some(e) = reg.tenant_mut(tenant)?.pipelines.get_mut(name) {
                e.upgrading_to = to;
            }
            Ok(())
        })
        .await
    }

    /// Settles an upgrade the server died in (at start, before the
    /// pipeline loads): if the pipeline runs the component the upgrade was
    /// moving to (as its data directory says, or on Kafka the log's record
    /// of the change), the spec follows; else the upgrade did not happen.
    /// Either way the record of it goes. Left as it is (logged) when
    /// neither can be read: loading then says why, and the next start
    /// settles it.
    pub(super) async fn settle_upgrade(
        &self,
        tenant: &str,
        mut entry: PipelineEntry,
    ) -> PipelineEntry {
        let Some((component, hash)) = entry.upgrading_to.take() else {
            return entry;
        };
        let name = entry.spec.name.clone();
        if entry.spec.across_hosts {
            // Its hosts follow the log's record of the change themselves
            // (and the registry follows them: `follow_components`). Read
            // here, the record would fence the leader's ingest.
            let settled = self
                .update(|reg| {
                    if let Some(e) = reg.tenant_mut(tenant)?.pipelines.get_mut(&name) {
                        e.upgrading_to = None;
                    }
                    Ok(())
                })
                .await;
            tracing::info!(tenant, pipeline = %name, to = %hash, stored = settled.is_ok(), "forgot an upgrade across hosts the server stopped in: the registry follows what its hosts run");
            return entry;
        }
        let dir = self
            .data
            .join(format!("{}/pipelines/{name}", tenant_dir(tenant)));
        // On Kafka, the log's record of the change is its commit point.
        let stored = match self.log_config(tenant, &entry.spec) {
            Ok(log) => read_upgraded(dir, log).await,
            Err(e) => Err(e.to_string()),
        };
        let made = match stored {
            Ok(stored) => stored.as_deref() == Some(hash.as_str()),
            Err(e) => {
                tracing::warn!(tenant, pipeline = %name, "could not read whether an upgrade was made: {e}");
                entry.upgrading_to = Some((component, hash));
                return entry;
            }
        };
        if made {
            entry.spec.component = component;
            entry.spec.component_hash = hash;
        }
        let spec = entry.spec.clone();
        let settled = self
            .update(|reg| {
                if let Some(e) = reg.tenant_mut(tenant)?.pipelines.get_mut(&name) {
                    e.spec = spec.clone();
                    e.upgrading_to = None;
                }
                Ok(())
            })
            .await;
        tracing::info!(tenant, pipeline = %name, made, stored = settled.is_ok(), "settled an upgrade the server stopped in");
        entry
    }
}

/// The component the pipeline in data directory `dir` runs on logs `log`
/// ([`upgraded_component`](sluice_pipeline::storage::upgraded_component)),
/// tried three times a second apart (a broker may be restarting); the
/// last error, as text, when it cannot be read.
async fn read_upgraded(
    dir: std::path::PathBuf,
    log: sluice_pipeline::LogConfig,
) -> std::result::Result<Option<String>, String> {
    let mut tries = 0;
    loop {
        let (d, l) = (dir.clone(), log.clone());
        let read = tokio::task::spawn_blocking(move || {
            sluice_pipeline::storage::upgraded_component(&d, &l)
        })
        .await;
        let e = match read {
            Ok(Ok(stored)) => return Ok(stored),
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        tries += 1;
        if tries == 3 {
            return Err(e);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Whether `e` says another holder still has the pipeline's database open.
fn is_locked(e: &sluice_pipeline::Error) -> bool {
    matches!(
        e.as_runtime(),
        Some(sluice_runtime::Error::Storage(
            sluice_storage::StorageError::Locked { .. }
        ))
    )
}
