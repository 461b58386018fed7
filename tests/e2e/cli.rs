//! The `sluice` command line contract: build, run, demo, and clear errors.

use crate::support::{component, recount, repo, sluice_cmd, stderr};
use std::collections::BTreeMap;
use std::path::Path;

fn write_lines(path: &Path, lines: &[&str]) {
    let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(path, body).unwrap();
}

#[test]
fn demo_counts_equal_a_plain_recount() {
    let dir = tempfile::tempdir().unwrap();
    let counts_file = dir.path().join("counts.json");
    let out = sluice_cmd()
        .args(["demo", "--repeat", "3", "--save-counts"])
        .arg(&counts_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "demo failed: {}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("top words:") && stdout.contains("events/s"),
        "{stdout}"
    );
    let counts: BTreeMap<String, i64> =
        serde_json::from_slice(&std::fs::read(&counts_file).unwrap()).unwrap();
    let text = std::fs::read_to_string(repo().join("host/tools/data/demo.txt")).unwrap();
    let expected = recount(text.lines().map(|l| (l, 3)));
    assert!(expected.len() > 300, "the bundled text is substantial");
    assert_eq!(counts, expected);
}

#[test]
fn build_prints_the_component_path_last() {
    let target = crate::support::cache_dir().join("guest-target");
    let out = sluice_cmd()
        .arg("build")
        .arg(repo().join("examples/wordcount"))
        .arg("--target-dir")
        .arg(&target)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    assert!(last.ends_with("wordcount.wasm"), "{stdout}");
    assert!(Path::new(last).is_file());

    let out = sluice_cmd()
        .arg("build")
        .arg("/definitely/not/here")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is not a circuit: no Cargo.toml (a Rust crate) and no circuit.py"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn run_twice_appends_once_and_resumes_a_grown_file() {
    let dir = tempfile::tempdir().unwrap();
    let (data, input, output) = (
        dir.path().join("data"),
        dir.path().join("in.jsonl"),
        dir.path().join("out.jsonl"),
    );
    write_lines(
        &input,
        &[
            "\"the cat\"",
            "\"the dog\"",
            "{\"delete\": \"the cat\"}",
            "{\"insert\": \"a cat\", \"weight\": 2}",
        ],
    );
    let run = || {
        let out = sluice_cmd()
            .arg("run")
            .arg(component("examples/wordcount"))
            .arg("--data")
            .arg(&data)
            .args(["--workers", "2", "--max-batch", "1", "--quiet"])
            .arg(format!("--input=lines={}", input.display()))
            .arg(format!("--output=counts={}", output.display()))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        sluice_tools::demo::integrate_counts(&std::fs::read_to_string(&output).unwrap()).unwrap()
    };
    let expected: BTreeMap<String, i64> = [("a", 2), ("cat", 2), ("dog", 1), ("the", 1)]
        .into_iter()
        .map(|(w, n)| (w.to_owned(), n))
        .collect();
    assert_eq!(run(), expected);
    assert_eq!(run(), expected, "a second run appends nothing");
    // The file grows: only the new line is appended.
    let mut body = std::fs::read_to_string(&input).unwrap();
    body.push_str("\"dog days\"\n");
    std::fs::write(&input, &body).unwrap();
    let mut grown = expected.clone();
    *grown.get_mut("dog").unwrap() += 1;
    grown.insert("days".into(), 1);
    assert_eq!(run(), grown);
    // The file changes under what was appended: refused, with a reason.
    std::fs::write(&input, body.replace("dog", "cow")).unwrap();
    let out = sluice_cmd()
        .arg("run")
        .arg(component("examples/wordcount"))
        .arg("--data")
        .arg(&data)
        .args(["--workers", "2", "--quiet"])
        .arg(format!("--input=lines={}", input.display()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("changed since"), "{}", stderr(&out));
}

/// `sluice run` steps while it appends its files, yet takes the steps it
/// would take with them appended first: every step moves each partition
/// by a whole batch or to the partition's end — also the step that
/// commits a change of W when a run starts with another `--workers` — and
/// the counts are right.
#[test]
fn run_steps_while_appending_only_on_whole_batches() {
    let dir = tempfile::tempdir().unwrap();
    let (data, input, output) = (
        dir.path().join("data"),
        dir.path().join("in.jsonl"),
        dir.path().join("out.jsonl"),
    );
    // 8 partitions filled 1 024 lines at a time; a batch of 1 500 needs
    // two of those, so a step divided while the file is half appended
    // would take less.
    let lines: Vec<String> = (0..200_000)
        .map(|i| format!("\"w{} x{}\"", i % 7_000, i % 13))
        .collect();
    let run = |upto: usize, workers: &str| {
        let body: String = lines[..upto].iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(&input, body).unwrap();
        let out = sluice_cmd()
            .arg("run")
            .arg(component("examples/wordcount"))
            .arg("--data")
            .arg(&data)
            .args(["--workers", workers, "--max-batch", "1500", "--quiet"])
            .arg(format!("--input=lines={}", input.display()))
            .arg(format!("--output=counts={}", output.display()))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let counts =
            sluice_tools::demo::integrate_counts(&std::fs::read_to_string(&output).unwrap())
                .unwrap();
        assert_eq!(
            counts,
            recount(lines[..upto].iter().map(|l| (l.as_str(), 1)))
        );
    };
    run(40_000, "2");
    // The file grows, and the run asks for another W: the change is
    // committed with a step, which must wait for whole batches too.
    run(200_000, "3");

    use sluice_storage::LogBackend;
    let log =
        sluice_embedded::EmbeddedLog::open(sluice_embedded::db::open(&data).unwrap()).unwrap();
    let last = log.last_step().unwrap().expect("steps were committed");
    let mut at: BTreeMap<sluice_core::PartitionId, u64> = BTreeMap::new();
    let mut relayouts = 0;
    for step in 0..=last {
        let record = log.step_record(step).unwrap().unwrap();
        relayouts += u32::from(record.layout.is_some());
        for (id, to) in record.frontiers.iter().flatten() {
            let from = at.insert(*id, *to).unwrap_or(0);
            // Where the partition ended when the first run finished, or
            // at the end.
            let first_end = (40_000u64 / 1024 / 8) * 1024
                + (40_000u64 % (1024 * 8))
                    .saturating_sub(u64::from(id.partition) * 1024)
                    .min(1024);
            let end = log.watermarks("lines", id.partition).unwrap().1;
            assert!(
                *to == from || *to == from + 1500 || *to == end || *to == first_end,
                "step {step} moved partition {} from {from} to {to} (its ends: {first_end}, {end})",
                id.partition
            );
        }
    }
    assert_eq!(relayouts, 1, "one change of W");
    assert!(last >= 15, "{last} steps");
}

/// A file still being written ends in a partial line: `sluice run` appends
/// only complete lines and leaves the last one, whole, for the next run.
#[test]
fn a_line_still_being_written_waits_for_its_newline() {
    let dir = tempfile::tempdir().unwrap();
    let (data, input, output) = (
        dir.path().join("data"),
        dir.path().join("in.jsonl"),
        dir.path().join("out.jsonl"),
    );
    std::fs::write(&input, "\"the cat\"\n\"the d").unwrap();
    let run = || {
        let out = sluice_cmd()
            .arg("run")
            .arg(component("examples/wordcount"))
            .arg("--data")
            .arg(&data)
            .args(["--workers", "2", "--quiet"])
            .arg(format!("--input=lines={}", input.display()))
            .arg(format!("--output=counts={}", output.display()))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        sluice_tools::demo::integrate_counts(&std::fs::read_to_string(&output).unwrap()).unwrap()
    };
    let counts = |pairs: &[(&str, i64)]| -> BTreeMap<String, i64> {
        pairs.iter().map(|(w, n)| ((*w).to_owned(), *n)).collect()
    };
    assert_eq!(run(), counts(&[("cat", 1), ("the", 1)]));
    // The writer finishes the line: it is appended whole, once.
    let mut body = std::fs::read_to_string(&input).unwrap();
    body.push_str("og\"\n");
    std::fs::write(&input, &body).unwrap();
    assert_eq!(run(), counts(&[("cat", 1), ("dog", 1), ("the", 2)]));
}

#[test]
fn run_reports_bad_input_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let wc = component("examples/wordcount");
    let bad = dir.path().join("bad.jsonl");
    write_lines(&bad, &["\"fine\"", "{oops"]);
    let run = |args: &[&str]| {
        let out = sluice_cmd().args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let e = stderr(&out);
        assert!(!e.contains("panicked"), "{e}");
        e
    };
    let data = dir.path().join("d1");
    let (wc_s, data_s) = (wc.to_str().unwrap(), data.to_str().unwrap());
    let e = run(&[
        "run",
        wc_s,
        "--data",
        data_s,
        &format!("--input=lines={}", bad.display()),
    ]);
    assert!(e.contains("line 2") && e.contains("not JSON"), "{e}");

    let e = run(&[
        "run",
        wc_s,
        "--data",
        data_s,
        "--input=lines=/no/such/file.jsonl",
    ]);
    assert!(e.contains("does not exist"), "{e}");

    let good = dir.path().join("good.jsonl");
    write_lines(&good, &["\"x\""]);
    let e = run(&[
        "run",
        wc_s,
        "--data",
        dir.path().join("d2").to_str().unwrap(),
        &format!("--input=words={}", good.display()),
    ]);
    assert!(
        e.contains("unknown input port `words`") && e.contains("lines"),
        "{e}"
    );

    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let e = run(&[
        "run",
        core.to_str().unwrap(),
        "--data",
        dir.path().join("d3").to_str().unwrap(),
    ]);
    assert!(
        e.contains("core WebAssembly module, not a component"),
        "{e}"
    );

    let empty = dir.path().join("empty.wasm");
    std::fs::write(&empty, b"\0asm\x0d\0\x01\0").unwrap();
    let e = run(&[
        "run",
        empty.to_str().unwrap(),
        "--data",
        dir.path().join("d5").to_str().unwrap(),
    ]);
    assert!(
        e.contains("does not implement the sluice:circuit/pipeline-worker")
            && e.contains("exports []"),
        "{e}"
    );

    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"hello").unwrap();
    let e = run(&[
        "run",
        junk.to_str().unwrap(),
        "--data",
        dir.path().join("d4").to_str().unwrap(),
    ]);
    assert!(e.contains("not a WebAssembly component"), "{e}");

    // Another W rescales (tests/e2e/rescale.rs); none at all is refused.
    let e = run(&[
        "run",
        "--data",
        data_s,
        wc_s,
        "--workers",
        "0",
        &format!("--input=lines={}", good.display()),
    ]);
    assert!(e.contains("at least one worker"), "{e}");
}

