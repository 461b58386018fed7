//! **Hosts**: a pipeline across hosts (in one process, loopback TCP):
//! events per CPU-second and bytes between hosts at 1, 2 and 3 hosts; the
//! state a host joining or leaving moves against the ideal; failover; and
//! the checkpoint pieces the hosts write themselves.

use super::report::{Row, fmt_rate, fmt_time, rate};
use super::workloads::{Workload, distinct_words, manual_checkpoints, text_lines};
use anyhow::Context;
use sluice_core::Event;
use sluice_pipeline::{Pipeline, PipelineConfig};
use sluice_runtime::{
    LoadedComponent, PipelineOptions, Reach, RemoteHost, SluiceEngine, WorkerHost,
};
use sluice_storage::AppendBatch;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// CPU time this process has used (all threads, user and system), from
/// `/proc/self/stat` (clock ticks of 10 ms).
pub(super) fn cpu_time() -> Duration {
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name (which may hold spaces).
            let rest = s.rsplit_once(')')?.1.to_owned();
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Worker hosts in this process, on loopback TCP, for `pipeline`: the
/// coordinator's connections to them, and the hosts (with the tasks serving
/// them).
/// The secret the bench's hosts share.
pub(super) const SECRET: &[u8] = b"the bench's shared secret";

pub(super) async fn worker_hosts(
    engine: &SluiceEngine,
    component: &LoadedComponent,
    pipeline: &str,
    n: usize,
    reach: impl Fn() -> anyhow::Result<Reach>,
) -> anyhow::Result<(
    Vec<Arc<RemoteHost>>,
    Vec<(Arc<WorkerHost>, tokio::task::JoinHandle<()>)>,
)> {
    let (mut hosts, mut tasks) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let host = WorkerHost::new_with(engine, component, pipeline, SECRET, None, reach()?);
        let serving = host.clone();
        tasks.push((
            host,
            tokio::spawn(async move {
                let _ = serving.serve(listener).await;
            }),
        ));
        hosts.push(RemoteHost::connect(&addr, pipeline, SECRET, Duration::from_secs(30)).await?);
    }
    Ok((hosts, tasks))
}

/// The word-count input of the runs across hosts: 200 000 lines of text
/// (20 000 with `quick`) as events.
pub(super) fn line_events(quick: bool) -> Vec<Event> {
    text_lines(if quick { 20_000 } else { 200_000 })
        .iter()
        .map(|l| Event {
            value: serde_json::to_vec(l).unwrap_or_default(),
            weight: 1,
        })
        .collect()
}

/// What one run of word count across hosts measured.
pub(super) struct Across {
    /// CPU this process used (the hosts' included).
    pub(super) cpu: Duration,
    /// Wall time.
    pub(super) wall: Duration,
    /// Every byte between hosts: the coordinator's connections both ways,
    /// and what the hosts sent each other directly.
    pub(super) bytes: u64,
    /// Of those, exchange frames.
    pub(super) exchanged: u64,
}

/// Word count of `lines` (in six partitions) with W=3 on this process and
/// `hosts` worker hosts that read their workers' input themselves,
/// `replicas` per worker, to the end.
pub(super) async fn wordcount_across(
    engine: &Arc<SluiceEngine>,
    wc: &Workload,
    lines: &[Event],
    hosts: usize,
    replicas: u32,
) -> anyhow::Result<Across> {
    let dir = tempfile::tempdir()?;
    let config = PipelineConfig {
        options: manual_checkpoints(2_000),
        partitions: Some(6),
        ..PipelineConfig::new(dir.path(), 3)
    };
    let pipeline = Pipeline::open(engine.clone(), wc.component.clone(), config).await?;
    let log = pipeline.storage().log.clone();
    for (p, chunk) in lines.chunks(lines.len().div_ceil(6)).enumerate() {
        log.append(AppendBatch {
            appends: vec![("lines".into(), p as u32, chunk.to_vec())],
            ..AppendBatch::default()
        })?;
    }
    let name = pipeline.options().name.clone();
    let reach = || {
        Ok(Reach {
            checkpoints: None,
            log: Some(log.clone()),
            read_only_log: false,
        })
    };
    let (remote, served) = worker_hosts(engine, &wc.component, &name, hosts, reach).await?;
    let options = PipelineOptions {
        replicas,
        ..pipeline.options().clone()
    };
    let (cpu, wall) = (cpu_time(), Instant::now());
    let mut c = pipeline.coordinator_on(options, remote.clone()).await?;
    while c.step().await? {}
    let (cpu, wall) = (cpu_time() - cpu, wall.elapsed());
    let peers = served.iter().map(|(h, _)| h.peer_traffic()).sum::<u64>();
    let bytes = remote
        .iter()
        .map(|h| h.traffic().0 + h.traffic().1)
        .sum::<u64>()
        + peers;
    let exchanged = remote.iter().map(|h| h.exchange_traffic()).sum::<u64>() + peers;
    Ok(Across {
        cpu,
        wall,
        bytes,
        exchanged,
    })
}

