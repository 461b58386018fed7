//! The API's wire types: request and response bodies, and the specs the
//! registry persists. Serde and OpenAPI only; no engine, no storage.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a tenant may use; enforced by the host. Pipelines ask for their own
/// limits within these. Each has a range ([`crate::limits::tenant`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TenantLimits {
    /// Maximum memory of one instance (all its linear memories and tables
    /// together), in MiB.
    pub memory_mib: u64,
    /// Fuel per call into the guest (deterministic CPU bound per step).
    pub fuel_per_step: u64,
    /// Wall-clock deadline of one call into the guest, in milliseconds.
    pub deadline_ms: u64,
    /// Pipelines the tenant may have.
    pub max_pipelines: u32,
    /// Workers one pipeline may have.
    pub max_workers: u32,
    /// Size of one uploaded component, in bytes.
    pub max_component_bytes: u64,
    /// Output events one worker may emit in one step.
    pub max_output_per_step: u64,
    /// Size of one push's body, in bytes.
    pub max_push_bytes: u64,
    /// Events in one push.
    pub max_push_events: u64,
    /// The tenant's pushes in flight at once.
    pub max_concurrent_pushes: u32,
    /// The tenant's long-polls and output streams open at once.
    pub max_streams: u32,
    /// Disk the tenant's components, logs and checkpoints may take, in MiB
    /// (pushes and uploads past it get 507 `quota_exceeded`).
    pub disk_quota_mib: u64,
}

impl Default for TenantLimits {
    fn default() -> Self {
        TenantLimits {
            memory_mib: 256,
            fuel_per_step: 10_000_000_000,
            deadline_ms: 30_000,
            max_pipelines: 16,
            max_workers: 8,
            max_component_bytes: 32 << 20,
            max_output_per_step: 1_000_000,
            max_push_bytes: 16 << 20,
            max_push_events: 1_000_000,
            max_concurrent_pushes: 2,
            max_streams: 16,
            disk_quota_mib: 10 << 10,
        }
    }
}

/// A pipeline as its tenant created it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// The pipeline's name (unique per tenant).
    pub name: String,
    /// The component it runs (a name the tenant uploaded).
    pub component: String,
    /// The component's SHA-256 when the pipeline was created: the pipeline
    /// keeps running that version even if the name is uploaded again.
    #[serde(default)]
    pub component_hash: String,
    /// Number of workers W (changed with `PATCH /pipelines/{name}`).
    #[serde(default = "one")]
    pub workers: u32,
    /// Partitions of each input (default: W, at least 8), fixed at
    /// creation: W can grow up to it with every worker reading input.
    #[serde(default)]
    pub partitions: Option<u32>,
    /// At most this many events per input partition per step.
    #[serde(default = "max_batch")]
    pub max_batch: u64,
    /// Checkpoint after this many steps…
    #[serde(default = "checkpoint_every")]
    pub checkpoint_every_steps: u64,
    /// …or this many milliseconds, whichever comes first.
    #[serde(default = "checkpoint_interval")]
    pub checkpoint_interval_ms: u64,
    /// Limits for this pipeline; each at most the tenant's (omitted: the
    /// tenant's).
    #[serde(default)]
    pub limits: Option<PipelineLimits>,
    /// Where its logs live: `embedded` (default) or `kafka` (on the
    /// server's brokers, topics `<tenant>.<pipeline>.<port>`).
    #[serde(default)]
    #[schema(value_type = String)]
    pub log: sluice_pipeline::LogKind,
    /// The name its Kafka topics and transactional ids derive from, chosen
    /// by the server (see [`kafka_name`](crate::service::kafka_name));
    /// absent for pipelines created before it existed
    /// (`<tenant>.<pipeline>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only)]
    pub kafka_name: Option<String>,
    /// Keep this many steps of output (older output that every checkpoint
    /// covers is deleted); omitted: keep all output.
    #[serde(default)]
    pub output_retention_steps: Option<u64>,
    /// Keep all its input: no checkpoint trims it, so that an upgrade can
    /// rebuild a new version's operators from it (`PATCH` with
    /// `"rebuild": true`). Costs the input's disk for good.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retain_input: bool,
    /// Run it across hosts: every server started with the same
    /// `--hosts-*` settings on which the tenant creates this pipeline runs
    /// some of its workers, one of them leads, and a server that dies is
    /// taken over from (its logs in Kafka, `"log": "kafka"`; checkpoints in
    /// the servers' shared store). Its input is written to its Kafka topics
    /// directly, not pushed through the API.
    #[serde(default)]
    pub across_hosts: bool,
    /// With `across_hosts`: run each worker on this many servers at once
    /// (never two on one; with fewer servers, on every one). The leader
    /// commits one replica's output; the others step beside it and their
    /// output's hash is checked every step — a difference stops the
    /// pipeline as nondeterministic. Each server still runs at most one
    /// instance of each worker, so the admission budget is unchanged.
    #[serde(default = "one")]
    pub replicas: u32,
    /// Input port → what a record there that is not an event (not JSON, a
    /// bad `sluice-weight` header) does: `fail` (the default: the pipeline
    /// fails, naming the record's position) or `dead-letter` (the record is
    /// skipped and written, with its position and why, to the port's
    /// dead-letter log `<port>.dead-letter` — on Kafka the topic
    /// `<kafka name>.<port>.dead-letter` — in the step's own commit).
    /// Pushes are parsed before anything is appended: a push with a bad
    /// line is refused whole, whatever the policy.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(value_type = BTreeMap<String, String>)]
    pub bad_records: BTreeMap<String, sluice_core::BadRecordPolicy>,
}

