//! The server's domain layer: who the caller is, tenants, components and
//! pipelines, with the rules that bind them — **tenant limits** (quotas on
//! pipelines, workers, component size, disk; a pipeline's own limits within
//! its tenant's), the **host's** limits (memory budget, instance pool,
//! concurrent pushes, streams and compiles: see [`crate::limits`]), the
//! pipeline lifecycle, and where tenant files live. Routes call it; it
//! knows nothing of HTTP and returns [`ServiceError`], which the HTTP edge
//! maps to statuses and codes.
//!
//! Every quota is checked and taken under the registry's lock, in the same
//! critical section (so parallel requests cannot all pass one check); the
//! registry is written to disk after the lock is released, and a request
//! answers only once its change is durable.

mod components;
mod io;
mod pipelines;
mod tenants;

pub use pipelines::kafka_name;
pub use tenants::DISK_MEASURE_AGE;

use crate::limits::{Gate, ServerLimits};
use crate::registry::{self, Registry};
use crate::runner::{KafkaSettings, PipelineHandle};
use crate::types::{Desired, PipelineSpec, TenantLimits};
use sluice_core::InvalidName;
use sluice_runtime::{Limits, SluiceEngine};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// A numeric setting outside its range.
    #[error("`{name}` must be between {min} and {max}; the request asked for {value}")]
    OutOfRange {
        /// The setting.
        name: &'static str,
        /// What was asked for.
        value: u64,
        /// Smallest accepted.
        min: u64,
        /// Largest accepted.
        max: u64,
    },
    /// Too many requests of this kind at once: try again later.
    #[error("too many {what} at once (the {limit}'s limit is {value}); try again later")]
    Busy {
        /// "pushes", "streams", …
        what: &'static str,
        /// Whose limit: "tenant" or "server".
        limit: &'static str,
        /// The limit.
        value: u64,
    },
    /// The host cannot promise a pipeline the memory its workers may use.
    #[error(
        "the host's memory budget is {budget_mib} MiB with {free_mib} MiB not promised to \
         pipelines; this pipeline may use {needed_mib} MiB ({workers} workers × {per_worker_mib} \
         MiB): stop another pipeline or ask for less memory"
    )]
    HostMemory {
        /// The host's budget.
        budget_mib: u64,
        /// What is not promised yet.
        free_mib: u64,
        /// What the pipeline needs.
        needed_mib: u64,
        /// Its workers.
        workers: u64,
        /// Memory per worker.
        per_worker_mib: u64,
    },
    /// The host's instance pool cannot hold a pipeline's workers.
    #[error(
        "the host's instance pool holds {pool} instances and {free} are not promised to \
         pipelines (one is kept for checking uploads); this pipeline needs {needed}"
    )]
    HostPool {
        /// The pool's size.
        pool: u32,
        /// Instances not promised.
        free: u64,
        /// Instances the pipeline needs.
        needed: u64,
    },
    /// The tenant's disk quota is used up.
    #[error(
        "the disk quota of {quota_mib} MiB is used up ({used_mib} MiB): delete pipelines or \
         components, or set output_retention_steps"
    )]
    QuotaExceeded {
        /// The quota.
        quota_mib: u64,
        /// What is used.
        used_mib: u64,
    },
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The limits every `init`/`describe` probe of an upload runs with: small
/// and fixed, whatever the tenant may use (a probe only builds the circuit
/// and names its ports).
pub const PROBE_LIMITS: Limits = Limits {
    memory: 64 << 20,
    fuel_per_call: 1_000_000_000,
    deadline: Duration::from_secs(5),
};

/// The concurrency bounds of the server's expensive requests.
pub(crate) struct Gates {
    /// Pushes being parsed and appended.
    pub pushes: Gate,
    /// Long-polls and output streams.
    pub streams: Gate,
    /// Component compiles (one per tenant at a time; the rest queue).
    pub compiles: Gate,
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
    /// The newest registry version on disk; held while writing it.
    saved: tokio::sync::Mutex<u64>,
    /// Loaded pipelines by (tenant, name).
    pipelines: Mutex<BTreeMap<(String, String), Arc<PipelineHandle>>>,
    /// The engine every pipeline's engine derives from.
    engine: Arc<SluiceEngine>,
    /// Kafka brokers for Kafka pipelines, if the admin configured them.
    kafka: Option<KafkaSettings>,
    /// The server-wide limits.
    limits: ServerLimits,
    pub(crate) gates: Gates,
    /// Each tenant's disk usage and when it was measured.
    disk: Mutex<HashMap<String, (Instant, u64)>>,
}

/// A pipeline being created: counted against its tenant's quota and the
/// host's budgets until it is in the registry (or its creation failed).
struct Reservation<'a> {
    service: &'a Service,
    key: (String, String),
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        lock(&self.service.registry).creating.remove(&self.key);
    }
}

