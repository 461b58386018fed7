//! The host's invariants, each shown by a test that fails if the rule goes:
//! I1 (a step is written once), I2 (trim only below a committed checkpoint),
//! I4 (a replay that differs is caught), and guest failures (trap, fuel,
//! memory) failing only their pipeline without losing committed work.

use crate::support::{Harness, component, manual_checkpoints};
use sluice_runtime::{Error, GuestError, Limits};
use sluice_storage::StorageError;
use std::collections::BTreeMap;
use std::time::Duration;

const MISBEHAVE: &str = "tests/guests/misbehave";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i1_a_committed_step_is_never_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(dir.path(), &component(MISBEHAVE), 2, Limits::default()).await;
    h.append("in", 0, &["a", "b"]);
    let mut c = h.coordinator(manual_checkpoints()).await.unwrap();
    assert!(c.step().await.unwrap());
    // Rewrite step 0 with the record the log holds: refused, whatever the outputs.
    let record = h.log.step_record(0).unwrap().unwrap();
    let mut again = sluice_core::StepCommit {
        record: record.clone(),
        outputs: h
            .outputs
            .iter()
            .map(|name| {
                let entries = (0..2)
                    .map(|w| sluice_core::OutputEntry {
                        step: 0,
                        worker: w,
                        frontier: record.frontiers[w as usize].clone(),
                        events: vec![],
                    })
                    .collect();
                (name.clone(), entries)
            })
            .collect(),
        dead_letters: Vec::new(),
    };
    assert!(matches!(
        h.storage.commit_step(&again),
        Err(StorageError::StepExists { step: 0 })
    ));
    // A malformed commit (missing a worker's entry) is refused before it reaches the log.
    again.record.step = 1;
    again.outputs[0].1.pop();
    assert!(matches!(
        h.storage.commit_step(&again),
        Err(StorageError::InvalidCommit { step: 1, .. })
    ));
    assert_eq!(h.log.last_step().unwrap(), Some(0));
}

