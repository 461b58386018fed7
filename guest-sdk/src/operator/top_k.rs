//! `top_k_by` and `top_k_by_owned`: the k largest values per key.

use crate::circuit::Data;
use crate::operator::group::Multiset;
use crate::{Stream, Weight};

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
        self.group_reduce("top_k_by", key, value, move |_, group| top(group, k))
    }

    /// [`top_k_by`](Self::top_k_by) with `value` taking each record by
    /// value, as [`map_owned`](Self::map_owned) does: a record moves into
    /// `value` when this stream has no other reader after this operator (a
    /// `top_k_by_owned` right after an input, a join or a filter, nearly
    /// always), and is cloned for it otherwise. For a value that keeps
    /// most of its record (the whole bid, ranked by its time), which
    /// `top_k_by` would have to clone. The state is `top_k_by`'s, under the same name: a
    /// circuit can switch between the two and keep its checkpoints.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<(String, i64)>("scores")
    ///         .top_k_by_owned(|(game, _)| game.clone(), |(game, s)| (s, game), 3)
    ///         .output("podium");
    /// }).unwrap();
    /// ```
    pub fn top_k_by_owned<K: Data, V: Data>(
        &self,
        key: impl Fn(&T) -> K + 'static,
        value: impl Fn(T) -> V + 'static,
        k: usize,
    ) -> Stream<(K, V)> {
        self.group_reduce_owned("top_k_by", key, value, move |_, group| top(group, k))
    }
}

/// The `k` largest values of a group, each with how many of its copies are
/// among them.
fn top<V: Data>(group: &Multiset<V>, k: usize) -> Vec<(V, Weight)> {
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
}

#[cfg(test)]
mod tests {
    use crate::Weight;
    use crate::operator::testing::{batches, check, zset};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// The 3 largest values per key of the integrated input.
    fn top_3(input: &BTreeMap<(u8, u8), Weight>) -> BTreeMap<(u8, u8), Weight> {
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
    }

    proptest! {
        #[test]
        fn equals_recomputation(steps in batches((0u8..3, 0u8..12))) {
            check(|c| c.input::<(u8, u8)>("in").top_k_by(|(k, _)| *k, |(_, v)| *v, 3).output("out"), &steps, top_3)?;
        }

        /// Given its input (nothing reads it after), and lent it (a filter
        /// reads it after): the same as `top_k_by`.
        #[test]
        fn owned_equals_recomputation(steps in batches((0u8..3, 0u8..12))) {
            let given = |c: &mut crate::Circuit| {
                c.input::<(u8, u8)>("in").top_k_by_owned(|(k, _)| *k, |(_, v)| v, 3).output("out");
            };
            let lent = |c: &mut crate::Circuit| {
                let input = c.input::<(u8, u8)>("in");
                let top = input.top_k_by_owned(|(k, _)| *k, |(_, v)| v, 3);
                top.union(&input.filter(|_| false)).output("out");
            };
            for build in [given as fn(&mut crate::Circuit), lent] {
                check(build, &steps, top_3)?;
            }
        }
    }

    /// A snapshot of `top_k_by` restores into `top_k_by_owned` and the
    /// other way round: the same state under the same name.
    #[test]
    fn owned_reads_the_same_snapshots() {
        use crate::exchange::LocalExchange;
        use crate::operator::testing::{decode, events};
        use crate::{Circuit, CircuitInstance};
        let lending = |c: &mut Circuit| {
            c.input::<(u8, u8)>("in")
                .top_k_by(|(k, _)| *k, |(_, v)| *v, 1)
                .output("out");
        };
        let taking = |c: &mut Circuit| {
            c.input::<(u8, u8)>("in")
                .top_k_by_owned(|(k, _)| *k, |(_, v)| v, 1)
                .output("out");
        };
        for (from, into) in [
            (lending as fn(&mut Circuit), taking as fn(&mut Circuit)),
            (taking, lending),
        ] {
            let mut before = CircuitInstance::build(from).unwrap();
            before
                .step(
                    vec![events(&[((1u8, 5u8), 1i64), ((1, 7), 1)])],
                    &mut LocalExchange,
                )
                .unwrap();
            let pieces = before.snapshot().unwrap();
            let mut after = CircuitInstance::build(into).unwrap();
            after.restore(&pieces).unwrap();
            // Deleting the top value brings the one kept below it back.
            let out = after
                .step(vec![events(&[((1u8, 7u8), -1i64)])], &mut LocalExchange)
                .unwrap();
            let out: Vec<((u8, u8), i64)> = decode(&out[0]);
            assert_eq!(out, vec![((1, 5), 1), ((1, 7), -1)]);
        }
    }

    thread_local! {
        static CLONES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// A record that counts its clones.
    #[derive(Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
    struct Counted(u8, u8);

    impl Clone for Counted {
        fn clone(&self) -> Self {
            CLONES.with(|c| c.set(c.get() + 1));
            Counted(self.0, self.1)
        }
    }

    /// Clones made while `build`'s circuit steps through `steps`.
    fn clones(build: fn(&mut crate::Circuit), steps: &[Vec<((u8, u8), Weight)>]) -> usize {
        use crate::exchange::LocalExchange;
        use crate::operator::testing::events;
        let mut circuit = crate::CircuitInstance::build(build).unwrap();
        CLONES.with(|c| c.set(0));
        for step in steps {
            let step: Vec<(Counted, Weight)> = step
                .iter()
                .map(|((k, v), w)| (Counted(*k, *v), *w))
                .collect();
            circuit
                .step(vec![events(&step)], &mut LocalExchange)
                .unwrap();
        }
        CLONES.with(|c| c.get())
    }

    /// Given its input, `top_k_by_owned` clones no record for its value
    /// (`top_k_by` clones each one); lent it, it clones each as
    /// `top_k_by` does.
    #[test]
    fn owned_moves_what_it_is_given() {
        let steps = vec![
            vec![((1, 5), 1), ((1, 7), 1), ((2, 3), 1)],
            vec![((1, 7), -1), ((2, 4), 1)],
        ];
        let records = 5;
        let reading = |c: &mut crate::Circuit| {
            c.input::<Counted>("in")
                .top_k_by(|r| r.0, |r| r.clone(), 1)
                .output("out");
        };
        let taking = |c: &mut crate::Circuit| {
            c.input::<Counted>("in")
                .top_k_by_owned(|r| r.0, |r| r, 1)
                .output("out");
        };
        let reading_lent = |c: &mut crate::Circuit| {
            let input = c.input::<Counted>("in");
            let top = input.top_k_by(|r| r.0, |r| r.clone(), 1);
            top.output("out");
            input.filter(|_| false).output("none");
        };
        let taking_lent = |c: &mut crate::Circuit| {
            let input = c.input::<Counted>("in");
            let top = input.top_k_by_owned(|r| r.0, |r| r, 1);
            top.output("out");
            input.filter(|_| false).output("none");
        };
        assert_eq!(clones(reading, &steps), clones(taking, &steps) + records);
        assert_eq!(clones(reading_lent, &steps), clones(taking_lent, &steps));
    }
}
