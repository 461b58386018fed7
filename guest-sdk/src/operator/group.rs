//! The keyed group operator behind `min_by`, `max_by`, `fold_by` and
//! `top_k_by`: it keeps each key's records as an integrated multiset and,
//! for every key a step touches, recomputes the key's output from the
//! multiset before and after the change and emits the difference. Exact
//! under any mix of inserts and deletes (min and max keep the whole
//! multiset), at O(group size) per touched key.

use crate::circuit::{Data, Operator, StepContext, input};
use crate::error::Result;
use crate::exchange::shuffle_keyed;
use crate::state::{self, Shards};
use crate::zset::{Weight, consolidate};
use crate::{Stream, ZSet, codec};
use std::any::Any;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::marker::PhantomData;

/// Integrated multisets per key.
pub(crate) type Groups<K, V> = BTreeMap<K, BTreeMap<V, Weight>>;

/// Adds `weight` copies of `value` to `key`'s group, dropping empty entries.
pub(crate) fn apply<K: Data, V: Data>(
    groups: &mut Groups<K, V>,
    key: &K,
    value: V,
    weight: Weight,
) {
    let group = groups.entry(key.clone()).or_default();
    // The value is moved in, not cloned: it can be a whole record (q9's
    // and q18's bids).
    match group.entry(value) {
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
    if group.is_empty() {
        groups.remove(key);
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
            .map(|(k, g)| (k, g.into_iter().collect()))
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
    VF: Fn(&T) -> V + 'static,
    F: Fn(&K, &BTreeMap<V, Weight>) -> Vec<(O, Weight)> + 'static,
{
    fn name(&self) -> &'static str {
        self.name
    }

    fn state_types(&self) -> String {
        crate::identity::types2::<K, V>()
    }

    fn eval(&mut self, cx: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>> {
        let mut local: ZSet<(K, V)> = input::<T>(inputs, 0)
            .iter()
            .map(|(t, w)| (((self.key)(t), (self.value)(t)), *w))
            .collect();
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
        reduce: impl Fn(&K, &BTreeMap<V, Weight>) -> Vec<(O, Weight)> + 'static,
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