/// A divided step (its division recorded first, each worker's share
/// later by the worker's holder) is refused a successor until every share
/// is in; a worker's share commits once, and only by its current holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i1_a_divided_step_completes_before_the_next_and_each_share_commits_once() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(dir.path(), &component(MISBEHAVE), 2, Limits::default()).await;
    h.append("in", 0, &["a", "b"]);
    let mut c = h.coordinator(manual_checkpoints()).await.unwrap();
    assert!(c.step().await.unwrap());
    drop(c);
    let whole = h.log.step_record(0).unwrap().unwrap();
    let division = |step: u64, prev: u128| sluice_core::StepRecord {
        step,
        output_hashes: Vec::new(),
        prev,
        ..whole.clone()
    };
    let record = |r: &sluice_core::StepRecord| sluice_core::StepCommit::division(r.clone());
    let share = |r: &sluice_core::StepRecord, worker: u32| {
        let ports = vec![Vec::new(); h.outputs.len()];
        sluice_storage::WorkerCommit {
            step: r.step,
            worker,
            hash: sluice_core::hash_outputs(&ports),
            outputs: h
                .outputs
                .iter()
                .map(|name| {
                    let entry = sluice_core::OutputEntry {
                        step: r.step,
                        worker,
                        frontier: r.frontiers[worker as usize].clone(),
                        events: Vec::new(),
                    };
                    (name.clone(), entry)
                })
                .collect(),
            dead_letters: Vec::new(),
        }
    };
    let one = division(1, whole.chain_hash());
    h.storage.commit_step(&record(&one)).unwrap();
    let two = division(2, one.chain_hash());
    assert!(
        matches!(
            h.storage.commit_step(&record(&two)),
            Err(StorageError::InvalidCommit { step: 2, .. })
        ),
        "no step is recorded after an incomplete one"
    );
    let mut zero = h.storage.take_worker(0).unwrap();
    assert_eq!(
        zero.commit(&share(&one, 0)).unwrap(),
        sluice_storage::WorkerDone::Committed
    );
    assert!(
        h.storage.commit_step(&record(&two)).is_err(),
        "worker 1's share is missing"
    );
    let mut zombie = h.storage.take_worker(1).unwrap();
    let mut holder = h.storage.take_worker(1).unwrap();
    assert!(matches!(
        zombie.commit(&share(&one, 1)),
        Err(StorageError::WorkerTaken { worker: 1, step: 1 })
    ));
    assert_eq!(
        holder.commit(&share(&one, 1)).unwrap(),
        sluice_storage::WorkerDone::Committed
    );
    assert_eq!(
        holder.commit(&share(&one, 1)).unwrap(),
        sluice_storage::WorkerDone::Already,
        "a share commits once"
    );
    h.storage.commit_step(&record(&two)).unwrap();
    assert_eq!(h.audit(), 3, "an incomplete last step passes the audit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_a_superseded_coordinator_cannot_commit() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(dir.path(), &component(MISBEHAVE), 1, Limits::default()).await;
    h.append("in", 0, &["a", "b", "c", "d"]);
    let mut zombie = h.coordinator(manual_checkpoints()).await.unwrap();
    assert!(zombie.step().await.unwrap());
    // A new host takes over the pipeline (recovering from the log)...
    let mut successor = h.coordinator(manual_checkpoints()).await.unwrap();
    assert_eq!(successor.stats().replayed_steps, 1);
    // ...and the old one's next commit is refused.
    let err = zombie.step().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Storage(StorageError::HostEpochSuperseded { step: 1, .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("fenced"), "{err}");
    assert_eq!(h.log.last_step().unwrap(), Some(0));
    assert!(successor.step().await.unwrap());
    assert_eq!(h.log.last_step().unwrap(), Some(1));
    assert_eq!(h.integrated("out").len(), 4, "every input once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i2_trim_only_below_the_newest_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(dir.path(), &component(MISBEHAVE), 1, Limits::default()).await;
    h.append("in", 0, &["a", "b", "c", "d", "e"]);
    let mut c = h.coordinator(manual_checkpoints()).await.unwrap();
    // Nothing checkpointed: no trim at all.
    assert!(matches!(
        h.storage.trim(0, 0, 1),
        Err(StorageError::TrimAboveCheckpoint { allowed: 0, .. })
    ));
    assert!(c.step().await.unwrap()); // consumes a, b
    c.checkpoint().await.unwrap(); // covers offset 2, trims below it
    assert!(c.step().await.unwrap()); // consumes c, d (not checkpointed)
    assert_eq!(
        h.log.watermarks("in", 0).unwrap(),
        (2, 5),
        "input below the checkpoint is gone"
    );
    assert!(matches!(
        h.log.read("in", 0, 0..2),
        Err(StorageError::Trimmed { low: 2, .. })
    ));
    let err = h.storage.trim(0, 0, 3).unwrap_err();
    assert!(
        matches!(
            err,
            StorageError::TrimAboveCheckpoint {
                requested: 3,
                allowed: 2,
                ..
            }
        ),
        "trim above the checkpoint must be refused, got {err}"
    );
    assert_eq!(
        h.log.read("in", 0, 2..5).unwrap().len(),
        3,
        "refused trim removed nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_restores_and_replays_to_the_same_output() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = component(MISBEHAVE);
    let before = {
        let h = Harness::open(dir.path(), &wasm, 2, Limits::default()).await;
        h.append("in", 0, &["apple", "avocado", "banana", "cherry"]);
        h.append("in", 1, &["blueberry", "apricot", "cranberry"]);
        let mut c = h.coordinator(manual_checkpoints()).await.unwrap();
        assert!(c.step().await.unwrap());
        c.checkpoint().await.unwrap();
        assert!(c.step().await.unwrap());
        // Crash: drop without a checkpoint. Step 1 is committed, not checkpointed.
        h.integrated("letters")
    };
    let h = Harness::open(dir.path(), &wasm, 2, Limits::default()).await;
    let mut c = h.coordinator(manual_checkpoints()).await.unwrap();
    assert_eq!(c.stats().restored_checkpoint, Some(0));
    assert_eq!(c.stats().replayed_steps, 1);
    assert_eq!(h.integrated("letters"), before, "replay wrote nothing");
    while c.step().await.unwrap() {}
    let letters = h.integrated("letters");
    assert_eq!(letters.get(r#"["a",3]"#), Some(&1), "{letters:?}");
    assert_eq!(letters.get(r#"["b",2]"#), Some(&1), "{letters:?}");
    assert_eq!(letters.get(r#"["c",2]"#), Some(&1), "{letters:?}");
    assert_eq!(letters.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i4_a_replay_with_different_output_stops_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = component(MISBEHAVE);
    {
        let h = Harness::open(dir.path(), &wasm, 1, Limits::default()).await;
        h.append("in", 0, &["nondet-a", "nondet-b", "nondet-c", "nondet-d"]);
        let mut c = h.coordinator(manual_checkpoints()).await.unwrap();
        assert!(c.step().await.unwrap());
        c.checkpoint().await.unwrap();
        assert!(c.step().await.unwrap());
    }
    let h = Harness::open(dir.path(), &wasm, 1, Limits::default()).await;
    let committed = h.integrated("out");
    let err = match h.coordinator(manual_checkpoints()).await {
        Ok(_) => panic!("a nondeterministic replay must stop the pipeline"),
        Err(e) => e,
    };
    assert!(
        matches!(
            err,
            sluice_pipeline::Error::Runtime(Error::Nondeterministic {
                step: 1,
                worker: 0,
                ..
            })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("not deterministic"), "{err}");
    assert_eq!(h.integrated("out"), committed, "nothing was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i4_a_guest_reading_the_clock_and_random_numbers_replays_identically() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = component(MISBEHAVE);
    let committed = {
        let h = Harness::open(dir.path(), &wasm, 2, Limits::default()).await;
        h.append("in", 0, &["clock-0", "random-0"]);
        h.append("in", 1, &["clock-1", "random-1"]);
        let mut c = h.coordinator(manual_checkpoints()).await.unwrap();
        assert!(c.step().await.unwrap());
        c.checkpoint().await.unwrap();
        h.append("in", 0, &["clock-2", "random-2"]);
        h.append("in", 1, &["clock-3", "random-3", "random-4"]);
        assert!(c.step().await.unwrap());
        assert!(c.step().await.unwrap());
        // Crash with steps 1 and 2 committed but not checkpointed.
        h.integrated("out")
    };
    // Time moves on before the restart.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let h = Harness::open(dir.path(), &wasm, 2, Limits::default()).await;
    let c = h
        .coordinator(manual_checkpoints())
        .await
        .expect("the replay reproduces clock and random reads");
    assert_eq!(c.stats().replayed_steps, 2);
    assert_eq!(h.integrated("out"), committed);
    // The clock the guest saw is the step's recorded time.
    let record = h.log.step_record(1).unwrap().unwrap();
    let seen: Vec<&String> = committed
        .keys()
        .filter(|v| v.starts_with("\"clock-2@"))
        .collect();
    assert_eq!(seen, [&format!("\"clock-2@{}\"", record.time_ms)]);
    // Random numbers differ between workers and steps.
    let randoms: std::collections::BTreeSet<&str> = committed
        .keys()
        .filter(|v| v.starts_with("\"random"))
        .map(|v| v.split('#').nth(1).unwrap())
        .collect();
    assert_eq!(randoms.len(), 5, "{committed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_fails_the_pipeline_naming_it_and_keeps_committed_work() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = component(MISBEHAVE);
    let h = Harness::open(dir.path(), &wasm, 2, Limits::default()).await;
    h.append("in", 0, &["a", "b"]);
    let mut c = h.coordinator(PipelineOptionsExt::batch(2)).await.unwrap();
    assert!(c.step().await.unwrap());
    h.append("in", 1, &["trap"]);
    let err = c.step().await.unwrap_err();
    match &err {
        Error::Guest(GuestError::Trap {
            worker: 1,
            call: "step",
            trap,
        }) => assert!(trap.contains("unreachable"), "{trap}"),
        other => panic!("expected a trap of worker 1, got {other}"),
    }
    assert_eq!(
        h.log.last_step().unwrap(),
        Some(0),
        "the failed step committed nothing"
    );
    assert_eq!(h.integrated("out").len(), 2, "committed output is intact");
    // The pipeline cannot go on with lost instances, and says so.
    assert!(c.step().await.is_err());
    // A reopen recovers the committed state (and fails again on the same input).
    drop(c);
    let mut c = h.coordinator(PipelineOptionsExt::batch(2)).await.unwrap();
    assert_eq!(c.stats().replayed_steps, 1);
    assert!(matches!(
        c.step().await,
        Err(Error::Guest(GuestError::Trap { .. }))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuel_and_memory_limits_stop_a_guest_with_a_named_error() {
    let wasm = component(MISBEHAVE);
    let limits = Limits {
        memory: 64 << 20,
        fuel_per_call: 200_000_000,
        deadline: Duration::from_secs(60),
    };

    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(dir.path(), &wasm, 1, limits).await;
    h.append("in", 0, &["spin"]);
    let mut c = h.coordinator(PipelineOptionsExt::batch(10)).await.unwrap();
    let err = c.step().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Guest(GuestError::FuelExhausted {
                limit: 200_000_000,
                ..
            })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("fuel per step"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(dir.path(), &wasm, 1, limits).await;
    h.append("in", 0, &["grow"]);
    let mut c = h.coordinator(PipelineOptionsExt::batch(10)).await.unwrap();
    let err = c.step().await.unwrap_err();
    assert!(
        matches!(err, Error::Guest(GuestError::MemoryExceeded { limit, .. }) if limit == 64 << 20),
        "{err}"
    );

    let limits = Limits {
        fuel_per_call: u64::MAX,
        deadline: Duration::from_millis(300),
        ..limits
    };
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(dir.path(), &wasm, 1, limits).await;
    h.append("in", 0, &["spin"]);
    let mut c = h.coordinator(PipelineOptionsExt::batch(10)).await.unwrap();
    let err = c.step().await.unwrap_err();
    assert!(
        matches!(err, Error::Guest(GuestError::DeadlineExceeded { .. })),
        "{err}"
    );

    // A guest looping over host calls burns almost no fuel between them,
    // so it seldom yields: the deadline is also checked as each returns.
    // Without that check this step would run for minutes (one yield per
    // ten million fuel, thousands of 1 MiB random reads).
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(dir.path(), &wasm, 1, limits).await;
    h.append("in", 0, &["hostspin"]);
    let mut c = h.coordinator(PipelineOptionsExt::batch(10)).await.unwrap();
    let started = std::time::Instant::now();
    let err = c.step().await.unwrap_err();
    assert!(
        matches!(err, Error::Guest(GuestError::DeadlineExceeded { .. })),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a 300 ms deadline stopped the guest only after {:?}",
        started.elapsed()
    );
}

struct PipelineOptionsExt;

impl PipelineOptionsExt {
    fn batch(n: u64) -> sluice_runtime::PipelineOptions {
        sluice_runtime::PipelineOptions {
            max_batch: n,
            ..manual_checkpoints()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_worker_runs_steps_and_a_full_pool_is_a_capacity_error() {
    use sluice_core::Event;
    use sluice_runtime::{SluiceEngine, Worker};
    let engine =
        SluiceEngine::with_pooling(Limits::default(), Some(crate::support::cache_dir()), 2)
            .unwrap();
    let component = engine.load_file(&component("examples/wordcount")).unwrap();
    let mut first = Worker::standalone(&engine, &component, "a").await.unwrap();
    let line = |l: &str| Event {
        value: serde_json::to_vec(l).unwrap(),
        weight: 1,
    };
    let out = first
        .step_ports(0, 0, vec![vec![line("b a b")]])
        .await
        .unwrap();
    let values: Vec<String> = out[0]
        .iter()
        .map(|e| String::from_utf8(e.value.clone()).unwrap())
        .collect();
    assert_eq!(
        values,
        [r#"{"word":"a","count":1}"#, r#"{"word":"b","count":2}"#]
    );
    let _second = Worker::standalone(&engine, &component, "b").await.unwrap();
    match Worker::standalone(&engine, &component, "c").await {
        Err(Error::PoolExhausted { limit: 2 }) => {}
        Err(other) => panic!("expected a capacity error, got {other}"),
        Ok(_) => panic!("a pool of 2 must refuse a third instance"),
    }
    drop(first);
    Worker::standalone(&engine, &component, "d")
        .await
        .expect("a freed slot is reused");
}

/// I4 checks content, not order: a component written against the WIT
/// without the SDK (`tests/guests/hashorder`) emits each step's counts in
/// the order of a fresh `HashMap`, which a restored instance iterates
/// differently. After a crash right after a commit, the replay of that step
/// must be accepted (same multiset) and the output stay exactly-once.
#[test]
fn a_replay_in_another_order_is_the_same_output() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let lines: Vec<String> = (0..400).map(|i| format!("\"v{}\"", i % 37)).collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let output = dir.path().join("out.jsonl");
    let run = |crash: Option<&str>| {
        let mut cmd = crate::support::sluice_cmd();
        cmd.arg("run")
            .arg(component("tests/guests/hashorder"))
            .arg("--data")
            .arg(dir.path().join("data"))
            .args(["--max-batch", "40", "--checkpoint-every", "2", "--quiet"])
            .arg(format!("--input=in={}", input.display()))
            .arg(format!("--output=out={}", output.display()));
        if let Some(point) = crash {
            cmd.env("SLUICE_CRASH_AT", point);
        }
        cmd.output().unwrap()
    };
    // Steps 0-4 commit; the checkpoint of step 3 is the newest; the run dies
    // right after step 4's commit, so the restart restores step 3 and
    // replays step 4 in a fresh instance.
    let crashed = run(Some("after-commit:5"));
    assert!(!crashed.status.success());
    let out = run(None);
    assert!(
        out.status.success(),
        "the restart must accept a replay in another order: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut total: BTreeMap<String, i64> = BTreeMap::new();
    for line in std::fs::read_to_string(&output).unwrap().lines() {
        let (v, w) = sluice_core::wire::parse_output_line(line).unwrap();
        *total.entry(v.to_string()).or_default() += w;
    }
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for l in &lines {
        *expected.entry(l.clone()).or_default() += 1;
    }
    assert_eq!(total, expected, "every input counted exactly once");
}

/// Timers follow the step's time, not real time: a guest that sleeps 1 ms
/// at a time until 5 ms have passed on its monotonic clock sleeps exactly 5
/// times, in every run and every replay (with real-time timers the count
/// would vary; with a clock frozen for the step, it would never end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_polling_a_timer_sees_the_same_time_in_every_replay() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = component(MISBEHAVE);
    let limits = Limits {
        deadline: Duration::from_secs(10),
        ..Limits::default()
    };
    let committed = {
        let h = Harness::open(dir.path(), &wasm, 1, limits).await;
        h.append("in", 0, &["sleepy-a", "sleepy-b"]);
        let mut c = h.coordinator(manual_checkpoints()).await.unwrap();
        assert!(c.step().await.unwrap());
        h.integrated("out")
    };
    assert_eq!(
        committed.keys().collect::<Vec<_>>(),
        ["\"sleepy-a#5\"", "\"sleepy-b#5\""]
    );
    // A restart replays the step: the same naps, or the replay check fails.
    let h = Harness::open(dir.path(), &wasm, 1, limits).await;
    let c = h.coordinator(manual_checkpoints()).await.unwrap();
    assert_eq!(c.stats().replayed_steps, 1);
    assert_eq!(h.integrated("out"), committed);
}

/// A replayed step runs under the fuel and memory limits it was committed
/// with: a pipeline reopened with a fuel limit too low for its committed
/// steps still recovers, and the new limit applies to new steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_runs_under_the_limits_its_step_ran_with() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = component("examples/wordcount");
    let words: Vec<String> = (0..2_000).map(|i| format!("w{i} x{i} y{i}")).collect();
    let lines: Vec<&str> = words.iter().map(String::as_str).collect();
    {
        let h = Harness::open(dir.path(), &wasm, 1, Limits::default()).await;
        h.append("lines", 0, &lines);
        let options = sluice_runtime::PipelineOptions {
            max_batch: 1_000,
            ..manual_checkpoints()
        };
        let mut c = h.coordinator(options).await.unwrap();
        while c.step().await.unwrap() {}
        assert_eq!(c.next_step(), 2);
    }
    let starved = Limits {
        fuel_per_call: 50_000,
        ..Limits::default()
    };
    let h = Harness::open(dir.path(), &wasm, 1, starved).await;
    let mut c = h
        .coordinator(manual_checkpoints())
        .await
        .expect("the replay runs with the fuel its steps had");
    assert_eq!(c.stats().replayed_steps, 2);
    h.append("lines", 0, &lines[..500]);
    let err = c.step().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Guest(GuestError::FuelExhausted { limit: 50_000, .. })
        ),
        "a new step gets the new limit: {err}"
    );
}

/// Guest clocks never go backwards across a restart: the first step after
/// it is at least as late as the last committed step, even when the
/// checkpoint leaves nothing to replay and the wall clock now says earlier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_time_does_not_go_back_after_a_restart() {
    use sluice_embedded::db::{self, CF_STEPS};
    let dir = tempfile::tempdir().unwrap();
    let wasm = component(MISBEHAVE);
    {
        let h = Harness::open(dir.path(), &wasm, 1, Limits::default()).await;
        h.append("in", 0, &["a"]);
        let mut c = h.coordinator(manual_checkpoints()).await.unwrap();
        assert!(c.step().await.unwrap());
        c.checkpoint().await.unwrap();
    }
    // The host that committed step 0 had a clock a year ahead of this one.
    let ahead = {
        let database = db::open(dir.path()).unwrap();
        let cf = db::cf(&database, CF_STEPS).unwrap();
        let bytes = database.get_cf(cf, 0u64.to_be_bytes()).unwrap().unwrap();
        let mut record: sluice_core::StepRecord = postcard::from_bytes(&bytes).unwrap();
        record.time_ms += 365 * 24 * 3600 * 1000;
        database
            .put_cf(
                cf,
                0u64.to_be_bytes(),
                postcard::to_allocvec(&record).unwrap(),
            )
            .unwrap();
        record.time_ms
    };
    let h = Harness::open(dir.path(), &wasm, 1, Limits::default()).await;
    let mut c = h.coordinator(manual_checkpoints()).await.unwrap();
    assert_eq!(c.stats().replayed_steps, 0, "the checkpoint covers step 0");
    h.append("in", 0, &["clock-after"]);
    assert!(c.step().await.unwrap());
    let seen: u64 = h
        .integrated("out")
        .keys()
        .find_map(|v| {
            v.strip_prefix("\"clock-after@")?
                .strip_suffix('"')?
                .parse()
                .ok()
        })
        .unwrap();
    assert!(seen >= ahead, "step 1 saw {seen}, before step 0's {ahead}");
}

/// Output crosses the boundary packed: a batch whose ends run past its
/// bytes fails the step, whatever the options; a value that is not JSON is
/// refused when the host checks output (the server does), and committed as
/// bytes when it does not (a local run of its own circuit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_output_is_refused_and_non_json_when_checked() {
    let wasm = component(MISBEHAVE);
    let run = |input: &'static str, check: bool| {
        let wasm = wasm.clone();
        async move {
            let dir = tempfile::tempdir().unwrap();
            let h = Harness::open(dir.path(), &wasm, 1, Limits::default()).await;
            h.append("in", 0, &[input]);
            let mut c = h
                .coordinator(sluice_runtime::PipelineOptions {
                    check_output_json: check,
                    ..manual_checkpoints()
                })
                .await
                .unwrap();
            let r = c.step().await.map(|_| h.integrated("out"));
            (r, dir)
        }
    };
    for check in [false, true] {
        let (r, _dir) = run("malformed", check).await;
        let err = r.unwrap_err().to_string();
        assert!(err.contains("malformed batch"), "{err}");
    }
    let (r, _dir) = run("garbage", true).await;
    let err = r.unwrap_err().to_string();
    assert!(err.contains("not JSON"), "{err}");
    let (r, _dir) = run("garbage", false).await;
    assert_eq!(r.unwrap(), BTreeMap::from([("{oops".to_owned(), 1)]));
}

/// A step whose commit is written while the next step runs has its output
/// checked on the write's thread: output that is not JSON fails the call
/// that awaits the commit, nothing of the step is committed, and the
/// coordinator is back before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_json_output_of_an_overlapped_step_fails_its_commit() {
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(dir.path(), &component(MISBEHAVE), 1, Limits::default()).await;
    h.append("in", 0, &["garbage"]);
    let mut c = h
        .coordinator(sluice_runtime::PipelineOptions {
            check_output_json: true,
            ..manual_checkpoints()
        })
        .await
        .unwrap();
    assert!(c.step_overlapped().await.unwrap(), "the step ran");
    let err = c.step().await.unwrap_err().to_string();
    assert!(err.contains("not JSON"), "{err}");
    assert_eq!(c.stats().steps, 0, "no step counts as committed");
    assert_eq!(c.next_step(), 0, "back to before the step");
    assert!(h.integrated("out").is_empty(), "{:?}", h.integrated("out"));
}
