//! The Kafka backend against a real Kafka-protocol broker.
//!
//! The broker's address comes from `SLUICE_KAFKA_BROKERS` (`.ci/run` starts
//! one and sets it). Without it these tests say so and pass, except under
//! `CI`, where a missing broker is a failure.
#![cfg(feature = "kafka")]

use crate::support::crash::{Hosts, Positions, WORKERS, campaign};
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

/// The broker's topics whose names start with `prefix`.
fn topics(brokers: &str, prefix: &str) -> Vec<String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let client: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let md = client
        .fetch_metadata(None, std::time::Duration::from_secs(10))
        .unwrap();
    md.topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|t| t.starts_with(prefix))
        .collect()
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
            output_retention: false,
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
            // The smallest window: every recovery reads back from the tail.
            "--step-window=2".into(),
        ],
        // The first run dies inside its third step's transaction: records a
        // read_committed consumer must never see.
        Some("inside-transaction:3"),
        Positions::Skip,
        Hosts::One,
    );
    let log = KafkaLog::open(KafkaConfig::new(&brokers, &pipeline)).unwrap();
    let last = exactly_once_on_kafka(&brokers, &pipeline, &log, &run.expected, run.kills);
    let topic = format!("{pipeline}.counts");
    assert!(
        kcat(&brokers, &topic, "read_uncommitted").len()
            > kcat(&brokers, &topic, "read_committed").len(),
        "the aborted transaction's records are in the topic, hidden from read_committed"
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

    // The pipeline's consumer group shows how far it read each partition
    // (committed with every step): Kafka's own tools see its lag.
    let offsets = log.group_offsets("lines").unwrap();
    for frontier in &checkpoint.frontiers {
        for (id, offset) in frontier {
            assert_eq!(
                offsets[id.partition as usize],
                Some(*offset),
                "the group's offset of partition {} is the last step's frontier",
                id.partition
            );
        }
    }

    // The offline audit reads the Kafka logs through the same storage
    // traits as the embedded ones, and finds them consistent.
    verify_consistent(&run.data, &brokers, None, last);
}

/// The crash campaign on Kafka with checkpoints in an S3-protocol store,
/// every run on another "machine" (a data directory of its own): each
/// recovery restores the checkpoint an earlier machine committed to S3 —
/// the input below it is trimmed, so no run could finish without it — and
/// the output stays exactly-once.
#[test]
fn another_machine_takes_over_from_checkpoints_in_s3() {
    let Some(brokers) = brokers() else { return };
    let Some(_) = crate::support::s3_endpoint() else {
        eprintln!(
            "skipped: set SLUICE_S3_ENDPOINT to an S3-protocol server with bucket sluice-tests"
        );
        return;
    };
    let pipeline = fresh_name("machines");
    let store = format!("s3://sluice-tests/{pipeline}");
    let run = campaign(
        40_000,
        &[
            "--log=kafka".into(),
            format!("--brokers={brokers}"),
            format!("--pipeline={pipeline}"),
            format!("--store={store}"),
        ],
        None,
        Positions::Skip,
        Hosts::EachRunAnother,
    );
    let log = KafkaLog::open(KafkaConfig::new(&brokers, &pipeline)).unwrap();
    let last = exactly_once_on_kafka(&brokers, &pipeline, &log, &run.expected, run.kills);
    let trimmed: u64 = (0..WORKERS)
        .map(|p| log.watermarks("lines", p).unwrap().0)
        .sum();
    assert!(trimmed > 0, "checkpoints in S3 trimmed the input");
    // The audit of the last machine's view: logs in Kafka, checkpoints in S3.
    verify_consistent(&run.data, &brokers, Some(&store), last);
}

