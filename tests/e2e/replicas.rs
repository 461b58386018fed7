//! Replicas of a worker (`PipelineOptions::replicas`): followers on other
//! hosts step beside each worker's primary on the same input, exchanging
//! the same events; only the primary's output is committed, and every
//! follower's output hash is checked against it every step. The output
//! must be what one host computes, step by step; a replica that computes
//! something else must stop the pipeline with the finding, the step
//! uncommitted.

use crate::hosts::{connect, hashes, lines, options, start_host, start_host_with};
use crate::support::{Harness, component, recount};
use sluice_runtime::{Error, Limits, PipelineOptions, Reach};
use std::collections::BTreeSet;

fn replicated(replicas: u32) -> PipelineOptions {
    PipelineOptions {
        replicas,
        ..options()
    }
}

/// Every worker's replicas are on as many different hosts as `want` (the
/// primary's host and each follower's, "" for the coordinator's own).
fn assert_spread(c: &sluice_runtime::Coordinator, want: usize) {
    let primaries = c.placement_addrs();
    let followers = c.replica_addrs();
    assert_eq!(followers.len(), primaries.len(), "{followers:?}");
    for (w, (p, fs)) in primaries.iter().zip(&followers).enumerate() {
        let on: BTreeSet<&String> = std::iter::once(p).chain(fs).collect();
        assert_eq!(
            on.len(),
            want,
            "worker {w}: primary on {p:?}, followers on {fs:?}"
        );
        assert_eq!(fs.len() + 1, want, "worker {w}: {fs:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn followers_step_beside_every_worker_and_the_output_is_what_one_host_computes() {
    let input = lines(3_000);
    let dir = tempfile::tempdir().unwrap();
    let (one, h) = crate::hosts::with_a_reference(dir.path(), 3, &input).await;
    let name = h.pipeline.options().name.clone();
    let (a, _ta) = start_host(&h, &name).await;
    let (b, _tb) = start_host(&h, &name).await;
    let ha = connect(&a, &name).await;
    // This process and one host: every worker runs on both.
    let mut c = h
        .pipeline
        .coordinator_on(replicated(2), vec![ha.clone()])
        .await
        .unwrap();
    assert_spread(&c, 2);
    assert_eq!(c.stats().replicas_built, 3);
    for _ in 0..8 {
        assert!(c.step().await.unwrap());
    }
    assert_eq!(
        c.stats().replica_steps_checked,
        8 * 3,
        "every follower's output was checked at every step"
    );
    // A host joins: the replicas spread over three, two each.
    c.replace_hosts(vec![ha, connect(&b, &name).await])
        .await
        .unwrap();
    assert_spread(&c, 2);
    let hosts: BTreeSet<String> = c
        .placement_addrs()
        .into_iter()
        .chain(c.replica_addrs().into_iter().flatten())
        .collect();
    assert_eq!(hosts.len(), 3, "the new host runs replicas: {hosts:?}");
    let before = c.stats().replica_steps_checked;
    let mut steps = 0;
    while c.step().await.unwrap() {
        steps += 1;
    }
    assert!(steps > 0);
    assert_eq!(c.stats().replica_steps_checked - before, steps * 3);
    c.finish().await.unwrap();
    drop(c);

    assert!(
        h.divided_steps() > 0,
        "the hosts committed their primaries' shares"
    );
    assert_eq!(
        hashes(&one),
        hashes(&h),
        "every step's output, worker by worker, is what one host computes: \
         the followers committed nothing"
    );
    audited_counts(&h, &input);
}

/// A host of a worker's replica set dies: the step in flight goes on with
/// the other replicas (a follower takes over from a primary that was
/// there), the dead host leaves the placement, every worker is brought
/// back to two replicas from a survivor's state — and nothing is replayed:
/// the coordinator never reopens, and every step's output is still what
/// one host computes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_that_dies_is_failed_over_without_a_replay() {
    let input = lines(3_000);
    let dir = tempfile::tempdir().unwrap();
    let (one, h) = crate::hosts::with_a_reference(dir.path(), 3, &input).await;
    let name = h.pipeline.options().name.clone();
    let (a, ta) = start_host(&h, &name).await;
    let (b, _tb) = start_host(&h, &name).await;
    let mut c = h
        .pipeline
        .coordinator_on(
            replicated(2),
            vec![connect(&a, &name).await, connect(&b, &name).await],
        )
        .await
        .unwrap();
    assert!(
        c.placement_addrs().contains(&a),
        "a runs a primary: {:?}",
        c.placement_addrs()
    );
    for _ in 0..5 {
        assert!(c.step().await.unwrap());
    }
    // Host a dies: its listener and every connection go with the task.
    ta.abort();
    let _ = ta.await;
    let mut steps = 0;
    while c.step().await.expect("the step goes on without host a") {
        steps += 1;
    }
    assert!(steps > 2);
    let stats = c.stats().clone();
    assert!(stats.failovers >= 1, "a follower took over: {stats:?}");
    assert!(stats.replicas_lost >= 1, "{stats:?}");
    assert_eq!(stats.replayed_steps, 0);
    let on: BTreeSet<String> = c
        .placement_addrs()
        .into_iter()
        .chain(c.replica_addrs().into_iter().flatten())
        .collect();
    assert!(!on.contains(&a), "host a left the placement: {on:?}");
    assert_spread(&c, 2);
    // Whose output was committed: a's primaries' before the failover, a
    // follower's from the step it took over on.
    let by = &stats.committed_by;
    assert!(by.len() >= 2, "{by:?}");
    assert!(by[0].1.contains(&a), "{by:?}");
    assert!(!by.last().unwrap().1.contains(&a), "{by:?}");
    assert!(by.windows(2).all(|p| p[0].0 < p[1].0), "{by:?}");
    c.finish().await.unwrap();
    drop(c);
    assert_eq!(
        hashes(&one),
        hashes(&h),
        "every step's output is what one host computes, through the failover"
    );
    audited_counts(&h, &input);
    // The checkpoints taken after the failover hold the state the steps
    // ran on: a coordinator restored from the newest counts on from it
    // (the promoted follower's changes do not count from the checkpoint
    // before it: the next checkpoint after a failover is whole).
    let more = lines(600);
    crate::hosts::fill(&h, &more).await;
    // A fresh host (b kept the workers it ran, which a coordinator would
    // adopt instead of restoring).
    let (d, _td) = start_host(&h, &name).await;
    let mut c = h
        .pipeline
        .coordinator_on(replicated(2), vec![connect(&d, &name).await])
        .await
        .unwrap();
    assert!(c.stats().restored_checkpoint.is_some());
    while c.step().await.unwrap() {}
    c.finish().await.unwrap();
    drop(c);
    let all: Vec<String> = input.iter().chain(&more).cloned().collect();
    audited_counts(&h, &all);
}

/// Host a is killed at another moment of the run in each trial — inside a
/// step's exchange, between a divided step's division and its shares, in a
/// checkpoint's snapshots, between steps: no step fails, none is replayed,
/// and the output is counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_killed_at_any_moment_is_failed_over_without_a_replay() {
    let wasm = component("examples/wordcount");
    let input = lines(1_500);
    let mut failovers = 0;
    for (trial, delay_ms) in [0u64, 1, 3, 6, 10, 15, 25, 40].into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let t = Trial::start(dir.path(), &wasm, &input).await;
        let (h, ta) = (&t.harness, t.a_task);
        let mut c = t.coordinator;
        let killer = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
            ta.abort();
            let _ = ta.await;
        });
        loop {
            match c.step().await {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => panic!("trial {trial} (kill after {delay_ms} ms): a step failed: {e}"),
            }
        }
        killer.await.unwrap();
        let stats = c.stats().clone();
        assert_eq!(stats.replayed_steps, 0);
        failovers += stats.failovers;
        c.finish().await.unwrap();
        drop(c);
        audited_counts(h, &input);
    }
    assert!(failovers > 0, "some trials killed a primary's host");
}

