//! The coordinator's workers: each an instance in this process or a
//! worker on another host ([`AnyWorker`]), started on the slot the
//! placement gives it, and the coordinator's exchange between them for one
//! placement.

use super::options::PipelineOptions;
use crate::bindings::Batch;
use crate::engine::{LoadedComponent, SluiceEngine};
use crate::error::{Error, Result};
use crate::exchange::{Exchange, Placement};
use crate::hosts::{MeshPlan, RemoteHost, RemoteWorker};
use crate::step_io::Spare;
use crate::worker::{Snapshot, Worker, WorkerInfo};
use sluice_core::{Layout, StepLimits};
use std::sync::Arc;
use std::time::Duration;

/// A worker in this process or on another host: what the coordinator
/// drives.
pub(crate) enum AnyWorker {
    /// An instance in this process.
    Local(Box<Worker>),
    /// A worker on another host.
    Remote(RemoteWorker),
}

impl AnyWorker {
    pub(crate) async fn step(
        &mut self,
        step: u64,
        time_ms: u64,
        inputs: Vec<Batch>,
        spare: &Spare,
    ) -> Result<Vec<Batch>> {
        match self {
            AnyWorker::Local(w) => {
                let r = w.step(step, time_ms, &inputs).await;
                spare.keep(inputs);
                r
            }
            AnyWorker::Remote(w) => w.step(step, time_ms, inputs).await,
        }
    }

    pub(crate) fn set_step_limits(&mut self, limits: StepLimits) {
        match self {
            AnyWorker::Local(w) => w.set_step_limits(limits),
            AnyWorker::Remote(w) => w.set_step_limits(limits),
        }
    }

    pub(crate) fn take_fuel_used(&mut self) -> u64 {
        match self {
            AnyWorker::Local(w) => w.take_fuel_used(),
            AnyWorker::Remote(w) => w.take_fuel_used(),
        }
    }

    pub(crate) async fn snapshot(&mut self, changed_only: bool) -> Result<Snapshot> {
        match self {
            AnyWorker::Local(w) => w.snapshot(changed_only).await,
            AnyWorker::Remote(w) => w.snapshot(changed_only).await,
        }
    }

    pub(crate) async fn restore(&mut self, pieces: Vec<(u32, Vec<u8>)>) -> Result<()> {
        match self {
            AnyWorker::Local(w) => w.restore(pieces).await,
            AnyWorker::Remote(w) => w.restore(pieces).await,
        }
    }

    pub(crate) async fn export_shards(&mut self, shards: &[u32]) -> Result<Vec<(u32, Vec<u8>)>> {
        match self {
            AnyWorker::Local(w) => w.export_shards(shards).await,
            AnyWorker::Remote(w) => w.export_shards(shards).await,
        }
    }

    pub(crate) async fn relayout(
        &mut self,
        workers: u32,
        exchange: &Arc<Exchange>,
        mesh: &MeshPlan,
    ) -> Result<()> {
        match self {
            AnyWorker::Local(w) => w.relayout(workers, exchange.clone()).await,
            AnyWorker::Remote(w) => w.relayout(workers, mesh).await,
        }
    }

    /// Shuffles through `exchange` (here) or as `mesh` says (there) from
    /// the next step on.
    pub(crate) async fn rewire(&mut self, exchange: &Arc<Exchange>, mesh: &MeshPlan) -> Result<()> {
        match self {
            AnyWorker::Local(w) => {
                w.rewire(exchange.clone());
                Ok(())
            }
            AnyWorker::Remote(w) => w.rewire(mesh).await,
        }
    }
}

/// Starts an instance of worker `w` of `workers` on slot `slot` (0 this
/// process, `i` `hosts[i - 1]`): its primary, on `mesh.slot(w)`, or a
/// follower.
#[allow(clippy::too_many_arguments)]
pub(super) async fn start_worker(
    engine: &SluiceEngine,
    component: &LoadedComponent,
    options: &PipelineOptions,
    hosts: &[Arc<RemoteHost>],
    limits: StepLimits,
    w: u32,
    workers: u32,
    slot: u32,
    exchange: &Arc<Exchange>,
    mesh: &MeshPlan,
) -> Result<AnyWorker> {
    let info = WorkerInfo {
        worker: w,
        workers,
        pipeline: options.name.clone(),
        config: options.config.clone(),
    };
    let slot = slot as usize;
    if slot > 0 {
        let host = hosts[slot - 1].clone();
        return Ok(AnyWorker::Remote(
            RemoteWorker::start(
                host,
                info,
                &component.hash,
                mesh,
                limits,
                options.inherit_guest_stderr,
            )
            .await?,
        ));
    }
    Ok(AnyWorker::Local(Box::new(
        Worker::start(
            engine,
            component,
            info,
            Some(exchange.clone()),
            options.inherit_guest_stderr,
        )
        .await?,
    )))
}

/// The coordinator's exchange for `layout` with workers placed on slots
/// `placement` (slot 0 here, slot `i` `hosts[i - 1]`; a fresh session)
/// and their followers on `followers`, and the plan the hosts are told;
/// the hosts' frames go to it from now on.
pub(super) fn coordinator_exchange(
    layout: &Layout,
    hosts: &[Arc<RemoteHost>],
    placement: &[u32],
    followers: &[Vec<u32>],
) -> Result<(Arc<Exchange>, MeshPlan)> {
    let slots: Vec<u32> = placement.to_vec();
    let session = if hosts.is_empty() {
        0
    } else {
        getrandom::u64()
            .map_err(|e| Error::remote("the coordinator", format!("the OS random source: {e}")))?
    };
    let plan = MeshPlan::new(
        session,
        slots.clone(),
        followers.to_vec(),
        std::iter::once(String::new())
            .chain(hosts.iter().map(|h| h.addr().to_owned()))
            .collect(),
        layout.shards.clone(),
    );
    let exchange = if hosts.is_empty() {
        Exchange::new(layout)
    } else {
        let links = std::iter::once(None)
            .chain(hosts.iter().map(|h| Some(h.link())))
            .collect();
        Exchange::across(
            layout,
            Placement {
                session,
                slot: 0,
                slots,
                followers: followers.to_vec(),
                links,
                // A waiting worker gives a host up when its connection has
                // delivered nothing for the host's session timeout.
                silence: hosts
                    .iter()
                    .map(|h| h.session_timeout())
                    .max()
                    .unwrap_or(Duration::MAX),
            },
        )
    };
    for (i, h) in hosts.iter().enumerate() {
        h.set_exchange(exchange.clone(), i as u32 + 1);
    }
    Ok((exchange, plan))
}
