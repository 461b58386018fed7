//! The keyed group operator behind `min_by`, `max_by`, `fold_by`,
//! `top_k_by`, `top_k_by_owned` and `session_by`: it keeps each key's
//! records as an integrated multiset and, for every key a step touches,
//! recomputes the key's output from the multiset before and after the
//! change and emits the difference. Exact under any mix of inserts and
//! deletes (min and max keep the whole multiset), at O(group size) per
//! touched key.

use crate::circuit::{Data, Operator, StepContext, StepInput};
use crate::error::Result;
use crate::exchange::shuffle_keyed;
use crate::state::{self, Shards};
use crate::zset::{Weight, consolidate};
use crate::{Stream, ZSet, codec};
use serde::Serialize;
use std::any::Any;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::marker::PhantomData;

/// Integrated multisets per key.
pub(crate) type Groups<K, V> = BTreeMap<K, Multiset<V>>;

/// One key's integrated multiset: each value with its weight, in value
/// order, none with weight 0. Most keys of a join hold one value (an
/// auction by its id, a bid by its window and price), kept inline: a
/// `BTreeMap` of one entry is a node of eleven slots on the heap (q7 kept
/// 600 bytes a bid that way). A second value makes it a map, and a map
/// left with one value becomes inline again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Multiset<V> {
    /// One value, with a weight that is not 0.
    One(V, Weight),
    /// Two values or more (or none, only while being changed).
    Many(BTreeMap<V, Weight>),
}

impl<V: Ord> Multiset<V> {
    /// The values and their weights, in value order.
    pub(crate) fn iter(&self) -> Iter<'_, V> {
        match self {
            Multiset::One(v, w) => Iter::One(Some((v, w))),
            Multiset::Many(map) => Iter::Many(map.iter()),
        }
    }

    /// Adds `weight` copies of `value`; returns whether the multiset is
    /// empty after.
    fn add(&mut self, value: V, weight: Weight) -> bool {
        match self {
            Multiset::One(v, w) if *v == value => {
                *w += weight;
                return *w == 0;
            }
            Multiset::One(..) if weight == 0 => return false,
            Multiset::One(..) => {
                let old = std::mem::replace(self, Multiset::Many(BTreeMap::new()));
                if let (Multiset::One(v, w), Multiset::Many(map)) = (old, &mut *self) {
                    map.insert(v, w);
                    map.insert(value, weight);
                }
            }
            Multiset::Many(map) => {
                // The value is moved in, not cloned: it can be a whole
                // record (q9's and q18's bids).
                match map.entry(value) {
                    Entry::Occupied(mut w) => {
                        *w.get_mut() += weight;
                        if *w.get() == 0 {
                            w.remove();
                        }
                    }
                    Entry::Vacant(slot) => {
                        if weight != 0 {
                            slot.insert(weight);
                        }
                    }
                }
                if map.len() == 1
                    && let Some((v, w)) = map.pop_first()
                {
                    *self = Multiset::One(v, w);
                }
            }
        }
        matches!(self, Multiset::Many(map) if map.is_empty())
    }
}

impl<V: Ord> FromIterator<(V, Weight)> for Multiset<V> {
    /// The multiset of `pairs` (each value once, weights not 0).
    fn from_iter<I: IntoIterator<Item = (V, Weight)>>(pairs: I) -> Self {
        let mut map: BTreeMap<V, Weight> = pairs.into_iter().collect();
        match (map.len(), map.pop_first()) {
            (1, Some((v, w))) => Multiset::One(v, w),
            (_, first) => {
                map.extend(first);
                Multiset::Many(map)
            }
        }
    }
}

impl<'a, V: Ord> IntoIterator for &'a Multiset<V> {
    type Item = (&'a V, &'a Weight);
    type IntoIter = Iter<'a, V>;

    fn into_iter(self) -> Iter<'a, V> {
        self.iter()
    }
}

