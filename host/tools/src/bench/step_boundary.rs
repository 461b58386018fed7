//! **Step boundary**: the cost of an empty step (the call boundary) as a
//! share of a step of 1, 100 and 10 000 events.

use super::report::{Row, fmt_time};
use super::workloads::{Workload, json_event, run_native, run_wasm, text_lines};
use sluice_guest::exchange::RawEvent;
use sluice_runtime::SluiceEngine;

/// The step boundary rows: the time of an empty step against steps of 1,
/// 100 and 10 000 word-count events (WASM, and native beside it).
pub(super) async fn step_boundary(
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