/// The coordinator dies between steps (its connections just end, as a
/// killed process's would): the hosts keep their workers, and the next
/// coordinator adopts them — nothing restored, nothing replayed — and
/// every step's output is still what one host computes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_coordinator_adopts_the_workers_a_dead_one_left() {
    let input = lines(3_000);
    let dir = tempfile::tempdir().unwrap();
    let (one, h) = crate::hosts::with_a_reference(dir.path(), 3, &input).await;
    let name = h.pipeline.options().name.clone();
    let (a, _ta) = start_host(&h, &name).await;
    let (b, _tb) = start_host(&h, &name).await;
    let mut last_adopted = 0;
    for round in 0..3 {
        let mut c = h
            .pipeline
            .coordinator_on(
                replicated(2),
                vec![connect(&a, &name).await, connect(&b, &name).await],
            )
            .await
            .unwrap();
        let stats = c.stats().clone();
        if round > 0 {
            assert_eq!(stats.restored_checkpoint, None, "round {round}: {stats:?}");
            assert_eq!(stats.replayed_steps, 0, "round {round}: {stats:?}");
            // W = 3 on three slots, two replicas each: the four instances
            // on the two hosts.
            assert_eq!(stats.adopted, 4, "round {round}: {stats:?}");
            last_adopted = stats.adopted;
        }
        for _ in 0..4 {
            assert!(c.step().await.unwrap());
        }
        // The followers that died with the coordinator before were rebuilt
        // after its first step.
        assert_spread(&c, 2);
        c.crash();
    }
    assert_eq!(last_adopted, 4);
    // A coordinator with other pipeline settings than the kept instances
    // were started with adopts none of them: it restores and replays.
    let mut c = h
        .pipeline
        .coordinator_on(
            PipelineOptions {
                config: vec![("a-setting".into(), "another value".into())],
                ..replicated(2)
            },
            vec![connect(&a, &name).await, connect(&b, &name).await],
        )
        .await
        .unwrap();
    assert_eq!(c.stats().adopted, 0, "{:?}", c.stats());
    assert!(c.stats().replayed_steps > 0, "{:?}", c.stats());
    while c.step().await.unwrap() {}
    c.finish().await.unwrap();
    drop(c);
    assert_eq!(
        hashes(&one),
        hashes(&h),
        "every step's output is what one host computes, through the take-overs"
    );
    audited_counts(&h, &input);
}

