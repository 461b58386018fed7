//! A pipeline across several hosts: what `sluice host` does on each.
//!
//! Every host runs a [`WorkerHost`] (the workers the coordinator places on
//! it) and joins the pipeline's group ([`Membership`]). The member that
//! joined first leads: it opens the pipeline (its logs in Kafka, its
//! checkpoints in an object store — nothing on one machine only), connects
//! to every other member's worker host and runs the coordinator over all of
//! them (workers spread evenly, some on itself). When hosts join or leave
//! gracefully, only the workers whose host changes move, live, each handing
//! its state from its old instance to a new one on its new host
//! ([`Coordinator::replace_hosts`]): a joining host takes its share, a
//! leaving one hands over its own workers and nothing else moves. When a
//! host dies or stalls past the TTL, the leader checkpoints if it can and
//! reopens the coordinator on the group as it is now: recovery restores the
//! newest checkpoint onto the new placement and replays what was committed
//! after it. When the leader itself goes, the next member leads and
//! recovers the same way.
//!
//! Nothing here is needed for safety: a stalled leader that wakes up still
//! believing it leads is fenced by Kafka (the new leader's
//! `init_transactions` on the pipeline's transactional id) and cannot
//! commit; its worker connections were replaced by the new leader's.

use crate::config::PipelineConfig;
use crate::error::{Error, Result};
use crate::pipeline::Pipeline;
use sluice_cluster::{Member, Membership, Session, View};
use sluice_runtime::{HostOptions, LoadedComponent, Reach, SluiceEngine, Tls, WorkerHost};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Changes of component across hosts: components through the store, the
/// leader making an upgrade the group asks for, hosts following one.
mod follow;
/// The leader's loop: the coordinator over the group's hosts, moving
/// workers live as the group changes, until a step fails or the group
/// changes so that it must reopen.
mod lead;

pub use follow::{ask_group, group_answer, publish_component, published_component};

/// One host's part in a pipeline across hosts.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The pipeline as this host would open it when it leads: its own data
    /// directory, W, the Kafka logs, the checkpoint store (required: another
    /// host must be able to take over).
    pub pipeline: PipelineConfig,
    /// This host's name in the group (stable across restarts).
    pub name: String,
    /// Where its worker host listens (and other hosts connect, unless
    /// `advertise` says otherwise).
    pub listen: std::net::SocketAddr,
    /// The address the other hosts dial to reach this one, when it is not
    /// `listen` (behind NAT, a container's port mapping or a proxy); the
    /// group records it.
    pub advertise: Option<std::net::SocketAddr>,
    /// The secret every host of the pipeline shares.
    pub secret: Vec<u8>,
    /// A connection between the hosts that delivers nothing (no frame, no
    /// heartbeat, not a byte of a large frame) for this long is lost: a
    /// coordinator gives up on the host, a host on the coordinator or a
    /// peer link, and the exchange fails everywhere.
    pub session_timeout: Duration,
    /// Mutual TLS on every connection between the hosts, if set.
    pub tls: Option<Tls>,
    /// `(input port, file)` a leader appends (exactly once across hosts and
    /// runs: the ingest marks are in Kafka).
    pub inputs: Vec<(String, PathBuf)>,
    /// This host may read the pipeline's Kafka topics but not write them
    /// (ACLs): its workers read their own input, and the leader commits
    /// their output. (It cannot lead: a leader writes.)
    pub read_only_log: bool,
    /// This host's failure domain (a rack, an availability zone), if
    /// labelled: the leader places the replicas of each worker in
    /// different zones where it can.
    pub zone: Option<String>,
}

