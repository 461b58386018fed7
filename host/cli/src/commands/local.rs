//! Commands on this machine's pipelines: `run`, `upgrade`, `verify`, `read`, `serve`.

use super::progress::run_progress;
use crate::cli::RunArgs;
use anyhow::{Context, bail};
use sluice_core::OutputPosition;
use sluice_embedded::meta::{self, LogMeta};
use sluice_embedded::{EmbeddedLog, PipelineMeta, RocksCheckpointStore, db};
use sluice_pipeline::{PipelineConfig, RunRequest, run as run_pipeline};
use sluice_runtime::{Limits, PipelineOptions};
use sluice_storage::LogBackend;
use sluice_storage::audit::{Verdict, audit_upgraded};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// `sluice run`.
pub async fn run(a: RunArgs) -> anyhow::Result<()> {
    // The allocator's thresholds fixed, as the server's: a key-heavy step's
    // large host buffers go back to the kernel when freed instead of
    // raising the thresholds (see `sluice_runtime::memory`).
    sluice_runtime::memory::configure();
    for (_, file) in &a.inputs {
        if !file.is_file() {
            bail!("input file {} does not exist", file.display());
        }
    }
    let log = a.kafka.log_config(a.log)?;
    let report = run_pipeline(
        RunRequest {
            component: a.component,
            pipeline: PipelineConfig {
                log,
                checkpoint_store: a.store,
                options: PipelineOptions {
                    incremental_checkpoints: !a.full_checkpoints,
                    check_output_json: a.check_output_json,
                    ..a.steps.options("run")
                },
                rescale_to: a.workers,
                partitions: a.partitions,
                ..PipelineConfig::new(a.data, a.workers.unwrap_or(1))
            },
            inputs: a.inputs,
            read_in_place: a.read_in_place,
            outputs: a.outputs,
            limits: Limits {
                memory: a.memory_mib << 20,
                fuel_per_call: a.fuel,
                deadline: Duration::from_secs(a.deadline_secs),
            },
        },
        run_progress(!a.quiet),
    )
    .await?;
    if !a.quiet {
        let s = &report.stats;
        let appended: u64 = report.ingested.iter().map(|i| i.appended).sum();
        let recovered = match s.restored_checkpoint {
            Some(step) => format!(
                "restored the checkpoint of step {step}, replayed {} steps",
                s.replayed_steps
            ),
            None if s.replayed_steps > 0 => {
                format!("no checkpoint, replayed {} steps", s.replayed_steps)
            }
            None => "started fresh".to_owned(),
        };
        let read: u64 = (report.ingested.iter())
            .filter(|i| i.in_place)
            .map(|i| i.appended)
            .sum();
        let appended = match (appended - read, read) {
            (_, 0) => format!("appended {appended} events"),
            (0, read) => format!("read {read} new lines in place"),
            (appended, read) => format!("appended {appended} events, read {read} in place"),
        };
        eprintln!(
            "{appended}; {recovered}; committed {} steps ({} in total) and {} checkpoints; \
             {} events in, {} out; {:.0} events/s",
            s.steps,
            report.total_steps,
            s.checkpoints,
            s.events_in,
            s.events_out,
            report.events_per_second()
        );
        if s.dead_letters > 0 {
            eprintln!(
                "{} input records were not events: skipped into the dead-letter logs \
                 (`sluice read --data DIR --output PORT.dead-letter` shows them)",
                s.dead_letters
            );
        }
    }
    Ok(())
}

/// The ports and operators of the pipeline in data directory `dir` as its
/// metadata stores them (what `sluice diff DIR NEW` compares). Blocks.
pub(super) fn stored_ports(dir: &std::path::Path) -> anyhow::Result<sluice_core::CircuitPorts> {
    if !dir.join("db").is_dir() {
        bail!("{} holds no pipeline", dir.display());
    }
    let database = db::open(dir)?;
    let stored =
        meta::load(&database)?.with_context(|| format!("{} holds no pipeline", dir.display()))?;
    if stored.operators.is_empty() {
        bail!(
            "the pipeline in {} has not recorded its operators yet (its metadata is older): \
             run it once with this sluice, or compare its component file",
            dir.display()
        );
    }
    Ok(stored.ports())
}

