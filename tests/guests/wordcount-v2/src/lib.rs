//! Word count, version 2: `examples/wordcount` (its words and output
//! type as there) with a count of word lengths added on a new output port,
//! `lengths`.
//!
//! Version 1's count is unnamed, known in its checkpoints by its default
//! identity `keyed_sum#0/1` (the first of one keyed sum). Here there are
//! two keyed sums, so the word count's default would be `keyed_sum#0/2`:
//! it is named `counts` and takes version 1's state as `keyed_sum#0/1`
//! (`formerly`); the new count is named `lengths`. (Not a dependency on the
//! example's crate: its WebAssembly build exports a circuit of its own.)

use sluice_guest::prelude::*;

/// One word and how often it occurs (as `examples/wordcount`'s).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WordCount {
    /// The word, lower-cased, without surrounding punctuation.
    pub word: String,
    /// How many times it occurs in the current input.
    pub count: i64,
}

/// Splits a line into normalized words (as `examples/wordcount`'s).
pub fn words(line: &str) -> Vec<String> {
    line.split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect()
}

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    let words = c.input::<String>("lines").flat_map(|line| words(line));
    words
        .count_by(|word| word.clone())
        .named("counts")
        .formerly("keyed_sum#0/1")
        .map(|(word, count)| WordCount {
            word: word.clone(),
            count: *count,
        })
        .output("counts");
    words
        .count_by(|word| word.chars().count() as u64)
        .named("lengths")
        .output("lengths");
}

sluice_guest::circuit!(build);
