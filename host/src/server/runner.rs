//! One running pipeline on the server: its storage, its coordinator task and
//! the status the API reports.
//!
//! The task owns the [`Coordinator`]. It runs steps while the pipeline is
//! wanted running and has input, checkpoints when the interval passes (also
//! when idle), keeps the instances but runs nothing while paused, and
//! checkpoints and unloads them when stopped. A guest failure or a limit
//! fails only this pipeline, with the error kept in its status; a storage
//! error is retried by recovering (reopening the coordinator).

use super::registry::{Desired, EffectiveLimits, PipelineSpec};
use crate::error::Error;
use crate::runtime::coordinator::{Coordinator, Layout, PipelineOptions};
use crate::runtime::engine::{Limits, LoadedComponent, SluiceEngine};
use crate::runtime::worker::CircuitShape;
use crate::storage::db::{self, PipelineDb};
use crate::storage::meta::{self, PipelineMeta};
use crate::storage::{CheckpointStore, EmbeddedLog, Guarded, LogBackend, RocksCheckpointStore};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};

/// Where the server's Kafka pipelines keep their logs (set by the admin
/// with `sluice serve --kafka-brokers`).
#[derive(Debug, Clone)]
pub struct KafkaSettings {
    /// Bootstrap servers.
    pub brokers: String,
    /// Replication factor of the topics the server creates.
    pub replication: i32,
}

/// What the API reports about a pipeline.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct PipelineStatus {
    /// The pipeline's name.
    pub name: String,
    /// The component it runs.
    pub component: String,
    /// The component's SHA-256.
    pub component_hash: String,
    /// `starting`, `running`, `idle`, `paused`, `stopped` or `failed`.
    pub state: String,
    /// Number of workers.
    pub workers: u32,
    /// Input ports.
    pub inputs: Vec<String>,
    /// Output ports.
    pub outputs: Vec<String>,
    /// Steps committed in total.
    pub steps: u64,
    /// Input events consumed since the host started the pipeline.
    pub events_in: u64,
    /// Output events committed since the host started the pipeline.
    pub events_out: u64,
    /// Per worker: `input/partition` → offset consumed up to.
    pub frontiers: Vec<BTreeMap<String, u64>>,
    /// Input events appended but not yet consumed.
    pub input_lag: u64,
    /// The step of the newest checkpoint.
    pub last_checkpoint: Option<u64>,
    /// Fuel the guests burned since the host started the pipeline.
    pub fuel_used: u64,
    /// Why the pipeline failed (or the last error it recovered from).
    pub last_error: Option<String>,
}

/// A command to the pipeline's task: what the tenant wants, with a
/// generation so that `start` on a failed pipeline is a new request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Control {
    /// Wanted state.
    pub desired: Desired,
    /// Bumped by every command.
    pub generation: u64,
    /// The host is shutting down: checkpoint and exit (no state change).
    pub shutdown: bool,
}

