//! `sluice chaos --hosts`: a fault campaign against a pipeline across
//! hosts.
//!
//! Every trial runs word count with deletes over fresh random input, W = 3,
//! on a coordinator and two worker hosts ([`WorkerHost`](sluice_runtime::WorkerHost)s on loopback TCP,
//! each behind a proxy the campaign controls), and injects one to four
//! faults at random step counts:
//!
//! - **kill**: a worker host dies (its server and every connection end)
//!   mid-run; a fresh host replaces it;
//! - **stall**: a worker host stops answering (its proxy holds every byte,
//!   as a SIGSTOPped process or a cut link would), so the coordinator's
//!   step waits out the session timeout and fails; the stalled host is
//!   replaced and resumes later as a zombie (its late bytes go nowhere);
//! - **leader crash**: the coordinator is dropped at a random moment of a
//!   step (its in-flight commit may or may not land, racing the next
//!   leader's fencing), as if its process died — its connections just end,
//!   and the next coordinator adopts the workers the hosts kept where they
//!   hold the log's last step (or the step in flight, which it records);
//! - **join**: a fresh host joins the running coordinator and takes its
//!   share of the workers live (up to four hosts);
//! - **leave**: a host leaves gracefully — its workers move live to the
//!   others — and is gone.
//!
//! With `--network` the hosts' proxies also fail the network, each fault
//! healing after a random while (half the session timeout to three times
//! it): one direction into a host cut (a one-way partition: the
//! connection stays up, nothing of that way arrives until it heals, as
//! TCP retransmits), one direction out of it cut, every byte delayed past the
//! session timeout, every connection reset, every open connection left
//! half-open for good. A coordinator that cannot reach a host opens without
//! it (as a leader does), and the trial fails as **stuck** when, after a
//! fault heals, no step commits within twice the session timeout.
//!
//! The hosts read their workers' input from the log themselves and write
//! their workers' checkpoint pieces to the pipeline's shared store (a
//! directory), keeping a copy. After a kill, stall or crash the coordinator
//! is reopened on the hosts there are — restore (half the time keeping the
//! surviving workers where they were, as a leader that survives does),
//! replay, go on — until all input is consumed. Then the
//! integrated output is compared with a recount (lost, duplicated, wrong)
//! and the logs are audited.

use super::Rng;
use super::proxy::{SECRET, start_host};
use super::report::{Differences, HostsChaosReport};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use sluice_core::Event;
use sluice_embedded::audit::audit_embedded_with;
use sluice_pipeline::{Pipeline, PipelineConfig};
use sluice_runtime::{LoadedComponent, PipelineOptions, Reach, RemoteHost, SluiceEngine};
use sluice_storage::audit::Verdict;
use sluice_storage::log::AppendBatch;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The session timeout: a host silent this long is lost.
const SESSION: Duration = Duration::from_millis(400);

/// The session timeout of the network campaign: long enough for a
/// reopen to restore and replay on a loaded machine within twice it.
const NET_SESSION: Duration = Duration::from_secs(1);

/// How long one step may take before the trial fails: far past the session
/// timeout, after which a lost host fails the step.
const STEP_LIMIT: Duration = Duration::from_secs(30);

/// A fault a trial injects.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// A worker host dies; a fresh one replaces it.
    Kill,
    /// A worker host stops answering (its proxy holds every byte).
    Stall,
    /// The coordinator is dropped at a random moment of a step.
    LeaderCrash,
    /// A host joins the running coordinator: its share moves live.
    Join,
    /// A host leaves gracefully: its workers move live, then it is gone.
    Leave,
    /// (Network.) Bytes into a host are dropped silently for a while.
    DropIn,
    /// (Network.) Bytes out of a host are dropped silently for a while.
    DropOut,
    /// (Network.) Every byte to and from a host is delayed past the session
    /// timeout for a while.
    Delay,
    /// (Network.) Every connection of a host is reset.
    Reset,
    /// (Network.) Every connection of a host open now is left half-open.
    HalfOpen,
}

