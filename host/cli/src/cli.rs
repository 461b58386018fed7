//! The `sluice` command line: its arguments (clap). What each command does
//! is in [`commands`](crate::commands).

use crate::parse::{key_value, port_file, port_policy, port_topic, zone_label};
use clap::{Parser, Subcommand};
use sluice_core::OutputPosition;
use sluice_pipeline::{LogConfig, LogKind};
use sluice_runtime::Limits;
use std::path::PathBuf;

/// The default `--step-window` (`sluice_kafka::STEP_WINDOW`, which a build
/// without Kafka does not link; a test keeps them equal).
const STEP_WINDOW: u32 = 4096;

/// Sluice: run WebAssembly circuits as exactly-once pipelines.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build the circuit at PATH (a Rust crate, or a Python circuit) into a
    /// wasm32-wasip2 component; prints the component's path as the last
    /// line.
    Build {
        /// The crate directory (or its Cargo.toml), or a Python circuit:
        /// a directory with `circuit.py` (or a pyproject.toml naming the
        /// module in `[tool.sluice]`), or the `.py` file itself.
        path: PathBuf,
        /// Cargo target directory (default: cargo's; a Python circuit's
        /// component goes to its `python/` subdirectory, by default under
        /// the circuit's `target/`).
        #[arg(long)]
        target_dir: Option<PathBuf>,
    },
    /// Append input files to a pipeline's input logs, run until all input is
    /// consumed and committed, and write the output logs. Run again on the
    /// same --data after a crash: it recovers and finishes.
    Run(RunArgs),
    /// Run one host of a pipeline across several: serve the workers the
    /// leader places here, join the pipeline's group (etcd), and lead when
    /// first in it — recovering on the hosts that are there whenever the
    /// group changes. Logs in Kafka, checkpoints in an object store. Stops
    /// on Ctrl-C / SIGTERM (a leader checkpoints first).
    Host(HostArgs),
    /// Audit a pipeline's logs offline; exits non-zero naming the first
    /// violation. A pipeline whose logs are in Kafka needs --brokers.
    Verify {
        /// The pipeline's data directory.
        #[arg(long)]
        data: PathBuf,
        /// Kafka bootstrap servers, for a pipeline whose logs are in Kafka.
        #[arg(long, env = "SLUICE_KAFKA_BROKERS")]
        brokers: Option<String>,
        /// The object store holding the pipeline's checkpoints, for a
        /// pipeline run with `--store` (as given there).
        #[arg(long, env = "SLUICE_CHECKPOINT_STORE")]
        store: Option<String>,
    },
    /// Print an output log with every event's position and the input
    /// frontier it covers, optionally resuming after a position.
    Read {
        /// The pipeline's data directory.
        #[arg(long)]
        data: PathBuf,
        /// The output port (or an input's dead-letter log,
        /// `INPUT.dead-letter`).
        #[arg(long)]
        output: String,
        /// Resume after this position, STEP:WORKER:INDEX.
        #[arg(long, value_parser = OutputPosition::parse)]
        after: Option<OutputPosition>,
        /// At most this many events.
        #[arg(long, default_value_t = usize::MAX)]
        limit: usize,
        /// Kafka bootstrap servers, for a pipeline whose logs are in Kafka.
        #[arg(long, env = "SLUICE_KAFKA_BROKERS")]
        brokers: Option<String>,
    },
    /// Crash campaign: run a keyed pipeline as a child process, crash it at
    /// named points and random moments, restart it, and check the output
    /// against a from-scratch computation. Exits non-zero on any violation.
    Chaos {
        /// Number of trials.
        #[arg(long, default_value_t = 100)]
        trials: u32,
        /// Campaign seed (trial i uses seed + i).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The orders-join component (default: build examples/orders-join).
        #[arg(long)]
        component: Option<PathBuf>,
        /// The noisy component, run by every second trial (default, when
        /// --component is not given either: build tests/guests/noisy).
        #[arg(long)]
        noisy_component: Option<PathBuf>,
        /// A word-count component (Rust or Python, e.g. `sluice build
        /// examples/python-wordcount`): the trials that do not run the noisy
        /// circuit run it over lines with deletes, checked against
        /// examples/wordcount's split of the words, instead of the orders
        /// join (the noisy circuit then runs only when --noisy-component is
        /// given).
        #[arg(long, conflicts_with = "component")]
        wordcount: Option<PathBuf>,
        /// Workers W.
        #[arg(long, default_value_t = 2)]
        workers: u32,
        /// Change W at random (1 to 4) on every run of a trial: layout
        /// changes between runs and, with crashes, during them.
        #[arg(long)]
        rescale: bool,
        /// Orders per trial (lines, with --wordcount).
        #[arg(long, default_value_t = 1500)]
        orders: u32,
        /// The campaign across hosts instead: word count with deletes on a
        /// coordinator and two worker hosts (loopback TCP), with worker
        /// hosts killed and stalled past the session timeout and the
        /// coordinator crashed mid-step (--component: word count).
        #[arg(long)]
        hosts: bool,
        /// The campaign across hosts with network faults too (implies
        /// --hosts): one direction into or out of a host cut, delays
        /// past the session timeout, connections reset or left half-open;
        /// a trial fails when no step commits within twice the session
        /// timeout after a fault heals.
        #[arg(long)]
        network: bool,
        /// The campaign across hosts with each worker on this many hosts
        /// (implies --hosts): a host's fault must be failed over — a
        /// follower takes over, nothing replayed — and a recovery after
        /// one host's fault is a violation.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=3))]
        replicas: u32,
    },
    /// Measure what the sandbox and exactly-once cost, as ratios to
    /// baselines measured in the same run; prints a table.
    Bench {
        /// Small inputs, one repetition (CI).
        #[arg(long)]
        quick: bool,
        /// Write the table into this markdown file (between bench markers).
        #[arg(long)]
        markdown: Option<PathBuf>,
        /// Write an SVG chart of the ratios here.
        #[arg(long)]
        chart: Option<PathBuf>,
        /// Run only the step-log scenario: a Kafka pipeline's leader open
        /// time and the step records a host holds, against histories of
        /// 10 k, 100 k and 1 M steps (1 k and 10 k with `--quick`). Needs
        /// `--brokers`.
        #[arg(long)]
        step_log: bool,
        /// Kafka bootstrap servers for `--step-log`.
        #[arg(long, env = "SLUICE_KAFKA_BROKERS")]
        brokers: Option<String>,
        /// Run only these scenarios (NAME[,NAME…]): sandbox, step-boundary,
        /// exactly-once, checkpoint, incremental, native-peer, large-state,
        /// rescale, hosts, replicas, replay, density, durable-commit, memory,
        /// python, nexmark. Prints
        /// the table; --markdown and --chart are written only by a whole
        /// run.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Scenarios to run, as --only: `sluice bench nexmark`.
        #[arg(value_name = "SCENARIO")]
        scenarios: Vec<String>,
    },
    /// Generate benchmark input as JSON lines.
    Gen {
        /// Which data set.
        #[command(subcommand)]
        what: GenCommand,
    },
    /// Run the multi-tenant host: an HTTP API to upload components and run
    /// pipelines (see `/openapi.json`). Recovers every running pipeline on
    /// start; checkpoints them on Ctrl-C / SIGTERM.
    Serve {
        /// The server's data directory.
        #[arg(long)]
        data: PathBuf,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:7878")]
        listen: std::net::SocketAddr,
        /// A file holding the admin token (else `SLUICE_ADMIN_TOKEN`).
        #[arg(long)]
        admin_token_file: Option<PathBuf>,
        /// Size the pooling allocator for this many instances (0: allocate
        /// instances on demand).
        #[arg(long, default_value_t = 0)]
        pool: u32,
        /// Kafka brokers for pipelines created with `"log": "kafka"` (none:
        /// such pipelines are refused).
        #[arg(long, env = "SLUICE_KAFKA_BROKERS")]
        kafka_brokers: Option<String>,
        /// Replication factor of the Kafka topics the server creates
        /// (default: what the cluster offers, min(3, brokers)).
        #[arg(long)]
        kafka_replication: Option<i32>,
        #[command(flatten)]
        /// Pipelines across hosts.
        hosts: ServeHostsArgs,
        #[command(flatten)]
        /// Timeouts, connection and concurrency bounds, memory budget.
        limits: ServerLimitArgs,
    },
    /// Tenant administration on a server (admin token).
    Tenant {
        /// What to do.
        #[command(subcommand)]
        what: TenantCommand,
        #[command(flatten)]
        /// Server and token.
        conn: Connection,
    },
    /// Upload a component to a server and start a pipeline running it.
    Deploy {
        /// The component (.wasm).
        component: PathBuf,
        /// The pipeline's name.
        #[arg(long)]
        pipeline: String,
        /// The component's name on the server (default: the pipeline's).
        #[arg(long)]
        name: Option<String>,
        /// Workers W.
        #[arg(long, default_value_t = 1)]
        workers: u32,
        #[command(flatten)]
        /// Server and token.
        conn: Connection,
    },
    /// Push a JSON-lines file to a pipeline's input port, durably and
    /// exactly once: run it again after a crash (of this client, the network
    /// or the server) and it resumes after what the server acknowledged.
    Push {
        /// The pipeline.
        pipeline: String,
        /// The input port.
        port: String,
        /// The JSON-lines file.
        file: PathBuf,
        /// Lines per push request.
        #[arg(long, default_value_t = crate::client::PUSH_CHUNK)]
        chunk_lines: usize,
        /// Push the whole file again, as a new producer session (the file
        /// changed, or it is meant to be counted twice).
        #[arg(long)]
        restart: bool,
        #[command(flatten)]
        /// Server and token.
        conn: Connection,
    },
    /// Print a pipeline's output as JSON lines with positions.
    Tail {
        /// The pipeline.
        pipeline: String,
        /// The output port.
        port: String,
        /// Start after this position, STEP:WORKER:INDEX.
        #[arg(long)]
        after: Option<String>,
        /// Keep waiting for new output.
        #[arg(long, short)]
        follow: bool,
        #[command(flatten)]
        /// Server and token.
        conn: Connection,
    },
    /// Compare two versions of a circuit before one replaces the other:
    /// every stateful operator kept (its state carried over), migrated,
    /// changed (an upgrade is refused unless it starts empty), new (starts
    /// empty) or removed (its state dropped), and the ports added or
    /// removed. Exits 2 when an upgrade to NEW would be refused (1 on
    /// an error).
    Diff {
        /// The running version: a component file (`.wasm`), a pipeline's
        /// data directory (`sluice run --data`), or the name of a pipeline
        /// on a server (`--server`, `--token`).
        old: String,
        /// The new version: a component file (`.wasm`).
        new: PathBuf,
        /// Changed operators to start empty instead of refusing the
        /// upgrade (ID[,ID…]).
        #[arg(long = "start-empty", value_delimiter = ',')]
        start_empty: Vec<String>,
        /// The diff of an upgrade with --rebuild (every operator rebuilt).
        #[arg(long)]
        rebuild: bool,
        /// The server, when OLD is a pipeline.
        #[arg(long, env = "SLUICE_SERVER", default_value = "http://127.0.0.1:7878")]
        server: String,
        /// The API token, when OLD is a pipeline.
        #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// Print the diff as JSON (for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Move a pipeline to another version of its circuit, keeping the
    /// state the new version can take (`sluice diff` shows what it keeps):
    /// at the checkpoint of the pipeline's last step, the new version's
    /// instances take the old state; a changed operator refuses the
    /// upgrade, with nothing changed, unless named in --start-empty. A
    /// pipeline in a data directory (--data; a `sluice run` that finished
    /// leaves the checkpoint; `sluice run NEW --data DIR` goes on), or on a
    /// server (--pipeline: the new version is uploaded, and the pipeline
    /// checkpoints and switches), or run by `sluice host` processes
    /// (--group: their leader switches them all).
    Upgrade(crate::upgrade_args::UpgradeArgs),
    /// List the caller's pipelines (state, W, rates, lag, checkpoint,
    /// last error).
    Pipelines {
        #[command(flatten)]
        /// Server and token.
        conn: Connection,
    },
    /// List the caller's components.
    Components {
        #[command(flatten)]
        /// Server and token.
        conn: Connection,
    },
    /// Show one pipeline's status, or all of the caller's.
    Status {
        /// The pipeline (all when omitted).
        pipeline: Option<String>,
        #[command(flatten)]
        /// Server and token.
        conn: Connection,
    },
    /// Change a pipeline's number of workers on a server: it changes its
    /// layout between two steps, moving only the shards the new balance
    /// needs (1/(W+1) of the keyed state for W → W+1), without a stop.
    Scale {
        /// The pipeline.
        pipeline: String,
        /// The new number of workers W.
        workers: u32,
        #[command(flatten)]
        /// Server and token.
        conn: Connection,
    },
    /// Start (or restart after a failure) a pipeline on a server.
    Start {
        /// The pipeline.
        pipeline: String,
        #[command(flatten)]
        /// Server and token.
        conn: Connection,
    },
    /// Pause a pipeline on a server (instances kept, no steps).
    Pause {
        /// The pipeline.
        pipeline: String,
        #[command(flatten)]
        /// Server and token.
        conn: Connection,
    },
    /// Stop a pipeline on a server (checkpoint, then unload).
    Stop {
        /// The pipeline.
        pipeline: String,
        #[command(flatten)]
        /// Server and token.
        conn: Connection,
    },
    /// Delete a pipeline and its data on a server.
    Delete {
        /// The pipeline.
        pipeline: String,
        #[command(flatten)]
        /// Server and token.
        conn: Connection,
    },
    /// Build the word-count example and run it on bundled text.
    Demo {
        /// Workers W.
        #[arg(long, default_value_t = 2)]
        workers: u32,
        /// Append the bundled text this many times.
        #[arg(long, default_value_t = 50)]
        repeat: u32,
        /// Keep the pipeline's data here instead of a temporary directory.
        #[arg(long)]
        data: Option<PathBuf>,
        /// Also write the final counts as a JSON object to this file.
        #[arg(long)]
        save_counts: Option<PathBuf>,
        /// How many top words to print.
        #[arg(long, default_value_t = 10)]
        top: usize,
    },
}

