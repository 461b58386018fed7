//! Circuits in Python (issue #30): the Python SDK's own tests, and Python
//! circuits built by `sluice build` (componentize-py) run by the same host
//! with the same guarantees. The Python word count's output equals the Rust
//! word count's at W = 1 and W = 3 and across a rescale 2 → 3; a crash
//! campaign over it (and over a Python circuit that reads the clocks,
//! `random` and `hash()`) finds no violation; it runs on the server.

use crate::support::crash::{Hosts, Positions, campaign_of};
use crate::support::server::{Server, integrated_counts};
use crate::support::{component, recount, repo, sluice_cmd, stderr, verified};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn python_wordcount() -> PathBuf {
    component("examples/python-wordcount")
}

/// Lines with words in mixed case and punctuation, some deleted later:
/// the input file's lines (JSON) and the live lines.
fn input(n: usize, salt: &str) -> (Vec<String>, Vec<String>) {
    let words = [
        "Stream", "state,", "(shard)", "WORKER", "step", "log.", "trim",
    ];
    let mut file = Vec::new();
    let mut live: Vec<String> = Vec::new();
    for i in 0..n {
        if i % 9 == 8 {
            let gone = live.remove((i * 7) % live.len());
            file.push(serde_json::json!({ "delete": gone }).to_string());
            continue;
        }
        let line = format!(
            "{salt}{} {} {} k{}",
            i % 41,
            words[i % words.len()],
            words[(i / 3) % words.len()],
            i % 17
        );
        file.push(serde_json::to_string(&line).unwrap());
        live.push(line);
    }
    (file, live)
}

fn append(path: &Path, lines: &[String]) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    for l in lines {
        writeln!(f, "{l}").unwrap();
    }
}

