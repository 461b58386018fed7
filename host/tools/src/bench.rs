//! `sluice bench`: what the sandbox and exactly-once cost, each figure a
//! ratio against a baseline measured in the same run (so it holds on a noisy
//! machine).
//!
//! Scenarios so far:
//! - **sandbox cost**: events/s of wordcount, Nexmark q1 and q4 as WASM
//!   components (W=1, no storage) against the same circuits compiled
//!   natively into this binary;
//! - **step boundary**: the cost of an empty step (the call boundary) as a
//!   share of a step of 1, 100 and 10 000 events;
//! - **exactly-once cost**: a whole pipeline's events/s with synced commits
//!   against the same pipeline with unsynced commits;
//! - **durable commit**: the runtime's step commits per second against raw
//!   synced RocksDB write batches of the same bytes;
//! - **checkpoint**: the pause a checkpoint takes, for word-count state of
//!   growing size, against the checkpoint interval and a step's time;
//! - **recovery**: the time from open to live with that state restored,
//!   against a cold start with empty state; and by replay of 1 M events
//!   without a checkpoint, against processing them live;
//! - **large state**: checkpoint and restore of 1 GiB in few keys (the
//!   `benches/guests/blobs` circuit), per byte rather than per key;
//! - **density**: the time to start a worker (instantiate + `init`), with
//!   and without the pooling allocator, against a bare wasmtime
//!   instantiate, and the resident memory of idle instances.
//!
//! The table goes to stdout, and with `--markdown` into a file between
//! `<!-- bench:begin -->` and `<!-- bench:end -->` (text around the markers
//! is kept), with an SVG chart of the ratios.

use anyhow::Context;
use nexmark::EventGenerator;
use nexmark::config::NexmarkConfig;
use sluice_core::{
    CircuitPorts, Event, Frontier, OutputEntry, PartitionId, StepCommit, StepRecord,
};
use sluice_embedded::{RocksCheckpointStore, db, output_key};
use sluice_guest::exchange::{LocalExchange, RawEvent};
use sluice_guest::{Circuit, CircuitInstance};
use sluice_pipeline::{LogConfig, Pipeline, PipelineConfig, Storage};
use sluice_runtime::{
    Coordinator, Limits, LoadedComponent, PipelineOptions, Reach, RemoteHost, SluiceEngine, Worker,
    WorkerHost, WorkerInfo,
};
use sluice_storage::{AppendBatch, CheckpointStore, LogBackend};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to run and where to write.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Small inputs and few repetitions (for CI).
    pub quick: bool,
    /// Write the table into this markdown file (between the markers).
    pub markdown: Option<PathBuf>,
    /// Write the chart (SVG) here.
    pub chart: Option<PathBuf>,
}

/// One line of the table.
#[derive(Debug, Clone)]
pub struct Row {
    /// The scenario.
    pub scenario: &'static str,
    /// Which case of it.
    pub case: String,
    /// The measured figure, with its unit.
    pub measured: String,
    /// The baseline figure, with its unit.
    pub baseline: String,
    /// measured / baseline (or the share the scenario defines).
    pub ratio: f64,
    /// The goal.
    pub goal: &'static str,
    /// Whether the goal is met (`None`: informational).
    pub met: Option<bool>,
}

fn rate(events: u64, d: Duration) -> f64 {
    events as f64 / d.as_secs_f64().max(1e-9)
}

fn fmt_rate(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.2} M ev/s", r / 1e6)
    } else {
        format!("{:.0} k ev/s", r / 1e3)
    }
}

fn fmt_time(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.1} µs")
    }
}

/// A circuit with its input, cut into steps: `steps[i][port]`.
struct Workload {
    name: &'static str,
    native: fn(&mut Circuit),
    wasm: PathBuf,
    component: LoadedComponent,
    steps: Vec<Vec<Vec<RawEvent>>>,
    events: u64,
}

fn json_event(value: &impl serde::Serialize) -> RawEvent {
    RawEvent {
        key: Vec::new(),
        value: serde_json::to_vec(value).expect("serializable"),
        weight: 1,
    }
}

/// Cuts per-port event lists into steps of about `per_step` events.
fn cut(ports: Vec<Vec<RawEvent>>, per_step: usize) -> Vec<Vec<Vec<RawEvent>>> {
    let total: usize = ports.iter().map(Vec::len).sum();
    let steps = total.div_ceil(per_step.max(1)).max(1);
    (0..steps)
        .map(|s| {
            ports
                .iter()
                .map(|events| {
                    let (a, b) = (events.len() * s / steps, events.len() * (s + 1) / steps);
                    events[a..b].to_vec()
                })
                .collect()
        })
        .collect()
}

fn nexmark_events(n: usize) -> impl Iterator<Item = nexmark::event::Event> {
    let config = NexmarkConfig {
        base_time: crate::generate::NEXMARK_BASE_TIME,
        ..NexmarkConfig::default()
    };
    EventGenerator::new(config).take(n)
}

fn text_lines(n: usize) -> Vec<String> {
    let text: Vec<&str> = crate::demo::TEXT
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    (0..n).map(|i| text[i % text.len()].to_owned()).collect()
}

async fn load(
    engine: &SluiceEngine,
    crate_dir: &str,
) -> anyhow::Result<(PathBuf, LoadedComponent)> {
    let src = crate::examples_dir().join(crate_dir);
    let target = SluiceEngine::default_cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("guest-target");
    let wasm =
        tokio::task::spawn_blocking(move || crate::compile::build_component(&src, Some(&target)))
            .await??;
    let component = engine.load_file(&wasm)?;
    Ok((wasm, component))
}

