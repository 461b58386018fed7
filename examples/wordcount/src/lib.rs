//! Word count: lines in, `{"word", "count"}` out, updated incrementally.
//!
//! Input port `lines` takes JSON strings; output port `counts` holds one
//! `{"word": …, "count": n}` per word. When a count changes, the old value is
//! deleted and the new one inserted; deleting a line un-counts its words.

use sluice_guest::prelude::*;

/// One word and how often it occurs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WordCount {
    /// The word, lower-cased, without surrounding punctuation.
    pub word: String,
    /// How many times it occurs in the current input.
    pub count: i64,
}

/// Splits a line into normalized words.
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
    c.input::<String>("lines")
        .flat_map(|line| words(line))
        .count_by(|word| word.clone())
        .map(|(word, count)| WordCount {
            word: word.clone(),
            count: *count,
        })
        .output("counts");
}

sluice_guest::circuit!(build);
