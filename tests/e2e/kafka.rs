//! The Kafka backend against a real Kafka-protocol broker.
//!
//! The broker's address comes from `SLUICE_KAFKA_BROKERS` (`.ci/run` starts
//! one and sets it). Without it these tests say so and pass, except under
//! `CI`, where a missing broker is a failure.
#![cfg(feature = "kafka")]

use crate::support::crash::{Positions, WORKERS, campaign};
use crate::support::server::{Server, code};
use crate::support::sluice_cmd;
use sluice_kafka::{KafkaConfig, KafkaLog};
use sluice_storage::conformance::{self, LogFlags};
use sluice_storage::{CheckpointStore, LogBackend};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// The broker's address, or `None` (outside CI) to skip.
pub fn brokers() -> Option<String> {
    match std::env::var("SLUICE_KAFKA_BROKERS") {
        Ok(b) if !b.is_empty() => Some(b),
        _ if std::env::var_os("CI").is_some() => {
            panic!("CI is set but SLUICE_KAFKA_BROKERS is not: .ci/run must start the broker")
        }
        _ => {
            eprintln!("skipped: set SLUICE_KAFKA_BROKERS=host:port to run the Kafka tests");
            None
        }
    }
}

/// A pipeline name no earlier run used (topics outlive test runs).
pub fn fresh_name(what: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format!(
        "{what}-{now}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

#[test]
fn kafka_log_passes_the_log_conformance_suite() {
    let Some(brokers) = brokers() else { return };
    conformance::log_backend(
        &|| {
            let log = KafkaLog::open(KafkaConfig::new(&brokers, fresh_name("conf")))
                .expect("opening the Kafka log");
            Arc::new(log) as Arc<dyn LogBackend>
        },
        LogFlags {
            supports_trim: true,
            dense_offsets: false,
        },
    );
}

/// Every record of `topic` as an independent consumer (`kcat`) sees it at
/// `isolation`: `(step, worker, weight, value)` from the headers and value.
fn kcat(brokers: &str, topic: &str, isolation: &str) -> Vec<(u64, u32, i64, String)> {
    let out = std::process::Command::new("kcat")
        .args(["-C", "-b", brokers, "-t", topic, "-e", "-q"])
        .args(["-X", &format!("isolation.level={isolation}")])
        .args(["-f", "%h\t%s\n"])
        .output()
        .expect("running kcat (scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "kcat failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let header = |headers: &str, key: &str| -> String {
        headers
            .split(',')
            .find_map(|h| h.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no header {key} in {headers}"))
            .to_owned()
    };
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (headers, value) = l.split_once('\t').expect("headers TAB value");
            (
                header(headers, "sluice-step").parse().unwrap(),
                header(headers, "sluice-worker").parse().unwrap(),
                header(headers, "sluice-weight").parse().unwrap(),
                value.to_owned(),
            )
        })
        .collect()
}

/// Integrates word-count output records into counts.
fn integrate(records: &[(u64, u32, i64, String)]) -> BTreeMap<String, i64> {
    let mut counts: BTreeMap<String, i64> = BTreeMap::new();
    for (_, _, weight, value) in records {
        let v: serde_json::Value = serde_json::from_str(value).unwrap();
        let word = v["word"].as_str().unwrap().to_owned();
        *counts.entry(word).or_default() += weight * v["count"].as_i64().unwrap();
    }
    counts.retain(|_, n| *n != 0);
    counts
}

/// The crash test of the foundation issue on Kafka (W=2, SIGKILL at random
/// moments), then: the step log holds one entry per step per worker; an
/// independent `read_committed` consumer sees each output record exactly
/// once and none of the aborted transactions' records; the input topics'
/// low watermarks sit exactly at the newest checkpoint's frontier.
#[test]
fn sigkill_on_kafka_loses_and_duplicates_nothing() {
    let Some(brokers) = brokers() else { return };
    let pipeline = fresh_name("crash");
    let run = campaign(
        // Enough steps (~70 of 600 lines) for every kill to land mid-run.
        40_000,
        &[
            "--log=kafka".into(),
            format!("--brokers={brokers}"),
            format!("--pipeline={pipeline}"),
        ],
        // The first run dies inside its third step's transaction: records a
        // read_committed consumer must never see.
        Some("inside-transaction:3"),
        Positions::Skip,
    );
    let log = KafkaLog::open(KafkaConfig::new(&brokers, &pipeline)).unwrap();
    let last = log.last_step().unwrap().expect("steps were committed");
    let mut entries: BTreeMap<(u64, u32), usize> = BTreeMap::new();
    log.scan_output("counts", 0, &mut |e| {
        *entries.entry((e.step, e.worker)).or_default() += e.events.len();
        Ok(())
    })
    .unwrap();
    assert_eq!(
        entries.len() as u64,
        (last + 1) * WORKERS as u64,
        "one entry per step per worker"
    );

    let topic = format!("{pipeline}.counts");
    let committed = kcat(&brokers, &topic, "read_committed");
    assert_eq!(
        integrate(&committed),
        run.expected,
        "a read_committed consumer sees exactly the from-scratch count"
    );
    let mut seen: BTreeMap<(u64, u32), usize> = BTreeMap::new();
    for (step, worker, _, _) in &committed {
        assert!(*step <= last, "a record of uncommitted step {step}");
        *seen.entry((*step, *worker)).or_default() += 1;
    }
    seen.retain(|_, n| *n > 0);
    let nonempty: BTreeMap<_, _> = entries.into_iter().filter(|(_, n)| *n > 0).collect();
    assert_eq!(seen, nonempty, "each step's records exactly once");
    let all = kcat(&brokers, &topic, "read_uncommitted");
    assert!(
        all.len() > committed.len(),
        "the aborted transaction's records are in the topic, hidden from read_committed"
    );
    eprintln!(
        "kafka crash test: {} kills, {} steps; {} committed output records, {} more in aborted \
         transactions (hidden from read_committed)",
        run.kills,
        last + 1,
        committed.len(),
        all.len() - committed.len()
    );

    // Trim: each input partition's low watermark is the newest checkpoint's
    // frontier for it (the final run checkpoints and trims on finish).
    let db = sluice_embedded::db::open(&run.data).unwrap();
    let checkpoint = sluice_embedded::RocksCheckpointStore::open(db)
        .latest_meta()
        .unwrap()
        .expect("a checkpoint");
    assert_eq!(
        checkpoint.step, last,
        "the final run checkpointed its last step"
    );
    for frontier in &checkpoint.frontiers {
        for (id, offset) in frontier {
            let (low, _) = log.watermarks("lines", id.partition).unwrap();
            assert_eq!(
                low, *offset,
                "partition {} trimmed to the checkpoint",
                id.partition
            );
        }
    }

    // The offline audit reads the Kafka logs through the same storage
    // traits as the embedded ones, and finds them consistent.
    let out = sluice_cmd()
        .args(["verify", "--data"])
        .arg(&run.data)
        .arg(format!("--brokers={brokers}"))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains(&format!("consistent: {} steps", last + 1)),
        "{text}"
    );
}

/// Fencing: a second `sluice run` of the same pipeline (another host: its
/// own data directory) makes the first one's next commit fail with a clear
/// "fenced" error; the second finishes and the output stays exactly-once.
#[test]
fn a_second_host_fences_the_first() {
    let Some(brokers) = brokers() else { return };
    let pipeline = fresh_name("fence");
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("lines.jsonl");
    let lines: Vec<String> = (0..20_000)
        .map(|i| format!("w{} w{} w{}", i % 97, i % 13, i % 1000))
        .collect();
    std::fs::write(
        &input,
        lines
            .iter()
            .map(|l| serde_json::to_string(l).unwrap() + "\n")
            .collect::<String>(),
    )
    .unwrap();
    let expected = crate::support::recount(lines.iter().map(|l| (l.as_str(), 1)));
    let wasm = crate::support::component("examples/wordcount");
    let host = |name: &str| {
        let mut cmd = crate::support::sluice_cmd();
        cmd.arg("run")
            .arg(&wasm)
            .arg("--data")
            .arg(dir.path().join(name))
            .args(["--workers", "2", "--max-batch", "100", "--quiet"])
            // No checkpoint (so no trim) while both hosts live: the second
            // host, with its own data directory, replays from step 0.
            .args([
                "--checkpoint-every",
                "1000000",
                "--checkpoint-interval-ms",
                "600000",
            ])
            .args([
                "--log",
                "kafka",
                "--brokers",
                &brokers,
                "--pipeline",
                &pipeline,
            ])
            .arg(format!("--input=lines={}", input.display()))
            .arg(format!(
                "--output=counts={}",
                dir.path().join(format!("{name}.jsonl")).display()
            ))
            .env("SLUICE_LOG", "sluice=debug")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        cmd
    };
    let mut first = host("a").spawn().unwrap();
    let stderr = first.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut log = String::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            if line.contains("step committed") {
                let _ = tx.send(());
            }
            log.push_str(&line);
            log.push('\n');
        }
        log
    });
    for _ in 0..3 {
        rx.recv_timeout(std::time::Duration::from_secs(120))
            .expect("the first host commits steps");
    }
    let second = host("b").output().unwrap();
    let status = first.wait().unwrap();
    let first_log = reader.join().unwrap();
    assert!(
        second.status.success(),
        "the second host finishes: {}\nthe first host's log ends: {}",
        String::from_utf8_lossy(&second.stderr),
        first_log
            .lines()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        !status.success(),
        "the first host must not finish: {first_log}"
    );
    assert!(
        first_log.contains("fenced: another host has taken over the pipeline"),
        "the first host's error names the fencing: {}",
        first_log
            .lines()
            .rev()
            .take(3)
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!(
        "fencing test: the first host stopped with: {}",
        first_log.lines().last().unwrap_or_default()
    );
    let b = std::fs::read_to_string(dir.path().join("b.jsonl")).unwrap();
    assert_eq!(sluice_tools::demo::integrate_counts(&b).unwrap(), expected);
    let committed = kcat(&brokers, &format!("{pipeline}.counts"), "read_committed");
    assert_eq!(
        integrate(&committed),
        expected,
        "the topic holds each step's output once, whichever host committed it"
    );
}

