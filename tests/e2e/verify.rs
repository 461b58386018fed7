//! `sluice verify`: consistent pipelines pass (also right after a crash),
//! and each deliberate corruption is reported as exactly that violation.

use crate::support::{component, sluice_cmd};
use sluice_core::{OutputEntry, StepRecord, hash_outputs};
use sluice_embedded::db::{self, CF_OUTPUT, CF_STEPS};
use sluice_embedded::{EmbeddedLog, output_key};
use sluice_storage::LogBackend;
use std::path::{Path, PathBuf};
use std::process::Output;

fn verify(data: &Path) -> (bool, String) {
    let out: Output = sluice_cmd()
        .arg("verify")
        .arg("--data")
        .arg(data)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Runs word count on 2000 lines; with `crash_after_commits`, the run aborts
/// right after that many commits (checkpoints every 3 steps).
fn pipeline(dir: &Path, name: &str, crash_after_commits: Option<u32>) -> PathBuf {
    let input = dir.join("lines.jsonl");
    if !input.exists() {
        let lines: Vec<String> = (0..2000)
            .map(|i| format!("\"w{} w{} w{}\"", i % 31, i % 7, i % 101))
            .collect();
        std::fs::write(&input, lines.join("\n")).unwrap();
    }
    let data = dir.join(name);
    let mut cmd = sluice_cmd();
    cmd.arg("run")
        .arg(component("examples/wordcount"))
        .arg("--data")
        .arg(&data)
        .args([
            "--workers",
            "2",
            "--max-batch",
            "50",
            "--checkpoint-every",
            "3",
            "--quiet",
        ])
        .arg(format!("--input=lines={}", input.display()));
    if let Some(n) = crash_after_commits {
        cmd.env("SLUICE_CRASH_AT", format!("after-commit:{n}"));
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    match crash_after_commits {
        None => assert!(out.status.success(), "{stderr}"),
        Some(n) => {
            assert!(!out.status.success(), "the run should have crashed");
            assert!(
                stderr.contains(&format!("crash point after-commit #{n}")),
                "{stderr}"
            );
        }
    }
    data
}

#[test]
fn a_finished_and_a_crashed_pipeline_are_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, text) = verify(&pipeline(dir.path(), "done", None));
    assert!(ok && text.contains("consistent:"), "{text}");
    let (ok, text) = verify(&pipeline(dir.path(), "crashed", Some(8)));
    assert!(ok && text.contains("consistent: 8 steps"), "{text}");
}

#[test]
fn a_duplicate_step_entry_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let data = pipeline(dir.path(), "dup", None);
    {
        let database = db::open(&data).unwrap();
        let cf = db::cf(&database, CF_OUTPUT).unwrap();
        let entry = database
            .get_cf(cf, output_key("counts", 3, 0))
            .unwrap()
            .expect("step 3 has an entry");
        database
            .put_cf(cf, output_key("counts", 4, 0), entry)
            .unwrap();
    }
    let (ok, text) = verify(&data);
    assert!(!ok, "{text}");
    assert!(
        text.contains("violation: output log `counts` holds a second entry for step 3 worker 0 (stored as step 4 worker 0)"),
        "{text}"
    );
}

#[test]
fn a_trim_above_the_checkpoint_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let data = pipeline(dir.path(), "trim", Some(8));
    {
        // Steps 0..=7 are committed; the newest checkpoint is step 5's.
        let database = db::open(&data).unwrap();
        let log = EmbeddedLog::open(database).unwrap();
        let frontier = log.step_record(7).unwrap().unwrap().frontiers[0].clone();
        let (id, offset) = frontier.iter().next().unwrap();
        // Bypass the host's guard (which refuses this) and trim the log itself.
        log.trim("lines", id.partition, *offset).unwrap();
    }
    let (ok, text) = verify(&data);
    assert!(!ok, "{text}");
    assert!(
        text.contains("violation: input `lines` partition 0 is trimmed below offset 400, above the newest committed checkpoint's frontier 300"),
        "{text}"
    );
}