async fn workloads(engine: &SluiceEngine, quick: bool) -> anyhow::Result<Vec<Workload>> {
    let (lines, events) = if quick {
        (20_000, 20_000)
    } else {
        (200_000, 200_000)
    };
    let per_step = 10_000;
    let wc = text_lines(lines).iter().map(json_event).collect::<Vec<_>>();
    let mut bids = Vec::new();
    let (mut q4_auctions, mut q4_bids) = (Vec::new(), Vec::new());
    for e in nexmark_events(events) {
        match e {
            nexmark::event::Event::Bid(b) => {
                bids.push(json_event(&b));
                q4_bids.push(json_event(&b));
            }
            nexmark::event::Event::Auction(a) => q4_auctions.push(json_event(&a)),
            nexmark::event::Event::Person(_) => {}
        }
    }
    let make = |name, native, (wasm, component), ports: Vec<Vec<RawEvent>>| {
        let events = ports.iter().map(|p| p.len() as u64).sum();
        Workload {
            name,
            native,
            wasm,
            component,
            steps: cut(ports, per_step),
            events,
        }
    };
    Ok(vec![
        make(
            "wordcount",
            wordcount::build,
            load(engine, "wordcount").await?,
            vec![wc],
        ),
        make(
            "nexmark q1",
            nexmark_q1::build,
            load(engine, "nexmark-q1").await?,
            vec![bids],
        ),
        make(
            "nexmark q4",
            nexmark_q4::build,
            load(engine, "nexmark-q4").await?,
            vec![q4_auctions, q4_bids],
        ),
    ])
}

/// Time spent in `step` by a native instance over all steps.
fn run_native(build: fn(&mut Circuit), steps: &[Vec<Vec<RawEvent>>]) -> anyhow::Result<Duration> {
    let mut c = CircuitInstance::build(build)?;
    let mut total = Duration::ZERO;
    for step in steps {
        let input = step.clone();
        let t = Instant::now();
        c.step(input, &mut LocalExchange)?;
        total += t.elapsed();
    }
    Ok(total)
}

fn host_events(step: &[Vec<RawEvent>]) -> Vec<Vec<Event>> {
    step.iter()
        .map(|events| {
            events
                .iter()
                .map(|e| Event {
                    value: e.value.clone(),
                    weight: e.weight,
                })
                .collect()
        })
        .collect()
}

/// Time spent in `step` by a WASM instance (W=1) over all steps.
async fn run_wasm(
    engine: &SluiceEngine,
    component: &LoadedComponent,
    steps: &[Vec<Vec<RawEvent>>],
) -> anyhow::Result<Duration> {
    let mut worker = Worker::standalone(engine, component, "bench").await?;
    let mut total = Duration::ZERO;
    for (i, step) in steps.iter().enumerate() {
        let input = host_events(step);
        let t = Instant::now();
        worker.step_ports(i as u64, 0, input).await?;
        total += t.elapsed();
    }
    Ok(total)
}

async fn sandbox_cost(
    engine: &SluiceEngine,
    loads: &[Workload],
    reps: usize,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    for w in loads {
        let (mut native, mut wasm) = (Duration::MAX, Duration::MAX);
        for _ in 0..reps {
            native = native.min(run_native(w.native, &w.steps)?);
            wasm = wasm.min(run_wasm(engine, &w.component, &w.steps).await?);
        }
        let (m, b) = (rate(w.events, wasm), rate(w.events, native));
        let stateful = w.name != "nexmark q1";
        let goal = if stateful {
            "≥ 0.6× (stateful)"
        } else {
            "≥ 0.8× (stateless)"
        };
        rows.push(Row {
            scenario: "sandbox cost",
            case: format!("{} ({} events, W=1)", w.name, w.events),
            measured: fmt_rate(m),
            baseline: fmt_rate(b),
            ratio: m / b,
            goal,
            met: Some(m / b >= if stateful { 0.6 } else { 0.8 }),
        });
    }
    Ok(())
}

async fn step_boundary(
    engine: &SluiceEngine,
    wc: &Workload,
    quick: bool,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let scale = if quick { 1 } else { 4 };
    let lines: Vec<RawEvent> = text_lines(10_000).iter().map(json_event).collect();
    let empty: Vec<Vec<Vec<RawEvent>>> = vec![vec![Vec::new()]; 1000 * scale];
    let boundary = run_wasm(engine, &wc.component, &empty).await? / empty.len() as u32;
    for (n, reps) in [
        (1usize, 500 * scale),
        (100, 200 * scale),
        (10_000, 5 * scale),
    ] {
        let steps: Vec<Vec<Vec<RawEvent>>> = (0..reps).map(|_| vec![lines[..n].to_vec()]).collect();
        let wasm = run_wasm(engine, &wc.component, &steps).await? / reps as u32;
        let native = run_native(wc.native, &steps)? / reps as u32;
        let share = boundary.as_secs_f64() / wasm.as_secs_f64().max(1e-12);
        rows.push(Row {
            scenario: "step boundary",
            case: format!(
                "wordcount, {n} events per step (empty step {})",
                fmt_time(boundary)
            ),
            measured: format!("{} per step (WASM)", fmt_time(wasm)),
            baseline: format!("{} (native operators)", fmt_time(native)),
            ratio: share,
            goal: "boundary < 5 % of the step at ≥ 1 000 events",
            met: (n >= 1000).then_some(share < 0.05),
        });
    }
    Ok(())
}

/// A word-count pipeline (W=2, input `lines` in 2 partitions) in `dir`,
/// never checkpointing by itself, with `max_batch` events per partition per
/// step; `synced` says whether its step commits are fsynced.
async fn wordcount_pipeline(
    engine: &Arc<SluiceEngine>,
    component: &LoadedComponent,
    dir: &Path,
    synced: bool,
    max_batch: u64,
) -> anyhow::Result<Pipeline> {
    let config = PipelineConfig {
        log: LogConfig::Embedded {
            sync_commits: synced,
        },
        options: manual_checkpoints(max_batch),
        // One partition per worker: `append_halves` fills both.
        partitions: Some(2),
        ..PipelineConfig::new(dir, 2)
    };
    Ok(Pipeline::open(engine.clone(), component.clone(), config).await?)
}

/// Appends `events` to the word-count pipeline's input, half to each partition.
fn append_halves(log: &dyn LogBackend, events: Vec<Event>) -> anyhow::Result<()> {
    let half = events.len().div_ceil(2).max(1);
    for (p, chunk) in events.chunks(half).enumerate() {
        log.append(AppendBatch {
            appends: vec![("lines".into(), p as u32, chunk.to_vec())],
            ..AppendBatch::default()
        })?;
    }
    Ok(())
}

/// Appends `events` to the word-count pipeline (half to each partition),
/// opens its coordinator and runs it until no input is left (no
/// checkpoint): the coordinator, and the time the steps took.
async fn fill_and_run(
    pipeline: &Pipeline,
    events: Vec<Event>,
) -> anyhow::Result<(Coordinator, Duration)> {
    append_halves(&*pipeline.storage().log, events)?;
    let mut c = pipeline.coordinator().await?;
    let t = Instant::now();
    while c.step().await? {}
    Ok((c, t.elapsed()))
}

