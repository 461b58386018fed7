//! The `sluice` command line.

use crate::runtime::pipeline::{RunRequest, run};
use crate::runtime::{Limits, PipelineOptions};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

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
    /// Build the circuit crate at PATH for wasm32-wasip2; prints the
    /// component's path as the last line.
    Build {
        /// The crate directory (or its Cargo.toml).
        path: PathBuf,
        /// Cargo target directory (default: cargo's).
        #[arg(long)]
        target_dir: Option<PathBuf>,
    },
    /// Append input files to a pipeline's input logs, run until all input is
    /// consumed and committed, and write the output logs. Run again on the
    /// same --data after a crash: it recovers and finishes.
    Run(RunArgs),
    /// Audit a pipeline's logs offline; exits non-zero naming the first
    /// violation.
    Verify {
        /// The pipeline's data directory.
        #[arg(long)]
        data: PathBuf,
    },
    /// Print an output log with every event's position and the input
    /// frontier it covers, optionally resuming after a position.
    Read {
        /// The pipeline's data directory.
        #[arg(long)]
        data: PathBuf,
        /// The output port.
        #[arg(long)]
        output: String,
        /// Resume after this position, STEP:WORKER:INDEX.
        #[arg(long, value_parser = position)]
        after: Option<crate::storage::OutputPosition>,
        /// At most this many events.
        #[arg(long, default_value_t = usize::MAX)]
        limit: usize,
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
        /// Workers W.
        #[arg(long, default_value_t = 2)]
        workers: u32,
        /// Orders per trial.
        #[arg(long, default_value_t = 1500)]
        orders: u32,
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
        /// Replication factor of the Kafka topics the server creates.
        #[arg(long, default_value_t = 1)]
        kafka_replication: i32,
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
    /// Push a JSON-lines file to a pipeline's input port (durably, once).
    Push {
        /// The pipeline.
        pipeline: String,
        /// The input port.
        port: String,
        /// The JSON-lines file.
        file: PathBuf,
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
    /// Show one pipeline's status, or all of the caller's.
    Status {
        /// The pipeline (all when omitted).
        pipeline: Option<String>,
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
    /// Number of workers W (fixed for the life of the data directory).
    #[arg(long, default_value_t = 1)]
    pub workers: u32,
    /// PORT=FILE: append FILE's JSON lines to input PORT (repeatable).
    #[arg(long = "input", value_parser = port_file)]
    pub inputs: Vec<(String, PathBuf)>,
    /// PORT=FILE: write output PORT's log to FILE as JSON lines (repeatable).
    #[arg(long = "output", value_parser = port_file)]
    pub outputs: Vec<(String, PathBuf)>,
    /// At most this many events per input partition per step.
    #[arg(long, default_value_t = 10_000)]
    pub max_batch: u64,
    /// Checkpoint every N committed steps.
    #[arg(long, default_value_t = 100)]
    pub checkpoint_every: u64,
    /// …or every this many milliseconds, whichever comes first.
    #[arg(long, default_value_t = 10_000)]
    pub checkpoint_interval_ms: u64,
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
    /// Where the input, output and step logs live (checkpoints stay in
    /// --data).
    #[arg(long, value_enum, default_value_t = LogKind::Embedded)]
    pub log: LogKind,
    /// Kafka settings (with `--log kafka`).
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
}

impl Connection {
    fn client(&self) -> crate::client::Client {
        crate::client::Client::new(&self.server, &self.token)
    }
}

/// The log backends `sluice run --log` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogKind {
    /// RocksDB in the data directory.
    Embedded,
    /// Kafka topics (needs --brokers and --pipeline).
    Kafka,
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
    /// Partitions of input topics Sluice creates (default: W).
    #[arg(long)]
    pub input_partitions: Option<u32>,
    /// Partitions of output topics Sluice creates.
    #[arg(long, default_value_t = 1)]
    pub output_partitions: u32,
    /// Replication factor of topics Sluice creates.
    #[arg(long, default_value_t = 1)]
    pub replication: i32,
    /// KEY=VALUE: a librdkafka setting for every Kafka client, e.g.
    /// security.protocol=SASL_SSL (repeatable).
    #[arg(long = "kafka-config", value_parser = key_value)]
    pub client: Vec<(String, String)>,
}

impl KafkaArgs {
    /// The log choice for `--log kind`, or why the flags do not make one.
    pub fn choice(&self, kind: LogKind) -> anyhow::Result<crate::runtime::pipeline::LogChoice> {
        use crate::runtime::pipeline::LogChoice;
        match kind {
            LogKind::Embedded => Ok(LogChoice::Embedded),
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
                let mut config = crate::storage::KafkaConfig::new(brokers, pipeline);
                for (port, topic) in &self.topics {
                    crate::storage::log::validate_topic(topic)?;
                    config.topics.insert(port.clone(), topic.clone());
                }
                config.output_partitions = self.output_partitions.max(1);
                config.replication = self.replication;
                config.client = self.client.clone();
                Ok(LogChoice::Kafka {
                    config,
                    input_partitions: self.input_partitions,
                })
            }
            #[cfg(not(feature = "kafka"))]
            LogKind::Kafka => {
                anyhow::bail!("this sluice was built without Kafka support (cargo feature `kafka`)")
            }
        }
    }
}

