//! Opening a pipeline's storage: the data directory's RocksDB (lock,
//! metadata, checkpoints), its logs (embedded or Kafka), the stored shape
//! checked against what was asked, and the input logs created.

use crate::config::{LogConfig, PipelineConfig};
use sluice_core::{CircuitPorts, PipelineShape};
use sluice_embedded::meta::{self, LogMeta, Upgrade};
use sluice_embedded::{EmbeddedLog, PipelineMeta, RocksCheckpointStore, db};
use sluice_storage::in_place::InPlaceLog;
use sluice_storage::{CheckpointLedger, CheckpointStore, Guarded, LogBackend, Result};
use std::sync::Arc;

/// What a pipeline's data-directory database holds in memory at most, in
/// bytes (its memtables, those being flushed, and its block cache): the
/// host memory a server promises every running pipeline besides its
/// instances.
pub const HOST_MEMORY_BOUND: u64 = db::MEMORY_BOUND;

/// A pipeline's open storage. While it exists, the data directory is
/// locked: no other process can open the pipeline.
#[derive(Clone)]
pub struct Storage {
    /// The pipeline's logs (behind any wrappers, e.g. fault injection).
    pub log: Arc<dyn LogBackend>,
    /// The pipeline's checkpoints.
    pub checkpoints: Arc<dyn CheckpointStore>,
    /// Its identity, component and shape, as stored.
    pub meta: PipelineMeta,
    /// The embedded log's inputs read in place from files, beneath `log`'s
    /// wrappers (`None` on Kafka, which reads none in place).
    in_place: Option<Arc<InPlaceLog>>,
    /// The database: keeps the directory's lock for as long as the storage
    /// lives.
    _db: Arc<db::PipelineDb>,
}

impl Storage {
    /// Opens (creating on first use) the storage of a pipeline of
    /// `config.workers` workers running a circuit with `ports`, whose
    /// component has SHA-256 `component`. Blocks: call it off the async
    /// workers. Fails if the data directory holds a pipeline of another
    /// component or log, or another process holds it. (Another W is a
    /// layout change, which the coordinator makes.)
    pub fn open(config: &PipelineConfig, ports: &CircuitPorts, component: &str) -> Result<Storage> {
        let database = db::open(&config.data)?;
        // Where a shared store's checkpoint commits are recorded: the Kafka
        // log's step topic, fenced like the steps (an embedded log's data
        // directory is this host's alone: its lock is the fence).
        #[cfg_attr(not(feature = "kafka"), allow(unused_mut))]
        let mut ledger: Option<Arc<dyn CheckpointLedger>> = None;
        let (log, id, log_meta): (Arc<dyn LogBackend>, String, LogMeta) = match &config.log {
            LogConfig::Embedded { sync_commits } => {
                let log = if *sync_commits {
                    EmbeddedLog::open(database.clone())?
                } else {
                    EmbeddedLog::open_unsynced_for_benchmarks(database.clone())?
                };
                let id = format!(
                    "{}{}",
                    config.id_prefix,
                    meta::new_pipeline_id(&config.data)
                );
                (Arc::new(log), id, LogMeta::Embedded)
            }
            #[cfg(feature = "kafka")]
            LogConfig::Kafka { config: kafka, .. } => {
                let mut kafka = kafka.clone();
                kafka.inputs = ports.inputs.clone();
                let log = Arc::new(sluice_kafka::KafkaLog::open(kafka.clone())?);
                ledger = Some(log.clone());
                // Every host running this pipeline must seed its guests
                // alike: the identity is the pipeline's Kafka name.
                let log_meta = LogMeta::Kafka {
                    pipeline: kafka.pipeline.clone(),
                    topics: kafka
                        .topics
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                };
                (log, kafka.pipeline.clone(), log_meta)
            }
        };
        let shape = PipelineShape::new(ports, config.workers, |name| {
            input_partitions(&*log, config, name)
        })?;
        let mut wanted = PipelineMeta {
            id,
            component: component.to_owned(),
            shape,
            log: log_meta,
            operators: ports.operators.clone(),
            upgrades: Vec::new(),
            retain_input: config.options.retain_input,
        };
        let shared = meta::decode_upgrades(log.upgrades()?.as_deref())?;
        follow_shared_upgrades(&database, shared, &mut wanted)?;
        let meta = meta::ensure(&database, &wanted)?;
        for input in &meta.shape.inputs {
            log.create_input(&input.name, input.partitions)?;
        }
        let in_place = in_place_log(&log, &meta)?;
        let log = in_place.clone().map_or(log, |l| l as Arc<dyn LogBackend>);
        let checkpoints = open_checkpoints(config, &database, ledger)?;
        Ok(Storage {
            log,
            checkpoints,
            meta,
            in_place,
            _db: database,
        })
    }