/// Data sets `sluice gen` writes.
#[derive(Debug, Subcommand)]
pub enum GenCommand {
    /// Nexmark: person.jsonl, auction.jsonl and bid.jsonl (deterministic).
    Nexmark {
        /// Number of events (all three kinds together).
        #[arg(long, default_value_t = 100_000)]
        events: u64,
        /// Events per second of event time (spaces the timestamps).
        #[arg(long, default_value_t = 10_000)]
        rate: u32,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
    },
}

/// Arguments of `sluice run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The component (.wasm) to run.
    pub component: PathBuf,
    /// The pipeline's data directory (created if missing).
    #[arg(long)]
    pub data: PathBuf,
    /// Number of workers W (default: 1 for a new pipeline, else what it
    /// runs with). Another W than an existing pipeline's rescales it after
    /// recovery: the layout changes, moving only the shards the new balance
    /// needs.
    #[arg(long)]
    pub workers: Option<u32>,
    /// Partitions of each input of a new pipeline (default: W, at least 8);
    /// fixed for its life. Existing Kafka topics keep theirs.
    #[arg(long, alias = "input-partitions")]
    pub partitions: Option<u32>,
    /// PORT=FILE: append FILE's JSON lines to input PORT (repeatable).
    #[arg(long = "input", value_parser = port_file)]
    pub inputs: Vec<(String, PathBuf)>,
    /// PORT=FILE: write output PORT's log to FILE as JSON lines (repeatable;
    /// `INPUT.dead-letter` writes input INPUT's dead-letter log).
    #[arg(long = "output", value_parser = port_file)]
    pub outputs: Vec<(String, PathBuf)>,
    /// Read each --input file where it is, as its input's log, instead of
    /// copying it into the log (embedded log; one file per input, one
    /// event per line): no copy to write, but the file must stay as it is
    /// (appending lines is fine) for as long as the pipeline may replay it,
    /// and its bad lines are found when a step reads them.
    #[arg(long)]
    pub read_in_place: bool,
    /// Steps and checkpoints.
    #[command(flatten)]
    pub steps: StepArgs,
    /// Write every checkpoint whole, instead of only the shards changed
    /// since the previous one.
    #[arg(long)]
    pub full_checkpoints: bool,
    /// Check that every output value is JSON before committing it (a
    /// circuit built with the SDK always writes JSON).
    #[arg(long)]
    pub check_output_json: bool,
    /// Memory limit per instance, in MiB.
    #[arg(long, default_value_t = 1024)]
    pub memory_mib: usize,
    /// Fuel per call into the guest (deterministic CPU bound).
    #[arg(long, default_value_t = Limits::default().fuel_per_call)]
    pub fuel: u64,
    /// Wall-clock deadline per call into the guest, in seconds.
    #[arg(long, default_value_t = 120)]
    pub deadline_secs: u64,
    /// No progress bars and no summary.
    #[arg(long, short)]
    pub quiet: bool,
    /// Where the input, output and step logs live: `embedded` or `kafka`.
    #[arg(long, default_value_t = LogKind::Embedded)]
    pub log: LogKind,
    /// Keep checkpoints in this object store instead of --data:
    /// `file:///shared/dir` or `s3://bucket/prefix` (S3 settings from the
    /// AWS_* variables). With `--log kafka`, any machine that reaches the
    /// brokers and the store can take the pipeline over, with a data
    /// directory of its own. (--data keeps a copy of this host's newest
    /// checkpoints, restored without downloading.)
    #[arg(long, env = "SLUICE_CHECKPOINT_STORE")]
    pub store: Option<String>,
    /// Kafka settings (with `--log kafka`).
    #[command(flatten)]
    pub kafka: KafkaArgs,
}

