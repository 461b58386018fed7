//! Helpers shared by the end-to-end tests.
#![allow(dead_code)]

#[cfg(feature = "kafka")]
pub mod cluster;
pub mod crash;
pub mod docs;
pub mod proxy;
pub mod server;

use sluice_core::Event;
use sluice_pipeline::{Pipeline, PipelineConfig};
use sluice_runtime::{Coordinator, Limits, PipelineOptions, SluiceEngine};
use sluice_storage::{AppendBatch, Guarded, LogBackend};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `sluice` binary under test.
pub fn sluice() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sluice"))
}

/// Scratch space that survives between test runs (guest builds, caches).
pub fn scratch() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

/// The precompiled-component cache the tests use.
pub fn cache_dir() -> PathBuf {
    scratch().join("sluice-cache")
}

/// Builds a guest crate (path relative to the repository) once per run of
/// the test binary and returns its component.
pub fn component(crate_path: &str) -> PathBuf {
    static BUILT: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = built.get(crate_path) {
        return p.clone();
    }
    let wasm = sluice_tools::compile::build_component(
        &repo().join(crate_path),
        Some(&cache_dir().join("guest-target")),
    )
    .unwrap_or_else(|e| panic!("building {crate_path}: {e:#}"));
    built.insert(crate_path.to_owned(), wasm.clone());
    wasm
}

/// A Python circuit written to `dir/name/circuit.py` from `source` and
/// built: its component.
pub fn python_component(dir: &std::path::Path, name: &str, source: &str) -> PathBuf {
    let at = dir.join(name);
    std::fs::create_dir_all(&at).unwrap();
    std::fs::write(at.join("circuit.py"), source).unwrap();
    component(at.to_str().unwrap())
}

/// A finished command's standard error, as text.
pub fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `sluice verify --data DATA`, which must pass: what it printed.
pub fn verified(data: &std::path::Path) -> String {
    let out = sluice_cmd()
        .arg("verify")
        .arg("--data")
        .arg(data)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}", stderr(&out));
    text
}