/// Options that never checkpoint by themselves, with `max_batch` events per
/// partition per step.
fn manual_checkpoints(max_batch: u64) -> PipelineOptions {
    PipelineOptions {
        name: "bench".into(),
        max_batch,
        checkpoint_every_steps: u64::MAX,
        checkpoint_interval: Duration::from_secs(3600),
        ..PipelineOptions::default()
    }
}

/// Times opening a coordinator (restoring and replaying) of `pipeline`.
async fn time_open(pipeline: &Pipeline) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let _c = pipeline.coordinator().await?;
    Ok(t.elapsed())
}

/// Times opening (restoring and replaying) the word-count pipeline in `dir`.
async fn time_open_wordcount(
    engine: &Arc<SluiceEngine>,
    component: &LoadedComponent,
    dir: &Path,
) -> anyhow::Result<Duration> {
    time_open(&wordcount_pipeline(engine, component, dir, true, 10_000).await?).await
}

/// Runs wordcount as a whole pipeline (W=2) and returns events/s of the
/// step loop.
async fn pipeline_rate(
    engine: &Arc<SluiceEngine>,
    component: &LoadedComponent,
    lines: &[RawEvent],
    synced: bool,
) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let pipeline = wordcount_pipeline(engine, component, dir.path(), synced, 5_000).await?;
    let events = lines
        .iter()
        .map(|e| Event {
            value: e.value.clone(),
            weight: 1,
        })
        .collect();
    let (_, took) = fill_and_run(&pipeline, events).await?;
    Ok(rate(lines.len() as u64, took))
}

async fn exactly_once_cost(
    engine: &Arc<SluiceEngine>,
    wc: &Workload,
    quick: bool,
    reps: usize,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let lines: Vec<RawEvent> = text_lines(if quick { 40_000 } else { 300_000 })
        .iter()
        .map(json_event)
        .collect();
    let (mut synced, mut unsynced) = (0f64, 0f64);
    for _ in 0..reps {
        synced = synced.max(pipeline_rate(engine, &wc.component, &lines, true).await?);
        unsynced = unsynced.max(pipeline_rate(engine, &wc.component, &lines, false).await?);
    }
    rows.push(Row {
        scenario: "exactly-once cost",
        case: format!(
            "wordcount pipeline, W=2, {} lines, 10 000 lines per step",
            lines.len()
        ),
        measured: format!("{} (synced commits)", fmt_rate(synced)),
        baseline: format!("{} (unsynced)", fmt_rate(unsynced)),
        ratio: synced / unsynced,
        goal: "≥ 0.95×",
        met: Some(synced / unsynced >= 0.95),
    });
    Ok(())
}

/// The native engine figure issue #17 measured on this machine class: the
/// `dbsp` crate (0.349), in memory, word count over the same 200 000
/// pre-parsed lines.
const DBSP_WORDCOUNT: &str = "dbsp 0.349 native, in memory: 290–370 k lines/s (issue #17)";

/// The peer: each workload as a whole exactly-once pipeline (W=1, synced
/// commits, sandboxed, 10 000 events per partition per step) against the
/// same circuit linked natively and run in memory without storage, in the
/// same run.
async fn native_peer(
    engine: &Arc<SluiceEngine>,
    loads: &[Workload],
    reps: usize,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    for w in loads.iter().filter(|w| w.name != "nexmark q1") {
        let (mut pipeline, mut native) = (0f64, 0f64);
        for _ in 0..reps {
            native = native.max(rate(w.events, run_native(w.native, &w.steps)?));
            let dir = tempfile::tempdir()?;
            let p = Pipeline::open(
                engine.clone(),
                w.component.clone(),
                PipelineConfig {
                    options: manual_checkpoints(10_000),
                    partitions: Some(1),
                    ..PipelineConfig::new(dir.path(), 1)
                },
            )
            .await?;
            let names = p.shape().input_names();
            // The steps hold each port's events in order: append them so.
            let mut appends = vec![Vec::new(); names.len()];
            for step in &w.steps {
                for (port, events) in step.iter().enumerate() {
                    appends[port].extend(events.iter().map(|e| Event {
                        value: e.value.clone(),
                        weight: e.weight,
                    }));
                }
            }
            for (name, events) in names.iter().zip(appends) {
                p.storage().log.append(AppendBatch {
                    appends: vec![(name.clone(), 0, events)],
                    ..AppendBatch::default()
                })?;
            }
            let mut c = p.coordinator().await?;
            let t = Instant::now();
            while c.step().await? {}
            pipeline = pipeline.max(rate(w.events, t.elapsed()));
        }
        let ratio = pipeline / native;
        rows.push(Row {
            scenario: "native peer",
            case: format!(
                "{}: exactly-once pipeline (durable, sandboxed, W=1) vs the circuit native, in memory",
                w.name
            ),
            measured: fmt_rate(pipeline),
            baseline: if w.name == "wordcount" {
                format!("{} native; {DBSP_WORDCOUNT}", fmt_rate(native))
            } else {
                format!("{} native", fmt_rate(native))
            },
            ratio,
            goal: "≥ 1× the native engine",
            met: Some(ratio >= 1.0),
        });
    }
    Ok(())
}

