//! A pipeline: a component and its storage, ready to open a coordinator
//! (which recovers) and to ingest files.

use crate::config::PipelineConfig;
use crate::error::{Error, Result};
use crate::storage::Storage;
use sluice_core::{CircuitPorts, PipelineShape};
use sluice_runtime::{Coordinator, LoadedComponent, PipelineOptions, SluiceEngine, UpgradedAt};
use sluice_storage::ingest::{IngestReport, ingest_file};
use std::path::Path;
use std::sync::Arc;

/// A component and its pipeline's storage.
pub struct Pipeline {
    engine: Arc<SluiceEngine>,
    component: LoadedComponent,
    ports: CircuitPorts,
    storage: Storage,
    options: PipelineOptions,
    /// The W to run with (see [`PipelineConfig::rescale_to`]).
    rescale_to: Option<u32>,
}

impl Pipeline {
    /// Learns the component's ports, then opens (creating on first use) the
    /// pipeline's storage as `config` says. The coordinator is opened by
    /// [`coordinator`](Self::coordinator).
    pub async fn open(
        engine: Arc<SluiceEngine>,
        component: LoadedComponent,
        config: PipelineConfig,
    ) -> Result<Pipeline> {
        let ports = engine.describe(&component).await?;
        Self::open_described(engine, component, ports, config).await
    }

    /// Like [`open`](Self::open), with the component's ports already known.
    pub async fn open_described(
        engine: Arc<SluiceEngine>,
        component: LoadedComponent,
        ports: CircuitPorts,
        config: PipelineConfig,
    ) -> Result<Pipeline> {
        for port in config.options.bad_records.keys() {
            ports.input(port)?;
        }
        let (hash, c, p) = (component.hash.clone(), config.clone(), ports.clone());
        let storage = tokio::task::spawn_blocking(move || Storage::open(&c, &p, &hash))
            .await
            .map_err(Error::task("opening the pipeline's storage"))??;
        let options = stored_options(config.options, &storage.meta);
        Ok(Self::assemble(
            engine,
            component,
            ports,
            storage,
            options,
            config.rescale_to,
        ))
    }

    /// A pipeline of its parts, its storage open.
    pub(crate) fn assemble(
        engine: Arc<SluiceEngine>,
        component: LoadedComponent,
        ports: CircuitPorts,
        storage: Storage,
        options: PipelineOptions,
        rescale_to: Option<u32>,
    ) -> Pipeline {
        Pipeline {
            engine,
            component,
            ports,
            storage,
            options,
            rescale_to,
        }
    }

    /// Opens a coordinator: starts the workers, takes over the pipeline (a
    /// new fencing epoch) and recovers (restore the newest checkpoint, replay
    /// the steps after it); then, if the pipeline runs with another W than
    /// it has (see [`set_workers`](Self::set_workers)), changes its layout.
    pub async fn coordinator(&self) -> Result<Coordinator> {
        self.coordinator_with(self.options.clone()).await
    }

    /// Like [`coordinator`](Self::coordinator), with other options (steps,
    /// checkpoints); the identity stays the pipeline's.
    pub async fn coordinator_with(&self, options: PipelineOptions) -> Result<Coordinator> {
        self.coordinator_on(options, Vec::new()).await
    }

    /// Like [`coordinator_with`](Self::coordinator_with), with workers on
    /// the other `hosts` too (see [`Coordinator::open_on`]).
    pub async fn coordinator_on(
        &self,
        options: PipelineOptions,
        hosts: Vec<Arc<sluice_runtime::RemoteHost>>,
    ) -> Result<Coordinator> {
        let mut c = self.coordinator_keeping_w(options, hosts).await?;
        self.rescale_if_asked(&mut c).await?;
        Ok(c)
    }

    /// Like [`coordinator_on`](Self::coordinator_on), without the change
    /// of W: the caller makes it ([`rescale_if_asked`](Self::rescale_if_asked)).
    pub(crate) async fn coordinator_keeping_w(
        &self,
        options: PipelineOptions,
        hosts: Vec<Arc<sluice_runtime::RemoteHost>>,
    ) -> Result<Coordinator> {
        // The identity and the upgrade record are the pipeline's, whatever
        // the caller's options say: a checkpoint of the component before
        // an upgrade restored plainly would keep state the upgrade drops.
        let options = PipelineOptions {
            name: self.options.name.clone(),
            upgraded_at: self.options.upgraded_at.clone(),
            retain_input: self.options.retain_input || options.retain_input,
            ..options
        };
        Ok(Coordinator::open_on(
            &self.engine,
            &self.component,
            self.storage.guarded(),
            options,
            hosts,
        )
        .await?)
    }

