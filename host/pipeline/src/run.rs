//! `sluice run` as a library call: open (or create) a pipeline, append the
//! input files exactly once (or register them to be read in place),
//! recover, run until all input is consumed and committed, checkpoint, and
//! write the output logs as JSON lines. The steps run while the files are
//! appended (or registered), each held back until it can take the batches
//! it would take with the files appended first.

use crate::config::PipelineConfig;
use crate::error::{Error, Result};
use crate::pipeline::Pipeline;
use crate::supervise::RecoveryPolicy;
use futures_util::future::join_all;
use sluice_core::PartitionId;
use sluice_core::wire::write_output_line;
use sluice_runtime::{Limits, SluiceEngine, Stats};
use sluice_storage::LogBackend;
use sluice_storage::ingest::IngestReport;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The component file.
    pub component: PathBuf,
    /// The pipeline: data directory, W, logs, options.
    pub pipeline: PipelineConfig,
    /// `(input port, JSON-lines file)` to append.
    pub inputs: Vec<(String, PathBuf)>,
    /// Read the input files where they are instead of appending them
    /// (`--read-in-place`, embedded log only; one file per port; see
    /// [`sluice_storage::in_place`]).
    pub read_in_place: bool,
    /// `(output port, file)` to write the output log to.
    pub outputs: Vec<(String, PathBuf)>,
    /// Per-instance limits.
    pub limits: Limits,
}

/// Progress of a run, for a caller to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEvent {
    /// Loading (compiling, or reading from the cache) the component.
    Loading(PathBuf),
    /// Appending a file (or registering it to be read in place): bytes
    /// done of its size.
    Ingest {
        /// The input port.
        port: String,
        /// The file.
        file: PathBuf,
        /// Bytes appended (or registered) so far (durable once the file is
        /// in).
        done: u64,
        /// The file's size.
        size: u64,
        /// Whether the file is read in place (registered, not copied).
        in_place: bool,
    },
    /// Running steps: input events consumed of those appended.
    Steps {
        /// Steps committed in total.
        steps: u64,
        /// Input offsets consumed.
        consumed: u64,
        /// Input offsets appended.
        total: u64,
    },
    /// Writing the output files.
    Exporting,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The coordinator's figures.
    pub stats: Stats,
    /// Per input file, what was appended.
    pub ingested: Vec<IngestReport>,
    /// Time spent running steps: from the coordinator's opening (the
    /// files are appended meanwhile) to the last step's commit.
    pub run_time: Duration,
    /// Steps committed in total, across runs.
    pub total_steps: u64,
    /// Output events written per output file.
    pub written: Vec<u64>,
    /// Recoveries after transient errors.
    pub retries: u32,
}

impl RunReport {
    /// Input events consumed per second of step time.
    pub fn events_per_second(&self) -> f64 {
        self.stats.events_in as f64 / self.run_time.as_secs_f64().max(1e-9)
    }
}

