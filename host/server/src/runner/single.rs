//! A pipeline this server runs alone: its [`Pipeline`] and the task that
//! drives it.
//!
//! The task is a small state machine over [`Phase`]: it opens the
//! coordinator when the pipeline is wanted running, runs steps while there
//! is input, checkpoints when the interval passes (also when idle), keeps
//! the instances but runs nothing while paused, and checkpoints and unloads
//! them when stopped. A transient error is recovered from as the
//! [`RecoveryPolicy`] says; any other error fails only this pipeline, kept
//! in its status until the tenant starts it again.

use super::handle::{Control, PipelineHandle, Shutdown, lock, options};
use crate::history::{History, WorkerFigures, now_ms};
use crate::limits::EffectiveLimits;
use crate::settings::KafkaSettings;
use crate::types::{Desired, PipelineSpec, PipelineState, PipelineStatus};
use sluice_core::CircuitPorts;
use sluice_pipeline::{LogConfig, Pipeline, PipelineConfig, RecoveryPolicy};
use sluice_runtime::{Coordinator, LoadedComponent, SluiceEngine};
use std::path::PathBuf;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};

/// The logs of pipeline `spec` of `tenant`, which this server runs alone:
/// its Kafka topics on `kafka`'s brokers, or (`None`) the embedded log.
#[cfg_attr(not(feature = "kafka"), allow(unused_variables))]
pub(crate) fn log_config(
    tenant: &str,
    spec: &PipelineSpec,
    kafka: Option<KafkaSettings>,
) -> sluice_pipeline::Result<LogConfig> {
    Ok(match kafka {
        None => LogConfig::default(),
        #[cfg(feature = "kafka")]
        Some(k) => {
            // Topics `<kafka name>.<port>`: a tenant cannot name another
            // tenant's topics (pipelines created before the server chose
            // names use `<tenant>.<pipeline>`).
            let name = spec.kafka_name_in(tenant);
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
    })
}

/// Opens (or creates) the storage in `dir` of pipeline `spec`, which this
/// server runs alone, and starts its task in state `desired`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn open(
    engine: Arc<SluiceEngine>,
    tenant: &str,
    spec: PipelineSpec,
    component: LoadedComponent,
    ports: CircuitPorts,
    limits: EffectiveLimits,
    dir: PathBuf,
    desired: Desired,
    kafka: Option<KafkaSettings>,
) -> sluice_pipeline::Result<Arc<PipelineHandle>> {
    let log = log_config(tenant, &spec, kafka)?;
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
        runs: Arc::default(),
    }))
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
                        // Its instances go: so does the heap their steps used.
                        drop(c);
                        tokio::task::spawn_blocking(sluice_runtime::memory::give_back);
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
                c.checkpoint_or_delay().await?;
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
        // An upgrade that rebuilt operators integrates the whole output log
        // up to its checkpoint on every recovery, until a checkpoint of the
        // new version is the newest: none of it is deleted meanwhile.
        if let Some(u) = &self.pipeline.options().upgraded_at
            && u.rebuilt.is_some()
            && u.checkpoint == checkpointed
        {
            return Ok(());
        }
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
        st.dead_letters = s.dead_letters;
        st.fuel_used = s.fuel_used;
        st.input_lag = lag;
        st.last_checkpoint = c.checkpointed_step();
        st.checkpoints_behind = c.checkpoints_behind().map(str::to_owned);
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
            metrics::counter!("sluice_dead_letters_total", labels)
                .increment(s.dead_letters - before.dead_letters);
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