/// An incremental checkpoint against a full one of the same state: a
/// word-count pipeline holding `words` distinct words runs steps that
/// change 5 % of them, then checkpoints incrementally; then the same again
/// with a full checkpoint. The pause (snapshots) and the bytes written.
async fn incremental_checkpoint(
    wc: &Workload,
    quick: bool,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    // About 1 GiB of state in the full run: W = 4, so that each instance
    // holds a quarter of it (and a whole snapshot's copy beside it) well
    // inside its memory limit.
    let (words, workers) = if quick {
        (200_000, 2u32)
    } else {
        (36_000_000, 4)
    };
    // An instance holds its quarter (about 250 MiB of stored state, more
    // in memory: tables keep spare capacity and per-entry marks) and a
    // whole snapshot's copy beside it: more than the default 1 GiB limit.
    let engine = Arc::new(SluiceEngine::new(
        Limits {
            memory: 3 << 30,
            ..Limits::default()
        },
        SluiceEngine::default_cache_dir(),
    )?);
    let component = engine.load_file(&wc.wasm)?;
    let dir = tempfile::tempdir()?;
    let pipeline = Pipeline::open(
        engine.clone(),
        component.clone(),
        PipelineConfig {
            options: manual_checkpoints(2_000),
            partitions: Some(workers),
            ..PipelineConfig::new(dir.path(), workers)
        },
    )
    .await?;
    let append = |log: &dyn LogBackend, events: Vec<Event>| -> anyhow::Result<()> {
        let part = events.len().div_ceil(workers as usize).max(1);
        for (p, chunk) in events.chunks(part).enumerate() {
            log.append(AppendBatch {
                appends: vec![("lines".into(), p as u32, chunk.to_vec())],
                ..AppendBatch::default()
            })?;
        }
        Ok(())
    };
    append(&*pipeline.storage().log, distinct_words(words))?;
    let mut c = pipeline.coordinator().await?;
    let t = Instant::now();
    while c.step().await? {}
    let step_time = t.elapsed() / c.next_step().max(1) as u32;
    c.checkpoint().await?;
    let whole_bytes = c
        .storage()
        .checkpoints()
        .latest()?
        .map_or(0, |cp| cp.state_bytes());
    let lines = |words: Vec<String>| -> Vec<Event> {
        words
            .chunks(20)
            .map(|line| Event {
                value: serde_json::to_vec(&line.join(" ")).expect("string"),
                weight: 1,
            })
            .collect()
    };
    // 5 % of the words, spread over the key space: every 20th word.
    let spread = |round: usize| (0..words / 20).map(move |i| format!("word{}", i * 20 + round));
    // 5 % of the words, those of 5 % of the shards (51 of 1024).
    let clustered = (0..words).map(|i| format!("word{i}")).filter(|w| {
        postcard::to_allocvec(w).is_ok_and(|k| sluice_core::shard_of(&k) < sluice_core::SHARDS / 20)
    });
    // The whole checkpoint in the middle is the baseline; the last round
    // leaves deltas on top of it for the restore below.
    let rounds: [(&str, Vec<String>, bool); 3] = [
        ("in 5 % of the shards", clustered.collect(), true),
        ("spread over all shards", spread(1).collect(), false),
        ("spread over all shards", spread(2).collect(), true),
    ];
    let mut pauses = Vec::new();
    for (_, changed, incremental) in &rounds {
        append(c.storage().log(), lines(changed.clone()))?;
        c.set_incremental_checkpoints(*incremental);
        while c.step().await? {}
        let before = c.stats().checkpoint_bytes_written;
        c.checkpoint().await?;
        pauses.push((
            c.last_checkpoint_snapshots(),
            c.last_checkpoint_time(),
            c.stats().checkpoint_bytes_written - before,
        ));
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let interval = PipelineOptions::default().checkpoint_interval;
    let (full, full_total, full_bytes) = pauses[1];
    for ((how, changed, _), (inc, inc_total, inc_bytes)) in rounds
        .iter()
        .zip(&pauses)
        .filter(|((_, _, incremental), _)| *incremental)
    {
        rows.push(Row {
            scenario: "incremental checkpoint",
            case: format!(
                "wordcount, {words} distinct words ({:.1} MiB of state), {} of them changed {how}, W={workers}",
                mib(whole_bytes),
                changed.len()
            ),
            measured: format!(
                "{} pause, {:.1} MiB written ({} with the write)",
                fmt_time(*inc),
                mib(*inc_bytes),
                fmt_time(*inc_total)
            ),
            baseline: format!(
                "full: {} pause, {:.1} MiB written ({} with the write); a step takes {}",
                fmt_time(full),
                mib(full_bytes),
                fmt_time(full_total),
                fmt_time(step_time)
            ),
            ratio: inc.as_secs_f64() / full.as_secs_f64().max(1e-9),
            goal: "pause ≤ 10 % of the interval at 1 GiB, 5 % changed",
            // The goal is stated at 1 GiB; smaller states are reported only.
            met: (whole_bytes >= 900 << 20)
                .then_some(inc.as_secs_f64() <= 0.1 * interval.as_secs_f64()),
        });
    }
    // Recovery from the last checkpoint: whole pieces and the deltas on top.
    let state_bytes = c
        .storage()
        .checkpoints()
        .latest()?
        .map_or(0, |cp| cp.state_bytes());
    drop(c);
    drop(pipeline);
    let open = |dir: std::path::PathBuf| {
        let engine = engine.clone();
        let component = component.clone();
        async move {
            Pipeline::open(
                engine,
                component,
                PipelineConfig {
                    options: manual_checkpoints(2_000),
                    partitions: Some(workers),
                    ..PipelineConfig::new(dir, workers)
                },
            )
            .await
        }
    };
    let empty = tempfile::tempdir()?;
    let cold = time_open(&open(empty.path().to_owned()).await?).await?;
    let restore = time_open(&open(dir.path().to_owned()).await?).await?;
    rows.push(recovery_row(
        format!(
            "restore {:.1} MiB of word-count state (whole pieces and deltas of 5 % of the keys), W={workers}",
            mib(state_bytes)
        ),
        state_bytes,
        restore,
        cold,
    ));
    Ok(())
}

/// Step commits like the runtime's: W=2, one output log `counts`, `events`
/// events of ~30 bytes per worker, each record chained to the one before.
pub fn sample_commits(steps: u64, events: usize, epoch: u64) -> Vec<StepCommit> {
    let mut prev = 0;
    (0..steps)
        .map(|step| {
            let c = sample_commit(step, events, epoch, prev);
            prev = c.record.chain_hash();
            c
        })
        .collect()
}

/// One commit of [`sample_commits`], linked to the record whose chain hash
/// is `prev` (also used by `benches/commit.rs`).
pub fn sample_commit(step: u64, events: usize, epoch: u64, prev: u128) -> StepCommit {
    let frontiers: Vec<Frontier> = (0..2)
        .map(|w| {
            [(
                PartitionId {
                    input: 0,
                    partition: w,
                },
                (step + 1) * 1000,
            )]
            .into_iter()
            .collect()
        })
        .collect();
    let entries = (0..2u32)
        .map(|w| OutputEntry {
            step,
            worker: w,
            frontier: frontiers[w as usize].clone(),
            events: (0..events)
                .map(|i| Event {
                    value: format!("{{\"word\":\"w{i}\",\"count\":{step}}}").into_bytes(),
                    weight: 1,
                })
                .collect(),
        })
        .collect();
    StepCommit {
        record: StepRecord {
            step,
            epoch,
            time_ms: step,
            frontiers,
            output_hashes: vec![step as u128, 0],
            limits: Default::default(),
            prev,
            layout: None,
        },
        outputs: vec![("counts".into(), entries)],
    }
}

fn durable_commit(quick: bool, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let (steps, events) = (if quick { 150 } else { 1000 }, 50);
    // The runtime's path: invariant checks, epoch check, one synced batch.
    let dir = tempfile::tempdir()?;
    let storage = Storage::open(
        &PipelineConfig::new(dir.path(), 2),
        &wordcount_ports(),
        "bench",
    )?;
    let guarded = storage.guarded();
    let epoch = guarded.fence()?;
    let commits = sample_commits(steps, events, epoch);
    let t = Instant::now();
    for c in &commits {
        guarded.commit_step(c)?;
    }
    let runtime = rate(steps, t.elapsed());
    // Raw RocksDB: the same keys and bytes, one synced batch per step.
    let dir = tempfile::tempdir()?;
    let database = db::open(dir.path())?;
    let (out, steps_cf) = (
        db::cf(&database, db::CF_OUTPUT)?,
        db::cf(&database, db::CF_STEPS)?,
    );
    let t = Instant::now();
    for c in &commits {
        let mut wb = rocksdb::WriteBatch::default();
        for (name, entries) in &c.outputs {
            for e in entries {
                wb.put_cf(
                    out,
                    output_key(name, e.step, e.worker),
                    postcard::to_allocvec(e)?,
                );
            }
        }
        wb.put_cf(
            steps_cf,
            c.record.step.to_be_bytes(),
            postcard::to_allocvec(&c.record)?,
        );
        database.write_opt(wb, &db::synced())?;
    }
    let raw = rate(steps, t.elapsed());
    rows.push(Row {
        scenario: "durable commit",
        case: format!("{steps} step commits, W=2, {events} events per worker"),
        measured: format!("{runtime:.0} steps/s (runtime)"),
        baseline: format!("{raw:.0} batches/s (raw synced WriteBatch)"),
        ratio: runtime / raw,
        goal: "≥ 0.8×",
        met: Some(runtime / raw >= 0.8),
    });
    Ok(())
}

/// The ports of the word-count circuit.
pub fn wordcount_ports() -> CircuitPorts {
    CircuitPorts {
        inputs: vec!["lines".into()],
        outputs: vec!["counts".into()],
        snapshot_version: 1,
    }
}

/// Lines of 20 words each, `words` distinct words in all.
fn distinct_words(words: usize) -> Vec<Event> {
    let per_line = 20;
    (0..words.div_ceil(per_line))
        .map(|l| {
            let line: Vec<String> = (0..per_line)
                .map(|i| format!("word{}", l * per_line + i))
                .collect();
            Event {
                value: serde_json::to_vec(&line.join(" ")).expect("string"),
                weight: 1,
            }
        })
        .collect()
}

/// A word-count pipeline holding about `words` distinct words (W=2), run
/// to the end without checkpoints; returns the average step time and the
/// still-open coordinator.
async fn stateful_pipeline(
    engine: &Arc<SluiceEngine>,
    component: &LoadedComponent,
    words: usize,
    dir: &Path,
) -> anyhow::Result<(Duration, Coordinator)> {
    let pipeline = wordcount_pipeline(engine, component, dir, true, 2_000).await?;
    let (c, took) = fill_and_run(&pipeline, distinct_words(words)).await?;
    let per_step = took / c.next_step().max(1) as u32;
    Ok((per_step, c))
}

/// The bytes of the newest checkpoint's worker states in `dir`.
fn stored_state_bytes(dir: &Path) -> anyhow::Result<u64> {
    let store = RocksCheckpointStore::open(db::open(dir)?);
    Ok(store.latest()?.map_or(0, |cp| cp.state_bytes()))
}

/// The checkpoint row: the pause (snapshots) against the interval.
fn checkpoint_row(case: String, snapshots: Duration, total: Duration, step: Duration) -> Row {
    let interval = PipelineOptions::default().checkpoint_interval;
    Row {
        scenario: "checkpoint",
        case,
        measured: format!(
            "{} pause (snapshots; {} with the write, which overlaps the next steps)",
            fmt_time(snapshots),
            fmt_time(total)
        ),
        baseline: format!("{interval:?} interval; a step takes {}", fmt_time(step)),
        ratio: snapshots.as_secs_f64() / interval.as_secs_f64(),
        goal: "pause ≤ 10 % of the interval",
        met: Some(snapshots.as_secs_f64() <= 0.1 * interval.as_secs_f64()),
    }
}

/// The recovery row: open-to-live with `state_bytes` restored, per GiB
/// beyond a cold start.
fn recovery_row(case: String, state_bytes: u64, restore: Duration, cold: Duration) -> Row {
    let gib = state_bytes as f64 / (1u64 << 30) as f64;
    let per_gib = restore.saturating_sub(cold).as_secs_f64() / gib.max(1e-12);
    Row {
        scenario: "recovery",
        case,
        measured: format!("{} to live ({per_gib:.2} s per GiB)", fmt_time(restore)),
        baseline: format!("{} cold start, empty state", fmt_time(cold)),
        ratio: restore.as_secs_f64() / cold.as_secs_f64().max(1e-9),
        goal: "≤ 2 s per GiB",
        met: (state_bytes >= 1 << 20).then_some(per_gib <= 2.0),
    }
}

async fn checkpoint_and_recovery(
    engine: &Arc<SluiceEngine>,
    wc: &Workload,
    quick: bool,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let sizes: &[usize] = if quick {
        &[20_000, 200_000]
    } else {
        &[20_000, 2_000_000, 8_000_000]
    };
    // Cold start: open a pipeline with no state at all.
    let empty_dir = tempfile::tempdir()?;
    let cold = time_open_wordcount(engine, &wc.component, empty_dir.path()).await?;
    for &words in sizes {
        let dir = tempfile::tempdir()?;
        let (step_time, mut c) =
            stateful_pipeline(engine, &wc.component, words, dir.path()).await?;
        let t = Instant::now();
        c.checkpoint().await?;
        let pause = t.elapsed();
        let snapshots = c.last_checkpoint_snapshots();
        drop(c);
        let state_bytes = stored_state_bytes(dir.path())?;
        let mib = state_bytes as f64 / (1 << 20) as f64;
        rows.push(checkpoint_row(
            format!("wordcount, {words} distinct words ({mib:.1} MiB of state), W=2"),
            snapshots,
            pause,
            step_time,
        ));
        // Recovery: reopen, restoring that checkpoint.
        let restore = time_open_wordcount(engine, &wc.component, dir.path()).await?;
        rows.push(recovery_row(
            format!("restore {mib:.1} MiB of state, W=2"),
            state_bytes,
            restore,
            cold,
        ));
    }
    Ok(())
}

/// Layout changes W → W + 1 of a word-count pipeline holding `words`
/// distinct words: the bytes of state the sticky rebalance moves against
/// the ideal (1/(W + 1) of the keyed state), the `mod W` layout's bytes as
/// the baseline (computed from the same pieces), and the pause — from the
/// last step under the old layout to the first under the new one — against
/// the bytes moved.
async fn rescale_cost(
    engine: &Arc<SluiceEngine>,
    wc: &Workload,
    quick: bool,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let words: usize = if quick { 50_000 } else { 1_000_000 };
    for from in [2u32, 8] {
        let dir = tempfile::tempdir()?;
        let config = PipelineConfig {
            options: manual_checkpoints(2_000),
            partitions: Some(16),
            ..PipelineConfig::new(dir.path(), from)
        };
        let pipeline = Pipeline::open(engine.clone(), wc.component.clone(), config).await?;
        let lines = distinct_words(words);
        let log = pipeline.storage().log.clone();
        for (p, chunk) in lines.chunks(lines.len().div_ceil(16).max(1)).enumerate() {
            log.append(AppendBatch {
                appends: vec![("lines".into(), p as u32, chunk.to_vec())],
                ..AppendBatch::default()
            })?;
        }
        let mut c = pipeline.coordinator().await?;
        while c.step().await? {}
        c.checkpoint().await?;
        // The state by shard, as the checkpoint holds it.
        let checkpoint = pipeline
            .storage()
            .checkpoints
            .latest()?
            .context("the checkpoint just taken")?;
        let total = checkpoint.state_bytes();
        let layout = checkpoint.meta.layout.clone();
        let to = from + 1;
        let ideal = total as f64 / f64::from(to);
        let modulo = layout.modulo(to);
        let modulo_bytes: u64 = checkpoint
            .pieces
            .iter()
            .filter(|p| layout.owner(p.shard) != modulo.owner(p.shard))
            .map(|p| p.state.len() as u64)
            .sum();
        let moved = c.rescale(to).await?.context("W changed")?;
        let mib = |b: f64| b / (1u64 << 20) as f64;
        let ratio = moved.bytes_moved as f64 / ideal.max(1.0);
        rows.push(Row {
            scenario: "rescale",
            case: format!(
                "wordcount {words} words ({:.1} MiB of state), W={from} → {to}, sticky layout",
                mib(total as f64)
            ),
            measured: format!(
                "{:.2} MiB moved ({} of 1024 shards), pause {} ({:.0} ms per MiB moved)",
                mib(moved.bytes_moved as f64),
                moved.shards_moved,
                fmt_time(moved.pause),
                moved.pause.as_secs_f64() * 1000.0 / mib(moved.bytes_moved as f64).max(1e-9)
            ),
            baseline: format!("ideal {:.2} MiB (1/{to} of the state)", mib(ideal)),
            ratio,
            goal: "bytes moved ≤ 1.1× the ideal",
            met: Some(ratio <= 1.1),
        });
        rows.push(Row {
            scenario: "rescale",
            case: "the same change with the `mod W` layout (before layouts)".into(),
            measured: format!("{:.2} MiB would move", mib(modulo_bytes as f64)),
            baseline: format!("ideal {:.2} MiB", mib(ideal)),
            ratio: modulo_bytes as f64 / ideal.max(1.0),
            goal: "baseline (informational)",
            met: None,
        });
    }
    Ok(())
}

/// Recovery by replay: a word-count pipeline that never checkpointed
/// reopens and replays every committed step; against processing the same
/// events live.
async fn replay_cost(
    engine: &Arc<SluiceEngine>,
    wc: &Workload,
    quick: bool,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let n = if quick { 50_000 } else { 1_000_000 };
    let dir = tempfile::tempdir()?;
    let pipeline = wordcount_pipeline(engine, &wc.component, dir.path(), true, 5_000).await?;
    let events = text_lines(n)
        .iter()
        .map(|l| Event {
            value: serde_json::to_vec(l).expect("string"),
            weight: 1,
        })
        .collect();
    let (c, live) = fill_and_run(&pipeline, events).await?;
    drop(c);
    drop(pipeline);
    let replay = time_open_wordcount(engine, &wc.component, dir.path()).await?;
    let per_million = replay.as_secs_f64() * 1e6 / n as f64;
    rows.push(Row {
        scenario: "recovery",
        case: format!("replay {n} events (no checkpoint), wordcount, W=2"),
        measured: format!(
            "{} to live ({per_million:.2} s per 1M events)",
            fmt_time(replay)
        ),
        baseline: format!("{} to process them live", fmt_time(live)),
        ratio: replay.as_secs_f64() / live.as_secs_f64().max(1e-9),
        goal: "reported: replay re-runs the steps (keep it short by checkpointing)",
        met: None,
    });
    Ok(())
}

/// Checkpoint and restore of large state in few keys: the `blobs` circuit
/// holding the distinct set of 64 KiB strings, 1 GiB in all (16 MiB in
/// `--quick`), W=2.
async fn large_state(
    engine: &Arc<SluiceEngine>,
    quick: bool,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    const BLOB: usize = 64 << 10;
    // A wasm32 instance addresses at most 4 GiB, and a snapshot needs a copy
    // of the state beside it (two, with the envelope): 1 GiB is spread over
    // four workers.
    const W: u32 = 4;
    let total: usize = if quick { 16 << 20 } else { 1 << 30 };
    // Half the state per worker, plus its snapshot and an input batch.
    let big = Arc::new(engine.with_limits(Limits {
        memory: 3 << 30,
        ..engine.limits()
    }));
    let (_, component) = load(&big, "../benches/guests/blobs").await?;
    let dir = tempfile::tempdir()?;
    let open = |dir: &Path| {
        let config = PipelineConfig {
            options: manual_checkpoints(128),
            partitions: Some(W),
            ..PipelineConfig::new(dir, W)
        };
        Pipeline::open(big.clone(), component.clone(), config)
    };
    let pipeline = open(dir.path()).await?;
    let log = pipeline.storage().log.clone();
    let n = total / BLOB;
    let filler = "x".repeat(BLOB - 16);
    for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
        let events: Vec<Event> = chunk
            .iter()
            .map(|i| Event {
                value: serde_json::to_vec(&format!("{i:012}{filler}")).expect("string"),
                weight: 1,
            })
            .collect();
        log.append(AppendBatch {
            appends: vec![("blobs".into(), (chunk[0] / 64) as u32 % W, events)],
            ..AppendBatch::default()
        })?;
    }
    let mut c = pipeline.coordinator().await?;
    let t = Instant::now();
    while c.step().await? {}
    let step_time = t.elapsed() / c.next_step().max(1) as u32;
    let t = Instant::now();
    c.checkpoint().await?;
    let pause = t.elapsed();
    let snapshots = c.last_checkpoint_snapshots();
    drop((c, log, pipeline));
    let state_bytes = stored_state_bytes(dir.path())?;
    let mib = state_bytes as f64 / (1 << 20) as f64;
    rows.push(checkpoint_row(
        format!("blobs, {n} distinct 64 KiB strings ({mib:.0} MiB of state), W={W}"),
        snapshots,
        pause,
        step_time,
    ));
    let empty = tempfile::tempdir()?;
    let cold = time_open(&open(empty.path()).await?).await?;
    let restore = time_open(&open(dir.path()).await?).await?;
    rows.push(recovery_row(
        format!("restore {mib:.0} MiB of blobs state, W={W}"),
        state_bytes,
        restore,
        cold,
    ));
    Ok(())
}

