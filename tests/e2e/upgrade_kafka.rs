//! Changing a running circuit (issue #31) on Kafka logs: the change is
//! recorded on the pipeline's meta topic in a transaction of the step
//! producer (the commit point there), so every host that opens the
//! pipeline afterwards — this data directory after a crash between that
//! record and its own metadata, or another machine with a fresh data
//! directory and the checkpoints in a shared store — follows it: it runs
//! the new component only, and its recovery takes the checkpoint of the
//! change through the new version's `upgrade`.
#![cfg(feature = "kafka")]

use crate::kafka::{brokers, fresh_name};
use crate::support::crash::{aborted_at, env_count, seeded};
use crate::support::{component, recount, sluice_cmd, stderr};
use crate::upgrade_switch::{
    assert_verified, input, integrate_pairs, kill_upgrade, recount_lengths, run_cmd,
    run_with_kills, store_in, upgrade_cmd, verify_cmd, with_store,
};
use std::path::Path;
use std::process::Command;

/// `sluice run` of `wasm` on Kafka (`--log kafka`), in data directory
/// `data`, writing the outputs named into `dir`.
fn run_on_kafka(
    wasm: &Path,
    data: &Path,
    file: &Path,
    outputs: &[&str],
    dir: &Path,
    brokers: &str,
    pipeline: &str,
) -> Command {
    let mut cmd = run_cmd(wasm, data, file, outputs, dir);
    cmd.args(["--log=kafka", &format!("--brokers={brokers}")])
        .arg(format!("--pipeline={pipeline}"));
    cmd
}