/// What a host reports as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEvent {
    /// Listening and joined the group.
    Joined {
        /// The worker host's address.
        addr: String,
        /// Its workers read their input from the pipeline's logs
        /// themselves (else the leader sends it).
        reads_input: bool,
        /// Its workers write and restore their checkpoint pieces in the
        /// shared store themselves (else through the leader).
        writes_checkpoints: bool,
    },
    /// Leading: the coordinator runs over these hosts (this one first).
    Leading {
        /// Names of the hosts, in placement order.
        hosts: Vec<String>,
        /// The checkpoint recovery restored, if any.
        restored: Option<u64>,
        /// Bytes of its state the hosts read from their own copies (their
        /// workers stayed where they were: no download).
        restored_local: u64,
        /// Bytes of its state fetched from the store (or sent by the
        /// leader).
        restored_fetched: u64,
        /// Steps replayed on recovery.
        replayed: u64,
        /// Instances adopted instead: the workers the leader before left on
        /// the hosts, at the log's last step (then nothing was restored or
        /// replayed).
        adopted: u64,
        /// How long opening (connecting, restoring, replaying) took.
        took: Duration,
    },
    /// Still leading, the group changed (hosts joined, or left
    /// gracefully): only the workers whose host changed moved, live.
    Moved {
        /// Names of the hosts now, in placement order.
        hosts: Vec<String>,
        /// Workers that moved.
        workers: u64,
        /// Bytes of state they took along.
        bytes: u64,
        /// How long the move paused the steps.
        took: Duration,
    },
    /// Leading, it made the upgrade the group asked for (or refused it,
    /// with nothing changed): the answer the group got.
    Upgraded {
        /// The component asked for (SHA-256, hex).
        to: String,
        /// What was made of it.
        answer: sluice_cluster::UpgradeAnswer,
    },
    /// Opening the pipeline, it found that another host had moved it to
    /// another component, fetched that from the checkpoint store, and runs
    /// it from now on. (Also when it opens the pipeline with the component
    /// of an upgrade it made itself but did not answer, having lost the
    /// lead.)
    Followed {
        /// The component it runs now (SHA-256, hex).
        component: String,
    },
    /// Not leading, its workers were started with another component than
    /// the one it last reported (the leader's, after an upgrade: fetched
    /// from the checkpoint store if it had not run it). It still opens the
    /// pipeline with its own when its turn to lead comes, and follows the
    /// change then ([`HostEvent::Followed`]).
    Fetched {
        /// The component its workers run now (SHA-256, hex).
        component: String,
    },
    /// No longer leading (the group changed, a step failed, or stopping).
    LeadEnded {
        /// Why.
        reason: String,
    },
    /// The membership lapsed (the host stalled or was cut off): joined
    /// again, at the end of the order.
    Rejoined,
    /// It was next to lead but may not write the pipeline's logs
    /// (`read_only_log`): it left and joined again, at the end of the order.
    SteppedAside,
    /// It led but made no progress — opened no coordinator, committed no
    /// step — for the step-aside bound while other hosts were in the group
    /// (it may not reach Kafka or the checkpoint store, which they may): it
    /// left and joined again, at the end of the order.
    GaveWay {
        /// How long it led without progress.
        idle: Duration,
        /// The last failure.
        reason: String,
    },
    /// Leading with replicas (`replicas` > 1): where each worker's
    /// replicas run, and what they did — reported when the leader opens
    /// and whenever either changes.
    Replicas {
        /// Per worker, the names of the hosts its replicas run on, the
        /// primary's (which commits the worker's output) first.
        placement: Vec<Vec<String>>,
        /// Steps in which a follower took over from a failed primary, per
        /// worker, since the leader opened: nothing was replayed.
        failovers: u64,
        /// Followers' steps whose output hash was checked against their
        /// primary's (a difference stops the pipeline, naming both).
        checked: u64,
        /// Whose output was committed, as its changes since the leader
        /// opened (the last few): from step `.0` on, per worker, the name
        /// of the host whose replica's output was committed.
        committed_by: Vec<(u64, Vec<String>)>,
    },
}

/// How often a host that could not reach the pipeline's logs at start
/// tries again.
const REACH_AGAIN: Duration = Duration::from_secs(10);