/// `sluice upgrade`.
pub async fn upgrade(
    component: PathBuf,
    data: PathBuf,
    store: Option<String>,
    brokers: Option<String>,
    start_empty: Vec<String>,
    rebuild: bool,
) -> anyhow::Result<()> {
    let engine = Arc::new(sluice_runtime::SluiceEngine::new(
        Limits::default(),
        sluice_runtime::SluiceEngine::default_cache_dir(),
    )?);
    let loaded = engine
        .load_file(&component)
        .with_context(|| format!("loading {}", component.display()))?;
    // What the upgrade will do, as `sluice diff DIR NEW` says it (the new
    // version's instances decide, over the operators holding state).
    let dir = data.clone();
    if let Ok(Ok(old)) = tokio::task::spawn_blocking(move || stored_ports(&dir)).await {
        let new = engine.describe(&loaded).await?;
        if let Ok(diff) = sluice_core::CircuitDiff::between(&old, &new, &start_empty) {
            let diff = if rebuild { diff.rebuilding() } else { diff };
            eprintln!("{diff}");
        }
    }
    let dir = data.clone();
    let log = tokio::task::spawn_blocking(move || stored_log_config(&dir, brokers)).await??;
    if let (Some(store), sluice_pipeline::LogKind::Kafka) = (&store, log.kind()) {
        // Where the pipeline's hosts fetch it: one started with the old
        // version follows the change instead of being refused.
        let (store, path) = (store.clone(), component.clone());
        tokio::task::spawn_blocking(move || {
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            sluice_pipeline::hosts::publish_component(&store, &bytes).map_err(anyhow::Error::from)
        })
        .await??;
    }
    let config = PipelineConfig {
        checkpoint_store: store,
        log,
        ..PipelineConfig::new(data, 1)
    };
    let (_, _, report) =
        sluice_pipeline::Pipeline::upgrade(engine, loaded, config, start_empty, rebuild).await?;
    let short = sluice_embedded::meta::short_hash;
    let at = match report.checkpoint {
        Some(step) => format!("at the checkpoint of step {step}, its state carried"),
        None => "before its first step (no state to carry)".to_owned(),
    };
    if let Some(rebuilt) = &report.rebuilt {
        eprintln!(
            "rebuilt from the input: {}; each output's difference from the new version's \
             goes out with the next step",
            if rebuilt.is_empty() {
                "no operator".to_owned()
            } else {
                rebuilt.join(", ")
            }
        );
    }
    eprintln!(
        "upgraded: component {} -> {} {at}",
        short(&report.from),
        short(&report.to)
    );
    if !report.outputs_added.is_empty() {
        eprintln!(
            "new outputs, written from the next step on: {}",
            report.outputs_added.join(", ")
        );
    }
    if !report.outputs_removed.is_empty() {
        eprintln!(
            "outputs no longer written (their logs are kept): {}",
            report.outputs_removed.join(", ")
        );
    }
    Ok(())
}

/// The secret a pipeline's hosts share: from `file`, else
/// `SLUICE_HOST_SECRET`; at least 16 bytes.
fn read_host_secret(file: Option<&std::path::Path>) -> anyhow::Result<Vec<u8>> {
    let secret = match file {
        Some(f) => std::fs::read(f).with_context(|| format!("reading {}", f.display()))?,
        None => std::env::var("SLUICE_HOST_SECRET")
            .context("the hosts' secret: pass its file (--secret-file, --hosts-secret-file) or set SLUICE_HOST_SECRET")?
            .into_bytes(),
    };
    if secret.len() < 16 {
        bail!("the hosts' secret must be at least 16 bytes");
    }
    Ok(secret)
}

