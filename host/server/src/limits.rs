//! Every bound the server enforces, in one place: the server-wide limits
//! (`sluice serve` flags: timeouts, connections, concurrent pushes, streams
//! and compiles, the host memory budget) and the **range** of every numeric
//! setting a client sends (tenant limits, pipeline specs). The README's
//! "Limits and quotas" table lists the same numbers.
//!
//! Concurrency bounds are [`Gate`]s: a semaphore in total and one per
//! tenant, so one tenant cannot take the whole server's share.
//!
//! **Tenant limits** live here whole: their ranges and checks, and the
//! limits a pipeline runs with ([`EffectiveLimits`]: its own, each at most
//! its tenant's), which admission and the runners use.

use crate::error::ServiceError;
use crate::types::{PipelineSpec, TenantLimits};
use sluice_runtime::Limits;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Server-wide limits, set by the admin when starting the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// A client must send a request's headers within this (also how long
    /// an idle keep-alive connection stays open).
    pub header_timeout: Duration,
    /// A client must send a request's whole body within this (408 after).
    pub body_timeout: Duration,
    /// Connections served at once; further clients wait in the listen
    /// backlog until one ends.
    pub max_connections: usize,
    /// Pushes being parsed and appended at once, all tenants together
    /// (429 past it).
    pub max_pushes: usize,
    /// Long-polls and output streams open at once, all tenants together
    /// (429 past it).
    pub max_streams: usize,
    /// Components compiled at once, all tenants together (further uploads
    /// queue).
    pub max_compiles: usize,
    /// How long compiling one component may take (422 after).
    pub compile_timeout: Duration,
    /// Memory the host may promise its pipelines' instances, in bytes:
    /// the sum over loaded pipelines of workers × memory limit (503
    /// `host_memory_exhausted` past it).
    pub memory_budget: u64,
}

impl Default for ServerLimits {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        ServerLimits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            max_connections: 512,
            max_pushes: 8,
            max_streams: 256,
            max_compiles: (cores / 2).max(1),
            compile_timeout: Duration::from_secs(120),
            memory_budget: physical_memory().map_or(8 << 30, |m| m / 4 * 3),
        }
    }
}

/// The machine's memory (`MemTotal`), if it can be read.
pub fn physical_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib << 10)
}

/// The range of a numeric setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// The setting's name, as clients send it.
    pub name: &'static str,
    /// Smallest accepted value.
    pub min: u64,
    /// Largest accepted value.
    pub max: u64,
}

impl Range {
    /// `value` if it lies in the range, else 400 `out_of_range`.
    pub fn check(&self, value: u64) -> Result<u64, ServiceError> {
        if (self.min..=self.max).contains(&value) {
            Ok(value)
        } else {
            Err(ServiceError::OutOfRange {
                name: self.name,
                value,
                min: self.min,
                max: self.max,
            })
        }
    }
}

const fn range(name: &'static str, min: u64, max: u64) -> Range {
    Range { name, min, max }
}

/// Ranges of the tenant limits (`POST /tenants`).
pub mod tenant {
    use super::{Range, range};
    /// Memory of one instance (all its memories and tables), MiB.
    pub const MEMORY_MIB: Range = range("memory_mib", 1, 64 << 10);
    /// Fuel per call into the guest.
    pub const FUEL_PER_STEP: Range = range("fuel_per_step", 1_000, 1_000_000_000_000);
    /// Deadline of one call into the guest, ms.
    pub const DEADLINE_MS: Range = range("deadline_ms", 10, 600_000);
    /// Pipelines of one tenant.
    pub const MAX_PIPELINES: Range = range("max_pipelines", 0, 1024);
    /// Workers of one pipeline.
    pub const MAX_WORKERS: Range = range("max_workers", 1, 256);
    /// Size of one component, bytes.
    pub const MAX_COMPONENT_BYTES: Range = range("max_component_bytes", 1 << 10, 256 << 20);
    /// Output events per worker per step.
    pub const MAX_OUTPUT_PER_STEP: Range = range("max_output_per_step", 1, 100_000_000);
    /// Size of one push's body, bytes.
    pub const MAX_PUSH_BYTES: Range = range("max_push_bytes", 1 << 10, 256 << 20);
    /// Events in one push.
    pub const MAX_PUSH_EVENTS: Range = range("max_push_events", 1, 10_000_000);
    /// The tenant's pushes at once.
    pub const MAX_CONCURRENT_PUSHES: Range = range("max_concurrent_pushes", 1, 64);
    /// The tenant's long-polls and output streams at once.
    pub const MAX_STREAMS: Range = range("max_streams", 1, 1024);
    /// Disk the tenant's components, logs and checkpoints may take, MiB.
    pub const DISK_QUOTA_MIB: Range = range("disk_quota_mib", 1, 1 << 30);
}

