//! Layout changes (issue #12): a pipeline goes from W to W′ workers, on the
//! command line and on a running server, moving only the shards the new
//! balance needs, through crashes in the middle, and every effect counts
//! once.

use crate::support::server::{Server, code, raw, raw_or_gone};
use crate::support::{component, recount, sluice_cmd, stderr, verified};
use sluice::client::Client;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

/// `n` lines with words that repeat across lines (keyed state that moves).
fn lines(n: usize, salt: &str) -> Vec<String> {
    (0..n)
        .map(|i| format!("{salt}{} w{} k{} common", i % 97, i % 13, (i * 7) % 31))
        .collect()
}

fn append(path: &Path, lines: &[String]) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    for l in lines {
        writeln!(f, "{}", serde_json::to_string(l).unwrap()).unwrap();
    }
}

/// `sluice run` with `workers` (and `crash_at` armed, if any), plus
/// `extra` arguments.
fn run_with(
    data: &Path,
    input: &Path,
    output: &Path,
    workers: u32,
    crash_at: Option<&str>,
    extra: &[&str],
) -> Output {
    let mut cmd = sluice_cmd();
    cmd.arg("run")
        .arg(component("examples/wordcount"))
        .arg("--data")
        .arg(data)
        .args([
            "--workers",
            &workers.to_string(),
            "--max-batch",
            "50",
            "--quiet",
        ])
        .args(["--checkpoint-every", "3"])
        .args(extra)
        .arg(format!("--input=lines={}", input.display()))
        .arg(format!("--output=counts={}", output.display()));
    match crash_at {
        Some(point) => cmd.env("SLUICE_CRASH_AT", point),
        None => cmd.env_remove("SLUICE_CRASH_AT"),
    };
    cmd.output().unwrap()
}

/// `sluice run` with `workers` (and `crash_at` armed, if any).
fn run(data: &Path, input: &Path, output: &Path, workers: u32, crash_at: Option<&str>) -> Output {
    run_with(data, input, output, workers, crash_at, &[])
}

fn counts(output: &Path) -> BTreeMap<String, i64> {
    sluice_tools::demo::integrate_counts(&std::fs::read_to_string(output).unwrap()).unwrap()
}

/// W = 2 → 3 → 1 → 4 with `sluice run` on one data directory, more input
/// each time, a crash in the middle of two of the changes (the hand-off,
/// and right after the new layout's first step): the output always equals
/// a recount, and the audit passes every step against its layout.
#[test]
fn sluice_run_rescales_a_data_directory_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (data, input, output) = (
        dir.path().join("data"),
        dir.path().join("in.jsonl"),
        dir.path().join("out.jsonl"),
    );
    let mut all = Vec::new();
    for (round, (workers, crash)) in [
        (2, None),
        (3, Some("mid-handoff:1")),
        (1, Some("after-relayout:1")),
        (4, None),
    ]
    .into_iter()
    .enumerate()
    {
        let more = lines(400, &format!("r{round}x"));
        append(&input, &more);
        all.extend(more);
        if let Some(point) = crash {
            let out = run(&data, &input, &output, workers, Some(point));
            assert!(!out.status.success(), "{point} was never reached");
            assert!(
                stderr(&out).contains(&format!("crash point {}", point.split(':').next().unwrap())),
                "{}",
                stderr(&out)
            );
        }
        let out = run(&data, &input, &output, workers, None);
        assert!(out.status.success(), "W={workers}: {}", stderr(&out));
        assert_eq!(
            counts(&output),
            recount(all.iter().map(|l| (l.as_str(), 1))),
            "after the change to W={workers}"
        );
    }
    let text = verified(&data);
    assert!(text.contains("consistent"), "{text}");
}