/// Runs a pipeline to completion; `progress` hears how it goes.
pub async fn run(
    req: RunRequest,
    progress: Arc<dyn Fn(RunEvent) + Send + Sync>,
) -> Result<RunReport> {
    let engine = Arc::new(SluiceEngine::new(
        req.limits,
        SluiceEngine::default_cache_dir(),
    )?);
    progress(RunEvent::Loading(req.component.clone()));
    let component = engine.load_file(&req.component)?;
    let ports = engine.describe(&component).await?;
    for (port, _) in &req.inputs {
        ports.input(port)?;
    }
    for (port, _) in &req.outputs {
        // An output port, or an input's dead-letter log.
        match sluice_core::dead_letter_input(port) {
            Some(input) => ports.input(input).map(|_| ())?,
            None => ports.output(port).map(|_| ())?,
        }
    }
    if req.read_in_place {
        for (i, (port, _)) in req.inputs.iter().enumerate() {
            if req.inputs[..i].iter().any(|(p, _)| p == port) {
                return Err(sluice_core::ConfigError::Invalid(format!(
                    "--read-in-place reads one file per input, and input `{port}` is given two"
                ))
                .into());
            }
        }
    }
    let pipeline = Pipeline::open_described(engine, component, ports, req.pipeline.clone()).await?;

    // The files are appended while the steps run, so that the append and
    // the guests share the cores. A step waits (the gate) until every
    // partition of an input still being appended holds a whole batch past
    // its frontier: it then divides as it would with the files appended
    // first — the same steps, the same output, whatever the timing.
    let (appending, watch) = tokio::sync::watch::channel(Appending {
        ports: req.inputs.iter().map(|(port, _)| port.clone()).collect(),
        failed: false,
    });
    let storage = pipeline.storage().clone();
    let appended = tokio::task::spawn_blocking(move || storage.appended())
        .await
        .map_err(Error::task("reading the input's size"))??;
    // Input events appended so far (kept by the gate), for progress.
    let total = Arc::new(AtomicU64::new(appended));
    // Each port's files are appended in order, the ports side by side: one
    // after the other, a step would wait for a large file of one port
    // before a small one of the next gave it a whole batch.
    let mut ports: Vec<&str> = Vec::new();
    for (port, _) in &req.inputs {
        if !ports.contains(&port.as_str()) {
            ports.push(port);
        }
    }
    // A port whose input is read in place from the file given reads it in
    // place again, with --read-in-place or not (its log takes no appends).
    let in_place_ports: Vec<&str> = (ports.iter().copied())
        .filter(|port| {
            req.read_in_place
                || req.inputs.iter().any(|(p, file)| {
                    p == port
                        && pipeline.storage().in_place().is_some_and(|log| {
                            log.file_of(port).is_some_and(|registered| {
                                file.canonicalize().is_ok_and(|f| f == registered)
                            })
                        })
                })
        })
        .collect();
    let per_port = ports.into_iter().map(|port| {
        let read_in_place = in_place_ports.contains(&port);
        let (progress, appending, pipeline) = (&progress, &appending, &pipeline);
        let files = req
            .inputs
            .iter()
            .enumerate()
            .filter(move |(_, (p, _))| p == port);
        async move {
            let mut reports = Vec::new();
            for (i, (_, file)) in files {
                let (p, port2, file2) = (progress.clone(), port.to_owned(), file.clone());
                let tell = appending.clone();
                let tell_progress = move |done, size| {
                    p(RunEvent::Ingest {
                        port: port2.clone(),
                        file: file2.clone(),
                        done,
                        size,
                        in_place: read_in_place,
                    });
                    // A chunk was appended: wake the gate.
                    tell.send_modify(|_| {});
                };
                let report = match read_in_place {
                    true => pipeline.read_in_place(port, file, tell_progress).await,
                    false => pipeline.ingest_file(port, file, tell_progress).await,
                };
                match report {
                    Ok(report) => reports.push((i, report)),
                    Err(e) => {
                        appending.send_modify(|a| a.failed = true);
                        return Err(e);
                    }
                }
            }
            // This port is whole.
            appending.send_modify(|a| a.ports.retain(|p| p != port));
            Ok::<_, Error>(reports)
        }
    });
    let ingest = async {
        // Every port's append ends before the run does, one that failed
        // or not (an append cannot be stopped between its chunks, and none
        // is left writing behind the run's error); an error is the run's
        // (the first port's, in the order given).
        let mut ingested: Vec<(usize, IngestReport)> = Vec::new();
        for reports in join_all(per_port).await {
            ingested.extend(reports?);
        }
        // Reported in the order the files were given.
        ingested.sort_by_key(|(i, _)| *i);
        Ok::<_, Error>(ingested.into_iter().map(|(_, r)| r).collect::<Vec<_>>())
    };
    let started = Instant::now();
    let policy = RecoveryPolicy::default();
    let steps = pipeline.run_until_idle_gated(
        &policy,
        |c| {
            progress(RunEvent::Steps {
                steps: c.next_step(),
                consumed: c.frontiers().iter().flat_map(|f| f.values()).sum(),
                total: total.load(Ordering::Relaxed),
            })
        },
        async |c| whole_batches(&pipeline, c, watch.clone(), &total).await,
    );
    let (ingested, idle) = tokio::join!(ingest, steps);
    // An append that failed stopped the steps: its error is the one to tell.
    let ingested = ingested?;
    let idle = idle?;
    let run_time = started.elapsed();

    progress(RunEvent::Exporting);
    let mut written = Vec::new();
    for (port, file) in &req.outputs {
        let (log, port, file) = (pipeline.storage().log.clone(), port.clone(), file.clone());
        let n = tokio::task::spawn_blocking(move || export_output(&*log, &port, &file))
            .await
            .map_err(Error::task("exporting output"))??;
        written.push(n);
    }
    let c = &idle.coordinator;
    Ok(RunReport {
        stats: c.stats().clone(),
        ingested,
        run_time,
        total_steps: c.next_step(),
        written,
        retries: idle.recoveries,
    })
}