/// CPU time this process has used (all threads, user and system), from
/// `/proc/self/stat` (clock ticks of 10 ms).
fn cpu_time() -> Duration {
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
async fn worker_hosts(
    engine: &SluiceEngine,
    component: &LoadedComponent,
    pipeline: &str,
    n: usize,
    reach: impl Fn() -> anyhow::Result<Reach>,
) -> anyhow::Result<(
    Vec<Arc<RemoteHost>>,
    Vec<(Arc<WorkerHost>, tokio::task::JoinHandle<()>)>,
)> {
    const SECRET: &[u8] = b"the bench's shared secret";
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

/// A pipeline across hosts (in one process, loopback TCP): events per
/// CPU-second and exchange bytes per event at 1, 2 and 3 hosts; the state a
/// host joining moves against the ideal; failover (reopening on the hosts
/// left) against state size.
async fn hosts_cost(
    engine: &Arc<SluiceEngine>,
    wc: &Workload,
    quick: bool,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let lines: Vec<Event> = text_lines(if quick { 20_000 } else { 200_000 })
        .iter()
        .map(|l| Event {
            value: serde_json::to_vec(l).unwrap_or_default(),
            weight: 1,
        })
        .collect();
    let mut one_host = 0f64;
    for n in 1..=3usize {
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
        // The hosts read their workers' input from the log themselves.
        let reach = || {
            Ok(Reach {
                checkpoints: None,
                log: Some(log.clone()),
                read_only_log: false,
            })
        };
        let (hosts, served) = worker_hosts(engine, &wc.component, &name, n - 1, reach).await?;
        let (cpu, wall) = (cpu_time(), Instant::now());
        let mut c = pipeline
            .coordinator_on(pipeline.options().clone(), hosts.clone())
            .await?;
        while c.step().await? {}
        let (cpu, wall) = (cpu_time() - cpu, wall.elapsed());
        // Every byte between hosts: the coordinator's connections both
        // ways, and what the hosts sent each other directly.
        let peers = served.iter().map(|(h, _)| h.peer_traffic()).sum::<u64>();
        let bytes: u64 = hosts
            .iter()
            .map(|h| h.traffic().0 + h.traffic().1)
            .sum::<u64>()
            + peers;
        let exchanged = hosts.iter().map(|h| h.exchange_traffic()).sum::<u64>() + peers;
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

fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

async fn density(wc: &Workload, quick: bool, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let n: u32 = if quick { 200 } else { 1000 };
    let limits = Limits {
        memory: 64 << 20,
        ..Limits::default()
    };
    for pooling in [false, true] {
        let engine = if pooling {
            SluiceEngine::with_pooling(limits, SluiceEngine::default_cache_dir(), n + 8)?
        } else {
            SluiceEngine::new(limits, SluiceEngine::default_cache_dir())?
        };
        let component = engine.load_file(&wc.wasm)?;
        let mut bare = Duration::ZERO;
        for _ in 0..n {
            let t = Instant::now();
            Worker::instantiate_only(&engine, &component).await?;
            bare += t.elapsed();
        }
        let bare = bare / n;
        let before = resident_bytes();
        let mut idle = Vec::with_capacity(n as usize);
        let t = Instant::now();
        for i in 0..n {
            let info = WorkerInfo {
                worker: 0,
                workers: 1,
                pipeline: format!("idle-{i}"),
                config: vec![],
            };
            idle.push(Worker::start(&engine, &component, info, None, false).await?);
        }
        let start = t.elapsed() / n;
        let per_instance = resident_bytes().saturating_sub(before) / n as u64;
        let mode = if pooling { "pooling" } else { "on demand" };
        rows.push(Row {
            scenario: "density",
            case: format!("start a wordcount worker ({mode}), {n} instances"),
            measured: format!("{} (instantiate + init)", fmt_time(start)),
            baseline: format!("{} (bare wasmtime instantiate)", fmt_time(bare)),
            ratio: start.as_secs_f64() / bare.as_secs_f64().max(1e-12),
            goal: "≤ 50 µs instantiate",
            met: Some(start <= Duration::from_micros(50)),
        });
        if pooling {
            // Pipelines come and go on a host: stop them all, then start as
            // many again, each in a slot a stopped worker left (reset in
            // place, its first pages kept resident).
            drop(std::mem::take(&mut idle));
            let t = Instant::now();
            for i in 0..n {
                let info = WorkerInfo {
                    worker: 0,
                    workers: 1,
                    pipeline: format!("again-{i}"),
                    config: vec![],
                };
                idle.push(Worker::start(&engine, &component, info, None, false).await?);
            }
            let again = t.elapsed() / n;
            rows.push(Row {
                scenario: "density",
                case: format!(
                    "start a wordcount worker (pooling, a slot used before), {n} instances"
                ),
                measured: format!("{} (instantiate + init)", fmt_time(again)),
                baseline: format!("{} in a fresh slot", fmt_time(start)),
                ratio: again.as_secs_f64() / start.as_secs_f64().max(1e-12),
                goal: "≤ 50 µs instantiate",
                met: Some(again <= Duration::from_micros(50)),
            });
        }
        let per_host = (24u64 << 30) / per_instance.max(1);
        rows.push(Row {
            scenario: "density",
            case: format!("{n} idle workers ({mode})"),
            measured: format!("{:.0} KiB resident each", per_instance as f64 / 1024.0),
            baseline: format!("{per_host} idle workers in 24 GiB"),
            ratio: per_host as f64 / 1000.0,
            goal: "≥ 1000 idle pipelines per host",
            met: Some(per_host >= 1000),
        });
    }
    Ok(())
}

/// The table as markdown.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| scenario | case | measured | baseline | ratio | goal | met |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "–",
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {:.3} | {} | {} |\n",
            r.scenario, r.case, r.measured, r.baseline, r.ratio, r.goal, met
        ));
    }
    s
}