/// A pipeline loaded on the server.
pub struct PipelineHandle {
    /// The owning tenant.
    pub tenant: String,
    /// As created.
    pub spec: PipelineSpec,
    /// The circuit's ports.
    pub shape: CircuitShape,
    /// Its logs.
    pub log: Arc<dyn LogBackend>,
    status: Arc<Mutex<PipelineStatus>>,
    control: watch::Sender<Control>,
    /// Woken when input is appended.
    pub input: Arc<Notify>,
    /// The number of committed steps, for readers waiting for output.
    pub committed: watch::Receiver<u64>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Rotates pushes over input partitions.
    pub next_partition: std::sync::atomic::AtomicU32,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Everything the task needs to (re)open the coordinator.
struct Runtime {
    engine: Arc<SluiceEngine>,
    component: LoadedComponent,
    db: Arc<PipelineDb>,
    log: Arc<dyn LogBackend>,
    meta: PipelineMeta,
    options: PipelineOptions,
    snapshot_version: u32,
    tenant: String,
    /// The pipeline's name (metrics labels, logs).
    pipeline: String,
}

impl PipelineHandle {
    /// Opens (or creates) the pipeline's storage in `dir` and starts its
    /// task in state `desired`.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        base: &SluiceEngine,
        tenant: &str,
        spec: PipelineSpec,
        component: LoadedComponent,
        shape: CircuitShape,
        limits: EffectiveLimits,
        dir: &Path,
        desired: Desired,
        kafka: Option<KafkaSettings>,
    ) -> crate::Result<Arc<PipelineHandle>> {
        let engine = Arc::new(base.with_limits(Limits {
            memory: limits.memory as usize,
            fuel_per_call: limits.fuel,
            deadline: Duration::from_millis(limits.deadline_ms),
        }));
        let db = db::open(dir)?;
        let (log, id, log_kind): (Arc<dyn LogBackend>, String, String) = match kafka {
            None => (
                Arc::new(EmbeddedLog::open(db.clone())?),
                format!("{tenant}/{}/{}", spec.name, meta::new_pipeline_id(dir)),
                "embedded".into(),
            ),
            #[cfg(feature = "kafka")]
            Some(k) => {
                // Topics `<tenant>.<pipeline>.<port>`: a tenant cannot name
                // another tenant's topics.
                let name = format!("{tenant}.{}", spec.name);
                let mut config = crate::storage::KafkaConfig::new(k.brokers, &name);
                config.replication = k.replication;
                config.output_partitions = spec.workers;
                let log = crate::storage::KafkaLog::open(config)?;
                (Arc::new(log), name.clone(), format!("kafka:{name}"))
            }
            #[cfg(not(feature = "kafka"))]
            Some(_) => {
                return Err(Error::Config(
                    "this sluice was built without Kafka support".into(),
                ));
            }
        };
        let wanted = PipelineMeta {
            id,
            component: component.hash.clone(),
            inputs: shape
                .inputs
                .iter()
                .map(|n| (n.clone(), spec.workers))
                .collect(),
            outputs: shape.outputs.clone(),
            workers: spec.workers,
            log: log_kind.clone(),
        };
        let meta = meta::ensure(&db, &wanted)?;
        for (name, partitions) in &meta.inputs {
            log.create_input(name, *partitions)?;
        }
        let last_checkpoint = RocksCheckpointStore::open(db.clone())
            .latest_meta()?
            .map(|m| m.step);
        // Kafka's step log is read after fencing (a dead predecessor's open
        // transaction would hold the read back): the coordinator reports it.
        let steps = if log_kind == "embedded" {
            log.last_step()?.map_or(0, |s| s + 1)
        } else {
            0
        };
        let status = Arc::new(Mutex::new(PipelineStatus {
            name: spec.name.clone(),
            component: spec.component.clone(),
            component_hash: component.hash.clone(),
            state: "starting".into(),
            workers: spec.workers,
            inputs: shape.inputs.clone(),
            outputs: shape.outputs.clone(),
            steps,
            events_in: 0,
            events_out: 0,
            frontiers: Vec::new(),
            input_lag: 0,
            last_checkpoint,
            fuel_used: 0,
            last_error: None,
        }));
        let (control, control_rx) = watch::channel(Control {
            desired,
            generation: 0,
            shutdown: false,
        });
        let (committed_tx, committed) = watch::channel(steps);
        let input = Arc::new(Notify::new());
        let runtime = Runtime {
            engine,
            component,
            db,
            log: log.clone(),
            options: PipelineOptions {
                name: meta.id.clone(),
                max_batch: spec.max_batch.max(1),
                checkpoint_every_steps: spec.checkpoint_every_steps.max(1),
                checkpoint_interval: Duration::from_millis(spec.checkpoint_interval_ms.max(10)),
                inherit_guest_stderr: false,
                config: Vec::new(),
                max_output_per_step: Some(limits.max_output),
            },
            meta,
            snapshot_version: shape.snapshot_version,
            tenant: tenant.to_owned(),
            pipeline: spec.name.clone(),
        };
        let task = tokio::spawn(drive(
            runtime,
            status.clone(),
            control_rx,
            input.clone(),
            committed_tx,
        ));
        Ok(Arc::new(PipelineHandle {
            tenant: tenant.to_owned(),
            spec,
            shape,
            log,
            status,
            control,
            input,
            committed,
            task: Mutex::new(Some(task)),
            next_partition: std::sync::atomic::AtomicU32::new(0),
        }))
    }

