//! Segments: the pieces one worker wrote for one checkpoint, concatenated
//! into one immutable object, under a name (step, nonce, worker) that no
//! other write draws; and where in its segment each piece lies.

use crate::manifest::PieceRef;
use sluice_storage::Staged;
use std::sync::atomic::{AtomicU64, Ordering};

/// The name of worker `worker`'s segment of checkpoint `step`.
pub(crate) fn segment_name(step: u64, nonce: u64, worker: u32) -> String {
    format!("{step:020}-{nonce:016x}-w{worker:05}")
}

/// Whether `name` is a segment name of `worker` in checkpoint `step`
/// (names from another host are checked before they go into a manifest).
pub(crate) fn is_segment_of(name: &str, step: u64, worker: u32) -> bool {
    name.len() == 44
        && name
            .get(21..37)
            .and_then(|n| u64::from_str_radix(n, 16).ok())
            .is_some_and(|nonce| segment_name(step, nonce, worker) == name)
}

/// Worker `worker`'s pieces (`(shard, bytes)`, in restore order) of
/// checkpoint `step` as one segment: how it is described, and its bytes.
pub(crate) fn segment(
    step: u64,
    nonce: u64,
    worker: u32,
    pieces: &[(u32, &[u8])],
) -> (Staged, Vec<u8>) {
    let mut bytes = Vec::with_capacity(pieces.iter().map(|(_, b)| b.len()).sum());
    for (_, state) in pieces {
        bytes.extend_from_slice(state);
    }
    let staged = Staged {
        step,
        worker,
        segment: segment_name(step, nonce, worker),
        pieces: pieces
            .iter()
            .map(|(shard, state)| (*shard, state.len() as u64))
            .collect(),
    };
    (staged, bytes)
}

/// Where the pieces `staged` describes lie, its segment being number
/// `segment` of a manifest's list.
pub(crate) fn piece_refs(staged: &Staged, segment: u32) -> Vec<PieceRef> {
    let mut offset = 0;
    staged
        .pieces
        .iter()
        .map(|(shard, len)| {
            let r = PieceRef {
                shard: *shard,
                worker: staged.worker,
                segment,
                offset,
                len: *len,
            };
            offset += len;
            r
        })
        .collect()
}

/// A number no other write of the same step (on any host) draws: segments
/// are immutable, so a checkpoint written again never reuses a name — and a
/// host's copy of a segment is always that segment's bytes. 64 random bits
/// (the clock and a counter should the OS source fail).
pub(crate) fn nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    getrandom::u64().unwrap_or_else(|_| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let count = COUNTER.fetch_add(1, Ordering::Relaxed);
        nanos ^ (u64::from(std::process::id()) << 40) ^ count.rotate_right(8)
    })
}
