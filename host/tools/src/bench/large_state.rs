//! **Large state**: checkpoint and restore of 1 GiB in few keys (the
//! `benches/guests/blobs` circuit), per byte rather than per key.

use super::report::{Row, checkpoint_row, recovery_row};
use super::workloads::{load, manual_checkpoints, stored_state_bytes, time_open};
use sluice_core::Event;
use sluice_pipeline::{Pipeline, PipelineConfig};
use sluice_runtime::{Limits, SluiceEngine};
use sluice_storage::AppendBatch;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Checkpoint and restore of large state in few keys: the `blobs` circuit
/// holding the distinct set of 64 KiB strings, 1 GiB in all (16 MiB in
/// `--quick`), W=2.
pub(super) async fn large_state(
    engine: &Arc<SluiceEngine>,
    quick: bool,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    const BLOB: usize = 64 << 10;
    // A wasm32 instance addresses at most 4 GiB, and a snapshot needs a copy
    // of the state beside it (two, with the envelope): 1 GiB is spread over
    // four workers.
    const W: u32 = 4;
    let total: usize = if quick { 16 << 20 } else { 1 << 30 };
    // Half the state per worker, plus its snapshot and an input batch.
    let big = Arc::new(engine.with_limits(Limits {
        memory: 3 << 30,
        ..engine.limits()
    }));
    let (_, component) = load(&big, "../benches/guests/blobs").await?;
    let dir = tempfile::tempdir()?;
    let open = |dir: &Path| {
        let config = PipelineConfig {
            options: manual_checkpoints(128),
            partitions: Some(W),
            ..PipelineConfig::new(dir, W)
        };
        Pipeline::open(big.clone(), component.clone(), config)
    };
    let pipeline = open(dir.path()).await?;
    let log = pipeline.storage().log.clone();
    let n = total / BLOB;
    let filler = "x".repeat(BLOB - 16);
    for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
        let events: Vec<Event> = chunk
            .iter()
            .map(|i| Event {
                value: serde_json::to_vec(&format!("{i:012}{filler}")).expect("string"),
                weight: 1,
            })
            .collect();
        log.append(AppendBatch {
            appends: vec![("blobs".into(), (chunk[0] / 64) as u32 % W, events)],
            ..AppendBatch::default()
        })?;
    }
    let mut c = pipeline.coordinator().await?;
    let t = Instant::now();
    while c.step().await? {}
    let step_time = t.elapsed() / c.next_step().max(1) as u32;
    let t = Instant::now();
    c.checkpoint().await?;
    let pause = t.elapsed();
    let snapshots = c.last_checkpoint_snapshots();
    drop((c, log, pipeline));
    let state_bytes = stored_state_bytes(dir.path())?;
    let mib = state_bytes as f64 / (1 << 20) as f64;
    rows.push(checkpoint_row(
        format!("blobs, {n} distinct 64 KiB strings ({mib:.0} MiB of state), W={W}"),
        snapshots,
        pause,
        step_time,
    ));
    let empty = tempfile::tempdir()?;
    let cold = time_open(&open(empty.path()).await?).await?;
    let restore = time_open(&open(dir.path()).await?).await?;
    rows.push(recovery_row(
        format!("restore {mib:.0} MiB of blobs state, W={W}"),
        state_bytes,
        restore,
        cold,
    ));
    Ok(())
}