/// Word count on Kafka, then `sluice upgrade` to version 2 (killed first:
/// at a random moment, or right after the record on the meta topic, its
/// commit point there), then more input; every other trial keeps the
/// checkpoints in an object store and runs version 2 on another "machine"
/// (a fresh data directory), where version 1 is refused. The counts go on
/// from the carried state exactly once, the new count starts at the
/// switch, and the audit finds the logs consistent.
#[test]
fn an_upgrade_on_kafka_is_followed_by_every_host_that_opens_the_pipeline() {
    let Some(brokers) = brokers() else { return };
    let v1 = component("examples/wordcount");
    let v2 = component("tests/guests/wordcount-v2");
    let mut rng = seeded("SLUICE_KAFKA_UPGRADE_SEED", "kafka upgrade");
    let trials = env_count("SLUICE_KAFKA_UPGRADE_TRIALS", 4);
    let (mut kills, mut upgrade_kills, mut retaken, mut elsewhere) = (0, 0, 0, 0);
    for trial in 0..trials {
        let pipeline = fresh_name("upgrade");
        let dir = tempfile::tempdir().unwrap();
        let here = dir.path().join("here");
        let store = (trial % 2 == 1).then(|| store_in(dir.path()));
        // `sluice upgrade --data DIR` finds the pipeline's name and topics
        // in its metadata: it needs the brokers (and the store).
        let kafka = |mut cmd: Command| {
            cmd.arg(format!("--brokers={brokers}"));
            with_store(&store, cmd)
        };
        let (before, before_pairs) = input(&mut rng, 500, &[]);
        let (after, after_pairs) = input(&mut rng, 500, &before_pairs);
        let (a, b) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
        std::fs::write(&a, before).unwrap();
        std::fs::write(&b, after).unwrap();
        let run = |wasm: &Path, data: &Path, file: &Path, outputs: &[&str]| {
            with_store(
                &store,
                run_on_kafka(wasm, data, file, outputs, dir.path(), &brokers, &pipeline),
            )
        };

        let (k, _) = run_with_kills(&mut rng, || run(&v1, &here, &a, &["counts"]), 1, None);
        kills += k;

        if trial == 0 {
            // The upgrade needs the brokers the pipeline's logs are on.
            let out = upgrade_cmd(&v2, &here, &[])
                .env_remove("SLUICE_KAFKA_BROKERS")
                .output()
                .unwrap();
            assert!(!out.status.success());
            assert!(stderr(&out).contains("pass --brokers"), "{}", stderr(&out));
        }
        // The upgrade, killed first: right after its record on the meta
        // topic (its data directory's metadata not yet rewritten), or at a
        // random moment; then made, or found made.
        let first = kafka(upgrade_cmd(&v2, &here, &[]));
        let (status, killed) = if trial % 3 == 2 {
            let mut first = first;
            let out = first
                .env("SLUICE_CRASH_AT", "after-upgrade-record")
                .output()
                .unwrap();
            assert!(
                aborted_at(&stderr(&out), "after-upgrade-record"),
                "{}",
                stderr(&out)
            );
            (out.status, true)
        } else {
            kill_upgrade(&mut rng, first, false, 1500)
        };
        upgrade_kills += u32::from(killed);
        let out = kafka(upgrade_cmd(&v2, &here, &[])).output().unwrap();
        if out.status.success() {
            assert!(!status.success(), "made twice: {}", stderr(&out));
        } else {
            assert!(
                stderr(&out).contains("already runs component"),
                "trial {trial}: {}",
                stderr(&out)
            );
        }

        // Version 2 runs here, or on another machine (a fresh data
        // directory, the checkpoints from the store), where version 1 no
        // longer opens the pipeline.
        let there = dir.path().join("there");
        let refused = |wasm: &Path, file: &Path, why: &str| {
            let out = run(wasm, &there, file, &["counts"]).output().unwrap();
            assert!(!out.status.success());
            assert!(
                stderr(&out).contains(why),
                "trial {trial}: {}",
                stderr(&out)
            );
        };
        let data = if store.is_some() {
            refused(&v1, &a, "`sluice upgrade` moves");
            std::fs::remove_dir_all(&there).unwrap();
            elsewhere += 1;
            there
        } else {
            // Without a shared store, a fresh data directory has not the
            // checkpoint of the change: refused, saying so, rather than
            // replaying version 1's steps under version 2.
            refused(&v2, &b, "which this host does not have (it has none)");
            here.clone()
        };
        let n = rng.below(2) as u32;
        let (k, log) = run_with_kills(
            &mut rng,
            || run(&v2, &data, &b, &["counts", "lengths"]),
            n,
            Some("after-commit:1"),
        );
        kills += k;
        let this = log
            .matches("taking the checkpoint of the component before the upgrade")
            .count();
        assert!(
            this >= 2,
            "trial {trial}: the old checkpoint taken through `upgrade` {this} times"
        );
        retaken += this;

        let counts = std::fs::read_to_string(dir.path().join("counts.jsonl")).unwrap();
        let all: Vec<(String, i64)> = before_pairs.iter().chain(&after_pairs).cloned().collect();
        assert_eq!(
            sluice_tools::demo::integrate_counts(&counts).unwrap(),
            recount(all.iter().map(|(l, w)| (l.as_str(), *w))),
            "trial {trial}: the counts go on from the carried state"
        );
        let lengths = std::fs::read_to_string(dir.path().join("lengths.jsonl")).unwrap();
        assert_eq!(
            integrate_pairs(&lengths),
            recount_lengths(&after_pairs),
            "trial {trial}: the new count started empty at the switch"
        );
        let out = verify_cmd(&data, &store)
            .arg(format!("--brokers={brokers}"))
            .output()
            .unwrap();
        assert_verified(&out, &format!("trial {trial}"));
    }
    eprintln!(
        "kafka upgrade test: {trials} trials ({elsewhere} run on another machine), {kills} \
         SIGKILLs of runs, {upgrade_kills} of upgrades; the old version's checkpoint taken \
         through `upgrade` {retaken} times"
    );
}