/// `sluice host`.
pub async fn host(a: crate::cli::HostArgs) -> anyhow::Result<()> {
    use sluice_pipeline::{HostConfig, HostEvent};
    if a.etcd.is_empty() {
        bail!("sluice host needs --etcd URL (or SLUICE_ETCD): the group of the pipeline's hosts");
    }
    let secret = read_host_secret(a.secret_file.as_deref())?;
    // A long-running host: the allocator's thresholds fixed, as the
    // server's (see `sluice_runtime::memory`).
    sluice_runtime::memory::configure();
    let log = a.kafka.log_config(sluice_pipeline::LogKind::Kafka)?;
    let group = a
        .kafka
        .pipeline
        .clone()
        .context("sluice host needs --pipeline NAME")?;
    let session_timeout = Duration::from_millis(a.session_timeout_ms.max(2_000));
    let membership = sluice_cluster::EtcdMembership::connect(&a.etcd, &group, session_timeout)
        .await
        .context("joining the pipeline's group in etcd")?;
    let engine = Arc::new(sluice_runtime::SluiceEngine::new(
        Limits::default(),
        sluice_runtime::SluiceEngine::default_cache_dir(),
    )?);
    let component = engine.load_file(&a.component)?;
    let config = HostConfig {
        pipeline: PipelineConfig {
            log,
            checkpoint_store: Some(a.store.clone()),
            options: sluice_runtime::PipelineOptions {
                replicas: a.replicas,
                ..a.steps.options(&group)
            },
            rescale_to: Some(a.workers),
            partitions: a.partitions,
            ..PipelineConfig::new(a.data.clone(), a.workers)
        },
        name: a.name.clone().unwrap_or_else(|| {
            a.advertise
                .unwrap_or(a.listen)
                .to_string()
                .replace(':', "-")
        }),
        listen: a.listen,
        advertise: a.advertise,
        secret,
        session_timeout,
        tls: match (&a.tls_cert, &a.tls_key, &a.tls_ca) {
            (Some(cert), Some(key), Some(ca)) => {
                Some(sluice_runtime::Tls::from_pem_files(cert, key, ca)?)
            }
            _ => None,
        },
        inputs: a.inputs.clone(),
        read_only_log: a.read_only_log,
        zone: a.zone.clone(),
    };
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
        let _ = stop_tx.send(true);
    });
    let name = config.name.clone();
    sluice_pipeline::run_host(
        engine,
        component,
        Arc::new(membership),
        config,
        stop,
        move |event| match event {
            HostEvent::Joined {
                addr,
                reads_input,
                writes_checkpoints,
            } => eprintln!(
                "host {name}: joined, serving workers at {addr} ({}, {})",
                if reads_input {
                    "reading their input from Kafka"
                } else {
                    "the leader sends their input"
                },
                if writes_checkpoints {
                    "writing their checkpoints to the store"
                } else {
                    "checkpoints through the leader"
                }
            ),
            HostEvent::Leading {
                hosts,
                adopted,
                took,
                ..
            } if adopted > 0 => eprintln!(
                "host {name}: leading on [{}]; adopted {adopted} worker instances the leader before left at the log's last step (nothing restored, nothing replayed) in {took:.2?}",
                hosts.join(", "),
            ),
            HostEvent::Leading {
                hosts,
                restored,
                restored_local,
                restored_fetched,
                replayed,
                took,
                ..
            } => eprintln!(
                "host {name}: leading on [{}]; restored checkpoint {} ({restored_local} bytes from the hosts' own copies, {restored_fetched} fetched), replayed {replayed} steps in {took:.2?}",
                hosts.join(", "),
                restored.map_or("none".to_owned(), |s| s.to_string())
            ),
            HostEvent::Moved {
                hosts,
                workers,
                bytes,
                took,
            } => eprintln!(
                "host {name}: leading on [{}]; moved {workers} workers ({bytes} bytes of state) live in {took:.2?}",
                hosts.join(", ")
            ),
            HostEvent::Replicas {
                placement,
                failovers,
                checked,
                committed_by,
            } => eprintln!(
                "host {name}: replicas (primary first): {}; {failovers} failovers, {checked} follower steps checked{}",
                placement
                    .iter()
                    .enumerate()
                    .map(|(w, on)| format!("w{w} [{}]", on.join(", ")))
                    .collect::<Vec<_>>()
                    .join(", "),
                committed_by
                    .last()
                    .map(|(step, _)| format!("; the primaries' output committed since step {step}"))
                    .unwrap_or_default()
            ),
            HostEvent::Upgraded {
                to,
                answer: sluice_cluster::UpgradeAnswer::Upgraded(said),
            } => eprintln!("host {name}: upgraded the pipeline to {}: {said}", meta::short_hash(&to)),
            HostEvent::Upgraded {
                to,
                answer: sluice_cluster::UpgradeAnswer::Refused(why),
            } => eprintln!("host {name}: refused the upgrade to {}: {why}", meta::short_hash(&to)),
            HostEvent::Followed { component } => eprintln!(
                "host {name}: the pipeline was upgraded by another host: runs component {} from the store",
                meta::short_hash(&component)
            ),
            HostEvent::Fetched { component } => eprintln!(
                "host {name}: the leader runs component {}: its workers here run it too, fetched from the store",
                meta::short_hash(&component)
            ),
            HostEvent::LeadEnded { reason } => eprintln!("host {name}: stopped leading: {reason}"),
            HostEvent::Rejoined => eprintln!("host {name}: membership lapsed; joined again"),
            HostEvent::SteppedAside => eprintln!(
                "host {name}: may not write the pipeline's logs, so it does not lead: joined again behind the others"
            ),
            HostEvent::GaveWay { idle, reason } => eprintln!(
                "host {name}: led for {idle:.1?} without progress ({reason}): gave way, joined again behind the others"
            ),
        },
    )
    .await?;
    Ok(())
}

