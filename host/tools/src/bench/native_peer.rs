//! **Native peer**: each workload as a whole exactly-once pipeline against
//! the same circuit linked natively and run in memory, with the native
//! engine figure measured before (issue #17) beside it.

use super::report::{Row, fmt_rate, rate};
use super::workloads::{Workload, run_exactly_once, run_native};
use sluice_runtime::SluiceEngine;
use std::sync::Arc;

/// The native engine figure issue #17 measured on this machine class: the
/// `dbsp` crate (0.349), in memory, word count over the same 200 000
/// pre-parsed lines.
const DBSP_WORDCOUNT: &str = "dbsp 0.349 native, in memory: 290–370 k lines/s (issue #17)";

/// The peer: each workload as a whole exactly-once pipeline (W=1, synced
/// commits, sandboxed, 10 000 events per partition per step) against the
/// same circuit linked natively and run in memory without storage, in the
/// same run.
pub(super) async fn native_peer(
    engine: &Arc<SluiceEngine>,
    loads: &[Workload],
    reps: usize,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    for w in loads.iter().filter(|w| w.name != "nexmark q1") {
        let (mut pipeline, mut native) = (0f64, 0f64);
        for _ in 0..reps {
            native = native.max(rate(w.events, run_native(w.native, &w.steps)?));
            let took = run_exactly_once(engine, &w.component, &w.steps).await?;
            pipeline = pipeline.max(rate(w.events, took));
        }
        let ratio = pipeline / native;
        rows.push(Row {
            scenario: "native peer",
            case: format!(
                "{}: exactly-once pipeline (durable, sandboxed, W=1) vs the circuit native, in memory",
                w.name
            ),
            measured: fmt_rate(pipeline),
            baseline: if w.name == "wordcount" {
                format!("{} native; {DBSP_WORDCOUNT}", fmt_rate(native))
            } else {
                format!("{} native", fmt_rate(native))
            },
            ratio,
            goal: "≥ 1× the native engine",
            met: Some(ratio >= 1.0),
        });
    }
    Ok(())
}
