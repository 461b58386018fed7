//! A pipeline loaded on the server, whichever way it runs: the
//! [`PipelineHandle`] the domain layer holds (status, ports, logs, the
//! commands it sends its task), the commands themselves, and the options
//! every server pipeline runs with. The runners fill a handle in; they
//! import this file, never the reverse.

use crate::history::{History, PipelineMetrics};
use crate::limits::EffectiveLimits;
use crate::types::{Desired, PipelineSpec, PipelineStatus};
use sluice_core::{CircuitPorts, PipelineShape};
use sluice_pipeline::Pipeline;
use sluice_runtime::PipelineOptions;
use sluice_storage::LogBackend;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// What the tenant wants, with a generation so that `start` on a failed
/// pipeline is a new request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Control {
    pub(super) desired: Desired,
    /// The W the tenant wants.
    pub(super) workers: u32,
    pub(super) generation: u64,
    /// The host is shutting down (checkpoint and end) or the pipeline is
    /// being deleted (end).
    pub(super) shutdown: Option<Shutdown>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shutdown {
    /// Checkpoint, then end the task.
    Checkpoint,
    /// Let a checkpoint write in flight finish, then end the task.
    Discard,
}

/// A pipeline loaded on the server.
pub struct PipelineHandle {
    /// The pipeline, when this server runs it alone (`None`: this server
    /// is one host of a pipeline across hosts).
    pub(super) pipeline: Option<Arc<Pipeline>>,
    pub(super) ports: CircuitPorts,
    pub(super) shape: PipelineShape,
    pub(super) log: Arc<dyn LogBackend>,
    pub(super) status: Arc<Mutex<PipelineStatus>>,
    /// Recent figures for the console.
    pub(super) history: Arc<Mutex<History>>,
    pub(super) control: watch::Sender<Control>,
    /// Woken when input is appended.
    pub(super) input: Arc<Notify>,
    /// The number of committed steps, for readers waiting for output.
    pub(super) committed: watch::Receiver<u64>,
    pub(super) task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Rotates pushes without a producer over input partitions.
    pub(super) next_partition: AtomicU32,
    /// Across hosts: the component this server's host of the pipeline
    /// last reported running, when it moved to another (an upgrade).
    pub(super) runs: Arc<Mutex<Option<String>>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PipelineHandle {
    /// Host memory the pipeline's log holds on this server now (RocksDB's
    /// write buffers and caches; see `LogBackend::memory_bytes`).
    pub fn log_memory_bytes(&self) -> u64 {
        self.log.memory_bytes()
    }

    /// The pipeline's current status.
    pub fn status(&self) -> PipelineStatus {
        lock(&self.status).clone()
    }

    /// The pipeline's recent figures.
    pub fn metrics(&self) -> PipelineMetrics {
        lock(&self.history).metrics()
    }

    /// The circuit's ports.
    pub fn ports(&self) -> &CircuitPorts {
        &self.ports
    }

    /// The pipeline's shape.
    pub fn shape(&self) -> &PipelineShape {
        &self.shape
    }

    /// The pipeline's logs (for a pipeline across hosts, a reader of them).
    pub fn log(&self) -> Arc<dyn LogBackend> {
        self.log.clone()
    }

    /// Whether this server is one host of a pipeline across hosts (its
    /// input is written to Kafka directly; it cannot pause or rescale from
    /// here).
    pub fn across_hosts(&self) -> bool {
        self.pipeline.is_none()
    }

    /// The number of committed steps, changing as steps commit.
    pub fn committed(&self) -> watch::Receiver<u64> {
        self.committed.clone()
    }

    /// The partition a push without a producer starts at (rotating).
    pub fn next_partition(&self) -> u32 {
        self.next_partition.fetch_add(1, Ordering::Relaxed)
    }

    /// Wakes the task: input was appended.
    pub fn input_appended(&self) {
        self.input.notify_one();
    }

    /// Asks the task for `workers` workers: a running pipeline changes its
    /// layout between two steps.
    pub fn set_workers(&self, workers: u32) {
        self.control.send_modify(|c| c.workers = workers);
    }

    /// The component (SHA-256, hex) this server's host of a pipeline across
    /// hosts last reported running, when it moved to another after the
    /// pipeline was loaded (an upgrade, here or elsewhere); `None` until
    /// then.
    pub fn runs_component(&self) -> Option<String> {
        lock(&self.runs).clone()
    }

    /// Records that the pipeline runs component `name` (SHA-256 `hash`) now:
    /// a pipeline across hosts whose component its hosts changed (also
    /// what its host is taken to run, until it reports another).
    pub fn set_component(&self, name: &str, hash: &str) {
        *lock(&self.runs) = Some(hash.to_owned());
        let mut s = lock(&self.status);
        s.component = name.to_owned();
        s.component_hash = hash.to_owned();
    }

    /// Asks the task for `desired`.
    pub fn set(&self, desired: Desired) {
        self.control.send_modify(|c| {
            c.desired = desired;
            c.generation += 1;
        });
    }

    /// Ends the task: with `checkpoint`, it checkpoints first (host
    /// shutdown); without, it only lets a checkpoint write in flight finish
    /// (the pipeline is being deleted).
    pub async fn shutdown(&self, checkpoint: bool) {
        self.control.send_modify(|c| {
            c.shutdown = Some(if checkpoint {
                Shutdown::Checkpoint
            } else {
                Shutdown::Discard
            });
        });
        let task = lock(&self.task).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// How a server pipeline runs: the spec's settings and the tenant's
/// limits.
pub(super) fn options(spec: &PipelineSpec, limits: &EffectiveLimits) -> PipelineOptions {
    PipelineOptions {
        name: String::new(),
        max_batch: spec.max_batch.max(1),
        checkpoint_every_steps: spec.checkpoint_every_steps.max(1),
        checkpoint_interval: Duration::from_millis(spec.checkpoint_interval_ms.max(10)),
        inherit_guest_stderr: false,
        config: Vec::new(),
        max_output_per_step: Some(limits.max_output),
        incremental_checkpoints: true,
        // Output is served to clients as JSON lines.
        check_output_json: true,
        placement_hint: Vec::new(),
        bad_records: spec.bad_records.clone(),
        replicas: spec.replicas.max(1),
        // Set where the pipeline runs across hosts (each host's own, the
        // group's zones).
        zones: Default::default(),
        own_host: None,
        // Set by the pipeline from its stored metadata.
        upgraded_at: None,
        retain_input: spec.retain_input,
    }
}