/// Waits until `pipeline` reports `workers` workers and no input lag.
fn await_settled(client: &Client, pipeline: &str, workers: u32) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s: serde_json::Value =
            serde_json::from_str(&client.status(Some(pipeline)).unwrap()).unwrap();
        if s["workers"] == workers && s["input_lag"] == 0 && s["state"] != "starting" {
            return s;
        }
        assert_ne!(s["state"], "failed", "{s}");
        assert!(
            Instant::now() < deadline,
            "never settled at W={workers}: {s}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A running server pipeline goes 2 → 3 → 1 → 4 while input flows in, is
/// SIGKILLed in the middle of a change, comes back at the W its tenant
/// asked for, and its output equals a recount.
#[test]
fn a_server_pipeline_rescales_while_input_flows_and_survives_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data);
    let tenant = server.tenant("acme");
    tenant
        .deploy(&component("examples/wordcount"), "wc", "wc", 2, false)
        .unwrap();
    let url = server.url.clone();
    let token = tenant.token().to_owned();
    let push = |url: &str, batch: &[String]| {
        let body: String = batch
            .iter()
            .map(|l| serde_json::to_string(l).unwrap() + "\n")
            .collect();
        let (status, text) = raw(
            "POST",
            &format!("{url}/pipelines/wc/input/lines"),
            Some(&token),
            "application/x-ndjson",
            body.as_bytes(),
        );
        assert_eq!(status, 200, "{text}");
    };
    let mut all = Vec::new();
    for (round, workers) in [3u32, 1].into_iter().enumerate() {
        // Input flows in while the layout changes.
        let batches: Vec<Vec<String>> = (0..6)
            .map(|i| lines(60, &format!("a{round}b{i}x")))
            .collect();
        push(&url, &batches[0]);
        let (status, body) = raw(
            "PATCH",
            &format!("{url}/pipelines/wc"),
            Some(&token),
            "application/json",
            format!("{{\"workers\": {workers}}}").as_bytes(),
        );
        assert_eq!(status, 200, "{body}");
        for b in &batches[1..] {
            push(&url, b);
            std::thread::sleep(Duration::from_millis(20));
        }
        all.extend(batches.into_iter().flatten());
        await_settled(&tenant, "wc", workers);
        assert_eq!(
            crate::support::server::integrated_counts(&tenant, "wc"),
            recount(all.iter().map(|l| (l.as_str(), 1)))
        );
    }
    // Beyond the tenant's max_workers: refused, nothing changes.
    let (status, body) = raw(
        "PATCH",
        &format!("{url}/pipelines/wc"),
        Some(&token),
        "application/json",
        b"{\"workers\": 9}",
    );
    assert_eq!(
        (status, code(&body).as_str()),
        (422, "limit_exceeded"),
        "{body}"
    );
    drop(server);

    // 1 → 4 on a server armed to die in the middle of the hand-off.
    let mut server = Server::start_with_env(&data, &[], &[("SLUICE_CRASH_AT", "mid-handoff:1")]);
    let more = lines(300, "killedx");
    push(&server.url, &more);
    all.extend(more);
    // The runner takes the request at once: the crash may strike before
    // the answer is written (then the connection just ends).
    match raw_or_gone(
        "PATCH",
        &format!("{}/pipelines/wc", server.url),
        Some(&token),
        "application/json",
        b"{\"workers\": 4}",
    ) {
        Ok((status, body)) => assert_eq!(status, 200, "{body}"),
        Err(e) => eprintln!("the server died before answering the PATCH: {e}"),
    }
    assert!(
        server.wait_exit(Duration::from_secs(60)),
        "the crash point was never reached"
    );
    // Restarted: the pipeline recovers, changes to the W asked for, and
    // counts every line once.
    let server = Server::start(&data);
    let client = Client::new(&server.url, &token);
    let last = lines(200, "afterx");
    push(&server.url, &last);
    all.extend(last);
    await_settled(&client, "wc", 4);
    assert_eq!(
        crate::support::server::integrated_counts(&client, "wc"),
        recount(all.iter().map(|l| (l.as_str(), 1)))
    );
}

/// The same on Kafka logs: W = 2 → 3 → 1 with the step records, outputs
/// and input in topics; a crash mid-handoff on the way.
#[cfg(feature = "kafka")]
#[test]
fn a_kafka_pipeline_rescales_exactly_once() {
    let Some(brokers) = crate::kafka::brokers() else {
        return;
    };
    let pipeline = crate::kafka::fresh_name("rescale");
    let dir = tempfile::tempdir().unwrap();
    let (data, input, output) = (
        dir.path().join("data"),
        dir.path().join("in.jsonl"),
        dir.path().join("out.jsonl"),
    );
    let kafka = [
        "--log",
        "kafka",
        "--brokers",
        &brokers,
        "--pipeline",
        &pipeline,
    ];
    let run = |workers: u32, crash_at: Option<&str>| {
        run_with(&data, &input, &output, workers, crash_at, &kafka)
    };
    let mut all = Vec::new();
    for (round, (workers, crash)) in [(2, None), (3, Some("mid-handoff:1")), (1, None)]
        .into_iter()
        .enumerate()
    {
        let more = lines(300, &format!("k{round}x"));
        append(&input, &more);
        all.extend(more);
        if let Some(point) = crash {
            let out = run(workers, Some(point));
            assert!(!out.status.success(), "{point} was never reached");
        }
        let out = run(workers, None);
        assert!(out.status.success(), "W={workers}: {}", stderr(&out));
        assert_eq!(
            counts(&output),
            recount(all.iter().map(|l| (l.as_str(), 1))),
            "after the change to W={workers}"
        );
    }
}