/// Whether the pipeline's logs are in Kafka (the only logs a pipeline
/// across hosts takes).
fn is_kafka(config: &HostConfig) -> bool {
    !matches!(config.pipeline.log, crate::LogConfig::Embedded { .. })
}

/// What this host reaches of the pipeline's storage: its logs (opened
/// afresh; `None` when Kafka does not answer) and, with them, the shared
/// checkpoint store with this host's copy of the segments its workers
/// write — which checkpoints are committed is recorded in the logs, so a
/// host that cannot read them leaves its workers' pieces to the leader.
#[cfg_attr(not(feature = "kafka"), allow(unused_variables))]
async fn open_reach(config: &HostConfig, inputs: &[String]) -> Result<Reach> {
    type Reached = (
        Arc<dyn sluice_storage::LogBackend>,
        Arc<dyn sluice_storage::CheckpointLedger>,
    );
    let log: Option<Reached> = match &config.pipeline.log {
        #[cfg(feature = "kafka")]
        crate::LogConfig::Kafka { config: kafka } => {
            let mut kafka = kafka.clone();
            kafka.inputs = inputs.to_vec();
            match tokio::task::spawn_blocking(move || sluice_kafka::KafkaLog::open(kafka)).await {
                Ok(Ok(log)) => {
                    let log = Arc::new(log);
                    Some((log.clone(), log))
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "the pipeline's logs are out of reach: the leader will send this host's workers their input");
                    None
                }
                Err(e) => {
                    tracing::warn!(error = %e, "opening the pipeline's logs failed: the leader will send this host's workers their input");
                    None
                }
            }
        }
        crate::LogConfig::Embedded { .. } => None,
    };
    let checkpoints: Option<Arc<dyn sluice_storage::CheckpointStore>> =
        match (&config.pipeline.checkpoint_store, &log) {
            (Some(url), Some((_, ledger))) => Some(Arc::new(
                sluice_objstore::ObjectCheckpointStore::open(url)?
                    .with_cache(crate::storage::segment_cache(&config.pipeline.data))?
                    .with_ledger(ledger.clone()),
            )),
            _ => None,
        };
    Ok(Reach {
        checkpoints,
        log: log.map(|(log, _)| log),
        read_only_log: config.read_only_log,
    })
}

/// How often the group is read while nothing else happens.
const POLL: Duration = Duration::from_millis(200);

/// How many times a leader makes an upgrade the group asked for whose
/// outcome a failure left unknown before it answers that it failed.
const UPGRADE_TRIES: u32 = 3;

/// How often a leader tries again to reach members that did not answer.
const RETRY: Duration = Duration::from_secs(1);

/// How long a leader leaves out a host that refused it because it runs
/// another component (then asks again: it may have been restarted with
/// the leader's, as in a rolling upgrade), or that went silent during a
/// step (a link from it cut one way: then it is dialled again, and if the
/// link is still cut, one more step fails and it is left out again).
const LEFT_OUT: Duration = Duration::from_secs(30);

/// How long a leader may make no progress (open no coordinator, commit no
/// step) before it gives way to another member: ten times the group's TTL,
/// at least 10 s — long past a reopen's restore and replay, so only a host
/// that cannot reach what the pipeline needs (Kafka, the store) gives way.
fn give_way_after(ttl: Duration) -> Duration {
    (ttl * 10).max(Duration::from_secs(10))
}