    /// Opens the storage of the pipeline in `config.data` for a change of
    /// its component to `component` (SHA-256 `hash`, with `ports`): the
    /// returned storage's metadata names the new component and shape and
    /// records the change (an [`Upgrade`] at the checkpoint of its last
    /// step), but is not stored — [`store_meta`](Self::store_meta) commits
    /// the change (and, on Kafka, [`record_upgrades`](Self::record_upgrades)
    /// before it: on Kafka the log is fenced here, before its last step is
    /// read, so a host still running the pipeline commits no more). Refused
    /// (nothing changed) when there is no pipeline there, it already runs
    /// `component` (also where another host's upgrade recorded it, which
    /// this directory then follows), `config` names other logs than the
    /// pipeline's, its checkpoints are in a shared store that `config` does
    /// not name, `rebuild` is asked on Kafka, the new component's inputs
    /// differ, or its newest checkpoint is not of its
    /// last committed step. Blocks.
    pub(crate) fn for_upgrade(
        config: &PipelineConfig,
        ports: &CircuitPorts,
        hash: &str,
        start_empty: &[String],
        rebuild: bool,
    ) -> crate::Result<(Storage, Upgrade)> {
        use crate::Error::UpgradeRefused as Refused;
        if !config.data.join("db").is_dir() {
            return Err(Refused(format!(
                "{} holds no pipeline",
                config.data.display()
            )));
        }
        let database = db::open(&config.data)?;
        let stored = meta::load(&database)?
            .ok_or_else(|| Refused(format!("{} holds no pipeline", config.data.display())))?;
        #[cfg_attr(not(feature = "kafka"), allow(unused_mut))]
        let mut ledger: Option<Arc<dyn CheckpointLedger>> = None;
        let log: Arc<dyn LogBackend> = match (&stored.log, &config.log) {
            (LogMeta::Embedded, LogConfig::Embedded { sync_commits }) => {
                Arc::new(match sync_commits {
                    true => EmbeddedLog::open(database.clone())?,
                    false => EmbeddedLog::open_unsynced_for_benchmarks(database.clone())?,
                })
            }
            #[cfg(feature = "kafka")]
            (LogMeta::Kafka { .. }, LogConfig::Kafka { config: kafka }) => {
                if rebuild {
                    return Err(Refused(
                        "--rebuild on Kafka logs is not built: a rebuild needs all of the \
                         pipeline's input and output logs, which Kafka's retention trims"
                            .into(),
                    ));
                }
                let mut kafka = kafka.clone();
                kafka.inputs = stored.shape.inputs.iter().map(|i| i.name.clone()).collect();
                let log = Arc::new(sluice_kafka::KafkaLog::open(kafka)?);
                // Fenced before the last step is read: a host still running
                // the pipeline commits no step after it (its next commit
                // fails as fenced).
                log.fence()?;
                ledger = Some(log.clone());
                log
            }
            _ => {
                return Err(Refused(format!(
                    "the pipeline's logs are {}: upgrade it on the logs it runs on{}",
                    stored.log,
                    match stored.log {
                        LogMeta::Kafka { .. } => " (--brokers)",
                        LogMeta::Embedded => "",
                    }
                )));
            }
        };
        // A change another host made (recorded in the shared log) that
        // this data directory does not know yet: followed first.
        let shared = meta::decode_upgrades(log.upgrades()?.as_deref())?;
        if shared.len() > stored.upgrades.len()
            && let Some(last) = shared.last()
        {
            if last.to != hash {
                return Err(Refused(format!(
                    "the pipeline was upgraded to component {} (its log records it), which this \
                     data directory has not opened yet: run that component here first",
                    meta::short_hash(&last.to)
                )));
            }
            let mut followed = stored.clone();
            followed.component = hash.to_owned();
            followed.operators = ports.operators.clone();
            followed.shape.outputs = ports.outputs.clone();
            followed.shape.snapshot_version = ports.snapshot_version;
            follow_shared_upgrades(&database, shared, &mut followed)?;
        }
        let stored = meta::load(&database)?.unwrap_or(stored);
        // Checkpoints in a shared store: the newest must be read there
        // (the data directory's RocksDB holds none).
        if segment_cache(&config.data).exists() && config.checkpoint_store.is_none() {
            return Err(Refused(
                "the pipeline keeps its checkpoints in an object store: upgrade it with the \
                 --store it runs with"
                    .into(),
            ));
        }
        if stored.component == hash {
            return Err(Refused(format!(
                "the pipeline already runs component {}",
                meta::short_hash(hash)
            )));
        }
        ports.validate()?;
        let names = |inputs: &mut dyn Iterator<Item = &str>| inputs.collect::<Vec<_>>().join(", ");
        let (old_inputs, new_inputs) = (
            names(&mut stored.shape.inputs.iter().map(|i| i.name.as_str())),
            names(&mut ports.inputs.iter().map(String::as_str)),
        );
        if old_inputs != new_inputs {
            return Err(Refused(format!(
                "the new component's inputs ({new_inputs}) are not the pipeline's ({old_inputs}): \
                 an upgrade keeps the inputs, their order and their logs"
            )));
        }
        let checkpoints = open_checkpoints(config, &database, ledger)?;
        let last = log.last_step()?;
        let newest = checkpoints.latest_meta()?.map(|m| m.step);
        // A second change at the same checkpoint would hand the newest
        // version the state of the one before the last, not the last's
        // (which ran no step and wrote no checkpoint).
        if let Some(previous) = stored.upgrades.last()
            && previous.checkpoint.is_some()
            && previous.checkpoint == newest
        {
            return Err(Refused(format!(
                "the pipeline has run no step since its last upgrade (at the checkpoint of step \
                 {}): run it until it checkpoints under its component, then upgrade again",
                newest.unwrap_or_default()
            )));
        }
        if last.is_some() && newest != last {
            let newest = newest.map_or("none".to_owned(), |s| format!("of step {s}"));
            return Err(Refused(format!(
                "the pipeline's last step is {}, its newest checkpoint {newest}: an upgrade is \
                 made at a checkpoint of the last step; run the pipeline with its component \
                 until it stops (it checkpoints as it finishes), then upgrade",
                last.unwrap_or_default()
            )));
        }
        let rebuilt = match rebuild {
            true => Some(rebuildable(&*log, &stored, ports, start_empty)?),
            false => None,
        };
        let upgrade = Upgrade {
            from: stored.component.clone(),
            to: hash.to_owned(),
            checkpoint: last,
            start_empty: start_empty.to_vec(),
            outputs_before: stored.shape.outputs.clone(),
            rebuilt,
        };
        let mut meta = stored.clone();
        meta.upgrades.push(upgrade.clone());
        meta.component = hash.to_owned();
        meta.operators = ports.operators.clone();
        meta.shape = PipelineShape {
            outputs: ports.outputs.clone(),
            snapshot_version: ports.snapshot_version,
            ..stored.shape
        };
        let in_place = in_place_log(&log, &meta)?;
        let log = in_place.clone().map_or(log, |l| l as Arc<dyn LogBackend>);
        let storage = Storage {
            log,
            checkpoints,
            meta,
            in_place,
            _db: database,
        };
        Ok((storage, upgrade))
    }