/// How big steps are, how often checkpoints come and what a record that
/// is not an event does (`sluice run`, `sluice host`).
#[derive(Debug, Clone, clap::Args)]
pub struct StepArgs {
    /// At most this many events per input partition per step.
    #[arg(long, default_value_t = 10_000)]
    pub max_batch: u64,
    /// Checkpoint every N committed steps.
    #[arg(long, default_value_t = 100)]
    pub checkpoint_every: u64,
    /// …or every this many milliseconds, whichever comes first.
    #[arg(long, default_value_t = 10_000)]
    pub checkpoint_interval_ms: u64,
    /// PORT=POLICY: what a record of input PORT that is not an event (not
    /// JSON, a bad `sluice-weight` header, a bad line of an --input file)
    /// does: `fail` (the default: the pipeline stops, naming the record's
    /// position) or `dead-letter` (it is skipped and written, with its
    /// position and why, to the log `PORT.dead-letter` — on Kafka the topic
    /// `<pipeline>.PORT.dead-letter` — in the step's own commit).
    /// Repeatable; every host of a pipeline should be given the same.
    #[arg(long = "bad-records", value_parser = port_policy)]
    pub bad_records: Vec<(String, sluice_core::BadRecordPolicy)>,
    /// Keep all input (no checkpoint trims it; kept in the pipeline's
    /// metadata once given), so that `sluice upgrade --rebuild` can
    /// rebuild a new version's operators from it.
    #[arg(long)]
    pub retain_input: bool,
}

