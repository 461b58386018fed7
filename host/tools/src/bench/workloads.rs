//! The workloads of `sluice bench`: the circuits built and loaded (as
//! components, and linked natively as baselines), their inputs generated
//! and cut into steps, and the word-count pipeline set-ups the scenarios
//! share.

use nexmark::EventGenerator;
use nexmark::config::NexmarkConfig;
use sluice_core::{CircuitPorts, Event};
use sluice_embedded::{RocksCheckpointStore, db};
use sluice_guest::exchange::{LocalExchange, RawEvent};
use sluice_guest::{Circuit, CircuitInstance, EventBatch};
use sluice_pipeline::{LogConfig, Pipeline, PipelineConfig};
use sluice_runtime::{Coordinator, LoadedComponent, PipelineOptions, SluiceEngine, Worker};
use sluice_storage::{AppendBatch, CheckpointStore, LogBackend};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A circuit with its input, cut into steps: `steps[i][port]`.
pub(super) struct Workload {
    /// The workload's name in the rows.
    pub(super) name: &'static str,
    /// The circuit, linked natively.
    pub(super) native: fn(&mut Circuit),
    /// The component's file.
    pub(super) wasm: PathBuf,
    /// The component, loaded.
    pub(super) component: LoadedComponent,
    /// The input: `steps[i][port]`.
    pub(super) steps: Vec<Vec<Vec<RawEvent>>>,
    /// Events in all steps.
    pub(super) events: u64,
}

/// An event (no key, weight 1) whose value is `value` as JSON.
pub(super) fn json_event(value: &impl serde::Serialize) -> RawEvent {
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

/// The first `n` events of the Nexmark generator, from the fixed base time
/// `sluice gen` uses.
fn nexmark_events(n: usize) -> impl Iterator<Item = nexmark::event::Event> {
    let config = NexmarkConfig {
        base_time: crate::generate::NEXMARK_BASE_TIME,
        ..NexmarkConfig::default()
    };
    EventGenerator::new(config).take(n)
}

/// `n` lines of the demo's text (blank lines skipped), repeated as needed.
pub(super) fn text_lines(n: usize) -> Vec<String> {
    let text: Vec<&str> = crate::demo::TEXT
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    (0..n).map(|i| text[i % text.len()].to_owned()).collect()
}

/// Builds the circuit crate `crate_dir` (under `examples/`) into the shared
/// guest target directory and loads it: the component's path and the
/// component.
pub(super) async fn load(
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

/// The three workloads (wordcount, Nexmark q1, Nexmark q4), built, loaded
/// and with their input cut into steps of 10 000 events.
pub(super) async fn workloads(engine: &SluiceEngine, quick: bool) -> anyhow::Result<Vec<Workload>> {
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
pub(super) fn run_native(
    build: fn(&mut Circuit),
    steps: &[Vec<Vec<RawEvent>>],
) -> anyhow::Result<Duration> {
    let mut c = CircuitInstance::build(build)?;
    let mut total = Duration::ZERO;
    for step in steps {
        // Packed before the clock starts, as the host's buffers arrive in
        // a component.
        let input = step
            .iter()
            .map(|events| EventBatch::from_events(events))
            .collect::<Result<Vec<_>, _>>()?;
        let t = Instant::now();
        c.step_batches(input, &mut LocalExchange)?;
        total += t.elapsed();
    }
    Ok(total)
}

/// A step's events as the host passes them (keys dropped).
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
pub(super) async fn run_wasm(
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

/// Runs `steps` through `component` as a whole exactly-once pipeline (W=1,
/// one partition, synced commits, sandboxed, 10 000 events per step, no
/// checkpoint) in a fresh directory: the time the steps took.
pub(super) async fn run_exactly_once(
    engine: &Arc<SluiceEngine>,
    component: &LoadedComponent,
    steps: &[Vec<Vec<RawEvent>>],
) -> anyhow::Result<Duration> {
    let dir = tempfile::tempdir()?;
    let p = Pipeline::open(
        engine.clone(),
        component.clone(),
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
    for step in steps {
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
    Ok(t.elapsed())
}

/// A word-count pipeline (W=2, input `lines` in 2 partitions) in `dir`,
/// never checkpointing by itself, with `max_batch` events per partition per
/// step; `synced` says whether its step commits are fsynced.
pub(super) async fn wordcount_pipeline(
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
pub(super) async fn fill_and_run(
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
pub(super) fn manual_checkpoints(max_batch: u64) -> PipelineOptions {
    PipelineOptions {
        name: "bench".into(),
        max_batch,
        checkpoint_every_steps: u64::MAX,
        checkpoint_interval: Duration::from_secs(3600),
        ..PipelineOptions::default()
    }
}

/// Times opening a coordinator (restoring and replaying) of `pipeline`.
pub(super) async fn time_open(pipeline: &Pipeline) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let _c = pipeline.coordinator().await?;
    Ok(t.elapsed())
}

/// Times opening (restoring and replaying) the word-count pipeline in `dir`.
pub(super) async fn time_open_wordcount(
    engine: &Arc<SluiceEngine>,
    component: &LoadedComponent,
    dir: &Path,
) -> anyhow::Result<Duration> {
    time_open(&wordcount_pipeline(engine, component, dir, true, 10_000).await?).await
}

/// The ports of the word-count circuit.
pub fn wordcount_ports() -> CircuitPorts {
    CircuitPorts {
        inputs: vec!["lines".into()],
        outputs: vec!["counts".into()],
        snapshot_version: 1,
        operators: Vec::new(),
    }
}

/// Lines of 20 words each, `words` distinct words in all.
pub(super) fn distinct_words(words: usize) -> Vec<Event> {
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

/// The bytes of the newest checkpoint's worker states in `dir`.
pub(super) fn stored_state_bytes(dir: &Path) -> anyhow::Result<u64> {
    let store = RocksCheckpointStore::open(db::open(dir)?);
    Ok(store.latest()?.map_or(0, |cp| cp.state_bytes()))
}
