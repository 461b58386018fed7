//! Keyed aggregates kept as running totals: `count_by`, `sum_by` and
//! `avg_by`, incremental under inserts and deletes in O(1) per changed key.
//! (Aggregates that need the whole group, such as `min_by`, live in
//! `group.rs`.)
//!
//! Each worker first combines its share of the step's delta per key, then
//! sends the per-key changes through the exchange to the key's owner, which
//! updates its state and emits, for every key whose result changed, a delete
//! of the old result and an insert of the new one.

use crate::circuit::{Data, Operator, StepContext, StepInput};
use crate::codec;
use crate::error::{Error, Result};
use crate::exchange::KeyedBatch;
use crate::state::Shards;
use crate::table::{Change, KeyedTable, Slot, encode_key};
use crate::types::OrdF64;
use crate::upgrade::Rekey;
use crate::zset::Weight;
use crate::{Stream, ZSet};
use serde::{Deserialize, Serialize};
use std::any::Any;
use std::collections::BTreeMap;
use std::marker::PhantomData;

/// Values `sum_by` can add up. Sums wrap on overflow (deterministically)
/// rather than trap.
pub trait Sum: Data + Default {
    /// Adds `value` times `weight` to `self`.
    fn add_weighted(&mut self, value: &Self, weight: Weight);
}

macro_rules! impl_sum {
    ($($t:ty),*) => {$(
        impl Sum for $t {
            fn add_weighted(&mut self, value: &Self, weight: Weight) {
                *self = self.wrapping_add(value.wrapping_mul(weight as $t));
            }
        }
    )*};
}
impl_sum!(i8, i16, i32, i64, i128, isize);

/// Several sums at once, slot by slot: one `sum_by` for a report's
/// counters, where each record adds 1 to the slots it counts in (its
/// `count(*) FILTER (…)`s and, after a `distinct`, its `count(DISTINCT …)`s).
///
/// ```
/// # use sluice_guest::{Circuit, CircuitInstance};
/// // Per region: orders, and orders over 100.
/// CircuitInstance::build(|c: &mut Circuit| {
///     c.input::<(String, i64)>("orders")
///         .sum_by(|(region, _)| region.clone(), |(_, amount)| [1i64, i64::from(*amount > 100)])
///         .output("order_counts");
/// }).unwrap();
/// ```
impl<S: Sum, const N: usize> Sum for [S; N]
where
    [S; N]: Data + Default,
{
    fn add_weighted(&mut self, value: &Self, weight: Weight) {
        for (sum, v) in self.iter_mut().zip(value) {
            sum.add_weighted(v, weight);
        }
    }
}

/// Per-key state: the multiplicity of the group and the weighted sum.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct Acc<S> {
    count: Weight,
    sum: S,
}

impl<S: Sum> Acc<S> {
    fn merge(&mut self, other: &Acc<S>) {
        self.count += other.count;
        self.sum.add_weighted(&other.sum, 1);
    }

    fn is_empty(&self) -> bool {
        self.count == 0 && self.sum == S::default()
    }

    /// `self − before`: what adds to `before` to make `self`.
    fn diff(&self, before: &Acc<S>) -> Acc<S> {
        let mut d = self.clone();
        d.count = d.count.wrapping_sub(before.count);
        d.sum.add_weighted(&before.sum, -1);
        d
    }

    /// Whether the group has records (a positive count).
    fn live(&self) -> bool {
        self.count > 0
    }
}

struct GroupSum<T, K, S, O, KF, VF, EF> {
    channel: u32,
    /// What its accumulators' sums hold: `count` (none: `count_by`) or
    /// `sum` (the values: `sum_by`, `avg_by`), part of its fingerprint.
    sums: &'static str,
    key: KF,
    value: VF,
    emit: EF,
    /// Accumulators by key encoding (see [`crate::table`]).
    state: KeyedTable<Acc<S>>,
    /// The step's combined changes before they cross the exchange (with
    /// more than one worker), kept to reuse its memory.
    local: KeyedTable<Acc<S>>,
    /// A key's encoding, reused.
    buf: Vec<u8>,
    /// Its migration from an earlier version's keys, if it has one.
    migration: Option<Box<dyn Rekey<K>>>,
    _type: PhantomData<fn(T) -> (K, O)>,
}