    /// The pipeline's current status.
    pub fn status(&self) -> PipelineStatus {
        lock(&self.status).clone()
    }

    /// Asks the task for `desired`.
    pub fn set(&self, desired: Desired) {
        self.control.send_modify(|c| {
            c.desired = desired;
            c.generation += 1;
        });
    }

    /// Stops the task: with `checkpoint`, it checkpoints first (host
    /// shutdown); without, it just ends (the pipeline is being deleted).
    pub async fn shutdown(&self, checkpoint: bool) {
        self.control.send_modify(|c| {
            c.shutdown = true;
            if !checkpoint {
                c.desired = Desired::Paused;
            }
        });
        let task = lock(&self.task).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl Runtime {
    async fn open(&self) -> crate::Result<Coordinator> {
        let checkpoints: Arc<dyn crate::storage::CheckpointStore> =
            Arc::new(RocksCheckpointStore::open(self.db.clone()));
        let log = self.log.clone();
        let guarded = Arc::new(Guarded::new(
            log,
            checkpoints,
            self.meta.inputs.iter().map(|(n, _)| n.clone()).collect(),
            self.meta.outputs.clone(),
            self.meta.workers as usize,
        )?);
        Coordinator::open(
            self.engine.clone(),
            &self.component,
            guarded,
            Layout {
                inputs: self.meta.inputs.clone(),
                outputs: self.meta.outputs.clone(),
                workers: self.meta.workers,
                snapshot_version: self.snapshot_version,
            },
            self.options.clone(),
        )
        .await
    }

    /// Appended but unconsumed input events.
    fn lag(&self, c: &Coordinator) -> u64 {
        let mut lag = 0;
        for frontier in c.frontiers() {
            for (id, offset) in frontier {
                if let Some((name, _)) = self.meta.inputs.get(id.input as usize)
                    && let Ok((_, high)) = self.log.watermarks(name, id.partition)
                {
                    lag += high.saturating_sub(*offset);
                }
            }
        }
        lag
    }
}

fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::Trap { .. } => "trap",
        Error::FuelExhausted { .. } => "fuel",
        Error::DeadlineExceeded { .. } => "deadline",
        Error::MemoryExceeded { .. } => "memory",
        Error::OutputLimit { .. } => "output_limit",
        Error::Guest { .. } => "guest",
        Error::Nondeterministic { .. } => "nondeterministic",
        e if e.is_transient() => "storage",
        _ => "other",
    }
}