/// Runs one host of a pipeline across hosts until `stop` turns true: on
/// stop, a leader checkpoints and leaves; a worker host leaves and keeps
/// serving until the leader has moved its workers away (its connection
/// closes) or a few TTLs pass.
// Without the Kafka backend every pipeline's logs are embedded, which a
// pipeline across hosts refuses at once: what follows that refusal is
// unreachable in such a build.
#[cfg_attr(
    not(feature = "kafka"),
    allow(unreachable_code, unused_variables, unused_mut)
)]
pub async fn run_host(
    engine: Arc<SluiceEngine>,
    component: LoadedComponent,
    membership: Arc<dyn Membership>,
    config: HostConfig,
    mut stop: watch::Receiver<bool>,
    mut report: impl FnMut(HostEvent) + Send,
) -> Result<()> {
    let mut component = component;
    if config.read_only_log && !config.inputs.is_empty() {
        return Err(sluice_core::ConfigError::Invalid(
            "a host that may not write the pipeline's logs (--read-only-log) cannot append \
             --input files: give them to a host that may"
                .into(),
        )
        .into());
    }
    let dialed = config.advertise.unwrap_or(config.listen);
    if dialed.ip().is_unspecified() {
        // The group records the address the other hosts dial: `0.0.0.0`
        // reaches nobody (and, as the default name, would be every host's).
        return Err(sluice_core::ConfigError::Invalid(format!(
            "address {dialed}: the other hosts dial the address this host listens on (or \
             advertises), so it must be one they reach (e.g. --listen 10.0.0.1:7900, or \
             --advertise 10.0.0.1:7900 with --listen 0.0.0.0:7900), not an unspecified one"
        ))
        .into());
    }
    if config.pipeline.checkpoint_store.is_none() {
        return Err(sluice_core::ConfigError::Invalid(
            "a pipeline across hosts keeps its checkpoints where every host reaches them: \
             name a store (--store)"
                .into(),
        )
        .into());
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| Error::Io {
            path: PathBuf::from(config.listen.to_string()),
            source: e,
        })?;
    let addr = match config.advertise {
        Some(advertised) => advertised,
        None => listener.local_addr().map_err(|e| Error::Io {
            path: PathBuf::from(config.listen.to_string()),
            source: e,
        })?,
    }
    .to_string();
    // The pipeline's identity is its Kafka name; the worker host checks
    // that coordinators run the same.
    let identity: String = match &config.pipeline.log {
        #[cfg(feature = "kafka")]
        crate::LogConfig::Kafka { config } => config.pipeline.clone(),
        crate::LogConfig::Embedded { .. } => {
            return Err(sluice_core::ConfigError::Invalid(
                "a pipeline across hosts keeps its logs in Kafka (--log kafka)".into(),
            )
            .into());
        }
    };
    // The pipeline's logs: its workers read their own input, and write
    // their checkpoint pieces to the shared store (whose commits the logs
    // record). A host that cannot reach Kafka now still serves workers
    // (the leader sends their input), and tries again in the background.
    let inputs = engine.describe(&component).await?.inputs;
    let reach = open_reach(&config, &inputs).await?;
    let (reads_input, writes_checkpoints) = (
        reach.log.is_some(),
        reach
            .checkpoints
            .as_ref()
            .is_some_and(|c| c.location().is_some()),
    );
    let read_only_log = config.read_only_log;
    let worker_host = WorkerHost::with_options(
        &engine,
        &component,
        &identity,
        &config.secret,
        HostOptions {
            tls: config.tls.clone(),
            reach: Reach {
                read_only_log,
                ..reach
            },
            session_timeout: config.session_timeout,
            // A coordinator of a newer component (after an upgrade): its
            // bytes are in the checkpoint store, by hash.
            components: config
                .pipeline
                .checkpoint_store
                .as_deref()
                .map(|store| follow::source(&engine, store)),
            ..HostOptions::default()
        },
    );
    // Served until this returns: dropping the set aborts the server. It is
    // watched: a host whose server ended leaves the group and returns the
    // error — never a member that serves nothing.
    let mut serving = tokio::task::JoinSet::new();
    serving.spawn(worker_host.clone().serve(listener));
    // Out of Kafka's reach at start: tried again in the background until it
    // answers (dropped with this function).
    let mut reaching = tokio::task::JoinSet::new();
    if !reads_input && is_kafka(&config) {
        let (host, config, inputs) = (worker_host.clone(), config.clone(), inputs.clone());
        reaching.spawn(async move {
            loop {
                tokio::time::sleep(REACH_AGAIN).await;
                let Ok(reach) = open_reach(&config, &inputs).await else {
                    continue;
                };
                if reach.log.is_some() {
                    tracing::info!(
                        "the pipeline's logs answer now: this host's workers read their own \
                         input from the leader's next session"
                    );
                    host.set_reach(Reach {
                        read_only_log: config.read_only_log,
                        ..reach
                    });
                    return;
                }
            }
        });
    }
    let me = Member {
        name: config.name.clone(),
        addr: addr.clone(),
        zone: config.zone.clone(),
    };
    let mut session: Box<dyn Session> = membership.join(me.clone()).await?;
    report(HostEvent::Joined {
        addr: addr.clone(),
        reads_input,
        writes_checkpoints,
    });
    let mut pipeline: Option<Pipeline> = None;
    // Where the workers ran when this host last led: a reopen keeps them
    // there (their hosts restore them from their own copies).
    let mut hint: Vec<String> = Vec::new();
    let mut ingested = false;
    let mut failures = 0u32;
    let mut alone_warned = false;
    // Hosts that refused this leader (another component) or went silent
    // during a step (a link from them cut one way), by address, and since
    // when: left out of its coordinators for `LEFT_OUT`.
    let mut left_out: HashMap<String, Instant> = HashMap::new();
    // When this host, leading, last made progress (started leading, opened
    // a coordinator, committed a step): one that makes none for
    // `give_way_after` gives way to another member.
    let mut progress = Instant::now();
    // Upgrades the group asked for that failed here, by request.
    let mut upgrade_tries: HashMap<String, u32> = HashMap::new();
    // The component this host last said the pipeline runs: its own, then
    // one it upgraded to or followed, or the leader's coordinators started
    // its workers with.
    let mut reported = component.hash.clone();
    loop {
        if *stop.borrow() {
            break;
        }
        if let Some(ended) = serving.try_join_next() {
            let _ = session.leave().await;
            return Err(serving_ended(config.listen, ended));
        }
        if !session.alive() {
            // Lapsed: another host may lead meanwhile (and commit,
            // checkpoint, trim). A next lead opens the logs afresh, taking
            // them over again, not with this handle's view of them.
            pipeline = None;
            hint.clear();
            // An etcd outage never ends the host: its worker server keeps
            // serving the leader it has meanwhile.
            match rejoin(&*membership, &me, &mut stop).await? {
                Some(again) => session = again,
                None => break,
            }
            report(HostEvent::Rejoined);
        }
        let view = match membership.view().await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "reading the group failed");
                tokio::time::sleep(POLL).await;
                continue;
            }
        };
        if view.leader().map(|m| m.name.as_str()) != Some(config.name.as_str()) {
            // Not leading: drop the pipeline (and its data directory lock)
            // if we led before, and serve workers.
            pipeline = None;
            hint.clear();
            progress = Instant::now();
            if let Some(started) = worker_host.take_started()
                && started != reported
            {
                reported = started.clone();
                report(HostEvent::Fetched { component: started });
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = stop.changed() => {}
                Some(ended) = serving.join_next() => {
                    let _ = session.leave().await;
                    return Err(serving_ended(config.listen, ended));
                }
            }
            continue;
        }
        if config.read_only_log {
            // A leader writes the logs, which this host may not: it goes to
            // the back of the group, behind the hosts that can lead. (When
            // no member may, they take turns at the back, each once per
            // TTL.)
            if view.members.len() > 1 {
                match step_aside(session, &*membership, &me, &mut stop).await? {
                    Some(again) => session = again,
                    // Stopping, out of the group already.
                    None => return Ok(()),
                }
                report(HostEvent::SteppedAside);
                alone_warned = false;
            } else if !alone_warned {
                alone_warned = true;
                tracing::warn!(
                    "the only host of the pipeline may not write its logs (--read-only-log): \
                     nothing runs until a host that may joins"
                );
            }
            tokio::select! {
                _ = tokio::time::sleep(membership.ttl()) => {}
                _ = stop.changed() => {}
            }
            continue;
        }
        // A `Start` from before this lead (or a stale coordinator's) says
        // nothing of the pipeline now.
        worker_host.take_started();
        // Whether this lead opens the logs afresh (else it goes on with the
        // handle of an earlier lead), and when it began.
        let fresh = pipeline.is_none();
        let began = Instant::now();
        // Opening the pipeline's logs fails like a lead does: Kafka out of
        // reach (a leader that reaches etcd but not Kafka) is tried again,
        // or given way to a member that may reach it.
        let led = async {
            if pipeline.is_none() {
                let opened =
                    Pipeline::open(engine.clone(), component.clone(), config.pipeline.clone())
                        .await;
                pipeline = Some(match opened {
                    Ok(p) => p,
                    // Another host moved the pipeline to another component
                    // (its open refuses this one): follow it.
                    Err(e) if !e.is_transient() => {
                        let Some(to) = follow::recorded_change(&config, &component.hash).await
                        else {
                            return Err(e);
                        };
                        let store = config.pipeline.checkpoint_store.as_deref();
                        let store = store.unwrap_or_default();
                        let new = match follow::fetch(&engine, store, &to).await? {
                            Some(new) => new,
                            None => {
                                tracing::error!(error = %e, "opening the pipeline");
                                let short = sluice_embedded::meta::short_hash(&to);
                                return Err(sluice_core::ConfigError::Invalid(format!(
                                    "the pipeline was upgraded to component {short}, which is \
                                     not in its checkpoint store ({store}): start this host \
                                     with that component's file"
                                ))
                                .into());
                            }
                        };
                        tracing::info!(component = %to, "another host upgraded the pipeline: following");
                        worker_host.add_component(new.clone());
                        component = new;
                        reported = to.clone();
                        report(HostEvent::Followed {
                            component: to.clone(),
                        });
                        Pipeline::open(engine.clone(), component.clone(), config.pipeline.clone())
                            .await?
                    }
                    Err(e) => return Err(e),
                });
                // Opened with another component than it last reported: one
                // it made an upgrade to, and lost the lead before it
                // answered (the next leader did).
                if component.hash != reported {
                    reported = component.hash.clone();
                    report(HostEvent::Followed {
                        component: reported.clone(),
                    });
                }
            }
            let p = pipeline.as_ref().expect("just opened");
            if !ingested {
                for (port, file) in &config.inputs {
                    p.ingest_file(port, file, |_, _| {}).await?;
                }
                ingested = true;
            }
            lead::lead(
                p,
                &config,
                &worker_host,
                &view,
                &*membership,
                &*session,
                &mut stop,
                &mut report,
                &mut hint,
                &mut left_out,
                &mut progress,
            )
            .await
        };
        match led.await {
            Ok(lead::Led::Ended(reason)) => {
                failures = 0;
                report(HostEvent::LeadEnded { reason });
            }
            Ok(lead::Led::Upgrade(request)) => {
                // The upgrade is made on this host's data directory, which
                // the pipeline lets go of; then it opens again across the
                // hosts with the component it runs after.
                pipeline = None;
                hint.clear();
                report(HostEvent::LeadEnded {
                    reason: format!(
                        "upgrading to component {}",
                        sluice_embedded::meta::short_hash(&request.to)
                    ),
                });
                let (answer, new) = follow::perform(&engine, &config, &request).await;
                let made = new.as_ref().map(|n| n.hash.clone());
                if let Some(new) = new {
                    worker_host.add_component(new.clone());
                    component = new;
                }
                // A host that lost the lead meanwhile (it stalled past its
                // session) does not answer: the leader now does. (Its
                // refusal, "another host ran the pipeline", would be
                // false: that leader has made the request, or makes it.)
                let answer = if still_leads(&*membership, &*session, &config.name).await {
                    // An outcome not known here is settled by the next
                    // lead (made again, or answered as made); a few times
                    // at most.
                    let tries = upgrade_tries.entry(request.id.clone()).or_insert(0);
                    *tries += 1;
                    answer.or_else(|| {
                        (*tries >= UPGRADE_TRIES).then(|| {
                            sluice_cluster::UpgradeAnswer::Refused(format!(
                                "the upgrade failed {UPGRADE_TRIES} times (this host's log \
                                 says why): nothing changed"
                            ))
                        })
                    })
                } else {
                    tracing::warn!("lost the lead during the upgrade: the next leader answers it");
                    None
                };
                if let Some(answer) = answer {
                    if let Err(e) = membership.answer_upgrade(&request.id, answer.clone()).await {
                        // Asked again at the next lead's first look:
                        // answered then as made (or made again).
                        tracing::warn!(error = %e, "answering the group's upgrade request failed");
                    }
                    reported = made.unwrap_or(reported);
                    report(HostEvent::Upgraded {
                        to: request.to.clone(),
                        answer,
                    });
                }
                progress = Instant::now();
            }
            Err(e) if e.as_runtime().and_then(|r| r.refusing_host()).is_some() => {
                // A host that runs another component: reopening with it
                // would fail the same way. Lead without it, at once.
                let host = e.as_runtime().and_then(|r| r.refusing_host());
                let host = host.unwrap_or_default().to_owned();
                tracing::warn!(
                    %host,
                    error = %e,
                    "a host runs another component: leading without it (asked again every {:?})",
                    LEFT_OUT
                );
                report(HostEvent::LeadEnded {
                    reason: e.to_string(),
                });
                left_out.insert(host, Instant::now());
            }
            Err(e) if e.is_transient() => {
                // Failures in a row back off; one after a lead that ran a
                // while (a fault now, after a healthy run) does not wait
                // for the faults before it.
                failures = match began.elapsed() > membership.ttl() {
                    true => 1,
                    false => failures + 1,
                };
                tracing::warn!(error = %e, failures, "leading failed; recovering on the group as it is");
                report(HostEvent::LeadEnded {
                    reason: e.to_string(),
                });
                if gives_way(&view, &progress, membership.ttl()) {
                    // Another member leads next: this one's pipeline (and
                    // its data directory's lock) goes.
                    pipeline = None;
                    hint.clear();
                    match give_way(
                        session,
                        &*membership,
                        &me,
                        &mut stop,
                        &progress,
                        &e,
                        &mut report,
                    )
                    .await?
                    {
                        Some(again) => session = again,
                        None => return Ok(()),
                    }
                    progress = Instant::now();
                    continue;
                }
                // A dead host stays in the group until its TTL passes:
                // wait a little before trying it again.
                tokio::time::sleep(POLL * failures.min(10)).await;
            }
            Err(e) if e.as_runtime().is_some_and(|r| r.kind() == "fenced") => {
                // Another host took the pipeline over while this one
                // believed it led (it stalled): it is not ours any more.
                pipeline = None;
                hint.clear();
                report(HostEvent::LeadEnded {
                    reason: e.to_string(),
                });
                tokio::time::sleep(POLL).await;
            }
            Err(e) if !fresh => {
                // A lead that went on with an earlier lead's handle failed
                // for good: it may be the handle that is stale (the logs
                // moved on under another leader). Open them afresh once
                // before believing it.
                tracing::warn!(error = %e, "leading failed; opening the pipeline's logs afresh");
                pipeline = None;
                hint.clear();
                report(HostEvent::LeadEnded {
                    reason: e.to_string(),
                });
            }
            Err(e) => return Err(e),
        }
    }
    // Stopping.
    let was_leading = pipeline.is_some();
    drop(pipeline);
    let _ = session.leave().await;
    if !was_leading {
        // Keep serving until the leader has moved our workers away.
        let grace = membership.ttl() * 3;
        tokio::time::sleep(grace.min(Duration::from_secs(10))).await;
    }
    Ok(())
}

