//! Changes of component across hosts: components published to the
//! pipeline's checkpoint store by hash ([`publish_component`]), fetched
//! from it by the hosts that do not run them yet; the leader making an
//! upgrade the group was asked for ([`perform`]); and a host that opens the
//! pipeline after another made one following it ([`recorded_change`]).
//!
//! The commit point of an upgrade is unchanged: the record of the change
//! on the pipeline's Kafka meta topic, which [`Pipeline::upgrade`] writes.
//! A leader asked for an upgrade checkpoints its last step, lets go of
//! the pipeline, upgrades its own data directory (the new version's
//! instances take the checkpoint, in this process) and opens the pipeline
//! again across the hosts: every worker takes the checkpoint through the
//! new version's `upgrade` on its own host, fetching the component from
//! the store when its host does not run it yet.

use super::HostConfig;
use crate::error::{Error, Result};
use crate::pipeline::Pipeline;
use sluice_cluster::{Membership, UpgradeAnswer, UpgradeRequest};
use sluice_runtime::{ComponentSource, LoadedComponent, SluiceEngine};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Publishes a component's bytes in the checkpoint store at `store` (a
/// URL, as `--store` takes it), where the hosts of a pipeline fetch it by
/// its SHA-256 — returned, hex. Publishing the same bytes again is
/// harmless. Blocks.
pub fn publish_component(store: &str, bytes: &[u8]) -> Result<String> {
    Ok(sluice_objstore::ObjectCheckpointStore::open(store)?.put_component(bytes)?)
}

/// The bytes of component `hash` (SHA-256, hex) published in the
/// checkpoint store at `store`, checked against the hash; `None` if it was
/// never published there. Blocks.
pub fn published_component(store: &str, hash: &str) -> Result<Option<Vec<u8>>> {
    Ok(sluice_objstore::ObjectCheckpointStore::open(store)?.get_component(hash)?)
}

/// Asks the leader of a group of hosts to upgrade the pipeline to component
/// `to` (published in its checkpoint store, [`publish_component`]),
/// starting `start_empty` empty: the request's id, for [`group_answer`].
/// Refused while another request is pending
/// ([`sluice_cluster::Error::UpgradePending`]).
pub async fn ask_group(
    group: &dyn Membership,
    to: &str,
    start_empty: Vec<String>,
) -> Result<String> {
    let id = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    );
    let request = UpgradeRequest {
        id: id.clone(),
        to: to.to_owned(),
        start_empty,
        answer: None,
    };
    group.request_upgrade(&request).await?;
    Ok(id)
}