impl StepArgs {
    /// Options with these steps and checkpoints (incremental, guests'
    /// stderr shown, output trusted as JSON); the pipeline's identity is
    /// `name` until the pipeline names it.
    pub fn options(&self, name: &str) -> sluice_runtime::PipelineOptions {
        sluice_runtime::PipelineOptions {
            name: name.to_owned(),
            max_batch: self.max_batch,
            checkpoint_every_steps: self.checkpoint_every,
            checkpoint_interval: std::time::Duration::from_millis(self.checkpoint_interval_ms),
            inherit_guest_stderr: true,
            bad_records: self.bad_records.iter().cloned().collect(),
            retain_input: self.retain_input,
            ..sluice_runtime::PipelineOptions::default()
        }
    }
}

/// Arguments of `sluice serve` for pipelines across hosts.
#[derive(Debug, clap::Args)]
pub struct ServeHostsArgs {
    /// etcd endpoints, URL[,URL…]: the server runs pipelines created with
    /// `"across_hosts": true` as one of their hosts, with every server
    /// given the same settings (needs --kafka-brokers and --hosts-store).
    #[arg(long, env = "SLUICE_HOSTS_ETCD", value_delimiter = ',')]
    pub hosts_etcd: Vec<String>,
    /// The checkpoint store every server reaches (s3://bucket/prefix, or
    /// file:///dir on shared storage); each pipeline's under its Kafka name.
    #[arg(long, env = "SLUICE_HOSTS_STORE")]
    pub hosts_store: Option<String>,
    /// The secret the servers share, from this file (else
    /// `SLUICE_HOST_SECRET`); at least 16 bytes.
    #[arg(long)]
    pub hosts_secret_file: Option<std::path::PathBuf>,
    /// The address the other servers reach this one at (required with
    /// --hosts-etcd): each pipeline's worker server binds it, on a port of
    /// its own.
    #[arg(long)]
    pub hosts_bind: Option<std::net::IpAddr>,
    /// This server's name in the pipelines' groups, unique among the
    /// servers and stable across restarts (required with --hosts-etcd).
    #[arg(long)]
    pub hosts_name: Option<String>,
    /// A server that renews nothing for this long leaves a pipeline's
    /// group, in milliseconds; at least 2000.
    #[arg(long, default_value_t = 3_000)]
    pub hosts_session_timeout_ms: u64,
    /// This server's failure domain (a rack, an availability zone): the
    /// replicas of each worker of a pipeline across hosts go to servers in
    /// different zones where they can.
    #[arg(long, value_parser = zone_label)]
    pub hosts_zone: Option<String>,
    /// This server's TLS certificate chain (PEM): with `--hosts-tls-key`
    /// and `--hosts-tls-ca`, every connection between the servers of a
    /// pipeline is mutual TLS. The certificate must name `--hosts-bind`.
    #[arg(long, requires_all = ["hosts_tls_key", "hosts_tls_ca"])]
    pub hosts_tls_cert: Option<std::path::PathBuf>,
    /// This server's TLS private key (PEM).
    #[arg(long, requires_all = ["hosts_tls_cert", "hosts_tls_ca"])]
    pub hosts_tls_key: Option<std::path::PathBuf>,
    /// The certificate authority (PEM) every server's certificate must
    /// chain to.
    #[arg(long, requires_all = ["hosts_tls_cert", "hosts_tls_key"])]
    pub hosts_tls_ca: Option<std::path::PathBuf>,
}