/// Whether host `me` still leads the group: its membership holds and the
/// group's view names it first. (A view that cannot be read: no.)
async fn still_leads(membership: &dyn Membership, session: &dyn Session, me: &str) -> bool {
    if !session.alive() {
        return false;
    }
    match membership.view().await {
        Ok(view) => view.leader().is_some_and(|m| m.name == me),
        Err(_) => false,
    }
}

/// Whether a leader that made no progress since `progress` gives way: it
/// has for [`give_way_after`] and the group has others. Stepping aside is
/// always safe: whoever leads next fences this host's producers.
fn gives_way(view: &View, progress: &Instant, ttl: Duration) -> bool {
    progress.elapsed() >= give_way_after(ttl) && view.members.len() > 1
}

/// Gives way after `error` ended a lead that made no progress since
/// `progress`: says why, steps aside and reports it. `None` if this host
/// is stopping meanwhile (out of the group).
async fn give_way(
    session: Box<dyn Session>,
    membership: &dyn Membership,
    me: &Member,
    stop: &mut watch::Receiver<bool>,
    progress: &Instant,
    error: &Error,
    report: &mut (impl FnMut(HostEvent) + Send),
) -> Result<Option<Box<dyn Session>>> {
    let idle = progress.elapsed();
    tracing::warn!(
        ?idle,
        error = %error,
        "leading made no progress (Kafka or the checkpoint store out of this host's reach?): \
         giving way to another member"
    );
    let again = step_aside(session, membership, me, stop).await?;
    if again.is_some() {
        report(HostEvent::GaveWay {
            idle,
            reason: error.to_string(),
        });
    }
    Ok(again)
}

