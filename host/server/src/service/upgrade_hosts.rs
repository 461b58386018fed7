//! Changing the component of a pipeline across hosts, and every server's
//! registry following the component its hosts run.
//!
//! `PATCH /pipelines/{name}` with `component` on any of the pipeline's
//! servers publishes the new version in the hosts' checkpoint store (by
//! its SHA-256, where every host fetches it) and asks the group's leader
//! through etcd, as `sluice upgrade --group` does; the leader — whichever
//! server it is — checkpoints, makes the upgrade and runs the new version
//! across the hosts, which run on meanwhile. The answer is the request's:
//! made (the registry points at the new version), refused (422
//! `upgrade_refused`, nothing changed), or none in time (504
//! `upgrade_pending`: it stays asked; another request is refused with 409
//! `upgrade_pending` until it is answered).
//!
//! The other servers learn of the change from their own host of the
//! pipeline: it made the upgrade, followed it when it opened the pipeline,
//! or its workers were started with the new version. Then
//! [`Service::follow_components`] brings the registry in line (keeping the
//! version's bytes, fetched from the store), then the status, so a server
//! started again loads the version its hosts run.

use super::state::{OnDrop, Service, lock};
use crate::error::{Result, ServiceError};
use crate::runner::PipelineHandle;
use crate::types::{PipelineSpec, PipelineStatus};
use sluice_cluster::{Membership, UpgradeAnswer};
use std::time::Duration;

/// How long a server waits for the leader's answer to an upgrade it
/// asked for.
const ANSWER_WAIT: Duration = Duration::from_secs(240);

/// How often [`Service::follow_components`] runs (`sluice serve`).
pub const FOLLOW_EVERY: Duration = Duration::from_secs(2);

