//! A benchmark circuit whose state is large but has few keys: the distinct
//! set of its input strings (the bench feeds 64 KiB strings, so 1 GiB of
//! state is 16 384 keys), and a count of them as its only output. It
//! measures what checkpoints and restores cost per byte, where word count's
//! millions of small keys measure the cost per key.

use sluice_guest::Circuit;

/// Builds the circuit: strings in, the number of distinct strings out.
pub fn build(c: &mut Circuit) {
    c.input::<String>("blobs")
        .distinct()
        .map(|s| s.len() as u64)
        .count_by(|_| 0u8)
        .output("distinct");
}

sluice_guest::circuit!(build);
