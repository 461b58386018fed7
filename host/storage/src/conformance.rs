//! The conformance suites every storage backend must pass.
//!
//! Plain functions over the traits (as `object_store` does): a backend's
//! tests call [`log_backend`] and [`checkpoint_store`] with a factory for
//! fresh, empty instances, passing what the backend cannot do as flags. The
//! embedded backends run them in their crate's tests; the Kafka backend runs
//! the same functions against a real broker.

use crate::checkpoint::KEPT;
use crate::error::StorageError as Error;
use crate::{
    AppendBatch, Checkpoint, CheckpointMeta, CheckpointStore, LogBackend, ProducerSeq, StatePiece,
    WorkerCommit, WorkerDone,
};
use sluice_core::{
    Event, Frontier, OutputEntry, PartitionId, StepCommit, StepRecord, hash_outputs,
};
use std::sync::Arc;

pub mod appends;
pub mod bad_records;

pub use appends::{
    append_read_watermarks, appends_are_ordered_per_partition,
    ingest_marks_are_atomic_with_appends, lazy_appends_are_read_like_appends,
};

/// What a log backend supports.
#[derive(Debug, Clone, Copy)]
pub struct LogFlags {
    /// Whether `trim` discards data (a backend may keep it longer).
    pub supports_trim: bool,
    /// Whether offsets are dense (every offset holds an event). Kafka's are
    /// not: transaction markers take offsets. Without it, the suite checks
    /// only what the trait promises: offsets increase, an append's range
    /// covers its events (consecutive for a single writer), reads return
    /// exactly the events of their range.
    pub dense_offsets: bool,
    /// Whether `trim_output` deletes output (Kafka's topics keep their own
    /// retention).
    pub output_retention: bool,
}

pub(crate) fn ev(i: u64) -> Event {
    Event {
        value: format!("{i}").into_bytes(),
        weight: if i.is_multiple_of(3) { -1 } else { 1 },
    }
}

fn frontier(input: u32, partition: u32, offset: u64) -> Frontier {
    [(PartitionId { input, partition }, offset)]
        .into_iter()
        .collect()
}

/// A well-formed commit of `step` for one worker and output `out`.
pub fn sample_commit(step: u64, offset: u64) -> StepCommit {
    let f = frontier(0, 0, offset);
    StepCommit {
        record: StepRecord {
            step,
            epoch: 1, // the first `fence()` of a fresh log
            time_ms: 1_700_000_000_000 + step,
            frontiers: vec![f.clone()],
            output_hashes: vec![step as u128],
            limits: Default::default(),
            prev: 0,
            layout: None,
        },
        outputs: vec![(
            "out".into(),
            vec![OutputEntry {
                step,
                worker: 0,
                frontier: f,
                events: vec![ev(step)],
            }],
        )],
        dead_letters: Vec::new(),
    }
}

/// Runs every log test on fresh logs from `make`.
pub fn log_backend(make: &dyn Fn() -> Arc<dyn LogBackend>, flags: LogFlags) {
    append_read_watermarks(&*make(), flags);
    appends_are_ordered_per_partition(&*make());
    ingest_marks_are_atomic_with_appends(&*make());
    lazy_appends_are_read_like_appends(&*make(), flags);
    producers_follow_the_idempotence_rules(&*make(), flags);
    commit_step_once_and_in_order(&*make());
    fencing_refuses_an_older_epoch(&*make());
    step_records_and_outputs_round_trip(&*make());
    output_scans_stop_where_the_reader_stops(&*make());
    output_retention_trims_old_steps(&*make(), flags);
    trim_moves_low_watermark(&*make(), flags);
    unknown_input_is_an_error(&*make());
    divided_steps_commit_per_worker(make());
    bad_records::marked_records_read_back_as_bad(&*make());
    bad_records::dead_letters_commit_with_their_step(&*make());
    bad_records::a_share_commits_its_dead_letters_once(make());
}

/// Fencing: after a new epoch starts, a commit carrying the old one is
/// refused, and the new epoch commits.
pub fn fencing_refuses_an_older_epoch(log: &dyn LogBackend) {
    let first = log.fence().unwrap();
    let mut commit = sample_commit(0, 1);
    commit.record.epoch = first;
    log.commit_step(&commit).unwrap();
    let second = log.fence().unwrap();
    assert!(second > first);
    let mut zombie = sample_commit(1, 2);
    zombie.record.epoch = first;
    assert!(matches!(
        log.commit_step(&zombie),
        Err(Error::HostEpochSuperseded { step: 1, epoch, current }) if epoch == first && current == second
    ));
    assert_eq!(
        log.last_step().unwrap(),
        Some(0),
        "the zombie's commit wrote nothing"
    );
    zombie.record.epoch = second;
    log.commit_step(&zombie).unwrap();
}

