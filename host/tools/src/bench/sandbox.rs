//! **Sandbox cost**: events/s of wordcount, Nexmark q1 and q4 as WASM
//! components (W=1, no storage) against the same circuits compiled
//! natively into this binary.

use super::report::{Row, fmt_rate, rate};
use super::workloads::{Workload, run_native, run_wasm};
use sluice_runtime::SluiceEngine;
use std::time::Duration;

/// The sandbox cost rows: per workload, events/s as a WASM component
/// against the circuit native, the best of `reps` runs each.
pub(super) async fn sandbox_cost(
    engine: &SluiceEngine,
    loads: &[Workload],
    reps: usize,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    for w in loads {
        let (mut native, mut wasm) = (Duration::MAX, Duration::MAX);
        for _ in 0..reps {
            native = native.min(run_native(w.native, &w.steps)?);
            wasm = wasm.min(run_wasm(engine, &w.component, &w.steps).await?);
        }
        let (m, b) = (rate(w.events, wasm), rate(w.events, native));
        let stateful = w.name != "nexmark q1";
        let goal = if stateful {
            "≥ 0.6× (stateful)"
        } else {
            "≥ 0.8× (stateless)"
        };
        rows.push(Row {
            scenario: "sandbox cost",
            case: format!("{} ({} events, W=1)", w.name, w.events),
            measured: fmt_rate(m),
            baseline: fmt_rate(b),
            ratio: m / b,
            goal,
            met: Some(m / b >= if stateful { 0.6 } else { 0.8 }),
        });
    }
    Ok(())
}