fn chart(rows: &[Row], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    // Ratios span 0.001 (a boundary share) to thousands (recovery against
    // a cold start): a log scale keeps every bar readable.
    const FLOOR: f64 = 1e-3;
    let top = rows.iter().map(|r| r.ratio).fold(2.0f64, f64::max) * 2.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Sluice: ratio to the same-run baseline (log scale; bar n = table row n)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..rows.len() as f64, (FLOOR..top).log_scale())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(rows.len() + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            rows.get(i)
                .map(|_| format!("{}", i + 1))
                .unwrap_or_default()
        })
        .y_desc("ratio")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, r)| {
            let color = match r.met {
                Some(true) => GREEN.mix(0.7),
                Some(false) => RED.mix(0.7),
                None => BLUE.mix(0.5),
            };
            Rectangle::new(
                [
                    (i as f64 + 0.15, FLOOR),
                    (i as f64 + 0.85, r.ratio.max(FLOOR)),
                ],
                color.filled(),
            )
        }))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024 / 1024);
    format!("{cores} cores ({cpu}), {mem} GiB")
}

/// Runs the benchmarks and returns the rows (also printed and written).
pub async fn bench(opts: &BenchOptions) -> anyhow::Result<Vec<Row>> {
    let engine = Arc::new(SluiceEngine::new(
        Limits::default(),
        SluiceEngine::default_cache_dir(),
    )?);
    eprintln!("bench: building and loading the circuits …");
    let loads = workloads(&engine, opts.quick).await?;
    let reps = if opts.quick { 1 } else { 3 };
    let mut rows = Vec::new();
    eprintln!("bench: sandbox cost …");
    sandbox_cost(&engine, &loads, reps, &mut rows).await?;
    eprintln!("bench: step boundary …");
    step_boundary(&engine, &loads[0], opts.quick, &mut rows).await?;
    eprintln!("bench: exactly-once cost …");
    exactly_once_cost(&engine, &loads[0], opts.quick, reps.min(2), &mut rows).await?;
    eprintln!("bench: checkpoint and recovery …");
    checkpoint_and_recovery(&engine, &loads[0], opts.quick, &mut rows).await?;
    eprintln!("bench: incremental checkpoint …");
    incremental_checkpoint(&loads[0], opts.quick, &mut rows).await?;
    eprintln!("bench: native peer …");
    native_peer(&engine, &loads, reps, &mut rows).await?;
    eprintln!("bench: large state …");
    large_state(&engine, opts.quick, &mut rows).await?;
    eprintln!("bench: rescale …");
    rescale_cost(&engine, &loads[0], opts.quick, &mut rows).await?;
    eprintln!("bench: hosts …");
    hosts_cost(&engine, &loads[0], opts.quick, &mut rows).await?;
    eprintln!("bench: recovery by replay …");
    replay_cost(&engine, &loads[0], opts.quick, &mut rows).await?;
    eprintln!("bench: density …");
    density(&loads[0], opts.quick, &mut rows).await?;
    eprintln!("bench: durable commit …");
    let quick = opts.quick;
    let mut commit_rows = Vec::new();
    tokio::task::spawn_blocking(move || {
        durable_commit(quick, &mut commit_rows).map(|()| commit_rows)
    })
    .await??
    .into_iter()
    .for_each(|r| rows.push(r));

    let table = table(&rows);
    println!("{table}");
    if let Some(chart_path) = &opts.chart {
        chart(&rows, chart_path).with_context(|| chart_path.display().to_string())?;
    }
    if let Some(md) = &opts.markdown {
        let chart_ref = opts
            .chart
            .as_ref()
            .and_then(|c| c.file_name())
            .map(|f| f.to_string_lossy().into_owned());
        let mut section = format!(
            "<!-- bench:begin -->\nMachine: {}. Command: `sluice bench{}`. Bars in the chart follow the table's rows.\n\n{table}",
            machine(),
            if opts.quick { " --quick" } else { "" }
        );
        if let Some(c) = chart_ref {
            section.push_str(&format!("\n![ratios]({c})\n"));
        }
        section.push_str("<!-- bench:end -->");
        let old = std::fs::read_to_string(md).unwrap_or_default();
        let new = match (
            old.find("<!-- bench:begin -->"),
            old.find("<!-- bench:end -->"),
        ) {
            (Some(a), Some(b)) if a < b => format!(
                "{}{section}{}",
                &old[..a],
                &old[b + "<!-- bench:end -->".len()..]
            ),
            _ => format!("{old}{section}\n"),
        };
        std::fs::write(md, new).with_context(|| md.display().to_string())?;
    }
    Ok(rows)
}