/// Arguments of `sluice host`.
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    /// The component (.wasm) to run: the same on every host.
    pub component: PathBuf,
    /// This host's name in the group (stable across restarts; default: the
    /// listen address).
    #[arg(long)]
    pub name: Option<String>,
    /// Where this host's worker server listens; other hosts connect here
    /// unless `--advertise` names another address.
    #[arg(long)]
    pub listen: std::net::SocketAddr,
    /// The address the other hosts dial to reach this one, when it is not
    /// `--listen` (behind NAT, a container's port mapping, a proxy).
    #[arg(long)]
    pub advertise: Option<std::net::SocketAddr>,
    /// etcd endpoints for the group, URL[,URL…].
    #[arg(long, env = "SLUICE_ETCD", value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// A host that renews nothing for this long leaves the group (etcd
    /// lease), in milliseconds; at least 2000.
    #[arg(long, default_value_t = 3_000)]
    pub session_timeout_ms: u64,
    /// The pipeline's shared secret, from this file (else
    /// `SLUICE_HOST_SECRET`): hosts accept coordinators that prove it.
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// This host's TLS certificate chain (PEM): with `--tls-key` and
    /// `--tls-ca`, every connection between the hosts is mutual TLS. The
    /// certificate must name the `--listen` address's host.
    #[arg(long, env = "SLUICE_TLS_CERT", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// This host's TLS private key (PEM).
    #[arg(long, env = "SLUICE_TLS_KEY", requires_all = ["tls_cert", "tls_ca"])]
    pub tls_key: Option<PathBuf>,
    /// The certificate authority (PEM) every host's certificate must chain
    /// to.
    #[arg(long, env = "SLUICE_TLS_CA", requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    /// This host's data directory (a leader's metadata and its local copy
    /// of checkpoints).
    #[arg(long)]
    pub data: PathBuf,
    /// This host may read the pipeline's Kafka topics but not write them
    /// (ACLs granting it no `sluice.NAME.` transactional id): its workers
    /// read their own input, the leader commits their output, and it never
    /// leads.
    #[arg(long)]
    pub read_only_log: bool,
    /// Number of workers W across all hosts (of a new pipeline; an
    /// existing one with another W changes layout).
    #[arg(long, default_value_t = 1)]
    pub workers: u32,
    /// Run each worker on this many hosts at once (never two on one host;
    /// with fewer hosts, on every host): the leader's host commits one
    /// replica's output, the others step beside it and their output's hash
    /// is checked every step — a difference stops the pipeline as
    /// nondeterministic. Every host should be given the same.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub replicas: u32,
    /// This host's failure domain (a rack, an availability zone): the
    /// leader places the replicas of each worker in different zones where
    /// it can (hosts without a zone count as a zone each).
    #[arg(long, value_parser = zone_label)]
    pub zone: Option<String>,
    /// Partitions of each input of a new pipeline.
    #[arg(long)]
    pub partitions: Option<u32>,
    /// PORT=FILE: a leader appends FILE to input PORT (exactly once across
    /// hosts; repeatable).
    #[arg(long = "input", value_parser = port_file)]
    pub inputs: Vec<(String, PathBuf)>,
    /// Steps and checkpoints.
    #[command(flatten)]
    pub steps: StepArgs,
    /// The object store of the checkpoints (`s3://bucket/prefix`,
    /// `file:///shared/dir`): every host must reach it.
    #[arg(long, env = "SLUICE_CHECKPOINT_STORE")]
    pub store: String,
    /// Kafka settings (the logs are in Kafka).
    #[command(flatten)]
    pub kafka: KafkaArgs,
}

