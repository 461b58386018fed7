//! Tenants: creation, token rotation, deletion with all their data, and
//! what each uses against its limits (disk, pipelines, memory).

use super::state::{Service, lock, tenant_dir};
use crate::error::{Result, ServiceError};
use crate::limits::effective_limits;
use crate::registry::{self, Tenant};
use crate::types::{CreateTenant, Desired, HostUsage, TenantCreated, TenantUsage};
use sluice_core::validate_name;
use sluice_pipeline::storage::HOST_MEMORY_BOUND;
use std::path::Path;
use std::time::{Duration, Instant};

/// How old a disk measurement may be before a quota check measures again.
pub const DISK_MEASURE_AGE: Duration = Duration::from_millis(250);

impl Service {
    /// Creates a tenant and issues its token (shown once, stored hashed).
    pub async fn create_tenant(&self, req: CreateTenant) -> Result<TenantCreated> {
        validate_name("tenant", &req.name)?;
        let limits = req.limits.unwrap_or_default();
        limits.validate()?;
        let token = registry::new_token()?;
        let token_sha256 = registry::token_hash(&token);
        for sub in ["components/versions", "pipelines"] {
            self.root
                .create_dir_all(format!("{}/{sub}", tenant_dir(&req.name)))
                .map_err(|e| {
                    ServiceError::Internal(format!("creating the tenant's directory: {e}"))
                })?;
        }
        let name = req.name.clone();
        self.update(move |reg| {
            if reg.tenants.contains_key(&name) {
                return Err(ServiceError::Exists {
                    kind: "tenant",
                    name,
                });
            }
            reg.tenants.insert(
                name,
                Tenant {
                    token_sha256,
                    limits,
                    pipelines: Default::default(),
                },
            );
            Ok(())
        })
        .await?;
        Ok(TenantCreated {
            name: req.name,
            token,
            limits,
        })
    }

    /// Issues a new token for `tenant`; the old one stops working at once.
    pub async fn rotate_token(&self, tenant: &str) -> Result<TenantCreated> {
        validate_name("tenant", tenant).map_err(|_| ServiceError::not_found("tenant", tenant))?;
        let token = registry::new_token()?;
        let hash = registry::token_hash(&token);
        let limits = self
            .update(|reg| {
                let t = reg.tenant_mut(tenant)?;
                t.token_sha256 = hash;
                Ok(t.limits)
            })
            .await?;
        Ok(TenantCreated {
            name: tenant.to_owned(),
            token,
            limits,
        })
    }

    /// Deletes a tenant: its token stops working, its pipelines end, and
    /// its components, logs, checkpoints (and Kafka topics) are deleted.
    pub async fn delete_tenant(&self, tenant: &str) -> Result<()> {
        validate_name("tenant", tenant).map_err(|_| ServiceError::not_found("tenant", tenant))?;
        // First the registry: from here on the token answers 401.
        let removed = self
            .update(|reg| {
                reg.tenants
                    .remove(tenant)
                    .ok_or_else(|| ServiceError::not_found("tenant", tenant))
            })
            .await?;
        let handles: Vec<_> = {
            let mut pipelines = lock(&self.pipelines);
            let keys: Vec<_> = pipelines
                .keys()
                .filter(|(t, _)| t == tenant)
                .cloned()
                .collect();
            keys.into_iter()
                .filter_map(|k| pipelines.remove(&k))
                .collect()
        };
        for h in &handles {
            h.shutdown(false).await;
        }
        for entry in removed.pipelines.values() {
            self.delete_topics(tenant, &entry.spec).await;
        }
        drop(handles);
        self.remove_dir(&tenant_dir(tenant)).await;
        for gate in [
            &self.gates.pushes,
            &self.gates.streams,
            &self.gates.compiles,
        ] {
            gate.forget(tenant);
        }
        lock(&self.disk).remove(tenant);
        Ok(())
    }

    /// Every tenant's name.
    pub fn tenants(&self) -> Vec<String> {
        lock(&self.registry).tenants.keys().cloned().collect()
    }

