//! **Incremental checkpoint**: the pause and the bytes written of an
//! incremental checkpoint against a full one of the same state, and the
//! restore of whole pieces with deltas on top.

use super::report::{Row, fmt_time, recovery_row};
use super::workloads::{Workload, distinct_words, manual_checkpoints, time_open};
use sluice_core::Event;
use sluice_pipeline::{Pipeline, PipelineConfig};
use sluice_runtime::{Limits, PipelineOptions, SluiceEngine};
use sluice_storage::{AppendBatch, LogBackend};
use std::sync::Arc;
use std::time::Instant;

/// An incremental checkpoint against a full one of the same state: a
/// word-count pipeline holding `words` distinct words runs steps that
/// change 5 % of them, then checkpoints incrementally; then the same again
/// with a full checkpoint. The pause (snapshots) and the bytes written.
pub(super) async fn incremental_checkpoint(
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