/// A stopped pipeline's data directory opened for reading: its metadata, its
/// logs (embedded, or Kafka with `brokers`) and the database.
struct Offline {
    meta: PipelineMeta,
    log: Arc<dyn LogBackend>,
    /// Where a shared store's checkpoint commits are recorded (Kafka).
    ledger: Option<Arc<dyn sluice_storage::CheckpointLedger>>,
    database: Arc<db::PipelineDb>,
}

fn open_offline(data: &std::path::Path, brokers: Option<String>) -> anyhow::Result<Offline> {
    if !data.join("db").is_dir() {
        bail!("{} holds no pipeline (no db directory)", data.display());
    }
    let database = db::open(data)?;
    let meta = meta::load(&database)?.context("no pipeline metadata")?;
    #[cfg_attr(not(feature = "kafka"), allow(unused_mut))]
    let mut ledger: Option<Arc<dyn sluice_storage::CheckpointLedger>> = None;
    let log: Arc<dyn LogBackend> = match &meta.log {
        // Reading outputs takes no input: inputs read in place are not
        // opened here (the embedded audit opens them itself).
        LogMeta::Embedded => Arc::new(EmbeddedLog::open(database.clone())?),
        #[cfg(feature = "kafka")]
        LogMeta::Kafka { .. } => {
            let log = Arc::new(sluice_kafka::KafkaLog::open(kafka_config(
                &meta.log, brokers,
            )?)?);
            ledger = Some(log.clone());
            log
        }
        #[cfg(not(feature = "kafka"))]
        LogMeta::Kafka { .. } => {
            let _ = brokers;
            bail!("this sluice was built without Kafka support (cargo feature `kafka`)")
        }
    };
    Ok(Offline {
        meta,
        log,
        ledger,
        database,
    })
}

/// The Kafka settings of a pipeline whose metadata records `log` (its
/// name and topics), with `brokers`.
#[cfg(feature = "kafka")]
fn kafka_config(
    log: &LogMeta,
    brokers: Option<String>,
) -> anyhow::Result<sluice_kafka::KafkaConfig> {
    let LogMeta::Kafka { pipeline, topics } = log else {
        bail!("the pipeline's logs are not in Kafka");
    };
    let brokers = brokers.with_context(|| {
        format!(
            "the logs of this pipeline are in Kafka (pipeline `{pipeline}`): pass --brokers \
             HOST:PORT (or SLUICE_KAFKA_BROKERS)"
        )
    })?;
    let mut config = sluice_kafka::KafkaConfig::new(brokers, pipeline.clone());
    config.topics = topics.clone().into_iter().collect();
    Ok(config)
}

