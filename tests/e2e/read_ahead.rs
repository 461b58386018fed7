//! A step reads the next step's input while its workers run (when the next
//! division can be foreseen), and the next step uses it only when its own
//! division asks for exactly that: input arriving between the steps, a
//! rescale and a reopen in the middle all leave the counts exact.

use crate::support::{Harness, component, manual_checkpoints, recount};
use sluice_runtime::Limits;

/// The word count with `workers` workers, in `dir`.
async fn wordcount(dir: &std::path::Path, workers: u32) -> Harness {
    Harness::open(
        dir,
        &component("examples/wordcount"),
        workers,
        Limits::default(),
    )
    .await
}

/// Appends `n` new lines to `partition`, keeping them in `lines`.
fn append(h: &Harness, lines: &mut Vec<String>, partition: u32, n: usize) {
    let new: Vec<String> = (0..n)
        .map(|i| format!("w{} p{partition} n{}", i % 5, lines.len() + i))
        .collect();
    let values: Vec<&str> = new.iter().map(String::as_str).collect();
    h.append("lines", partition, &values);
    lines.extend(new);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_steps_input_is_read_ahead_and_used_only_when_it_matches() {
    let dir = tempfile::tempdir().unwrap();
    let h = wordcount(dir.path(), 2).await;
    let partitions = h.pipeline.shape().inputs[0].partitions;
    assert!(partitions >= 3, "{partitions} partitions");
    let mut lines: Vec<String> = Vec::new();
    let mut append = |h: &Harness, partition: u32, n: usize| append(h, &mut lines, partition, n);
    // Every partition but the last holds 5 whole batches (of 2).
    for p in 0..partitions - 1 {
        append(&h, p, 10);
    }
    let options = manual_checkpoints();
    assert_eq!(options.max_batch, 2);
    let mut c = h.coordinator(options.clone()).await.unwrap();
    assert!(c.step().await.unwrap());
    assert!(c.step().await.unwrap());
    let ahead = c.stats().events_read_ahead;
    assert_eq!(
        ahead,
        2 * u64::from(partitions - 1),
        "the second step ran on what the first read ahead"
    );
    // The last partition gets input after the read ahead: the next step
    // divides otherwise and reads for itself.
    append(&h, partitions - 1, 6);
    assert!(c.step().await.unwrap());
    assert_eq!(c.stats().events_read_ahead, ahead, "a stale read was used");
    assert!(c.step().await.unwrap());
    assert!(c.stats().events_read_ahead > ahead, "reading ahead went on");
    // A rescale changes who reads what; a reopen starts without a read.
    c.rescale(3).await.unwrap();
    append(&h, 0, 8);
    assert!(c.step().await.unwrap());
    drop(c);
    append(&h, 1, 8);
    let mut c = h.coordinator(options).await.unwrap();
    while c.step().await.unwrap() {}
    assert!(c.stats().events_read_ahead > 0);
    assert_eq!(
        h.word_counts(),
        recount(lines.iter().map(|l| (l.as_str(), 1)))
    );
    h.audit();
}

/// The tail of an input, shorter than a whole batch, is read ahead when the
/// input has not grown since the step's division (a finished input's last
/// step), and left unused when more input came before the next step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_is_read_ahead_when_its_input_stopped_growing() {
    let dir = tempfile::tempdir().unwrap();
    let h = wordcount(dir.path(), 1).await;
    let mut lines: Vec<String> = Vec::new();
    let options = manual_checkpoints();
    assert_eq!(options.max_batch, 2);
    // Two whole batches and a tail of one.
    append(&h, &mut lines, 0, 5);
    let mut c = h.coordinator(options).await.unwrap();
    assert!(c.step().await.unwrap());
    assert!(c.step().await.unwrap());
    assert_eq!(c.stats().events_read_ahead, 2, "the second batch");
    assert!(c.step().await.unwrap());
    assert_eq!(c.stats().events_read_ahead, 3, "the tail was read ahead");
    // A whole batch and a tail; more input comes after the tail was read
    // ahead: the next step takes a whole batch, reading it itself.
    append(&h, &mut lines, 0, 3);
    assert!(c.step().await.unwrap());
    append(&h, &mut lines, 0, 2);
    assert!(c.step().await.unwrap());
    assert_eq!(c.stats().events_read_ahead, 3, "a stale tail was used");
    while c.step().await.unwrap() {}
    assert_eq!(
        h.word_counts(),
        recount(lines.iter().map(|l| (l.as_str(), 1)))
    );
    h.audit();
}
