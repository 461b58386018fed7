//! Incremental checkpoints (issue #17): a checkpoint writes only the shards
//! that changed since the one before and carries the others' pieces from
//! it; recovery from such a checkpoint — whose pieces may come from several
//! checkpoints back — restores the whole state.

use crate::support::{Harness, component, manual_checkpoints, recount};
use sluice_runtime::{Limits, PipelineOptions};
use std::collections::{BTreeMap, BTreeSet};

/// Word counts from the integrated `counts` output.
fn counts(h: &Harness) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for (value, weight) in h.integrated("counts") {
        assert_eq!(weight, 1, "{value}");
        let v: serde_json::Value = serde_json::from_str(&value).unwrap();
        out.insert(
            v["word"].as_str().unwrap().to_owned(),
            v["count"].as_i64().unwrap(),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_writes_only_changed_shards_and_restores_whole() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = component("examples/wordcount");
    let mut lines: Vec<String> = (0..400)
        .map(|l| {
            (0..10)
                .map(|i| format!("w{}", l * 10 + i))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let options = PipelineOptions {
        max_batch: 1_000,
        ..manual_checkpoints()
    };
    let append = |h: &Harness, lines: &[String]| {
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        h.append("lines", 0, &refs);
    };
    let last = {
        let h = Harness::open(dir.path(), &wasm, 2, Limits::default()).await;
        append(&h, &lines);
        let mut c = h.coordinator(options.clone()).await.unwrap();
        while c.step().await.unwrap() {}
        c.checkpoint().await.unwrap();
        let whole = c.stats().checkpoint_bytes_written;
        let keys = |h: &Harness| -> BTreeSet<(u32, u32)> {
            let latest = h.storage.checkpoints().latest().unwrap().unwrap();
            latest.pieces.iter().map(|p| (p.shard, p.worker)).collect()
        };
        let whole_keys = keys(&h);
        let whole_pieces = whole_keys.len();
        assert!(
            whole_pieces > 900,
            "4 000 words fill most shards: {whole_pieces}"
        );
        // Three rounds changing two words each: each checkpoint writes a
        // few shards and still reads back whole.
        for round in 0..3 {
            let more = vec![format!("w{round} w{}", 1000 + round)];
            append(&h, &more);
            lines.extend(more);
            while c.step().await.unwrap() {}
            let before = c.stats().checkpoint_bytes_written;
            c.checkpoint().await.unwrap();
            let written = c.stats().checkpoint_bytes_written - before;
            assert!(
                written > 0 && written * 50 < whole,
                "round {round}: {written} bytes written, a whole checkpoint is {whole}"
            );
            // Every (shard, worker) of the whole checkpoint is there (and
            // those a new word came to), some with deltas after their
            // whole piece.
            let now = keys(&h);
            assert!(now.is_superset(&whole_keys), "every shard's piece is there");
            let pieces = h.storage.checkpoints().latest().unwrap().unwrap().pieces;
            assert!(pieces.len() > now.len(), "deltas follow some pieces");
        }
        // Turned off, a checkpoint is whole again.
        c.set_incremental_checkpoints(false);
        let more = vec!["w7".to_owned()];
        append(&h, &more);
        lines.extend(more);
        while c.step().await.unwrap() {}
        let before = c.stats().checkpoint_bytes_written;
        c.checkpoint().await.unwrap();
        assert!(c.stats().checkpoint_bytes_written - before >= whole);
        // And incremental once more, on top of it.
        c.set_incremental_checkpoints(true);
        let more = vec!["w8 w9".to_owned()];
        append(&h, &more);
        lines.extend(more);
        while c.step().await.unwrap() {}
        let before = c.stats().checkpoint_bytes_written;
        c.checkpoint().await.unwrap();
        assert!((c.stats().checkpoint_bytes_written - before) * 50 < whole);
        c.checkpointed_step().unwrap()
    };
    // Recovery restores the composed checkpoint without replaying, and the
    // counts go on from the whole state.
    let h = Harness::open(dir.path(), &wasm, 2, Limits::default()).await;
    let mut c = h.coordinator(options).await.unwrap();
    assert_eq!(c.stats().restored_checkpoint, Some(last));
    assert_eq!(c.stats().replayed_steps, 0);
    let more: Vec<String> = (0..50).map(|i| format!("w{} fresh", i * 37)).collect();
    append(&h, &more);
    lines.extend(more);
    while c.step().await.unwrap() {}
    c.checkpoint().await.unwrap();
    assert_eq!(
        counts(&h),
        recount(lines.iter().map(|l| (l.as_str(), 1))),
        "the output equals a recount of every line"
    );
}
