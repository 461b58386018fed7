//! **Exactly-once cost**: a whole pipeline's events/s with synced commits
//! against the same pipeline with unsynced commits.

use super::report::{Row, fmt_rate, rate};
use super::workloads::{Workload, fill_and_run, json_event, text_lines, wordcount_pipeline};
use sluice_core::Event;
use sluice_guest::exchange::RawEvent;
use sluice_runtime::{LoadedComponent, SluiceEngine};
use std::sync::Arc;

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

/// The exactly-once cost row: the word-count pipeline's events/s with
/// synced commits against unsynced ones, the best of `reps` runs each.
pub(super) async fn exactly_once_cost(
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
