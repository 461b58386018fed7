//! **Replicas**: what running each worker on two hosts costs and buys, side
//! by side with one (in one process, loopback TCP, a coordinator and two
//! worker hosts): CPU per event and exchange bytes per event; and failover
//! time — a host killed (its server and every connection gone at once) to
//! the next committed step — at two state sizes. With one replica the
//! coordinator reopens on the hosts left (restore the checkpoint, replay the
//! steps after it); with two, a follower takes over and nothing is
//! replayed. And the leader's death: the coordinator dropped as a killed
//! process is (its connections just end) to the next committed step under a
//! new one — with one replica it restores and replays, with two it adopts
//! the workers the hosts kept.

use super::hosts::{SECRET, line_events, wordcount_across, worker_hosts};
use super::report::{Row, fmt_time};
use super::workloads::{Workload, load, manual_checkpoints};
use sluice_core::Event;
use sluice_pipeline::{Pipeline, PipelineConfig};
use sluice_runtime::{Limits, PipelineOptions, Reach, RemoteHost, SluiceEngine};
use sluice_storage::AppendBatch;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Replicas against none: CPU and exchange bytes per event (word count),
/// and failover time at two state sizes (the `blobs` circuit: 28 MiB and
/// 1 GiB; 4 and 16 MiB with `quick`).
pub(super) async fn replicas_cost(
    engine: &Arc<SluiceEngine>,
    wc: &Workload,
    quick: bool,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let lines = line_events(quick);
    let mut one = (0f64, 0f64);
    for replicas in [1u32, 2] {
        let run = wordcount_across(engine, wc, &lines, 2, replicas).await?;
        let (cpu, bytes) = (run.cpu, run.exchanged);
        let per_event = (
            cpu.as_secs_f64() * 1e6 / lines.len() as f64,
            bytes as f64 / lines.len() as f64,
        );
        if replicas == 1 {
            one = per_event;
        }
        rows.push(Row {
            scenario: "replicas",
            case: format!(
                "wordcount W=3 on 3 hosts, {} replica{} per worker, {} lines",
                replicas,
                if replicas == 1 { "" } else { "s" },
                lines.len()
            ),
            measured: format!(
                "{:.1} µs CPU/event, {:.2} exchange B/event",
                per_event.0, per_event.1
            ),
            baseline: format!("1 replica: {:.1} µs CPU/event, {:.2} B/event", one.0, one.1),
            ratio: per_event.0 / one.0.max(1e-9),
            goal: "informational (CPU ratio; 2 cores)",
            met: None,
        });
    }
    let sizes: [usize; 2] = if quick {
        [4 << 20, 16 << 20]
    } else {
        [28 << 20, 1 << 30]
    };
    for kill in [Kill::Host, Kill::Leader] {
        for state in sizes {
            let mut without = Duration::ZERO;
            for replicas in [1u32, 2] {
                let f = failover(engine, state, replicas, kill).await?;
                if replicas == 1 {
                    without = f.took;
                }
                rows.push(failover_row(kill, state, replicas, &f, without));
            }
        }
    }
    Ok(())
}

/// Whose death a failover measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kill {
    /// A worker host's: its server and every connection end at once.
    Host,
    /// The leader's: the coordinator is dropped as a killed process is
    /// (its connections just end, its own instances are gone) and a new
    /// one opens on the hosts.
    Leader,
}

fn failover_row(kill: Kill, state: usize, replicas: u32, f: &Failover, without: Duration) -> Row {
    let plural = if replicas == 1 { "" } else { "s" };
    let (case, how) = match kill {
        Kill::Host => (
            format!(
                "failover: a host of 3 killed, {} MiB of state, {replicas} replica{plural}",
                state >> 20
            ),
            format!("{} failovers", f.failovers),
        ),
        Kill::Leader => (
            format!(
                "leader take-over: the coordinator killed, {} MiB of state, {replicas} \
                 replica{plural}",
                state >> 20
            ),
            format!("{} instances adopted", f.adopted),
        ),
    };
    let rebuilt_first = match replicas > 1 {
        true => " (the followers lost rebuilt from the survivors first)",
        false => "",
    };
    Row {
        scenario: "replicas",
        case,
        measured: format!(
            "{} from the kill to the next committed step ({} steps replayed, {how}); the step \
             after: {}{rebuilt_first}",
            fmt_time(f.took),
            f.replayed,
            fmt_time(f.after),
        ),
        baseline: format!("1 replica: {}", fmt_time(without)),
        ratio: f.took.as_secs_f64() / without.as_secs_f64().max(1e-9),
        goal: "informational",
        met: None,
    }
}

