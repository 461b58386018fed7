//! A pipeline across hosts, as one of its hosts: the server runs
//! [`sluice_pipeline::run_host`] for it — the same as `sluice host` — and
//! reports what that host does in the pipeline's status.
//!
//! Every server started with the same `--hosts-*` settings on which the
//! tenant creates the pipeline joins its group in etcd (named after the
//! pipeline's Kafka name); the first to join leads and runs the coordinator
//! over all of them, the others run workers. Their input is the pipeline's
//! Kafka topics, written by the tenant's producers (the server's push API
//! would need the pipeline's ingest producer, which only one host may hold).
//! Output is read through the API as for any Kafka pipeline, from the
//! topics.

use super::handle::{Control, PipelineHandle, lock, options};
use crate::limits::EffectiveLimits;
use crate::settings::KafkaSettings;
use crate::types::{
    CommittedBy, Desired, HostsStatus, PipelineSpec, PipelineState, PipelineStatus,
};
use sluice_core::{CircuitPorts, PipelineShape};
use sluice_pipeline::{HostConfig, HostEvent, LogConfig, PipelineConfig};
use sluice_runtime::{LoadedComponent, SluiceEngine};
use std::path::PathBuf;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// Opens this server's part of pipeline `spec` across hosts and starts its
/// task in state `desired`.
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
    kafka: KafkaSettings,
) -> sluice_pipeline::Result<Arc<PipelineHandle>> {
    let Some(hosts) = kafka.hosts.clone() else {
        return Err(sluice_core::ConfigError::Invalid(
            "this server runs no pipelines across hosts (start it with --hosts-etcd, \
             --hosts-store and the hosts' secret)"
                .into(),
        )
        .into());
    };
    let name = spec.kafka_name_in(tenant);
    let mut topics = sluice_kafka::KafkaConfig::new(kafka.brokers.clone(), name.clone());
    topics.replication = kafka.replication;
    topics.output_partitions = spec.workers;
    let pipeline = PipelineConfig {
        rescale_to: Some(spec.workers),
        partitions: spec.partitions,
        log: LogConfig::Kafka {
            config: topics.clone(),
        },
        checkpoint_store: Some(hosts.pipeline_store(&name)),
        options: options(&spec, &limits),
        id_prefix: format!("{tenant}/{}/", spec.name),
        ..PipelineConfig::new(dir, spec.workers)
    };
    // A reader of the pipeline's logs: its output for the API, its steps
    // for the status.
    let reader = {
        let mut config = topics;
        config.inputs = ports.inputs.clone();
        tokio::task::spawn_blocking(move || sluice_kafka::KafkaLog::open(config))
            .await
            .map_err(|source| {
                sluice_pipeline::Error::Runtime(sluice_runtime::Error::Task {
                    what: "opening the pipeline's Kafka logs".into(),
                    source,
                })
            })??
    };
    let reader = Arc::new(reader);
    let shape = PipelineShape::new(&ports, spec.workers, |input| {
        sluice_storage::LogBackend::partitions(&*reader, input)
            .unwrap_or(pipeline.input_partitions())
    })?;
    let status = Arc::new(Mutex::new(PipelineStatus {
        hosts: Some(HostsStatus {
            host: hosts.name.clone(),
            leading: false,
            group: Vec::new(),
            replicas: Vec::new(),
            failovers: 0,
            replica_steps_checked: 0,
            committed_by: Vec::new(),
        }),
        ..PipelineStatus::starting(&spec, &component.hash, &shape, 0, None)
    }));
    let (control, control_rx) = watch::channel(Control {
        desired,
        workers: spec.workers,
        generation: 0,
        shutdown: None,
    });
    let (committed_tx, committed) = watch::channel(0);
    let runs = Arc::new(Mutex::new(None));
    let host = Host {
        runs: runs.clone(),
        engine,
        component,
        config: HostConfig {
            pipeline,
            name: hosts.name.clone(),
            listen: std::net::SocketAddr::new(hosts.bind, 0),
            advertise: None,
            secret: hosts.secret.clone(),
            session_timeout: hosts.session_timeout,
            tls: hosts.tls.clone(),
            inputs: Vec::new(),
            read_only_log: false,
            zone: hosts.zone.clone(),
        },
        etcd: hosts.etcd.clone(),
        group: name,
        reader: reader.clone(),
        status: status.clone(),
        control: control_rx,
        committed: Arc::new(committed_tx),
    };
    let task = tokio::spawn(host.run());
    Ok(Arc::new(PipelineHandle {
        pipeline: None,
        ports,
        shape,
        log: reader,
        status,
        history: Arc::default(),
        control,
        input: Arc::new(Notify::new()),
        committed,
        task: Mutex::new(Some(task)),
        next_partition: AtomicU32::new(0),
        runs,
    }))
}

/// The task of this server's host of a pipeline across hosts.
struct Host {
    engine: Arc<SluiceEngine>,
    component: LoadedComponent,
    config: HostConfig,
    etcd: Vec<String>,
    group: String,
    reader: Arc<sluice_kafka::KafkaLog>,
    status: Arc<Mutex<PipelineStatus>>,
    control: watch::Receiver<Control>,
    committed: Arc<watch::Sender<u64>>,
    /// The component the host reported running after a change.
    runs: Arc<Mutex<Option<String>>>,
}

/// How often the status reads the pipeline's progress from Kafka.
const POLL: Duration = Duration::from_millis(500);