/// The logs the pipeline in data directory `dir` runs on, as its metadata
/// records them (Kafka's with `brokers`); the embedded log where there is
/// no pipeline (the upgrade says so). Blocks.
fn stored_log_config(
    dir: &std::path::Path,
    brokers: Option<String>,
) -> anyhow::Result<sluice_pipeline::LogConfig> {
    if !dir.join("db").is_dir() {
        return Ok(Default::default());
    }
    let stored = meta::load(&*db::open(dir)?)?;
    match stored.map(|m| m.log) {
        #[cfg(feature = "kafka")]
        Some(log @ LogMeta::Kafka { .. }) => Ok(sluice_pipeline::LogConfig::Kafka {
            config: kafka_config(&log, brokers)?,
        }),
        #[cfg(not(feature = "kafka"))]
        Some(LogMeta::Kafka { .. }) => {
            let _ = brokers;
            bail!("this sluice was built without Kafka support (cargo feature `kafka`)")
        }
        _ => Ok(Default::default()),
    }
}

/// `sluice verify`.
pub async fn verify(
    data: PathBuf,
    brokers: Option<String>,
    store: Option<String>,
) -> anyhow::Result<()> {
    let verdict = tokio::task::spawn_blocking(move || -> anyhow::Result<Verdict> {
        let offline = open_offline(&data, brokers)?;
        // On Kafka the meta topic records every change of component; a
        // data directory that has not opened the pipeline since one
        // elsewhere knows neither the new component's outputs nor where
        // the old one's stop, so its audit would be of the wrong circuit.
        if matches!(offline.meta.log, LogMeta::Kafka { .. }) {
            let recorded =
                sluice_embedded::meta::decode_upgrades(offline.log.upgrades()?.as_deref())?;
            let known = offline.meta.upgrades.len();
            if recorded.len() > known {
                let last = &recorded[recorded.len() - 1];
                bail!(
                    "{} is behind the pipeline's log: the log records {} change(s) of component, \
                     this data directory's metadata {known} (the last one to {}); open the \
                     pipeline here once with that component (`sluice run`), or verify from a \
                     data directory that has, so the audit knows each component's outputs",
                    data.display(),
                    recorded.len(),
                    sluice_embedded::meta::short_hash(&last.to)
                );
            }
        }
        // The outputs each component wrote, up to each change of it.
        let eras = sluice_embedded::audit::outputs_before(&offline.meta);
        Ok(match (offline.meta.log, store) {
            // The embedded log's audit reads its upgrades from the
            // metadata (the outputs each component wrote).
            (LogMeta::Embedded, Some(url)) => sluice_embedded::audit::audit_embedded_with(
                &offline.database,
                &sluice_objstore::ObjectCheckpointStore::open(&url)?,
            )?,
            (_, Some(url)) => {
                let store = sluice_objstore::ObjectCheckpointStore::open(&url)?;
                let store = match offline.ledger {
                    Some(ledger) => store.with_ledger(ledger),
                    None => store,
                };
                audit_upgraded(&*offline.log, &store, &offline.meta.shape, &eras)?
            }
            (LogMeta::Embedded, None) => sluice_embedded::audit::audit_embedded(&offline.database)?,
            (LogMeta::Kafka { .. }, None) => audit_upgraded(
                &*offline.log,
                &RocksCheckpointStore::open(offline.database.clone()),
                &offline.meta.shape,
                &eras,
            )?,
        })
    })
    .await??;
    match verdict {
        Verdict::Consistent(s) => println!(
            "consistent: {} steps, {} output entries, {} dead letters, checkpoints {:?}",
            s.steps, s.entries, s.dead_letters, s.checkpoints
        ),
        Verdict::Violation(v) => bail!("violation: {v}"),
    }
    Ok(())
}

