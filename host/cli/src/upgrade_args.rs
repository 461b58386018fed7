//! The arguments of `sluice upgrade`.

use std::path::PathBuf;

/// `sluice upgrade`: a pipeline in a data directory, on a server, or run
/// by a group of `sluice host` processes.
#[derive(Debug, clap::Args)]
pub struct UpgradeArgs {
    /// The new version: a component file (`.wasm`).
    pub component: PathBuf,
    /// The pipeline's data directory.
    #[arg(
        long,
        required_unless_present_any = ["pipeline", "group"],
        conflicts_with_all = ["pipeline", "group"]
    )]
    pub data: Option<PathBuf>,
    /// A pipeline on a server (--server, --token) instead.
    #[arg(long)]
    pub pipeline: Option<String>,
    /// With --pipeline: the name to upload the new version under
    /// (default: the file's name without `.wasm`).
    #[arg(long = "as", requires = "pipeline")]
    pub as_name: Option<String>,
    /// Operators of the new version to start empty (ID[,ID…]).
    #[arg(long = "start-empty", value_delimiter = ',')]
    pub start_empty: Vec<String>,
    /// Compute the new version's state anew from all of the input
    /// (kept with --retain-input), and write each output's difference
    /// from the new version's at the switch.
    #[arg(long)]
    pub rebuild: bool,
    /// With --data or --group: the object store of a pipeline run with
    /// `--store` (as given there; ignored with --pipeline, as the next).
    #[arg(long, env = "SLUICE_CHECKPOINT_STORE")]
    pub store: Option<String>,
    /// With --data: Kafka bootstrap servers, for a pipeline whose logs
    /// are in Kafka (the upgrade fences any host still running it).
    #[arg(long, env = "SLUICE_KAFKA_BROKERS")]
    pub brokers: Option<String>,
    /// The server, with --pipeline.
    #[arg(long, env = "SLUICE_SERVER", default_value = "http://127.0.0.1:7878")]
    pub server: String,
    /// The API token, with --pipeline.
    #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A pipeline run by `sluice host` processes instead: the group's
    /// etcd endpoints (with --group and --store). The new version is
    /// published in the store, and the group's leader checkpoints, makes
    /// the upgrade and runs it across the hosts; the command waits for its
    /// answer.
    #[arg(long, value_delimiter = ',', requires = "group")]
    pub etcd: Vec<String>,
    /// The group's name: the pipeline's, as its hosts' --pipeline.
    #[arg(long, requires_all = ["etcd", "store"], conflicts_with = "pipeline")]
    pub group: Option<String>,
    /// With --group: how long to wait for the leader's answer, in seconds.
    #[arg(long, default_value_t = 600)]
    pub wait_secs: u64,
}