#[test]
fn a_second_process_on_the_same_data_is_refused_naming_the_holder() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let (data, input) = (dir.path().join("data"), dir.path().join("in.jsonl"));
    let lines: Vec<String> = (0..200_000)
        .map(|i| format!("\"word{} other{}\"", i % 97, i % 13))
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let wasm = component("examples/wordcount");
    let mut first = sluice_cmd()
        .arg("run")
        .arg(&wasm)
        .arg("--data")
        .arg(&data)
        .args(["--workers", "2", "--max-batch", "100", "--quiet"])
        .arg(format!("--input=lines={}", input.display()))
        .env("SLUICE_LOG", "sluice=debug")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the first process is committing steps.
    let mut log = BufReader::new(first.stderr.take().unwrap());
    let mut line = String::new();
    while log.read_line(&mut line).unwrap() > 0 && !line.contains("step committed") {
        line.clear();
    }
    assert!(
        line.contains("step committed"),
        "the first run never committed a step"
    );
    let second = sluice_cmd()
        .arg("run")
        .arg(&wasm)
        .arg("--data")
        .arg(&data)
        .args(["--workers", "2", "--quiet"])
        .output()
        .unwrap();
    let _ = first.kill();
    let _ = first.wait();
    assert!(!second.status.success());
    let e = stderr(&second);
    assert!(
        e.contains("is in use by pid") && e.contains(&format!("pid {}", first.id())),
        "{e}"
    );
}