/// Encoded as the `BTreeMap` of its values was (a map: how many, then
/// each value and weight), so snapshots read either way.
impl<V: Serialize + Ord> Serialize for Multiset<V> {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

/// An iterator over a [`Multiset`]'s values and weights, in value order
/// (either way).
pub(crate) enum Iter<'a, V> {
    /// A [`Multiset::One`]'s value, until taken (from either end).
    One(Option<(&'a V, &'a Weight)>),
    /// A [`Multiset::Many`]'s map's iterator.
    Many(std::collections::btree_map::Iter<'a, V, Weight>),
}

impl<'a, V> Iterator for Iter<'a, V> {
    type Item = (&'a V, &'a Weight);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Iter::One(one) => one.take(),
            Iter::Many(many) => many.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            Iter::One(one) => (usize::from(one.is_some()), Some(usize::from(one.is_some()))),
            Iter::Many(many) => many.size_hint(),
        }
    }
}

impl<V> DoubleEndedIterator for Iter<'_, V> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            Iter::One(one) => one.take(),
            Iter::Many(many) => many.next_back(),
        }
    }
}

/// Adds `weight` copies of `value` to `key`'s group, dropping empty groups.
/// The key is cloned only for a new group.
pub(crate) fn apply<K: Data, V: Data>(
    groups: &mut Groups<K, V>,
    key: &K,
    value: V,
    weight: Weight,
) {
    match groups.get_mut(key) {
        Some(group) => {
            if group.add(value, weight) {
                groups.remove(key);
            }
        }
        None => {
            if weight != 0 {
                groups.insert(key.clone(), Multiset::One(value, weight));
            }
        }
    }
}

/// Adds a piece of groups (the encoding of some of their entries, as
/// [`state::split`] writes it) to `groups`.
pub(crate) fn restore_groups<K: Data, V: Data>(
    groups: &mut Groups<K, V>,
    name: &str,
    piece: &[u8],
) -> Result<()> {
    let entries: Vec<(K, Vec<(V, Weight)>)> = codec::from_state(name, piece)?;
    if groups.is_empty() {
        *groups = entries
            .into_iter()
            .map(|(k, g)| {
                let group: Multiset<V> = g.into_iter().filter(|(_, w)| *w != 0).collect();
                (k, group)
            })
            .filter(|(_, g)| g.iter().next().is_some())
            .collect();
        return Ok(());
    }
    for (k, g) in entries {
        for (v, w) in g {
            apply(groups, &k, v, w);
        }
    }
    Ok(())
}

/// How a group operator takes a record's value: from a record it is lent,
/// or from one it is given.
pub(crate) trait ValueOf<T, V>: 'static {
    /// The value of a record another operator reads after this one.
    fn lent(&self, record: &T) -> V;
    /// The value of a record this operator is the last to read.
    fn given(&self, record: T) -> V;
}

/// A value function that reads the record (`min_by`, `top_k_by`, ...).
pub(crate) struct Reading<F>(pub(crate) F);

impl<T, V, F: Fn(&T) -> V + 'static> ValueOf<T, V> for Reading<F> {
    fn lent(&self, record: &T) -> V {
        (self.0)(record)
    }
    fn given(&self, record: T) -> V {
        (self.0)(&record)
    }
}

/// A value function that takes the record (`top_k_by_owned`): a record it
/// is given moves into it, a record it is lent is cloned for it.
pub(crate) struct Taking<F>(pub(crate) F);

impl<T: Clone, V, F: Fn(T) -> V + 'static> ValueOf<T, V> for Taking<F> {
    fn lent(&self, record: &T) -> V {
        (self.0)(record.clone())
    }
    fn given(&self, record: T) -> V {
        (self.0)(record)
    }
}

struct Group<T, K, V, O, KF, VF, F> {
    name: &'static str,
    channel: u32,
    key: KF,
    value: VF,
    reduce: F,
    groups: Groups<K, V>,
    _types: PhantomData<fn(T) -> O>,
}