/// A host that opened a Kafka pipeline before another upgraded it cannot
/// take the pipeline back with the old component: its next take-over reads
/// the record after fencing and fails, naming the new component. (Version
/// 1 runs its input in data directory A, which a host then opens through
/// the library and keeps open; host B, a data directory of its own with
/// the checkpoints in the shared store, opens the pipeline and is upgraded
/// to version 2; then A's host takes the pipeline over.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_opened_the_pipeline_before_an_upgrade_elsewhere_cannot_take_it_back() {
    use crate::support::Harness;
    use sluice_pipeline::LogConfig;
    let Some(brokers) = brokers() else { return };
    let v1 = component("examples/wordcount");
    let v2 = component("tests/guests/wordcount-v2");
    let pipeline = fresh_name("stale");
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(dir.path());
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let file = dir.path().join("lines.jsonl");
    std::fs::write(&file, "\"hello world\"\n\"hello sluice\"\n").unwrap();
    let run = |data: &Path, input: Option<&Path>| {
        let mut cmd = sluice_cmd();
        cmd.arg("run")
            .arg(&v1)
            .arg("--data")
            .arg(data)
            .args(["--workers", "2", "--log=kafka"])
            .arg(format!("--brokers={brokers}"))
            .arg(format!("--pipeline={pipeline}"))
            .arg(format!("--store={store}"));
        if let Some(input) = input {
            cmd.arg(format!("--input=lines={}", input.display()));
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    };
    run(&a, Some(&file));
    let stale = Harness::open_with(&a, &v1, 2, sluice_runtime::Limits::default(), |c| {
        c.log = LogConfig::Kafka {
            config: sluice_kafka::KafkaConfig::new(&brokers, &pipeline),
        };
        c.checkpoint_store = Some(store.clone());
    })
    .await;

    run(&b, None);
    let mut upgrade = upgrade_cmd(&v2, &b, &[]);
    upgrade.args([&format!("--brokers={brokers}"), &format!("--store={store}")]);
    let out = upgrade.output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    let e = stale
        .coordinator(stale.pipeline.options().clone())
        .await
        .err()
        .expect("a take-over with the old component after the upgrade")
        .to_string();
    assert!(
        e.contains("was upgraded to component") && e.contains("since this host opened it"),
        "{e}"
    );

    // Nor does `sluice verify` audit A's stale view as if it were the
    // pipeline's: A's metadata lacks the change the log records.
    drop(stale);
    let mut verify = sluice_cmd();
    verify
        .args(["verify", "--data"])
        .arg(&a)
        .args([&format!("--brokers={brokers}"), &format!("--store={store}")]);
    let out = tokio::task::spawn_blocking(move || verify.output().unwrap())
        .await
        .unwrap();
    assert!(!out.status.success(), "verified a stale data directory");
    assert!(
        stderr(&out).contains("is behind the pipeline's log"),
        "{}",
        stderr(&out)
    );
}

/// A pipeline on a server, its logs in Kafka, upgraded through the API;
/// the server dies right after the change's record on the meta topic (its
/// registry and the pipeline's data directory still name version 1) and
/// settles the upgrade from the record when it starts again: the pipeline
/// runs version 2, and its counts go on from version 1's.
#[test]
fn a_server_that_dies_at_the_record_of_a_kafka_pipeline_s_upgrade_settles_it() {
    use crate::support::server::Server;
    use crate::upgrade_switch::ServerInput;
    let Some(brokers) = brokers() else { return };
    let v1 = component("examples/wordcount");
    let v2 = component("tests/guests/wordcount-v2");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let kafka = ["--kafka-brokers".to_owned(), brokers.clone()];
    let mut server = Server::start_with_env(
        &data,
        &kafka,
        &[("SLUICE_CRASH_AT", "after-upgrade-record")],
    );
    let tenant = server.tenant(&fresh_name("t").replace('-', ""));
    let token = tenant.token().to_owned();
    let (s, body) = server.upload(&token, "wordcount", &std::fs::read(&v1).unwrap());
    assert_eq!(s, 201, "{body}");
    let spec = serde_json::json!({
        "name": "wc", "component": "wordcount", "workers": 2, "log": "kafka"
    });
    let (s, body) = server.create(&token, &spec);
    assert_eq!(s, 201, "{body}");
    let mut rng = seeded("SLUICE_KAFKA_UPGRADE_SEED", "server kafka upgrade");
    let input = ServerInput::new(&mut rng, 300, dir.path());
    input.push_first(&tenant);

    let upgrade = |extra: &[&str]| {
        sluice_cmd()
            .arg("upgrade")
            .arg(&v2)
            .args(["--pipeline", "wc", "--server", server.url.as_str()])
            .args(["--token", &token])
            .args(extra)
            .output()
            .unwrap()
    };
    // Rebuilding from retained input is for the embedded log only: refused,
    // saying so, the pipeline running on as before.
    let out = upgrade(&["--rebuild"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("rebuilding its state from its input is built for the embedded"),
        "{}",
        stderr(&out)
    );
    let out = upgrade(&[]);
    assert!(!out.status.success(), "the server should have died");
    assert!(
        server.wait_exit(std::time::Duration::from_secs(60)),
        "the server did not stop at the crash point"
    );

    let server = Server::start_with(&data, &kafka);
    let tenant = sluice::client::Client::new(&server.url, &token);
    // (Settled from the data directory alone, the server would load
    // version 1, which the log's record refuses: no pipeline `wc`.)
    let status = tenant
        .status(Some("wc"))
        .expect("the restarted server runs pipeline wc");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["component"], "wordcount_v2", "{status}");
    assert!(status["last_error"].is_null(), "{status}");
    input.push_second_to_version_2(&tenant);
}