    /// Stores [`meta`](Self::meta) (durably): the commit point of an
    /// upgrade on the embedded log. Blocks.
    pub(crate) fn store_meta(&self) -> Result<()> {
        meta::store(&self._db, &self.meta)
    }

    /// Records the metadata's changes of component in the pipeline's
    /// shared log, where it keeps them (Kafka: the commit point of an
    /// upgrade there, fenced like a step; every host opening the pipeline
    /// follows it). `false`: the log keeps none (the embedded log). Blocks.
    pub(crate) fn record_upgrades(&self) -> Result<bool> {
        self.log
            .record_upgrades(&meta::encode_upgrades(&self.meta.upgrades)?)
    }

    /// The pipeline's shape.
    pub fn shape(&self) -> &PipelineShape {
        &self.meta.shape
    }

    /// Where the pipeline's inputs read in place are registered: `None` on
    /// Kafka logs, which read no file in place.
    pub fn in_place(&self) -> Option<&Arc<InPlaceLog>> {
        self.in_place.as_ref()
    }

    /// The logs and checkpoints behind the host's invariant checks: what a
    /// coordinator commits to. Its every take-over fails where the log
    /// records a change of component this storage's metadata lacks (an
    /// upgrade made elsewhere after this host opened the pipeline).
    pub fn guarded(&self) -> Arc<Guarded> {
        let known = self.meta.upgrades.clone();
        Arc::new(
            Guarded::new(
                self.log.clone(),
                self.checkpoints.clone(),
                self.meta.shape.clone(),
            )
            .checking_upgrades(move |recorded| {
                // The changes recorded must be this host's, or the first of
                // them (an upgrade here records its own after it fenced).
                let recorded = meta::decode_upgrades(recorded.as_deref())?;
                match recorded.last() {
                    Some(last) if !known.starts_with(&recorded) => {
                        Err(sluice_core::ConfigError::Invalid(format!(
                            "the pipeline was upgraded to component {} since this host opened \
                             it (its log records the change): open it again with that component",
                            meta::short_hash(&last.to)
                        ))
                        .into())
                    }
                    _ => Ok(()),
                }
            }),
        )
    }