/// `sluice verify` of the pipeline in `data` finds `last + 1` consistent steps.
fn verify_consistent(data: &std::path::Path, brokers: &str, store: Option<&str>, last: u64) {
    let mut cmd = sluice_cmd();
    cmd.args(["verify", "--data"])
        .arg(data)
        .arg(format!("--brokers={brokers}"));
    if let Some(store) = store {
        cmd.arg(format!("--store={store}"));
    }
    let out = cmd.output().unwrap();
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

/// After a crash campaign on Kafka pipeline `pipeline`: the step log holds
/// one entry per step per worker; an independent `read_committed` consumer
/// sees each output record exactly once, none of an aborted transaction's,
/// and integrates to `expected`. Returns the last committed step.
fn exactly_once_on_kafka(
    brokers: &str,
    pipeline: &str,
    log: &KafkaLog,
    expected: &BTreeMap<String, i64>,
    kills: usize,
) -> u64 {
    let last = log.last_step().unwrap().expect("steps were committed");
    let mut entries: BTreeMap<(u64, u32), usize> = BTreeMap::new();
    log.scan_output("counts", 0, &mut |e| {
        *entries.entry((e.step, e.worker)).or_default() += e.events.len();
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    assert_eq!(
        entries.len() as u64,
        (last + 1) * WORKERS as u64,
        "one entry per step per worker"
    );

    let topic = format!("{pipeline}.counts");
    let committed = kcat(brokers, &topic, "read_committed");
    assert_eq!(
        integrate(&committed),
        *expected,
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
    let all = kcat(brokers, &topic, "read_uncommitted");
    eprintln!(
        "kafka crash test: {} kills, {} steps; {} committed output records, {} more in aborted \
         transactions (hidden from read_committed)",
        kills,
        last + 1,
        committed.len(),
        all.len() - committed.len()
    );

    last
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
    // The server names the topics: `sl.<tenant>.<pipeline>.<port>`.
    let topic = format!("sl.{tenant}.wc.counts");
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
    // Deleting the pipeline deletes its topics (and only its).
    let prefix = format!("sl.{tenant}.wc.");
    assert!(
        topics(&brokers, &prefix).len() >= 3,
        "{:?}",
        topics(&brokers, &prefix)
    );
    client.delete("wc").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let left = topics(&brokers, &prefix);
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the deleted pipeline's topics are still there: {left:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // A server without brokers refuses Kafka pipelines with a clear code.
    let plain = Server::start(&dir.path().join("plain"));
    let other = plain.tenant("solo");
    let (s, body) = plain.upload(other.token(), "wc", &bytes);
    assert_eq!(s, 201, "{body}");
    let (s, body) = plain.create(other.token(), &spec);
    assert_eq!((s, code(&body).as_str()), (422, "no_kafka"), "{body}");
}

/// Output reads while steps commit: a reader whose view of the step log is
/// older than the output topic leaves the newer steps for a later read
/// (it used to report them as corruption), and a read from a late step
/// finds where that step starts instead of scanning the topic.
#[test]
fn output_reads_while_steps_commit() {
    let Some(brokers) = brokers() else { return };
    let name = fresh_name("scan");
    let writer = KafkaLog::open(KafkaConfig::new(&brokers, &name)).unwrap();
    writer.fence().unwrap();
    for step in 0..20 {
        writer
            .commit_step(&conformance::sample_commit(step, step))
            .unwrap();
    }
    let entries = |log: &KafkaLog, from: u64| {
        let mut steps = Vec::new();
        log.scan_output("out", from, &mut |e| {
            steps.push((e.step, e.events.len()));
            Ok(std::ops::ControlFlow::Continue(()))
        })
        .map(|()| steps)
    };
    let reader = KafkaLog::open(KafkaConfig::new(&brokers, &name)).unwrap();
    assert_eq!(entries(&reader, 0).unwrap().len(), 20);
    for step in 20..40 {
        writer
            .commit_step(&conformance::sample_commit(step, step))
            .unwrap();
    }
    let seen = entries(&reader, 0).expect("newer steps are not corruption");
    assert_eq!(seen.len(), 20, "the reader's view ends at step 19");
    let late = KafkaLog::open(KafkaConfig::new(&brokers, &name)).unwrap();
    let tail = entries(&late, 35).unwrap();
    assert_eq!(
        tail,
        (35..40).map(|s| (s, 1)).collect::<Vec<_>>(),
        "exactly the steps from 35 on, each with its event"
    );
    let mut events = Vec::new();
    late.scan_output("out", 35, &mut |e| {
        events.extend(e.events);
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    assert_eq!(
        events,
        (35..40)
            .flat_map(|s| conformance::sample_commit(s, s).outputs[0].1[0]
                .events
                .clone())
            .collect::<Vec<_>>()
    );
}

/// Checkpoints on a shared store commit through the step topic: a host
/// whose step producer another host fenced records no checkpoint, and the
/// manifest it wrote to the store anyway is never read (here on a shared
/// directory: the store is the same for both, only the ledger fences).
#[test]
fn a_fenced_host_commits_no_checkpoint() {
    use sluice_storage::{CheckpointLedger, StorageError};
    let Some(brokers) = brokers() else { return };
    let name = fresh_name("ckpt");
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("store").display());
    let open = |fence: bool| {
        let log = Arc::new(KafkaLog::open(KafkaConfig::new(&brokers, &name)).unwrap());
        if fence {
            log.fence().unwrap();
        }
        let store = sluice_objstore::ObjectCheckpointStore::open(&url)
            .unwrap()
            .with_ledger(log.clone());
        (log, store)
    };
    let (old_log, old) = open(true);
    old.put(&conformance::sample_checkpoint(3, 2)).unwrap();
    let (new_log, new) = open(true);
    assert_eq!(
        new.list().unwrap(),
        vec![3],
        "the new host reads the record"
    );
    // The old host wakes: its manifest is written, its record refused.
    let err = old.put(&conformance::sample_checkpoint(5, 2)).unwrap_err();
    assert!(
        matches!(err, StorageError::TransactionalProducerSuperseded { .. }),
        "{err}"
    );
    let err = old_log.record_checkpoint(5, "anything").unwrap_err();
    assert!(
        matches!(
            err,
            StorageError::InvalidCommit { .. }
                | StorageError::TransactionalProducerSuperseded { .. }
        ),
        "{err}"
    );
    assert_eq!(new.list().unwrap(), vec![3]);
    assert_eq!(new_log.recorded_checkpoint(5).unwrap(), None);
    // The new host commits its own checkpoint of that step.
    let fresh = conformance::sample_checkpoint(5, 2);
    new.put(&fresh).unwrap();
    let (_, reader) = open(false);
    assert_eq!(reader.list().unwrap(), vec![3, 5]);
    assert_eq!(reader.get(5).unwrap(), Some(fresh));
    let manifests = std::fs::read_dir(dir.path().join("store/manifests"))
        .unwrap()
        .count();
    assert_eq!(manifests, 3, "the fenced host's manifest is there, unread");
    // The step log holding these records is kept whatever the broker's
    // default retention.
    let topic = format!("{name}.sluice-steps");
    let described = futures_executor::block_on(admin(&brokers).describe_configs(
        [&rdkafka::admin::ResourceSpecifier::Topic(&topic)],
        &rdkafka::admin::AdminOptions::new(),
    ))
    .unwrap();
    let config = described.into_iter().next().unwrap().unwrap();
    for key in ["retention.ms", "retention.bytes"] {
        assert_eq!(
            config.get(key).and_then(|e| e.value.clone()).as_deref(),
            Some("-1"),
            "{topic} {key}"
        );
    }
}

/// Trim deletes records only on the pipeline's own input topics: an input
/// topic the user named (`--topic`) may have other readers and keeps its
/// records unless `--trim-named-topics` says otherwise.
#[test]
fn named_input_topics_are_trimmed_only_when_asked() {
    let Some(brokers) = brokers() else { return };
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("lines.jsonl");
    let lines: Vec<String> = (0..600)
        .map(|i| format!("\"w{} v{}\"", i % 13, i % 5))
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let wasm = crate::support::component("examples/wordcount");
    let run = |name: &str, trim_named: bool| {
        let pipeline = fresh_name(name);
        let topic = format!("{pipeline}-raw");
        let mut cmd = crate::support::sluice_cmd();
        cmd.arg("run")
            .arg(&wasm)
            .arg("--data")
            .arg(dir.path().join(name))
            .args(["--max-batch", "100", "--checkpoint-every", "2", "--quiet"])
            .args([
                "--log",
                "kafka",
                "--brokers",
                &brokers,
                "--pipeline",
                &pipeline,
            ])
            .arg(format!("--topic=lines={topic}"))
            .arg(format!("--input=lines={}", input.display()));
        if trim_named {
            cmd.arg("--trim-named-topics");
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut config = KafkaConfig::new(&brokers, &pipeline);
        config.topics.insert("lines".into(), topic);
        let log = KafkaLog::open(config).unwrap();
        log.watermarks("lines", 0).unwrap()
    };
    let (low, high) = run("named", false);
    assert_eq!(low, 0, "a named topic keeps its records");
    assert!(high >= 600);
    let (low, _) = run("trimmed", true);
    assert!(
        low > 0,
        "with --trim-named-topics it is trimmed to the checkpoint"
    );
}

/// An admin client of the test broker.
fn admin(brokers: &str) -> rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> {
    rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap()
}

/// Creates `topic` with one partition and `config`.
fn create_topic(brokers: &str, topic: &str, config: &[(&str, &str)]) {
    use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
    let mut new = NewTopic::new(topic, 1, TopicReplication::Fixed(1));
    for (k, v) in config {
        new = new.set(k, v);
    }
    let results =
        futures_executor::block_on(admin(brokers).create_topics([&new], &AdminOptions::new()))
            .unwrap();
    for r in results {
        r.unwrap();
    }
}

/// `sluice run` of word count on Kafka pipeline `pipeline` with its own
/// data directory `data`, with `extra` arguments; returns the output.
fn run_on_kafka(
    brokers: &str,
    pipeline: &str,
    data: &std::path::Path,
    extra: &[String],
) -> std::process::Output {
    crate::support::sluice_cmd()
        .arg("run")
        .arg(crate::support::component("examples/wordcount"))
        .arg("--data")
        .arg(data)
        .args(["--max-batch", "100", "--checkpoint-every", "2", "--quiet"])
        .args([
            "--log",
            "kafka",
            "--brokers",
            brokers,
            "--pipeline",
            pipeline,
        ])
        .args(extra)
        .output()
        .unwrap()
}

/// A host taking over a Kafka pipeline without the checkpoints of the host
/// before it (another data directory) finds the input trimmed below where
/// its recovery would read: it fails, saying so, instead of failing on a
/// read.
#[test]
fn a_takeover_without_the_checkpoints_fails_clearly() {
    let Some(brokers) = brokers() else { return };
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("lines.jsonl");
    let lines: Vec<String> = (0..600)
        .map(|i| format!("\"w{} v{}\"", i % 13, i % 5))
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let pipeline = fresh_name("takeover");
    let feed = [format!("--input=lines={}", input.display())];
    let first = run_on_kafka(&brokers, &pipeline, &dir.path().join("a"), &feed);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let second = run_on_kafka(&brokers, &pipeline, &dir.path().join("b"), &[]);
    let e = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{e}");
    assert!(
        e.contains("after a checkpoint this host does not have")
            && e.contains("has no checkpoint")
            && e.contains("--data"),
        "{e}"
    );
}

/// An input topic deleted and made again under a pipeline ends below where
/// the pipeline read it: a clear error naming the topic and the offsets,
/// never silently skipped.
#[test]
fn an_input_that_shrinks_under_the_pipeline_is_an_error() {
    let Some(brokers) = brokers() else { return };
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("lines.jsonl");
    let lines: Vec<String> = (0..300).map(|i| format!("\"w{}\"", i % 13)).collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let pipeline = fresh_name("shrink");
    let topic = format!("{pipeline}-raw");
    let extra = [
        format!("--topic=lines={topic}"),
        "--input-partitions=1".to_owned(),
    ];
    let mut feed = extra.to_vec();
    feed.push(format!("--input=lines={}", input.display()));
    let first = run_on_kafka(&brokers, &pipeline, &dir.path().join("a"), &feed);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    // The topic is deleted and made again, empty.
    let deleted = futures_executor::block_on(
        admin(&brokers).delete_topics(&[topic.as_str()], &rdkafka::admin::AdminOptions::new()),
    )
    .unwrap();
    for r in deleted {
        r.unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let results = futures_executor::block_on(admin(&brokers).create_topics(
            [&rdkafka::admin::NewTopic::new(
                &topic,
                1,
                rdkafka::admin::TopicReplication::Fixed(1),
            )],
            &rdkafka::admin::AdminOptions::new(),
        ))
        .unwrap();
        if results.iter().all(Result::is_ok) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{results:?}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let again = run_on_kafka(&brokers, &pipeline, &dir.path().join("a"), &extra);
    let e = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success(), "{e}");
    assert!(
        e.contains("input `lines` partition 0 now ends at offset 0, below offset")
            && e.contains("deleted, recreated or truncated"),
        "{e}"
    );
}

/// An input topic with `cleanup.policy=compact` is refused at start
/// (compaction could remove records a replay must read) unless the user
/// opts in.
#[test]
fn compacted_input_topics_are_refused_unless_allowed() {
    let Some(brokers) = brokers() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pipeline = fresh_name("compact");
    let topic = format!("{pipeline}-compacted");
    create_topic(&brokers, &topic, &[("cleanup.policy", "compact")]);
    let named = [format!("--topic=lines={topic}")];
    let out = run_on_kafka(&brokers, &pipeline, &dir.path().join("a"), &named);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{e}");
    assert!(e.contains("cleanup.policy=compact"), "{e}");
    let mut allowed = named.to_vec();
    allowed.push("--allow-compacted-inputs".into());
    let out = run_on_kafka(&brokers, &pipeline, &dir.path().join("b"), &allowed);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
