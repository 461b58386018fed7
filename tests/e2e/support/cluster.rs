//! A pipeline across `sluice host` processes, for the cluster tests and
//! the fault campaign: the hosts (started, signalled, restarted under
//! their names), an independent `read_committed` consumer (`kcat`) of the
//! output and the step log, the input and its recount, and a broker of a
//! test's own (to restart).

use crate::kafka::{brokers, fresh_name};
use crate::support::{component, recount, s3_endpoint, sluice_cmd};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// etcd for the group (scripts/test.sh starts one), or `None` outside CI.
pub fn etcd_endpoint() -> Option<String> {
    match std::env::var("SLUICE_ETCD_ENDPOINT") {
        Ok(e) if !e.is_empty() => Some(e),
        _ if std::env::var_os("CI").is_some() => {
            panic!("CI is set but SLUICE_ETCD_ENDPOINT is not: scripts/test.sh must start etcd")
        }
        _ => None,
    }
}

/// The Kafka brokers and the etcd endpoint a cluster test runs against
/// (with the S3 server), or `None` — the test is skipped, outside CI.
pub fn parts() -> Option<(String, String)> {
    let brokers = brokers()?;
    let (Some(_), Some(etcd)) = (s3_endpoint(), etcd_endpoint()) else {
        eprintln!("skipped: needs SLUICE_S3_ENDPOINT and SLUICE_ETCD_ENDPOINT");
        return None;
    };
    Some((brokers, etcd))
}

/// The line a host's log has before each of its runs.
const STARTED: &str = "--- (test) the host starts";

pub const WORKERS: u32 = 3;
pub const SESSION_MS: u64 = 2_000;

/// The `sluice serve` flags that make server `name` one host of the
/// pipelines across hosts on `brokers`, etcd `etcd` and checkpoint store
/// `store`, sharing the secret in file `secret`; with `tls`, mutual TLS
/// between the servers (the fixtures' certificate names 127.0.0.1).
pub fn server_host_args(
    name: &str,
    brokers: &str,
    etcd: &str,
    store: &str,
    secret: &Path,
    tls: bool,
) -> Vec<String> {
    let mut args = vec![
        format!("--kafka-brokers={brokers}"),
        format!("--hosts-etcd={etcd}"),
        format!("--hosts-store={store}"),
        format!("--hosts-secret-file={}", secret.display()),
        format!("--hosts-name={name}"),
        "--hosts-bind=127.0.0.1".to_owned(),
        format!("--hosts-session-timeout-ms={SESSION_MS}"),
    ];
    if tls {
        let tls = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2e/fixtures/tls");
        args.extend([
            format!("--hosts-tls-cert={}", tls.join("sluice-host.pem").display()),
            format!("--hosts-tls-key={}", tls.join("sluice-host.key").display()),
            format!("--hosts-tls-ca={}", tls.join("sluice-ca.pem").display()),
        ]);
    }
    args
}

/// The hosts of one pipeline, and where they find its parts.
pub struct Cluster {
    pub dir: PathBuf,
    pub wasm: PathBuf,
    pub brokers: String,
    pub etcd: String,
    pub pipeline: String,
    pub store: String,
    pub input: PathBuf,
    pub hosts: BTreeMap<String, Child>,
    /// Each host's listen port, kept across its restarts.
    pub ports: BTreeMap<String, u16>,
    /// The address a host advertises (a proxy in front of it), if any.
    pub advertise: BTreeMap<String, String>,
    /// Environment every host starts with (e.g. the S3 endpoint behind a
    /// proxy).
    pub env: Vec<(String, String)>,
    /// The hosts' session timeout (and membership TTL), in milliseconds.
    pub session_ms: u64,
}

/// Creates `topic` with `partitions` partitions (replication 1).
pub fn create_topic(brokers: &str, topic: &str, partitions: i32) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let created =
        futures_executor::block_on(admin.create_topics([&new], &AdminOptions::new())).unwrap();
    for result in created {
        result.unwrap();
    }
}