/// The coordinator dies at another moment in each trial — before a step's
/// calls go out, inside its exchange, between its division and its
/// shares, in a checkpoint: the next one adopts the workers the hosts kept
/// (completing the step in flight where every worker computed it) or, where
/// it cannot, restores; either way the output is counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_coordinator_that_dies_at_any_moment_is_followed_without_loss() {
    let wasm = component("examples/wordcount");
    let input = lines(1_500);
    let mut adopted = 0;
    let mut late_not_adopted = Vec::new();
    let mut in_flight = 0;
    for (trial, delay_us) in [0u64, 200, 1_000, 3_000, 6_000, 10_000, 20_000, 40_000]
        .into_iter()
        .enumerate()
    {
        let dir = tempfile::tempdir().unwrap();
        let t = Trial::start(dir.path(), &wasm, &input).await;
        let (h, name, a, b) = (&t.harness, &t.name, &t.a, &t.b);
        let mut c = t.coordinator;
        let before = h.log.last_step().unwrap();
        let wait = std::time::Duration::from_micros(delay_us);
        let _ = tokio::time::timeout(wait, c.step()).await;
        let _ = c.settle().await;
        c.crash();
        let mut c = h
            .pipeline
            .coordinator_on(
                trial_options(),
                vec![connect(a, name).await, connect(b, name).await],
            )
            .await
            .unwrap();
        let stats = c.stats().clone();
        eprintln!(
            "trial {trial} (dies after {delay_us} µs): last step {before:?} -> {:?}, {stats:?}",
            c.next_step()
        );
        if stats.adopted > 0 {
            adopted += 1;
            assert_eq!(stats.replayed_steps, 0);
            in_flight += stats.adopted_in_flight;
        } else if delay_us >= 10_000 {
            late_not_adopted.push(delay_us);
        }
        while c.step().await.unwrap() {}
        c.finish().await.unwrap();
        drop(c);
        audited_counts(h, &input);
    }
    eprintln!("{adopted} of 8 trials adopted, {in_flight} completing the step in flight");
    // A death before the step's calls reached every worker's host leaves
    // the others waiting inside the step, their state part-way through it:
    // those cannot be adopted, and the next coordinator restores (after
    // `BUSY_WAIT`). How many of the early deaths (0–6 ms) land so depends
    // on the machine's load: 6–8 of 8 trials adopted alone, 4 of 8 in a
    // loaded CI run (every early one but 1 ms restored). A death 10 ms or
    // more into the step comes after the calls went out on any machine
    // this runs on: those must be adopted.
    assert!(
        late_not_adopted.is_empty() && adopted >= 3,
        "{adopted} of 8 trials adopted; not adopted though dying late: {late_not_adopted:?} µs"
    );
}