/// `scripts/setup.sh` decides what to install from dpkg's database, never
/// from files another package may have left: a fresh image ships
/// `libclang-cpp.so.14` (libclang-cpp14), which a file glob once took for
/// libclang and skipped `libclang-dev`, and the RocksDB build then failed.
#[test]
fn setup_plans_libclang_dev_from_dpkg_not_from_files() {
    let plan = |status: &str, path: Option<&str>| {
        let admindir = tempfile::tempdir().unwrap();
        std::fs::create_dir(admindir.path().join("updates")).unwrap();
        std::fs::write(admindir.path().join("status"), status).unwrap();
        // Beside it, a tree like the fresh image's: libclang-cpp, no libclang.
        let tree = admindir.path().join("usr/lib/llvm-14/lib");
        std::fs::create_dir_all(&tree).unwrap();
        std::fs::write(tree.join("libclang-cpp.so.14"), b"").unwrap();
        let mut cmd = std::process::Command::new(repo().join("scripts/setup.sh"));
        cmd.arg("--dry-run")
            .env("SLUICE_DPKG_ADMINDIR", admindir.path())
            .env_remove("LIBCLANG_PATH");
        if let Some(p) = path {
            cmd.env("SLUICE_SETUP_PATH", p);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let installed = "Package: libclang-dev\nStatus: install ok installed\n\
                     Version: 1:14.0-55.7~deb12u1\nArchitecture: amd64\n\n";
    assert!(
        plan("", None).contains("libclang-dev"),
        "a fresh root lacks it"
    );
    let removed = installed.replace("install ok installed", "deinstall ok config-files");
    assert!(
        plan(&removed, None).contains("libclang-dev"),
        "removed is not installed"
    );
    assert!(!plan(installed, None).contains("libclang-dev"));
    let bare = plan(installed, Some("/nonexistent"));
    assert!(
        bare.contains("make")
            && bare.contains("g++")
            && bare.contains("kcat")
            && bare.contains("protobuf-compiler"),
        "{bare}"
    );
    // The tests' servers on a fresh root: etcd from Debian, by package.
    let admindir = tempfile::tempdir().unwrap();
    std::fs::create_dir(admindir.path().join("updates")).unwrap();
    std::fs::write(admindir.path().join("status"), "").unwrap();
    let out = std::process::Command::new(repo().join("scripts/setup.sh"))
        .args(["--tests", "--dry-run"])
        .env("SLUICE_DPKG_ADMINDIR", admindir.path())
        .env("SLUICE_SETUP_PATH", "/nonexistent")
        .output()
        .unwrap();
    let plan = String::from_utf8(out.stdout).unwrap();
    assert!(
        plan.contains("etcd-server") && plan.contains("curl") && plan.contains("chromium"),
        "{plan}"
    );
}
