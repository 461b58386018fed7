//! **Checkpoint** and **recovery**: the pause a checkpoint takes, for
//! word-count state of growing size, against the checkpoint interval and a
//! step's time; and the time from open to live with that state restored,
//! against a cold start with empty state.

use super::report::{Row, checkpoint_row, recovery_row};
use super::workloads::{
    Workload, distinct_words, fill_and_run, stored_state_bytes, time_open_wordcount,
    wordcount_pipeline,
};
use sluice_runtime::{Coordinator, LoadedComponent, SluiceEngine};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A word-count pipeline holding about `words` distinct words (W=2), run
/// to the end without checkpoints; returns the average step time and the
/// still-open coordinator.
async fn stateful_pipeline(
    engine: &Arc<SluiceEngine>,
    component: &LoadedComponent,
    words: usize,
    dir: &Path,
) -> anyhow::Result<(Duration, Coordinator)> {
    let pipeline = wordcount_pipeline(engine, component, dir, true, 2_000).await?;
    let (c, took) = fill_and_run(&pipeline, distinct_words(words)).await?;
    let per_step = took / c.next_step().max(1) as u32;
    Ok((per_step, c))
}

/// The checkpoint and recovery rows: for word-count state of growing
/// size, the checkpoint's pause, then the time to reopen restoring it
/// against a cold start.
pub(super) async fn checkpoint_and_recovery(
    engine: &Arc<SluiceEngine>,
    wc: &Workload,
    quick: bool,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let sizes: &[usize] = if quick {
        &[20_000, 200_000]
    } else {
        &[20_000, 2_000_000, 8_000_000]
    };
    // Cold start: open a pipeline with no state at all.
    let empty_dir = tempfile::tempdir()?;
    let cold = time_open_wordcount(engine, &wc.component, empty_dir.path()).await?;
    for &words in sizes {
        let dir = tempfile::tempdir()?;
        let (step_time, mut c) =
            stateful_pipeline(engine, &wc.component, words, dir.path()).await?;
        let t = Instant::now();
        c.checkpoint().await?;
        let pause = t.elapsed();
        let snapshots = c.last_checkpoint_snapshots();
        drop(c);
        let state_bytes = stored_state_bytes(dir.path())?;
        let mib = state_bytes as f64 / (1 << 20) as f64;
        rows.push(checkpoint_row(
            format!("wordcount, {words} distinct words ({mib:.1} MiB of state), W=2"),
            snapshots,
            pause,
            step_time,
        ));
        // Recovery: reopen, restoring that checkpoint.
        let restore = time_open_wordcount(engine, &wc.component, dir.path()).await?;
        rows.push(recovery_row(
            format!("restore {mib:.1} MiB of state, W=2"),
            state_bytes,
            restore,
            cold,
        ));
    }
    Ok(())
}
