//! **Density**: the time to start a worker (instantiate + `init`), with and
//! without the pooling allocator, against a bare wasmtime instantiate, and
//! the resident memory of idle instances.

use super::report::{Row, fmt_time};
use super::workloads::Workload;
use sluice_runtime::memory::resident_bytes;
use sluice_runtime::{Limits, SluiceEngine, Worker, WorkerInfo};
use std::time::{Duration, Instant};

/// The density rows: the time to start a word-count worker, on demand and
/// pooled, against a bare instantiate; and the memory of idle workers.
pub(super) async fn density(wc: &Workload, quick: bool, rows: &mut Vec<Row>) -> anyhow::Result<()> {
    let n: u32 = if quick { 200 } else { 1000 };
    let limits = Limits {
        memory: 64 << 20,
        ..Limits::default()
    };
    for pooling in [false, true] {
        let engine = if pooling {
            SluiceEngine::with_pooling(limits, SluiceEngine::default_cache_dir(), n + 8)?
        } else {
            SluiceEngine::new(limits, SluiceEngine::default_cache_dir())?
        };
        let component = engine.load_file(&wc.wasm)?;
        let mut bare = Duration::ZERO;
        for _ in 0..n {
            let t = Instant::now();
            Worker::instantiate_only(&engine, &component).await?;
            bare += t.elapsed();
        }
        let bare = bare / n;
        let before = resident_bytes();
        let mut idle = Vec::with_capacity(n as usize);
        let t = Instant::now();
        for i in 0..n {
            let info = WorkerInfo {
                worker: 0,
                workers: 1,
                pipeline: format!("idle-{i}"),
                config: vec![],
            };
            idle.push(Worker::start(&engine, &component, info, None, false).await?);
        }
        let start = t.elapsed() / n;
        let per_instance = resident_bytes().saturating_sub(before) / n as u64;
        let mode = if pooling { "pooling" } else { "on demand" };
        rows.push(Row {
            scenario: "density",
            case: format!("start a wordcount worker ({mode}), {n} instances"),
            measured: format!("{} (instantiate + init)", fmt_time(start)),
            baseline: format!("{} (bare wasmtime instantiate)", fmt_time(bare)),
            ratio: start.as_secs_f64() / bare.as_secs_f64().max(1e-12),
            goal: "≤ 50 µs instantiate",
            met: Some(start <= Duration::from_micros(50)),
        });
        if pooling {
            // Pipelines come and go on a host: stop them all, then start as
            // many again, each in a slot a stopped worker left (reset in
            // place, its first pages kept resident).
            drop(std::mem::take(&mut idle));
            let t = Instant::now();
            for i in 0..n {
                let info = WorkerInfo {
                    worker: 0,
                    workers: 1,
                    pipeline: format!("again-{i}"),
                    config: vec![],
                };
                idle.push(Worker::start(&engine, &component, info, None, false).await?);
            }
            let again = t.elapsed() / n;
            rows.push(Row {
                scenario: "density",
                case: format!(
                    "start a wordcount worker (pooling, a slot used before), {n} instances"
                ),
                measured: format!("{} (instantiate + init)", fmt_time(again)),
                baseline: format!("{} in a fresh slot", fmt_time(start)),
                ratio: again.as_secs_f64() / start.as_secs_f64().max(1e-12),
                goal: "≤ 50 µs instantiate",
                met: Some(again <= Duration::from_micros(50)),
            });
        }
        let per_host = (24u64 << 30) / per_instance.max(1);
        rows.push(Row {
            scenario: "density",
            case: format!("{n} idle workers ({mode})"),
            measured: format!("{:.0} KiB resident each", per_instance as f64 / 1024.0),
            baseline: format!("{per_host} idle workers in 24 GiB"),
            ratio: per_host as f64 / 1000.0,
            goal: "≥ 1000 idle pipelines per host",
            met: Some(per_host >= 1000),
        });
    }
    Ok(())
}
