//! The server's domain layer: who the caller is, tenants, components and
//! pipelines, with the rules that bind them — **tenant limits** (quotas on
//! pipelines, workers, component size; a pipeline's own limits within its
//! tenant's), the pipeline lifecycle, and where tenant files live. Routes
//! call it; it knows nothing of HTTP and returns [`ServiceError`], which the
//! HTTP edge maps to statuses and codes.

use crate::registry::{self, PipelineEntry, Registry, Tenant};
use crate::runner::{KafkaSettings, PipelineHandle};
use crate::types::{
    ComponentInfo, CreateTenant, Desired, PartitionRange, PipelineSpec, PipelineStatus,
    ProducerInfo, PushAck, TenantCreated, TenantLimits,
};
use sha2::Digest;
use sluice_core::{CircuitPorts, Event, InvalidName, validate_name};
use sluice_runtime::{Limits, LoadedComponent, SluiceEngine};
use sluice_storage::{AppendBatch, IngestMark, ProducerSeq};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the domain layer refuses, or fails at.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// No token, or one nobody holds.
    #[error("missing or unknown token: send `Authorization: Bearer <token>`")]
    Unauthorized,
    /// A valid token without the right to this.
    #[error("{0}")]
    Forbidden(&'static str),
    /// A resource the caller cannot see (missing or another tenant's: the
    /// answer is the same).
    #[error("no {kind} named {name:?}")]
    NotFound {
        /// "pipeline", "component", …
        kind: &'static str,
        /// The name asked for.
        name: String,
    },
    /// A resource that exists already.
    #[error("{kind} {name:?} exists")]
    Exists {
        /// "tenant", "pipeline".
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// A name that breaks the naming rule.
    #[error(transparent)]
    InvalidName(#[from] InvalidName),
    /// A request the caller must change, with a stable code.
    #[error("{message}")]
    Invalid {
        /// Stable, machine-readable.
        code: &'static str,
        /// For people.
        message: String,
    },
    /// A tenant limit refused the request.
    #[error("limit `{limit}` is {value}; the request asked for {attempted}")]
    LimitExceeded {
        /// The limit's name.
        limit: &'static str,
        /// Its value.
        value: u64,
        /// What was asked for.
        attempted: u64,
    },
    /// An upload larger than the tenant may store.
    #[error("limit `{limit}` is {value}; the request asked for {attempted}")]
    TooLarge {
        /// The limit's name.
        limit: &'static str,
        /// Its value.
        value: u64,
        /// The body's size.
        attempted: u64,
    },
    /// An uploaded component the host cannot run.
    #[error("{0}")]
    InvalidComponent(String),
    /// A Kafka pipeline on a server started without brokers.
    #[error("this server has no Kafka brokers configured (sluice serve --kafka-brokers)")]
    NoKafka,
    /// Opening or running a pipeline failed.
    #[error(transparent)]
    Pipeline(#[from] sluice_pipeline::Error),
    /// The server itself failed.
    #[error("{0}")]
    Internal(String),
}

impl ServiceError {
    /// [`ServiceError::NotFound`].
    pub fn not_found(kind: &'static str, name: &str) -> Self {
        ServiceError::NotFound {
            kind,
            name: name.to_owned(),
        }
    }

    /// [`ServiceError::Invalid`].
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        ServiceError::Invalid {
            code,
            message: message.into(),
        }
    }
}

/// Result with a [`ServiceError`].
pub type Result<T, E = ServiceError> = std::result::Result<T, E>;

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The holder of the admin token.
    Admin,
    /// A tenant, by name.
    Tenant(String),
}

/// The limits a pipeline runs with: its own, checked against its tenant's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectiveLimits {
    /// Per-instance limits.
    pub instance: Limits,
    /// Output events per worker per step.
    pub max_output: u64,
}