impl PipelineSpec {
    /// The name its Kafka topics, transactional ids and (across hosts) its
    /// group and checkpoints derive from: the one the server chose, or
    /// `<tenant>.<pipeline>` for a pipeline created before it chose names.
    pub fn kafka_name_in(&self, tenant: &str) -> String {
        self.kafka_name
            .clone()
            .unwrap_or_else(|| format!("{tenant}.{}", self.name))
    }
}

fn one() -> u32 {
    1
}
fn max_batch() -> u64 {
    10_000
}
fn checkpoint_every() -> u64 {
    100
}
fn checkpoint_interval() -> u64 {
    10_000
}

/// A pipeline's own limits, each optional (the tenant's when omitted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineLimits {
    /// Maximum linear memory of one instance, in MiB.
    pub memory_mib: Option<u64>,
    /// Fuel per call into the guest.
    pub fuel_per_step: Option<u64>,
    /// Wall-clock deadline of one call, in milliseconds.
    pub deadline_ms: Option<u64>,
    /// Output events one worker may emit in one step.
    pub max_output_per_step: Option<u64>,
}

/// `PATCH /pipelines/{name}`: what to change.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelinePatch {
    /// The number of workers W: the pipeline changes its layout, moving
    /// only the shards the new balance needs.
    pub workers: Option<u32>,
    /// An uploaded component to run instead (a new version of the
    /// circuit): the pipeline checkpoints its last step and the new
    /// version takes the state it can (`POST /pipelines/{name}/diff`
    /// says what); refused (422 `upgrade_refused`), the pipeline running
    /// on as before, if it changed an operator not in `start_empty`.
    pub component: Option<String>,
    /// With `component`: operators of the new version to start empty.
    pub start_empty: Option<Vec<String>>,
    /// With `component`: compute the new version's state anew from all of
    /// the pipeline's input (it must have been
    /// created with `retain_input`), and give each output, with the next
    /// step, its difference from the new version's output.
    #[serde(default)]
    pub rebuild: bool,
}

/// Whether a pipeline should be running after a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Desired {
    /// Running steps.
    Running,
    /// Instances kept, no steps.
    Paused,
    /// Checkpointed and unloaded.
    Stopped,
}

/// Where a pipeline is in its life, as the API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PipelineState {
    /// Opening: starting the workers and recovering.
    Starting,
    /// Committing steps.
    Running,
    /// Running, with no new input.
    Idle,
    /// Instances kept, no steps.
    Paused,
    /// Checkpointed and unloaded.
    Stopped,
    /// Failed; `last_error` says why. `start` tries again.
    Failed,
    /// Its component is being changed (`PATCH` with `component`): every
    /// request for it answers 503 until the upgrade ends. Only listings
    /// show this state, with the status it had when the upgrade began.
    Upgrading,
}