/// The leader's answer to upgrade request `id` ([`ask_group`]), waited for
/// up to `wait` (read every half second; a read that fails is tried again
/// until then): `None` if none came by then — the request stays pending,
/// and the leader, or the next one, makes it.
pub async fn group_answer(
    group: &dyn Membership,
    id: &str,
    wait: Duration,
) -> Result<Option<UpgradeAnswer>> {
    let started = Instant::now();
    loop {
        match group.upgrade_request().await {
            Ok(Some(UpgradeRequest {
                id: asked,
                answer: Some(answer),
                ..
            })) if asked == id => return Ok(Some(answer)),
            Ok(_) => {}
            Err(e) if started.elapsed() > wait => return Err(e.into()),
            Err(e) => tracing::warn!(error = %e, "reading the group's answer failed; again"),
        }
        if started.elapsed() > wait {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Fetches and loads component `hash` from the checkpoint store at
/// `store`; `None` if it was never published there.
pub(super) async fn fetch(
    engine: &Arc<SluiceEngine>,
    store: &str,
    hash: &str,
) -> Result<Option<LoadedComponent>> {
    let (engine, store, hash) = (engine.clone(), store.to_owned(), hash.to_owned());
    tokio::task::spawn_blocking(move || {
        let Some(bytes) = published_component(&store, &hash)? else {
            return Ok(None);
        };
        let origin = std::path::PathBuf::from(format!("{store}/components/{hash}.wasm"));
        Ok(Some(engine.load(&origin, &bytes)?))
    })
    .await
    .map_err(Error::task("fetching a component"))?
}

/// The worker host's source of components it does not run: the
/// pipeline's checkpoint store.
pub(super) fn source(engine: &Arc<SluiceEngine>, store: &str) -> ComponentSource {
    let (engine, store) = (engine.clone(), store.to_owned());
    ComponentSource::new(move |hash| {
        let (engine, store) = (engine.clone(), store.clone());
        Box::pin(async move {
            fetch(&engine, &store, &hash).await.map_err(|e| match e {
                Error::Runtime(e) => e,
                other => sluice_runtime::Error::Storage(sluice_storage::StorageError::backend(
                    "component store",
                    "fetching a component",
                    true,
                    other.to_string(),
                )),
            })
        })
    })
}

/// The component the pipeline's Kafka logs record a change to, when that
/// is not `current`: another host upgraded it (see
/// [`crate::storage::recorded_upgrade`]). `None` when they record none or
/// `current`, or cannot be read (the caller's own error then stands).
pub(super) async fn recorded_change(config: &HostConfig, current: &str) -> Option<String> {
    let log = config.pipeline.log.clone();
    let read = tokio::task::spawn_blocking(move || crate::storage::recorded_upgrade(&log)).await;
    let read = read.map_err(|e| e.to_string());
    match read.and_then(|r| r.map_err(|e| e.to_string())) {
        Ok(Some(to)) if to != current => Some(to),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(error = %e, "reading the pipeline's changes of component failed");
            None
        }
    }
}

/// Makes the upgrade `request` asks on this host's data directory (the
/// pipeline let go of, its last step checkpointed): the answer for the
/// group — `None` when the upgrade failed otherwise than by a refusal,
/// so its outcome is not known here (it may have been recorded before the
/// failure): the request stays pending, and the next lead settles it (a
/// pipeline that follows the record runs the new component and answers
/// so; else it is made again) — and the new component when the pipeline
/// runs it now.
pub(super) async fn perform(
    engine: &Arc<SluiceEngine>,
    config: &HostConfig,
    request: &UpgradeRequest,
) -> (Option<UpgradeAnswer>, Option<LoadedComponent>) {
    let short = sluice_embedded::meta::short_hash(&request.to).to_owned();
    let store = config.pipeline.checkpoint_store.clone().unwrap_or_default();
    let new = match fetch(engine, &store, &request.to).await {
        Ok(Some(new)) => new,
        Ok(None) => {
            let why = format!(
                "component {short} is not in the pipeline's store ({store}): `sluice upgrade \
                 --etcd` publishes it there before it asks"
            );
            return (Some(UpgradeAnswer::Refused(why)), None);
        }
        Err(e) => {
            tracing::warn!(error = %e, component = %short, "fetching the component of an upgrade failed");
            return (None, None);
        }
    };
    let made = Pipeline::upgrade(
        engine.clone(),
        new.clone(),
        config.pipeline.clone(),
        request.start_empty.clone(),
        false,
    )
    .await;
    match made {
        // Its coordinator runs every worker here: dropped, the leader
        // opens the pipeline again across the hosts.
        Ok((_, _, report)) => {
            let at = match report.checkpoint {
                Some(step) => format!("at the checkpoint of step {step}, its state carried"),
                None => "before its first step (no state to carry)".to_owned(),
            };
            let mut said = format!(
                "component {} -> {short} {at}",
                sluice_embedded::meta::short_hash(&report.from)
            );
            if !report.outputs_added.is_empty() {
                said += &format!("; new outputs: {}", report.outputs_added.join(", "));
            }
            if !report.outputs_removed.is_empty() {
                said += &format!(
                    "; outputs no longer written: {}",
                    report.outputs_removed.join(", ")
                );
            }
            (Some(UpgradeAnswer::Upgraded(said)), Some(new))
        }
        Err(Error::UpgradeRefused(why)) => (Some(UpgradeAnswer::Refused(why)), None),
        Err(e) => {
            tracing::warn!(error = %e, component = %short, "the upgrade failed: the next lead settles it");
            (None, None)
        }
    }
}