/// A `sluice` command with the test cache.
pub fn sluice_cmd() -> std::process::Command {
    let mut cmd = std::process::Command::new(sluice());
    cmd.env("SLUICE_CACHE_DIR", cache_dir());
    // The test S3-protocol server, for `--store s3://sluice-tests/…`.
    if let Some(endpoint) = s3_endpoint() {
        cmd.env("AWS_ENDPOINT", endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1");
    }
    cmd
}

/// The S3-protocol server the tests may use (scripts/test.sh starts one,
/// with a bucket `sluice-tests`), or `None` (outside CI) to skip.
pub fn s3_endpoint() -> Option<String> {
    match std::env::var("SLUICE_S3_ENDPOINT") {
        Ok(e) if !e.is_empty() => Some(e),
        _ if std::env::var_os("CI").is_some() => {
            panic!(
                "CI is set but SLUICE_S3_ENDPOINT is not: scripts/test.sh must start the S3 server"
            )
        }
        _ => None,
    }
}

/// A pipeline opened through the library, for tests that need to stop at
/// precise points.
pub struct Harness {
    pub pipeline: Pipeline,
    /// The pipeline's logs.
    pub log: Arc<dyn LogBackend>,
    /// Its logs and checkpoints behind the invariant checks.
    pub storage: Arc<Guarded>,
    pub outputs: Vec<String>,
    pub workers: u32,
}

impl Harness {
    /// Opens (or creates) a pipeline of `wasm` in `dir`.
    pub async fn open(dir: &Path, wasm: &Path, workers: u32, limits: Limits) -> Harness {
        Self::open_with(dir, wasm, workers, limits, |_| {}).await
    }

    /// [`open`](Self::open), the configuration changed by `configure`
    /// first.
    pub async fn open_with(
        dir: &Path,
        wasm: &Path,
        workers: u32,
        limits: Limits,
        configure: impl FnOnce(&mut PipelineConfig),
    ) -> Harness {
        let engine = Arc::new(SluiceEngine::new(limits, Some(cache_dir())).unwrap());
        let component = engine.load_file(wasm).unwrap();
        let mut config = PipelineConfig::new(dir, workers);
        configure(&mut config);
        let pipeline = Pipeline::open(engine, component, config).await.unwrap();
        Harness {
            log: pipeline.storage().log.clone(),
            storage: pipeline.storage().guarded(),
            outputs: pipeline.shape().outputs.clone(),
            workers,
            pipeline,
        }
    }

    /// The engine the workers run on.
    pub fn engine(&self) -> &Arc<SluiceEngine> {
        self.pipeline.engine()
    }

    /// Appends JSON values (inserts) to `partition` of input `port`.
    pub fn append(&self, port: &str, partition: u32, values: &[&str]) {
        let events = values
            .iter()
            .map(|v| Event {
                value: serde_json::to_vec(v).unwrap(),
                weight: 1,
            })
            .collect();
        self.log
            .append(AppendBatch {
                appends: vec![(port.into(), partition, events)],
                mark: None,
                producer: None,
            })
            .unwrap();
    }

    /// Opens a coordinator (which recovers).
    pub async fn coordinator(
        &self,
        options: PipelineOptions,
    ) -> sluice_pipeline::Result<Coordinator> {
        self.pipeline.coordinator_with(options).await
    }

    /// Runs the offline audit of the pipeline's logs and checkpoints and
    /// panics on a violation; returns how many steps it checked.
    pub fn audit(&self) -> u64 {
        let verdict = sluice_storage::audit::audit(
            &*self.log,
            self.storage.checkpoints(),
            self.pipeline.shape(),
        )
        .unwrap();
        match verdict {
            sluice_storage::audit::Verdict::Consistent(summary) => summary.steps,
            sluice_storage::audit::Verdict::Violation(v) => panic!("audit: {v}"),
        }
    }

    /// How many of the committed steps were divided (each worker's share
    /// committed by whoever held the worker).
    pub fn divided_steps(&self) -> u64 {
        let Some(last) = self.log.last_step().unwrap() else {
            return 0;
        };
        (0..=last)
            .filter(|s| self.log.step_record(*s).unwrap().unwrap().is_division())
            .count() as u64
    }

    /// Word count's integrated output (`counts`): word → count.
    pub fn word_counts(&self) -> BTreeMap<String, i64> {
        self.integrated("counts")
            .into_iter()
            .map(|(v, w)| {
                let v: serde_json::Value = serde_json::from_str(&v).unwrap();
                let count = w * v["count"].as_i64().unwrap();
                (v["word"].as_str().unwrap().to_owned(), count)
            })
            .collect()
    }

    /// Integrated contents of output `name`: JSON value → weight.
    pub fn integrated(&self, name: &str) -> BTreeMap<String, i64> {
        let mut z = BTreeMap::new();
        self.log
            .scan_output(name, 0, &mut |e| {
                for ev in e.events {
                    *z.entry(String::from_utf8(ev.value).unwrap()).or_insert(0) += ev.weight;
                }
                Ok(std::ops::ControlFlow::Continue(()))
            })
            .unwrap();
        z.retain(|_, w| *w != 0);
        z
    }
}

/// Options that never checkpoint on their own.
pub fn manual_checkpoints() -> PipelineOptions {
    PipelineOptions {
        checkpoint_every_steps: u64::MAX,
        checkpoint_interval: std::time::Duration::from_secs(3600),
        max_batch: 2,
        ..PipelineOptions::default()
    }
}

/// Word count from scratch, normalizing words the way the example's
/// documentation says: trim non-alphanumerics at both ends, lower-case.
pub fn recount<'a>(lines: impl IntoIterator<Item = (&'a str, i64)>) -> BTreeMap<String, i64> {
    let mut counts = BTreeMap::new();
    for (line, weight) in lines {
        for raw in line.split_whitespace() {
            let w: String = raw
                .trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase();
            if !w.is_empty() {
                *counts.entry(w).or_insert(0) += weight;
            }
        }
    }
    counts.retain(|_, n| *n > 0);
    counts
}
