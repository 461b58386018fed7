//! Input records that are not events (issue #27, item 10): under the
//! policy `fail` the pipeline stops, naming the record's position; under
//! `dead-letter` the record is skipped and written to the input's
//! dead-letter log in the step's own commit — once, whatever is replayed,
//! and a replay skips it whatever the policy is by then.
//!
//! On the embedded log (`sluice run` keeps a file's bad lines, marked, for
//! the steps to dead-letter; steps across in-process hosts, each host
//! committing its workers' shares) and on Kafka (a record any producer
//! wrote, crashes inside and after the step's transaction).

use crate::support::{Harness, component, recount, sluice_cmd, stderr, verified};
use sluice_core::{BadRecordPolicy, DeadLetter, Event};
use sluice_runtime::{Limits, PipelineOptions, Reach, RemoteHost, WorkerHost};
use sluice_storage::AppendBatch;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

/// Word count's output file (`sluice run --output`), integrated: word →
/// count.
fn counts_of(file: &Path) -> BTreeMap<String, i64> {
    let mut counts: BTreeMap<String, i64> = BTreeMap::new();
    for line in std::fs::read_to_string(file).unwrap().lines() {
        let (v, weight) = sluice_core::wire::parse_output_line(line).unwrap();
        *counts
            .entry(v["word"].as_str().unwrap().to_owned())
            .or_default() += weight * v["count"].as_i64().unwrap();
    }
    counts.retain(|_, n| *n != 0);
    counts
}

/// The dead letters of a dead-letter log's output file.
fn letters_of(file: &Path) -> Vec<DeadLetter> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|line| {
            let (v, weight) = sluice_core::wire::parse_output_line(line).unwrap();
            let event = Event {
                value: serde_json::to_vec(&v).unwrap(),
                weight,
            };
            DeadLetter::from_event(&event).unwrap()
        })
        .collect()
}

/// `sluice run` of word count on `data` with `input`, W = 1, steps of 20
/// events and no checkpoint before the end; `extra` arguments after.
fn run(data: &Path, input: &Path, extra: &[&str], crash_at: Option<&str>) -> Output {
    let mut cmd = sluice_cmd();
    cmd.arg("run")
        .arg(component("examples/wordcount"))
        .arg("--data")
        .arg(data)
        .arg(format!("--input=lines={}", input.display()))
        .args(["--max-batch", "20", "--checkpoint-every", "1000", "--quiet"])
        .args(extra);
    match crash_at {
        Some(point) => cmd.env("SLUICE_CRASH_AT", point),
        None => cmd.env_remove("SLUICE_CRASH_AT"),
    };
    cmd.output().unwrap()
}