/// A port free on 127.0.0.1 for a listener another process binds later.
///
/// Chosen below the kernel's ephemeral range (32768–60999 by default),
/// which outbound connections take their ports from: the port is free
/// when chosen and bound later by another process, and in between a
/// connection (a Kafka client's, a proxy's) could take one from that range
/// — a host of the fault campaign once failed to start with "Address
/// already in use". Spread by process id, distinct within a process.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    let base = std::process::id().wrapping_mul(7_919);
    for _ in 0..SPAN {
        let port = (LOW + base.wrapping_add(NEXT.fetch_add(1, Ordering::SeqCst)) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {LOW}..{}", LOW + SPAN);
}

impl Cluster {
    /// A cluster of no hosts yet for a fresh pipeline named `what-…`, word
    /// count on `lines` lines of input in `dir`; with the recount.
    pub fn new(
        dir: &Path,
        what: &str,
        lines: usize,
        brokers: &str,
        etcd: String,
    ) -> (Cluster, BTreeMap<String, i64>) {
        let pipeline = fresh_name(what);
        let input_file = dir.join("lines.jsonl");
        let expected = input(&input_file, lines);
        let cluster = Cluster {
            dir: dir.to_owned(),
            wasm: component("examples/wordcount"),
            brokers: brokers.to_owned(),
            etcd,
            store: format!("s3://sluice-tests/{pipeline}"),
            pipeline,
            input: input_file,
            hosts: BTreeMap::new(),
            ports: BTreeMap::new(),
            advertise: BTreeMap::new(),
            env: Vec::new(),
            session_ms: SESSION_MS,
        };
        (cluster, expected)
    }

    /// A cluster of no hosts that only reads pipeline `pipeline`'s topics.
    pub fn reader(dir: &Path, brokers: &str, pipeline: &str) -> Cluster {
        Cluster {
            dir: dir.to_owned(),
            wasm: PathBuf::new(),
            brokers: brokers.to_owned(),
            etcd: String::new(),
            pipeline: pipeline.to_owned(),
            store: String::new(),
            input: PathBuf::new(),
            hosts: BTreeMap::new(),
            ports: BTreeMap::new(),
            advertise: BTreeMap::new(),
            env: Vec::new(),
            session_ms: SESSION_MS,
        }
    }

    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    pub fn stderr(&self, name: &str) -> String {
        std::fs::read_to_string(self.log(name)).unwrap_or_default()
    }

    /// Starts host `name` on a free loopback port (the same port when it
    /// starts again).
    pub fn start(&mut self, name: &str) {
        self.start_with(name, &[]);
    }

    /// [`start`](Self::start) with `extra` arguments.
    pub fn start_with(&mut self, name: &str, extra: &[&str]) {
        // Appended: a host started again under its name keeps one log,
        // each run after a line of its own (what is said of the host now
        // is read after the last).
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(name))
            .unwrap();
        writeln!(log, "{STARTED}").unwrap();
        // The leader appends the input (a host that may not write the logs
        // cannot, and never leads).
        let input = match extra.contains(&"--read-only-log") {
            true => Vec::new(),
            false => vec![format!("--input=lines={}", self.input.display())],
        };
        let port = *self.ports.entry(name.to_owned()).or_insert_with(free_port);
        let child = sluice_cmd()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .arg("host")
            .arg(&self.wasm)
            .args(["--name", name])
            .arg(format!("--listen=127.0.0.1:{port}"))
            .args(self.advertise.get(name).map(|a| format!("--advertise={a}")))
            .arg(format!("--etcd={}", self.etcd))
            .arg(format!("--session-timeout-ms={}", self.session_ms))
            .arg("--data")
            .arg(self.dir.join(name))
            .arg(format!("--workers={WORKERS}"))
            .args([
                "--partitions",
                "6",
                "--max-batch",
                "10",
                "--checkpoint-every",
                "6",
            ])
            .args(input)
            .arg(format!("--store={}", self.store))
            .arg(format!("--brokers={}", self.brokers))
            .arg(format!("--pipeline={}", self.pipeline))
            // A step window far below the run's steps: every host prunes
            // its view of the step log and reads back what a recovery asks.
            .arg("--step-window=4")
            .args(extra)
            .env("SLUICE_HOST_SECRET", "a secret the hosts share")
            .env(
                "SLUICE_LOG",
                std::env::var("SLUICE_TEST_HOST_LOG").unwrap_or_else(|_| "sluice=info".into()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        self.hosts.insert(name.to_owned(), child);
    }

    pub fn signal(&self, name: &str, signal: &str) {
        let pid = self.hosts[name].id().to_string();
        let ok = std::process::Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {signal} {name}");
    }

    /// Recorded steps, as an independent consumer sees the step log (a
    /// step record's key is the step, 8 bytes; a worker's done record's,
    /// 12, is not counted).
    pub fn steps(&self) -> usize {
        self.step_log_records(8)
    }

    /// Workers' done records (shares of divided steps) in the step log.
    pub fn done_records(&self) -> usize {
        self.step_log_records(12)
    }

    /// Records of the step log whose key is `key_len` bytes long.
    pub fn step_log_records(&self, key_len: usize) -> usize {
        let topic = format!("{}.sluice-steps", self.pipeline);
        kcat(&self.brokers, &topic, "%K\n")
            .iter()
            .filter(|len| **len == key_len.to_string())
            .count()
    }

    /// Waits until `done` holds, failing with the hosts' logs after `limit`.
    pub fn wait(&self, what: &str, limit: Duration, mut done: impl FnMut(&Self) -> bool) {
        let start = Instant::now();
        while !done(self) {
            if start.elapsed() > limit {
                panic!("timed out waiting for {what}\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every host's log so far, each under its name.
    pub fn logs(&self) -> String {
        let logs: Vec<String> = self
            .hosts
            .keys()
            .map(|n| format!("--- {n}\n{}", self.stderr(n)))
            .collect();
        logs.join("\n")
    }

    /// Waits until the output, as [`Self::counts`] integrates it, equals
    /// the recount `expected`, saying every 10 s how far off it is; after
    /// `limit`, fails with what differs and where the topics end
    /// ([`Self::explain_off`]) and the hosts' logs — unless the pipeline
    /// committed a step in the last 30 s: then it is given up to twice
    /// `limit`. (The tests step `--max-batch 10` records a partition at a
    /// time, so a pipeline on a machine busy with other tests can still be
    /// reading its input at `limit`; one that stopped stepping fails there.)
    pub fn wait_for_recount(&self, expected: &BTreeMap<String, i64>, limit: Duration) {
        let start = Instant::now();
        let mut said = Instant::now();
        // The step count last seen, and when it last grew.
        let mut stepped = (self.steps(), Instant::now());
        loop {
            let counts = self.counts();
            if counts == *expected {
                return;
            }
            if start.elapsed() > limit {
                // The step count is read every 10 s (below).
                let stepping = stepped.1.elapsed() < Duration::from_secs(30);
                if !stepping || start.elapsed() > limit * 2 {
                    panic!(
                        "the output did not reach the recount in {:?} ({} steps, the count \
                         last grew {:?} ago): {}\n{}",
                        start.elapsed(),
                        stepped.0,
                        stepped.1.elapsed(),
                        self.explain_off(expected, &counts),
                        self.logs()
                    );
                }
            }
            if said.elapsed() > Duration::from_secs(10) {
                said = Instant::now();
                let off = expected
                    .iter()
                    .filter(|(w, n)| counts.get(*w) != Some(n))
                    .count();
                let steps = self.steps();
                if steps > stepped.0 {
                    stepped = (steps, Instant::now());
                }
                eprintln!("{steps} steps, {off} words off the recount");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// What differs between the recount (`expected`) and the output
    /// (`counts`), and where the input topic ends against what the pipeline's
    /// last step covers: which side lags, or that both read all and differ.
    pub fn explain_off(
        &self,
        expected: &BTreeMap<String, i64>,
        counts: &BTreeMap<String, i64>,
    ) -> String {
        let c = self;
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use sluice_storage::LogBackend;
        let words: std::collections::BTreeSet<&String> =
            expected.keys().chain(counts.keys()).collect();
        let off: Vec<String> = words
            .iter()
            .filter(|w| expected.get(**w) != counts.get(**w))
            .map(|w| {
                let n = |m: &BTreeMap<String, i64>| m.get(*w).copied().unwrap_or(0);
                format!("{w}: {} in, {} out", n(expected), n(counts))
            })
            .collect();
        let total = |m: &BTreeMap<String, i64>| m.values().sum::<i64>();
        // Each partition of a topic as `low..high`, and the last stable offset
        // a read_committed reader reaches where it differs (a transaction
        // left open holds it back, and every reader of the output with it).
        let ends = |topic: &str, partitions: i32| -> String {
            let consumer = |isolation: &str| {
                rdkafka::ClientConfig::new()
                    .set("bootstrap.servers", &c.brokers)
                    .set("isolation.level", isolation)
                    .create::<BaseConsumer>()
            };
            let (Ok(all), Ok(committed)) =
                (consumer("read_uncommitted"), consumer("read_committed"))
            else {
                return "no consumer".to_owned();
            };
            let timeout = Duration::from_secs(5);
            let parts: Vec<String> = (0..partitions)
                .map(|p| match all.fetch_watermarks(topic, p, timeout) {
                    Ok((low, high)) => match committed.fetch_watermarks(topic, p, timeout) {
                        Ok((_, stable)) if stable != high => {
                            format!("{p}: {low}..{high} (stable {stable})")
                        }
                        Ok(_) => format!("{p}: {low}..{high}"),
                        Err(e) => format!("{p}: {low}..{high} (stable: {e})"),
                    },
                    Err(e) => format!("{p}: {e}"),
                })
                .collect();
            format!("{topic} [{}]", parts.join(", "))
        };
        let input = ends(&format!("{}.lines", c.pipeline), 6);
        let steps = ends(&format!("{}.sluice-steps", c.pipeline), 1);
        let output = ends(&format!("{}.counts", c.pipeline), 6);
        let covered =
            sluice_kafka::KafkaLog::open(sluice_kafka::KafkaConfig::new(&c.brokers, &c.pipeline))
                .map_err(|e| e.to_string())
                .and_then(|log| {
                    let last = log.last_step().map_err(|e| e.to_string())?;
                    let Some(last) = last else {
                        return Ok("no step".to_owned());
                    };
                    let record = log.step_record(last).map_err(|e| e.to_string())?;
                    let mut upto: BTreeMap<u32, u64> = BTreeMap::new();
                    for frontier in record.iter().flat_map(|r| &r.frontiers) {
                        for (id, offset) in frontier {
                            let at = upto.entry(id.partition).or_default();
                            *at = (*at).max(*offset);
                        }
                    }
                    Ok(format!("step {last} covers {upto:?}"))
                })
                .unwrap_or_else(|e| e);
        format!(
            "{} words off ({}…); {} words in, {} out; the pipeline's last {covered}; topics: \
             {input}; {steps}; {output}",
            off.len(),
            off.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
            total(expected),
            total(counts),
        )
    }

    /// The pipeline's output as an independent `read_committed` consumer
    /// integrates it: count by word.
    pub fn counts(&self) -> BTreeMap<String, i64> {
        let topic = format!("{}.counts", self.pipeline);
        let mut counts: BTreeMap<String, i64> = BTreeMap::new();
        for (value, weight) in integrated(&self.brokers, &topic) {
            let v: serde_json::Value = serde_json::from_str(&value).unwrap();
            *counts
                .entry(v["word"].as_str().unwrap().to_owned())
                .or_default() += weight * v["count"].as_i64().unwrap();
        }
        counts.retain(|_, n| *n != 0);
        counts
    }

    /// Waits for `more` committed steps past now.
    pub fn progress(&self, what: &str, more: usize) {
        let from = self.steps();
        self.wait(what, Duration::from_secs(90), |c| c.steps() >= from + more);
    }

    /// Whether `leader`'s last coordinator ran on exactly `hosts` (itself
    /// first, the others in any order).
    pub fn leads_on(&self, leader: &str, hosts: &[&str]) -> bool {
        let log = self.stderr(leader);
        let prefix = format!("host {leader}: leading on [");
        let Some(line) = log.lines().rfind(|l| l.starts_with(&prefix)) else {
            return false;
        };
        let listed = &line[prefix.len()..line.find(']').unwrap_or(line.len())];
        let mut listed: Vec<&str> = listed.split(", ").collect();
        let mut wanted = hosts.to_vec();
        listed[1..].sort_unstable();
        wanted[1..].sort_unstable();
        self.leading(leader) && listed == wanted
    }

    /// Bytes `leader`'s last recovery read from the hosts' own copies of
    /// the checkpoint (from its last "leading on" line with a restore).
    pub fn restored_locally(&self, leader: &str) -> u64 {
        let log = self.stderr(leader);
        let prefix = format!("host {leader}: leading on [");
        let line = log
            .lines()
            .rfind(|l| l.starts_with(&prefix) && l.contains("restored checkpoint "))
            .unwrap_or_else(|| panic!("{leader} never recovered:\n{log}"));
        let local = line
            .split_once("restored checkpoint ")
            .and_then(|(_, rest)| {
                rest.split_once(" (")?
                    .1
                    .split_once(" bytes from the hosts' own")
            })
            .map(|(n, _)| n.parse().unwrap())
            .unwrap_or_else(|| panic!("no restore figures in {line:?}"));
        eprintln!("{line}");
        local
    }

    /// The host leading now, from the hosts' logs (the last "leading" line
    /// of its last run).
    pub fn leading(&self, name: &str) -> bool {
        let log = self.stderr(name);
        let log = log.rsplit(STARTED).next().unwrap_or_default();
        let lead = log.rfind(&format!("host {name}: leading"));
        let ended = log.rfind(&format!("host {name}: stopped leading"));
        lead.is_some() && lead > ended
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.hosts.values_mut() {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Every record of `topic` as `kcat` prints it with `format`, read_committed.
pub fn kcat(brokers: &str, topic: &str, format: &str) -> Vec<String> {
    let out = std::process::Command::new("kcat")
        .args(["-C", "-b", brokers, "-t", topic, "-e", "-q"])
        .args(["-X", "isolation.level=read_committed", "-f", format])
        .output()
        .unwrap();
    if !out.status.success() {
        return Vec::new(); // the topic does not exist yet
    }
    // (Lossy: step log keys are binary, except checkpoint records'.)
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Output topic `topic` as an independent `read_committed` consumer
/// integrates it: each value (its JSON text) with its summed weight, those
/// summing to zero left out.
pub fn integrated(brokers: &str, topic: &str) -> BTreeMap<String, i64> {
    let mut z: BTreeMap<String, i64> = BTreeMap::new();
    for line in kcat(brokers, topic, "%h\t%s\n") {
        let (headers, value) = line.split_once('\t').unwrap();
        let weight: i64 = headers
            .split(',')
            .find_map(|h| h.strip_prefix("sluice-weight="))
            .unwrap()
            .parse()
            .unwrap();
        *z.entry(value.to_owned()).or_default() += weight;
    }
    z.retain(|_, w| *w != 0);
    z
}

/// Lines of words, about one in twenty deleting an earlier line.
pub fn input(path: &Path, n: usize) -> BTreeMap<String, i64> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut lines: Vec<(String, i64)> = Vec::new();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    for i in 0..n {
        if i > 20 && next(20) == 0 {
            let victim = lines[next(lines.len() as u64) as usize].0.clone();
            writeln!(f, "{}", serde_json::json!({ "delete": victim })).unwrap();
            lines.push((victim, -1));
        } else {
            let words: Vec<String> = (0..1 + next(5))
                .map(|_| format!("w{}", next(300)))
                .collect();
            let line = words.join(" ");
            writeln!(f, "{}", serde_json::to_string(&line).unwrap()).unwrap();
            lines.push((line, 1));
        }
    }
    recount(lines.iter().map(|(l, w)| (l.as_str(), *w)))
}

/// Writes the word-count input in `file` (as [`input`] makes it) to
/// Kafka topic `topic` as a pipeline's input records: a line's JSON; a
/// deletion is the deleted line with the header `sluice-weight: -1`.
pub fn produce_lines(brokers: &str, topic: &str, file: &Path) {
    let (mut ins, mut del) = (String::new(), String::new());
    for line in std::fs::read_to_string(file).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        match v.get("delete") {
            Some(victim) => del.push_str(&format!("{victim}\n")),
            None => ins.push_str(&format!("{line}\n")),
        }
    }
    for (records, headers) in [(ins, &[][..]), (del, &["-H", "sluice-weight=-1"][..])] {
        // One record per line (kcat reads stdin line by line).
        let mut kcat = std::process::Command::new("kcat")
            .args(["-P", "-b", brokers, "-t", topic])
            .args(headers)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = kcat.stdin.take().unwrap();
        stdin.write_all(records.as_bytes()).unwrap();
        drop(stdin);
        assert!(kcat.wait().unwrap().success(), "kcat -P");
    }
}

/// A Kafka broker of this test's own (`scripts/kafka-broker.sh start-at`),
/// stopped when dropped. Each broker's controller listens on port 9093 of
/// its address, so each gets a loopback address of its own (127.0.0.2 and
/// up) whose port 9093 is free: two tests with brokers of their own may run
/// side by side.
pub struct OwnBroker {
    pub addr: String,
    pub dir: PathBuf,
    /// The address it tells clients to reach it at, when not `addr` (a
    /// proxy in front of it).
    pub advertised: Option<String>,
}

impl OwnBroker {
    pub fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kafka-broker.sh")
    }

    pub fn start(dir: PathBuf) -> OwnBroker {
        let addr = format!("{}:{}", own_loopback(), free_port());
        let broker = OwnBroker {
            addr,
            dir,
            advertised: None,
        };
        broker.up();
        broker
    }

    /// A broker behind what `front` starts given its address (a proxy),
    /// telling clients to reach it at the address `front` returns.
    pub fn start_behind(dir: PathBuf, front: impl FnOnce(&str) -> String) -> OwnBroker {
        let addr = format!("{}:{}", own_loopback(), free_port());
        let advertised = Some(front(&addr));
        let broker = OwnBroker {
            addr,
            dir,
            advertised,
        };
        broker.up();
        broker
    }

    /// Kills the broker with SIGKILL and waits until it is gone.
    pub fn kill(&self) {
        let pid = std::fs::read_to_string(self.dir.with_extension("pid")).unwrap();
        let pid = pid.trim();
        let ok = std::process::Command::new("kill")
            .args(["-9", pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "killing the broker {pid}");
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    pub fn up(&self) {
        let mut start = std::process::Command::new(Self::script());
        if let Some(advertised) = &self.advertised {
            start.env("CRABKA_ADVERTISED_LISTENER", advertised);
        }
        let ok = start
            .arg("start-at")
            .arg(&self.addr)
            .arg(&self.dir)
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "starting the broker at {}", self.addr);
    }

    pub fn down(&self) {
        let ok = std::process::Command::new(Self::script())
            .arg("stop")
            .arg(&self.dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "stopping the broker at {}", self.addr);
    }
}

/// A loopback address, 127.0.0.2 and up, not yet given out by this process
/// and whose port 9093 (a broker's controller) is free.
fn own_loopback() -> std::net::Ipv4Addr {
    use std::sync::atomic::{AtomicU8, Ordering};
    static NEXT: AtomicU8 = AtomicU8::new(2);
    loop {
        let last = NEXT.fetch_add(1, Ordering::SeqCst);
        assert!(last < 250, "no loopback address with port 9093 free");
        let ip = std::net::Ipv4Addr::new(127, 0, 0, last);
        if std::net::TcpListener::bind((ip, 9093)).is_ok() {
            return ip;
        }
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        self.down();
    }
}
/// The audit of a cluster's logs, as independent readers see them: each
/// (step, worker) entry of the output once (by `kcat`, read_committed),
/// every step but the last complete and each checkpoint a host restored
/// recorded (by a fresh `KafkaLog`). Returns the output entries and the
/// last step.
pub fn audit(c: &Cluster, hosts: &[&str]) -> (usize, u64) {
    use sluice_storage::{CheckpointLedger, LogBackend};
    let topic = format!("{}.counts", c.pipeline);
    // Each (step, worker) entry once. Workers' shares commit in
    // transactions of their own, so two shares' records may interleave in
    // a partition; but word count's entry holds each (value, weight) at most
    // once (its output is consolidated), so an entry committed twice would
    // repeat every record of it.
    let mut seen: BTreeMap<(u64, u32), usize> = BTreeMap::new();
    let mut records: std::collections::BTreeSet<(u64, u32, String, String)> = Default::default();
    for line in kcat(&c.brokers, &topic, "%h\t%s\n") {
        let (headers, value) = line.split_once('\t').unwrap();
        let header = |key: &str| -> String {
            headers
                .split(',')
                .find_map(|h| h.strip_prefix(&format!("{key}=")))
                .unwrap()
                .to_owned()
        };
        let (step, worker) = (
            header("sluice-step").parse::<u64>().unwrap(),
            header("sluice-worker").parse::<u32>().unwrap(),
        );
        *seen.entry((step, worker)).or_default() += 1;
        let record = (step, worker, header("sluice-weight"), value.to_owned());
        assert!(
            records.insert(record.clone()),
            "a record of step {step} worker {worker} committed twice: {record:?}"
        );
    }
    // The step log as a fresh reader loads it: a second done record of
    // one (step, worker) would be refused as corrupt; every step but the
    // last is complete.
    let log = sluice_kafka::KafkaLog::open(sluice_kafka::KafkaConfig::new(&c.brokers, &c.pipeline))
        .unwrap();
    let last = log.last_step().unwrap().unwrap();
    for step in 0..last {
        assert!(
            log.output_hashes(step).unwrap().is_some(),
            "step {step} is complete"
        );
    }
    // Checkpoints commit as records in the step log (the leader's fenced
    // transactions), and every recovery restored a recorded one.
    let recorded = log.recorded_checkpoints(usize::MAX).unwrap();
    assert!(
        !recorded.is_empty(),
        "no checkpoint recorded in the step log"
    );
    let topic_steps = format!("{}.sluice-steps", c.pipeline);
    let marks = kcat(&c.brokers, &topic_steps, "%k\n")
        .iter()
        .filter(|k| k.starts_with("checkpoint:"))
        .count();
    assert!(
        marks >= recorded.len(),
        "{marks} marks, {} recorded",
        recorded.len()
    );
    for host in hosts {
        for line in c.stderr(host).lines() {
            if let Some(rest) = line.split("restored checkpoint ").nth(1)
                && let Some(step) = rest.split(' ').next().and_then(|s| s.parse::<u64>().ok())
            {
                assert!(
                    recorded.iter().any(|(s, _)| *s == step),
                    "{host} restored checkpoint {step}, which the step log does not record"
                );
            }
        }
    }
    (seen.len(), last)
}