/// The pipeline's task.
async fn drive(
    rt: Runtime,
    status: Arc<Mutex<PipelineStatus>>,
    mut control: watch::Receiver<Control>,
    input: Arc<Notify>,
    committed: watch::Sender<u64>,
) {
    let labels = [
        ("tenant", rt.tenant.clone()),
        ("pipeline", rt.pipeline.clone()),
    ];
    let tenant_label = [("tenant", rt.tenant.clone())];
    let mut coordinator: Option<Coordinator> = None;
    let mut failed_generation: Option<u64> = None;
    let mut retries = 0u32;
    let set_state = |state: &str| lock(&status).state = state.to_owned();
    loop {
        let ctl = *control.borrow_and_update();
        if ctl.shutdown {
            if let Some(c) = coordinator.as_mut() {
                // Host shutdown checkpoints; a deletion only lets a write in
                // flight finish, so the storage can be removed after.
                let _ = if ctl.desired == Desired::Paused {
                    c.settle().await
                } else {
                    c.finish().await
                };
            }
            return;
        }
        if failed_generation == Some(ctl.generation) || ctl.desired != Desired::Running {
            match ctl.desired {
                Desired::Stopped => {
                    if let Some(mut c) = coordinator.take() {
                        match c.finish().await {
                            Ok(()) => lock(&status).last_checkpoint = c.checkpointed_step(),
                            Err(e) => {
                                lock(&status).last_error = Some(format!("checkpoint on stop: {e}"));
                            }
                        }
                    }
                    if failed_generation != Some(ctl.generation) {
                        set_state("stopped");
                    }
                }
                Desired::Paused if failed_generation != Some(ctl.generation) => set_state("paused"),
                _ => {}
            }
            if control.changed().await.is_err() {
                return;
            }
            continue;
        }
        failed_generation = None;
        let c = match coordinator.as_mut() {
            Some(c) => c,
            None => {
                set_state("starting");
                match rt.open().await {
                    Ok(c) => coordinator.insert(c),
                    Err(e) => {
                        fail(
                            &rt,
                            &status,
                            &e,
                            &labels,
                            &mut retries,
                            &mut failed_generation,
                            ctl,
                        );
                        continue;
                    }
                }
            }
        };
        let before = c.stats().clone();
        let started = Instant::now();
        let result = c.step().await;
        let result = match result {
            Ok(false) if c.checkpoint_due() => c.checkpoint().await.map(|()| false),
            r => r,
        };
        match result {
            Ok(progressed) => {
                retries = 0;
                let s = c.stats().clone();
                if progressed {
                    metrics::histogram!("sluice_step_seconds", &labels)
                        .record(started.elapsed().as_secs_f64());
                    metrics::counter!("sluice_steps_total", &labels).increment(1);
                    metrics::counter!("sluice_events_in_total", &labels)
                        .increment(s.events_in - before.events_in);
                    metrics::counter!("sluice_events_out_total", &labels)
                        .increment(s.events_out - before.events_out);
                    metrics::counter!("sluice_fuel_consumed_total", &tenant_label)
                        .increment(s.fuel_used - before.fuel_used);
                }
                if s.checkpoints > before.checkpoints {
                    metrics::counter!("sluice_checkpoints_total", &labels).increment(1);
                    metrics::histogram!("sluice_checkpoint_seconds", &labels)
                        .record(c.last_checkpoint_time().as_secs_f64());
                }
                let lag = rt.lag(c);
                {
                    let mut st = lock(&status);
                    st.state = if progressed { "running" } else { "idle" }.into();
                    st.steps = c.next_step();
                    st.events_in = s.events_in;
                    st.events_out = s.events_out;
                    st.fuel_used = s.fuel_used;
                    st.input_lag = lag;
                    st.last_checkpoint = c.checkpointed_step();
                    st.frontiers = c
                        .frontiers()
                        .iter()
                        .map(|f| {
                            f.iter()
                                .map(|(id, o)| {
                                    let name = rt
                                        .meta
                                        .inputs
                                        .get(id.input as usize)
                                        .map_or("?", |(n, _)| n.as_str());
                                    (format!("{name}/{}", id.partition), *o)
                                })
                                .collect()
                        })
                        .collect();
                }
                if progressed {
                    committed.send_replace(c.next_step());
                } else {
                    tokio::select! {
                        _ = input.notified() => {}
                        _ = control.changed() => {}
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    }
                }
            }
            Err(e) => {
                coordinator = None;
                fail(
                    &rt,
                    &status,
                    &e,
                    &labels,
                    &mut retries,
                    &mut failed_generation,
                    ctl,
                );
                if e.is_transient() {
                    tokio::time::sleep(Duration::from_millis(100 << retries.min(6))).await;
                }
            }
        }
    }
}

/// Records an error: transient ones are retried (up to 5 times in a row),
/// the rest fail the pipeline until the tenant starts it again.
fn fail(
    rt: &Runtime,
    status: &Mutex<PipelineStatus>,
    e: &Error,
    labels: &[(&'static str, String); 2],
    retries: &mut u32,
    failed_generation: &mut Option<u64>,
    ctl: Control,
) {
    metrics::counter!(
        "sluice_errors_total",
        &[
            ("tenant", labels[0].1.clone()),
            ("pipeline", labels[1].1.clone()),
            ("kind", error_kind(e).to_owned()),
        ]
    )
    .increment(1);
    let mut st = lock(status);
    st.last_error = Some(e.to_string());
    if e.is_transient() && *retries < 5 {
        *retries += 1;
        tracing::warn!(tenant = %rt.tenant, pipeline = %rt.pipeline, "recovering after a storage error: {e}");
        return;
    }
    tracing::warn!(tenant = %rt.tenant, pipeline = %rt.pipeline, "pipeline failed: {e}");
    st.state = "failed".into();
    *failed_generation = Some(ctl.generation);
}
