//! One pipeline on the server: its [`Pipeline`], the task that drives it
//! and the status the API reports.
//!
//! The task is a small state machine over [`Phase`]: it opens the
//! coordinator when the pipeline is wanted running, runs steps while there
//! is input, checkpoints when the interval passes (also when idle), keeps
//! the instances but runs nothing while paused, and checkpoints and unloads
//! them when stopped. A transient error is recovered from as the
//! [`RecoveryPolicy`] says; any other error fails only this pipeline, kept
//! in its status until the tenant starts it again.

use crate::history::{History, PipelineMetrics, WorkerFigures, now_ms};
use crate::service::EffectiveLimits;
use crate::types::{Desired, PipelineSpec, PipelineState, PipelineStatus};
use sluice_core::{CircuitPorts, PipelineShape};
use sluice_pipeline::{LogConfig, Pipeline, PipelineConfig, RecoveryPolicy};
use sluice_runtime::{Coordinator, LoadedComponent, PipelineOptions, SluiceEngine};
use sluice_storage::LogBackend;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};

#[cfg(feature = "kafka")]
mod hosted;

/// Where the server's Kafka pipelines keep their logs (set by the admin
/// with `sluice serve --kafka-brokers`).
#[derive(Debug, Clone)]
pub struct KafkaSettings {
    /// Bootstrap servers.
    pub brokers: String,
    /// Replication factor of the topics the server creates.
    pub replication: i32,
    /// How the server runs pipelines across hosts, if it does.
    pub hosts: Option<HostsSettings>,
}

/// How the server runs pipelines across hosts (`sluice serve --hosts-etcd
/// …`): every server given the same settings on which a tenant creates a
/// pipeline with `"across_hosts": true` runs it as one host of it, like
/// `sluice host`.
#[derive(Clone)]
pub struct HostsSettings {
    /// etcd endpoints for the pipelines' groups.
    pub etcd: Vec<String>,
    /// The checkpoint store every server reaches (a URL); each pipeline's
    /// checkpoints are under `<store>/<its Kafka name>`.
    pub store: String,
    /// The secret the servers share (they accept coordinators that prove
    /// it).
    pub secret: Vec<u8>,
    /// The address this server's worker listeners bind (any port), which
    /// the other servers dial.
    pub bind: std::net::IpAddr,
    /// This server's name in every pipeline's group (stable across
    /// restarts).
    pub name: String,
    /// A host that renews nothing for this long leaves a group.
    pub session_timeout: Duration,
    /// Mutual TLS on every connection between the servers, if set.
    pub tls: Option<sluice_runtime::Tls>,
}

impl std::fmt::Debug for HostsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostsSettings")
            .field("etcd", &self.etcd)
            .field("store", &self.store)
            .field("bind", &self.bind)
            .field("name", &self.name)
            .field("session_timeout", &self.session_timeout)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// What the tenant wants, with a generation so that `start` on a failed
/// pipeline is a new request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Control {
    desired: Desired,
    /// The W the tenant wants.
    workers: u32,
    generation: u64,
    /// The host is shutting down (checkpoint and end) or the pipeline is
    /// being deleted (end).
    shutdown: Option<Shutdown>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shutdown {
    /// Checkpoint, then end the task.
    Checkpoint,
    /// Let a checkpoint write in flight finish, then end the task.
    Discard,
}

