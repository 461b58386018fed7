//! `sluice bench`: what the sandbox and exactly-once cost, each figure a
//! ratio against a baseline measured in the same run (so it holds on a noisy
//! machine).
//!
//! One module per scenario, each module's docs saying what it measures
//! against what; [`bench`] runs them in turn, and the table lists their
//! rows in that order.
//!
//! The table goes to stdout, and with `--markdown` into a file between
//! `<!-- bench:begin -->` and `<!-- bench:end -->` (text around the markers
//! is kept), with an SVG chart of the ratios.

/// **Checkpoint** pause and **recovery** time, for growing word-count state.
mod checkpoint;
/// **Density**: worker start time and idle memory.
mod density;
/// **Durable commit**: step commits against raw synced RocksDB batches.
mod durable_commit;
/// **Exactly-once cost**: synced commits against unsynced ones.
mod exactly_once;
/// **Hosts**: a pipeline across hosts; joins, leaves and failover.
mod hosts;
/// **Incremental checkpoint** against a full one of the same state.
mod incremental;
/// **Large state**: checkpoint and restore of 1 GiB in few keys.
mod large_state;
/// **Memory against dbsp**: `sluice run` and `sluice serve` against the
/// `dbsp` crate's word count, throughput and peak memory.
mod memory;
/// **Native peer**: a whole exactly-once pipeline against the circuit native.
mod native_peer;
/// **Nexmark against DBSP's own**: q0–q22 as whole `sluice run`s against
/// `dbsp_nexmark`, throughput and peak memory.
mod nexmark;
/// **Python**: Python circuits against the same circuits in Rust.
mod python;
/// **Recovery by replay** of 1 M events without a checkpoint.
mod replay;
/// **Replicas**: two per worker against one — CPU, exchange bytes, failover.
mod replicas;
/// **Rescale**: the state a layout change moves, and its pause.
mod rescale;
/// **Sandbox cost**: WASM components against the same circuits native.
mod sandbox;
/// **Step boundary**: an empty step as a share of steps of 1 to 10 000 events.
mod step_boundary;
/// **Step log**: a Kafka pipeline's take-over against its history's length.
#[cfg(feature = "kafka")]
mod step_log;

/// The rows, their formatting, the table, the chart and the markdown.
mod report;
/// The circuits, their inputs cut into steps, the pipeline set-ups.
mod workloads;

pub use durable_commit::{sample_commit, sample_commits};
pub use report::{Row, table};
pub use workloads::wordcount_ports;

use sluice_runtime::{Limits, SluiceEngine};
use std::path::PathBuf;
use std::sync::Arc;

/// What to run and where to write.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Small inputs and few repetitions (for CI).
    pub quick: bool,
    /// Write the table into this markdown file (between the markers).
    pub markdown: Option<PathBuf>,
    /// Write the chart (SVG) here.
    pub chart: Option<PathBuf>,
    /// Run only these scenarios (empty: all): `sandbox`, `step-boundary`,
    /// `exactly-once`, `checkpoint`, `incremental`, `native-peer`,
    /// `large-state`, `rescale`, `hosts`, `replicas`, `replay`, `density`,
    /// `durable-commit`, `memory`, `python`, `nexmark`. A partial run prints its table but writes no
    /// markdown or chart (they hold every scenario).
    pub only: Vec<String>,
}

/// The scenarios' names, for [`BenchOptions::only`].
pub const SCENARIOS: [&str; 16] = [
    "sandbox",
    "step-boundary",
    "exactly-once",
    "checkpoint",
    "incremental",
    "native-peer",
    "large-state",
    "rescale",
    "hosts",
    "replicas",
    "replay",
    "density",
    "durable-commit",
    "memory",
    "python",
    "nexmark",
];

impl BenchOptions {
    /// Whether scenario `name` runs.
    fn runs(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == name)
    }
}

/// Runs the step-log scenario alone, against the Kafka brokers at
/// `brokers` (the other scenarios need none), prints its table and returns
/// its rows.
#[cfg(feature = "kafka")]
pub async fn bench_step_log(brokers: &str, quick: bool) -> anyhow::Result<Vec<Row>> {
    let brokers = brokers.to_owned();
    eprintln!("bench: step log …");
    let rows = tokio::task::spawn_blocking(move || {
        let mut rows = Vec::new();
        step_log::step_log(&brokers, quick, &mut rows).map(|()| rows)
    })
    .await??;
    println!("{}", table(&rows));
    Ok(rows)
}