/// Rewrites step `step`'s record in `data` with `f`.
fn rewrite_record(data: &Path, step: u64, f: impl FnOnce(&mut StepRecord)) {
    let database = db::open(data).unwrap();
    let cf = db::cf(&database, CF_STEPS).unwrap();
    let bytes = database.get_cf(cf, step.to_be_bytes()).unwrap().unwrap();
    let mut record: StepRecord = postcard::from_bytes(&bytes).unwrap();
    f(&mut record);
    database
        .put_cf(
            cf,
            step.to_be_bytes(),
            postcard::to_allocvec(&record).unwrap(),
        )
        .unwrap();
}

/// Rewrites the `counts` entry of (`step`, `worker`) in `data` with `f`.
fn rewrite_entry(data: &Path, step: u64, worker: u32, f: impl FnOnce(&mut OutputEntry)) {
    let database = db::open(data).unwrap();
    let cf = db::cf(&database, CF_OUTPUT).unwrap();
    let key = output_key("counts", step, worker);
    let bytes = database.get_cf(cf, &key).unwrap().unwrap();
    let mut entry: OutputEntry = postcard::from_bytes(&bytes).unwrap();
    f(&mut entry);
    database
        .put_cf(cf, &key, postcard::to_allocvec(&entry).unwrap())
        .unwrap();
}

/// A step rewritten in place, outputs and record consistent with each other
/// (keys stay unique, hashes match): the next record's link gives it away.
#[test]
fn a_step_rewritten_in_place_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let data = pipeline(dir.path(), "rewritten", None);
    let mut events = Vec::new();
    rewrite_entry(&data, 3, 0, |e| {
        e.events[0].weight += 1;
        events = e.events.clone();
    });
    rewrite_record(&data, 3, |r| r.output_hashes[0] = hash_outputs(&[events]));
    let (ok, text) = verify(&data);
    assert!(!ok, "{text}");
    assert!(
        text.contains("violation: step 4's record does not chain to step 3's"),
        "{text}"
    );
}

/// A partition vanishing from a worker's frontier is reported.
#[test]
fn a_partition_dropped_from_a_frontier_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let data = pipeline(dir.path(), "dropped", Some(8));
    let mut frontier = Default::default();
    rewrite_record(&data, 7, |r| {
        r.frontiers[0].clear();
        frontier = r.frontiers[0].clone();
    });
    rewrite_entry(&data, 7, 0, |e| e.frontier = frontier);
    let (ok, text) = verify(&data);
    assert!(!ok, "{text}");
    assert!(
        text.contains("violation: step 7: the frontiers lost `lines` partition 0"),
        "{text}"
    );
}

/// A worker whose frontier names a partition another worker reads is
/// reported.
#[test]
fn a_partition_read_by_the_wrong_worker_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let data = pipeline(dir.path(), "stolen", Some(8));
    let mut frontier = Default::default();
    rewrite_record(&data, 7, |r| {
        let theirs: Vec<_> = r.frontiers[1].iter().map(|(k, v)| (*k, *v)).collect();
        r.frontiers[0].extend(theirs);
        frontier = r.frontiers[0].clone();
    });
    rewrite_entry(&data, 7, 0, |e| e.frontier = frontier);
    let (ok, text) = verify(&data);
    assert!(!ok, "{text}");
    assert!(
        text.contains("violation: step 7: worker 0 read `lines` partition 1, which worker 1 reads"),
        "{text}"
    );
}

#[test]
fn consumers_resume_after_a_position() {
    let dir = tempfile::tempdir().unwrap();
    let data = pipeline(dir.path(), "read", None);
    let read = |after: Option<&str>| -> Vec<serde_json::Value> {
        let mut cmd = sluice_cmd();
        cmd.arg("read")
            .arg("--data")
            .arg(&data)
            .args(["--output", "counts"]);
        if let Some(a) = after {
            cmd.args(["--after", a]);
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let all = read(None);
    assert!(all.len() > 100);
    let key = |v: &serde_json::Value| {
        let p = &v["position"];
        (
            p["step"].as_u64().unwrap(),
            p["worker"].as_u64().unwrap(),
            p["index"].as_u64().unwrap(),
        )
    };
    assert!(
        all.windows(2).all(|w| key(&w[0]) < key(&w[1])),
        "positions strictly increase"
    );
    assert!(
        all.iter()
            .all(|v| v["frontier"].as_array().is_some_and(|f| !f.is_empty()))
    );
    let (s, w, i) = key(&all[57]);
    assert_eq!(read(Some(&format!("{s}:{w}:{i}"))), all[58..].to_vec());
}