/// A pipeline across hosts (in one process, loopback TCP): events per
/// CPU-second and exchange bytes per event at 1, 2 and 3 hosts; the state a
/// host joining moves against the ideal; failover (reopening on the hosts
/// left) against state size.
pub(super) async fn hosts_cost(
    engine: &Arc<SluiceEngine>,
    wc: &Workload,
    quick: bool,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let lines = line_events(quick);
    let mut one_host = 0f64;
    for n in 1..=3usize {
        let run = wordcount_across(engine, wc, &lines, n - 1, 1).await?;
        let (cpu, wall, bytes, exchanged) = (run.cpu, run.wall, run.bytes, run.exchanged);
        let per_cpu = lines.len() as f64 / cpu.as_secs_f64().max(0.01);
        if n == 1 {
            one_host = per_cpu;
        }
        rows.push(Row {
            scenario: "hosts",
            case: format!(
                "wordcount W=3 on {n} host{} (one process, loopback TCP), {} lines",
                if n == 1 { "" } else { "s" },
                lines.len()
            ),
            measured: format!(
                "{:.0} k ev/CPU-s ({}), {:.0} B/event between hosts (exchange {:.0})",
                per_cpu / 1e3,
                fmt_rate(rate(lines.len() as u64, wall)),
                bytes as f64 / lines.len() as f64,
                exchanged as f64 / lines.len() as f64
            ),
            baseline: format!("1 host: {:.0} k ev/CPU-s", one_host / 1e3),
            ratio: per_cpu / one_host.max(1.0),
            goal: "informational (2 cores: per-CPU figures)",
            met: None,
        });
    }
    // A host joins (2 → 3 hosts), one leaves (3 → 2) and one dies, with
    // state.
    let words: usize = if quick { 50_000 } else { 1_000_000 };
    let dir = tempfile::tempdir()?;
    // Checkpoints in a shared store (a directory) that every host writes
    // its own workers' pieces to, keeping a copy of them.
    let store = format!("file://{}", dir.path().join("store").display());
    let config = PipelineConfig {
        options: manual_checkpoints(5_000),
        partitions: Some(6),
        checkpoint_store: Some(store.clone()),
        ..PipelineConfig::new(dir.path().join("leader"), 3)
    };
    let pipeline = Pipeline::open(engine.clone(), wc.component.clone(), config).await?;
    let copies = std::sync::atomic::AtomicU32::new(0);
    let words_in = distinct_words(words);
    let log = pipeline.storage().log.clone();
    for (p, chunk) in words_in.chunks(words_in.len().div_ceil(6)).enumerate() {
        log.append(AppendBatch {
            appends: vec![("lines".into(), p as u32, chunk.to_vec())],
            ..AppendBatch::default()
        })?;
    }
    let name = pipeline.options().name.clone();
    let reach = || -> anyhow::Result<Reach> {
        let n = copies.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Reach {
            checkpoints: Some(Arc::new(
                sluice_objstore::ObjectCheckpointStore::open(&store)?
                    .with_cache(dir.path().join(format!("host{n}")))?,
            )),
            log: Some(log.clone()),
            read_only_log: false,
        })
    };
    let (two, _t2) = worker_hosts(engine, &wc.component, &name, 1, reach).await?;
    let mut c = pipeline
        .coordinator_on(pipeline.options().clone(), two.clone())
        .await?;
    while c.step().await? {}
    c.checkpoint().await?;
    let state = pipeline
        .storage()
        .checkpoints
        .latest()?
        .context("the checkpoint just taken")?
        .state_bytes();
    let staged = c.stats().checkpoint_bytes_staged;
    let mib = |b: f64| b / (1u64 << 20) as f64;
    // Join: a third host takes its worker live, from the old instance.
    let (third, _t3) = worker_hosts(engine, &wc.component, &name, 1, reach).await?;
    let t = Instant::now();
    let moved = c
        .replace_hosts(two.iter().chain(&third).cloned().collect())
        .await?;
    let join = t.elapsed();
    let shipped = moved;
    let ideal = state as f64 / 3.0;
    rows.push(Row {
        scenario: "hosts",
        case: format!(
            "a host joins (2 → 3 hosts), wordcount {words} words, {:.1} MiB of state",
            mib(state as f64)
        ),
        measured: format!(
            "{:.2} MiB moved live (no store read), pause {}",
            mib(shipped as f64),
            fmt_time(join)
        ),
        baseline: format!("ideal {:.2} MiB (the new host's third)", mib(ideal)),
        ratio: shipped as f64 / ideal.max(1.0),
        goal: "≤ 1.1× the ideal",
        met: Some(shipped as f64 / ideal.max(1.0) <= 1.1),
    });
    // A host leaves gracefully (3 → 2): only its worker moves, live.
    let t = Instant::now();
    let handed = c.replace_hosts(third.clone()).await?;
    let leave = t.elapsed();
    rows.push(Row {
        scenario: "hosts",
        case: format!(
            "a host leaves gracefully (3 → 2 hosts), {:.1} MiB of state",
            mib(state as f64)
        ),
        measured: format!(
            "{:.2} MiB moved live (only its workers), pause {}",
            mib(handed as f64),
            fmt_time(leave)
        ),
        baseline: format!("ideal {:.2} MiB (the leaving host's third)", mib(ideal)),
        ratio: handed as f64 / ideal.max(1.0),
        goal: "≤ 1.1× the ideal",
        met: Some(handed as f64 / ideal.max(1.0) <= 1.1),
    });
    // Failover: a host joins again (3 hosts, a worker each), a checkpoint
    // (each host writes its own worker's pieces, keeping a copy), more
    // steps, then a host dies mid-step. Detection: the dead host's
    // connection ends (a stalled one: the session timeout); then the
    // coordinator reopens on the hosts left, the survivors' workers where
    // they were: they restore from their own copies, the dead host's
    // worker from the store; and replay.
    let (fourth, t4) = worker_hosts(engine, &wc.component, &name, 1, reach).await?;
    c.replace_hosts(third.iter().chain(&fourth).cloned().collect())
        .await?;
    // A third of more input, then the checkpoint (whole: workers moved),
    // a third committed after it (replayed), a third the host dies in.
    let more = distinct_words(words / 5);
    let batch = |chunk: &[Event], p: usize| AppendBatch {
        appends: vec![("lines".into(), p as u32, chunk.to_vec())],
        ..AppendBatch::default()
    };
    let per = more.len().div_ceil(6);
    for third_part in 0..3 {
        for (p, chunk) in more.chunks(per).enumerate() {
            let n = chunk.len();
            log.append(batch(
                &chunk[n * third_part / 3..n * (third_part + 1) / 3],
                p,
            ))?;
        }
        match third_part {
            0 => {
                while c.step().await? {}
                c.checkpoint().await?;
            }
            1 => while c.step().await? {},
            _ => {}
        }
    }
    let hint = c.placement_addrs();
    let killed = Instant::now();
    for (_, task) in &t4 {
        task.abort();
    }
    let detected = loop {
        match c.step().await {
            Ok(true) => continue,
            Ok(false) => anyhow::bail!("the steps ended without noticing the dead host"),
            Err(_) => break killed.elapsed(),
        }
    };
    drop(c);
    let options = PipelineOptions {
        placement_hint: hint,
        ..pipeline.options().clone()
    };
    let c = pipeline.coordinator_on(options, third).await?;
    let stats = c.stats().clone();
    drop(c);
    let restored = stats.restored_local_bytes + stats.restored_fetched_bytes;
    rows.push(Row {
        scenario: "hosts",
        case: format!(
            "failover: a host of 3 killed mid-step, {:.1} MiB of state, {} steps to replay",
            mib(restored as f64),
            stats.replayed_steps
        ),
        measured: format!(
            "detected {}, restore {} ({:.2} s/GiB; {:.1} MiB from the survivors' own copies, \
             {:.1} MiB fetched), replay {}",
            fmt_time(detected),
            fmt_time(stats.restore_took),
            stats.restore_took.as_secs_f64() / (restored as f64 / (1u64 << 30) as f64).max(1e-9),
            mib(stats.restored_local_bytes as f64),
            mib(stats.restored_fetched_bytes as f64),
            fmt_time(stats.replay_took)
        ),
        baseline: "a stalled host: detected after the session timeout".into(),
        ratio: (detected + stats.restore_took + stats.replay_took).as_secs_f64(),
        goal: "informational",
        met: None,
    });
    rows.push(Row {
        scenario: "hosts",
        case: format!(
            "checkpoint of {:.1} MiB of state, W=3 on 2 hosts",
            mib(state as f64)
        ),
        measured: format!(
            "{:.1} MiB written by the worker host itself, never sent to the leader",
            mib(staged as f64)
        ),
        baseline: format!("its worker's share: {:.1} MiB", mib(state as f64 / 3.0)),
        ratio: staged as f64 / (state as f64 / 3.0).max(1.0),
        goal: "informational",
        met: None,
    });
    Ok(())
}