impl Service {
    /// Asks the hosts of pipeline `name` (across hosts, loaded here as `h`)
    /// to move to the tenant's component `component` (its `bytes`, SHA-256
    /// `hash`), starting `start_empty` empty; the status once made. The
    /// pipeline runs on meanwhile, and answers every request as before.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn upgrade_across_hosts(
        &self,
        h: &PipelineHandle,
        tenant: &str,
        name: &str,
        component: &str,
        bytes: Vec<u8>,
        hash: &str,
        start_empty: Vec<String>,
    ) -> Result<PipelineStatus> {
        let key = (tenant.to_owned(), name.to_owned());
        if !lock(&self.asking).insert(key.clone()) {
            return Err(ServiceError::Upgrading { name: name.into() });
        }
        let _asking = OnDrop(|| {
            lock(&self.asking).remove(&key);
        });
        let entry = self.registered(tenant, name)?;
        if hash == entry.spec.component_hash {
            return Err(ServiceError::invalid(
                "same_component",
                format!("pipeline {name} already runs this version of component {component}"),
            ));
        }
        // Checked (it compiles; its ports) as every new version is.
        self.load_component(tenant, component, bytes.clone().into())
            .await?;
        let hosts = self
            .kafka
            .as_ref()
            .and_then(|k| k.hosts.clone())
            .ok_or(ServiceError::NoKafka)?;
        let (group, store) = self.hosts_store(tenant, &entry.spec)?;
        self.keep_version(tenant, hash, &bytes)?;
        let kept = bytes.clone();
        let published = tokio::task::spawn_blocking({
            let store = store.clone();
            move || sluice_pipeline::hosts::publish_component(&store, &bytes)
        })
        .await
        .map_err(|e| ServiceError::Internal(format!("publishing the component: {e}")))??;
        debug_assert_eq!(published, hash);
        let membership =
            sluice_cluster::EtcdMembership::connect(&hosts.etcd, &group, hosts.session_timeout)
                .await
                .map_err(sluice_pipeline::Error::from)?;
        let view = membership.view().await;
        if view
            .map_err(sluice_pipeline::Error::from)?
            .members
            .is_empty()
        {
            return Err(ServiceError::invalid(
                "no_hosts",
                format!(
                    "no server runs pipeline {name} now (it is stopped on every one): start it, \
                     then upgrade it"
                ),
            ));
        }
        let id = sluice_pipeline::hosts::ask_group(&membership, hash, start_empty).await?;
        // Asked: the registry names the upgrade under way (its name for
        // the new version, which `follow_components` gives the spec when
        // the hosts run it, however this request ends).
        self.set_upgrading_to(tenant, name, Some((component.to_owned(), hash.to_owned())))
            .await?;
        // (Kept again, now that the registry names it: a collection may
        // have run since it was kept.)
        self.keep_version(tenant, hash, &kept)?;
        let answer = sluice_pipeline::hosts::group_answer(&membership, &id, ANSWER_WAIT).await?;
        match answer {
            Some(UpgradeAnswer::Upgraded(said)) => {
                tracing::info!(
                    tenant,
                    pipeline = name,
                    component,
                    "upgraded across hosts: {said}"
                );
                self.runs_component(tenant, name, component, hash).await?;
                h.set_component(component, hash);
                self.collect_versions(tenant);
                Ok(h.status())
            }
            Some(UpgradeAnswer::Refused(why)) => {
                self.set_upgrading_to(tenant, name, None).await?;
                self.collect_versions(tenant);
                Err(sluice_pipeline::Error::UpgradeRefused(why).into())
            }
            None => Err(ServiceError::UpgradePending {
                name: name.to_owned(),
                waited_secs: ANSWER_WAIT.as_secs(),
            }),
        }
    }

    /// Brings the registry, then the status, in line with the component
    /// each pipeline across hosts loaded here runs (as its host reports
    /// it, [`PipelineHandle::runs_component`]), where they differ:
    /// the version is kept (its bytes fetched from the hosts' store if
    /// this server lacks them) and the spec points at it. Failures are
    /// logged and tried again at the next call.
    pub async fn follow_components(&self) {
        let loaded: Vec<((String, String), String)> = lock(&self.pipelines)
            .iter()
            .filter_map(|(key, h)| Some((key.clone(), h.runs_component()?)))
            .collect();
        for ((tenant, name), runs) in loaded {
            if let Err(e) = self.follow_component(&tenant, &name, &runs).await {
                tracing::warn!(
                    tenant,
                    pipeline = name,
                    component = runs,
                    "the pipeline's hosts run another component; keeping it failed: {e}"
                );
            }
        }
    }

    /// [`follow_components`](Self::follow_components) for one pipeline,
    /// whose hosts run component `runs`.
    async fn follow_component(&self, tenant: &str, name: &str, runs: &str) -> Result<()> {
        let key = (tenant.to_owned(), name.to_owned());
        if lock(&self.asking).contains(&key) {
            return Ok(());
        }
        let entry = lock(&self.registry)
            .tenant(tenant)?
            .pipelines
            .get(name)
            .cloned();
        let Some(entry) = entry.filter(|e| e.spec.component_hash != runs) else {
            return Ok(());
        };
        let bytes = match self.version_bytes(tenant, runs) {
            Ok(bytes) => bytes,
            Err(_) => {
                let (_, store) = self.hosts_store(tenant, &entry.spec)?;
                let hash = runs.to_owned();
                let fetched = tokio::task::spawn_blocking(move || {
                    sluice_pipeline::hosts::published_component(&store, &hash)
                })
                .await
                .map_err(|e| ServiceError::Internal(format!("fetching the component: {e}")))??;
                fetched.ok_or_else(|| {
                    ServiceError::Internal(format!(
                        "component {runs} is not in the hosts' checkpoint store"
                    ))
                })?
            }
        };
        self.keep_version(tenant, runs, &bytes)?;
        // The name the upgrade asked for, when this server asked; else the
        // name the pipeline was created with.
        let component = match &entry.upgrading_to {
            Some((component, hash)) if hash == runs => component.clone(),
            _ => entry.spec.component.clone(),
        };
        // Unless an upgrade asked here changed the entry meanwhile.
        let was = entry.spec.component_hash.as_str();
        let followed = self
            .update(|reg| {
                let Some(e) = reg.tenant_mut(tenant)?.pipelines.get_mut(name) else {
                    return Ok(false);
                };
                if e.spec.component_hash != was || lock(&self.asking).contains(&key) {
                    return Ok(false);
                }
                e.spec.component = component.clone();
                e.spec.component_hash = runs.to_owned();
                if e.upgrading_to.as_ref().is_some_and(|(_, to)| to == runs) {
                    e.upgrading_to = None;
                }
                Ok(true)
            })
            .await?;
        if !followed {
            return Ok(());
        }
        // (Kept again, now that the registry names it: a collection may
        // have run since it was kept.)
        self.keep_version(tenant, runs, &bytes)?;
        if let Some(h) = lock(&self.pipelines).get(&key) {
            h.set_component(&component, runs);
        }
        tracing::info!(
            tenant,
            pipeline = name,
            component = runs,
            "the pipeline's hosts run another version of its component: the registry follows"
        );
        self.collect_versions(tenant);
        Ok(())
    }

    /// Records that a tenant's pipeline runs component `component` (SHA-256
    /// `hash`); an upgrade under way to it is over.
    async fn runs_component(
        &self,
        tenant: &str,
        name: &str,
        component: &str,
        hash: &str,
    ) -> Result<()> {
        self.update(|reg| {
            if let Some(e) = reg.tenant_mut(tenant)?.pipelines.get_mut(name) {
                e.spec.component = component.to_owned();
                e.spec.component_hash = hash.to_owned();
                if e.upgrading_to.as_ref().is_some_and(|(_, to)| to == hash) {
                    e.upgrading_to = None;
                }
            }
            Ok(())
        })
        .await
    }

    /// The group (etcd) and checkpoint store of a tenant's pipeline across
    /// hosts, as its hosts have them.
    fn hosts_store(&self, tenant: &str, spec: &PipelineSpec) -> Result<(String, String)> {
        let hosts = self.kafka.as_ref().and_then(|k| k.hosts.as_ref());
        let hosts = hosts.ok_or(ServiceError::NoKafka)?;
        let group = spec.kafka_name_in(tenant);
        let store = hosts.pipeline_store(&group);
        Ok((group, store))
    }
}
