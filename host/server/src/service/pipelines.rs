//! A tenant's pipelines: creation within every quota (checked and taken in
//! one critical section), loading, control, deletion; and all of them at
//! once: recovered when the server starts, checkpointed when it stops.

use super::components::sha256;
use super::state::{Reservation, Service, lock, tenant_dir};
use crate::error::{Result, ServiceError};
use crate::limits::effective_limits;
use crate::registry::PipelineEntry;
use crate::runner::PipelineHandle;
use crate::settings::kafka_name;
use crate::types::{Desired, PipelineSpec, PipelineStatus};
use sluice_core::validate_name;
use sluice_pipeline::storage::HOST_MEMORY_BOUND;
use std::sync::Arc;
use std::time::Duration;

impl Service {
    /// Recovers every pipeline of the registry: running ones resume
    /// (restore + replay). A pipeline that cannot be recovered is logged
    /// and left out; the others start.
    pub async fn recover(&self) {
        let entries = lock(&self.registry).all_pipelines();
        for (tenant, entry) in entries {
            let entry = self.settle_upgrade(&tenant, entry).await;
            let name = entry.spec.name.clone();
            match self.load_pipeline(&tenant, entry.spec, entry.desired).await {
                Ok(handle) => {
                    tracing::info!(tenant, pipeline = %name, desired = ?entry.desired, "recovered");
                    lock(&self.pipelines).insert((tenant, name), handle);
                }
                Err(e) => tracing::error!(
                    tenant,
                    pipeline = %name,
                    "could not recover: {}",
                    sluice_core::text::for_log(&e.to_string())
                ),
            }
        }
        self.collect_garbage();
    }

    /// Checkpoints every running pipeline and ends its task (host shutdown).
    pub async fn shutdown(&self) {
        let handles: Vec<Arc<PipelineHandle>> = lock(&self.pipelines).values().cloned().collect();
        // Side by side: a host of a pipeline across hosts may wait for its
        // leader to move its workers away.
        let mut ending = tokio::task::JoinSet::new();
        for h in handles {
            ending.spawn(async move { h.shutdown(true).await });
        }
        while ending.join_next().await.is_some() {}
    }

    /// Creates a pipeline from an uploaded component and starts it, within
    /// the tenant's quotas and the host's budgets.
    pub async fn create_pipeline(
        &self,
        tenant: &str,
        mut spec: PipelineSpec,
    ) -> Result<PipelineStatus> {
        validate_name("pipeline", &spec.name)?;
        validate_name("component", &spec.component)?;
        spec.validate()?;
        if spec.across_hosts && self.kafka.as_ref().and_then(|k| k.hosts.as_ref()).is_none() {
            return Err(ServiceError::invalid(
                "no_hosts",
                "this server runs no pipelines across hosts (start it with --kafka-brokers, \
                 --hosts-etcd, --hosts-store and the hosts' secret)",
            ));
        }
        let key = (tenant.to_owned(), spec.name.clone());
        // Every quota is checked and the pipeline counted in one critical
        // section: parallel creates cannot all pass one check.
        let reservation = {
            let mut reg = lock(&self.registry);
            let t = reg.tenant(tenant)?;
            if t.pipelines.contains_key(&spec.name) || reg.creating.contains_key(&key) {
                return Err(ServiceError::Exists {
                    kind: "pipeline",
                    name: spec.name,
                });
            }
            // (A stopped pipeline being upgraded holds a reservation too:
            // it counts once.)
            let creating = reg
                .creating
                .keys()
                .filter(|(t_, n)| t_ == tenant && !t.pipelines.contains_key(n))
                .count();
            let count = t.pipelines.len() + creating;
            if count as u64 >= u64::from(t.limits.max_pipelines) {
                return Err(ServiceError::LimitExceeded {
                    limit: "max_pipelines",
                    value: t.limits.max_pipelines.into(),
                    attempted: count as u64 + 1,
                });
            }
            if spec.workers > t.limits.max_workers {
                return Err(ServiceError::LimitExceeded {
                    limit: "max_workers",
                    value: t.limits.max_workers.into(),
                    attempted: spec.workers.into(),
                });
            }
            let effective = effective_limits(&spec, &t.limits)?;
            let memory = effective.instance.memory as u64;
            self.admit(&reg, None, spec.workers, memory)?;
            reg.creating.insert(
                key.clone(),
                (
                    memory * u64::from(spec.workers) + HOST_MEMORY_BOUND,
                    spec.workers.into(),
                ),
            );
            Reservation { service: self, key }
        };
        let bytes = self.component_bytes(tenant, &spec.component)?;
        spec.component_hash = sha256(&bytes);
        self.keep_version(tenant, &spec.component_hash, &bytes)?;
        // The server names the topics, never the client.
        spec.kafka_name =
            (spec.log == sluice_pipeline::LogKind::Kafka).then(|| kafka_name(tenant, &spec.name));
        let handle = self
            .load_pipeline(tenant, spec.clone(), Desired::Running)
            .await?;
        let entry = PipelineEntry {
            spec: spec.clone(),
            desired: Desired::Running,
            upgrading_to: None,
        };
        let stored = self
            .update(|reg| {
                reg.creating.remove(&reservation.key);
                reg.tenant_mut(tenant)?
                    .pipelines
                    .insert(spec.name.clone(), entry);
                Ok(())
            })
            .await;
        drop(reservation);
        if let Err(e) = stored {
            handle.shutdown(false).await;
            return Err(e);
        }
        let status = handle.status();
        lock(&self.pipelines).insert((tenant.to_owned(), spec.name), handle);
        Ok(status)
    }

