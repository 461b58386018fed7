//! The tool commands: `build`, `chaos`, `bench`, `gen`, `demo`.

use super::progress::{bar, run_progress};
use sluice_runtime::SluiceEngine;
use sluice_tools::{bench as benchmarks, chaos as campaign, compile, demo as demos, generate};
use std::path::PathBuf;

/// `sluice build`.
pub async fn build(path: PathBuf, target_dir: Option<PathBuf>) -> anyhow::Result<()> {
    let wasm =
        tokio::task::spawn_blocking(move || compile::build_component(&path, target_dir.as_deref()))
            .await??;
    println!("{}", wasm.display());
    Ok(())
}

/// Builds the guest crate at `path` (relative to the source tree's
/// `examples/`) into the shared guest target directory.
async fn build_guest(path: &str) -> anyhow::Result<PathBuf> {
    let src = sluice_tools::examples_dir().join(path);
    let target = SluiceEngine::default_cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("guest-target");
    tokio::task::spawn_blocking(move || compile::build_component(&src, Some(&target))).await?
}

/// The W of a campaign's runs.
pub struct Workers {
    /// W (of every run, or of the first).
    pub workers: u32,
    /// Draw W anew for every run.
    pub rescale: bool,
}

/// The circuits of a one-host campaign (see `sluice chaos --help`).
pub struct ChaosCircuits {
    /// The orders-join component (built when absent).
    pub component: Option<PathBuf>,
    /// The noisy component (built when absent and no word count is given).
    pub noisy: Option<PathBuf>,
    /// A word-count component, instead of the orders join.
    pub wordcount: Option<PathBuf>,
}

/// `sluice chaos`.
pub async fn chaos(
    trials: u32,
    seed: u64,
    circuits: ChaosCircuits,
    workers: Workers,
    orders: u32,
) -> anyhow::Result<()> {
    let ChaosCircuits {
        component,
        noisy,
        wordcount,
    } = circuits;
    let (component, noisy) = match (component, noisy, &wordcount) {
        // The word count replaces the orders join: nothing else to build.
        (_, noisy, Some(wc)) => (wc.clone(), noisy),
        (Some(c), noisy, None) => (c, noisy),
        (None, noisy, None) => {
            let noisy = match noisy {
                Some(n) => n,
                None => build_guest("../tests/guests/noisy").await?,
            };
            (build_guest("orders-join").await?, Some(noisy))
        }
    };
    let exe = std::env::current_exe()?;
    let opts = campaign::ChaosOptions {
        trials,
        seed,
        component,
        noisy,
        wordcount,
        workers: workers.workers,
        rescale: workers.rescale,
        orders,
        progress: true,
    };
    let report = tokio::task::spawn_blocking(move || campaign::chaos(&exe, &opts)).await??;
    println!("{report}");
    if report.violations() > 0 {
        anyhow::bail!("{} violations of exactly-once", report.violations());
    }
    Ok(())
}

/// `sluice chaos --hosts` (and `--network`).
pub async fn chaos_hosts(
    trials: u32,
    seed: u64,
    component: Option<PathBuf>,
    network: bool,
    replicas: u32,
) -> anyhow::Result<()> {
    let component = match component {
        Some(c) => c,
        None => build_guest("wordcount").await?,
    };
    let report = campaign::chaos_hosts(&component, trials, seed, network, replicas, true).await?;
    println!("{report}");
    if report.violations() > 0 {
        anyhow::bail!(
            "{} violations (of exactly-once, or stuck pipelines)",
            report.violations()
        );
    }
    Ok(())
}

/// `sluice bench`.
pub async fn bench(
    quick: bool,
    markdown: Option<PathBuf>,
    chart: Option<PathBuf>,
    only: Vec<String>,
) -> anyhow::Result<()> {
    if let Some(bad) = only
        .iter()
        .find(|o| !benchmarks::SCENARIOS.contains(&o.as_str()))
    {
        anyhow::bail!(
            "{bad}: no such bench scenario (there are: {})",
            benchmarks::SCENARIOS.join(", ")
        );
    }
    benchmarks::bench(&benchmarks::BenchOptions {
        quick,
        markdown,
        chart,
        only,
    })
    .await?;
    Ok(())
}

/// `sluice bench --step-log`.
#[cfg(feature = "kafka")]
pub async fn bench_step_log(brokers: Option<String>, quick: bool) -> anyhow::Result<()> {
    let brokers = brokers.ok_or_else(|| {
        anyhow::anyhow!("--step-log needs --brokers HOST:PORT (or SLUICE_KAFKA_BROKERS)")
    })?;
    benchmarks::bench_step_log(&brokers, quick).await?;
    Ok(())
}

/// `sluice bench --step-log`, in a build without Kafka.
#[cfg(not(feature = "kafka"))]
pub async fn bench_step_log(_brokers: Option<String>, _quick: bool) -> anyhow::Result<()> {
    anyhow::bail!("--step-log needs Kafka: this `sluice` was built without the `kafka` feature")
}

/// `sluice gen nexmark`.
pub async fn gen_nexmark(events: u64, rate: u32, out: PathBuf) -> anyhow::Result<()> {
    let progress = bar(true, "{wide_bar} {pos}/{len} events");
    progress.set_length(events);
    let files = tokio::task::spawn_blocking(move || {
        let files = generate::gen_nexmark(events, rate, &out, &mut |n| progress.set_position(n));
        progress.finish_and_clear();
        files
    })
    .await??;
    for (path, n) in [files.person, files.auction, files.bid] {
        println!("{n:>10}  {}", path.display());
    }
    Ok(())
}

/// `sluice demo`.
pub async fn demo(
    workers: u32,
    repeat: u32,
    data: Option<PathBuf>,
    save_counts: Option<PathBuf>,
    top: usize,
) -> anyhow::Result<()> {
    demos::demo(
        demos::DemoOptions {
            workers,
            repeat,
            data,
            save_counts,
            top,
        },
        run_progress(true),
    )
    .await?;
    Ok(())
}
