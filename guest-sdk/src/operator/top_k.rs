//! `top_k_by`: the k largest values per key.

use crate::Stream;
use crate::circuit::Data;

impl<T: Data> Stream<T> {
    /// Emits `(key, value)` for the `k` largest values of each key (by the
    /// value's `Ord`; wrap it in `std::cmp::Reverse` for the smallest). A
    /// value present n times counts n times. When the top k change, what
    /// left is deleted and what entered inserted. Re-shards by key through
    /// the exchange.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<(String, i64)>("scores").top_k_by(|(game, _)| game.clone(), |(_, s)| *s, 3)
    ///         .output("podium");
    /// }).unwrap();
    /// ```
    pub fn top_k_by<K: Data, V: Data>(
        &self,
        key: impl Fn(&T) -> K + 'static,
        value: impl Fn(&T) -> V + 'static,
        k: usize,
    ) -> Stream<(K, V)> {
        self.group_reduce("top_k_by", key, value, move |_, group| {
            let mut left = k as i64;
            let mut out = Vec::new();
            for (v, w) in group.iter().rev().filter(|(_, w)| **w > 0) {
                if left == 0 {
                    break;
                }
                let n = (*w).min(left);
                out.push((v.clone(), n));
                left -= n;
            }
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::operator::testing::{batches, check, zset};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        #[test]
        fn equals_recomputation(steps in batches((0u8..3, 0u8..12))) {
            check(|c| c.input::<(u8, u8)>("in").top_k_by(|(k, _)| *k, |(_, v)| *v, 3).output("out"), &steps, |input| {
                let mut copies: BTreeMap<u8, Vec<u8>> = BTreeMap::new();
                for ((k, v), w) in input {
                    for _ in 0..(*w).max(0) {
                        copies.entry(*k).or_default().push(*v);
                    }
                }
                zset(copies.into_iter().flat_map(|(k, mut vs)| {
                    vs.sort_unstable_by(|a, b| b.cmp(a));
                    vs.into_iter().take(3).map(move |v| ((k, v), 1))
                }))
            })?;
        }
    }
}
