//! The leader's loop ([`lead`]): it opens a coordinator on the members that
//! answer, steps it, dials members that join or answer again and moves
//! their share of the workers live, and returns when a step fails, the
//! group changes so that it must reopen, or the host stops. A step that
//! fails because a host went silent leaves that host out for a while.

use super::{HostConfig, HostEvent, LEFT_OUT, POLL, RETRY};
use crate::error::Result;
use crate::pipeline::Pipeline;
use sluice_cluster::{Member, Membership, Session, View};
use sluice_runtime::{Coordinator, RemoteHost, WorkerHost};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How a lead ended (else it failed).
#[derive(Debug)]
pub(super) enum Led {
    /// It stopped leading, for this reason.
    Ended(String),
    /// The group asks for an upgrade: the coordinator checkpointed its last
    /// step and went; this host makes the upgrade on its data directory.
    Upgrade(sluice_cluster::UpgradeRequest),
}

/// Leads until the group changes, this host must stop, a step fails, or
/// the group asks for an upgrade; says which ([`Led`]). `hint` is where
/// the workers ran when this host last led (kept where their hosts still
/// are), and where they run now when this returns.
#[allow(clippy::too_many_arguments)]
pub(super) async fn lead(
    pipeline: &Pipeline,
    config: &HostConfig,
    own: &Arc<WorkerHost>,
    view: &View,
    membership: &dyn Membership,
    session: &dyn Session,
    stop: &mut watch::Receiver<bool>,
    report: &mut (impl FnMut(HostEvent) + Send),
    hint: &mut Vec<String>,
    left_out: &mut HashMap<String, Instant>,
    progress: &mut Instant,
) -> Result<Led> {
    let started = Instant::now();
    let identity = pipeline.options().name.clone();
    let connect = |addr: String| {
        let (identity, secret, timeout, tls) = (
            identity.clone(),
            config.secret.clone(),
            config.session_timeout,
            config.tls.clone(),
        );
        async move { RemoteHost::connect_with(&addr, &identity, &secret, tls.as_ref(), timeout).await }
    };
    // The other members' worker hosts, by name, in the view's order — those
    // that answer: a member that died stays in the group until its lease
    // lapses, and the pipeline need not wait for that (it is tried again
    // every RETRY, and takes its share live when it answers).
    left_out.retain(|_, since| since.elapsed() < LEFT_OUT);
    let mut connected: Vec<(String, Arc<RemoteHost>)> = Vec::new();
    let others = |m: &&Member| {
        m.name != config.name
            && left_out
                .get(&m.addr)
                .is_none_or(|since| since.elapsed() >= LEFT_OUT)
    };
    for member in view.members.iter().filter(others) {
        match connect(member.addr.clone()).await {
            Ok(h) => connected.push((member.name.clone(), h)),
            Err(e) if e.is_transient() => {
                tracing::warn!(host = %member.name, error = %e, "a member does not answer: leading without it");
            }
            Err(e) => return Err(e.into()),
        }
    }
    let names = |connected: &[(String, Arc<RemoteHost>)]| -> Vec<String> {
        std::iter::once(config.name.clone())
            .chain(connected.iter().map(|(n, _)| n.clone()))
            .collect()
    };
    // The workers a leader before left on this host and the others are
    // adopted where they hold the log's last step.
    let options = sluice_runtime::PipelineOptions {
        placement_hint: hint.clone(),
        own_host: Some(own.clone()),
        zones: zones(view, config),
        ..pipeline.options().clone()
    };
    let mut coordinator: Coordinator = pipeline
        .coordinator_on(options, connected.iter().map(|(_, h)| h.clone()).collect())
        .await?;
    *hint = coordinator.placement_addrs();
    *progress = Instant::now();
    report(HostEvent::Leading {
        hosts: names(&connected),
        restored: coordinator.stats().restored_checkpoint,
        restored_local: coordinator.stats().restored_local_bytes,
        restored_fetched: coordinator.stats().restored_fetched_bytes,
        replayed: coordinator.stats().replayed_steps,
        adopted: coordinator.stats().adopted,
        took: started.elapsed(),
    });
    // With replicas: what was last said of them.
    let mut replicas_said: Option<(Vec<Vec<String>>, u64)> = None;
    let mut view = view.clone();
    let mut last_check = Instant::now();
    // Members not connected yet (joined, or did not answer), being dialed
    // in the background so the steps go on meanwhile.
    let mut dialing: Vec<(
        String,
        tokio::task::JoinHandle<sluice_runtime::Result<Arc<RemoteHost>>>,
    )> = Vec::new();
    let mut last_dial: Option<Instant> = None;
    let mut lapsed_warned = false;
    loop {
        if *stop.borrow() {
            coordinator.finish().await?;
            return Ok(Led::Ended("stopping".into()));
        }
        if last_check.elapsed() >= POLL {
            last_check = Instant::now();
            let now = membership.view().await;
            if !session.alive() {
                if now.is_ok() {
                    // Lapsed while the group answers: another host may
                    // lead already. Leave the coordinator as it is (a
                    // checkpoint would be fenced) and join again.
                    return Ok(Led::Ended("this host's membership lapsed".into()));
                }
                // Lapsed because the group does not answer (etcd is
                // away): lead on. Kafka fences this host's commits if
                // another host takes the pipeline over meanwhile.
                if !lapsed_warned {
                    lapsed_warned = true;
                    tracing::warn!(
                        "the group does not answer and this host's membership lapsed: leading \
                         on while Kafka's fencing holds; joining again when the group answers"
                    );
                }
            }
            // An upgrade the group asks for, made by its leader as the
            // group sees it now (a host that no longer leads leaves it to
            // the one that does).
            let leads =
                |v: &View| v.leader().map(|m| m.name.as_str()) == Some(config.name.as_str());
            if matches!(&now, Ok(v) if leads(v))
                && session.alive()
                && let Some(request) = asked_upgrade(pipeline, membership).await
            {
                // The upgrade is made at a checkpoint of the last step.
                coordinator.finish().await?;
                return Ok(Led::Upgrade(request));
            }
            // With replicas, a host whose connection ended is given up by
            // the coordinator (a follower took over): it leaves the
            // placement live, and is dialed again like a member not
            // connected, taking its share back when it answers.
            let on = coordinator.host_addrs();
            let usable =
                |h: &Arc<RemoteHost>| h.closed().is_none() || on.iter().any(|a| a == h.addr());
            let given_up = connected.iter().any(|(_, h)| !usable(h));
            if let Ok(now) = &now {
                // Dial the members not connected (again every RETRY).
                dialing.retain(|(n, _)| now.contains(n));
                if last_dial.is_none_or(|t| t.elapsed() >= RETRY) {
                    last_dial = Some(Instant::now());
                    for member in now.members.iter().filter(others) {
                        let known = connected
                            .iter()
                            .any(|(n, h)| *n == member.name && usable(h))
                            || dialing.iter().any(|(n, _)| *n == member.name);
                        if !known {
                            let dial = tokio::spawn(connect(member.addr.clone()));
                            dialing.push((member.name.clone(), dial));
                        }
                    }
                }
            }
            let mut answered: Vec<(String, Arc<RemoteHost>)> = Vec::new();
            let mut still = Vec::new();
            for (name, dial) in dialing.drain(..) {
                if !dial.is_finished() {
                    still.push((name, dial));
                    continue;
                }
                match dial.await {
                    Ok(Ok(h)) => answered.push((name, h)),
                    Ok(Err(e)) => {
                        tracing::debug!(host = %name, error = %e, "a member does not answer");
                    }
                    Err(e) => tracing::warn!(host = %name, error = %e, "dialing a member failed"),
                }
            }
            dialing = still;
            match now {
                Ok(now)
                    if now.leader() == view.leader()
                        && (now != view || !answered.is_empty() || given_up)
                        && {
                            // Hosts that left are still reachable (they
                            // leave gracefully, serving until their workers
                            // are moved), or the coordinator no longer runs
                            // on them (replicas: a follower took over).
                            connected
                                .iter()
                                .filter(|(n, _)| !now.contains(n))
                                .all(|(_, h)| {
                                    h.closed().is_none() || !on.iter().any(|a| a == h.addr())
                                })
                        } =>
                {
                    // Move only the workers whose host changes, live, from
                    // their old instances: a host joining (or answering
                    // again) takes its share, one leaving hands over its
                    // own workers.
                    let started = Instant::now();
                    let mut next = Vec::new();
                    for member in now.members.iter().filter(|m| m.name != config.name) {
                        let host = answered
                            .iter()
                            .chain(connected.iter().filter(|(_, h)| usable(h)))
                            .find(|(n, _)| *n == member.name);
                        if let Some((_, h)) = host {
                            next.push((member.name.clone(), h.clone()));
                        }
                    }
                    view = now;
                    coordinator.set_zones(zones(&view, config));
                    let same = next.len() == connected.len()
                        && next.iter().zip(&connected).all(|((a, _), (b, _))| a == b);
                    if same {
                        continue;
                    }
                    let before = coordinator.stats().workers_moved;
                    let moved = match coordinator
                        .replace_hosts(next.iter().map(|(_, h)| h.clone()).collect())
                        .await
                    {
                        Ok(moved) => moved,
                        // The instances are gone: reopen on the group as
                        // it is (from the newest checkpoint).
                        Err(e) => {
                            return Ok(Led::Ended(format!(
                                "the group changed ({} → {} hosts) and moving workers live failed: {e}",
                                connected.len() + 1,
                                next.len() + 1
                            )));
                        }
                    };
                    connected = next;
                    *hint = coordinator.placement_addrs();
                    let workers = coordinator.stats().workers_moved - before;
                    tracing::info!(moved, workers, "the group changed: workers moved live");
                    report(HostEvent::Moved {
                        hosts: names(&connected),
                        workers,
                        bytes: moved,
                        took: started.elapsed(),
                    });
                }
                Ok(now) if now != view => {
                    // A host died (or the leader changed): checkpoint while
                    // the hosts we run on are there, then reopen on the
                    // group as it is.
                    let saved = coordinator.finish().await;
                    return Ok(Led::Ended(format!(
                        "the group changed ({} → {} hosts){}",
                        view.members.len(),
                        now.members.len(),
                        match saved {
                            Ok(()) => String::new(),
                            Err(e) => format!("; no checkpoint first: {e}"),
                        }
                    )));
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "reading the group failed"),
            }
        }
        // A step that commits, or finds no input, reached what it needs.
        let stepped = match coordinator.step().await {
            Ok(stepped) => stepped,
            Err(e) => {
                // A host that went silent (a link from it cut one way, or
                // it stalled) would fail the next session's steps the
                // same way until the link heals: lead without it a while.
                if let Some(slot) = e.silent_slot().filter(|s| *s > 0)
                    && let Some((name, host)) = connected.get(slot as usize - 1)
                {
                    tracing::warn!(
                        host = %name,
                        "a host went silent during a step: leading without it for {LEFT_OUT:?}"
                    );
                    left_out.insert(host.addr().to_owned(), Instant::now());
                }
                return Err(e.into());
            }
        };
        *progress = Instant::now();
        if coordinator.replicas_wanted() > 1 {
            let placement = replica_names(&coordinator, &config.name, &connected);
            let failovers = coordinator.stats().failovers;
            let now = Some((placement, failovers));
            if now != replicas_said {
                let (placement, failovers) = now.clone().unwrap_or_default();
                let name = host_name(&config.name, &connected);
                let committed_by = coordinator
                    .stats()
                    .committed_by
                    .iter()
                    .map(|(step, by)| (*step, by.iter().map(&name).collect()))
                    .collect();
                report(HostEvent::Replicas {
                    placement,
                    failovers,
                    checked: coordinator.stats().replica_steps_checked,
                    committed_by,
                });
                replicas_said = now;
            }
        }
        if !stepped {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = stop.changed() => {}
            }
        }
    }
}