/// Tenant administration.
#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Create a tenant; prints its API token (shown once).
    Create {
        /// The tenant's name.
        name: String,
    },
    /// Issue a new token for a tenant (the old one stops working); prints
    /// it (shown once).
    Rotate {
        /// The tenant's name.
        name: String,
    },
    /// Delete a tenant with its pipelines, components, logs, checkpoints
    /// and Kafka topics.
    Delete {
        /// The tenant's name.
        name: String,
    },
    /// Show the host's budgets and every tenant's usage.
    List,
}

/// `sluice serve`'s bounds (the README's "Limits and quotas" table).
#[derive(Debug, Clone, clap::Args)]
pub struct ServerLimitArgs {
    /// A client must send a request's headers within this many ms (an idle
    /// keep-alive connection closes after it too).
    #[arg(long, default_value_t = 10_000)]
    pub header_timeout_ms: u64,
    /// A client must send a request's body within this many ms (408).
    #[arg(long, default_value_t = 60_000)]
    pub body_timeout_ms: u64,
    /// Connections served at once (more wait in the listen backlog).
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Pushes in flight at once, all tenants together (429 past it).
    #[arg(long, default_value_t = 8)]
    pub max_pushes: usize,
    /// Long-polls and output streams open at once, all tenants (429).
    #[arg(long, default_value_t = 256)]
    pub max_streams: usize,
    /// Components compiled at once (default: half the cores, at least 1).
    #[arg(long)]
    pub max_compiles: Option<usize>,
    /// How long compiling one component may take, in ms (422 after).
    #[arg(long, default_value_t = 120_000)]
    pub compile_timeout_ms: u64,
    /// Memory the host promises pipelines' instances, in MiB (default:
    /// three quarters of the machine's).
    #[arg(long)]
    pub memory_budget_mib: Option<u64>,
}

