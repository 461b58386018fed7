//! A pipeline on the embedded backend, run to completion: what `sluice run`
//! does. Opens (or creates) the data directory, appends the input files
//! exactly once, recovers, runs steps until all input is consumed and
//! committed, checkpoints, and writes the output logs as JSON lines.

use super::coordinator::{Coordinator, PipelineOptions, Stats};
use super::engine::{Limits, LoadedComponent, SluiceEngine};
use super::worker::{CircuitShape, Worker};
use crate::error::{Error, Result};
use crate::ingest::{IngestReport, ingest_file};
use crate::spec::write_output_line;
use crate::storage::meta::{self, PipelineMeta};
use crate::storage::{EmbeddedLog, Guarded, LogBackend, RocksCheckpointStore, db};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The component file.
    pub component: PathBuf,
    /// The pipeline's data directory.
    pub data: PathBuf,
    /// Number of workers W.
    pub workers: u32,
    /// `(input port, JSON-lines file)` to append.
    pub inputs: Vec<(String, PathBuf)>,
    /// `(output port, file)` to write the output log to.
    pub outputs: Vec<(String, PathBuf)>,
    /// Step, checkpoint and naming options.
    pub options: PipelineOptions,
    /// Per-instance limits.
    pub limits: Limits,
    /// Show progress bars on stderr.
    pub progress: bool,
    /// Where the logs live.
    pub log: LogChoice,
}

/// Where a pipeline's input, output and step logs live. Checkpoints are
/// always in the data directory's RocksDB.
#[derive(Debug, Clone, Default)]
pub enum LogChoice {
    /// In the data directory's RocksDB (the default).
    #[default]
    Embedded,
    /// In Kafka topics.
    #[cfg(feature = "kafka")]
    Kafka {
        /// Brokers, pipeline name (the identity every host shares) and topics.
        config: crate::storage::KafkaConfig,
        /// Partitions of input topics Sluice creates (default: W); existing
        /// topics keep theirs.
        input_partitions: Option<u32>,
    },
}

impl LogChoice {
    /// How the choice is recorded in the pipeline's metadata.
    fn describe(&self) -> String {
        match self {
            LogChoice::Embedded => "embedded".into(),
            #[cfg(feature = "kafka")]
            LogChoice::Kafka { config, .. } => format!("kafka:{}", config.pipeline),
        }
    }
}

/// How often `run` recovers from storage errors before giving up.
pub const MAX_RETRIES: u32 = 5;

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The coordinator's figures.
    pub stats: Stats,
    /// Per input file, what was appended.
    pub ingested: Vec<IngestReport>,
    /// Time spent running steps (after ingest and recovery).
    pub run_time: Duration,
    /// Steps committed in total, across runs.
    pub total_steps: u64,
    /// Output events written per output file.
    pub written: Vec<u64>,
    /// Recoveries after storage errors.
    pub retries: u32,
}

impl RunReport {
    /// Input events consumed per second of step time.
    pub fn events_per_second(&self) -> f64 {
        self.stats.events_in as f64 / self.run_time.as_secs_f64().max(1e-9)
    }
}

fn bar(show: bool, template: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style);
    }
    bar
}

/// Learns a component's ports from a throwaway instance.
pub async fn describe(engine: &SluiceEngine, component: &LoadedComponent) -> Result<CircuitShape> {
    let info = super::bindings::WorkerInfo {
        worker: 0,
        workers: 1,
        pipeline: "describe".into(),
        config: vec![],
    };
    let mut worker = Worker::start(engine, component, info, None, false).await?;
    worker.describe().await
}

fn port_index(kind: &'static str, names: &[String], name: &str) -> Result<usize> {
    names
        .iter()
        .position(|n| n == name)
        .ok_or_else(|| Error::Unknown {
            kind,
            name: name.to_owned(),
            hint: format!("; the circuit has [{}]", names.join(", ")),
        })
}