/// An upgrade the group asks for, pending and to another component than
/// `pipeline`'s. One to the component the pipeline runs was made (by a
/// leader that went before answering it): answered here.
async fn asked_upgrade(
    pipeline: &Pipeline,
    membership: &dyn Membership,
) -> Option<sluice_cluster::UpgradeRequest> {
    let request = match membership.upgrade_request().await {
        Ok(Some(request)) if request.answer.is_none() => request,
        Ok(_) => return None,
        Err(e) => {
            tracing::warn!(error = %e, "reading the group's upgrade request failed");
            return None;
        }
    };
    let runs = &pipeline.component().hash;
    if request.to != *runs {
        return Some(request);
    }
    let said = format!(
        "the pipeline runs component {}",
        sluice_embedded::meta::short_hash(runs)
    );
    let answered = sluice_cluster::UpgradeAnswer::Upgraded(said);
    if let Err(e) = membership.answer_upgrade(&request.id, answered).await {
        tracing::warn!(error = %e, "answering the group's upgrade request failed");
    }
    None
}

/// The zone of each member that has one, by the address the leader dials
/// (this host's own under "", as the coordinator knows its own process).
fn zones(view: &View, config: &HostConfig) -> std::collections::BTreeMap<String, String> {
    let mut zones: std::collections::BTreeMap<String, String> = view
        .members
        .iter()
        .filter(|m| m.name != config.name)
        .filter_map(|m| Some((m.addr.clone(), m.zone.clone()?)))
        .collect();
    if let Some(zone) = &config.zone {
        zones.insert(String::new(), zone.clone());
    }
    zones
}

/// The name of the host at a coordinator's address for it: this host's
/// `me` (empty: the coordinator's own process), a connected member's name,
/// or — for a host not connected under a name — its address.
fn host_name<'a>(
    me: &'a str,
    connected: &'a [(String, Arc<RemoteHost>)],
) -> impl Fn(&String) -> String + 'a {
    move |addr: &String| -> String {
        if addr.is_empty() {
            return me.to_owned();
        }
        connected
            .iter()
            .find(|(_, h)| h.addr() == addr)
            .map_or_else(|| addr.clone(), |(n, _)| n.clone())
    }
}

/// Per worker, the names of the hosts its replicas run on (its primary's
/// first): this host's `me`, a connected member's name, or — for a host
/// not connected under a name — its address.
fn replica_names(
    c: &Coordinator,
    me: &str,
    connected: &[(String, Arc<RemoteHost>)],
) -> Vec<Vec<String>> {
    let name = host_name(me, connected);
    c.placement_addrs()
        .iter()
        .zip(
            c.replica_addrs()
                .iter()
                .chain(std::iter::repeat(&Vec::new())),
        )
        .map(|(p, fs)| std::iter::once(p).chain(fs).map(&name).collect())
        .collect()
}