/// `sluice run` of `wasm` on `data` with W = `workers`: the integrated
/// counts it wrote.
fn run(wasm: &Path, data: &Path, input: &Path, workers: u32) -> BTreeMap<String, i64> {
    let output = data.with_extension("out.jsonl");
    let out = sluice_cmd()
        .arg("run")
        .arg(wasm)
        .arg("--data")
        .arg(data)
        .args(["--workers", &workers.to_string(), "--max-batch", "60"])
        .args(["--checkpoint-every", "2", "--quiet"])
        .arg(format!("--input=lines={}", input.display()))
        .arg(format!("--output=counts={}", output.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "W={workers}: {}", stderr(&out));
    sluice_tools::demo::integrate_counts(&std::fs::read_to_string(&output).unwrap()).unwrap()
}

#[test]
fn the_python_sdk_s_own_tests_pass() {
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-s", "tests"])
        .current_dir(repo().join("guest-sdk/python"))
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    let text = stderr(&out);
    assert!(text.contains("OK"), "{text}");
}

/// Issue #30's acceptance: the Python word count's output equals the Rust
/// word count's on the same input (with deletes) at W = 1 and W = 3, and
/// after a rescale 2 → 3 of one data directory; both equal a recount.
#[test]
fn python_wordcount_equals_the_rust_one_at_one_and_three_workers_and_across_a_rescale() {
    let dir = tempfile::tempdir().unwrap();
    let (first, live1) = input(700, "a");
    let (second, live2) = input(500, "b");
    let file = dir.path().join("lines.jsonl");
    append(&file, &first);
    append(&file, &second);
    let expected = recount(live1.iter().chain(&live2).map(|l| (l.as_str(), 1)));
    let rust = run(
        &component("examples/wordcount"),
        &dir.path().join("rust"),
        &file,
        1,
    );
    assert_eq!(rust, expected, "the Rust word count equals the recount");
    let python = python_wordcount();
    for workers in [1, 3] {
        let data = dir.path().join(format!("python-w{workers}"));
        assert_eq!(
            run(&python, &data, &file, workers),
            rust,
            "Python at W={workers}"
        );
        assert!(verified(&data).contains("consistent"));
    }
    // One data directory: the first part at W = 2, then everything at 3.
    let part = dir.path().join("part.jsonl");
    append(&part, &first);
    let data = dir.path().join("python-rescaled");
    assert_eq!(
        run(&python, &data, &part, 2),
        recount(live1.iter().map(|l| (l.as_str(), 1)))
    );
    append(&part, &second);
    assert_eq!(run(&python, &data, &part, 3), rust, "after 2 → 3");
    assert!(verified(&data).contains("consistent"));
}

/// The crash campaign with Python circuits: the word count (with deletes,
/// W drawn anew for every run) and, every second trial, a circuit that
/// reads the wall and monotonic clocks, `random` and `hash()` — a replay
/// that saw other values would write other bytes and stop the pipeline.
#[test]
fn a_crash_campaign_over_python_circuits_finds_no_violation() {
    let out = sluice_cmd()
        .arg("chaos")
        .args([
            "--trials",
            "8",
            "--seed",
            "3030",
            "--rescale",
            "--orders",
            "300",
        ])
        .arg("--wordcount")
        .arg(python_wordcount())
        .arg("--noisy-component")
        .arg(component("tests/guests/python-noisy"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{}", stderr(&out));
    assert!(
        stdout.contains("trials: 8 (4 of the noisy circuit; 4 of word count)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("violations: 0 (lost 0, duplicated 0, wrong 0, audit failures 0)"),
        "{stdout}"
    );
}

/// The Python Nexmark q1 and q4 give the Rust ones' output (as JSON
/// values) on the same generated events, at W = 2.
#[test]
fn python_nexmark_q1_and_q4_equal_the_rust_ones() {
    let nx = crate::examples::nexmark(8_000);
    let dir = tempfile::tempdir().unwrap();
    let q4_inputs = [("auction", nx.auction.as_path()), ("bid", nx.bid.as_path())];
    for (query, inputs, port) in [
        ("q1", &[("bid", nx.bid.as_path())][..], "euro_bids"),
        ("q4", &q4_inputs[..], "avg_price_per_category"),
    ] {
        let rust = crate::examples::run(
            &format!("examples/nexmark-{query}"),
            dir.path(),
            inputs,
            port,
        );
        let python = crate::examples::run(
            &format!("examples/python-nexmark-{query}"),
            dir.path(),
            inputs,
            port,
        );
        assert!(!rust.is_empty(), "{query}");
        assert_eq!(python, rust, "{query}");
    }
}

/// The crash test with the Python word count: `sluice run` SIGKILLed at
/// random moments (ingest, steps, commits, checkpoints) and rerun each
/// time; the final output equals the recount.
#[test]
fn the_python_wordcount_survives_sigkill_at_random_moments() {
    let run = campaign_of(
        "examples/python-wordcount",
        60_000,
        &[],
        None,
        Positions::Check,
        Hosts::One,
    );
    assert!(run.kills > 0, "no kill landed");
}

/// A Python exception in the circuit's own code fails the pipeline with
/// the exception and where it was raised, and nothing is committed.
#[test]
fn an_exception_in_a_python_circuit_is_reported_with_where_it_was_raised() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    append(&input, &["\"fine\"".to_owned(), "\"raise\"".to_owned()]);
    let out = sluice_cmd()
        .arg("run")
        .arg(component("tests/guests/python-noisy"))
        .arg("--data")
        .arg(dir.path().join("data"))
        .arg(format!("--input=in={}", input.display()))
        .arg(format!(
            "--output=out={}",
            dir.path().join("out.jsonl").display()
        ))
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("ValueError: asked to (at "), "{err}");
    assert!(err.contains("circuit.py:"), "{err}");
}

/// The server's flow with a Python component: upload, create, push, and
/// the output read back equals a recount.
#[test]
fn a_python_circuit_runs_on_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let t = server.tenant("pythonista");
    t.deploy(&python_wordcount(), "wc-py", "wc", 2, false)
        .unwrap();
    let (lines, live) = input(400, "s");
    let file = dir.path().join("push.jsonl");
    append(&file, &lines);
    t.push("wc", "lines", &file, &Default::default()).unwrap();
    let expected = recount(live.iter().map(|l| (l.as_str(), 1)));
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let got = integrated_counts(&t, "wc");
        if got == expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the output never reached the recount ({} of {} words): {}",
            got.len(),
            expected.len(),
            t.status(Some("wc")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