    /// What `tenant` uses against its limits.
    pub async fn usage(&self, tenant: &str) -> Result<TenantUsage> {
        let disk = self.disk_used(tenant, Duration::ZERO).await?;
        let reg = lock(&self.registry);
        let t = reg.tenant(tenant)?;
        let mut memory = 0u64;
        for entry in t.pipelines.values() {
            if entry.desired != Desired::Stopped {
                let per_worker = effective_limits(&entry.spec, &t.limits)
                    .map_or(t.limits.memory_mib << 20, |e| e.instance.memory as u64);
                memory += per_worker * u64::from(entry.spec.workers) + HOST_MEMORY_BOUND;
            }
        }
        let limits = t.limits;
        let pipelines = t.pipelines.len() as u32;
        drop(reg);
        let host_memory = lock(&self.pipelines)
            .iter()
            .filter(|((owner, _), _)| owner == tenant)
            .map(|(_, h)| h.log_memory_bytes())
            .sum::<u64>()
            + self.push_bytes(tenant);
        Ok(TenantUsage {
            name: tenant.to_owned(),
            pipelines,
            disk_used_bytes: disk,
            disk_quota_bytes: limits.disk_quota_mib << 20,
            memory_promised_bytes: memory,
            host_memory_bytes: host_memory,
            limits,
        })
    }

    /// The host's budgets and every tenant's usage (admin).
    pub async fn host_usage(&self) -> Result<HostUsage> {
        let mut tenants = Vec::new();
        for t in self.tenants() {
            // A tenant deleted meanwhile is simply not listed.
            if let Ok(u) = self.usage(&t).await {
                tenants.push(u);
            }
        }
        let (memory, instances) = self.promised(&lock(&self.registry), None);
        let (disk_free, disk_total) = disk_space(&self.data);
        Ok(HostUsage {
            memory_budget_bytes: self.limits.memory_budget,
            memory_promised_bytes: memory,
            pool_instances: self.engine.pool_size(),
            instances_promised: instances,
            resident_bytes: sluice_runtime::memory::resident_bytes(),
            heap_in_use_bytes: sluice_runtime::memory::heap_in_use_bytes(),
            host_memory_bytes: tenants.iter().map(|t| t.host_memory_bytes).sum(),
            disk_free_bytes: disk_free,
            disk_total_bytes: disk_total,
            tenants,
        })
    }

    /// The bytes under the tenant's directory, measured at most `max_age`
    /// ago.
    pub(crate) async fn disk_used(&self, tenant: &str, max_age: Duration) -> Result<u64> {
        if let Some((at, bytes)) = lock(&self.disk).get(tenant).copied()
            && at.elapsed() <= max_age
        {
            return Ok(bytes);
        }
        let dir = self.data.join(tenant_dir(tenant));
        let bytes = tokio::task::spawn_blocking(move || dir_size(&dir))
            .await
            .map_err(|e| ServiceError::Internal(format!("measuring disk usage: {e}")))?;
        lock(&self.disk).insert(tenant.to_owned(), (Instant::now(), bytes));
        Ok(bytes)
    }

    /// Refuses with 507 `quota_exceeded` when `tenant` has no room for
    /// `adding` more bytes (usage measured within [`DISK_MEASURE_AGE`]).
    pub(crate) async fn check_disk(&self, tenant: &str, adding: u64) -> Result<()> {
        let quota = self.limits(tenant)?.disk_quota_mib << 20;
        let used = self.disk_used(tenant, DISK_MEASURE_AGE).await?;
        if used + adding > quota {
            return Err(ServiceError::QuotaExceeded {
                quota_mib: quota >> 20,
                used_mib: used >> 20,
            });
        }
        Ok(())
    }

    /// Removes a directory under the data directory, retrying briefly
    /// while a closing database still holds files.
    pub(crate) async fn remove_dir(&self, dir: &str) {
        let mut removed = Err(std::io::Error::other("not tried"));
        for _ in 0..50 {
            removed = self.root.remove_dir_all(dir);
            if removed.as_ref().is_ok()
                || removed
                    .as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if let Err(e) = removed {
            tracing::warn!(dir, "could not remove: {e}");
        }
    }
}

/// The bytes of every file under `dir` (0 if it is missing).
fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => todo.push(entry.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}

/// `(free, total)` bytes of the file system holding `dir` (zeros if it
/// cannot be asked).
fn disk_space(dir: &Path) -> (u64, u64) {
    match rustix::fs::statvfs(dir) {
        Ok(s) => (
            s.f_bavail.saturating_mul(s.f_frsize),
            s.f_blocks.saturating_mul(s.f_frsize),
        ),
        Err(_) => (0, 0),
    }
}