/// What the appends of a run have left to do.
#[derive(Debug, Clone)]
struct Appending {
    /// The input ports a file is still being appended to.
    ports: Vec<String>,
    /// An append failed: no step is to start.
    failed: bool,
}

/// Waits until the next step may be divided: every partition of an input
/// still being appended holds at least a whole batch (`max_batch` events)
/// past `c`'s frontier, or nothing is being appended. Keeps `total` (input
/// events appended, for progress) up to date.
async fn whole_batches(
    pipeline: &Pipeline,
    c: &sluice_runtime::Coordinator,
    mut appending: tokio::sync::watch::Receiver<Appending>,
    total: &AtomicU64,
) -> Result<()> {
    let max = pipeline.options().max_batch.max(1);
    let mut at: BTreeMap<PartitionId, u64> = BTreeMap::new();
    for frontier in c.frontiers() {
        at.extend(frontier.iter().map(|(id, offset)| (*id, *offset)));
    }
    loop {
        let state = appending.borrow_and_update().clone();
        if state.failed {
            return Err(Error::Stopped("appending an input file failed".into()));
        }
        let (storage, shape, at2) = (
            pipeline.storage().clone(),
            pipeline.shape().clone(),
            at.clone(),
        );
        let ready = tokio::task::spawn_blocking(move || {
            let mut appended = 0;
            let mut ready = true;
            for (id, name) in shape.partitions() {
                let high = storage.log.watermarks(name, id.partition)?.1;
                appended += high;
                let from = at2.get(&id).copied().unwrap_or(0);
                if state.ports.iter().any(|p| p == name) && high < from + max {
                    ready = false;
                }
            }
            Ok::<_, Error>((appended, ready))
        })
        .await
        .map_err(Error::task("reading the input's size"))??;
        total.store(ready.0, Ordering::Relaxed);
        if ready.1 {
            return Ok(());
        }
        if appending.changed().await.is_err() {
            // The appends are over (the sender is gone): look once more.
            return Ok(());
        }
    }
}

/// Writes output log `output` as JSON lines to `file` (atomically: a
/// reader never sees a half-written file). Returns the events written.
pub fn export_output(log: &dyn LogBackend, output: &str, file: &Path) -> Result<u64> {
    let io = |source| Error::Io {
        path: file.to_owned(),
        source,
    };
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    let mut out = std::io::BufWriter::new(tmp.as_file_mut());
    let mut line = Vec::new();
    let mut n = 0;
    let mut failed = None;
    log.scan_output(output, 0, &mut |entry| {
        for event in &entry.events {
            line.clear();
            write_output_line(&mut line, event);
            if let Err(e) = out.write_all(&line) {
                failed.get_or_insert(e);
            }
            n += 1;
        }
        Ok(std::ops::ControlFlow::Continue(()))
    })?;
    if let Some(e) = failed {
        return Err(io(e));
    }
    out.flush().map_err(io)?;
    drop(out);
    tmp.persist(file).map_err(|e| io(e.error))?;
    Ok(n)
}