/// Ranges of a pipeline's settings (`POST /pipelines`).
pub mod pipeline {
    use super::{Range, range};
    /// Workers W (and at most the tenant's `max_workers`).
    pub const WORKERS: Range = range("workers", 1, 256);
    /// Partitions of each input.
    pub const PARTITIONS: Range = range("partitions", 1, 1024);
    /// Events per input partition per step.
    pub const MAX_BATCH: Range = range("max_batch", 1, 1_000_000);
    /// Steps between checkpoints.
    pub const CHECKPOINT_EVERY_STEPS: Range = range("checkpoint_every_steps", 1, 1_000_000);
    /// Time between checkpoints, ms.
    pub const CHECKPOINT_INTERVAL_MS: Range = range("checkpoint_interval_ms", 10, 86_400_000);
    /// Steps of output kept (older output below every checkpoint goes).
    pub const OUTPUT_RETENTION_STEPS: Range = range("output_retention_steps", 1, u32::MAX as u64);
    /// Replicas of each worker (across hosts).
    pub const REPLICAS: Range = range("replicas", 1, 8);
}

/// Ranges of the server's own flags.
pub mod server {
    use super::{Range, range};
    /// `--header-timeout-ms`.
    pub const HEADER_TIMEOUT_MS: Range = range("header-timeout-ms", 100, 300_000);
    /// `--body-timeout-ms`.
    pub const BODY_TIMEOUT_MS: Range = range("body-timeout-ms", 100, 3_600_000);
    /// `--max-connections`.
    pub const MAX_CONNECTIONS: Range = range("max-connections", 1, 65_536);
    /// `--max-pushes`.
    pub const MAX_PUSHES: Range = range("max-pushes", 1, 1024);
    /// `--max-streams`.
    pub const MAX_STREAMS: Range = range("max-streams", 1, 65_536);
    /// `--max-compiles`.
    pub const MAX_COMPILES: Range = range("max-compiles", 1, 256);
    /// `--compile-timeout-ms`.
    pub const COMPILE_TIMEOUT_MS: Range = range("compile-timeout-ms", 100, 3_600_000);
    /// `--memory-budget-mib`.
    pub const MEMORY_BUDGET_MIB: Range = range("memory-budget-mib", 16, 1 << 30);
}

impl ServerLimits {
    /// Checks every limit against its range.
    pub fn validate(&self) -> Result<(), ServiceError> {
        use server::*;
        let ms = |d: Duration| d.as_millis().min(u64::MAX as u128) as u64;
        HEADER_TIMEOUT_MS.check(ms(self.header_timeout))?;
        BODY_TIMEOUT_MS.check(ms(self.body_timeout))?;
        MAX_CONNECTIONS.check(self.max_connections as u64)?;
        MAX_PUSHES.check(self.max_pushes as u64)?;
        MAX_STREAMS.check(self.max_streams as u64)?;
        MAX_COMPILES.check(self.max_compiles as u64)?;
        COMPILE_TIMEOUT_MS.check(ms(self.compile_timeout))?;
        MEMORY_BUDGET_MIB.check(self.memory_budget >> 20)?;
        Ok(())
    }
}

impl TenantLimits {
    /// Checks every limit against its range.
    pub fn validate(&self) -> Result<(), ServiceError> {
        use tenant::*;
        MEMORY_MIB.check(self.memory_mib)?;
        FUEL_PER_STEP.check(self.fuel_per_step)?;
        DEADLINE_MS.check(self.deadline_ms)?;
        MAX_PIPELINES.check(self.max_pipelines.into())?;
        MAX_WORKERS.check(self.max_workers.into())?;
        MAX_COMPONENT_BYTES.check(self.max_component_bytes)?;
        MAX_OUTPUT_PER_STEP.check(self.max_output_per_step)?;
        MAX_PUSH_BYTES.check(self.max_push_bytes)?;
        MAX_PUSH_EVENTS.check(self.max_push_events)?;
        MAX_CONCURRENT_PUSHES.check(self.max_concurrent_pushes.into())?;
        MAX_STREAMS.check(self.max_streams.into())?;
        DISK_QUOTA_MIB.check(self.disk_quota_mib)?;
        Ok(())
    }
}