/// The limits `spec` runs with, or which of them exceeds the tenant's.
pub fn effective_limits(spec: &PipelineSpec, tenant: &TenantLimits) -> Result<EffectiveLimits> {
    let own = spec.limits.unwrap_or_default();
    let pick = |name: &'static str, asked: Option<u64>, max: u64| match asked {
        Some(0) => Err(ServiceError::invalid(
            "invalid_limit",
            format!("limit `{name}` must be above 0"),
        )),
        Some(v) if v > max => Err(ServiceError::LimitExceeded {
            limit: name,
            value: max,
            attempted: v,
        }),
        Some(v) => Ok(v),
        None => Ok(max),
    };
    Ok(EffectiveLimits {
        instance: Limits {
            memory: (pick("memory_mib", own.memory_mib, tenant.memory_mib)? << 20) as usize,
            fuel_per_call: pick("fuel_per_step", own.fuel_per_step, tenant.fuel_per_step)?,
            deadline: Duration::from_millis(pick(
                "deadline_ms",
                own.deadline_ms,
                tenant.deadline_ms,
            )?),
        },
        max_output: pick(
            "max_output_per_step",
            own.max_output_per_step,
            tenant.max_output_per_step,
        )?,
    })
}

/// The per-instance limits of a tenant.
fn tenant_instance_limits(limits: &TenantLimits) -> Limits {
    Limits {
        memory: (limits.memory_mib << 20) as usize,
        fuel_per_call: limits.fuel_per_step,
        deadline: Duration::from_millis(limits.deadline_ms),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The server's state and domain rules.
pub struct Service {
    /// The data directory.
    data: PathBuf,
    /// The data directory as a capability: tenant files are created and
    /// written only through it.
    root: cap_std::fs::Dir,
    /// SHA-256 of the admin token.
    admin_hash: String,
    registry: Mutex<Registry>,
    /// Loaded pipelines by (tenant, name).
    pipelines: Mutex<BTreeMap<(String, String), Arc<PipelineHandle>>>,
    /// The engine every pipeline's engine derives from.
    engine: Arc<SluiceEngine>,
    /// Kafka brokers for Kafka pipelines, if the admin configured them.
    kafka: Option<KafkaSettings>,
}

impl Service {
    /// The service over data directory `data` (created if missing).
    pub fn new(
        data: PathBuf,
        admin_token: &str,
        engine: Arc<SluiceEngine>,
        kafka: Option<KafkaSettings>,
    ) -> Result<Service> {
        let internal = |e: std::io::Error| {
            ServiceError::Internal(format!("data directory {}: {e}", data.display()))
        };
        std::fs::create_dir_all(&data).map_err(internal)?;
        let root = cap_std::fs::Dir::open_ambient_dir(&data, cap_std::ambient_authority())
            .map_err(internal)?;
        root.create_dir_all("tenants").map_err(internal)?;
        let registry = Registry::load(&data)?;
        Ok(Service {
            data,
            root,
            admin_hash: registry::token_hash(admin_token),
            registry: Mutex::new(registry),
            pipelines: Mutex::new(BTreeMap::new()),
            engine,
            kafka,
        })
    }

    /// Recovers every pipeline of the registry: running ones resume
    /// (restore + replay). A pipeline that cannot be recovered is logged
    /// and left out; the others start.
    pub async fn recover(&self) {
        let entries = lock(&self.registry).all_pipelines();
        for (tenant, entry) in entries {
            let name = entry.spec.name.clone();
            match self.load_pipeline(&tenant, entry.spec, entry.desired).await {
                Ok(handle) => {
                    tracing::info!(tenant, pipeline = %name, desired = ?entry.desired, "recovered");
                    lock(&self.pipelines).insert((tenant, name), handle);
                }
                Err(e) => tracing::error!(tenant, pipeline = %name, "could not recover: {e}"),
            }
        }
    }

    /// Checkpoints every running pipeline and ends its task (host shutdown).
    pub async fn shutdown(&self) {
        let handles: Vec<Arc<PipelineHandle>> = lock(&self.pipelines).values().cloned().collect();
        for h in handles {
            h.shutdown(true).await;
        }
    }

    // ----------------------------------------------------------- callers --

    /// Who holds `token`.
    pub fn caller(&self, token: Option<&str>) -> Result<Caller> {
        let token = token.ok_or(ServiceError::Unauthorized)?;
        if registry::constant_time_eq(
            registry::token_hash(token).as_bytes(),
            self.admin_hash.as_bytes(),
        ) {
            return Ok(Caller::Admin);
        }
        lock(&self.registry)
            .tenant_by_token(token)
            .map(|t| Caller::Tenant(t.to_owned()))
            .ok_or(ServiceError::Unauthorized)
    }

    /// Succeeds for the admin token only.
    pub fn admin(&self, token: Option<&str>) -> Result<()> {
        match self.caller(token)? {
            Caller::Admin => Ok(()),
            Caller::Tenant(_) => Err(ServiceError::Forbidden("this route needs the admin token")),
        }
    }

    /// The tenant holding `token`; the admin token is refused.
    pub fn tenant(&self, token: Option<&str>) -> Result<String> {
        match self.caller(token)? {
            Caller::Tenant(t) => Ok(t),
            Caller::Admin => Err(ServiceError::Forbidden(
                "this route needs a tenant's token, not the admin token",
            )),
        }
    }

    // ----------------------------------------------------------- tenants --

    /// Creates a tenant and issues its token (shown once, stored hashed).
    pub fn create_tenant(&self, req: CreateTenant) -> Result<TenantCreated> {
        validate_name("tenant", &req.name)?;
        let token = registry::new_token()?;
        let limits = req.limits.unwrap_or_default();
        {
            let mut reg = lock(&self.registry);
            if reg.tenants.contains_key(&req.name) {
                return Err(ServiceError::Exists {
                    kind: "tenant",
                    name: req.name,
                });
            }
            reg.tenants.insert(
                req.name.clone(),
                Tenant {
                    token_sha256: registry::token_hash(&token),
                    limits,
                    pipelines: Default::default(),
                },
            );
            reg.save(&self.data)?;
        }
        for sub in ["components", "pipelines"] {
            self.root
                .create_dir_all(format!("{}/{sub}", tenant_dir(&req.name)))
                .map_err(|e| {
                    ServiceError::Internal(format!("creating the tenant's directory: {e}"))
                })?;
        }
        Ok(TenantCreated {
            name: req.name,
            token,
            limits,
        })
    }

    /// Every tenant's name.
    pub fn tenants(&self) -> Vec<String> {
        lock(&self.registry).tenants.keys().cloned().collect()
    }

    fn limits(&self, tenant: &str) -> Result<TenantLimits> {
        Ok(lock(&self.registry).tenant(tenant)?.limits)
    }

    // -------------------------------------------------------- components --

    /// Validates, precompiles and stores a component (replacing one of the
    /// same name; pipelines keep the version they were created with).
    pub async fn put_component(
        &self,
        tenant: &str,
        name: &str,
        bytes: &[u8],
    ) -> Result<ComponentInfo> {
        validate_name("component", name)?;
        let max = self.limits(tenant)?.max_component_bytes;
        if bytes.len() as u64 > max {
            return Err(ServiceError::TooLarge {
                limit: "max_component_bytes",
                value: max,
                attempted: bytes.len() as u64,
            });
        }
        let (component, ports) = self.load_component(tenant, name, bytes).await?;
        let store = |file: String| {
            self.root
                .write(file, bytes)
                .map_err(|e| ServiceError::Internal(format!("storing the component: {e}")))
        };
        store(component_file(tenant, name))?;
        // Pipelines refer to a component version by hash: keep every version.
        store(component_file(tenant, &component.hash))?;
        Ok(ComponentInfo {
            name: name.to_owned(),
            hash: component.hash,
            size: bytes.len() as u64,
            inputs: ports.inputs,
            outputs: ports.outputs,
        })
    }

    /// The tenant's components (names, hashes, sizes).
    pub fn list_components(&self, tenant: &str) -> Result<Vec<ComponentInfo>> {
        let internal = |e: std::io::Error| ServiceError::Internal(e.to_string());
        let dir = self
            .root
            .open_dir(format!("{}/components", tenant_dir(tenant)))
            .map_err(internal)?;
        let mut out = Vec::new();
        for entry in dir.entries().map_err(internal)? {
            let file = entry.map_err(internal)?.file_name();
            let Some(name) = file.to_str().and_then(|f| f.strip_suffix(".wasm")) else {
                continue;
            };
            // Hash-named copies are versions, not names.
            if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
                continue;
            }
            let bytes = dir.read(&file).map_err(internal)?;
            out.push(ComponentInfo {
                name: name.to_owned(),
                hash: hex::encode(sha2::Sha256::digest(&bytes)),
                size: bytes.len() as u64,
                inputs: Vec::new(),
                outputs: Vec::new(),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Deletes a component name (pipelines created from it keep running).
    pub fn delete_component(&self, tenant: &str, name: &str) -> Result<()> {
        validate_name("component", name).map_err(|_| ServiceError::not_found("component", name))?;
        self.root
            .remove_file(component_file(tenant, name))
            .map_err(|_| ServiceError::not_found("component", name))
    }

    /// Loads a tenant's component and learns its ports, with the tenant's
    /// memory and fuel limits.
    async fn load_component(
        &self,
        tenant: &str,
        name: &str,
        bytes: &[u8],
    ) -> Result<(LoadedComponent, CircuitPorts)> {
        let engine = self
            .engine
            .with_limits(tenant_instance_limits(&self.limits(tenant)?));
        let origin = PathBuf::from(format!("{name}.wasm"));
        let invalid = |e: &dyn std::fmt::Display| ServiceError::InvalidComponent(e.to_string());
        let component = engine.load(&origin, bytes).map_err(|e| invalid(&e))?;
        let ports = engine.describe(&component).await.map_err(|e| invalid(&e))?;
        ports.validate().map_err(|e| invalid(&e))?;
        Ok((component, ports))
    }

    // --------------------------------------------------------- pipelines --

    /// Creates a pipeline from an uploaded component and starts it, within
    /// the tenant's quotas.
    pub async fn create_pipeline(
        &self,
        tenant: &str,
        mut spec: PipelineSpec,
    ) -> Result<PipelineStatus> {
        validate_name("pipeline", &spec.name)?;
        validate_name("component", &spec.component)?;
        let limits = {
            let reg = lock(&self.registry);
            let t = reg.tenant(tenant)?;
            if t.pipelines.contains_key(&spec.name) {
                return Err(ServiceError::Exists {
                    kind: "pipeline",
                    name: spec.name,
                });
            }
            if t.pipelines.len() as u32 >= t.limits.max_pipelines {
                return Err(ServiceError::LimitExceeded {
                    limit: "max_pipelines",
                    value: t.limits.max_pipelines as u64,
                    attempted: t.pipelines.len() as u64 + 1,
                });
            }
            t.limits
        };
        if spec.workers == 0 {
            return Err(ServiceError::invalid(
                "invalid_request",
                "workers must be at least 1",
            ));
        }
        if spec.workers > limits.max_workers {
            return Err(ServiceError::LimitExceeded {
                limit: "max_workers",
                value: limits.max_workers as u64,
                attempted: spec.workers as u64,
            });
        }
        effective_limits(&spec, &limits)?;
        let bytes = self
            .root
            .read(component_file(tenant, &spec.component))
            .map_err(|_| ServiceError::not_found("component", &spec.component))?;
        spec.component_hash = hex::encode(sha2::Sha256::digest(&bytes));
        let handle = self
            .load_pipeline(tenant, spec.clone(), Desired::Running)
            .await?;
        {
            let mut reg = lock(&self.registry);
            reg.tenant_mut(tenant)?.pipelines.insert(
                spec.name.clone(),
                PipelineEntry {
                    spec: spec.clone(),
                    desired: Desired::Running,
                },
            );
            reg.save(&self.data)?;
        }
        let status = handle.status();
        lock(&self.pipelines).insert((tenant.to_owned(), spec.name), handle);
        Ok(status)
    }

    /// Opens a pipeline's storage and starts its task (creation, recovery).
    async fn load_pipeline(
        &self,
        tenant: &str,
        spec: PipelineSpec,
        desired: Desired,
    ) -> Result<Arc<PipelineHandle>> {
        let effective = effective_limits(&spec, &self.limits(tenant)?)?;
        let bytes = self
            .root
            .read(component_file(tenant, &spec.component_hash))
            .map_err(|_| ServiceError::not_found("component version", &spec.component_hash))?;
        let (component, ports) = self.load_component(tenant, &spec.component, &bytes).await?;
        let dir = format!("{}/pipelines/{}", tenant_dir(tenant), spec.name);
        self.root.create_dir_all(&dir).map_err(|e| {
            ServiceError::Internal(format!("creating the pipeline's directory: {e}"))
        })?;
        let kafka = match spec.log {
            sluice_pipeline::LogKind::Embedded => None,
            sluice_pipeline::LogKind::Kafka => {
                Some(self.kafka.clone().ok_or(ServiceError::NoKafka)?)
            }
        };
        Ok(PipelineHandle::open(
            &self.engine,
            tenant,
            spec,
            component,
            ports,
            effective,
            self.data.join(&dir),
            desired,
            kafka,
        )
        .await?)
    }

    /// The handle of a tenant's pipeline, or 404.
    pub fn pipeline(&self, tenant: &str, name: &str) -> Result<Arc<PipelineHandle>> {
        validate_name("pipeline", name).map_err(|_| ServiceError::not_found("pipeline", name))?;
        lock(&self.pipelines)
            .get(&(tenant.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| ServiceError::not_found("pipeline", name))
    }

    /// The status of each of the tenant's pipelines.
    pub fn statuses(&self, tenant: &str) -> Vec<PipelineStatus> {
        lock(&self.pipelines)
            .iter()
            .filter(|((t, _), _)| t == tenant)
            .map(|(_, h)| h.status())
            .collect()
    }

    /// Starts, pauses or stops a pipeline; remembered across restarts.
    pub async fn control(&self, tenant: &str, name: &str, action: &str) -> Result<PipelineStatus> {
        let h = self.pipeline(tenant, name)?;
        let desired = match action {
            "start" => Desired::Running,
            "pause" => Desired::Paused,
            "stop" => Desired::Stopped,
            _ => return Err(ServiceError::not_found("action", action)),
        };
        {
            let mut reg = lock(&self.registry);
            if let Some(entry) = reg.tenant_mut(tenant)?.pipelines.get_mut(name) {
                entry.desired = desired;
            }
            reg.save(&self.data)?;
        }
        h.set(desired);
        // Let the task take the command before answering with its status.
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(h.status())
    }

    /// Deletes a pipeline and its data.
    pub async fn delete_pipeline(&self, tenant: &str, name: &str) -> Result<()> {
        let h = self.pipeline(tenant, name)?;
        h.shutdown(false).await;
        lock(&self.pipelines).remove(&(tenant.to_owned(), name.to_owned()));
        {
            let mut reg = lock(&self.registry);
            reg.tenant_mut(tenant)?.pipelines.remove(name);
            reg.save(&self.data)?;
        }
        // The task has ended; its database closes when the last handle goes.
        drop(h);
        let dir = format!("{}/pipelines/{name}", tenant_dir(tenant));
        let mut removed = Err(std::io::Error::other("not tried"));
        for _ in 0..50 {
            removed = self.root.remove_dir_all(&dir);
            if removed.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if let Err(e) = removed {
            // The pipeline is gone from the registry; only its files remain.
            tracing::warn!(tenant, pipeline = %name, "could not remove the pipeline's data: {e}");
        }
        Ok(())
    }

    // ------------------------------------------------------------- input --

    /// Appends `events` to input `port`, durably, spread over the input's
    /// partitions in contiguous chunks. A producer's push goes to the
    /// partitions its (id, seq) picks, so a retry's acknowledgement (the
    /// original offsets) names the same ones.
    pub async fn push(
        &self,
        tenant: &str,
        name: &str,
        port: &str,
        events: Vec<Event>,
        producer: Option<(ProducerSeq, Option<String>)>,
    ) -> Result<PushAck> {
        let h = self.pipeline(tenant, name)?;
        let index = h
            .ports()
            .input(port)
            .map_err(|_| ServiceError::not_found("input port", port))?;
        let partitions = h.shape().inputs[index].partitions;
        let n = events.len() as u64;
        let (producer, mark) = match producer {
            Some((p, mark)) => {
                let mark = mark.map(|m| IngestMark {
                    source: producer_mark_source(&p.id, port),
                    state: m.into_bytes(),
                });
                (Some(p), mark)
            }
            None => (None, None),
        };
        let first = match &producer {
            Some(p) => {
                let hash = xxhash_rust::xxh3::xxh3_64(format!("{}/{}", p.id, p.seq).as_bytes());
                (hash % partitions as u64) as u32
            }
            None => h.next_partition(),
        };
        let chunk = events.len().div_ceil(partitions as usize).max(1);
        let mut appends = Vec::new();
        let mut rest = events;
        let mut p = first % partitions;
        while !rest.is_empty() {
            let tail = rest.split_off(chunk.min(rest.len()));
            appends.push((port.to_owned(), p, rest));
            rest = tail;
            p = (p + 1) % partitions;
        }
        let parts: Vec<u32> = appends.iter().map(|(_, p, _)| *p).collect();
        let log = h.log();
        let ranges = tokio::task::spawn_blocking(move || {
            log.append(AppendBatch {
                appends,
                mark,
                producer,
            })
        })
        .await
        .map_err(|e| ServiceError::Internal(e.to_string()))?
        .map_err(sluice_pipeline::Error::from)?;
        h.input_appended();
        let appended: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        Ok(PushAck {
            events: appended.min(n),
            offsets: parts
                .into_iter()
                .zip(ranges)
                .map(|(partition, r)| PartitionRange {
                    partition,
                    start: r.start,
                    end: r.end,
                })
                .collect(),
        })
    }
}

/// Where a producer's mark for `port` is kept among the ingest marks.
fn producer_mark_source(id: &str, port: &str) -> String {
    format!("producer:{port}/{id}")
}

impl Service {
    /// What the pipeline remembers of producer `id` on input `port`.
    pub async fn producer(
        &self,
        tenant: &str,
        name: &str,
        port: &str,
        id: &str,
    ) -> Result<ProducerInfo> {
        let h = self.pipeline(tenant, name)?;
        let log = h.log();
        let (id2, port2) = (id.to_owned(), port.to_owned());
        let (state, mark) = tokio::task::spawn_blocking(move || {
            let state = log.producer(&id2, &port2)?;
            let mark = log.ingest_mark(&producer_mark_source(&id2, &port2))?;
            Ok::<_, sluice_storage::StorageError>((state, mark))
        })
        .await
        .map_err(|e| ServiceError::Internal(e.to_string()))?
        .map_err(sluice_pipeline::Error::from)?;
        let state = state.unwrap_or_default();
        Ok(ProducerInfo {
            producer: id.to_owned(),
            port: port.to_owned(),
            epoch: state.epoch,
            last_seq: state.last_seq,
            mark: mark.map(|m| String::from_utf8_lossy(&m).into_owned()),
        })
    }
}

/// A tenant's directory, relative to the data directory (the name is
/// validated by then).
fn tenant_dir(tenant: &str) -> String {
    format!("tenants/{tenant}")
}

/// A component's file: by name, or a version by hash.
fn component_file(tenant: &str, name_or_hash: &str) -> String {
    format!("{}/components/{name_or_hash}.wasm", tenant_dir(tenant))
}
