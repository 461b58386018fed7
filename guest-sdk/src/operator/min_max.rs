//! `min_by` and `max_by`: the smallest and largest value per key, exact
//! under deletes (each key keeps its values as a multiset).

use crate::Stream;
use crate::circuit::Data;

impl<T: Data> Stream<T> {
    /// Emits `(key, smallest value)` for every key with records; when the
    /// minimum changes (including by deleting it), the old pair is deleted and
    /// the new one inserted. Re-shards by key through the exchange.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<(String, i64)>("bids").min_by(|(item, _)| item.clone(), |(_, price)| *price)
    ///         .output("lowest_bid");
    /// }).unwrap();
    /// ```
    pub fn min_by<K: Data, V: Data>(
        &self,
        key: impl Fn(&T) -> K + 'static,
        value: impl Fn(&T) -> V + 'static,
    ) -> Stream<(K, V)> {
        self.group_reduce("min_by", key, value, |_, group| {
            group
                .iter()
                .find(|(_, w)| **w > 0)
                .map(|(v, _)| (v.clone(), 1))
                .into_iter()
                .collect()
        })
    }

    /// Emits `(key, largest value)` for every key with records; the mirror of
    /// [`min_by`](Self::min_by).
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<(String, i64)>("bids").max_by(|(item, _)| item.clone(), |(_, price)| *price)
    ///         .output("highest_bid");
    /// }).unwrap();
    /// ```
    pub fn max_by<K: Data, V: Data>(
        &self,
        key: impl Fn(&T) -> K + 'static,
        value: impl Fn(&T) -> V + 'static,
    ) -> Stream<(K, V)> {
        self.group_reduce("max_by", key, value, |_, group| {
            group
                .iter()
                .rev()
                .find(|(_, w)| **w > 0)
                .map(|(v, _)| (v.clone(), 1))
                .into_iter()
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::operator::testing::{batches, check, zset};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn per_key(input: &BTreeMap<(u8, u8), i64>) -> BTreeMap<u8, Vec<u8>> {
        let mut g: BTreeMap<u8, Vec<u8>> = BTreeMap::new();
        for ((k, v), w) in input {
            if *w > 0 {
                g.entry(*k).or_default().push(*v);
            }
        }
        g
    }

    proptest! {
        #[test]
        fn min_and_max_equal_recomputation(steps in batches((0u8..4, 0u8..10))) {
            check(|c| c.input::<(u8, u8)>("in").min_by(|(k, _)| *k, |(_, v)| *v).output("out"), &steps, |input| {
                zset(per_key(input).into_iter().map(|(k, vs)| ((k, *vs.iter().min().unwrap()), 1)))
            })?;
            check(|c| c.input::<(u8, u8)>("in").max_by(|(k, _)| *k, |(_, v)| *v).output("out"), &steps, |input| {
                zset(per_key(input).into_iter().map(|(k, vs)| ((k, *vs.iter().max().unwrap()), 1)))
            })?;
        }
    }
}
