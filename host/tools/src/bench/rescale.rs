//! **Rescale**: the state a layout change W → W + 1 moves (sticky layout)
//! against the ideal, with the `mod W` layout as the baseline, and the
//! pause.

use super::report::{Row, fmt_time};
use super::workloads::{Workload, distinct_words, manual_checkpoints};
use anyhow::Context;
use sluice_pipeline::{Pipeline, PipelineConfig};
use sluice_runtime::SluiceEngine;
use sluice_storage::AppendBatch;
use std::sync::Arc;

/// Layout changes W → W + 1 of a word-count pipeline holding `words`
/// distinct words: the bytes of state the sticky rebalance moves against
/// the ideal (1/(W + 1) of the keyed state), the `mod W` layout's bytes as
/// the baseline (computed from the same pieces), and the pause — from the
/// last step under the old layout to the first under the new one — against
/// the bytes moved.
pub(super) async fn rescale_cost(
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
