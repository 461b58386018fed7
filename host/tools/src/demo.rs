//! `sluice demo`: build the word-count example and run it with W workers on
//! bundled public-domain text, then show the top words and the run's figures.

use anyhow::{Context, bail};
use sluice_pipeline::{PipelineConfig, RunEvent, RunReport, RunRequest, run};
use sluice_runtime::{Limits, PipelineOptions, SluiceEngine};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The bundled text (Lincoln, Dickens, Frost, Shakespeare, Psalm 23).
pub const TEXT: &str = include_str!("../data/demo.txt");

/// Options of `sluice demo`.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Workers W.
    pub workers: u32,
    /// How many times the text is appended (more events, same words).
    pub repeat: u32,
    /// Data directory (default: a temporary one, removed afterwards).
    pub data: Option<PathBuf>,
    /// Write the final counts as a JSON object here.
    pub save_counts: Option<PathBuf>,
    /// How many top words to print.
    pub top: usize,
}

/// Runs the demo; prints to stdout. `progress` hears how the run goes.
pub async fn demo(
    opts: DemoOptions,
    progress: Arc<dyn Fn(RunEvent) + Send + Sync>,
) -> anyhow::Result<RunReport> {
    let src = crate::examples_dir().join("wordcount");
    if !src.join("Cargo.toml").is_file() {
        bail!(
            "sluice demo builds {} and needs the Sluice source tree",
            src.display()
        );
    }
    let guests = SluiceEngine::default_cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("guest-target");
    eprintln!("building examples/wordcount for wasm32-wasip2 …");
    let component =
        tokio::task::spawn_blocking(move || crate::compile::build_component(&src, Some(&guests)))
            .await??;

    let tmp = tempfile::tempdir().context("creating a temporary directory")?;
    let data = opts.data.clone().unwrap_or_else(|| tmp.path().join("data"));
    let input = tmp.path().join("lines.jsonl");
    let output = tmp.path().join("counts.jsonl");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&input)?);
        for _ in 0..opts.repeat.max(1) {
            for line in TEXT.lines().filter(|l| !l.trim().is_empty()) {
                serde_json::to_writer(&mut f, line)?;
                f.write_all(b"\n")?;
            }
        }
        f.flush()?;
    }
    let report = run(
        RunRequest {
            component,
            pipeline: PipelineConfig {
                options: PipelineOptions {
                    name: "demo".into(),
                    max_batch: 512,
                    checkpoint_every_steps: 20,
                    checkpoint_interval: Duration::from_secs(5),
                    ..PipelineOptions::default()
                },
                ..PipelineConfig::new(data, opts.workers)
            },
            inputs: vec![("lines".into(), input)],
            read_in_place: false,
            outputs: vec![("counts".into(), output.clone())],
            limits: Limits::default(),
        },
        progress,
    )
    .await?;

    let counts = integrate_counts(&std::fs::read_to_string(&output)?)?;
    let mut top: Vec<(&String, &i64)> = counts.iter().collect();
    top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    println!("top words:");
    for (word, count) in top.iter().take(opts.top) {
        println!("  {count:>7}  {word}");
    }
    let s = &report.stats;
    println!(
        "workers: {}  steps: {}  checkpoints: {}  events in: {}  events out: {}  distinct words: {}",
        opts.workers,
        s.steps,
        s.checkpoints,
        s.events_in,
        s.events_out,
        counts.len()
    );
    println!(
        "run time: {:.3} s  throughput: {:.0} events/s",
        report.run_time.as_secs_f64(),
        report.events_per_second()
    );
    if let Some(path) = &opts.save_counts {
        std::fs::write(path, serde_json::to_vec_pretty(&counts)?)
            .with_context(|| path.display().to_string())?;
    }
    Ok(report)
}

/// Integrates word-count output lines into `word → count`, checking that the
/// result is a function (each word has exactly one current count).
pub fn integrate_counts(jsonl: &str) -> anyhow::Result<BTreeMap<String, i64>> {
    let mut z: BTreeMap<(String, i64), i64> = BTreeMap::new();
    for (i, line) in jsonl.lines().enumerate() {
        let (v, w) = sluice_core::wire::parse_output_line(line)
            .with_context(|| format!("line {}", i + 1))?;
        let word = v["word"].as_str().context("missing word")?.to_owned();
        let count = v["count"].as_i64().context("missing count")?;
        *z.entry((word, count)).or_default() += w;
    }
    let mut counts = BTreeMap::new();
    for ((word, count), weight) in z.into_iter().filter(|(_, w)| *w != 0) {
        if weight != 1 || counts.insert(word.clone(), count).is_some() {
            bail!("output is not a set of current counts: `{word}` has weight {weight}");
        }
    }
    Ok(counts)
}