/// One trial (seed `seed`): word count across hosts with faults injected,
/// recovered until all input is consumed, then the output recounted and the
/// logs audited, into `report`.
async fn trial(
    engine: &Arc<SluiceEngine>,
    component: &LoadedComponent,
    seed: u64,
    network: bool,
    replicas: u32,
    report: &mut HostsChaosReport,
) -> anyhow::Result<()> {
    let mut rng = Rng(seed | 1);
    let session = if network { NET_SESSION } else { SESSION };
    // When the last network fault healed, until a step commits after it,
    // and how many faults were injected so far: a fault injected before
    // that commit takes the wait over (it delays the commit for reasons
    // of its own, and an earlier fault healing meanwhile does not count).
    let healed: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    let injected = Arc::new(AtomicU64::new(0));
    let dir = tempfile::tempdir()?;
    let options = PipelineOptions {
        max_batch: 5 + rng.below(20),
        checkpoint_every_steps: 2 + rng.below(6),
        checkpoint_interval: Duration::from_secs(3600),
        replicas,
        ..PipelineOptions::default()
    };
    let store = format!("file://{}", dir.path().join("store").display());
    let config = PipelineConfig {
        partitions: Some(6),
        options: options.clone(),
        checkpoint_store: Some(store.clone()),
        ..PipelineConfig::new(dir.path().join("data"), 3)
    };
    let pipeline = Pipeline::open(engine.clone(), component.clone(), config).await?;
    let name = pipeline.options().name.clone();
    let log = pipeline.storage().log.clone();
    // Each host: the log, and the store with a copy of its own.
    let hosts_made = std::sync::atomic::AtomicU32::new(0);
    let reach = || -> anyhow::Result<Reach> {
        let n = hosts_made.fetch_add(1, Ordering::Relaxed);
        Ok(Reach {
            checkpoints: Some(Arc::new(
                sluice_objstore::ObjectCheckpointStore::open(&store)?
                    .with_cache(dir.path().join(format!("host{n}")))?,
            )),
            log: Some(log.clone()),
            read_only_log: false,
        })
    };

    // Input: lines of words, some deleting an earlier line.
    let mut lines: Vec<(String, i64)> = Vec::new();
    let n = 300 + rng.below(600) as usize;
    for i in 0..n {
        if i > 10 && rng.below(15) == 0 {
            let victim = lines[rng.below(lines.len() as u64) as usize].0.clone();
            lines.push((victim, -1));
        } else {
            let words: Vec<String> = (0..1 + rng.below(4))
                .map(|_| format!("w{}", rng.below(150)))
                .collect();
            lines.push((words.join(" "), 1));
        }
    }
    for (i, chunk) in lines.chunks(40).enumerate() {
        let events = chunk
            .iter()
            .map(|(l, w)| Event {
                value: serde_json::to_vec(l).expect("a string"),
                weight: *w,
            })
            .collect();
        log.append(AppendBatch {
            appends: vec![("lines".into(), (i % 6) as u32, events)],
            mark: None,
            producer: None,
        })?;
    }

    // Faults at random step counts (steps run since the trial began).
    let expected_steps = (n as u64 / 6 / options.max_batch).max(2);
    let mut faults: Vec<(u64, Fault)> = (0..1 + rng.below(4))
        .map(|_| {
            let at = 1 + rng.below(expected_steps);
            let fault = match rng.below(if network { 12 } else { 5 }) {
                0 => Fault::Kill,
                1 => Fault::Stall,
                2 => Fault::LeaderCrash,
                3 => Fault::Join,
                4 => Fault::Leave,
                5 | 6 => Fault::DropIn,
                7 | 8 => Fault::DropOut,
                9 => Fault::Delay,
                10 => Fault::Reset,
                _ => Fault::HalfOpen,
            };
            (at, fault)
        })
        .collect();
    faults.sort_by_key(|(at, _)| std::cmp::Reverse(*at));

    let mut hosts = vec![
        start_host(engine, component, &name, &reach, session).await?,
        start_host(engine, component, &name, &reach, session).await?,
    ];
    let mut zombies = Vec::new();
    let mut ran = 0u64;
    // The first wait from a fault's healing to the next commit that took
    // longer than twice the session timeout.
    let mut stuck: Option<Duration> = None;
    // Where the workers ran under the last coordinator.
    let mut hint: Vec<String> = Vec::new();
    // Host faults since the coordinator last ran on every live host: with
    // replicas, a recovery after one is a replay with a live replica.
    let mut faults_since_whole: u32;
    // The coordinator crashed: the next one opened takes over from it.
    let mut leader_crashed = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    'run: loop {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the trial did not finish in 120 s"
        );
        // Hosts that stalled are gone from the group by now (a leader
        // would not see them): fresh ones take their place, the stalled
        // ones wake up later as zombies.
        for i in (0..hosts.len()).rev() {
            if hosts[i].frozen.load(Ordering::Relaxed) {
                let stalled = hosts.remove(i);
                hosts.push(start_host(engine, component, &name, &reach, session).await?);
                zombies.push(stalled);
            }
        }
        let mut remote = Vec::new();
        for h in &hosts {
            match RemoteHost::connect(&h.addr, &name, SECRET, session).await {
                Ok(r) => remote.push(r),
                // A leader opens without a host it cannot reach (and takes
                // it back at a later reopen).
                Err(e) if e.is_transient() && network => continue,
                Err(e) if e.is_transient() => continue 'run,
                Err(e) => return Err(e).context("connecting to a host"),
            }
        }
        report.opens += 1;
        // The hosts the coordinator runs on, as it was last told.
        let mut placed = remote.clone();
        // Half the reopens keep the workers where they ran (a leader that
        // survived), the others deal them anew (a new leader).
        let opening = PipelineOptions {
            placement_hint: if rng.below(2) == 0 {
                hint.clone()
            } else {
                Vec::new()
            },
            ..options.clone()
        };
        let mut c = match pipeline.coordinator_on(opening, remote).await {
            Ok(c) => c,
            Err(e) if e.is_transient() => continue,
            Err(e) => return Err(e).context("opening the coordinator"),
        };
        hint = c.placement_addrs();
        // A coordinator that adopted the workers a crashed one left runs
        // without the replicas that died with it until its first step is
        // committed: the crash was a host's fault too.
        faults_since_whole = u32::from(c.degraded());
        if std::mem::take(&mut leader_crashed) {
            match c.stats().adopted {
                0 => report.leader_takeovers_restored += 1,
                _ => report.leader_takeovers_adopted += 1,
            }
            report.in_flight_recorded += c.stats().adopted_in_flight;
        }
        report.replayed += c.stats().replayed_steps;
        report.restored_local_bytes += c.stats().restored_local_bytes;
        report.restored_fetched_bytes += c.stats().restored_fetched_bytes;
        // What this coordinator did, added when it ends.
        let mut counted = (0u64, 0u64, 0u64);
        loop {
            if let Some(&(at, fault)) = faults.last()
                && ran >= at
            {
                faults.pop();
                let i = rng.below(hosts.len() as u64) as usize;
                let this = injected.fetch_add(1, Ordering::SeqCst) + 1;
                *healed.lock().unwrap_or_else(|p| p.into_inner()) = None;
                if !matches!(fault, Fault::LeaderCrash | Fault::Join | Fault::Leave) {
                    faults_since_whole += 1;
                }
                match fault {
                    Fault::Kill => {
                        report.kills += 1;
                        hosts.remove(i);
                        hosts.push(start_host(engine, component, &name, &reach, session).await?);
                    }
                    Fault::Stall => {
                        report.stalls += 1;
                        hosts[i].frozen.store(true, Ordering::Relaxed);
                    }
                    Fault::Join if hosts.len() < 4 => {
                        let host = start_host(engine, component, &name, &reach, session).await?;
                        let joined =
                            match RemoteHost::connect(&host.addr, &name, SECRET, session).await {
                                Ok(r) => r,
                                Err(e) if e.is_transient() => continue,
                                Err(e) => return Err(e).context("connecting to a joining host"),
                            };
                        hosts.push(host);
                        let mut next = placed.clone();
                        next.push(joined);
                        report.joins += 1;
                        match c.replace_hosts(next.clone()).await {
                            Ok(_) => {
                                placed = next;
                                hint = c.placement_addrs();
                            }
                            // A host lost meanwhile: recover.
                            Err(e) if e.is_transient() => continue 'run,
                            Err(e) => return Err(e).context("a host joining"),
                        }
                    }
                    Fault::Leave if hosts.len() > 1 => {
                        let addr = hosts[i].addr.clone();
                        let next: Vec<_> = placed
                            .iter()
                            .filter(|r| r.addr() != addr)
                            .cloned()
                            .collect();
                        report.leaves += 1;
                        match c.replace_hosts(next.clone()).await {
                            Ok(_) => {
                                placed = next;
                                hint = c.placement_addrs();
                                // Handed over: the host is gone.
                                hosts.remove(i);
                            }
                            Err(e) if e.is_transient() => continue 'run,
                            Err(e) => return Err(e).context("a host leaving"),
                        }
                    }
                    Fault::Join | Fault::Leave => {}
                    Fault::DropIn | Fault::DropOut | Fault::Delay => {
                        let net = hosts[i].net.clone();
                        match fault {
                            Fault::DropIn => {
                                report.drops_in += 1;
                                net.drop_in.store(true, Ordering::Relaxed);
                            }
                            Fault::DropOut => {
                                report.drops_out += 1;
                                net.drop_out.store(true, Ordering::Relaxed);
                            }
                            _ => {
                                report.delays += 1;
                                let past = session.as_millis() as u64 * 3 / 2;
                                net.delay_ms.store(past, Ordering::Relaxed);
                            }
                        }
                        let lasts = session / 2 + session.mul_f64(rng.below(250) as f64 / 100.0);
                        let (healed, injected) = (healed.clone(), injected.clone());
                        tokio::spawn(async move {
                            tokio::time::sleep(lasts).await;
                            net.heal();
                            if injected.load(Ordering::SeqCst) == this {
                                *healed.lock().unwrap_or_else(|p| p.into_inner()) =
                                    Some(Instant::now());
                            }
                        });
                    }
                    Fault::Reset | Fault::HalfOpen => {
                        let net = &hosts[i].net;
                        if let Fault::Reset = fault {
                            report.resets += 1;
                            net.resets.fetch_add(1, Ordering::Relaxed);
                        } else {
                            report.half_opens += 1;
                            net.cuts.fetch_add(1, Ordering::Relaxed);
                        }
                        *healed.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                    }
                    Fault::LeaderCrash => {
                        report.leader_crashes += 1;
                        let wait = Duration::from_micros(rng.below(20_000));
                        let _ = tokio::time::timeout(wait, c.step()).await;
                        // A dead process writes nothing more; in one
                        // process, a checkpoint write already under way
                        // finishes (as if it landed just before the
                        // crash) before the next leader reads the store.
                        // A step commit still in flight is left to race
                        // the next leader's fencing, as a zombie's would.
                        let _ = c.settle().await;
                        // Its connections just end: the hosts keep their
                        // workers for the next coordinator to adopt.
                        c.crash();
                        leader_crashed = true;
                        continue 'run;
                    }
                }
            }
            // A step that never ends is a liveness bug (a worker waiting
            // on a host that cannot answer), never something to wait out.
            let stepped = tokio::time::timeout(STEP_LIMIT, c.step())
                .await
                .map_err(|_| anyhow::anyhow!("a step did not end in {STEP_LIMIT:?}"))?;
            // The steps ended: the final checkpoint. (A fault that landed
            // after the last step hits it: recover and checkpoint again.)
            let outcome = match stepped {
                Ok(false) => c.finish().await.map(|()| false),
                other => other,
            };
            // What the coordinator did so far (checkpoints ride steps).
            let now = (
                c.stats().events_in_read_by_hosts,
                c.stats().checkpoint_bytes_staged,
                c.stats().failovers,
            );
            report.events_read_by_hosts += now.0 - counted.0;
            report.staged_bytes += now.1 - counted.1;
            report.failovers += now.2 - counted.2;
            counted = now;
            match outcome {
                Ok(true) => {
                    ran += 1;
                    report.steps += 1;
                    if replicas > 1 {
                        // As a leader does when the group changes: stalled
                        // hosts are replaced, and hosts the coordinator
                        // left behind (lost, then healed, or fresh) join.
                        for i in (0..hosts.len()).rev() {
                            if hosts[i].frozen.load(Ordering::Relaxed)
                                && !c.host_addrs().contains(&hosts[i].addr)
                            {
                                zombies.push(hosts.remove(i));
                                hosts.push(
                                    start_host(engine, component, &name, &reach, session).await?,
                                );
                            }
                        }
                        let on = c.host_addrs();
                        let mut next: Vec<Arc<RemoteHost>> = placed
                            .iter()
                            .filter(|r| on.iter().any(|a| a == r.addr()))
                            .cloned()
                            .collect();
                        let mut joining = 0;
                        for h in hosts.iter().filter(|h| !on.contains(&h.addr)) {
                            if let Ok(r) =
                                RemoteHost::connect(&h.addr, &name, SECRET, session).await
                            {
                                next.push(r);
                                joining += 1;
                            }
                        }
                        if joining == 0 {
                            // The hosts the coordinator still runs on.
                            placed = next;
                        } else {
                            match c.replace_hosts(next.clone()).await {
                                Ok(_) => {
                                    placed = next;
                                    hint = c.placement_addrs();
                                }
                                Err(e) if e.is_transient() => continue 'run,
                                Err(e) => return Err(e).context("hosts joining again"),
                            }
                        }
                        if !c.degraded() && c.host_addrs().len() == hosts.len() {
                            faults_since_whole = 0;
                        }
                    }
                    let since = healed.lock().unwrap_or_else(|p| p.into_inner()).take();
                    if let Some(at) = since {
                        let took = at.elapsed();
                        report.longest_to_commit = report.longest_to_commit.max(took);
                        if took > session * 2 {
                            stuck.get_or_insert(took);
                        }
                    }
                }
                Ok(false) => break 'run,
                // A host lost or stalled: recover on the hosts there are —
                // with replicas, only when more than one host failed.
                Err(e) if e.is_transient() => {
                    if replicas > 1 && faults_since_whole <= 1 {
                        report.replays_with_a_live_replica += 1;
                        report.first_violation.get_or_insert(format!(
                            "trial seed {seed}: a step failed after one host's fault, every \
                             worker with a live replica (a replay): {e}"
                        ));
                    }
                    continue 'run;
                }
                Err(e) => return Err(e).context("a step or the final checkpoint"),
            }
        }
    }
    // The zombies wake up: whatever they still send goes to connections
    // that are gone.
    for z in &zombies {
        z.frozen.store(false, Ordering::Relaxed);
    }

    let mut got: BTreeMap<String, i64> = BTreeMap::new();
    log.scan_output("counts", 0, &mut |e| {
        for ev in e.events {
            let v: serde_json::Value = serde_json::from_slice(&ev.value)
                .map_err(sluice_storage::StorageError::corrupt("an output value"))?;
            let word = v["word"].as_str().unwrap_or_default().to_owned();
            *got.entry(word).or_default() += ev.weight * v["count"].as_i64().unwrap_or(0);
        }
        Ok(std::ops::ControlFlow::Continue(()))
    })?;
    got.retain(|_, n| *n != 0);
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for (line, weight) in &lines {
        // The words are `w<n>`: the circuit's normalisation keeps them.
        for word in line.split_whitespace() {
            *expected.entry(word.to_owned()).or_default() += weight;
        }
    }
    // A line deleted more often than inserted leaves a word below zero:
    // word count emits no row for it (as the e2e recount).
    expected.retain(|_, n| *n > 0);
    let diff = Differences::of(&expected, &got);
    report.lost += diff.lost;
    report.duplicated += diff.duplicated;
    report.wrong += diff.wrong;
    let mut violation = diff.first;
    if let Some(took) = stuck {
        report.stuck += 1;
        violation.get_or_insert(format!(
            "stuck: the first step after a network fault healed committed {took:.1?} later (at most {:?})",
            session * 2
        ));
    }
    // The hosts go (their servers, connections and workers with them, as
    // the tasks are aborted), and with them their hold on the database
    // (through the log): the audit opens it afresh once the last holder has
    // closed it.
    drop((pipeline, log, hosts, zombies));
    let gone = Instant::now();
    let database = loop {
        match sluice_embedded::db::open(&dir.path().join("data")) {
            Err(sluice_storage::StorageError::Locked { .. })
                if gone.elapsed() < Duration::from_secs(10) =>
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            opened => break opened.context("opening the pipeline's database for the audit")?,
        }
    };
    let checkpoints = sluice_objstore::ObjectCheckpointStore::open(&store)?;
    if let Verdict::Violation(v) = audit_embedded_with(&database, &checkpoints)? {
        report.audit_failures += 1;
        violation.get_or_insert(format!("audit: {v}"));
    }
    if let Some(v) = violation
        && report.first_violation.is_none()
    {
        report.first_violation = Some(format!("trial seed {seed}: {v}"));
    }
    Ok(())
}

