//! A pipeline's recent figures, kept in memory for the console and the
//! CLI: one sample a second over the last ten minutes (rates, input lag,
//! step latency percentiles), the last checkpoints, and per worker its
//! shards, partitions and lag.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Samples kept: ten minutes at one a second.
pub const SAMPLES: usize = 600;
/// Checkpoints kept.
pub const CHECKPOINTS: usize = 50;

/// One second of a pipeline's life.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Sample {
    /// When (ms since the Unix epoch).
    pub t_ms: u64,
    /// Input events consumed per second.
    pub events_in_per_sec: f64,
    /// Output events committed per second.
    pub events_out_per_sec: f64,
    /// Steps committed per second.
    pub steps_per_sec: f64,
    /// Input events appended but not yet consumed.
    pub input_lag: u64,
    /// Median step time over the second, ms (0 without steps).
    pub step_p50_ms: f64,
    /// 99th percentile step time over the second, ms.
    pub step_p99_ms: f64,
}

/// One checkpoint the pipeline took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CheckpointEntry {
    /// The step it covers.
    pub step: u64,
    /// When it committed (ms since the Unix epoch).
    pub at_ms: u64,
    /// How long the pipeline paused for its snapshots, ms.
    pub pause_ms: f64,
    /// How long it took with the write (which overlaps the next steps), ms.
    pub total_ms: f64,
}

/// One worker's share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WorkerFigures {
    /// The worker.
    pub worker: u32,
    /// Shards of the key space it owns.
    pub shards: u32,
    /// Input partitions it reads.
    pub partitions: u32,
    /// Input events in its partitions not yet consumed.
    pub lag: u64,
}

/// `GET /pipelines/{name}/metrics`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PipelineMetrics {
    /// One per second, oldest first (the last ten minutes the pipeline ran).
    pub samples: Vec<Sample>,
    /// The last checkpoints, oldest first.
    pub checkpoints: Vec<CheckpointEntry>,
    /// Per worker of the current layout.
    pub workers: Vec<WorkerFigures>,
    /// The current layout's epoch.
    pub layout_epoch: u64,
}

/// What the runner accumulates.
#[derive(Debug, Default)]
pub struct History {
    samples: VecDeque<Sample>,
    checkpoints: VecDeque<CheckpointEntry>,
    /// Step times since the last sample.
    steps: Vec<f64>,
    /// The last sample's time and totals (events in, out, steps).
    last: Option<(Instant, u64, u64, u64)>,
    workers: Vec<WorkerFigures>,
    layout_epoch: u64,
}

/// Now, in ms since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

impl History {
    /// A step took `took`.
    pub fn on_step(&mut self, took: Duration) {
        self.steps.push(took.as_secs_f64() * 1000.0);
    }

    /// A checkpoint of `step` committed.
    pub fn on_checkpoint(&mut self, step: u64, pause: Duration, total: Duration) {
        if self.checkpoints.len() == CHECKPOINTS {
            self.checkpoints.pop_front();
        }
        self.checkpoints.push_back(CheckpointEntry {
            step,
            at_ms: now_ms(),
            pause_ms: pause.as_secs_f64() * 1000.0,
            total_ms: total.as_secs_f64() * 1000.0,
        });
    }

    /// The workers' shares, as of now.
    pub fn set_workers(&mut self, workers: Vec<WorkerFigures>, layout_epoch: u64) {
        self.workers = workers;
        self.layout_epoch = layout_epoch;
    }

    /// Takes a sample if a second passed since the last one, from the
    /// totals since the pipeline started.
    pub fn sample(&mut self, events_in: u64, events_out: u64, steps: u64, lag: u64) {
        let now = Instant::now();
        let Some((at, e_in, e_out, s)) = self.last else {
            self.last = Some((now, events_in, events_out, steps));
            return;
        };
        let secs = now.duration_since(at).as_secs_f64();
        if secs < 1.0 {
            return;
        }
        let mut times = std::mem::take(&mut self.steps);
        times.sort_by(f64::total_cmp);
        if self.samples.len() == SAMPLES {
            self.samples.pop_front();
        }
        let per_sec = |now: u64, then: u64| now.saturating_sub(then) as f64 / secs;
        self.samples.push_back(Sample {
            t_ms: now_ms(),
            events_in_per_sec: per_sec(events_in, e_in),
            events_out_per_sec: per_sec(events_out, e_out),
            steps_per_sec: per_sec(steps, s),
            input_lag: lag,
            step_p50_ms: percentile(&times, 0.5),
            step_p99_ms: percentile(&times, 0.99),
        });
        self.last = Some((now, events_in, events_out, steps));
    }

    /// The newest sample.
    pub fn latest(&self) -> Option<&Sample> {
        self.samples.back()
    }

    /// The newest checkpoint.
    pub fn last_checkpoint(&self) -> Option<&CheckpointEntry> {
        self.checkpoints.back()
    }

    /// Everything, for the API.
    pub fn metrics(&self) -> PipelineMetrics {
        PipelineMetrics {
            samples: self.samples.iter().cloned().collect(),
            checkpoints: self.checkpoints.iter().cloned().collect(),
            workers: self.workers.clone(),
            layout_epoch: self.layout_epoch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_rates_and_percentiles() {
        let mut h = History::default();
        h.sample(0, 0, 0, 0);
        for ms in [1, 2, 3, 4, 100] {
            h.on_step(Duration::from_millis(ms));
        }
        // Not a second yet: nothing.
        h.sample(10, 5, 5, 3);
        assert!(h.latest().is_none());
        h.last = h
            .last
            .map(|(at, a, b, c)| (at - Duration::from_secs(2), a, b, c));
        h.sample(200, 100, 5, 7);
        let s = h.latest().unwrap();
        assert!((s.events_in_per_sec - 100.0).abs() < 5.0, "{s:?}");
        assert_eq!(s.input_lag, 7);
        assert_eq!(s.step_p50_ms, 3.0);
        assert_eq!(s.step_p99_ms, 100.0);
        for i in 0..(CHECKPOINTS as u64 + 5) {
            h.on_checkpoint(i, Duration::from_millis(1), Duration::from_millis(2));
        }
        assert_eq!(h.metrics().checkpoints.len(), CHECKPOINTS);
        assert_eq!(h.last_checkpoint().unwrap().step, CHECKPOINTS as u64 + 4);
    }
}