/// Hosts labelled with zones: the two replicas of every worker run in
/// different zones — when the pipeline opens, and after a host of one
/// zone dies and the followers it ran are rebuilt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_replicas_of_a_worker_go_to_different_zones() {
    let input = lines(2_000);
    let dir = tempfile::tempdir().unwrap();
    let (_, h) = crate::hosts::with_a_reference(dir.path(), 4, &input).await;
    let name = h.pipeline.options().name.clone();
    let (a, ta) = start_host(&h, &name).await;
    let (b, _tb) = start_host(&h, &name).await;
    let (d, _td) = start_host(&h, &name).await;
    // This process and d in zone east, a and b in zone west (placed by load
    // alone, worker 0's follower would go to d, beside its primary here).
    let zones: std::collections::BTreeMap<String, String> = [
        (String::new(), "east"),
        (a.clone(), "west"),
        (b.clone(), "west"),
        (d.clone(), "east"),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_owned()))
    .collect();
    let zone = |addr: &String| zones[addr].clone();
    let spread = |c: &sluice_runtime::Coordinator, when: &str| {
        for (w, (p, fs)) in c
            .placement_addrs()
            .iter()
            .zip(c.replica_addrs())
            .enumerate()
        {
            assert_eq!(fs.len(), 1, "{when}: worker {w}: {fs:?}");
            assert_ne!(
                zone(p),
                zone(&fs[0]),
                "{when}: worker {w}'s replicas on {p:?} and {:?} share a zone",
                fs[0]
            );
        }
    };
    let hosts = vec![
        connect(&a, &name).await,
        connect(&b, &name).await,
        connect(&d, &name).await,
    ];
    let mut c = h
        .pipeline
        .coordinator_on(
            PipelineOptions {
                zones: zones.clone(),
                ..replicated(2)
            },
            hosts,
        )
        .await
        .unwrap();
    spread(&c, "opened");
    for _ in 0..3 {
        assert!(c.step().await.unwrap());
    }
    ta.abort();
    let _ = ta.await;
    while c.step().await.unwrap() {}
    assert!(c.stats().failovers + c.stats().replicas_lost > 0);
    spread(&c, "after host a died");
    c.finish().await.unwrap();
    drop(c);
    audited_counts(&h, &input);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_are_kept_through_a_rescale_and_a_reopen() {
    let wasm = component("examples/wordcount");
    let input = lines(2_400);
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(&dir.path().join("p"), &wasm, 2, Limits::default()).await;
    crate::hosts::fill(&h, &input[..1_200]).await;
    let name = h.pipeline.options().name.clone();
    let (a, _ta) = start_host(&h, &name).await;
    let (b, _tb) = start_host(&h, &name).await;
    let (ha, hb) = (connect(&a, &name).await, connect(&b, &name).await);
    let mut c = h
        .pipeline
        .coordinator_on(replicated(2), vec![ha.clone(), hb.clone()])
        .await
        .unwrap();
    for _ in 0..4 {
        assert!(c.step().await.unwrap());
    }
    c.rescale(3).await.unwrap();
    assert_spread(&c, 2);
    while c.step().await.unwrap() {}
    let checked = c.stats().replica_steps_checked;
    assert!(checked > 0);
    drop(c);
    // A new coordinator (a new leader) restores, replays, and builds the
    // followers again — three replicas now, one on every host.
    crate::hosts::fill(&h, &input[1_200..]).await;
    let mut c = h
        .pipeline
        .coordinator_on(replicated(3), vec![ha, hb])
        .await
        .unwrap();
    assert_spread(&c, 3);
    while c.step().await.unwrap() {}
    assert!(c.stats().replica_steps_checked > 0);
    c.finish().await.unwrap();
    drop(c);
    audited_counts(&h, &input);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_that_computes_other_output_stops_the_pipeline_with_the_finding() {
    let wasm = component("examples/wordcount");
    let dir = tempfile::tempdir().unwrap();
    let h = Harness::open(&dir.path().join("p"), &wasm, 2, Limits::default()).await;
    crate::hosts::fill(&h, &lines(1_000)).await;
    let name = h.pipeline.options().name.clone();
    let reach = Reach {
        checkpoints: None,
        log: Some(h.log.clone()),
        read_only_log: false,
    };
    let (a, _ta, host_a) = start_host_with(&h, &name, reach).await;
    let (b, _tb) = start_host(&h, &name).await;
    let mut c = h
        .pipeline
        .coordinator_on(
            replicated(2),
            vec![connect(&a, &name).await, connect(&b, &name).await],
        )
        .await
        .unwrap();
    for _ in 0..3 {
        assert!(c.step().await.unwrap());
    }
    let committed = h.log.last_step().unwrap();
    // Host a's workers now compute other output than their replicas.
    host_a.alter_output(true);
    let err = c.step().await.unwrap_err();
    let Error::ReplicasDiverged {
        step,
        worker,
        primary,
        replica,
        primary_at,
        replica_at,
    } = &err
    else {
        panic!("not the replicas' finding: {err}");
    };
    assert_eq!(*step, 3, "{err}");
    assert_ne!(primary, replica, "{err}");
    assert!(
        primary_at.contains(&a) || replica_at.contains(&a),
        "names host a ({a}): {err}"
    );
    assert!(*worker < 2);
    assert!(!err.is_transient(), "the pipeline stops: {err}");
    assert_eq!(err.kind(), "nondeterministic");
    let message = err.to_string();
    assert!(
        message.contains("not deterministic") && message.contains(primary.as_str()),
        "{message}"
    );
    assert_eq!(
        h.log.last_step().unwrap(),
        committed,
        "nothing of the step was committed"
    );
}

/// A trial's pipeline: W = 3 on this process and two hosts (a and b), two
/// replicas each, three steps run.
struct Trial {
    harness: Harness,
    name: String,
    a: String,
    a_task: tokio::task::JoinHandle<()>,
    b: String,
    _b_task: tokio::task::JoinHandle<()>,
    coordinator: sluice_runtime::Coordinator,
}

fn trial_options() -> PipelineOptions {
    PipelineOptions {
        checkpoint_every_steps: 2,
        ..replicated(2)
    }
}

impl Trial {
    async fn start(dir: &std::path::Path, wasm: &std::path::Path, input: &[String]) -> Trial {
        let harness = Harness::open(&dir.join("p"), wasm, 3, Limits::default()).await;
        crate::hosts::fill(&harness, input).await;
        let name = harness.pipeline.options().name.clone();
        let (a, a_task) = start_host(&harness, &name).await;
        let (b, _b_task) = start_host(&harness, &name).await;
        let hosts = vec![connect(&a, &name).await, connect(&b, &name).await];
        let mut coordinator = harness
            .pipeline
            .coordinator_on(trial_options(), hosts)
            .await
            .unwrap();
        for _ in 0..3 {
            assert!(coordinator.step().await.unwrap());
        }
        Trial {
            harness,
            name,
            a,
            a_task,
            b,
            _b_task,
            coordinator,
        }
    }
}

/// The pipeline's log passes the audit and its counts are the input's.
fn audited_counts(h: &Harness, input: &[String]) {
    h.audit();
    let expected = recount(input.iter().map(|l| (l.as_str(), 1)));
    assert_eq!(h.word_counts(), expected);
}