/// Reads the pipeline's progress (whoever leads it) into the status every
/// [`POLL`], and wakes readers waiting for output; until aborted.
async fn progress(
    reader: Arc<sluice_kafka::KafkaLog>,
    status: Arc<Mutex<PipelineStatus>>,
    committed: Arc<watch::Sender<u64>>,
) {
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let reader = reader.clone();
        let read = tokio::task::spawn_blocking(move || {
            use sluice_storage::CheckpointLedger;
            let last = reader.latest_step()?;
            let checkpoint = reader.recorded_checkpoints(1)?.pop().map(|(s, _)| s);
            Ok::<_, sluice_storage::StorageError>((last, checkpoint))
        })
        .await;
        if let Ok(Ok((last, checkpoint))) = read {
            let steps = last.map_or(0, |l| l + 1);
            {
                let mut s = lock(&status);
                s.steps = steps;
                s.last_checkpoint = s.last_checkpoint.max(checkpoint);
            }
            committed.send_if_modified(|c| {
                let changed = *c != steps;
                *c = steps;
                changed
            });
        }
    }
}

impl Host {
    /// Joins the pipeline's group while the tenant wants it running; a
    /// failure (etcd or Kafka out of reach, the host's own error) is
    /// reported and tried again with a growing pause — the other hosts may
    /// carry the pipeline meanwhile.
    async fn run(mut self) {
        let mut failures = 0u32;
        loop {
            let ctl = *self.control.borrow_and_update();
            if ctl.shutdown.is_some() {
                return;
            }
            if ctl.desired != Desired::Running {
                self.set(|s| {
                    s.state = PipelineState::Stopped;
                    if let Some(h) = &mut s.hosts {
                        h.leading = false;
                        h.group.clear();
                    }
                });
                if self.control.changed().await.is_err() {
                    return;
                }
                continue;
            }
            match self.join_and_run().await {
                Ok(()) => failures = 0,
                Err(message) => {
                    failures += 1;
                    tracing::warn!(pipeline = %self.group, error = %message, failures, "this host of the pipeline failed; joining again");
                    self.set(|s| {
                        s.state = PipelineState::Failed;
                        s.last_error = Some(message);
                        if let Some(h) = &mut s.hosts {
                            h.leading = false;
                            h.group.clear();
                        }
                    });
                    let pause = Duration::from_millis(250 << failures.min(5));
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        changed = self.control.changed() => if changed.is_err() { return },
                    }
                }
            }
        }
    }

    /// Runs the host until the tenant stops the pipeline (or the server
    /// shuts down: a leader then checkpoints and leaves the group).
    async fn join_and_run(&mut self) -> Result<(), String> {
        let membership = sluice_cluster::EtcdMembership::connect(
            &self.etcd,
            &self.group,
            self.config.session_timeout,
        )
        .await
        .map_err(|e| format!("joining the pipeline's group in etcd: {e}"))?;
        let (stop_tx, stop) = watch::channel(false);
        let status = self.status.clone();
        let runs = self.runs.clone();
        let report = move |event: HostEvent| {
            let mut s = lock(&status);
            let Some(h) = s.hosts.as_mut() else { return };
            match event {
                HostEvent::Joined { .. } => {}
                HostEvent::Leading {
                    hosts, restored, ..
                } => {
                    h.leading = true;
                    h.group = hosts;
                    s.last_checkpoint = s.last_checkpoint.max(restored);
                }
                HostEvent::Moved { hosts, .. } => h.group = hosts,
                HostEvent::Replicas {
                    placement,
                    failovers,
                    checked,
                    committed_by,
                } => {
                    h.replicas = placement;
                    h.failovers = failovers;
                    h.replica_steps_checked = checked;
                    h.committed_by = committed_by
                        .into_iter()
                        .map(|(from_step, hosts)| CommittedBy { from_step, hosts })
                        .collect();
                }
                HostEvent::LeadEnded { reason } => {
                    h.leading = false;
                    h.group.clear();
                    h.replicas.clear();
                    s.last_error = Some(reason);
                }
                // The pipeline runs another component now (this host
                // made the upgrade, or another did): the server's registry
                // follows it, then the status (see the server's
                // `upgrade_hosts` module).
                HostEvent::Upgraded {
                    to: component,
                    answer: sluice_cluster::UpgradeAnswer::Upgraded(_),
                }
                | HostEvent::Followed { component }
                | HostEvent::Fetched { component } => *lock(&runs) = Some(component),
                HostEvent::Upgraded { .. } => {}
                HostEvent::Rejoined | HostEvent::SteppedAside | HostEvent::GaveWay { .. } => {
                    h.leading = false;
                    h.group.clear();
                    h.replicas.clear();
                }
            }
        };
        self.set(|s| s.state = PipelineState::Running);
        let host = sluice_pipeline::run_host(
            self.engine.clone(),
            self.component.clone(),
            Arc::new(membership),
            self.config.clone(),
            stop,
            report,
        );
        tokio::pin!(host);
        // The progress is read beside the host (a slow broker never holds
        // the coordinator back).
        let poller = tokio::spawn(progress(
            self.reader.clone(),
            self.status.clone(),
            self.committed.clone(),
        ));
        let mut stopping = false;
        let ended = loop {
            tokio::select! {
                ended = &mut host => break ended,
                changed = self.control.changed(), if !stopping => {
                    let ctl = *self.control.borrow();
                    if changed.is_err() || ctl.shutdown.is_some() || ctl.desired != Desired::Running {
                        stopping = true;
                        let _ = stop_tx.send(true);
                    }
                }
            }
        };
        poller.abort();
        ended.map_err(|e| e.to_string())
    }

    fn set(&self, f: impl FnOnce(&mut PipelineStatus)) {
        f(&mut lock(&self.status));
    }
}