    /// Opens a pipeline's storage and starts its task (creation, recovery).
    pub(crate) async fn load_pipeline(
        &self,
        tenant: &str,
        spec: PipelineSpec,
        desired: Desired,
    ) -> Result<Arc<PipelineHandle>> {
        let effective = effective_limits(&spec, &self.limits(tenant)?)?;
        let bytes = self.version_bytes(tenant, &spec.component_hash)?;
        let (component, ports) = self
            .load_component(tenant, &spec.component, bytes.into())
            .await?;
        let dir = format!("{}/pipelines/{}", tenant_dir(tenant), spec.name);
        self.root.create_dir_all(&dir).map_err(|e| {
            ServiceError::Internal(format!("creating the pipeline's directory: {e}"))
        })?;
        let kafka = match spec.log {
            sluice_pipeline::LogKind::Embedded => None,
            sluice_pipeline::LogKind::Kafka => {
                Some(self.kafka.clone().ok_or(ServiceError::NoKafka)?)
            }
        };
        Ok(PipelineHandle::open(
            &self.engine,
            tenant,
            spec,
            component,
            ports,
            effective,
            self.data.join(&dir),
            desired,
            kafka,
        )
        .await?)
    }

    /// The handle of a tenant's pipeline, or 404 (503 while it is being
    /// upgraded).
    pub fn pipeline(&self, tenant: &str, name: &str) -> Result<Arc<PipelineHandle>> {
        validate_name("pipeline", name).map_err(|_| ServiceError::not_found("pipeline", name))?;
        if lock(&self.upgrading).contains_key(&(tenant.to_owned(), name.to_owned())) {
            return Err(ServiceError::Upgrading { name: name.into() });
        }
        lock(&self.pipelines)
            .get(&(tenant.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| ServiceError::not_found("pipeline", name))
    }

    /// One pipeline's status; while it is being upgraded, its status as
    /// the upgrade began, in state `upgrading` (as the listing shows it),
    /// so a client that watches it sees the upgrade rather than an error.
    pub fn status(&self, tenant: &str, name: &str) -> Result<PipelineStatus> {
        validate_name("pipeline", name).map_err(|_| ServiceError::not_found("pipeline", name))?;
        let key = (tenant.to_owned(), name.to_owned());
        if let Some(Some(status)) = lock(&self.upgrading).get(&key) {
            return Ok(status.clone());
        }
        Ok(self.pipeline(tenant, name)?.status())
    }

    /// The status of each of the tenant's pipelines, by name; one being
    /// upgraded as it was when its upgrade began, in state `upgrading`.
    pub fn statuses(&self, tenant: &str) -> Vec<PipelineStatus> {
        let upgrading: Vec<((String, String), Option<PipelineStatus>)> = lock(&self.upgrading)
            .iter()
            .filter(|((t, _), _)| t == tenant)
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        let mut statuses: Vec<PipelineStatus> = lock(&self.pipelines)
            .iter()
            .filter(|(k, _)| k.0 == tenant && !upgrading.iter().any(|(u, _)| u == *k))
            .map(|(_, h)| h.status())
            .collect();
        statuses.extend(upgrading.into_iter().filter_map(|(_, s)| s));
        statuses.sort_by(|a, b| a.name.cmp(&b.name));
        statuses
    }

    /// Starts, pauses or stops a pipeline; remembered across restarts.
    /// Starting (or pausing) a stopped pipeline takes its memory from the
    /// host's budget again.
    pub async fn control(&self, tenant: &str, name: &str, action: &str) -> Result<PipelineStatus> {
        let h = self.pipeline(tenant, name)?;
        let desired = match action {
            "start" => Desired::Running,
            "pause" => Desired::Paused,
            "stop" => Desired::Stopped,
            _ => return Err(ServiceError::not_found("action", action)),
        };
        if desired == Desired::Paused && h.across_hosts() {
            return Err(ServiceError::invalid(
                "across_hosts",
                format!(
                    "pipeline {name} runs across hosts: it can be started and stopped on this \
                     server (joining and leaving its group), not paused"
                ),
            ));
        }
        self.update(|reg| {
            let t = reg.tenant(tenant)?;
            let entry = t
                .pipelines
                .get(name)
                .ok_or_else(|| ServiceError::not_found("pipeline", name))?;
            if entry.desired == Desired::Stopped && desired != Desired::Stopped {
                let memory = effective_limits(&entry.spec, &t.limits)?.instance.memory as u64;
                self.admit(reg, Some((tenant, name)), entry.spec.workers, memory)?;
            }
            if let Some(entry) = reg.tenant_mut(tenant)?.pipelines.get_mut(name) {
                entry.desired = desired;
            }
            Ok(())
        })
        .await?;
        h.set(desired);
        // Let the task take the command before answering with its status.
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(h.status())
    }

    /// Changes a pipeline's number of workers: within the tenant's
    /// `max_workers` and the host's budgets; the running pipeline changes
    /// its layout between two steps (moving only the shards the new balance
    /// needs), a stopped or paused one when it next runs.
    pub async fn scale_pipeline(
        &self,
        tenant: &str,
        name: &str,
        workers: u32,
    ) -> Result<PipelineStatus> {
        let h = self.pipeline(tenant, name)?;
        crate::limits::pipeline::WORKERS.check(workers.into())?;
        if h.across_hosts() {
            return Err(ServiceError::invalid(
                "across_hosts",
                format!(
                    "pipeline {name} runs across hosts: its workers spread over the servers that \
                     run it; add or remove a server instead"
                ),
            ));
        }
        self.update(|reg| {
            let t = reg.tenant(tenant)?;
            if workers > t.limits.max_workers {
                return Err(ServiceError::LimitExceeded {
                    limit: "max_workers",
                    value: t.limits.max_workers.into(),
                    attempted: workers.into(),
                });
            }
            let entry = t
                .pipelines
                .get(name)
                .ok_or_else(|| ServiceError::not_found("pipeline", name))?;
            if entry.desired != Desired::Stopped {
                let memory = effective_limits(&entry.spec, &t.limits)?.instance.memory as u64;
                self.admit(reg, Some((tenant, name)), workers, memory)?;
            }
            if let Some(entry) = reg.tenant_mut(tenant)?.pipelines.get_mut(name) {
                entry.spec.workers = workers;
            }
            Ok(())
        })
        .await?;
        h.set_workers(workers);
        Ok(h.status())
    }

    /// Deletes a pipeline and its data (and its Kafka topics).
    pub async fn delete_pipeline(&self, tenant: &str, name: &str) -> Result<()> {
        let h = self.pipeline(tenant, name)?;
        h.shutdown(false).await;
        lock(&self.pipelines).remove(&(tenant.to_owned(), name.to_owned()));
        let entry = self
            .update(|reg| Ok(reg.tenant_mut(tenant)?.pipelines.remove(name)))
            .await?;
        // The task has ended; its database closes when the last handle goes.
        let across_hosts = h.across_hosts();
        drop(h);
        // The topics of a pipeline across hosts stay: the other servers
        // that run it still read them.
        if let Some(entry) = entry.filter(|_| !across_hosts) {
            self.delete_topics(tenant, &entry.spec).await;
        }
        self.remove_dir(&format!("{}/pipelines/{name}", tenant_dir(tenant)))
            .await;
        self.collect_versions(tenant);
        let returned = tokio::task::spawn_blocking(sluice_runtime::memory::give_back)
            .await
            .unwrap_or(0);
        tracing::debug!(
            tenant,
            pipeline = name,
            returned,
            in_use = sluice_runtime::memory::heap_in_use_bytes(),
            "deleted; freed heap given back"
        );
        Ok(())
    }

    /// Deletes the Kafka topics of a deleted pipeline (its own: the steps,
    /// its metadata and one per port). A failure is logged: the pipeline is
    /// gone either way.
    pub(crate) async fn delete_topics(&self, tenant: &str, spec: &PipelineSpec) {
        if spec.log != sluice_pipeline::LogKind::Kafka {
            return;
        }
        #[cfg(feature = "kafka")]
        if let Some(k) = &self.kafka {
            let name = spec.kafka_name_in(tenant);
            let config = sluice_kafka::KafkaConfig::new(k.brokers.clone(), name);
            match tokio::task::spawn_blocking(move || sluice_kafka::delete_topics(&config)).await {
                Ok(Ok(deleted)) => {
                    tracing::info!(tenant, pipeline = %spec.name, ?deleted, "deleted the pipeline's topics")
                }
                Ok(Err(e)) => {
                    tracing::warn!(tenant, pipeline = %spec.name, "could not delete the pipeline's topics: {e}")
                }
                Err(e) => tracing::warn!(tenant, pipeline = %spec.name, "deleting topics: {e}"),
            }
        }
        #[cfg(not(feature = "kafka"))]
        let _ = tenant;
    }
}