impl Service {
    /// The service over data directory `data` (created if missing).
    pub fn new(
        data: PathBuf,
        admin_token: &str,
        engine: Arc<SluiceEngine>,
        kafka: Option<KafkaSettings>,
        limits: ServerLimits,
    ) -> Result<Service> {
        limits.validate()?;
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
            saved: tokio::sync::Mutex::new(0),
            pipelines: Mutex::new(BTreeMap::new()),
            engine,
            kafka,
            limits,
            gates: Gates {
                pushes: Gate::new("pushes", limits.max_pushes),
                streams: Gate::new("streams", limits.max_streams),
                compiles: Gate::new("compiles", limits.max_compiles),
            },
            disk: Mutex::new(HashMap::new()),
        })
    }

    /// The server-wide limits.
    pub fn server_limits(&self) -> &ServerLimits {
        &self.limits
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
                Err(e) => tracing::error!(
                    tenant,
                    pipeline = %name,
                    "could not recover: {}",
                    sluice_core::text::for_log(&e.to_string())
                ),
            }
        }
        self.collect_garbage();
    }

    /// Checkpoints every running pipeline and ends its task (host shutdown).
    pub async fn shutdown(&self) {
        let handles: Vec<Arc<PipelineHandle>> = lock(&self.pipelines).values().cloned().collect();
        // Side by side: a host of a pipeline across hosts may wait for its
        // leader to move its workers away.
        let mut ending = tokio::task::JoinSet::new();
        for h in handles {
            ending.spawn(async move { h.shutdown(true).await });
        }
        while ending.join_next().await.is_some() {}
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

    /// A tenant's limits.
    pub fn limits(&self, tenant: &str) -> Result<TenantLimits> {
        Ok(lock(&self.registry).tenant(tenant)?.limits)
    }

    // ---------------------------------------------------------- registry --

    /// Changes the registry under its lock with `change` (which checks
    /// before it changes anything), then writes it durably *after* the
    /// lock is released: other requests are not held up by the disk. Returns
    /// once this change (or a newer registry holding it) is on disk.
    async fn update<T>(&self, change: impl FnOnce(&mut Registry) -> Result<T>) -> Result<T> {
        let (value, version, bytes) = {
            let mut reg = lock(&self.registry);
            let value = change(&mut reg)?;
            reg.version += 1;
            (value, reg.version, reg.to_bytes()?)
        };
        let mut saved = self.saved.lock().await;
        if *saved < version {
            let dir = self.data.clone();
            tokio::task::spawn_blocking(move || Registry::write(&dir, &bytes))
                .await
                .map_err(|e| ServiceError::Internal(format!("saving the registry: {e}")))??;
            *saved = version;
        }
        Ok(value)
    }

    // --------------------------------------------------------- admission --

    /// Memory and instances promised to pipelines that hold instances (not
    /// stopped) and to pipelines being created, except `except`.
    fn promised(&self, reg: &Registry, except: Option<(&str, &str)>) -> (u64, u64) {
        let (mut memory, mut instances) = (0u64, 0u64);
        for (t, tenant) in &reg.tenants {
            for (name, entry) in &tenant.pipelines {
                if entry.desired == Desired::Stopped || except == Some((t, name)) {
                    continue;
                }
                let per_worker = effective_limits(&entry.spec, &tenant.limits)
                    .map_or(tenant.limits.memory_mib << 20, |e| e.instance.memory as u64);
                memory += per_worker * u64::from(entry.spec.workers);
                instances += u64::from(entry.spec.workers);
            }
        }
        for &(m, w) in reg.creating.values() {
            memory += m;
            instances += w;
        }
        (memory, instances)
    }

    /// Whether the host can promise `workers` more instances of `memory`
    /// bytes each (the memory budget, and the instance pool if there is
    /// one, keeping one instance for the probes of uploads).
    fn admit(
        &self,
        reg: &Registry,
        except: Option<(&str, &str)>,
        workers: u32,
        memory: u64,
    ) -> Result<()> {
        let (promised_memory, promised_instances) = self.promised(reg, except);
        let needed = u64::from(workers) * memory;
        let budget = self.limits.memory_budget;
        if promised_memory + needed > budget {
            return Err(ServiceError::HostMemory {
                budget_mib: budget >> 20,
                free_mib: budget.saturating_sub(promised_memory) >> 20,
                needed_mib: needed >> 20,
                workers: workers.into(),
                per_worker_mib: memory >> 20,
            });
        }
        if let Some(pool) = self.engine.pool_size() {
            let free = u64::from(pool)
                .saturating_sub(1)
                .saturating_sub(promised_instances);
            if u64::from(workers) > free {
                return Err(ServiceError::HostPool {
                    pool,
                    free,
                    needed: workers.into(),
                });
            }
        }
        Ok(())
    }
}

/// A tenant's directory, relative to the data directory (the name is
/// validated by then).
fn tenant_dir(tenant: &str) -> String {
    format!("tenants/{tenant}")
}