    /// Changes `c`'s W to the one the pipeline is to run with, if another
    /// (see [`set_workers`](Self::set_workers)); returns whether it did.
    pub(crate) async fn rescale_if_asked(&self, c: &mut Coordinator) -> Result<bool> {
        match self.rescale_to {
            Some(w) => Ok(c.rescale(w).await?.is_some()),
            None => Ok(false),
        }
    }

    /// Runs the pipeline with `workers` workers from the next coordinator
    /// on (a running coordinator changes with
    /// [`Coordinator::rescale`]).
    pub fn set_workers(&mut self, workers: u32) {
        self.rescale_to = Some(workers);
    }

    /// The W the pipeline is to run with, if set (see
    /// [`set_workers`](Self::set_workers)).
    pub(crate) fn rescale_to(&self) -> Option<u32> {
        self.rescale_to
    }

    /// Appends the JSON lines of `file` to input `port`, exactly once across
    /// runs and crashes; `progress` gets (bytes done, file size). A line
    /// that is not an event fails it, unless the port's bad-record policy
    /// is `dead-letter`: then the line is kept, marked, for the step that
    /// reads it to dead-letter.
    pub async fn ingest_file(
        &self,
        port: &str,
        file: &Path,
        mut progress: impl FnMut(u64, u64) + Send + 'static,
    ) -> Result<IngestReport> {
        let index = self.ports.input(port)?;
        let partitions = self.shape().inputs[index].partitions;
        let policy = self
            .options
            .bad_records
            .get(port)
            .copied()
            .unwrap_or_default();
        let (log, port, file) = (self.storage.log.clone(), port.to_owned(), file.to_owned());
        Ok(tokio::task::spawn_blocking(move || {
            ingest_file(&*log, &port, partitions, &file, policy, &mut progress)
        })
        .await
        .map_err(Error::task("ingesting a file"))??)
    }

    /// Reads the JSON lines of `file` in place as input `port`'s records
    /// from now on, instead of appending them to its log (see
    /// [`sluice_storage::in_place`]): registers the file, or the lines
    /// appended to it since it was; `progress` gets (bytes checked, file
    /// size). Refused on Kafka logs, for an input whose log holds events
    /// or that is read from another file, and for a file whose registered
    /// part changed or that holds a blank line.
    pub async fn read_in_place(
        &self,
        port: &str,
        file: &Path,
        mut progress: impl FnMut(u64, u64) + Send + 'static,
    ) -> Result<IngestReport> {
        self.ports.input(port)?;
        let Some(in_place) = self.storage.in_place().cloned() else {
            return Err(sluice_core::ConfigError::Invalid(format!(
                "--read-in-place reads files as the embedded log's inputs; on {} logs, \
                 files are appended",
                self.storage.meta.log
            ))
            .into());
        };
        let (port, file) = (port.to_owned(), file.to_owned());
        Ok(
            tokio::task::spawn_blocking(move || {
                in_place.read_in_place(&port, &file, &mut progress)
            })
            .await
            .map_err(Error::task("reading a file in place"))??,
        )
    }

    /// The engine the workers run on.
    pub fn engine(&self) -> &Arc<SluiceEngine> {
        &self.engine
    }

    /// The component.
    pub fn component(&self) -> &LoadedComponent {
        &self.component
    }

    /// The circuit's ports.
    pub fn ports(&self) -> &CircuitPorts {
        &self.ports
    }

    /// The pipeline's storage.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The pipeline's storage, to wrap its backends (fault injection).
    pub fn storage_mut(&mut self) -> &mut Storage {
        &mut self.storage
    }

    /// The pipeline's shape.
    pub fn shape(&self) -> &PipelineShape {
        self.storage.shape()
    }

    /// How the pipeline runs (its `name` is the stored identity).
    pub fn options(&self) -> &PipelineOptions {
        &self.options
    }
}

/// `options` with what the pipeline's metadata decides: its identity, its
/// last upgrade, its input retention (once asked for, kept).
pub(crate) fn stored_options(
    mut options: PipelineOptions,
    meta: &sluice_embedded::PipelineMeta,
) -> PipelineOptions {
    options.name = meta.id.clone();
    options.upgraded_at = upgraded_at(meta);
    options.retain_input |= meta.retain_input;
    options
}

/// Where the pipeline's component last changed, if at a checkpoint: the
/// coordinator takes that checkpoint (while it is the newest) through the
/// circuit's `upgrade`.
fn upgraded_at(meta: &sluice_embedded::PipelineMeta) -> Option<UpgradedAt> {
    let last = meta.upgrades.last().filter(|u| u.to == meta.component)?;
    Some(UpgradedAt {
        checkpoint: last.checkpoint?,
        start_empty: last.start_empty.clone(),
        rebuilt: last.rebuilt.clone(),
    })
}