impl<T, K, V, O, KF, VF, F> Operator for Group<T, K, V, O, KF, VF, F>
where
    T: Data,
    K: Data,
    V: Data,
    O: Data,
    KF: Fn(&T) -> K + 'static,
    VF: ValueOf<T, V>,
    F: Fn(&K, &Multiset<V>) -> Vec<(O, Weight)> + 'static,
{
    fn name(&self) -> &'static str {
        self.name
    }

    fn state_types(&self) -> String {
        crate::identity::types2::<K, V>()
    }

    fn eval(&mut self, cx: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>> {
        self.eval_owned(cx, vec![StepInput::Shared(inputs[0])])
    }

    fn eval_owned(
        &mut self,
        cx: &mut StepContext<'_>,
        mut inputs: Vec<StepInput<'_>>,
    ) -> Result<Box<dyn Any>> {
        // Given its input, it hands each record to the value function.
        let mut local: ZSet<(K, V)> = inputs.pop().expect("a group has one input").map_records(
            |(t, w)| {
                let k = (self.key)(&t);
                ((k, self.value.given(t)), w)
            },
            |(t, w)| (((self.key)(t), self.value.lent(t)), *w),
        );
        consolidate(&mut local);
        let received = shuffle_keyed(cx.exchange, self.channel, local)?;
        let mut by_key: BTreeMap<K, Vec<(V, Weight)>> = BTreeMap::new();
        for ((k, v), w) in received {
            by_key.entry(k).or_default().push((v, w));
        }
        let mut out: ZSet<(K, O)> = Vec::new();
        for (key, changes) in by_key {
            if let Some(group) = self.groups.get(&key) {
                out.extend(
                    (self.reduce)(&key, group)
                        .into_iter()
                        .map(|(o, w)| ((key.clone(), o), -w)),
                );
            }
            for (v, w) in changes {
                apply(&mut self.groups, &key, v, w);
            }
            if let Some(group) = self.groups.get(&key) {
                out.extend(
                    (self.reduce)(&key, group)
                        .into_iter()
                        .map(|(o, w)| ((key.clone(), o), w)),
                );
            }
        }
        consolidate(&mut out);
        Ok(Box::new(out))
    }

    fn stateful(&self) -> bool {
        true
    }

    fn snapshot(&self, only: Option<&Shards>) -> Result<BTreeMap<u32, Vec<u8>>> {
        state::split(&self.groups, only)
    }

    fn restore(&mut self, _name: &str, _shard: u32, piece: &[u8]) -> Result<()> {
        restore_groups(&mut self.groups, self.name, piece)
    }

    fn forget(&mut self, shards: &Shards) {
        state::forget(&mut self.groups, shards);
    }
}

impl<T: Data> Stream<T> {
    /// Groups records by `key`, keeps each group's `value`s as a multiset, and
    /// emits `(key, o)` for every `(o, weight)` that `reduce` returns for the
    /// group (called only for non-empty groups, whenever they change).
    pub(crate) fn group_reduce<K: Data, V: Data, O: Data>(
        &self,
        name: &'static str,
        key: impl Fn(&T) -> K + 'static,
        value: impl Fn(&T) -> V + 'static,
        reduce: impl Fn(&K, &Multiset<V>) -> Vec<(O, Weight)> + 'static,
    ) -> Stream<(K, O)> {
        self.group_with(name, key, Reading(value), reduce)
    }

    /// [`group_reduce`](Self::group_reduce) with `value` taking each record
    /// (moved when this operator is the stream's last reader, cloned
    /// otherwise). The state, and so its fingerprint, is the same.
    pub(crate) fn group_reduce_owned<K: Data, V: Data, O: Data>(
        &self,
        name: &'static str,
        key: impl Fn(&T) -> K + 'static,
        value: impl Fn(T) -> V + 'static,
        reduce: impl Fn(&K, &Multiset<V>) -> Vec<(O, Weight)> + 'static,
    ) -> Stream<(K, O)> {
        self.group_with(name, key, Taking(value), reduce)
    }