impl PipelineState {
    /// The state's name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            PipelineState::Starting => "starting",
            PipelineState::Running => "running",
            PipelineState::Idle => "idle",
            PipelineState::Paused => "paused",
            PipelineState::Stopped => "stopped",
            PipelineState::Failed => "failed",
            PipelineState::Upgrading => "upgrading",
        }
    }
}

/// What the API reports about a pipeline.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PipelineStatus {
    /// The pipeline's name.
    pub name: String,
    /// The component it runs.
    pub component: String,
    /// The component's SHA-256.
    pub component_hash: String,
    /// Where it is in its life.
    pub state: PipelineState,
    /// Number of workers.
    pub workers: u32,
    /// Input ports.
    pub inputs: Vec<String>,
    /// Output ports.
    pub outputs: Vec<String>,
    /// Steps committed in total.
    pub steps: u64,
    /// Input events consumed since the host started the pipeline.
    pub events_in: u64,
    /// Output events committed since the host started the pipeline.
    pub events_out: u64,
    /// Input records that were not events, skipped into their ports'
    /// dead-letter logs since the host started the pipeline.
    #[serde(default)]
    pub dead_letters: u64,
    /// Per worker: `input/partition` → offset consumed up to.
    pub frontiers: Vec<BTreeMap<String, u64>>,
    /// Input events appended but not yet consumed.
    pub input_lag: u64,
    /// Input events consumed per second (over the last second sampled).
    pub events_in_per_sec: f64,
    /// Output events committed per second.
    pub events_out_per_sec: f64,
    /// Steps committed per second.
    pub steps_per_sec: f64,
    /// How long ago the newest checkpoint this host took committed, ms.
    pub last_checkpoint_age_ms: Option<u64>,
    /// The step of the newest checkpoint.
    pub last_checkpoint: Option<u64>,
    /// Why the checkpoints are behind the steps, while checkpoint writes
    /// fail (the store is away): steps go on, checkpoints and trims wait.
    pub checkpoints_behind: Option<String>,
    /// Fuel the guests burned since the host started the pipeline.
    pub fuel_used: u64,
    /// Why the pipeline failed (or the last error it recovered from).
    pub last_error: Option<String>,
    /// For a pipeline across hosts: this server's part in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<HostsStatus>,
}

impl PipelineStatus {
    /// The status of pipeline `spec` as it opens: `steps` committed, its
    /// newest checkpoint `last_checkpoint`, nothing run yet.
    pub fn starting(
        spec: &PipelineSpec,
        component_hash: &str,
        shape: &sluice_core::PipelineShape,
        steps: u64,
        last_checkpoint: Option<u64>,
    ) -> Self {
        PipelineStatus {
            name: spec.name.clone(),
            component: spec.component.clone(),
            component_hash: component_hash.to_owned(),
            state: PipelineState::Starting,
            workers: shape.workers,
            inputs: shape.input_names(),
            outputs: shape.outputs.clone(),
            steps,
            events_in: 0,
            events_out: 0,
            dead_letters: 0,
            frontiers: Vec::new(),
            input_lag: 0,
            events_in_per_sec: 0.0,
            events_out_per_sec: 0.0,
            steps_per_sec: 0.0,
            last_checkpoint_age_ms: None,
            last_checkpoint,
            checkpoints_behind: None,
            fuel_used: 0,
            last_error: None,
            hosts: None,
        }
    }
}

/// This server's part in a pipeline across hosts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HostsStatus {
    /// This server's name in the pipeline's group.
    pub host: String,
    /// Whether this server leads the pipeline now (runs its coordinator).
    pub leading: bool,
    /// While leading: the hosts the coordinator runs on, itself first.
    pub group: Vec<String>,
    /// While leading with `replicas` > 1: per worker, the servers its
    /// replicas run on, the primary's (which commits its output) first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<Vec<String>>,
    /// While leading: steps in which a follower took over from a failed
    /// primary since this server opened the pipeline (nothing replayed).
    #[serde(default)]
    pub failovers: u64,
    /// While leading: followers' steps whose output hash was checked
    /// against their primary's (a mismatch stops the pipeline, its error
    /// naming both).
    #[serde(default)]
    pub replica_steps_checked: u64,
    /// While leading with `replicas` > 1: whose output was committed, as
    /// its changes since this server opened the pipeline (the last 16):
    /// from `from_step` on, per worker, the server whose replica's output
    /// was committed (until the next entry).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub committed_by: Vec<CommittedBy>,
}