/// Leaves the group and joins it again, at the end of the order (to step
/// aside); `None` if this host is stopping meanwhile (out of the group).
async fn step_aside(
    session: Box<dyn Session>,
    membership: &dyn Membership,
    me: &Member,
    stop: &mut watch::Receiver<bool>,
) -> Result<Option<Box<dyn Session>>> {
    if let Err(e) = session.leave().await {
        tracing::debug!(error = %e, "leaving the group to step aside");
    }
    rejoin(membership, me, stop).await
}

/// Joins the group again (after this host's membership lapsed, or to
/// step aside), trying until the group's store answers or `stop` turns
/// true (`None`): an etcd outage longer than the TTL never ends a host.
/// Meanwhile its worker server serves the leader it has, and a leader that
/// kept leading is fenced by Kafka if another host took over. A refusal
/// that waiting does not mend (the name taken by another host) is
/// returned.
async fn rejoin(
    membership: &dyn Membership,
    me: &Member,
    stop: &mut watch::Receiver<bool>,
) -> Result<Option<Box<dyn Session>>> {
    let started = Instant::now();
    let mut tries = 0u32;
    loop {
        if *stop.borrow() {
            return Ok(None);
        }
        match membership.join(me.clone()).await {
            Ok(session) => {
                if tries > 0 {
                    tracing::info!(
                        after = ?started.elapsed(),
                        "the group answers again: joined"
                    );
                }
                return Ok(Some(session));
            }
            Err(e @ sluice_cluster::Error::Backend { .. }) => {
                tries += 1;
                if tries == 1 || tries.is_multiple_of(20) {
                    tracing::warn!(
                        error = %e,
                        for_ = ?started.elapsed(),
                        "the group does not answer: serving on, joining again when it does"
                    );
                }
                let wait = (POLL * tries.min(10)).min(membership.ttl());
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.changed() => {}
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Why a host's worker server on `listen` ended (it serves until its
/// listener is unusable): the error `run_host` returns, having left the
/// group.
fn serving_ended(
    listen: std::net::SocketAddr,
    ended: std::result::Result<sluice_runtime::Result<()>, tokio::task::JoinError>,
) -> Error {
    let why = match ended {
        Ok(Ok(())) => "it ended".to_owned(),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    };
    Error::Io {
        path: PathBuf::from(listen.to_string()),
        source: std::io::Error::other(format!(
            "this host's worker server stopped serving ({why}): it left the pipeline's group \
             rather than stay a member that serves nothing"
        )),
    }
}