/// Keys of a step's combining table kept for the next step: a larger table
/// is dropped once sent.
const LOCAL_KEPT: usize = 1 << 14;

/// The operator's name in snapshots written before keyed tables: a piece
/// holding the sorted `(key, accumulator)` pairs of a shard.
const LEGACY_NAME: &str = "group_sum";

/// Adds `delta` to the state of `key`, remembering the key's first touch
/// in this step and its accumulator before it.
fn apply<S: Sum>(
    state: &mut KeyedTable<Acc<S>>,
    touched: &mut Vec<(Slot, Acc<S>)>,
    key: &[u8],
    delta: &Acc<S>,
) -> Result<()> {
    let (slot, first, acc) = state.touch(key)?;
    if first {
        touched.push((slot, acc.clone()));
    }
    acc.merge(delta);
    Ok(())
}

impl<T, K, S, O, KF, VF, EF> Operator for GroupSum<T, K, S, O, KF, VF, EF>
where
    T: Data,
    K: Data,
    S: Sum,
    O: Data,
    KF: Fn(&T) -> K + 'static,
    VF: Fn(&T) -> S + 'static,
    EF: Fn(&Acc<S>) -> O + 'static,
{
    fn name(&self) -> &'static str {
        "keyed_sum"
    }

    fn state_types(&self) -> String {
        format!("{}: {}", self.sums, crate::identity::types2::<K, S>())
    }

    fn reads(&self, name: &str) -> bool {
        name == self.name() || name == LEGACY_NAME
    }

    fn eval(&mut self, cx: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>> {
        self.eval_owned(cx, vec![StepInput::Shared(inputs[0])])
    }

    fn eval_owned(
        &mut self,
        cx: &mut StepContext<'_>,
        mut inputs: Vec<StepInput<'_>>,
    ) -> Result<Box<dyn Any>> {
        self.state.begin_step();
        let mut touched: Vec<(Slot, Acc<S>)> = Vec::new();
        let input = inputs.pop().expect("group_sum has one input");
        let records = input.zset::<T>();
        if cx.exchange.workers() == 1 {
            // Nothing moves: apply each record where it is.
            for (record, weight) in records {
                encode_key(&(self.key)(record), &mut self.buf)?;
                let mut delta = Acc {
                    count: *weight,
                    sum: S::default(),
                };
                delta.sum.add_weighted(&(self.value)(record), *weight);
                apply(&mut self.state, &mut touched, &self.buf, &delta)?;
            }
            // Freed (if given) before the output is built.
            drop(input);
        } else {
            // Combine this worker's share per key before it crosses the
            // exchange; the key's encoding is what the exchange routes by.
            self.local.clear();
            for (record, weight) in records {
                encode_key(&(self.key)(record), &mut self.buf)?;
                let acc = self.local.touch(&self.buf)?.2;
                acc.count += weight;
                acc.sum.add_weighted(&(self.value)(record), *weight);
            }
            // The records are combined: freed (if given) before the
            // exchange brings the other workers' changes.
            drop(input);
            let mut send = KeyedBatch::new();
            for (key, acc) in self.local.iter() {
                if !acc.is_empty() {
                    send.push_with(
                        |out| {
                            out.extend_from_slice(key);
                            Ok(())
                        },
                        1,
                        |out| codec::write_bytes(out, acc),
                    )?;
                }
            }
            if self.local.len() > LOCAL_KEPT {
                // A large step's table is not kept for the next: its memory
                // goes to the state, which grows next.
                self.local = KeyedTable::new(false);
            }
            let received = cx.exchange.shuffle(self.channel, send)?;
            for (key, value, _) in received.iter() {
                let delta: Acc<S> = codec::from_bytes(value).map_err(|m| {
                    Error::Failed(format!("exchange: undecodable accumulator: {m}"))
                })?;
                apply(&mut self.state, &mut touched, key, &delta)?;
            }
        }

        // Emit, for every key whose result changed, the old and new result
        // (one record for a key that is new or gone, two for a change).
        let mut out: ZSet<(K, O)> = Vec::with_capacity(touched.len());
        let mut emptied = Vec::new();
        for (slot, old) in touched {
            let (key, acc) = self.state.get(slot);
            let old = old.live().then(|| (self.emit)(&old));
            let new = acc.live().then(|| (self.emit)(acc));
            if acc.is_empty() {
                emptied.push(slot);
            }
            if old != new {
                let key: K = codec::from_bytes(key)
                    .map_err(|m| Error::Failed(format!("{}: undecodable key: {m}", self.name())))?;
                match (old, new) {
                    (Some(old), Some(new)) => {
                        out.push(((key.clone(), old), -1));
                        out.push(((key, new), 1));
                    }
                    (Some(old), None) => out.push(((key, old), -1)),
                    (None, Some(new)) => out.push(((key, new), 1)),
                    (None, None) => {}
                }
            }
        }
        emptied.sort_unstable();
        self.state.remove_sorted(&emptied);
        Ok(Box::new(out))
    }

    fn stateful(&self) -> bool {
        true
    }

    fn snapshot(&self, only: Option<&Shards>) -> Result<BTreeMap<u32, Vec<u8>>> {
        Ok(self.state.snapshot(only)?.into_iter().collect())
    }

    fn restore(&mut self, name: &str, shard: u32, piece: &[u8]) -> Result<()> {
        let merge = |mine: &mut Acc<S>, other: &Acc<S>| mine.merge(other);
        if name == LEGACY_NAME {
            let entries: Vec<(K, Acc<S>)> = codec::from_state(name, piece)?;
            for (key, acc) in entries {
                encode_key(&key, &mut self.buf)?;
                self.state
                    .restore_entry(&self.buf, &acc, merge, Acc::is_empty)?;
            }
            return Ok(());
        }
        self.state
            .restore(self.name(), shard, piece, merge, Acc::is_empty)
    }

    fn forget(&mut self, shards: &Shards) {
        self.state.forget(shards);
    }

    fn dirty(&self) -> Shards {
        self.state.dirty().clone()
    }

    fn delta(&self, shard: u32) -> Result<Change> {
        self.state.delta(shard, Acc::diff, Acc::is_empty)
    }

    fn clean(&mut self, whole: &Shards) {
        self.state.clean(whole);
    }

    fn set_migration(&mut self, migration: Box<dyn Any>) -> std::result::Result<(), String> {
        let migration = migration
            .downcast::<Box<dyn Rekey<K>>>()
            .map_err(|_| format!("the keys of this {} are not of that type", self.name()))?;
        if self.migration.is_some() {
            return Err(format!("this {} has a migration already", self.name()));
        }
        self.migration = Some(*migration);
        Ok(())
    }

    fn migrates_from(&self) -> Vec<u64> {
        self.migration
            .iter()
            .map(|m| {
                let types = format!(
                    "{}: {}, {}",
                    self.sums,
                    m.old_key_type(),
                    std::any::type_name::<S>()
                );
                let types = crate::identity::versioned(types, m.old_version());
                crate::identity::fingerprint(self.name(), &types)
            })
            .collect()
    }

    fn migrate(&mut self, fingerprint: u64, _shard: u32, piece: &[u8]) -> Result<()> {
        let name = self.name();
        let Some(migration) = self.migration.as_ref() else {
            return Err(Error::IncompatibleSnapshot(format!(
                "no migration from state fingerprint {fingerprint:016x}"
            )));
        };
        let merge = |mine: &mut Acc<S>, other: &Acc<S>| mine.merge(other);
        let rekey = |old: &[u8], new: &mut Vec<u8>| encode_key(&migration.rekey(old)?, new);
        self.state
            .restore_rekeyed(name, piece, rekey, merge, Acc::is_empty)
    }
}