/// From which step each worker's output was committed from which server's
/// replica ([`HostsStatus::committed_by`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CommittedBy {
    /// The first step committed so.
    pub from_step: u64,
    /// Per worker, the server whose replica's output was committed.
    pub hosts: Vec<String>,
}

/// `POST /tenants`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    /// The tenant's name.
    pub name: String,
    /// Its limits (omitted fields: defaults).
    #[serde(default)]
    pub limits: Option<TenantLimits>,
}

/// A created tenant and its API token (shown once; stored hashed).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TenantCreated {
    /// The tenant.
    pub name: String,
    /// Its API token.
    pub token: String,
    /// Its limits.
    pub limits: TenantLimits,
}

/// An uploaded component.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ComponentInfo {
    /// Its name.
    pub name: String,
    /// SHA-256 of its bytes.
    pub hash: String,
    /// Size in bytes.
    pub size: u64,
    /// Input ports (listed on upload).
    pub inputs: Vec<String>,
    /// Output ports (listed on upload).
    pub outputs: Vec<String>,
}

/// Where a push's events went.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PartitionRange {
    /// Input partition.
    pub partition: u32,
    /// First offset.
    pub start: u64,
    /// One past the last offset.
    pub end: u64,
}

/// A durable acknowledgement of a push.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PushAck {
    /// Events acknowledged (a retry of an acknowledged push gets the
    /// original acknowledgement; nothing is appended twice).
    pub events: u64,
    /// Offsets per partition.
    pub offsets: Vec<PartitionRange>,
}

/// What a pipeline remembers of a producer on one input port.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProducerInfo {
    /// The producer.
    pub producer: String,
    /// The input port.
    pub port: String,
    /// Its current session (0 if it never pushed).
    pub epoch: u64,
    /// The last sequence number acknowledged in that session (0: none).
    pub last_seq: u64,
    /// The mark the producer sent with its last acknowledged push.
    pub mark: Option<String>,
}

/// Every error response: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// An error's stable code and message.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Stable, machine-readable.
    pub code: String,
    /// For people.
    pub message: String,
}

/// What a tenant uses against its limits (`GET /usage`; the admin's
/// `GET /tenants` lists every tenant's).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TenantUsage {
    /// The tenant.
    pub name: String,
    /// Its pipelines.
    pub pipelines: u32,
    /// Bytes its components, logs and checkpoints take on the host.
    pub disk_used_bytes: u64,
    /// Its disk quota in bytes.
    pub disk_quota_bytes: u64,
    /// Memory promised to its pipelines that are not stopped: their
    /// instances (workers × memory) and each one's database bound (56 MiB).
    pub memory_promised_bytes: u64,
    /// Host memory it holds on this server now besides its instances: its
    /// pipelines' databases (memtables, table readers and block cache, at
    /// most 56 MiB a pipeline) and its pushes in flight (their bodies, then
    /// their parsed events).
    pub host_memory_bytes: u64,
    /// Its limits.
    pub limits: TenantLimits,
}

/// The host's budgets and every tenant's usage (`GET /tenants`, admin).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HostUsage {
    /// The memory budget instances are admitted against.
    pub memory_budget_bytes: u64,
    /// Memory promised to loaded pipelines (instances and databases).
    pub memory_promised_bytes: u64,
    /// The instance pool's size, if the host uses one.
    pub pool_instances: Option<u32>,
    /// Instances promised to loaded pipelines.
    pub instances_promised: u64,
    /// The server process's resident memory now.
    pub resident_bytes: u64,
    /// Of it, heap allocated and in use (0 where the allocator cannot
    /// tell).
    pub heap_in_use_bytes: u64,
    /// Host memory every tenant holds besides instances (the sum of
    /// theirs).
    pub host_memory_bytes: u64,
    /// Free bytes on the data directory's file system.
    pub disk_free_bytes: u64,
    /// Size of that file system.
    pub disk_total_bytes: u64,
    /// Every tenant.
    pub tenants: Vec<TenantUsage>,
}