impl ServerLimitArgs {
    /// The server's limits.
    pub fn limits(&self) -> sluice_server::limits::ServerLimits {
        let d = sluice_server::limits::ServerLimits::default();
        sluice_server::limits::ServerLimits {
            header_timeout: std::time::Duration::from_millis(self.header_timeout_ms),
            body_timeout: std::time::Duration::from_millis(self.body_timeout_ms),
            max_connections: self.max_connections,
            max_pushes: self.max_pushes,
            max_streams: self.max_streams,
            max_compiles: self.max_compiles.unwrap_or(d.max_compiles),
            compile_timeout: std::time::Duration::from_millis(self.compile_timeout_ms),
            memory_budget: self
                .memory_budget_mib
                .map_or(d.memory_budget, |m| m.saturating_mul(1 << 20)),
        }
    }
}

/// Which server, as whom.
#[derive(Debug, Clone, clap::Args)]
pub struct Connection {
    /// The server's URL.
    #[arg(long, env = "SLUICE_SERVER", default_value = "http://127.0.0.1:7878")]
    pub server: String,
    /// The API token (a tenant's, or the admin's for `tenant`).
    #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true)]
    pub token: String,
    /// Print the server's JSON (for scripts) instead of a view for people.
    #[arg(long, global = true)]
    pub json: bool,
    /// `json` is `--json`; `human` (the default) the view for people.
    #[arg(short = 'o', long = "output-format", global = true, value_parser = ["human", "json"], default_value = "human")]
    pub format: String,
}

impl Connection {
    /// Whether to print JSON for scripts.
    pub fn wants_json(&self) -> bool {
        self.json || self.format == "json"
    }

    /// A client of the server as this caller.
    pub fn client(&self) -> crate::client::Client {
        crate::client::Client::new(&self.server, &self.token)
    }
}