/// A file's bad line stops `sluice run` (naming the file and the line);
/// under `--bad-records lines=dead-letter` it is kept, and the step that
/// reads it writes it to `lines.dead-letter` with its position. A crash
/// after that step commits, then a run without the policy: the replay
/// skips the record again (no failure, no second dead letter), and the
/// next bad record, met live, stops the run naming its position; with
/// the policy again, the run completes. The output equals the recount of
/// the good lines, each bad line is dead-lettered once, and the audit
/// accepts the dead letters.
#[test]
fn a_bad_line_stops_a_run_or_goes_to_its_dead_letter_log_once() {
    let dir = tempfile::tempdir().unwrap();
    let (data, input) = (dir.path().join("data"), dir.path().join("lines.jsonl"));
    let bad = [(40, "{nope"), (170, r#"{"insert": 1, "delete": 2}"#)];
    let mut good = Vec::new();
    let mut text = String::new();
    for n in 1..=300 {
        match bad.iter().find(|(at, _)| *at == n) {
            Some((_, line)) => text.push_str(line),
            None => {
                let line = format!("w{} v{}", n % 13, n % 5);
                text.push_str(&serde_json::to_string(&line).unwrap());
                good.push(line);
            }
        }
        text.push('\n');
    }
    std::fs::write(&input, text).unwrap();
    let expected = recount(good.iter().map(|l| (l.as_str(), 1)));

    let failed = run(&data, &input, &[], None);
    let e = stderr(&failed);
    assert!(!failed.status.success(), "{e}");
    assert!(e.contains("lines.jsonl: line 40: not JSON"), "{e}");

    // The policy keeps both lines; the run dies right after its third step
    // (lines 41..60: the first bad line was in the second) is committed.
    let dead = ["--bad-records", "lines=dead-letter"];
    let crashed = run(&data, &input, &dead, Some("after-commit:3"));
    assert!(!crashed.status.success(), "{}", stderr(&crashed));
    assert!(
        stderr(&crashed).contains("crash point after-commit #3"),
        "{}",
        stderr(&crashed)
    );
    // Without the policy: the replay of steps 0..=2 skips the first bad
    // line as it was skipped; the second, met live, stops the run.
    let stopped = run(&data, &input, &[], None);
    let e = stderr(&stopped);
    assert!(!stopped.status.success(), "{e}");
    assert!(
        e.contains("input record lines/0@169 is not an event")
            && e.contains("--bad-records PORT=dead-letter"),
        "{e}"
    );
    let (out, letters) = (
        dir.path().join("counts.jsonl"),
        dir.path().join("dead.jsonl"),
    );
    let done = run(
        &data,
        &input,
        &[
            "--bad-records",
            "lines=dead-letter",
            &format!("--output=counts={}", out.display()),
            &format!("--output=lines.dead-letter={}", letters.display()),
        ],
        None,
    );
    assert!(done.status.success(), "{}", stderr(&done));
    assert_eq!(counts_of(&out), expected);
    let letters = letters_of(&letters);
    let positions: Vec<&str> = letters.iter().map(|d| d.position.as_str()).collect();
    assert_eq!(positions, ["lines/0@39", "lines/0@169"], "{letters:?}");
    assert_eq!(letters[0].value.as_deref(), Some(&b"{nope"[..]));
    assert!(letters[0].error.contains("not JSON"), "{letters:?}");
    assert!(letters[1].error.contains("not both"), "{letters:?}");

    let said = verified(&data);
    assert!(said.contains(", 2 dead letters,"), "{said}");
    let read = sluice_cmd()
        .args(["read", "--output", "lines.dead-letter", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    let read = String::from_utf8_lossy(&read.stdout);
    assert_eq!(read.lines().count(), 2, "{read}");
    assert!(read.contains("\"position\":\"lines/0@39\""), "{read}");
}

/// The words of `lines` word count counts, with every seventh line
/// replaced by a record that is not an event (kept as an ingest keeps it: weight
/// 0, the line as written), spread over `partitions` partitions; returns
/// the recount of the good lines and how many bad ones went in.
fn fill_with_bad(h: &Harness, lines: usize, partitions: u32) -> (BTreeMap<String, i64>, usize) {
    let mut good = Vec::new();
    let mut bad = 0;
    let mut parts: Vec<Vec<Event>> = vec![Vec::new(); partitions as usize];
    for i in 0..lines {
        // Every seventh: over 4 partitions, some in each.
        let event = if i % 7 == 3 {
            bad += 1;
            Event {
                value: format!("{{not json {i}").into_bytes(),
                weight: 0,
            }
        } else {
            let line = format!("w{} x{}", i % 37, i % 5);
            let e = Event {
                value: serde_json::to_vec(&line).unwrap(),
                weight: 1,
            };
            good.push(line);
            e
        };
        parts[i % partitions as usize].push(event);
    }
    let appends = parts
        .into_iter()
        .enumerate()
        .map(|(p, events)| ("lines".to_owned(), p as u32, events))
        .collect();
    h.log
        .append(AppendBatch {
            appends,
            mark: None,
            producer: None,
        })
        .unwrap();
    (recount(good.iter().map(|l| (l.as_str(), 1))), bad)
}

/// The dead letters in `h`'s log `lines.dead-letter`, with the (step,
/// worker) of their entries.
fn dead_letters(h: &Harness) -> Vec<((u64, u32), DeadLetter)> {
    let mut all = Vec::new();
    h.log
        .scan_output("lines.dead-letter", 0, &mut |e| {
            for ev in &e.events {
                all.push(((e.step, e.worker), DeadLetter::from_event(ev).unwrap()));
            }
            Ok(std::ops::ControlFlow::Continue(()))
        })
        .unwrap();
    all
}

const SECRET: &[u8] = b"the hosts' shared secret";

/// A worker host of `h`'s pipeline on a loopback port, reading and
/// committing its workers' input and shares itself.
async fn start_host(h: &Harness) -> (Arc<RemoteHost>, tokio::task::JoinHandle<()>) {
    let name = h.pipeline.options().name.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let reach = Reach {
        checkpoints: None,
        log: Some(h.log.clone()),
        read_only_log: false,
    };
    let host = WorkerHost::new_with(
        h.engine(),
        h.pipeline.component(),
        &name,
        SECRET,
        None,
        reach,
    );
    let task = tokio::spawn(async move {
        let _ = host.serve(listener).await;
    });
    let remote = RemoteHost::connect(&addr, &name, SECRET, Duration::from_secs(3))
        .await
        .unwrap();
    (remote, task)
}

fn options(policy: Option<BadRecordPolicy>) -> PipelineOptions {
    PipelineOptions {
        max_batch: 25,
        checkpoint_every_steps: u64::MAX,
        checkpoint_interval: Duration::from_secs(3600),
        bad_records: policy
            .map(|p| ("lines".to_owned(), p))
            .into_iter()
            .collect(),
        ..PipelineOptions::default()
    }
}

/// Divided steps across hosts (in process, on the embedded log): each
/// host reads its workers' input and commits their shares with the
/// records they skipped; the leader commits its own worker's. Every bad
/// record is dead-lettered once, by the worker that read it, in the step
/// that read it; the output is the recount of the good records. Reopened
/// with no checkpoint and the policy `fail`, the replay of every step
/// skips them again and writes nothing twice. Under `fail`, a live step
/// stops at the first, naming its position.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn steps_across_hosts_dead_letter_each_bad_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = component("examples/wordcount");
    let h = Harness::open(&dir.path().join("p"), &wasm, 3, Limits::default()).await;
    let (expected, bad) = fill_with_bad(&h, 600, 4);
    let (a, _ta) = start_host(&h).await;
    let (b, _tb) = start_host(&h).await;
    let hosts = vec![a.clone(), b.clone()];
    let dead = Some(BadRecordPolicy::DeadLetter);
    let mut c = h
        .pipeline
        .coordinator_on(options(dead), hosts.clone())
        .await
        .unwrap();
    while c.step().await.unwrap() {}
    assert_eq!(c.stats().dead_letters, bad as u64);
    drop(c);
    assert!(h.divided_steps() > 0, "the hosts committed shares");
    assert_eq!(h.word_counts(), expected);
    let letters = dead_letters(&h);
    assert_eq!(letters.len(), bad, "{letters:?}");
    let mut positions: Vec<String> = letters.iter().map(|(_, d)| d.position.clone()).collect();
    positions.sort();
    positions.dedup();
    assert_eq!(positions.len(), bad, "each bad record once");
    // Every worker that read bad records skipped them: the leader's own
    // (committed here) and the hosts' (committed there).
    let workers: std::collections::BTreeSet<u32> = letters.iter().map(|((_, w), _)| *w).collect();
    assert_eq!(workers.len(), 3, "{letters:?}");
    for (_, d) in &letters {
        assert!(d.error.contains("not JSON"), "{d:?}");
        assert_eq!(d.position, format!("lines/{}@{}", d.partition, d.offset));
    }
    assert!(h.audit() > 0);

    // No checkpoint: reopening replays every step, now under `fail`.
    let c = h
        .pipeline
        .coordinator_on(options(None), hosts)
        .await
        .unwrap();
    assert!(c.stats().replayed_steps > 0);
    drop(c);
    assert_eq!(dead_letters(&h).len(), bad, "nothing written twice");
    h.audit();

    // Under `fail`, a live step stops at a bad record, naming it.
    let h2 = Harness::open(&dir.path().join("q"), &wasm, 3, Limits::default()).await;
    fill_with_bad(&h2, 100, 4);
    let (a2, _ta2) = start_host(&h2).await;
    let mut c = h2
        .pipeline
        .coordinator_on(options(None), vec![a2])
        .await
        .unwrap();
    let e = loop {
        match c.step().await {
            Ok(true) => continue,
            Ok(false) => panic!("every step committed past the bad records"),
            Err(e) => break e.to_string(),
        }
    };
    assert!(
        e.contains("input record lines/") && e.contains("is not an event: not JSON"),
        "{e}"
    );
    assert_eq!(dead_letters(&h2).len(), 0);
}

/// The same on Kafka, where any producer can write a record that is not
/// JSON.
#[cfg(feature = "kafka")]
mod on_kafka {
    use super::{counts_of, stderr};
    use crate::kafka::{brokers, fresh_name};
    use crate::support::{component, recount, sluice_cmd};
    use sluice_core::{DeadLetter, Event};
    use std::io::Write;
    use std::path::Path;
    use std::process::{Output, Stdio};

    /// Writes `records` (one per line) to partition 0 of `topic` with
    /// `kcat`, as any producer could, after creating the topic with one
    /// partition. Returns the recount of the lines that are JSON strings.
    fn produce(
        brokers: &str,
        topic: &str,
        records: &[String],
    ) -> std::collections::BTreeMap<String, i64> {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> =
            rdkafka::ClientConfig::new()
                .set("bootstrap.servers", brokers)
                .create()
                .unwrap();
        let created = futures_executor::block_on(admin.create_topics(
            [&NewTopic::new(topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        ))
        .unwrap();
        for r in created {
            r.unwrap();
        }
        let mut kcat = std::process::Command::new("kcat")
            .args(["-P", "-b", brokers, "-t", topic, "-p", "0"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("running kcat (scripts/setup.sh installs it)");
        let mut stdin = kcat.stdin.take().unwrap();
        for r in records {
            writeln!(stdin, "{r}").unwrap();
        }
        drop(stdin);
        assert!(kcat.wait().unwrap().success(), "kcat -P");
        let good: Vec<String> = records
            .iter()
            .filter_map(|r| serde_json::from_str::<String>(r).ok())
            .collect();
        recount(good.iter().map(|l| (l.as_str(), 1)))
    }

    /// `records` lines of words, the one at `bad` not JSON.
    fn records(n: usize, bad: usize) -> Vec<String> {
        (0..n)
            .map(|i| match i == bad {
                true => format!("not json {{ {i}"),
                false => serde_json::to_string(&format!("w{} v{}", i % 11, i % 3)).unwrap(),
            })
            .collect()
    }

    /// Every record of `topic` at `isolation`, as `kcat` prints its value.
    fn values(brokers: &str, topic: &str, isolation: &str) -> Vec<String> {
        let out = std::process::Command::new("kcat")
            .args(["-C", "-b", brokers, "-t", topic, "-e", "-q"])
            .args(["-X", &format!("isolation.level={isolation}"), "-f", "%s\n"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// The dead letters a read_committed consumer sees on `topic`.
    fn letters(brokers: &str, topic: &str) -> Vec<DeadLetter> {
        values(brokers, topic, "read_committed")
            .iter()
            .map(|v| {
                let event = Event {
                    value: v.as_bytes().to_vec(),
                    weight: 1,
                };
                DeadLetter::from_event(&event).unwrap()
            })
            .collect()
    }

    /// `sluice run` of word count on Kafka pipeline `pipeline` (steps of
    /// 20 records, no checkpoint before the end), with `extra` arguments.
    fn run(
        brokers: &str,
        pipeline: &str,
        data: &Path,
        extra: &[String],
        crash_at: Option<&str>,
    ) -> Output {
        let mut cmd = sluice_cmd();
        cmd.arg("run")
            .arg(component("examples/wordcount"))
            .arg("--data")
            .arg(data)
            .args(["--max-batch", "20", "--checkpoint-every", "1000", "--quiet"])
            .args([
                "--log",
                "kafka",
                "--brokers",
                brokers,
                "--pipeline",
                pipeline,
            ])
            .args(extra);
        match crash_at {
            Some(point) => cmd.env("SLUICE_CRASH_AT", point),
            None => cmd.env_remove("SLUICE_CRASH_AT"),
        };
        cmd.output().unwrap()
    }

    /// A record that is not JSON, written by another producer between good
    /// ones: under `fail` the run stops, naming it `topic/partition@offset`
    /// (and again when restarted: it meets the same record); restarted with
    /// `--bad-records lines=dead-letter` it goes on, the output is the
    /// recount of the good records, the dead-letter topic holds the record
    /// once (for a read_committed consumer) with its position, and
    /// `sluice verify` accepts it.
    #[test]
    fn a_record_that_is_not_json_stops_the_run_or_goes_to_the_dead_letter_topic() {
        let Some(brokers) = brokers() else { return };
        let dir = tempfile::tempdir().unwrap();
        let pipeline = fresh_name("badrec");
        let expected = produce(&brokers, &format!("{pipeline}.lines"), &records(201, 100));
        let data = dir.path().join("a");
        for _ in 0..2 {
            let out = run(&brokers, &pipeline, &data, &[], None);
            let e = stderr(&out);
            assert!(!out.status.success(), "{e}");
            assert!(
                e.contains(&format!(
                    "input record {pipeline}.lines/0@100 is not an event: the value is not JSON"
                )),
                "{e}"
            );
        }
        let file = dir.path().join("counts.jsonl");
        let extra = [
            "--bad-records=lines=dead-letter".to_owned(),
            format!("--output=counts={}", file.display()),
        ];
        let out = run(&brokers, &pipeline, &data, &extra, None);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(counts_of(&file), expected);
        let dead = letters(&brokers, &format!("{pipeline}.lines.dead-letter"));
        assert_eq!(dead.len(), 1, "{dead:?}");
        assert_eq!(dead[0].position, format!("{pipeline}.lines/0@100"));
        assert_eq!(
            (dead[0].input.as_str(), dead[0].partition, dead[0].offset),
            ("lines", 0, 100)
        );
        assert_eq!(dead[0].value.as_deref(), Some(&b"not json { 100"[..]));
        assert!(dead[0].error.contains("not JSON"), "{dead:?}");
        let verify = sluice_cmd()
            .args(["verify", "--brokers", &brokers, "--data"])
            .arg(&data)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&verify.stdout);
        assert!(verify.status.success(), "{said}{}", stderr(&verify));
        assert!(said.contains(", 1 dead letters,"), "{said}");
    }

    /// A crash inside the transaction of the step that skips a bad record
    /// (its dead letter written, not committed) and one after that step
    /// commits, each followed by a run that recovers: the aborted
    /// transaction's dead letter stays hidden, the replay drops the
    /// committed one as a duplicate — a read_committed consumer sees the
    /// record in the dead-letter topic once, and the output is the recount.
    #[test]
    fn a_crash_and_replay_across_a_bad_record_dead_letters_it_once() {
        let Some(brokers) = brokers() else { return };
        let dir = tempfile::tempdir().unwrap();
        // Record 30 is in the second step (records 20..40).
        for (what, crash) in [
            ("inside", "inside-transaction:2"),
            ("after", "after-commit:3"),
        ] {
            let pipeline = fresh_name(&format!("badrec-{what}"));
            let expected = produce(&brokers, &format!("{pipeline}.lines"), &records(120, 30));
            let (data, file) = (
                dir.path().join(what),
                dir.path().join(format!("{what}.jsonl")),
            );
            let policy = "--bad-records=lines=dead-letter".to_owned();
            let out = run(
                &brokers,
                &pipeline,
                &data,
                std::slice::from_ref(&policy),
                Some(crash),
            );
            assert!(
                !out.status.success()
                    && stderr(&out).contains(&format!("crash point {}", crash.replace(':', " #"))),
                "{}",
                stderr(&out)
            );
            let extra = [policy, format!("--output=counts={}", file.display())];
            let out = run(&brokers, &pipeline, &data, &extra, None);
            assert!(out.status.success(), "{}", stderr(&out));
            assert_eq!(counts_of(&file), expected, "{what}");
            let topic = format!("{pipeline}.lines.dead-letter");
            let dead = letters(&brokers, &topic);
            assert_eq!(dead.len(), 1, "{what}: {dead:?}");
            assert_eq!(dead[0].position, format!("{pipeline}.lines/0@30"));
            let all = values(&brokers, &topic, "read_uncommitted").len();
            match what {
                // The crashed transaction's copy is in the topic, aborted.
                "inside" => assert_eq!(all, 2, "{what}"),
                _ => assert_eq!(all, 1, "{what}: the replay wrote nothing"),
            }
        }
    }
}