    /// Wraps the log and the checkpoint store, e.g. to inject faults.
    pub fn wrap(
        &mut self,
        f: impl FnOnce(
            Arc<dyn LogBackend>,
            Arc<dyn CheckpointStore>,
        ) -> (Arc<dyn LogBackend>, Arc<dyn CheckpointStore>),
    ) {
        let (log, checkpoints) = f(self.log.clone(), self.checkpoints.clone());
        self.log = log;
        self.checkpoints = checkpoints;
    }

    /// Input events appended but not yet consumed by the given frontiers.
    pub fn lag(&self, frontiers: &[sluice_core::Frontier]) -> u64 {
        let mut lag = 0;
        for frontier in frontiers {
            for (id, offset) in frontier {
                if let Some(name) = self.meta.shape.input_name(id.input)
                    && let Ok((_, high)) = self.log.watermarks(name, id.partition)
                {
                    lag += high.saturating_sub(*offset);
                }
            }
        }
        lag
    }

    /// The number of input events appended so far, over all partitions.
    pub fn appended(&self) -> Result<u64> {
        let mut total = 0;
        for (id, name) in self.meta.shape.partitions() {
            total += self.log.watermarks(name, id.partition)?.1;
        }
        Ok(total)
    }
}

/// The embedded `log` of the pipeline of `meta` wrapped to read its inputs
/// read in place from their files (checked and indexed now); `None` on
/// Kafka.
fn in_place_log(log: &Arc<dyn LogBackend>, meta: &PipelineMeta) -> Result<Option<Arc<InPlaceLog>>> {
    if !matches!(meta.log, LogMeta::Embedded) {
        return Ok(None);
    }
    let inputs: Vec<(String, u32)> = (meta.shape.inputs.iter())
        .map(|i| (i.name.clone(), i.partitions))
        .collect();
    Ok(Some(Arc::new(InPlaceLog::open(log.clone(), &inputs)?)))
}

/// The component (SHA-256) the pipeline in data directory `data` runs, as
/// its metadata says; `None` when there is no pipeline there. Blocks; fails
/// if another process holds the directory.
pub fn stored_component(data: &std::path::Path) -> Result<Option<String>> {
    if !data.join("db").is_dir() {
        return Ok(None);
    }
    let database = db::open(data)?;
    Ok(meta::load(&database)?.map(|m| m.component))
}

/// Brings a data directory up to the changes of component its pipeline's
/// shared log records (`shared`; none for the embedded log): a host that
/// did not make an upgrade — another machine, a fresh data directory, or
/// this one's upgrade stopped between the shared record and its own
/// metadata — opens the pipeline as the upgrade left it, with the new
/// component only (another is refused as a changed component), and its
/// recovery takes the checkpoint of the change through the new version's
/// `upgrade`. `wanted`: the metadata of the component being opened, which
/// a new directory stores.
fn follow_shared_upgrades(
    database: &Arc<db::PipelineDb>,
    shared: Vec<Upgrade>,
    wanted: &mut PipelineMeta,
) -> Result<()> {
    let Some(last) = shared.last() else {
        return Ok(());
    };
    let stored = meta::load(database)?;
    if stored
        .as_ref()
        .is_some_and(|s| s.upgrades.len() >= shared.len())
    {
        return Ok(());
    }
    if wanted.component != last.to {
        return Err(sluice_core::ConfigError::ComponentChanged {
            stored: meta::short_hash(&last.to).into(),
            wanted: meta::short_hash(&wanted.component).into(),
        }
        .into());
    }
    wanted.upgrades = shared;
    if let Some(mut stored) = stored {
        stored.upgrades = wanted.upgrades.clone();
        stored.component = wanted.component.clone();
        stored.operators = wanted.operators.clone();
        stored.shape.outputs = wanted.shape.outputs.clone();
        stored.shape.snapshot_version = wanted.shape.snapshot_version;
        meta::store(database, &stored)?;
    }
    Ok(())
}