/// A producer's appends follow Kafka's idempotent-producer rules, per
/// (producer, input): the next sequence number appends; a retry of the last
/// gets its original offsets and appends nothing; an older one and a gap are
/// refused, naming the last and the expected; a new epoch starts a new
/// session at 1 and fences the old one. Nothing refused is appended.
pub fn producers_follow_the_idempotence_rules(log: &dyn LogBackend, flags: LogFlags) {
    log.create_input("orders", 1).unwrap();
    log.create_input("customers", 1).unwrap();
    let batch =
        |input: &str, producer: &str, epoch: u64, seq: u64, events: Vec<Event>| AppendBatch {
            appends: vec![(input.into(), 0, events)],
            mark: None,
            producer: Some(ProducerSeq {
                id: producer.into(),
                epoch,
                seq,
            }),
        };
    let high = |input: &str| log.watermarks(input, 0).unwrap().1;
    assert_eq!(log.producer("x", "orders").unwrap(), None);
    let first = log
        .append(batch("orders", "x", 0, 1, vec![ev(1), ev(2)]))
        .unwrap();
    if flags.dense_offsets {
        assert_eq!(first, vec![0..2]);
    }
    let stored = log.producer("x", "orders").unwrap().expect("stored");
    assert_eq!((stored.epoch, stored.last_seq), (0, 1));
    // A retry of the last append: the original offsets, nothing appended.
    let before = high("orders");
    assert_eq!(
        log.append(batch("orders", "x", 0, 1, vec![ev(1), ev(2)]))
            .unwrap(),
        first
    );
    assert_eq!(high("orders"), before, "a retry appends nothing");
    // Sequence numbers are per input: the same (x, 1) on another input appends.
    let c = log
        .append(batch("customers", "x", 0, 1, vec![ev(7)]))
        .unwrap();
    assert_eq!(
        c[0].end - c[0].start,
        1,
        "another input is another sequence"
    );
    assert_eq!(log.read("customers", 0, c[0].clone()).unwrap(), vec![ev(7)]);
    // A gap (3 before 2, as when pushes in flight land out of order): refused.
    assert!(matches!(
        log.append(batch("orders", "x", 0, 3, vec![ev(4)])),
        Err(Error::OutOfOrderSequence {
            seq: 3,
            expected: 2,
            ..
        })
    ));
    let two = log.append(batch("orders", "x", 0, 2, vec![ev(3)])).unwrap();
    assert!(two[0].start >= first[0].end);
    assert!(log.append(batch("orders", "x", 0, 3, vec![ev(4)])).is_ok());
    // An older sequence number: refused, naming the last acknowledged.
    assert!(matches!(
        log.append(batch("orders", "x", 0, 1, vec![ev(1), ev(2)])),
        Err(Error::DuplicateSequence {
            seq: 1,
            last: 3,
            ..
        })
    ));
    // A producer that restarts its numbering starts a new session (epoch).
    let again = log.append(batch("orders", "x", 1, 1, vec![ev(5)])).unwrap();
    assert_eq!(
        again[0].end - again[0].start,
        1,
        "a new session appends at 1"
    );
    let stored = log.producer("x", "orders").unwrap().expect("stored");
    assert_eq!((stored.epoch, stored.last_seq), (1, 1));
    // ... which fences the older session.
    assert!(matches!(
        log.append(batch("orders", "x", 0, 4, vec![ev(6)])),
        Err(Error::InputProducerSuperseded {
            epoch: 0,
            current: 1,
            ..
        })
    ));
    // Another producer is independent.
    assert!(log.append(batch("orders", "y", 0, 1, vec![ev(8)])).is_ok());
    assert_eq!(
        log.read("orders", 0, 0..high("orders")).unwrap(),
        vec![ev(1), ev(2), ev(3), ev(4), ev(5), ev(8)],
        "exactly the accepted appends, once each"
    );
    // A producer's batch goes to one input.
    let mut two_inputs = batch("orders", "z", 0, 1, vec![ev(9)]);
    two_inputs
        .appends
        .push(("customers".into(), 0, vec![ev(9)]));
    assert!(log.append(two_inputs).is_err());
}