/// What one failover measured.
struct Failover {
    /// From the kill to the next committed step.
    took: Duration,
    /// Steps the recovery replayed.
    replayed: u64,
    /// Followers that took over.
    failovers: u64,
    /// Instances a new coordinator adopted (a leader's death).
    adopted: u64,
    /// The step after that one (with replicas, the followers lost are
    /// rebuilt first, from full snapshots of their primaries).
    after: Duration,
}

/// The `blobs` circuit holding `state` bytes (64 KiB strings), W=4 on this
/// process and two worker hosts, `replicas` per worker: a checkpoint, steps
/// after it (a replay's worth), then a host is killed with input waiting;
/// how long until a step is committed again — with one replica by
/// reopening on the host left, as a leader does.
async fn failover(
    engine: &Arc<SluiceEngine>,
    state: usize,
    replicas: u32,
    kill: Kill,
) -> anyhow::Result<Failover> {
    const BLOB: usize = 64 << 10;
    const W: u32 = 4;
    let big = Arc::new(engine.with_limits(Limits {
        memory: 3 << 30,
        ..engine.limits()
    }));
    let (_, component) = load(&big, "../benches/guests/blobs").await?;
    let dir = tempfile::tempdir()?;
    let store = format!("file://{}", dir.path().join("store").display());
    let config = PipelineConfig {
        options: manual_checkpoints(64),
        partitions: Some(W),
        checkpoint_store: Some(store.clone()),
        ..PipelineConfig::new(dir.path().join("leader"), W)
    };
    let pipeline = Pipeline::open(big.clone(), component.clone(), config).await?;
    let log = pipeline.storage().log.clone();
    let filler = "x".repeat(BLOB - 16);
    let append = |from: usize, to: usize| -> anyhow::Result<()> {
        for chunk in (from..to).collect::<Vec<_>>().chunks(16) {
            let events: Vec<Event> = chunk
                .iter()
                .map(|i| Event {
                    value: serde_json::to_vec(&format!("{i:012}{filler}")).unwrap_or_default(),
                    weight: 1,
                })
                .collect();
            log.append(AppendBatch {
                appends: vec![("blobs".into(), (chunk[0] / 16) as u32 % W, events)],
                ..AppendBatch::default()
            })?;
        }
        Ok(())
    };
    let copies = std::sync::atomic::AtomicU32::new(0);
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
    let name = pipeline.options().name.clone();
    let (hosts, served) = worker_hosts(&big, &component, &name, 2, reach).await?;
    let options = PipelineOptions {
        replicas,
        ..pipeline.options().clone()
    };
    let mut c = pipeline
        .coordinator_on(options.clone(), hosts.clone())
        .await?;
    let n = state / BLOB;
    // Nine tenths before the checkpoint, the rest after it (replayed by a
    // recovery), then one more batch waiting when the host dies.
    append(0, n * 9 / 10)?;
    while c.step().await? {}
    c.checkpoint().await?;
    append(n * 9 / 10, n)?;
    while c.step().await? {}
    append(n, n + 16)?;
    let hint = c.placement_addrs();
    let killed = Instant::now();
    let mut c = match kill {
        // The coordinator dies; a new one opens on the hosts (with
        // replicas, it adopts what they kept).
        Kill::Leader => {
            c.crash();
            let mut again = Vec::new();
            for h in &hosts {
                let timeout = Duration::from_secs(30);
                again.push(RemoteHost::connect(h.addr(), &name, SECRET, timeout).await?);
            }
            let mut c = pipeline.coordinator_on(options, again).await?;
            anyhow::ensure!(c.step().await?, "the new coordinator found no input");
            c
        }
        Kill::Host => {
            served[0].1.abort();
            let committed = match c.step().await {
                Ok(true) => Some(c.stats().clone()),
                Ok(false) => anyhow::bail!("the step after the kill found no input"),
                Err(_) => None,
            };
            match committed {
                Some(_) => c,
                None => {
                    drop(c);
                    let options = PipelineOptions {
                        placement_hint: hint,
                        ..options
                    };
                    let mut c = pipeline
                        .coordinator_on(options, vec![hosts[1].clone()])
                        .await?;
                    anyhow::ensure!(c.step().await?, "the recovered pipeline found no input");
                    c
                }
            }
        }
    };
    let took = killed.elapsed();
    let stats = c.stats().clone();
    append(n + 16, n + 32)?;
    let t = Instant::now();
    anyhow::ensure!(c.step().await?, "the step after found no input");
    let after = t.elapsed();
    for (_, task) in &served {
        task.abort();
    }
    Ok(Failover {
        took,
        replayed: stats.replayed_steps,
        failovers: stats.failovers,
        adopted: stats.adopted,
        after,
    })
}
