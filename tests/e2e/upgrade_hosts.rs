//! Changing a running circuit (issue #31) for a pipeline whose workers run
//! on other hosts: after an upgrade, the first recovery takes the old
//! component's checkpoint through the new version's `upgrade` on every
//! worker — on the coordinator's host, on a host that reads its pieces from
//! the shared checkpoint store itself, and on one that is sent them.
//! (Before, a remote worker refused: the pipeline had to be opened once
//! without other hosts first.)

use crate::hosts::{connect, fill, lines, options, start_host_with};
use crate::support::{Harness, component, recount, sluice_cmd, stderr};
use crate::upgrade_switch::{assert_verified, recount_lengths, verify_cmd};
use sluice_pipeline::{Pipeline, PipelineConfig};
use sluice_runtime::{Limits, Reach};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Word count (W = 3) runs its first input on one host and checkpoints;
/// it is upgraded to version 2 (a new `lengths` count) with its `counts`
/// started empty; then version 2 runs on the coordinator's host and two
/// worker hosts — one reaching the checkpoint store, one not — through
/// more input. Every worker took its pieces through `upgrade` with the
/// upgrade's start-empty (a plain restore would carry the counts: version
/// 2's `counts` reads version 1's state), so the counts written after the
/// switch are of the new input alone, as is `lengths`; `sluice verify`
/// finds the logs consistent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upgraded_pipeline_recovers_through_upgrade_on_every_host() {
    let v1 = component("examples/wordcount");
    let v2 = component("tests/guests/wordcount-v2");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("p");
    let store = format!("file://{}", dir.path().join("store").display());
    let (before, after) = (lines(1_200), lines(2_000).split_off(1_200));

    // Version 1, on one host, to the end of its input (a checkpoint).
    let h = Harness::open_with(&data, &v1, 3, Limits::default(), |c| {
        c.checkpoint_store = Some(store.clone())
    })
    .await;
    fill(&h, &before).await;
    let mut c = h.coordinator(options()).await.unwrap();
    while c.step().await.unwrap() {}
    c.finish().await.unwrap();
    drop(c);
    let engine = h.engine().clone();
    drop(h);

    // The upgrade (in this process: its trial runs on one host).
    let loaded = engine.load_file(&v2).unwrap();
    let config = PipelineConfig {
        checkpoint_store: Some(store.clone()),
        ..PipelineConfig::new(&data, 3)
    };
    let start_empty = vec!["counts".to_owned()];
    let (pipeline, trial, report) = Pipeline::upgrade(engine, loaded, config, start_empty, false)
        .await
        .unwrap();
    drop(trial);
    let checkpoint = report.checkpoint.expect("the upgrade carried state");

    // Version 2 across hosts: `a` reads its workers' pieces from the
    // store, `b` reaches neither the store nor the logs (it is sent both).
    let h = Harness {
        log: pipeline.storage().log.clone(),
        storage: pipeline.storage().guarded(),
        outputs: pipeline.shape().outputs.clone(),
        workers: 3,
        pipeline,
    };
    assert!(h.outputs.iter().any(|o| o == "lengths"), "{:?}", h.outputs);
    let name = h.pipeline.options().name.clone();
    let checkpoints: Arc<dyn sluice_storage::CheckpointStore> = Arc::new(
        sluice_objstore::ObjectCheckpointStore::open(&store)
            .unwrap()
            .with_cache(dir.path().join("a"))
            .unwrap(),
    );
    let reach_a = Reach {
        checkpoints: Some(checkpoints),
        log: Some(h.log.clone()),
        read_only_log: false,
    };
    let (a, task_a, _) = start_host_with(&h, &name, reach_a).await;
    let (b, task_b, _) = start_host_with(&h, &name, Reach::default()).await;
    fill(&h, &after).await;
    // Placed by hint (this host holds every piece in its own copy, where
    // the workers would go without one): worker 1 on `a`, worker 2 on `b`,
    // each taking its pieces there.
    let options = sluice_runtime::PipelineOptions {
        placement_hint: vec![String::new(), a.clone(), b.clone()],
        ..options()
    };
    let mut c = h
        .pipeline
        .coordinator_on(
            options,
            vec![connect(&a, &name).await, connect(&b, &name).await],
        )
        .await
        .unwrap();
    let stats = c.stats().clone();
    assert_eq!(stats.restored_checkpoint, Some(checkpoint), "{stats:?}");
    assert_eq!(stats.replayed_steps, 0, "{stats:?}");
    // `b`'s pieces were sent to it.
    assert_eq!(c.placement_addrs(), [String::new(), a.clone(), b.clone()]);
    assert!(stats.restored_fetched_bytes > 0, "{stats:?}");
    while c.step().await.unwrap() {}
    c.finish().await.unwrap();
    drop(c);

    assert_eq!(
        counts_after(&h, checkpoint),
        Some(recount(after.iter().map(|l| (l.as_str(), 1)))),
        "every worker started its counts empty at the switch"
    );
    let pairs: Vec<(String, i64)> = after.iter().map(|l| (l.clone(), 1)).collect();
    assert_eq!(
        current_lengths(&h.integrated("lengths")),
        Some(recount_lengths(&pairs)),
        "the new count started empty at the switch"
    );

    // The audit, once the hosts let go of the pipeline's database.
    task_a.abort();
    task_b.abort();
    let _ = (task_a.await, task_b.await);
    drop(h);
    let store = Some(store);
    let verify = move || verify_cmd(&data, &store).output().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let out = loop {
        let out = tokio::task::spawn_blocking(verify.clone()).await.unwrap();
        if out.status.success() || Instant::now() > deadline || !stderr(&out).contains("lock") {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_verified(&out, "the upgraded pipeline across hosts");
}

/// Word count's `counts` as written by the steps after `step`, integrated
/// by value: word → count, when each word has one value of weight 1 there
/// (its count started from nothing at `step`); `None` when a value there
/// is retracted or a word has two (the count went on from a state before).
fn counts_after(h: &Harness, step: u64) -> Option<BTreeMap<String, i64>> {
    let mut by_value: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
    h.log
        .scan_output("counts", 0, &mut |e| {
            if e.step > step {
                for ev in e.events {
                    *by_value.entry(ev.value).or_default() += ev.weight;
                }
            }
            Ok(std::ops::ControlFlow::Continue(()))
        })
        .unwrap();
    let mut counts = BTreeMap::new();
    for (value, weight) in by_value.into_iter().filter(|(_, w)| *w != 0) {
        let v: serde_json::Value = serde_json::from_slice(&value).unwrap();
        let word = v["word"].as_str().unwrap().to_owned();
        if weight != 1 || counts.insert(word, v["count"].as_i64().unwrap()).is_some() {
            return None;
        }
    }
    Some(counts)
}

/// Version 2's `lengths` integrated (JSON `[length, count]` → weight): the
/// current count of each length; `None` unless each length has one count
/// of weight 1 (a reader between two partitions' ends may see that).
pub(crate) fn current_lengths(integrated: &BTreeMap<String, i64>) -> Option<BTreeMap<u64, i64>> {
    let mut current = BTreeMap::new();
    for (value, weight) in integrated {
        let v: serde_json::Value = serde_json::from_str(value).unwrap();
        let (len, count) = (v[0].as_u64().unwrap(), v[1].as_i64().unwrap());
        if *weight != 1 || current.insert(len, count).is_some() {
            return None;
        }
    }
    Some(current)
}

/// The switch for a pipeline of `sluice host` processes (Kafka logs, etcd
/// group, checkpoints in S3), as a user makes it: every host is stopped
/// (SIGKILL), version 1 runs to a checkpoint on one host's data directory
/// (`sluice run`), `sluice upgrade` switches it there, and the hosts start
/// again with version 2, with more input. (Whether the new leader's first
/// recovery runs on one host or on three depends on when the others join:
/// the test above pins the remote workers' part.) Version 1's counts
/// go on, version 2's new count starts at the switch, each once.
#[cfg(feature = "kafka")]
#[test]
fn a_group_of_hosts_stopped_upgraded_and_started_again_runs_the_new_version() {
    use crate::support::cluster::{integrated, parts};
    let Some((brokers, etcd)) = parts() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (mut c, expected) = three_hosts(dir.path(), "upgrade-group", &brokers, etcd, &[]);
    let hosts = ["h1", "h2", "h3"];
    for h in hosts {
        c.signal(h, "-KILL");
        c.hosts.get_mut(h).unwrap().wait().unwrap();
    }

    // The upgrade is made at a checkpoint of the last step: killed, the
    // hosts left steps after their last one, which a run of version 1 on
    // one host's data directory takes to a checkpoint (as `sluice upgrade`
    // says when it refuses).
    let out = sluice_cmd()
        .arg("run")
        .arg(&c.wasm)
        .arg("--data")
        .arg(dir.path().join("h1"))
        .args(["--log=kafka", &format!("--brokers={brokers}")])
        .args([
            format!("--pipeline={}", c.pipeline),
            format!("--store={}", c.store),
        ])
        .args(["--workers", "3", "--partitions", "6"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = sluice_cmd()
        .arg("upgrade")
        .arg(component("tests/guests/wordcount-v2"))
        .arg("--data")
        .arg(dir.path().join("h1"))
        .args([
            format!("--brokers={brokers}"),
            format!("--store={}", c.store),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    // The same input generator again: each count doubles. h3 starts
    // with version 1's file: it fetches version 2 from the store, where
    // the upgrade published it.
    c.wasm = component("tests/guests/wordcount-v2");
    c.input = dir.path().join("more.jsonl");
    let more = crate::support::cluster::input(&c.input, 2_000);
    assert_eq!(more, expected);
    c.start("h1");
    c.start("h2");
    c.wasm = component("examples/wordcount");
    c.start("h3");
    let doubled: BTreeMap<String, i64> = expected.iter().map(|(w, n)| (w.clone(), 2 * n)).collect();
    c.wait_for_recount(&doubled, Duration::from_secs(240));

    // `lengths`, from the switch: the second file's lines (a delete takes
    // one line back).
    let wanted = recount_lengths(&pairs_of(&c.input));
    let topic = format!("{}.lengths", c.pipeline);
    c.wait("version 2's lengths", Duration::from_secs(120), |_| {
        current_lengths(&integrated(&brokers, &topic)).as_ref() == Some(&wanted)
    });
    // h3, started with version 1, runs version 2's workers, or leads them:
    // whichever host wins the election (h3 did in a CI run) leads all three.
    c.wait("a leader on all three", Duration::from_secs(120), |c| {
        hosts.iter().any(|leader| {
            let mut group = vec![*leader];
            group.extend(hosts.iter().filter(|h| *h != leader));
            c.leads_on(leader, &group)
        })
    });
    for h in hosts {
        let running = c.hosts.get_mut(h).unwrap().try_wait().unwrap().is_none();
        assert!(running, "{h} exited:\n{}", c.stderr(h));
    }
    crate::support::cluster::audit(&c, &hosts);
}

/// The lines of a word-count input file (as `support::cluster::input`
/// writes it) with their weights: a delete takes one line back.
pub(crate) fn pairs_of(file: &std::path::Path) -> Vec<(String, i64)> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(
            |l| match serde_json::from_str::<serde_json::Value>(l).unwrap() {
                serde_json::Value::String(line) => (line, 1),
                v => (v["delete"].as_str().unwrap().to_owned(), -1),
            },
        )
        .collect()
}

/// `sluice upgrade NEW --group` for the pipeline of `sluice host`
/// processes in `c`: its output.
#[cfg(feature = "kafka")]
fn upgrade_group(
    c: &crate::support::cluster::Cluster,
    new: &std::path::Path,
    extra: &[&str],
) -> std::process::Output {
    upgrade_group_cmd(c, new, extra).output().unwrap()
}

/// The command of [`upgrade_group`], to run.
#[cfg(feature = "kafka")]
pub(crate) fn upgrade_group_cmd(
    c: &crate::support::cluster::Cluster,
    new: &std::path::Path,
    extra: &[&str],
) -> std::process::Command {
    let mut cmd = sluice_cmd();
    cmd.arg("upgrade").arg(new).args(extra).args([
        format!("--etcd={}", c.etcd),
        format!("--group={}", c.pipeline),
        format!("--store={}", c.store),
        "--wait-secs=180".to_owned(),
    ]);
    cmd
}

/// The switch of a running group, as a user makes it: three `sluice host`
/// processes (Kafka logs, etcd group, checkpoints in S3) run version 1;
/// `sluice upgrade v2 --group` publishes version 2 in the store and asks
/// the group; the leader checkpoints, upgrades, and runs version 2 on all
/// three hosts (the others fetch it from the store: they were started with
/// version 1's file). An upgrade the new version refuses (`--start-empty`
/// of no operator) changes nothing, and asked again after the switch, the
/// leader answers that it runs it. Input written to the topic after the
/// switch is counted once with the state carried; `lengths` counts from
/// the switch. Then the leader is killed: the next one, started with
/// version 1's file, opens the pipeline, follows the change (fetching
/// version 2) and goes on, and the killed host, restarted with version 1's
/// file, rejoins and serves version 2's workers. No host exits; the
/// cluster audit passes.
#[cfg(feature = "kafka")]
#[test]
fn a_running_group_is_upgraded_by_its_leader_and_every_host_follows() {
    use crate::support::cluster::{integrated, parts, produce_lines};
    let Some((brokers, etcd)) = parts() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (mut c, expected) = three_hosts(dir.path(), "upgrade-running", &brokers, etcd, &[]);
    let hosts = ["h1", "h2", "h3"];
    c.wait("h1 to lead on all three", Duration::from_secs(60), |c| {
        c.leads_on("h1", &hosts)
    });

    // A refusal changes nothing: the group runs on with version 1.
    let v2 = component("tests/guests/wordcount-v2");
    let out = upgrade_group(&c, &v2, &["--start-empty=nosuch"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("upgrade refused") && stderr(&out).contains("nosuch"),
        "{}",
        stderr(&out)
    );
    c.wait(
        "h1 to lead on all three after the refusal",
        Duration::from_secs(120),
        |c| c.leads_on("h1", &hosts),
    );
    let out = upgrade_group(&c, &v2, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("upgraded: component"),
        "{}",
        stderr(&out)
    );
    c.wait(
        "h1 to lead on all three again",
        Duration::from_secs(120),
        |c| c.leads_on("h1", &hosts),
    );
    assert!(c.stderr("h1").contains("host h1: upgraded the pipeline to"));
    // Asked again: made already.
    let out = upgrade_group(&c, &v2, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the pipeline runs component"),
        "{}",
        stderr(&out)
    );

    // More input, straight to the topic: each count doubles.
    let pipeline = c.pipeline.clone();
    let topic = |port: &str| format!("{pipeline}.{port}");
    let more = dir.path().join("more.jsonl");
    assert_eq!(crate::support::cluster::input(&more, 2_000), expected);
    produce_lines(&brokers, &topic("lines"), &more);
    let doubled: BTreeMap<String, i64> = expected.iter().map(|(w, n)| (w.clone(), 2 * n)).collect();
    c.wait_for_recount(&doubled, Duration::from_secs(240));
    let mut pairs = pairs_of(&more);
    c.wait("version 2's lengths", Duration::from_secs(120), |_| {
        current_lengths(&integrated(&brokers, &topic("lengths"))) == Some(recount_lengths(&pairs))
    });

    // The leader dies; the next was started with version 1's file.
    c.signal("h1", "-KILL");
    c.hosts.get_mut("h1").unwrap().wait().unwrap();
    c.wait("another host to lead", Duration::from_secs(120), |c| {
        c.leading("h2") || c.leading("h3")
    });
    let (next, other) = next_leader_followed(&c);
    c.start("h1");
    produce_lines(&brokers, &topic("lines"), &more);
    let tripled: BTreeMap<String, i64> = expected.iter().map(|(w, n)| (w.clone(), 3 * n)).collect();
    c.wait_for_recount(&tripled, Duration::from_secs(240));
    pairs.extend(pairs_of(&more));
    c.wait(
        "version 2's lengths again",
        Duration::from_secs(120),
        |_| {
            current_lengths(&integrated(&brokers, &topic("lengths")))
                == Some(recount_lengths(&pairs))
        },
    );
    c.wait(
        "the new leader to lead on all three",
        Duration::from_secs(120),
        |c| c.leads_on(next, &[next, "h1", other]),
    );
    for h in hosts {
        let running = c.hosts.get_mut(h).unwrap().try_wait().unwrap().is_none();
        assert!(running, "{h} exited:\n{}", c.stderr(h));
    }
    crate::support::cluster::audit(&c, &hosts);
}

/// Three `sluice host` processes (h1 leading first, with `h1_env` set) of
/// a fresh word-count pipeline named `what-…` over 2,000 lines, run until
/// its output is the recount (returned).
#[cfg(feature = "kafka")]
pub(crate) fn three_hosts(
    dir: &std::path::Path,
    what: &str,
    brokers: &str,
    etcd: String,
    h1_env: &[(&str, &str)],
) -> (crate::support::cluster::Cluster, BTreeMap<String, i64>) {
    let (mut c, expected) = crate::support::cluster::Cluster::new(dir, what, 2_000, brokers, etcd);
    let before = c.env.clone();
    c.env
        .extend(h1_env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    c.start("h1");
    c.env = before;
    c.wait("h1 to lead", Duration::from_secs(60), |c| c.leading("h1"));
    c.start("h2");
    c.start("h3");
    c.wait_for_recount(&expected, Duration::from_secs(240));
    (c, expected)
}

/// The leader dies between the upgrade's record on the meta topic (the
/// commit point) and its answer (`SLUICE_CRASH_AT=after-upgrade-record`):
/// the request stays pending; the next leader, started with version 1's
/// file, finds the pipeline moved (its open is refused), follows the
/// record — fetching version 2 — and answers the request as made, so
/// `sluice upgrade --group` succeeds. The counts go on from the state
/// carried, `lengths` counts from the switch, the killed host rejoins
/// (version 1's file again) and the cluster audit passes.
#[cfg(feature = "kafka")]
#[test]
fn a_leader_that_dies_at_the_record_of_a_group_upgrade_leaves_it_made() {
    use crate::support::cluster::{integrated, parts, produce_lines};
    let Some((brokers, etcd)) = parts() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let crash = [("SLUICE_CRASH_AT", "after-upgrade-record:1")];
    let (mut c, expected) = three_hosts(dir.path(), "upgrade-died", &brokers, etcd, &crash);
    c.wait("h1 to lead on all three", Duration::from_secs(60), |c| {
        c.leads_on("h1", &["h1", "h2", "h3"])
    });
    let v2 = component("tests/guests/wordcount-v2");
    let out = upgrade_group(&c, &v2, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("upgraded: the pipeline runs component"),
        "{}",
        stderr(&out)
    );
    let h1 = c.hosts.get_mut("h1").unwrap().try_wait().unwrap();
    assert!(
        h1.is_some_and(|s| !s.success()),
        "h1 did not die at the record"
    );
    let (next, other) = next_leader_followed(&c);
    c.start("h1");
    let pipeline = c.pipeline.clone();
    let more = dir.path().join("more.jsonl");
    assert_eq!(crate::support::cluster::input(&more, 2_000), expected);
    produce_lines(&brokers, &format!("{pipeline}.lines"), &more);
    let doubled: BTreeMap<String, i64> = expected.iter().map(|(w, n)| (w.clone(), 2 * n)).collect();
    c.wait_for_recount(&doubled, Duration::from_secs(240));
    let pairs = pairs_of(&more);
    c.wait("version 2's lengths", Duration::from_secs(120), |_| {
        current_lengths(&integrated(&brokers, &format!("{pipeline}.lengths")))
            == Some(recount_lengths(&pairs))
    });
    c.wait(
        "the new leader to lead on all three",
        Duration::from_secs(120),
        |c| c.leads_on(next, &[next, "h1", other]),
    );
    crate::support::cluster::audit(&c, &["h1", "h2", "h3"]);
}

/// The host of h2 and h3 that leads after h1 (and the other), having
/// followed the upgrade another host made.
#[cfg(feature = "kafka")]
fn next_leader_followed(c: &crate::support::cluster::Cluster) -> (&'static str, &'static str) {
    let (next, other) = match c.leading("h2") {
        true => ("h2", "h3"),
        false => ("h3", "h2"),
    };
    assert!(
        c.stderr(next)
            .contains("the pipeline was upgraded by another host"),
        "{}",
        c.stderr(next)
    );
    (next, other)
}