fn port_topic(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((port, topic)) if !port.is_empty() && !topic.is_empty() => {
            Ok((port.to_owned(), topic.to_owned()))
        }
        _ => Err(format!("expected PORT=TOPIC, got {s:?}")),
    }
}

fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

fn position(s: &str) -> Result<crate::storage::OutputPosition, String> {
    let parts: Vec<&str> = s.split(':').collect();
    match parts.as_slice() {
        [step, worker, index] => Ok(crate::storage::OutputPosition {
            step: step.parse().map_err(|e| format!("step: {e}"))?,
            worker: worker.parse().map_err(|e| format!("worker: {e}"))?,
            index: index.parse().map_err(|e| format!("index: {e}"))?,
        }),
        _ => Err(format!("expected STEP:WORKER:INDEX, got {s:?}")),
    }
}

fn port_file(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((port, file)) if !port.is_empty() && !file.is_empty() => {
            Ok((port.to_owned(), PathBuf::from(file)))
        }
        _ => Err(format!("expected PORT=FILE, got {s:?}")),
    }
}

async fn control(conn: Connection, pipeline: String, action: &'static str) -> anyhow::Result<()> {
    let c = conn.client();
    println!(
        "{}",
        tokio::task::spawn_blocking(move || c.control(&pipeline, action)).await??
    );
    Ok(())
}