impl PipelineSpec {
    /// Checks every setting against its range (workers against the
    /// tenant's `max_workers` happens with the tenant's other limits).
    pub fn validate(&self) -> Result<(), ServiceError> {
        use pipeline::*;
        WORKERS.check(self.workers.into())?;
        if let Some(p) = self.partitions {
            PARTITIONS.check(p.into())?;
        }
        MAX_BATCH.check(self.max_batch)?;
        CHECKPOINT_EVERY_STEPS.check(self.checkpoint_every_steps)?;
        CHECKPOINT_INTERVAL_MS.check(self.checkpoint_interval_ms)?;
        if self.across_hosts && self.log != sluice_pipeline::LogKind::Kafka {
            return Err(ServiceError::invalid(
                "across_hosts_needs_kafka",
                "a pipeline across hosts keeps its logs in Kafka: add \"log\": \"kafka\"",
            ));
        }
        if self.across_hosts && self.output_retention_steps.is_some() {
            return Err(ServiceError::invalid(
                "across_hosts_retention",
                "a pipeline across hosts keeps all its output (its Kafka topics' own retention \
                 applies): drop \"output_retention_steps\"",
            ));
        }
        if let Some(steps) = self.output_retention_steps {
            OUTPUT_RETENTION_STEPS.check(steps)?;
        }
        REPLICAS.check(self.replicas.into())?;
        if self.replicas > 1 && !self.across_hosts {
            return Err(ServiceError::invalid(
                "replicas_need_hosts",
                "replicas run on other servers: add \"across_hosts\": true, or drop \"replicas\"",
            ));
        }
        Ok(())
    }
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
pub fn effective_limits(
    spec: &PipelineSpec,
    tenant: &TenantLimits,
) -> Result<EffectiveLimits, ServiceError> {
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

/// The limits every `init`/`describe` probe of an upload runs with: small
/// and fixed, whatever the tenant may use (a probe only builds the circuit
/// and names its ports).
pub const PROBE_LIMITS: Limits = Limits {
    memory: 64 << 20,
    fuel_per_call: 1_000_000_000,
    deadline: Duration::from_secs(5),
};

/// A bound on concurrent work: so many in total, so many per tenant.
pub struct Gate {
    what: &'static str,
    total: Arc<Semaphore>,
    total_limit: usize,
    tenants: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// Held while the work it admitted runs.
#[derive(Debug)]
pub struct Permit {
    _tenant: OwnedSemaphorePermit,
    _total: OwnedSemaphorePermit,
}

impl Gate {
    /// A gate letting `total` through at once.
    pub fn new(what: &'static str, total: usize) -> Gate {
        Gate {
            what,
            total: Arc::new(Semaphore::new(total)),
            total_limit: total,
            tenants: Mutex::new(HashMap::new()),
        }
    }

    fn tenant(&self, tenant: &str, per_tenant: usize) -> Arc<Semaphore> {
        let mut map = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(tenant.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(per_tenant)))
            .clone()
    }

    /// Admits one more of `tenant`'s, or 429 at once when the tenant's
    /// share (`per_tenant`) or the total is taken.
    pub fn try_enter(&self, tenant: &str, per_tenant: usize) -> Result<Permit, ServiceError> {
        let own = self.tenant(tenant, per_tenant);
        let busy = |limit: &'static str, value: usize| ServiceError::Busy {
            what: self.what,
            limit,
            value: value as u64,
        };
        let tenant_permit = own
            .try_acquire_owned()
            .map_err(|_| busy("tenant", per_tenant))?;
        let total_permit = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| busy("server", self.total_limit))?;
        Ok(Permit {
            _tenant: tenant_permit,
            _total: total_permit,
        })
    }

    /// Admits one more of `tenant`'s, waiting in line: first behind the
    /// tenant's own work, then for a share of the total.
    pub async fn enter(&self, tenant: &str, per_tenant: usize) -> Permit {
        let own = self.tenant(tenant, per_tenant);
        // The semaphores are never closed.
        let tenant_permit = own.acquire_owned().await.expect("gate open");
        let total_permit = self.total.clone().acquire_owned().await.expect("gate open");
        Permit {
            _tenant: tenant_permit,
            _total: total_permit,
        }
    }

    /// Forgets a deleted tenant's share.
    pub fn forget(&self, tenant: &str) {
        self.tenants
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(tenant);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_bounds_each_tenant_and_the_total() {
        let gate = Gate::new("pushes", 3);
        let a1 = gate.try_enter("a", 2).unwrap();
        let _a2 = gate.try_enter("a", 2).unwrap();
        assert!(matches!(
            gate.try_enter("a", 2),
            Err(ServiceError::Busy {
                limit: "tenant",
                ..
            })
        ));
        let _b1 = gate.try_enter("b", 2).unwrap();
        assert!(matches!(
            gate.try_enter("b", 2),
            Err(ServiceError::Busy {
                limit: "server",
                ..
            })
        ));
        drop(a1);
        gate.try_enter("b", 2).unwrap();
    }

    #[test]
    fn ranges_refuse_both_ends() {
        assert!(pipeline::MAX_BATCH.check(0).is_err());
        assert!(pipeline::MAX_BATCH.check(u64::MAX).is_err());
        assert_eq!(pipeline::MAX_BATCH.check(10_000).unwrap(), 10_000);
        ServerLimits::default().validate().unwrap();
    }
}