/// The pipeline's checkpoint store: the data directory's RocksDB, or the
/// shared store `config.checkpoint_store` names with this host's copy of
/// what it wrote beside its RocksDB (a surviving host restores from it),
/// its commits recorded in `ledger` (where one is given).
fn open_checkpoints(
    config: &PipelineConfig,
    database: &Arc<db::PipelineDb>,
    ledger: Option<Arc<dyn CheckpointLedger>>,
) -> Result<Arc<dyn CheckpointStore>> {
    Ok(match &config.checkpoint_store {
        None => Arc::new(RocksCheckpointStore::open(database.clone())),
        Some(url) => {
            let store = sluice_objstore::ObjectCheckpointStore::open(url)?
                .with_cache(segment_cache(&config.data))?;
            Arc::new(match ledger {
                Some(ledger) => store.with_ledger(ledger),
                None => store,
            })
        }
    })
}

/// The component (SHA-256) the pipeline in data directory `data` runs on
/// logs `log`: where the logs record changes of component (Kafka), the
/// last one's, which a data directory behind it follows when it opens;
/// else as its metadata says (see [`stored_component`]). Blocks; on Kafka,
/// initialises the pipeline's ingest producer (call it with the pipeline
/// unloaded).
pub fn upgraded_component(data: &std::path::Path, log: &LogConfig) -> Result<Option<String>> {
    match recorded_upgrade(log)? {
        Some(to) => Ok(Some(to)),
        None => stored_component(data),
    }
}

/// The component the last change of component recorded on logs `log`
/// moved the pipeline to: `None` if none is recorded, or the logs record
/// none (embedded: each data directory's metadata does). Blocks; on Kafka,
/// initialises the pipeline's ingest producer (as
/// [`upgraded_component`]).
#[cfg_attr(not(feature = "kafka"), allow(unused_variables))]
pub fn recorded_upgrade(log: &LogConfig) -> Result<Option<String>> {
    #[cfg(feature = "kafka")]
    if let LogConfig::Kafka { config } = log {
        let shared = sluice_kafka::KafkaLog::open(config.clone())?.upgrades()?;
        return Ok(meta::decode_upgrades(shared.as_deref())?
            .pop()
            .map(|last| last.to));
    }
    Ok(None)
}

/// Where a host keeps its copy of the checkpoint segments it wrote to a
/// shared store: beside the pipeline's RocksDB in its data directory.
pub fn segment_cache(data: &std::path::Path) -> std::path::PathBuf {
    data.join("segments")
}

/// The partitions input `name` of a new pipeline gets: what the
/// configuration asks (see [`PipelineConfig::input_partitions`]); for Kafka
/// an existing topic keeps its own. (A broker that cannot answer shows its
/// error when the input is created.)
#[cfg_attr(not(feature = "kafka"), allow(unused_variables))]
fn input_partitions(log: &dyn LogBackend, config: &PipelineConfig, name: &str) -> u32 {
    match &config.log {
        LogConfig::Embedded { .. } => config.input_partitions(),
        #[cfg(feature = "kafka")]
        LogConfig::Kafka { .. } => log.partitions(name).unwrap_or(config.input_partitions()),
    }
}

/// The operators an upgrade with `--rebuild` rebuilds from the pipeline's
/// input — every stateful operator of the new version (`ports`): the
/// switch moves each output log to the new version's view, so every
/// operator must hold the state that view comes from, not a carried one
/// (a kept count behind a changed `map` holds other keys) — when it can:
/// nothing is to start empty, every input partition still holds its first
/// record, and every output port of both versions its first step (the
/// switch writes the difference between the rebuilt output and the log's).
fn rebuildable(
    log: &dyn LogBackend,
    stored: &PipelineMeta,
    ports: &CircuitPorts,
    start_empty: &[String],
) -> crate::Result<Vec<String>> {
    use crate::Error::UpgradeRefused as Refused;
    if !start_empty.is_empty() {
        return Err(Refused(
            "--start-empty and --rebuild: a rebuild gives every operator the state the new \
             version computes from all of the input, none starts empty"
                .into(),
        ));
    }
    for input in &stored.shape.inputs {
        for p in 0..input.partitions {
            let (low, _) = log.watermarks(&input.name, p)?;
            if low > 0 {
                return Err(Refused(format!(
                    "input `{}` partition {p} was trimmed up to offset {low}: a rebuild needs \
                     all of the pipeline's input (run it with --retain-input from its start)",
                    input.name
                )));
            }
        }
    }
    for output in stored
        .shape
        .outputs
        .iter()
        .filter(|o| ports.outputs.contains(o))
    {
        let low = log.output_low(output)?;
        if low > 0 {
            return Err(Refused(format!(
                "output `{output}` was trimmed below step {low}: a rebuild writes the \
                 difference between the new version's output and all of the log's"
            )));
        }
    }
    Ok(ports.operators.iter().map(|o| o.id.clone()).collect())
}