/// I1: a step commits once, and steps commit in order from 0.
pub fn commit_step_once_and_in_order(log: &dyn LogBackend) {
    log.fence().unwrap();
    assert_eq!(log.last_step().unwrap(), None);
    assert!(matches!(
        log.commit_step(&sample_commit(1, 1)),
        Err(Error::StepGap {
            step: 1,
            last: None
        })
    ));
    log.commit_step(&sample_commit(0, 1)).unwrap();
    assert!(matches!(
        log.commit_step(&sample_commit(0, 1)),
        Err(Error::StepExists { step: 0 })
    ));
    assert!(matches!(
        log.commit_step(&sample_commit(2, 1)),
        Err(Error::StepGap { step: 2, .. })
    ));
    log.commit_step(&sample_commit(1, 2)).unwrap();
    assert_eq!(log.last_step().unwrap(), Some(1));
    let mut seen = Vec::new();
    log.scan_output("out", 0, &mut |e| {
        seen.push((e.step, e.worker));
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    assert_eq!(
        seen,
        vec![(0, 0), (1, 0)],
        "exactly one entry per step per worker"
    );
}

/// The division of step `step` for two workers (frontiers at `offset`).
pub fn sample_division(step: u64, offset: u64, prev: u128) -> StepRecord {
    StepRecord {
        step,
        epoch: 1,
        time_ms: 1_700_000_000_000 + step,
        frontiers: vec![frontier(0, 0, offset), frontier(0, 1, offset)],
        output_hashes: Vec::new(),
        limits: Default::default(),
        prev,
        layout: None,
    }
}

/// Worker `worker`'s share of a divided step with `events`.
pub fn sample_share(record: &StepRecord, worker: u32, events: Vec<Event>) -> WorkerCommit {
    WorkerCommit {
        step: record.step,
        worker,
        hash: hash_outputs(std::slice::from_ref(&events)),
        outputs: vec![(
            "out".into(),
            OutputEntry {
                step: record.step,
                worker,
                frontier: record.frontiers[worker as usize].clone(),
                events,
            },
        )],
        dead_letters: Vec::new(),
    }
}

/// A log that takes divided steps: the division commits first and shows no
/// output; each worker's share commits once, by its current holder (a
/// second take fences the first); a share whose done record exists is
/// answered `Already` with the same hash and refused with another; a share
/// that does not fit its division is refused; the step's output becomes
/// visible, and its hashes known, when every share is in. A log that
/// commits steps whole says so and takes no worker.
pub fn divided_steps_commit_per_worker(log: Arc<dyn LogBackend>) {
    if !log.worker_commits() {
        assert!(log.clone().take_worker(0).is_err());
        return;
    }
    log.fence().unwrap();
    let entries = |log: &Arc<dyn LogBackend>| {
        let mut seen = Vec::new();
        log.scan_output("out", 0, &mut |e| {
            seen.push((e.step, e.worker, e.events.len()));
            Ok(std::ops::ControlFlow::Continue(()))
        })
        .unwrap();
        seen
    };
    let division = sample_division(0, 5, 0);
    log.commit_step(&StepCommit::division(division.clone()))
        .unwrap();
    assert_eq!(log.last_step().unwrap(), Some(0));
    assert_eq!(log.step_record(0).unwrap(), Some(division.clone()));
    assert_eq!(log.output_hashes(0).unwrap(), None, "no share is in yet");
    assert!(entries(&log).is_empty(), "a division shows no output");

    let share0 = sample_share(&division, 0, vec![ev(1), ev(2)]);
    let share1 = sample_share(&division, 1, vec![ev(3)]);
    let mut holder0 = log.clone().take_worker(0).unwrap();
    assert_eq!(holder0.worker(), 0);
    assert_eq!(holder0.commit(&share0).unwrap(), WorkerDone::Committed);
    assert_eq!(
        log.output_hashes(0).unwrap(),
        None,
        "worker 1's share is missing"
    );
    assert!(entries(&log).is_empty(), "shares show together");

    // Taking a worker fences its earlier holder.
    let mut zombie = log.clone().take_worker(1).unwrap();
    let mut holder1 = log.clone().take_worker(1).unwrap();
    assert!(
        zombie.commit(&share1).is_err(),
        "a fenced holder commits nothing"
    );
    assert_eq!(holder1.commit(&share1).unwrap(), WorkerDone::Committed);
    assert_eq!(
        log.await_complete(0).unwrap(),
        vec![share0.hash, share1.hash]
    );
    assert_eq!(
        log.output_hashes(0).unwrap(),
        Some(vec![share0.hash, share1.hash])
    );
    assert_eq!(entries(&log), vec![(0, 0, 2), (0, 1, 1)]);

    // A replayed share: once, checked against the done record.
    assert_eq!(holder0.commit(&share0).unwrap(), WorkerDone::Already);
    let mut again = log.clone().take_worker(0).unwrap();
    assert_eq!(again.commit(&share0).unwrap(), WorkerDone::Already);
    assert!(matches!(
        again.commit(&sample_share(&division, 0, vec![ev(7)])),
        Err(Error::DoneDiffers {
            step: 0,
            worker: 0,
            ..
        })
    ));
    assert_eq!(
        entries(&log),
        vec![(0, 0, 2), (0, 1, 1)],
        "nothing written twice"
    );

    // Shares that do not fit their division.
    let mut wrong_hash = sample_share(&division, 0, vec![ev(1), ev(2)]);
    wrong_hash.hash ^= 1;
    assert!(matches!(
        again.commit(&wrong_hash),
        Err(Error::InvalidCommit { .. })
    ));
    let mut wrong_frontier = share0.clone();
    wrong_frontier.outputs[0].1.frontier = frontier(0, 0, 99);
    assert!(matches!(
        again.commit(&wrong_frontier),
        Err(Error::InvalidCommit { .. })
    ));
    let unrecorded = sample_share(&sample_division(1, 6, 0), 0, vec![ev(1)]);
    assert!(
        again.commit(&unrecorded).is_err(),
        "a share of an unrecorded step"
    );
    let mut other = log.clone().take_worker(1).unwrap();
    assert!(
        other.commit(&share0).is_err(),
        "worker 0's share offered to worker 1's holder"
    );

    // The next step, divided again, after the complete one.
    let next = sample_division(1, 6, division.chain_hash());
    log.commit_step(&StepCommit::division(next.clone()))
        .unwrap();
    assert_eq!(
        again.commit(&sample_share(&next, 0, vec![])).unwrap(),
        WorkerDone::Committed
    );
    assert_eq!(entries(&log).len(), 2, "step 1 is not complete");
    assert_eq!(
        other.commit(&sample_share(&next, 1, vec![ev(4)])).unwrap(),
        WorkerDone::Committed
    );
    assert_eq!(
        entries(&log),
        vec![(0, 0, 2), (0, 1, 1), (1, 0, 0), (1, 1, 1)]
    );
}

/// Step records and output entries read back as written.
pub fn step_records_and_outputs_round_trip(log: &dyn LogBackend) {
    log.fence().unwrap();
    for s in 0..4 {
        log.commit_step(&sample_commit(s, s * 10)).unwrap();
    }
    assert_eq!(
        log.step_record(2).unwrap(),
        Some(sample_commit(2, 20).record)
    );
    assert_eq!(log.step_record(9).unwrap(), None);
    let mut entries = Vec::new();
    log.scan_output("out", 2, &mut |e| {
        entries.push(e);
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    assert_eq!(
        entries,
        vec![
            sample_commit(2, 20).outputs[0].1[0].clone(),
            sample_commit(3, 30).outputs[0].1[0].clone()
        ]
    );
    let mut none = 0;
    log.scan_output("other", 0, &mut |_| {
        none += 1;
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    assert_eq!(none, 0, "output logs are separate");
}

/// A scan stops where its reader stops, and `read_output` reads no more
/// entries than it returns events from (a read with `limit = 1` of a long
/// history touches one entry).
pub fn output_scans_stop_where_the_reader_stops(log: &dyn LogBackend) {
    log.fence().unwrap();
    for s in 0..40 {
        log.commit_step(&sample_commit(s, s)).unwrap();
    }
    let mut seen = Vec::new();
    log.scan_output("out", 5, &mut |e| {
        seen.push(e.step);
        Ok(if seen.len() == 3 {
            std::ops::ControlFlow::Break(())
        } else {
            std::ops::ControlFlow::Continue(())
        })
    })
    .unwrap();
    assert_eq!(
        seen,
        vec![5, 6, 7],
        "the scan went on after its reader stopped"
    );
    // `read_output` stops there too: one entry for `limit = 1`.
    let read = crate::read_output(log, "out", None, 1).unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].position.step, 0);
    let after = crate::read_output(log, "out", Some(read[0].position), 2).unwrap();
    assert_eq!(
        after.iter().map(|e| e.position.step).collect::<Vec<_>>(),
        vec![1, 2]
    );
}

/// Output retention deletes the entries below a step, durably says where
/// output starts, never moves that down; backends whose output keeps its
/// own retention (`flags.output_retention == false`) keep everything.
pub fn output_retention_trims_old_steps(log: &dyn LogBackend, flags: LogFlags) {
    log.fence().unwrap();
    for s in 0..10 {
        log.commit_step(&sample_commit(s, s)).unwrap();
    }
    assert_eq!(log.output_low("out").unwrap(), 0);
    log.trim_output("out", 6).unwrap();
    log.trim_output("out", 3).unwrap();
    let mut steps = Vec::new();
    log.scan_output("out", 0, &mut |e| {
        steps.push(e.step);
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    if flags.output_retention {
        assert_eq!(log.output_low("out").unwrap(), 6, "never moves down");
        assert_eq!(steps, (6..10).collect::<Vec<_>>());
    } else {
        assert_eq!(log.output_low("out").unwrap(), 0);
        assert_eq!(steps, (0..10).collect::<Vec<_>>());
    }
}

/// Trim raises the low watermark (never lowers it) and reads below it fail.
pub fn trim_moves_low_watermark(log: &dyn LogBackend, flags: LogFlags) {
    log.create_input("in", 1).unwrap();
    let r = log
        .append(AppendBatch {
            appends: vec![("in".into(), 0, (0..10).map(ev).collect())],
            mark: None,
            producer: None,
        })
        .unwrap()
        .remove(0);
    let at = |i: u64| r.start + i;
    log.trim("in", 0, at(4)).unwrap();
    log.trim("in", 0, at(2)).unwrap();
    if flags.supports_trim {
        let (low, high) = log.watermarks("in", 0).unwrap();
        assert_eq!(low, at(4), "trim moved the low watermark, never down");
        assert!(high >= r.end);
        assert!(matches!(
            log.read("in", 0, at(3)..at(5)),
            Err(Error::Trimmed { low, .. }) if low == at(4)
        ));
    }
    assert_eq!(
        log.read("in", 0, at(4)..r.end).unwrap(),
        (4..10).map(ev).collect::<Vec<_>>()
    );
    let r2 = log
        .append(AppendBatch {
            appends: vec![("in".into(), 0, vec![ev(10)])],
            mark: None,
            producer: None,
        })
        .unwrap();
    assert!(r2[0].start >= r.end, "offsets continue after a trim");
    if flags.dense_offsets {
        assert_eq!(r2, vec![10..11]);
    }
}

/// Unknown logs and partitions are errors, not empty results.
pub fn unknown_input_is_an_error(log: &dyn LogBackend) {
    assert!(log.partitions("nope").is_err());
    assert!(log.watermarks("nope", 0).is_err());
    log.create_input("in", 1).unwrap();
    assert!(log.watermarks("in", 1).is_err());
    assert!(
        log.append(AppendBatch {
            appends: vec![("nope".into(), 0, vec![ev(1)])],
            mark: None,
            producer: None
        })
        .is_err()
    );
}

/// A checkpoint of step `step` with `workers` workers: two pieces of shard
/// 7 (one per worker when there are two) and one of shard 300.
pub fn sample_checkpoint(step: u64, workers: usize) -> Checkpoint {
    let shape = sluice_core::PipelineShape::new(
        &sluice_core::CircuitPorts {
            inputs: vec!["in".into()],
            outputs: vec!["out".into()],
            snapshot_version: 1,
            operators: Vec::new(),
        },
        workers as u32,
        |_| workers as u32,
    )
    .expect("a valid shape");
    // Two pieces of shard 7 (a linear state on two workers), one of 300.
    let mut pieces = vec![
        StatePiece {
            shard: 7,
            worker: 0,
            state: format!("state {step}/7/0").into_bytes(),
        },
        StatePiece {
            shard: 300,
            worker: (workers - 1) as u32,
            state: format!("state {step}/300").into_bytes(),
        },
    ];
    if workers > 1 {
        pieces.insert(
            1,
            StatePiece {
                shard: 7,
                worker: 1,
                state: format!("state {step}/7/1").into_bytes(),
            },
        );
    }
    Checkpoint {
        meta: CheckpointMeta {
            step,
            frontiers: (0..workers as u32).map(|w| frontier(0, w, step)).collect(),
            snapshot_version: 1,
            layout: sluice_core::Layout::initial(&shape),
        },
        pieces,
    }
}

/// Runs every checkpoint-store test on fresh stores from `make`.
pub fn checkpoint_store(make: &dyn Fn() -> Arc<dyn CheckpointStore>) {
    checkpoints_round_trip_and_keep_the_newest(&*make());
    checkpoints_only_move_forward(&*make());
    pieces_are_read_by_shard(&*make());
    incremental_checkpoints_carry_pieces(&*make());
    keys_and_worker_pieces_agree_with_pieces(&*make());
}

/// [`CheckpointStore::keys`] and [`CheckpointStore::worker_pieces`] read
/// what [`CheckpointStore::pieces`] reads; a commit naming no staged pieces
/// is a plain one.
pub fn keys_and_worker_pieces_agree_with_pieces(store: &dyn CheckpointStore) {
    let c = sample_checkpoint(5, 3);
    store.put_staged(&c, &[], None).unwrap();
    assert_eq!(store.get(5).unwrap(), Some(c.clone()));
    assert_eq!(
        store.keys(5).unwrap(),
        Some(c.pieces.iter().map(|p| (p.shard, p.worker)).collect())
    );
    for w in 0..3 {
        let (mine, read) = store.worker_pieces(5, w).unwrap().unwrap();
        let want: Vec<StatePiece> = c.pieces.iter().filter(|p| p.worker == w).cloned().collect();
        assert_eq!(mine, want, "worker {w}");
        let bytes: u64 = want.iter().map(|p| p.state.len() as u64).sum();
        assert_eq!(read.local + read.fetched, bytes, "worker {w}");
    }
    assert_eq!(store.keys(6).unwrap(), None);
    assert!(store.worker_pieces(6, 0).unwrap().is_none());
}

/// A stored checkpoint reads back whole; only the newest [`KEPT`] remain.
pub fn checkpoints_round_trip_and_keep_the_newest(store: &dyn CheckpointStore) {
    assert_eq!(store.latest().unwrap(), None);
    for step in [3, 7, 12, 20] {
        store.put(&sample_checkpoint(step, 3)).unwrap();
        assert_eq!(store.latest().unwrap(), Some(sample_checkpoint(step, 3)));
    }
    assert_eq!(store.list().unwrap().len(), KEPT);
    assert_eq!(store.list().unwrap(), vec![12, 20]);
    assert_eq!(store.get(12).unwrap(), Some(sample_checkpoint(12, 3)));
    assert_eq!(store.get(3).unwrap(), None);
    assert_eq!(store.pieces(3, None).unwrap(), None);
    assert_eq!(store.latest_meta().unwrap().map(|m| m.step), Some(20));
}

/// An older checkpoint than the newest is refused; the same step replaces.
pub fn checkpoints_only_move_forward(store: &dyn CheckpointStore) {
    store.put(&sample_checkpoint(5, 2)).unwrap();
    assert!(store.put(&sample_checkpoint(4, 2)).is_err());
    let mut again = sample_checkpoint(5, 2);
    again.pieces[1].state = b"new".to_vec();
    again.pieces.pop();
    store.put(&again).unwrap();
    assert_eq!(store.latest().unwrap(), Some(again));
    let mut bad = sample_checkpoint(6, 2);
    bad.meta.frontiers.pop();
    assert!(store.put(&bad).is_err(), "one frontier per worker");
    let mut bad = sample_checkpoint(6, 2);
    bad.pieces[0].worker = 2;
    assert!(store.put(&bad).is_err(), "pieces of workers of the layout");
}

/// A reader of some shards gets only their pieces, of every worker.
pub fn pieces_are_read_by_shard(store: &dyn CheckpointStore) {
    let c = sample_checkpoint(9, 3);
    store.put(&c).unwrap();
    let seven = store.pieces(9, Some(&[7, 8])).unwrap().unwrap();
    assert_eq!(seven, c.pieces[..2].to_vec());
    assert_eq!(
        store.pieces(9, Some(&[300, 7])).unwrap().unwrap(),
        c.pieces,
        "ordered by shard"
    );
    assert!(store.pieces(9, Some(&[1])).unwrap().unwrap().is_empty());
}

/// An incremental checkpoint reads back whole — its own pieces and those
/// it carries, from however far back — while the checkpoints it carries
/// from are dropped; carrying what is not there is refused.
pub fn incremental_checkpoints_carry_pieces(store: &dyn CheckpointStore) {
    use crate::Carried;
    let piece = |shard, worker, state: &str| StatePiece {
        shard,
        worker,
        state: state.as_bytes().to_vec(),
    };
    let at = |step: u64, pieces: Vec<StatePiece>| {
        let mut c = sample_checkpoint(step, 3);
        c.pieces = pieces;
        c
    };
    let carry = |from, pieces: &[(u32, u32)]| Carried {
        from,
        pieces: pieces.to_vec(),
    };
    // Step 3: everything written.
    store.put(&sample_checkpoint(3, 3)).unwrap();
    let mut expect = sample_checkpoint(3, 3).pieces;
    // Step 7: shard 300 changed; shard 7 carried from 3.
    store
        .put_carrying(
            &at(7, vec![piece(300, 2, "300 at 7")]),
            &carry(3, &[(7, 0), (7, 1)]),
        )
        .unwrap();
    expect[2] = piece(300, 2, "300 at 7");
    assert_eq!(store.get(7).unwrap(), Some(at(7, expect.clone())));
    // Step 12: (7, 0) changed, (7, 1) still from 3 (carried from 7), 300
    // from 7; checkpoint 3 is dropped, its carried piece stays readable.
    store
        .put_carrying(
            &at(12, vec![piece(7, 0, "7/0 at 12")]),
            &carry(7, &[(7, 1), (300, 2)]),
        )
        .unwrap();
    expect[0] = piece(7, 0, "7/0 at 12");
    assert_eq!(store.list().unwrap(), vec![7, 12]);
    assert_eq!(store.get(12).unwrap(), Some(at(12, expect.clone())));
    assert_eq!(
        store.pieces(12, Some(&[7])).unwrap().unwrap(),
        expect[..2].to_vec(),
        "carried pieces are read by shard too"
    );
    // Step 20: nothing changed but shard 7 of worker 1 went away.
    store
        .put_carrying(&at(20, vec![]), &carry(12, &[(7, 0), (300, 2)]))
        .unwrap();
    expect.remove(1);
    assert_eq!(store.get(20).unwrap(), Some(at(20, expect.clone())));
    assert_eq!(store.get(7).unwrap(), None);
    // Step 22: a delta of (300, 2) on top of the carried piece: both read
    // back, the carried one first; step 24 carries both and adds another.
    store
        .put_carrying(
            &at(22, vec![piece(300, 2, "300 delta at 22")]),
            &carry(20, &[(7, 0), (300, 2)]),
        )
        .unwrap();
    store
        .put_carrying(
            &at(24, vec![piece(300, 2, "300 delta at 24")]),
            &carry(22, &[(7, 0), (300, 2)]),
        )
        .unwrap();
    let mut with_deltas = expect.clone();
    with_deltas.push(piece(300, 2, "300 delta at 22"));
    with_deltas.push(piece(300, 2, "300 delta at 24"));
    assert_eq!(store.get(24).unwrap(), Some(at(24, with_deltas)));
    assert_eq!(store.list().unwrap(), vec![22, 24]);
    // Refused: carrying from a dropped checkpoint, or a piece not there.
    assert!(
        store
            .put_carrying(&at(25, vec![]), &carry(7, &[(7, 0)]))
            .is_err()
    );
    assert!(
        store
            .put_carrying(&at(25, vec![]), &carry(24, &[(7, 1)]))
            .is_err()
    );
    assert_eq!(store.list().unwrap(), vec![22, 24], "nothing was stored");
    // Whole checkpoints again: the carried pieces go with the rest.
    store.put(&sample_checkpoint(30, 3)).unwrap();
    store.put(&sample_checkpoint(31, 3)).unwrap();
    assert_eq!(store.get(31).unwrap(), Some(sample_checkpoint(31, 3)));
    assert_eq!(store.get(24).unwrap(), None);
}
