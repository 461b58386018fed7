//! `fold_by`: a user-defined aggregate per key, exact under deletes.

use crate::Stream;
use crate::circuit::Data;
use crate::zset::Weight;

impl<T: Data> Stream<T> {
    /// Folds each key's values into one result: `step(acc, value, weight)`
    /// is called for every distinct value of the group (in value order) with
    /// its integrated weight, starting from `init`. Emits `(key, result)` for
    /// every non-empty group; when a group changes, the old result is deleted
    /// and the new one inserted. Because the group's values are kept, the
    /// fold needs no inverse: deletes are handled by folding again. That
    /// costs the whole group at every step that changes it: for counts,
    /// sums and distinct counts over large groups, `distinct` and `sum_by`
    /// (several sums at once in an array) do only the step's changes.
    /// Re-shards by key through the exchange.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// // The set of tags per user, as one sorted, comma-separated string.
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<(String, String)>("tags")
    ///         .fold_by(|(user, _)| user.clone(), |(_, tag)| tag.clone(), String::new(), |acc, tag, _| {
    ///             if acc.is_empty() { tag.clone() } else { format!("{acc},{tag}") }
    ///         })
    ///         .output("tag_list");
    /// }).unwrap();
    /// ```
    pub fn fold_by<K: Data, V: Data, A: Data>(
        &self,
        key: impl Fn(&T) -> K + 'static,
        value: impl Fn(&T) -> V + 'static,
        init: A,
        step: impl Fn(A, &V, Weight) -> A + 'static,
    ) -> Stream<(K, A)> {
        self.group_reduce("fold_by", key, value, move |_, group| {
            vec![(
                group
                    .iter()
                    .fold(init.clone(), |acc, (v, w)| step(acc, v, *w)),
                1,
            )]
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
        fn equals_recomputation(steps in batches((0u8..4, 0u8..10))) {
            // Sum of squares times weight: not invertible from the result alone.
            check(
                |c| c.input::<(u8, u8)>("in")
                    .fold_by(|(k, _)| *k, |(_, v)| *v, 0i64, |acc, v, w| acc + (*v as i64).pow(2) * w)
                    .output("out"),
                &steps,
                |input| {
                    let mut g: BTreeMap<u8, i64> = BTreeMap::new();
                    for ((k, v), w) in input {
                        *g.entry(*k).or_default() += (*v as i64).pow(2) * w;
                    }
                    zset(g.into_iter().map(|kv| (kv, 1)))
                },
            )?;
        }
    }
}
