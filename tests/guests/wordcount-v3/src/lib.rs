//! Word count, version 3: `tests/guests/wordcount-v2` (a count of word
//! lengths beside the word count) whose word count counts a word and its
//! plural as one — `cats` counts as `cat` — and takes version 1's counts
//! through a migration: each counted word becomes its stem, and the
//! counts of words with one stem add up (version 1's `cat` 2 and `cats`
//! 3 become `cat` 5).
//!
//! The key type did not change (a `String`), its meaning did: the count
//! declares state version 1, so version 1's state (version 0) is not
//! carried as it is, and migrates its keys from version 0. (The record
//! type and `words` are copies of the example's, not a dependency on it:
//! its WebAssembly build exports a circuit of its own.)

use sluice_guest::prelude::*;

/// One word and how often it occurs (as `examples/wordcount`'s).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WordCount {
    /// The word's stem: lower-cased, without surrounding punctuation or a
    /// plural's trailing `s`.
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

/// A normalized word without one trailing `s` (`s` alone stays).
pub fn stem(word: &str) -> String {
    match word.strip_suffix('s') {
        Some(stem) if !stem.is_empty() => stem.to_owned(),
        _ => word.to_owned(),
    }
}

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    let words = c.input::<String>("lines").flat_map(|line| words(line));
    words
        .count_by(|word| stem(word))
        .named("counts")
        .formerly("keyed_sum#0/1")
        .state_version(1)
        .migrates_keys_from(0, |word: String| stem(&word))
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