/// A pipeline created through `sluice serve` with `"log": "kafka"`: its
/// logs are the topics `<tenant>.<pipeline>.<port>` on the server's
/// brokers; pushes and output reads go through the server, and an
/// independent `read_committed` consumer sees the same output.
#[test]
fn server_pipelines_can_keep_their_logs_in_kafka() {
    let Some(brokers) = brokers() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--kafka-brokers".into(), brokers.clone()],
    );
    let tenant = fresh_name("t").replace('-', "");
    let client = server.tenant(&tenant);
    let bytes = std::fs::read(crate::support::component("examples/wordcount")).unwrap();
    let (s, body) = server.upload(client.token(), "wc", &bytes);
    assert_eq!(s, 201, "{body}");
    let spec = serde_json::json!({ "name": "wc", "component": "wc", "workers": 2, "log": "kafka" });
    let (s, body) = server.create(client.token(), &spec);
    assert_eq!(s, 201, "{body}");
    let lines: Vec<String> = (0..2_000)
        .map(|i| format!("k{} k{}", i % 50, i % 7))
        .collect();
    let file = dir.path().join("in.jsonl");
    std::fs::write(
        &file,
        lines
            .iter()
            .map(|l| serde_json::to_string(l).unwrap() + "\n")
            .collect::<String>(),
    )
    .unwrap();
    client
        .push("wc", "lines", &file, &Default::default())
        .unwrap();
    let expected = crate::support::recount(lines.iter().map(|l| (l.as_str(), 1)));
    let topic = format!("{tenant}.wc.counts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        // The output topic appears with the first committed step.
        let steps = serde_json::from_str::<serde_json::Value>(&client.status(Some("wc")).unwrap())
            .unwrap()["steps"]
            .as_u64()
            .unwrap_or(0);
        if steps == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "no step was committed"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
            continue;
        }
        let committed = kcat(&brokers, &topic, "read_committed");
        if integrate(&committed) == expected {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the Kafka output never reached the expected counts: {}",
            client.status(Some("wc")).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // The server reads the same output back, with positions.
    let read = client.read("wc", "counts", None, 0).unwrap();
    assert!(!read.is_empty() && read[0].starts_with("{\"position\":\"0:"));
    // A server without brokers refuses Kafka pipelines with a clear code.
    let plain = Server::start(&dir.path().join("plain"));
    let other = plain.tenant("solo");
    let (s, body) = plain.upload(other.token(), "wc", &bytes);
    assert_eq!(s, 201, "{body}");
    let (s, body) = plain.create(other.token(), &spec);
    assert_eq!((s, code(&body).as_str()), (422, "no_kafka"), "{body}");
}
