//! The [`Service`] itself: the server's state (the data directory as a
//! capability, the registry and its durable update, the loaded pipelines,
//! the engine, the concurrency gates), who the caller is, and admission
//! against the host's memory budget and instance pool. The other files of
//! the domain layer add its operations, by resource.

use crate::error::{Result, ServiceError};
use crate::limits::{Gate, ServerLimits, effective_limits};
use crate::registry::{self, PipelineEntry, Registry};
use crate::runner::PipelineHandle;
use crate::settings::KafkaSettings;
use crate::types::{Desired, PipelineStatus, TenantLimits};
use sluice_pipeline::storage::HOST_MEMORY_BOUND;
use sluice_runtime::SluiceEngine;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The holder of the admin token.
    Admin,
    /// A tenant, by name.
    Tenant(String),
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

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
    pub(super) data: PathBuf,
    /// The data directory as a capability: tenant files are created and
    /// written only through it.
    pub(super) root: cap_std::fs::Dir,
    /// SHA-256 of the admin token.
    pub(super) admin_hash: String,
    pub(super) registry: Mutex<Registry>,
    /// The newest registry version on disk; held while writing it.
    pub(super) saved: tokio::sync::Mutex<u64>,
    /// Loaded pipelines by (tenant, name).
    pub(super) pipelines: Mutex<BTreeMap<(String, String), Arc<PipelineHandle>>>,
    /// The engine every pipeline's engine derives from.
    pub(super) engine: Arc<SluiceEngine>,
    /// Kafka brokers for Kafka pipelines, if the admin configured them.
    pub(super) kafka: Option<KafkaSettings>,
    /// The server-wide limits.
    pub(super) limits: ServerLimits,
    pub(crate) gates: Gates,
    /// Each tenant's disk usage and when it was measured.
    pub(super) disk: Mutex<HashMap<String, (Instant, u64)>>,
    /// Bytes each tenant's pushes in flight hold on the host (bodies, then
    /// their parsed events), while they are held.
    pub(super) pushing: Mutex<HashMap<String, u64>>,
    /// Pipelines whose component is being changed: unloaded meanwhile,
    /// every request for them answers 503, and listings show the status
    /// each had when its upgrade began (state `upgrading`; none until it
    /// is read).
    pub(super) upgrading: Mutex<BTreeMap<(String, String), Option<PipelineStatus>>>,
    /// Pipelines across hosts whose upgrade this server asked of their
    /// leader and waits for: they run on meanwhile, but their registry
    /// entry is the upgrade's until it is answered.
    pub(super) asking: Mutex<std::collections::BTreeSet<(String, String)>>,
}

/// A pipeline being created: counted against its tenant's quota and the
/// host's budgets until it is in the registry (or its creation failed).
pub(super) struct Reservation<'a> {
    pub(super) service: &'a Service,
    pub(super) key: (String, String),
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        lock(&self.service.registry).creating.remove(&self.key);
    }
}

/// Runs its closure when dropped: takes a mark off a pipeline (being
/// upgraded, being asked of its leader) however the request ends.
pub(super) struct OnDrop<F: FnMut()>(pub(super) F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)()
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
            pushing: Mutex::new(HashMap::new()),
            upgrading: Mutex::new(Default::default()),
            asking: Mutex::new(Default::default()),
        })
    }

    /// A tenant's pipeline as the registry has it (404 if it has none of
    /// that name).
    pub(super) fn registered(&self, tenant: &str, name: &str) -> Result<PipelineEntry> {
        lock(&self.registry)
            .tenant(tenant)?
            .pipelines
            .get(name)
            .cloned()
            .ok_or_else(|| ServiceError::not_found("pipeline", name))
    }

    /// The server-wide limits.
    pub fn server_limits(&self) -> &ServerLimits {
        &self.limits
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
    pub(super) async fn update<T>(
        &self,
        change: impl FnOnce(&mut Registry) -> Result<T>,
    ) -> Result<T> {
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
    /// stopped) and to pipelines being created, except `except`: each
    /// pipeline's instances at their memory limit and its database's bound
    /// ([`HOST_MEMORY_BOUND`]).
    pub(super) fn promised(&self, reg: &Registry, except: Option<(&str, &str)>) -> (u64, u64) {
        let (mut memory, mut instances) = (0u64, 0u64);
        for (t, tenant) in &reg.tenants {
            for (name, entry) in &tenant.pipelines {
                if entry.desired == Desired::Stopped || except == Some((t, name)) {
                    continue;
                }
                let per_worker = effective_limits(&entry.spec, &tenant.limits)
                    .map_or(tenant.limits.memory_mib << 20, |e| e.instance.memory as u64);
                memory += per_worker * u64::from(entry.spec.workers) + HOST_MEMORY_BOUND;
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
    /// bytes each, and a pipeline's database ([`HOST_MEMORY_BOUND`]) with
    /// them (the memory budget, and the instance pool if there is one,
    /// keeping one instance for the probes of uploads).
    pub(super) fn admit(
        &self,
        reg: &Registry,
        except: Option<(&str, &str)>,
        workers: u32,
        memory: u64,
    ) -> Result<()> {
        let (promised_memory, promised_instances) = self.promised(reg, except);
        let needed = u64::from(workers) * memory + HOST_MEMORY_BOUND;
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
pub(super) fn tenant_dir(tenant: &str) -> String {
    format!("tenants/{tenant}")
}