impl<T: Data> Stream<T> {
    /// Counts records per key: emits `(key, count)` for every key with a
    /// positive count. When a count changes, the old pair is deleted and the
    /// new one inserted; a key whose count drops to zero is only deleted.
    /// Re-shards by key through the exchange.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<String>("words").count_by(|w| w.clone()).output("counts");
    /// }).unwrap();
    /// ```
    pub fn count_by<K: Data>(&self, key: impl Fn(&T) -> K + 'static) -> Stream<(K, i64)> {
        self.group_sum("count", key, |_| 0i64, |acc: &Acc<i64>| acc.count)
    }

    /// Sums `value` of the records per key (each record counted with its
    /// weight): emits `(key, sum)` for every key that has records, with the
    /// same delete-old/insert-new convention as [`count_by`](Self::count_by).
    /// Re-shards by key through the exchange.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<(String, i64)>("sales").sum_by(|(region, _)| region.clone(), |(_, n)| *n)
    ///         .output("revenue");
    /// }).unwrap();
    /// ```
    pub fn sum_by<K: Data, S: Sum>(
        &self,
        key: impl Fn(&T) -> K + 'static,
        value: impl Fn(&T) -> S + 'static,
    ) -> Stream<(K, S)> {
        self.group_sum("sum", key, value, |acc: &Acc<S>| acc.sum.clone())
    }