    fn group_with<K: Data, V: Data, O: Data>(
        &self,
        name: &'static str,
        key: impl Fn(&T) -> K + 'static,
        value: impl ValueOf<T, V>,
        reduce: impl Fn(&K, &Multiset<V>) -> Vec<(O, Weight)> + 'static,
    ) -> Stream<(K, O)> {
        let channel = self.next_channel();
        self.unary(Group {
            name,
            channel,
            key,
            value,
            reduce,
            groups: BTreeMap::new(),
            _types: PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{Groups, Multiset, apply};
    use crate::codec;
    use crate::zset::Weight;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// Groups changed value by value hold what maps of maps would (the
        /// model), each group inline exactly when it has one value, and
        /// encode as the maps of maps did (snapshots read either way).
        #[test]
        fn groups_equal_maps_of_maps(changes in prop::collection::vec((0u8..4, 0u8..4, -2i64..3), 0..60)) {
            let mut groups: Groups<u8, u8> = BTreeMap::new();
            let mut model: BTreeMap<u8, BTreeMap<u8, Weight>> = BTreeMap::new();
            for (k, v, w) in changes {
                apply(&mut groups, &k, v, w);
                let group = model.entry(k).or_default();
                *group.entry(v).or_default() += w;
                group.retain(|_, w| *w != 0);
                model.retain(|_, g| !g.is_empty());
                let seen: BTreeMap<u8, BTreeMap<u8, Weight>> = groups
                    .iter()
                    .map(|(k, g)| (*k, g.iter().map(|(v, w)| (*v, *w)).collect()))
                    .collect();
                prop_assert_eq!(&seen, &model);
                for g in groups.values() {
                    prop_assert_eq!(matches!(g, Multiset::One(..)), g.iter().count() == 1);
                    prop_assert_eq!(g.iter().rev().count(), g.iter().count());
                }
                prop_assert_eq!(codec::to_bytes(&groups).unwrap(), codec::to_bytes(&model).unwrap());
            }
        }
    }

    proptest! {
        /// Pieces in the maps' encoding restore into empty groups and merge
        /// into groups already there, as the maps did: the same contents,
        /// no zero weights or empty groups, inline exactly with one value.
        #[test]
        fn pieces_restore_as_maps_of_maps(
            there in prop::collection::vec((0u8..4, 0u8..4, -2i64..3), 0..20),
            piece in prop::collection::btree_map(0u8..4, prop::collection::btree_map(0u8..4, -2i64..3, 0..3), 0..4),
        ) {
            let mut model: BTreeMap<u8, BTreeMap<u8, Weight>> = BTreeMap::new();
            for (k, v, w) in &there {
                *model.entry(*k).or_default().entry(*v).or_default() += w;
            }
            let encoded = codec::to_bytes(&piece).unwrap();
            for start_empty in [true, false] {
                let mut groups: Groups<u8, u8> = BTreeMap::new();
                let mut expected: BTreeMap<u8, BTreeMap<u8, Weight>> = BTreeMap::new();
                if !start_empty {
                    for (k, v, w) in &there {
                        apply(&mut groups, k, *v, *w);
                    }
                    expected = model.clone();
                }
                super::restore_groups(&mut groups, "test", &encoded).unwrap();
                for (k, g) in &piece {
                    for (v, w) in g {
                        *expected.entry(*k).or_default().entry(*v).or_default() += w;
                    }
                }
                for g in expected.values_mut() {
                    g.retain(|_, w| *w != 0);
                }
                expected.retain(|_, g| !g.is_empty());
                let seen: BTreeMap<u8, BTreeMap<u8, Weight>> = groups
                    .iter()
                    .map(|(k, g)| (*k, g.iter().map(|(v, w)| (*v, *w)).collect()))
                    .collect();
                prop_assert_eq!(&seen, &expected, "restored into empty groups: {}", start_empty);
                for g in groups.values() {
                    prop_assert_eq!(matches!(g, Multiset::One(..)), g.iter().count() == 1);
                }
            }
        }
    }

    #[test]
    fn a_multiset_from_pairs_is_inline_with_one_value() {
        let one: Multiset<u8> = [(3, 2)].into_iter().collect();
        assert_eq!(one, Multiset::One(3, 2));
        let two: Multiset<u8> = [(3, 2), (1, -1)].into_iter().collect();
        assert_eq!(two, Multiset::Many(BTreeMap::from([(1, -1), (3, 2)])));
        assert_eq!(two.iter().next_back(), Some((&3, &2)));
    }
}