/// Runs a parsed command line.
pub async fn main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Build { path, target_dir } => {
            let wasm = tokio::task::spawn_blocking(move || {
                crate::compile::build_component(&path, target_dir.as_deref())
            })
            .await??;
            println!("{}", wasm.display());
        }
        Command::Run(a) => {
            for (_, file) in &a.inputs {
                if !file.is_file() {
                    anyhow::bail!("input file {} does not exist", file.display());
                }
            }
            let log = a.kafka.choice(a.log)?;
            let report = run(RunRequest {
                log,
                component: a.component,
                data: a.data,
                workers: a.workers,
                inputs: a.inputs,
                outputs: a.outputs,
                options: PipelineOptions {
                    name: "run".into(),
                    max_batch: a.max_batch,
                    checkpoint_every_steps: a.checkpoint_every,
                    checkpoint_interval: Duration::from_millis(a.checkpoint_interval_ms),
                    inherit_guest_stderr: true,
                    config: vec![],
                    max_output_per_step: None,
                },
                limits: Limits {
                    memory: a.memory_mib << 20,
                    fuel_per_call: a.fuel,
                    deadline: Duration::from_secs(a.deadline_secs),
                },
                progress: !a.quiet,
            })
            .await?;
            if !a.quiet {
                let s = &report.stats;
                let appended: u64 = report.ingested.iter().map(|i| i.appended).sum();
                let recovered = match s.restored_checkpoint {
                    Some(step) => format!(
                        "restored the checkpoint of step {step}, replayed {} steps",
                        s.replayed_steps
                    ),
                    None if s.replayed_steps > 0 => {
                        format!("no checkpoint, replayed {} steps", s.replayed_steps)
                    }
                    None => "started fresh".to_owned(),
                };
                eprintln!(
                    "appended {appended} events; {recovered}; committed {} steps ({} in total) and {} checkpoints; \
                     {} events in, {} out; {:.0} events/s",
                    s.steps,
                    report.total_steps,
                    s.checkpoints,
                    s.events_in,
                    s.events_out,
                    report.events_per_second()
                );
            }
        }
        Command::Serve {
            data,
            listen,
            admin_token_file,
            pool,
            kafka_brokers,
            kafka_replication,
        } => {
            let admin_token = match admin_token_file {
                Some(f) => std::fs::read_to_string(&f).map_err(|e| {
                    anyhow::anyhow!("reading the admin token from {}: {e}", f.display())
                })?,
                None => std::env::var("SLUICE_ADMIN_TOKEN").map_err(|_| {
                    anyhow::anyhow!(
                        "no admin token: set SLUICE_ADMIN_TOKEN or pass --admin-token-file FILE \
                         (there is no default)"
                    )
                })?,
            };
            crate::server::serve(crate::server::ServeOptions {
                data,
                listen,
                admin_token: admin_token.trim().to_owned(),
                pool,
                kafka: kafka_brokers.map(|brokers| crate::server::runner::KafkaSettings {
                    brokers,
                    replication: kafka_replication,
                }),
            })
            .await?;
        }
        Command::Tenant { what, conn } => match what {
            TenantCommand::Create { name } => {
                let c = conn.client();
                println!(
                    "{}",
                    tokio::task::spawn_blocking(move || c.create_tenant(&name)).await??
                );
            }
        },
        Command::Deploy {
            component,
            pipeline,
            name,
            workers,
            conn,
        } => {
            let c = conn.client();
            let name = name.unwrap_or_else(|| pipeline.clone());
            let out = tokio::task::spawn_blocking(move || {
                c.deploy(&component, &name, &pipeline, workers, true)
            })
            .await??;
            println!("{out}");
        }
        Command::Push {
            pipeline,
            port,
            file,
            conn,
        } => {
            let c = conn.client();
            let n = tokio::task::spawn_blocking(move || c.push(&pipeline, &port, &file, true))
                .await??;
            eprintln!("appended {n} events");
        }
        Command::Tail {
            pipeline,
            port,
            after,
            follow,
            conn,
        } => {
            let c = conn.client();
            tokio::task::spawn_blocking(move || c.tail(&pipeline, &port, after, follow)).await??;
        }
        Command::Status { pipeline, conn } => {
            let c = conn.client();
            println!(
                "{}",
                tokio::task::spawn_blocking(move || c.status(pipeline.as_deref())).await??
            );
        }
        Command::Start { pipeline, conn } => control(conn, pipeline, "start").await?,
        Command::Pause { pipeline, conn } => control(conn, pipeline, "pause").await?,
        Command::Stop { pipeline, conn } => control(conn, pipeline, "stop").await?,
        Command::Delete { pipeline, conn } => {
            let c = conn.client();
            tokio::task::spawn_blocking(move || c.delete(&pipeline)).await??;
        }
        Command::Verify { data } => {
            if !data.join("db").is_dir() {
                anyhow::bail!("{} holds no pipeline (no db directory)", data.display());
            }
            let database = crate::storage::db::open(&data)?;
            match crate::storage::verify::verify(&database)? {
                crate::storage::verify::Verdict::Consistent(s) => println!(
                    "consistent: {} steps, {} output entries, checkpoints {:?}",
                    s.steps, s.entries, s.checkpoints
                ),
                crate::storage::verify::Verdict::Violation(v) => anyhow::bail!("violation: {v}"),
            }
        }
        Command::Read {
            data,
            output,
            after,
            limit,
        } => {
            if !data.join("db").is_dir() {
                anyhow::bail!("{} holds no pipeline (no db directory)", data.display());
            }
            let database = crate::storage::db::open(&data)?;
            let meta = crate::storage::meta::load(&database)?
                .ok_or_else(|| anyhow::anyhow!("no pipeline metadata"))?;
            if !meta.outputs.contains(&output) {
                anyhow::bail!(
                    "unknown output port `{output}`; the pipeline has [{}]",
                    meta.outputs.join(", ")
                );
            }
            let log = crate::storage::EmbeddedLog::open(database)?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            for e in crate::storage::read_output(&log, &output, after, limit)? {
                let value: serde_json::Value = serde_json::from_slice(&e.event.value)?;
                let frontier: Vec<serde_json::Value> = e
                    .frontier
                    .iter()
                    .map(|(id, offset)| {
                        serde_json::json!({"input": meta.inputs[id.input as usize].0, "partition": id.partition, "offset": offset})
                    })
                    .collect();
                let op = if e.event.weight >= 0 {
                    "insert"
                } else {
                    "delete"
                };
                let mut line =
                    serde_json::json!({"position": e.position, "frontier": frontier, op: value});
                if e.event.weight.unsigned_abs() > 1 {
                    line["weight"] = e.event.weight.unsigned_abs().into();
                }
                use std::io::Write;
                writeln!(out, "{line}")?;
            }
        }
        Command::Chaos {
            trials,
            seed,
            component,
            workers,
            orders,
        } => {
            let component = match component {
                Some(c) => c,
                None => {
                    let src = crate::demo::wordcount_dir().join("..").join("orders-join");
                    let target = crate::runtime::SluiceEngine::default_cache_dir()
                        .unwrap_or_else(std::env::temp_dir)
                        .join("guest-target");
                    tokio::task::spawn_blocking(move || {
                        crate::compile::build_component(&src, Some(&target))
                    })
                    .await??
                }
            };
            let exe = std::env::current_exe()?;
            let opts = crate::chaos::ChaosOptions {
                trials,
                seed,
                component,
                workers,
                orders,
                progress: true,
            };
            let report =
                tokio::task::spawn_blocking(move || crate::chaos::chaos(&exe, &opts)).await??;
            println!("{report}");
            if report.violations() > 0 {
                anyhow::bail!("{} violations of exactly-once", report.violations());
            }
        }
        Command::Bench {
            quick,
            markdown,
            chart,
        } => {
            crate::bench::bench(&crate::bench::BenchOptions {
                quick,
                markdown,
                chart,
            })
            .await?;
        }
        Command::Gen {
            what: GenCommand::Nexmark { events, rate, out },
        } => {
            let bar = indicatif::ProgressBar::new(events);
            let files = tokio::task::spawn_blocking(move || {
                crate::generate::gen_nexmark(events, rate, &out, &bar)
            })
            .await??;
            for (path, n) in [files.person, files.auction, files.bid] {
                println!("{n:>10}  {}", path.display());
            }
        }
        Command::Demo {
            workers,
            repeat,
            data,
            save_counts,
            top,
        } => {
            crate::demo::demo(crate::demo::DemoOptions {
                workers,
                repeat,
                data,
                save_counts,
                top,
                progress: true,
            })
            .await?;
        }
    }
    Ok(())
}