    /// Averages `value` of the records per key (each record counted with its
    /// weight): emits `(key, average)` for every key that has records, with
    /// the delete-old/insert-new convention of [`count_by`](Self::count_by).
    /// Re-shards by key through the exchange.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<(String, i64)>("bids").avg_by(|(item, _)| item.clone(), |(_, price)| *price)
    ///         .output("average_price");
    /// }).unwrap();
    /// ```
    pub fn avg_by<K: Data>(
        &self,
        key: impl Fn(&T) -> K + 'static,
        value: impl Fn(&T) -> i64 + 'static,
    ) -> Stream<(K, OrdF64)> {
        self.group_sum("sum", key, value, |acc: &Acc<i64>| {
            OrdF64(acc.sum as f64 / acc.count as f64)
        })
    }

    fn group_sum<K: Data, S: Sum, O: Data>(
        &self,
        sums: &'static str,
        key: impl Fn(&T) -> K + 'static,
        value: impl Fn(&T) -> S + 'static,
        emit: impl Fn(&Acc<S>) -> O + 'static,
    ) -> Stream<(K, O)> {
        let channel = self.next_channel();
        self.unary(GroupSum {
            channel,
            sums,
            key,
            value,
            emit,
            state: KeyedTable::new(true),
            local: KeyedTable::new(false),
            buf: Vec::new(),
            migration: None,
            _type: PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::exchange::LocalExchange;
    use crate::operator::testing::{decode, events, run_steps};
    use crate::zset::integrate;
    use crate::{Circuit, CircuitInstance};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn counts(c: &mut Circuit) {
        c.input::<u8>("in").count_by(|x| x % 5).output("out");
    }

    #[test]
    fn count_changes_delete_old_and_insert_new() {
        let out: Vec<Vec<((u8, i64), i64)>> = run_steps(
            counts,
            &[
                vec![(1, 1), (6, 1)],
                vec![(11, 1)],
                vec![(1, -1), (6, -1), (11, -1)],
            ],
        );
        assert_eq!(
            out,
            vec![
                vec![((1, 2), 1)],
                vec![((1, 2), -1), ((1, 3), 1)],
                vec![((1, 3), -1)],
            ]
        );
    }

    /// The from-scratch answer: count the integrated input.
    fn recount(input: &BTreeMap<u8, i64>) -> BTreeMap<(u8, i64), i64> {
        let mut per_key: BTreeMap<u8, i64> = BTreeMap::new();
        for (x, w) in input {
            *per_key.entry(x % 5).or_default() += w;
        }
        per_key
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|kv| (kv, 1))
            .collect()
    }

    fn batches() -> impl Strategy<Value = Vec<Vec<(u8, i64)>>> {
        proptest::collection::vec(
            proptest::collection::vec((0u8..20, -2i64..=2), 0..12),
            1..10,
        )
    }

    proptest! {
        #[test]
        fn incremental_count_equals_recount(steps in batches()) {
            let mut c = CircuitInstance::build(counts).unwrap();
            let (mut input, mut output) = (BTreeMap::new(), BTreeMap::new());
            for step in &steps {
                integrate(&mut input, step);
                let out = c.step(vec![events(step)], &mut LocalExchange).unwrap();
                integrate(&mut output, &decode::<(u8, i64)>(&out[0]));
                prop_assert_eq!(&output, &recount(&input));
            }
        }

        #[test]
        fn snapshot_restore_continue_equals_uninterrupted(steps in batches(), cut in 0usize..10) {
            let cut = cut.min(steps.len());
            let mut a = CircuitInstance::build(counts).unwrap();
            let mut b = CircuitInstance::build(counts).unwrap();
            for step in &steps[..cut] {
                a.step(vec![events(step)], &mut LocalExchange).unwrap();
                b.step(vec![events(step)], &mut LocalExchange).unwrap();
            }
            let mut restored = CircuitInstance::build(counts).unwrap();
            restored.restore(&b.snapshot().unwrap()).unwrap();
            for step in &steps[cut..] {
                let x = a.step(vec![events(step)], &mut LocalExchange).unwrap();
                let y = restored.step(vec![events(step)], &mut LocalExchange).unwrap();
                prop_assert_eq!(x, y);
            }
        }
    }

    fn per_key<V: Copy>(input: &BTreeMap<(u8, V), i64>) -> BTreeMap<u8, Vec<(V, i64)>> {
        let mut g: BTreeMap<u8, Vec<(V, i64)>> = BTreeMap::new();
        for ((k, v), w) in input {
            g.entry(*k).or_default().push((*v, *w));
        }
        g
    }

    proptest! {
        #[test]
        fn count_sum_avg_equal_recomputation_on_many_workers(steps in crate::operator::testing::batches((0u8..5, -20i64..20))) {
            use crate::operator::testing::{check, zset};
            use crate::OrdF64;
            check(|c| c.input::<(u8, i64)>("in").count_by(|(k, _)| *k).output("out"), &steps, |input| {
                zset(per_key(input).into_iter().filter_map(|(k, vs)| {
                    let n: i64 = vs.iter().map(|(_, w)| w).sum();
                    (n > 0).then_some(((k, n), 1))
                }))
            })?;
            check(|c| c.input::<(u8, i64)>("in").sum_by(|(k, _)| *k, |(_, v)| *v).output("out"), &steps, |input| {
                zset(per_key(input).into_iter().filter_map(|(k, vs)| {
                    let n: i64 = vs.iter().map(|(_, w)| w).sum();
                    let s: i64 = vs.iter().map(|(v, w)| v * w).sum();
                    (n > 0).then_some(((k, s), 1))
                }))
            })?;
            check(|c| c.input::<(u8, i64)>("in").sum_by(|(k, _)| *k, |(_, v)| [1, *v, v * v]).output("out"), &steps, |input| {
                zset(per_key(input).into_iter().filter_map(|(k, vs)| {
                    let n: i64 = vs.iter().map(|(_, w)| w).sum();
                    let slot = |f: fn(i64) -> i64| vs.iter().map(|(v, w)| f(*v) * w).sum::<i64>();
                    (n > 0).then_some(((k, [slot(|_| 1), slot(|v| v), slot(|v| v * v)]), 1))
                }))
            })?;
            check(|c| c.input::<(u8, i64)>("in").avg_by(|(k, _)| *k, |(_, v)| *v).output("out"), &steps, |input| {
                zset(per_key(input).into_iter().filter_map(|(k, vs)| {
                    let n: i64 = vs.iter().map(|(_, w)| w).sum();
                    let s: i64 = vs.iter().map(|(v, w)| v * w).sum();
                    (n > 0).then_some(((k, OrdF64(s as f64 / n as f64)), 1))
                }))
            })?;
        }
    }

    #[test]
    fn sum_by_tracks_sums_under_retraction() {
        let out: Vec<Vec<((String, i64), i64)>> = run_steps(
            |c| {
                c.input::<(String, i64)>("in")
                    .sum_by(|(k, _)| k.clone(), |(_, v)| *v)
                    .output("out")
            },
            &[
                vec![(("a".to_owned(), 5), 1), (("a".to_owned(), 3), 1)],
                vec![(("a".to_owned(), 5), -1)],
            ],
        );
        assert_eq!(
            out,
            // Output is consolidated, so sorted by record.
            vec![
                vec![(("a".into(), 8), 1)],
                vec![(("a".into(), 3), 1), (("a".into(), 8), -1)]
            ]
        );
    }

    #[test]
    fn exported_shards_leave_with_their_state_and_come_back_whole() {
        let mut a = CircuitInstance::build(counts).unwrap();
        let input: Vec<(u8, i64)> = (0..200u8).map(|i| (i, 1)).collect();
        a.step(vec![events(&input)], &mut LocalExchange).unwrap();
        let before = a.snapshot().unwrap();
        assert!(before.len() > 1, "keys spread over several shards");
        let moving: Vec<u32> = before.iter().map(|(s, _)| *s).step_by(2).collect();
        let exported = a.export_shards(&moving).unwrap();
        assert_eq!(
            exported,
            before
                .iter()
                .filter(|(s, _)| moving.contains(s))
                .cloned()
                .collect::<Vec<_>>()
        );
        let after = a.snapshot().unwrap();
        assert!(after.iter().all(|(s, _)| !moving.contains(s)));
        // Another instance takes them; putting them back gives the original.
        let mut b = CircuitInstance::build(counts).unwrap();
        b.restore(&exported).unwrap();
        assert_eq!(b.snapshot().unwrap(), exported);
        a.restore(&exported).unwrap();
        assert_eq!(a.snapshot().unwrap(), before);
    }

    #[test]
    fn a_snapshot_of_the_format_before_shards_still_restores() {
        use crate::codec;
        // What the SDK wrote before states were split by shard: one
        // envelope (format 1) per worker, each operator's whole state.
        let mut state: BTreeMap<u8, super::Acc<i64>> = BTreeMap::new();
        state.insert(1, super::Acc { count: 2, sum: 0 });
        state.insert(3, super::Acc { count: 1, sum: 0 });
        let op = codec::to_bytes(&state).unwrap();
        let old = codec::to_bytes(&(
            1u32,
            1u32,
            vec![(1u32, "group_sum", serde_bytes::Bytes::new(&op))],
        ))
        .unwrap();
        let mut c = CircuitInstance::build(counts).unwrap();
        c.restore(&[(crate::state::WHOLE, old.clone())]).unwrap();
        let out = c
            .step(vec![events(&[(1u8, 1)])], &mut LocalExchange)
            .unwrap();
        assert_eq!(
            decode::<(u8, i64)>(&out[0]),
            vec![((1, 2), -1), ((1, 3), 1)],
            "the count of key 1 went on from the old snapshot"
        );
        // Its pieces now follow the new format.
        assert!(c.snapshot().unwrap().iter().all(|(s, _)| *s < 1024));
        // An old envelope is only ever a whole state.
        assert!(c.restore(&[(7, old)]).is_err());
    }

    #[test]
    fn restore_refuses_other_shapes_and_versions() {
        let mut a = CircuitInstance::build(counts).unwrap();
        a.step(vec![events(&[(1u8, 1)])], &mut LocalExchange)
            .unwrap();
        let snap = a.snapshot().unwrap();

        let mut stateless = CircuitInstance::build(|c: &mut Circuit| {
            c.input::<u8>("in").output("out");
        })
        .unwrap();
        assert!(
            stateless
                .restore(&snap)
                .unwrap_err()
                .to_string()
                .contains("`keyed_sum#0/1` (keyed_sum) in the snapshot is not in the circuit")
        );

        let mut v2 = CircuitInstance::build(|c: &mut Circuit| {
            c.snapshot_version(2);
            counts(c);
        })
        .unwrap();
        assert!(
            v2.restore(&snap)
                .unwrap_err()
                .to_string()
                .contains("snapshot version 1")
        );
        assert!(a.restore(&[(0, b"garbage".to_vec())]).is_err());
    }
}