/// Runs the benchmarks and returns the rows (also printed and written).
pub async fn bench(opts: &BenchOptions) -> anyhow::Result<Vec<Row>> {
    let engine = Arc::new(SluiceEngine::new(
        Limits::default(),
        SluiceEngine::default_cache_dir(),
    )?);
    eprintln!("bench: building and loading the circuits …");
    let loads = workloads::workloads(&engine, opts.quick).await?;
    let reps = if opts.quick { 1 } else { 3 };
    let mut rows = Vec::new();
    if opts.runs("sandbox") {
        eprintln!("bench: sandbox cost …");
        sandbox::sandbox_cost(&engine, &loads, reps, &mut rows).await?;
    }
    if opts.runs("step-boundary") {
        eprintln!("bench: step boundary …");
        step_boundary::step_boundary(&engine, &loads[0], opts.quick, &mut rows).await?;
    }
    if opts.runs("exactly-once") {
        eprintln!("bench: exactly-once cost …");
        exactly_once::exactly_once_cost(&engine, &loads[0], opts.quick, reps.min(2), &mut rows)
            .await?;
    }
    if opts.runs("checkpoint") {
        eprintln!("bench: checkpoint and recovery …");
        checkpoint::checkpoint_and_recovery(&engine, &loads[0], opts.quick, &mut rows).await?;
    }
    if opts.runs("incremental") {
        eprintln!("bench: incremental checkpoint …");
        incremental::incremental_checkpoint(&loads[0], opts.quick, &mut rows).await?;
    }
    if opts.runs("native-peer") {
        eprintln!("bench: native peer …");
        native_peer::native_peer(&engine, &loads, reps, &mut rows).await?;
    }
    if opts.runs("large-state") {
        eprintln!("bench: large state …");
        large_state::large_state(&engine, opts.quick, &mut rows).await?;
    }
    if opts.runs("rescale") {
        eprintln!("bench: rescale …");
        rescale::rescale_cost(&engine, &loads[0], opts.quick, &mut rows).await?;
    }
    if opts.runs("hosts") {
        eprintln!("bench: hosts …");
        hosts::hosts_cost(&engine, &loads[0], opts.quick, &mut rows).await?;
    }
    if opts.runs("replicas") {
        eprintln!("bench: replicas …");
        replicas::replicas_cost(&engine, &loads[0], opts.quick, &mut rows).await?;
    }
    if opts.runs("replay") {
        eprintln!("bench: recovery by replay …");
        replay::replay_cost(&engine, &loads[0], opts.quick, &mut rows).await?;
    }
    if opts.runs("density") {
        eprintln!("bench: density …");
        density::density(&loads[0], opts.quick, &mut rows).await?;
    }
    if opts.runs("durable-commit") {
        eprintln!("bench: durable commit …");
        let quick = opts.quick;
        let mut commit_rows = Vec::new();
        tokio::task::spawn_blocking(move || {
            durable_commit::durable_commit(quick, &mut commit_rows).map(|()| commit_rows)
        })
        .await??
        .into_iter()
        .for_each(|r| rows.push(r));
    }
    if opts.runs("memory") {
        eprintln!("bench: memory against dbsp …");
        memory::memory(&loads[0], opts.quick, reps, &mut rows).await?;
    }
    if opts.runs("python") {
        eprintln!("bench: Python circuits …");
        python::python(&engine, &loads, opts.quick, reps.min(2), &mut rows).await?;
    }
    if opts.runs("nexmark") {
        eprintln!("bench: Nexmark against dbsp_nexmark …");
        // Three turns each: between runs of a pair the ratios here moved by
        // up to ±15 % with two.
        nexmark::nexmark(&engine, opts.quick, reps, &mut rows).await?;
    }

    let whole = opts.only.is_empty();
    report::write(
        &rows,
        opts.quick,
        opts.markdown.as_deref().filter(|_| whole),
        opts.chart.as_deref().filter(|_| whole),
    )?;
    Ok(rows)
}
