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

/// A tenant's components: uploads, compiles, probes, versions on disk.
mod components;
/// A pipeline's input: durable pushes and what it remembers of producers.
mod io;
/// A tenant's pipelines: creation, loading, control, deletion, recovery.
mod pipelines;
/// The service's state, its callers, the registry's update and admission.
mod state;
/// Tenants: creation, tokens, deletion, usage against their limits.
mod tenants;
/// Changing a pipeline's component, keeping its state.
mod upgrade;
/// Changing the component of a pipeline across hosts; registries following
/// what the hosts run.
mod upgrade_hosts;

pub use crate::error::{Result, ServiceError};
pub use crate::limits::{EffectiveLimits, PROBE_LIMITS, effective_limits};
pub use crate::settings::kafka_name;
pub use io::PushBytes;
pub use state::{Caller, Service};
pub use tenants::DISK_MEASURE_AGE;
pub use upgrade_hosts::FOLLOW_EVERY;