/// `sluice read`.
pub async fn read(
    data: PathBuf,
    output: String,
    after: Option<OutputPosition>,
    limit: usize,
    brokers: Option<String>,
) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        use std::io::Write;
        let offline = open_offline(&data, brokers)?;
        let shape = &offline.meta.shape;
        let dead_letters = sluice_core::dead_letter_input(&output)
            .is_some_and(|input| shape.inputs.iter().any(|i| i.name == input));
        if !shape.outputs.contains(&output) && !dead_letters {
            bail!(
                "unknown output port `{output}`; the pipeline has [{}] (and the dead-letter logs \
                 [{}])",
                shape.outputs.join(", "),
                shape
                    .inputs
                    .iter()
                    .map(|i| sluice_core::dead_letter_log(&i.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        for e in sluice_storage::read_output(&*offline.log, &output, after, limit)? {
            let value: serde_json::Value = serde_json::from_slice(&e.event.value)?;
            let frontier: Vec<serde_json::Value> = e
                .frontier
                .iter()
                .map(|(id, offset)| {
                    serde_json::json!({
                        "input": shape.input_name(id.input).unwrap_or("?"),
                        "partition": id.partition,
                        "offset": offset,
                    })
                })
                .collect();
            let op = if e.event.weight >= 0 {
                "insert"
            } else {
                "delete"
            };
            let mut line =
                serde_json::json!({"position": e.position, "frontier": frontier, op: value});
            if e.event.weight.unsigned_abs() > 1 {
                line["weight"] = e.event.weight.unsigned_abs().into();
            }
            writeln!(out, "{line}")?;
        }
        Ok(())
    })
    .await?
}

/// `sluice serve`.
#[allow(clippy::too_many_arguments)] // one per flag group of `sluice serve`
pub async fn serve(
    data: PathBuf,
    listen: std::net::SocketAddr,
    admin_token_file: Option<PathBuf>,
    pool: u32,
    kafka_brokers: Option<String>,
    kafka_replication: Option<i32>,
    hosts: crate::cli::ServeHostsArgs,
    limits: sluice_server::limits::ServerLimits,
) -> anyhow::Result<()> {
    let hosts = match (hosts.hosts_etcd.is_empty(), &kafka_brokers) {
        (true, _) => None,
        (false, None) => bail!(
            "pipelines across hosts keep their logs in Kafka: --hosts-etcd needs --kafka-brokers"
        ),
        (false, Some(_)) => {
            let store = hosts.hosts_store.clone().context(
                "--hosts-etcd needs --hosts-store URL: the checkpoint store every server reaches",
            )?;
            let secret = read_host_secret(hosts.hosts_secret_file.as_deref())?;
            // No defaults: two servers with the same name would pass for
            // one member, and a loopback address reaches no other machine.
            let bind = hosts.hosts_bind.context(
                "--hosts-etcd needs --hosts-bind IP: the address the other servers reach this one at",
            )?;
            let name = hosts.hosts_name.context(
                "--hosts-etcd needs --hosts-name NAME: this server's name in the pipelines' groups, \
                 unique among the servers",
            )?;
            Some(sluice_server::runner::HostsSettings {
                etcd: hosts.hosts_etcd,
                store,
                secret,
                bind,
                name,
                session_timeout: Duration::from_millis(hosts.hosts_session_timeout_ms.max(2_000)),
                tls: match (
                    &hosts.hosts_tls_cert,
                    &hosts.hosts_tls_key,
                    &hosts.hosts_tls_ca,
                ) {
                    (Some(cert), Some(key), Some(ca)) => {
                        Some(sluice_runtime::Tls::from_pem_files(cert, key, ca)?)
                    }
                    _ => None,
                },
                zone: hosts.hosts_zone,
            })
        }
    };
    let admin_token = match admin_token_file {
        Some(f) => std::fs::read_to_string(&f)
            .with_context(|| format!("reading the admin token from {}", f.display()))?,
        None => std::env::var("SLUICE_ADMIN_TOKEN").map_err(|_| {
            anyhow::anyhow!(
                "no admin token: set SLUICE_ADMIN_TOKEN or pass --admin-token-file FILE \
                 (there is no default)"
            )
        })?,
    };
    sluice_server::serve(sluice_server::ServeOptions {
        data,
        listen,
        admin_token: admin_token.trim().to_owned(),
        pool,
        kafka: kafka_brokers.map(|brokers| sluice_server::runner::KafkaSettings {
            brokers,
            replication: kafka_replication.unwrap_or(0),
            hosts,
        }),
        limits,
    })
    .await
}
