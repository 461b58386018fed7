//! **Recovery by replay**: the time from open to live replaying 1 M events
//! without a checkpoint, against processing them live.

use super::report::{Row, fmt_time};
use super::workloads::{
    Workload, fill_and_run, text_lines, time_open_wordcount, wordcount_pipeline,
};
use sluice_core::Event;
use sluice_runtime::SluiceEngine;
use std::sync::Arc;

/// Recovery by replay: a word-count pipeline that never checkpointed
/// reopens and replays every committed step; against processing the same
/// events live.
pub(super) async fn replay_cost(
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
