//! **Python**: circuits written in Python (componentize-py: CPython and the
//! circuit in one component) against the same circuits in Rust, in the same
//! run: throughput of the whole exactly-once pipeline on the same steps, and
//! for word count the component's size, its compile time (and load time
//! once cached), a worker's start and an idle worker's memory.

use super::report::{Row, fmt_rate, fmt_time, rate};
use super::workloads::{Workload, load, run_exactly_once};
use sluice_runtime::memory::resident_bytes;
use sluice_runtime::{Limits, SluiceEngine, Worker, WorkerInfo};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The Python examples of the bench workloads, by workload name.
const CIRCUITS: [(&str, &str); 3] = [
    ("wordcount", "python-wordcount"),
    ("nexmark q1", "python-nexmark-q1"),
    ("nexmark q4", "python-nexmark-q4"),
];

/// The Python rows (see the module's docs). Without componentize-py, one
/// row says how to install it.
pub(super) async fn python(
    engine: &Arc<SluiceEngine>,
    loads: &[Workload],
    quick: bool,
    reps: usize,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    if let Err(e) = crate::python::componentize_py() {
        rows.push(Row {
            scenario: "python",
            case: "Python circuits: not measured".into(),
            measured: format!("{e}"),
            baseline: String::new(),
            ratio: 0.0,
            goal: "reported",
            met: None,
        });
        return Ok(());
    }
    // CPython interprets every record: a few steps of each input.
    let steps = if quick { 1 } else { 5 };
    for (name, dir) in CIRCUITS.iter().take(if quick { 1 } else { 3 }) {
        let Some(rust) = loads.iter().find(|w| w.name == *name) else {
            continue;
        };
        let (wasm, component) = load(engine, dir).await?;
        let steps = &rust.steps[..steps.min(rust.steps.len())];
        let events: u64 = steps
            .iter()
            .flatten()
            .map(|events| events.len() as u64)
            .sum();
        let (mut py, mut rs) = (0f64, 0f64);
        for _ in 0..reps {
            py = py.max(rate(
                events,
                run_exactly_once(engine, &component, steps).await?,
            ));
            rs = rs.max(rate(
                events,
                run_exactly_once(engine, &rust.component, steps).await?,
            ));
        }
        rows.push(Row {
            scenario: "python",
            case: format!(
                "{name}: the Python circuit vs the same in Rust (exactly-once pipeline, W=1, {events} events)"
            ),
            measured: fmt_rate(py),
            baseline: format!("{} in Rust", fmt_rate(rs)),
            ratio: py / rs.max(1e-9),
            goal: "reported (CPython interprets each record)",
            met: None,
        });
        if *name == "wordcount" {
            component_rows(&wasm, &rust.wasm, rows).await?;
        }
    }
    Ok(())
}

/// What a component costs before it runs a step, Python against Rust:
/// size, compile, cached load, worker start, idle memory.
async fn component_rows(python: &Path, rust: &Path, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let (ps, rs) = (size(python), size(rust));
    rows.push(Row {
        scenario: "python",
        case: "wordcount component size: Python vs Rust".into(),
        measured: format!("{:.1} MiB", ps as f64 / (1 << 20) as f64),
        baseline: format!("{:.0} KiB in Rust", rs as f64 / 1024.0),
        ratio: ps as f64 / rs.max(1) as f64,
        goal: "reported (CPython is in the component)",
        met: None,
    });
    let mut figures = Vec::new();
    for wasm in [python, rust] {
        figures.push(costs(wasm).await?);
    }
    let (py, rs) = (&figures[0], &figures[1]);
    let time_row = |case: &str, p: Duration, r: Duration| Row {
        scenario: "python",
        case: format!("wordcount {case}: Python vs Rust"),
        measured: fmt_time(p),
        baseline: format!("{} in Rust", fmt_time(r)),
        ratio: p.as_secs_f64() / r.as_secs_f64().max(1e-12),
        goal: "reported",
        met: None,
    };
    rows.push(time_row("compile (first load)", py.compile, rs.compile));
    rows.push(time_row(
        "load, compiled before (cached)",
        py.cached,
        rs.cached,
    ));
    rows.push(time_row(
        "worker start (instantiate + init)",
        py.start,
        rs.start,
    ));
    rows.push(Row {
        scenario: "python",
        case: "wordcount idle worker's resident memory: Python vs Rust".into(),
        measured: format!("{:.1} MiB", py.resident as f64 / (1 << 20) as f64),
        baseline: format!("{:.0} KiB in Rust", rs.resident as f64 / 1024.0),
        ratio: py.resident as f64 / rs.resident.max(1) as f64,
        goal: "reported",
        met: None,
    });
    Ok(())
}

/// A component's costs before its first step.
struct Costs {
    compile: Duration,
    cached: Duration,
    start: Duration,
    resident: u64,
}

async fn costs(wasm: &Path) -> anyhow::Result<Costs> {
    const WORKERS: u32 = 4;
    let cache = tempfile::tempdir()?;
    let limits = Limits {
        memory: 256 << 20,
        ..Limits::default()
    };
    let t = Instant::now();
    SluiceEngine::new(limits, Some(cache.path().to_owned()))?.load_file(wasm)?;
    let compile = t.elapsed();
    let engine = SluiceEngine::new(limits, Some(cache.path().to_owned()))?;
    let t = Instant::now();
    let component = engine.load_file(wasm)?;
    let cached = t.elapsed();
    let before = resident_bytes();
    let mut idle = Vec::new();
    let t = Instant::now();
    for i in 0..WORKERS {
        let info = WorkerInfo {
            worker: 0,
            workers: 1,
            pipeline: format!("python-bench-{i}"),
            config: vec![],
        };
        idle.push(Worker::start(&engine, &component, info, None, false).await?);
    }
    let start = t.elapsed() / WORKERS;
    let resident = resident_bytes().saturating_sub(before) / WORKERS as u64;
    drop(idle);
    Ok(Costs {
        compile,
        cached,
        start,
        resident,
    })
}