/// Where and how a pipeline's logs live in Kafka (`--log kafka`).
#[derive(Debug, Clone, clap::Args)]
pub struct KafkaArgs {
    /// Kafka bootstrap servers, HOST:PORT[,HOST:PORT…].
    #[arg(long, env = "SLUICE_KAFKA_BROKERS")]
    pub brokers: Option<String>,
    /// The pipeline's name: every host running it uses the same one (it
    /// names the transactional ids that fence other hosts, and the default
    /// topics `<pipeline>.<port>`).
    #[arg(long)]
    pub pipeline: Option<String>,
    /// PORT=TOPIC: the topic of an input or output port (repeatable;
    /// default `<pipeline>.<port>`).
    #[arg(long = "topic", value_parser = port_topic)]
    pub topics: Vec<(String, String)>,
    /// PORT=TOPIC: the dead-letter topic of input PORT, for its records
    /// skipped under `--bad-records PORT=dead-letter` (repeatable; default
    /// `<pipeline>.PORT.dead-letter`).
    #[arg(long = "dead-letter-topic", value_parser = port_topic)]
    pub dead_letter_topics: Vec<(String, String)>,
    /// Partitions of output topics Sluice creates.
    #[arg(long, default_value_t = 1)]
    pub output_partitions: u32,
    /// Replication factor of topics Sluice creates (default: what the
    /// cluster offers, min(3, brokers), with a warning when that is 1).
    #[arg(long)]
    pub replication: Option<i32>,
    /// KEY=VALUE: a librdkafka setting for every Kafka client, e.g.
    /// security.protocol=SASL_SSL (repeatable).
    #[arg(long = "kafka-config", value_parser = key_value)]
    pub client: Vec<(String, String)>,
    /// Trim the input topics named with --topic too, after checkpoints
    /// (by default only the pipeline's own `<pipeline>.<port>` topics are:
    /// a named topic may have other readers).
    #[arg(long)]
    pub trim_named_topics: bool,
    /// Accept input topics with cleanup.policy=compact (refused by default:
    /// compaction may remove records a committed step read; safe only when
    /// keys never repeat).
    #[arg(long)]
    pub allow_compacted_inputs: bool,
    /// How many of the step topic's records each host keeps in memory (a
    /// window of the newest; older ones are read back from the topic when
    /// a recovery or a reader asks for them). At least 2.
    #[arg(long, default_value_t = STEP_WINDOW, value_parser = clap::value_parser!(u32).range(2..))]
    pub step_window: u32,
}

impl KafkaArgs {
    /// The logs `--log kind` asks for, or why the flags do not make them.
    pub fn log_config(&self, kind: LogKind) -> anyhow::Result<LogConfig> {
        match kind {
            LogKind::Embedded => Ok(LogConfig::default()),
            #[cfg(feature = "kafka")]
            LogKind::Kafka => {
                let brokers = self.brokers.clone().ok_or_else(|| {
                    anyhow::anyhow!(
                        "--log kafka needs --brokers HOST:PORT (or SLUICE_KAFKA_BROKERS)"
                    )
                })?;
                let pipeline = self.pipeline.clone().ok_or_else(|| {
                    anyhow::anyhow!(
                        "--log kafka needs --pipeline NAME: the name every host running this \
                         pipeline shares"
                    )
                })?;
                let mut config = sluice_kafka::KafkaConfig::new(brokers, pipeline);
                for (port, topic) in &self.topics {
                    sluice_kafka::validate_topic(topic)?;
                    config.topics.insert(port.clone(), topic.clone());
                }
                for (port, topic) in &self.dead_letter_topics {
                    sluice_kafka::validate_topic(topic)?;
                    let log = sluice_core::dead_letter_log(port);
                    config.topics.insert(log, topic.clone());
                }
                config.output_partitions = self.output_partitions.max(1);
                config.replication = self.replication.unwrap_or(0);
                config.client = self.client.clone();
                config.trim_named_topics = self.trim_named_topics;
                config.allow_compacted_inputs = self.allow_compacted_inputs;
                config.step_window = self.step_window as usize;
                Ok(LogConfig::Kafka { config })
            }
            #[cfg(not(feature = "kafka"))]
            LogKind::Kafka => {
                anyhow::bail!("this sluice was built without Kafka support (cargo feature `kafka`)")
            }
        }
    }
}

#[cfg(all(test, feature = "kafka"))]
mod step_window_tests {
    #[test]
    fn the_default_step_window_is_the_kafka_logs() {
        assert_eq!(super::STEP_WINDOW as usize, sluice_kafka::STEP_WINDOW);
    }
}