/// Runs `trials` trials of word count (`component`) across hosts, trial
/// `i` with seed `seed + i`; with `network`, network faults too; each
/// worker on `replicas` hosts (then a recovery after one host's fault is a
/// violation: a follower must take over, nothing replayed).
pub async fn chaos_hosts(
    component: &std::path::Path,
    trials: u32,
    seed: u64,
    network: bool,
    replicas: u32,
    progress: bool,
) -> anyhow::Result<HostsChaosReport> {
    let started = Instant::now();
    let engine = Arc::new(SluiceEngine::new(
        sluice_runtime::Limits::default(),
        SluiceEngine::default_cache_dir(),
    )?);
    let component = engine.load_file(component)?;
    let mut report = HostsChaosReport {
        replicas,
        ..HostsChaosReport::default()
    };
    let bar = if progress {
        ProgressBar::new(trials as u64)
    } else {
        ProgressBar::hidden()
    };
    if let Ok(style) =
        ProgressStyle::with_template("chaos across hosts {wide_bar} {pos}/{len} {msg}")
    {
        bar.set_style(style);
    }
    for i in 0..trials {
        let seed = seed.wrapping_add(i as u64);
        trial(&engine, &component, seed, network, replicas, &mut report)
            .await
            .with_context(|| format!("trial with seed {seed}"))?;
        report.trials += 1;
        bar.inc(1);
        bar.set_message(format!("{} violations", report.violations()));
    }
    bar.finish_and_clear();
    report.took = started.elapsed();
    Ok(report)
}