/// A pipeline loaded on the server.
pub struct PipelineHandle {
    /// The pipeline, when this server runs it alone (`None`: this server
    /// is one host of a pipeline across hosts).
    pipeline: Option<Arc<Pipeline>>,
    ports: CircuitPorts,
    shape: PipelineShape,
    log: Arc<dyn LogBackend>,
    status: Arc<Mutex<PipelineStatus>>,
    /// Recent figures for the console.
    history: Arc<Mutex<History>>,
    control: watch::Sender<Control>,
    /// Woken when input is appended.
    input: Arc<Notify>,
    /// The number of committed steps, for readers waiting for output.
    committed: watch::Receiver<u64>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Rotates pushes without a producer over input partitions.
    next_partition: AtomicU32,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PipelineHandle {
    /// Opens (or creates) the pipeline's storage in `dir` and starts its
    /// task in state `desired`.
    #[allow(clippy::too_many_arguments)]
    pub async fn open(
        base: &SluiceEngine,
        tenant: &str,
        spec: PipelineSpec,
        component: LoadedComponent,
        ports: CircuitPorts,
        limits: EffectiveLimits,
        dir: PathBuf,
        desired: Desired,
        kafka: Option<KafkaSettings>,
    ) -> sluice_pipeline::Result<Arc<PipelineHandle>> {
        let engine = Arc::new(base.with_limits(limits.instance));
        if spec.across_hosts {
            #[cfg(feature = "kafka")]
            if let Some(kafka) = kafka {
                return hosted::open(
                    engine, tenant, spec, component, ports, limits, dir, desired, kafka,
                )
                .await;
            }
            return Err(sluice_core::ConfigError::Invalid(
                "a pipeline across hosts needs a server with Kafka brokers and --hosts-etcd".into(),
            )
            .into());
        }
        let log = match kafka {
            None => LogConfig::default(),
            #[cfg(feature = "kafka")]
            Some(k) => {
                // Topics `<kafka name>.<port>`: a tenant cannot name another
                // tenant's topics (pipelines created before the server chose
                // names use `<tenant>.<pipeline>`).
                let name = spec
                    .kafka_name
                    .clone()
                    .unwrap_or_else(|| format!("{tenant}.{}", spec.name));
                let mut config = sluice_kafka::KafkaConfig::new(k.brokers, name);
                config.replication = k.replication;
                config.output_partitions = spec.workers;
                LogConfig::Kafka { config }
            }
            #[cfg(not(feature = "kafka"))]
            Some(_) => {
                return Err(sluice_core::ConfigError::Invalid(
                    "this sluice was built without Kafka support".into(),
                )
                .into());
            }
        };
        let embedded = matches!(log, LogConfig::Embedded { .. });
        let config = PipelineConfig {
            data: dir,
            workers: spec.workers,
            // The spec's W is what the tenant wants: a pipeline stored with
            // another (a scale that did not finish) changes layout.
            rescale_to: Some(spec.workers),
            partitions: spec.partitions,
            log,
            // The server keeps checkpoints in each pipeline's directory.
            checkpoint_store: None,
            options: options(&spec, &limits),
            id_prefix: format!("{tenant}/{}/", spec.name),
        };
        let pipeline = Arc::new(Pipeline::open_described(engine, component, ports, config).await?);
        let storage = pipeline.storage().clone();
        // Kafka's step log is read after fencing (a dead predecessor's open
        // transaction would hold the read back): the coordinator reports it.
        let (steps, last_checkpoint) = tokio::task::spawn_blocking(move || {
            let steps = if embedded {
                storage.log.last_step()?.map_or(0, |s| s + 1)
            } else {
                0
            };
            let checkpoint = storage.checkpoints.latest_meta()?.map(|m| m.step);
            Ok::<_, sluice_storage::StorageError>((steps, checkpoint))
        })
        .await
        .map_err(|source| {
            sluice_pipeline::Error::Runtime(sluice_runtime::Error::Task {
                what: "reading the pipeline's status".into(),
                source,
            })
        })??;
        let shape = pipeline.shape().clone();
        let status = Arc::new(Mutex::new(PipelineStatus::starting(
            &spec,
            &pipeline.component().hash,
            &shape,
            steps,
            last_checkpoint,
        )));
        let (control, control_rx) = watch::channel(Control {
            desired,
            workers: spec.workers,
            generation: 0,
            shutdown: None,
        });
        let (committed_tx, committed) = watch::channel(steps);
        let input = Arc::new(Notify::new());
        let history = Arc::new(Mutex::new(History::default()));
        let runner = Runner {
            pipeline: pipeline.clone(),
            status: status.clone(),
            history: history.clone(),
            control: control_rx,
            input: input.clone(),
            committed: committed_tx,
            metrics: Metrics::new(tenant, &spec.name),
            policy: RecoveryPolicy::default(),
            tenant: tenant.to_owned(),
            name: spec.name.clone(),
            retention: spec.output_retention_steps,
            retained_below: 0,
        };
        let task = tokio::spawn(runner.run());
        Ok(Arc::new(PipelineHandle {
            ports: pipeline.ports().clone(),
            shape: pipeline.shape().clone(),
            log: pipeline.storage().log.clone(),
            pipeline: Some(pipeline),
            status,
            history,
            control,
            input,
            committed,
            task: Mutex::new(Some(task)),
            next_partition: AtomicU32::new(0),
        }))
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
fn options(spec: &PipelineSpec, limits: &EffectiveLimits) -> PipelineOptions {
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
    }
}

/// Where the runner is.
enum Phase {
    /// No coordinator (not started yet, stopped, or after an error).
    Cold,
    /// A coordinator with its instances.
    Live(Box<Coordinator>),
    /// Failed at this control generation: waits for a new command.
    Failed(u64),
}

/// The pipeline's task.
struct Runner {
    pipeline: Arc<Pipeline>,
    status: Arc<Mutex<PipelineStatus>>,
    history: Arc<Mutex<History>>,
    control: watch::Receiver<Control>,
    input: Arc<Notify>,
    committed: watch::Sender<u64>,
    metrics: Metrics,
    policy: RecoveryPolicy,
    tenant: String,
    name: String,
    /// Steps of output to keep (`None`: all).
    retention: Option<u64>,
    /// Output below this step is already deleted.
    retained_below: u64,
}

impl Runner {
    async fn run(mut self) {
        let mut phase = Phase::Cold;
        let mut in_a_row = 0;
        loop {
            let ctl = *self.control.borrow_and_update();
            if let Some(how) = ctl.shutdown {
                if let Phase::Live(c) = &mut phase {
                    let _ = match how {
                        Shutdown::Checkpoint => c.finish().await,
                        Shutdown::Discard => c.settle().await,
                    };
                }
                return;
            }
            if let Phase::Failed(generation) = phase {
                if generation == ctl.generation {
                    // Stop still unloads a failed pipeline's instances
                    // (there are none) but keeps it shown as failed.
                    self.wait_for_command().await;
                    continue;
                }
                phase = Phase::Cold;
            }
            match ctl.desired {
                Desired::Stopped => {
                    if let Phase::Live(mut c) = std::mem::replace(&mut phase, Phase::Cold) {
                        match c.finish().await {
                            Ok(()) => lock(&self.status).last_checkpoint = c.checkpointed_step(),
                            Err(e) => {
                                lock(&self.status).last_error =
                                    Some(sluice_core::text::guest_message(&format!(
                                        "checkpoint on stop: {e}"
                                    )));
                            }
                        }
                    }
                    self.set_state(PipelineState::Stopped);
                    self.wait_for_command().await;
                }
                Desired::Paused => {
                    self.set_state(PipelineState::Paused);
                    self.wait_for_command().await;
                }
                Desired::Running => {
                    let result = match &mut phase {
                        Phase::Live(c) if c.workers() != ctl.workers => {
                            self.rescale(c, ctl.workers).await
                        }
                        Phase::Live(c) => self.step(c).await,
                        _ => {
                            self.set_state(PipelineState::Starting);
                            match self.pipeline.coordinator().await {
                                Ok(c) => {
                                    phase = Phase::Live(Box::new(c));
                                    continue;
                                }
                                Err(e) => Err(e),
                            }
                        }
                    };
                    match result {
                        Ok(()) => in_a_row = 0,
                        Err(e) if is_capacity(&e) => {
                            // The instance pool is full for now (another
                            // pipeline's probe or a race with admission):
                            // wait for room, never fail for it.
                            phase = Phase::Cold;
                            self.record_error(&e, false);
                            self.set_state(PipelineState::Starting);
                            tokio::select! {
                                _ = tokio::time::sleep(self.policy.backoff(in_a_row.min(4))) => {}
                                _ = self.control.changed() => {}
                            }
                            in_a_row += 1;
                        }
                        Err(e) => {
                            phase = Phase::Cold;
                            match self.policy.retry_after(&e, in_a_row) {
                                Some(pause) => {
                                    in_a_row += 1;
                                    self.record_error(&e, false);
                                    tokio::time::sleep(pause).await;
                                }
                                None => {
                                    in_a_row = 0;
                                    self.record_error(&e, true);
                                    phase = Phase::Failed(ctl.generation);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Runs one step (or a due checkpoint when there is no input), then
    /// reports; with nothing to do, waits for input, a command or the
    /// checkpoint interval.
    async fn step(&mut self, c: &mut Coordinator) -> sluice_pipeline::Result<()> {
        let before = c.stats().clone();
        let started = Instant::now();
        let progressed = match c.step().await? {
            false if c.checkpoint_due() => {
                c.checkpoint().await?;
                false
            }
            p => p,
        };
        let took = started.elapsed();
        self.metrics.record(c, &before, progressed, took);
        self.remember(c, &before, progressed.then_some(took));
        self.retain(c.next_step(), c.checkpointed_step()).await?;
        let lag = self.pipeline.storage().lag(c.frontiers());
        self.report(c, progressed, lag);
        if progressed {
            self.committed.send_replace(c.next_step());
        } else {
            tokio::select! {
                _ = self.input.notified() => {}
                _ = self.control.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
        Ok(())
    }

    /// Output retention: deletes output older than the last `retention`
    /// steps, never a step a recovery may replay (above the newest
    /// checkpoint).
    async fn retain(
        &mut self,
        next_step: u64,
        checkpointed: Option<u64>,
    ) -> sluice_pipeline::Result<()> {
        let (Some(keep), Some(checkpointed)) = (self.retention, checkpointed) else {
            return Ok(());
        };
        let below = next_step.saturating_sub(keep).min(checkpointed + 1);
        if below <= self.retained_below {
            return Ok(());
        }
        let log = self.pipeline.storage().log.clone();
        let outputs = self.pipeline.shape().outputs.clone();
        tokio::task::spawn_blocking(move || {
            outputs.iter().try_for_each(|o| log.trim_output(o, below))
        })
        .await
        .map_err(|source| {
            sluice_pipeline::Error::Runtime(sluice_runtime::Error::Task {
                what: "deleting old output".into(),
                source,
            })
        })?
        .map_err(|e| sluice_pipeline::Error::Runtime(e.into()))?;
        self.retained_below = below;
        Ok(())
    }

    /// Changes a live pipeline's layout to `workers` workers, reporting it.
    async fn rescale(&mut self, c: &mut Coordinator, workers: u32) -> sluice_pipeline::Result<()> {
        let before = c.stats().clone();
        if let Some(moved) = c.rescale(workers).await? {
            tracing::info!(
                tenant = %self.tenant,
                pipeline = %self.name,
                from = moved.from,
                to = moved.to,
                shards = moved.shards_moved,
                bytes = moved.bytes_moved,
                pause = ?moved.pause,
                "rescaled"
            );
            metrics::counter!("sluice_rescales_total", &self.metrics.labels).increment(1);
            metrics::histogram!("sluice_rescale_pause_seconds", &self.metrics.labels)
                .record(moved.pause.as_secs_f64());
        }
        self.metrics.record(c, &before, true, Duration::ZERO);
        self.remember(c, &before, None);
        let lag = self.pipeline.storage().lag(c.frontiers());
        self.report(c, true, lag);
        self.committed.send_replace(c.next_step());
        Ok(())
    }

    async fn wait_for_command(&mut self) {
        if self.control.changed().await.is_err() {
            // The handle is gone: nothing will ever command this task.
            std::future::pending::<()>().await;
        }
    }

    fn set_state(&self, state: PipelineState) {
        lock(&self.status).state = state;
    }

    /// Adds a step's time and a checkpoint it took to the history.
    fn remember(&self, c: &Coordinator, before: &sluice_runtime::Stats, step: Option<Duration>) {
        let mut h = lock(&self.history);
        if let Some(took) = step {
            h.on_step(took);
        }
        if c.stats().checkpoints > before.checkpoints
            && let Some(step) = c.checkpointed_step()
        {
            h.on_checkpoint(
                step,
                c.last_checkpoint_snapshots(),
                c.last_checkpoint_time(),
            );
        }
    }

    fn report(&self, c: &Coordinator, progressed: bool, lag: u64) {
        let shape = self.pipeline.shape();
        let s = c.stats();
        let (rates, checkpoint_at) = {
            let mut h = lock(&self.history);
            h.sample(s.events_in, s.events_out, s.steps, lag);
            let storage = self.pipeline.storage();
            let layout = c.layout();
            let workers = c
                .frontiers()
                .iter()
                .enumerate()
                .map(|(w, f)| WorkerFigures {
                    worker: w as u32,
                    shards: layout.shards.iter().filter(|o| **o == w as u32).count() as u32,
                    partitions: f.len() as u32,
                    lag: storage.lag(std::slice::from_ref(f)),
                })
                .collect();
            h.set_workers(workers, layout.epoch);
            (
                h.latest()
                    .map(|x| (x.events_in_per_sec, x.events_out_per_sec, x.steps_per_sec)),
                h.last_checkpoint().map(|x| x.at_ms),
            )
        };
        let mut st = lock(&self.status);
        st.state = if progressed {
            PipelineState::Running
        } else {
            PipelineState::Idle
        };
        st.steps = c.next_step();
        st.workers = c.workers();
        if let Some((events_in, events_out, steps)) = rates {
            st.events_in_per_sec = events_in;
            st.events_out_per_sec = events_out;
            st.steps_per_sec = steps;
        }
        st.last_checkpoint_age_ms = checkpoint_at.map(|at| now_ms().saturating_sub(at));
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
                        let name = shape.input_name(id.input).unwrap_or("?");
                        (format!("{name}/{}", id.partition), *o)
                    })
                    .collect()
            })
            .collect();
    }

    /// Records an error: in the status, the metrics and the log; `fatal`
    /// marks the pipeline failed.
    fn record_error(&self, e: &sluice_pipeline::Error, fatal: bool) {
        let kind = e.as_runtime().map_or("other", sluice_runtime::Error::kind);
        self.metrics.error(kind);
        // The message may hold a guest's words: bounded and escaped.
        let message = sluice_core::text::guest_message(&e.to_string());
        let mut st = lock(&self.status);
        if fatal {
            tracing::warn!(tenant = %self.tenant, pipeline = %self.name, "pipeline failed: {message}");
            st.state = PipelineState::Failed;
        } else {
            tracing::warn!(tenant = %self.tenant, pipeline = %self.name, "recovering after a transient error: {message}");
        }
        st.last_error = Some(message);
    }
}

/// Whether `e` says the host's instance pool is full.
fn is_capacity(e: &sluice_pipeline::Error) -> bool {
    matches!(
        e.as_runtime(),
        Some(sluice_runtime::Error::PoolExhausted { .. })
    )
}

/// A pipeline's Prometheus series.
struct Metrics {
    labels: [(&'static str, String); 2],
}

impl Metrics {
    fn new(tenant: &str, pipeline: &str) -> Self {
        Metrics {
            labels: [
                ("tenant", tenant.to_owned()),
                ("pipeline", pipeline.to_owned()),
            ],
        }
    }

    fn record(
        &self,
        c: &Coordinator,
        before: &sluice_runtime::Stats,
        progressed: bool,
        took: Duration,
    ) {
        let labels = &self.labels;
        let s = c.stats();
        if progressed {
            metrics::histogram!("sluice_step_seconds", labels).record(took.as_secs_f64());
            metrics::counter!("sluice_steps_total", labels).increment(1);
            metrics::counter!("sluice_events_in_total", labels)
                .increment(s.events_in - before.events_in);
            metrics::counter!("sluice_events_out_total", labels)
                .increment(s.events_out - before.events_out);
            metrics::counter!("sluice_fuel_consumed_total", &labels[..1])
                .increment(s.fuel_used - before.fuel_used);
        }
        if s.checkpoints > before.checkpoints {
            metrics::counter!("sluice_checkpoints_total", labels).increment(1);
            metrics::histogram!("sluice_checkpoint_seconds", labels)
                .record(c.last_checkpoint_time().as_secs_f64());
        }
    }

    fn error(&self, kind: &'static str) {
        metrics::counter!(
            "sluice_errors_total",
            &[
                self.labels[0].clone(),
                self.labels[1].clone(),
                ("kind", kind.to_owned()),
            ]
        )
        .increment(1);
    }
}