/// Runs a pipeline to completion on the embedded backend.
pub async fn run(req: RunRequest) -> Result<RunReport> {
    let engine = Arc::new(SluiceEngine::new(
        req.limits,
        SluiceEngine::default_cache_dir(),
    )?);
    let spinner = bar(req.progress, "{spinner} {msg}");
    spinner.set_message(format!("loading {}", req.component.display()));
    spinner.enable_steady_tick(Duration::from_millis(100));
    let component = engine.load_file(&req.component)?;
    let shape = describe(&engine, &component).await?;
    spinner.finish_and_clear();
    for (port, _) in &req.inputs {
        port_index("input port", &shape.inputs, port)?;
    }
    for (port, _) in &req.outputs {
        port_index("output port", &shape.outputs, port)?;
    }
    for name in shape.inputs.iter().chain(&shape.outputs) {
        crate::storage::validate_name("port", name)?;
    }

    let db = db::open(&req.data)?;
    let (log, id): (Arc<dyn LogBackend>, String) = match &req.log {
        LogChoice::Embedded => (
            Arc::new(EmbeddedLog::open(db.clone())?),
            meta::new_pipeline_id(&req.data),
        ),
        #[cfg(feature = "kafka")]
        LogChoice::Kafka { config, .. } => {
            let config = config.clone();
            let log = tokio::task::spawn_blocking(move || crate::storage::KafkaLog::open(config))
                .await
                .map_err(|e| Error::Engine(format!("connecting to Kafka failed: {e}")))??;
            // Every host running this pipeline must seed its guests alike:
            // the identity is the pipeline's name, not the data directory.
            let id = log.config().pipeline.clone();
            (Arc::new(log), id)
        }
    };
    let mut inputs = Vec::with_capacity(shape.inputs.len());
    for name in &shape.inputs {
        let partitions = match &req.log {
            LogChoice::Embedded => req.workers,
            #[cfg(feature = "kafka")]
            LogChoice::Kafka {
                input_partitions, ..
            } => match log.partitions(name) {
                Ok(n) => n,
                Err(Error::Unknown { .. }) => input_partitions.unwrap_or(req.workers),
                Err(e) => return Err(e),
            },
        };
        inputs.push((name.clone(), partitions));
    }
    let wanted = PipelineMeta {
        id,
        component: component.hash.clone(),
        inputs,
        outputs: shape.outputs.clone(),
        workers: req.workers,
        log: req.log.describe(),
    };
    let meta = meta::ensure(&db, &wanted)?;
    for (name, partitions) in &meta.inputs {
        log.create_input(name, *partitions)?;
    }

    let mut ingested = Vec::new();
    for (port, file) in &req.inputs {
        let partitions = log.partitions(port)?;
        let progress = bar(
            req.progress,
            "appending {msg} {wide_bar} {bytes}/{total_bytes}",
        );
        progress.set_message(format!("{} → {port}", file.display()));
        let (log2, port2, file2, p2) = (log.clone(), port.clone(), file.clone(), progress.clone());
        let report = tokio::task::spawn_blocking(move || {
            ingest_file(&*log2, &port2, partitions, &file2, &p2)
        })
        .await
        .map_err(|e| Error::Engine(format!("ingest task failed: {e}")))??;
        progress.finish_and_clear();
        ingested.push(report);
    }

    let checkpoints: Arc<dyn crate::storage::CheckpointStore> =
        Arc::new(RocksCheckpointStore::open(db.clone()));
    let total: u64 = {
        let mut t = 0;
        for (name, partitions) in &meta.inputs {
            for p in 0..*partitions {
                t += log.watermarks(name, p)?.1;
            }
        }
        t
    };
    let progress = bar(req.progress, "steps {msg} {wide_bar} {pos}/{len} events");
    progress.set_length(total);
    let started = Instant::now();
    let mut options = req.options.clone();
    options.name = meta.id.clone();
    // A storage error mid-run is retried by recovering: the coordinator is
    // reopened from the log and the newest checkpoint, which never loses or
    // repeats an effect. Guest failures, limits and fencing are final.
    let mut retries = 0;
    let coordinator = loop {
        let attempt = async {
            let guarded = Arc::new(Guarded::new(
                log.clone(),
                checkpoints.clone(),
                meta.inputs.iter().map(|(n, _)| n.clone()).collect(),
                meta.outputs.clone(),
                meta.workers as usize,
            )?);
            let mut c = Coordinator::open(
                engine.clone(),
                &component,
                guarded,
                super::Layout {
                    inputs: meta.inputs.clone(),
                    outputs: meta.outputs.clone(),
                    workers: meta.workers,
                    snapshot_version: shape.snapshot_version,
                },
                options.clone(),
            )
            .await?;
            let consumed =
                |c: &Coordinator| c.frontiers().iter().flat_map(|f| f.values()).sum::<u64>();
            progress.set_position(consumed(&c));
            while c.step().await? {
                progress.set_position(consumed(&c));
                progress.set_message(c.next_step().to_string());
            }
            c.finish().await?;
            Ok::<_, Error>(c)
        };
        match attempt.await {
            Ok(c) => break c,
            Err(e) if e.is_transient() && retries < MAX_RETRIES => {
                retries += 1;
                tracing::warn!(
                    "recovering after a storage error (retry {retries} of {MAX_RETRIES}): {e}"
                );
                tokio::time::sleep(Duration::from_millis(100 << retries)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let run_time = started.elapsed();
    progress.finish_and_clear();

    let mut written = Vec::new();
    for (port, file) in &req.outputs {
        let log = log.clone();
        let (port, file) = (port.clone(), file.clone());
        let n = tokio::task::spawn_blocking(move || export_output(&*log, &port, &file))
            .await
            .map_err(|e| Error::Engine(format!("export task failed: {e}")))??;
        written.push(n);
    }
    Ok(RunReport {
        stats: coordinator.stats().clone(),
        ingested,
        run_time,
        total_steps: coordinator.next_step(),
        written,
        retries,
    })
}

/// Writes output log `output` as JSON lines to `file` (atomically: a
/// reader never sees a half-written file). Returns the events written.
pub fn export_output(log: &dyn LogBackend, output: &str, file: &Path) -> Result<u64> {
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(Error::io(dir))?;
    let mut out = std::io::BufWriter::new(tmp.as_file_mut());
    let mut line = Vec::new();
    let mut n = 0;
    log.scan_output(output, 0, &mut |entry| {
        for event in &entry.events {
            line.clear();
            write_output_line(&mut line, event);
            out.write_all(&line).map_err(Error::io(file))?;
            n += 1;
        }
        Ok(())
    })?;
    out.flush().map_err(Error::io(file))?;
    drop(out);
    tmp.persist(file).map_err(|e| Error::io(file)(e.error))?;
    Ok(n)
}
