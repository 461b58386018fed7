//! Joins on keys, incremental: `join` (inner) and `left_join` (left outer).
//!
//! Both inputs are indexed streams `(key, value)` (see
//! [`key_by`](crate::Stream::key_by)), re-sharded by key so that both sides
//! of a key meet on one worker. The inner join applies
//! Δ(A⋈B) = ΔA⋈B + A⋈ΔB + ΔA⋈ΔB at the cost of the changes; the left join
//! recomputes each touched key's rows (a key's "no match" row comes and goes
//! with the right side).

use super::group::{Groups, apply, restore_groups};
use crate::circuit::{Data, Operator, StepContext, StepInput};
use crate::error::Result;
use crate::exchange::shuffle_keyed;
use crate::state::{self, Shards};
use crate::zset::{Weight, consolidate};
use crate::{Stream, ZSet, codec};
use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::marker::PhantomData;

fn shuffle_side<K: Data, V: Data>(
    cx: &mut StepContext<'_>,
    channel: u32,
    mut local: ZSet<(K, V)>,
) -> Result<Vec<((K, V), Weight)>> {
    consolidate(&mut local);
    shuffle_keyed(cx.exchange, channel, local)
}

/// The `eval`s of an operator whose step is `join_step(da, db)` over its
/// two inputs' deltas, each consolidated and re-sharded by key (its
/// channel and the next): the inputs it is given are moved into them, the
/// ones lent are cloned (both joins).
macro_rules! two_sided_eval {
    () => {
        fn eval(&mut self, cx: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>> {
            let lent = inputs.iter().map(|i| StepInput::Shared(*i)).collect();
            self.eval_owned(cx, lent)
        }

        fn eval_owned(
            &mut self,
            cx: &mut StepContext<'_>,
            inputs: Vec<StepInput<'_>>,
        ) -> Result<Box<dyn Any>> {
            let mut inputs = inputs.into_iter();
            let a = inputs.next().expect("a join has two inputs");
            let b = inputs.next().expect("a join has two inputs");
            let da = shuffle_side(cx, self.channel, a.into_zset())?;
            let db = shuffle_side(cx, self.channel + 1, b.into_zset())?;
            self.join_step(da, db)
        }
    };
}

/// Both sides of a join, integrated per key.
struct Sides<K, A, B> {
    left: Groups<K, A>,
    right: Groups<K, B>,
    /// Shards changed since the last snapshot.
    dirty: Shards,
}

impl<K: Data, A: Data, B: Data> Sides<K, A, B> {
    fn new() -> Self {
        Sides {
            left: BTreeMap::new(),
            right: BTreeMap::new(),
            dirty: Shards::none(),
        }
    }

    /// The types its state holds, for the operator's fingerprint.
    fn types(&self) -> String {
        format!(
            "{}, {}",
            crate::identity::types2::<K, A>(),
            std::any::type_name::<B>()
        )
    }

    /// Marks the shard of `key` changed.
    fn touch(&mut self, key: &K) -> Result<()> {
        self.dirty.insert(state::shard_of_key(key)?);
        Ok(())
    }

    /// Per shard, both sides' entries there (a side without any: an empty
    /// list), as byte strings — a `(Bytes, Bytes)`'s encoding, written
    /// once, from the entries as split.
    fn snapshot(&self, only: Option<&Shards>) -> Result<BTreeMap<u32, Vec<u8>>> {
        let mut left = state::split_entries(&self.left, only)?;
        let mut right = state::split_entries(&self.right, only)?;
        let shards: std::collections::BTreeSet<u32> =
            left.keys().chain(right.keys()).copied().collect();
        shards
            .into_iter()
            .map(|s| {
                let l = left.remove(&s).unwrap_or_default();
                let r = right.remove(&s).unwrap_or_default();
                let (l_len, r_len) = (l.encoded_len()?, r.encoded_len()?);
                let mut piece = Vec::with_capacity(
                    state::varint_len(l_len)? + l_len + state::varint_len(r_len)? + r_len,
                );
                codec::write_bytes(&mut piece, &l_len)?;
                l.write(&mut piece)?;
                codec::write_bytes(&mut piece, &r_len)?;
                r.write(&mut piece)?;
                Ok((s, piece))
            })
            .collect()
    }

    fn restore(&mut self, name: &str, piece: &[u8]) -> Result<()> {
        let (l, r): (&[u8], &[u8]) = codec::from_state_borrowed(name, piece)?;
        restore_groups(&mut self.left, name, l)?;
        restore_groups(&mut self.right, name, r)
    }

    fn forget(&mut self, shards: &Shards) {
        state::forget(&mut self.left, shards);
        state::forget(&mut self.right, shards);
        self.dirty.union(shards);
    }
}

/// The methods of an operator whose state is its `sides` and whose step
/// is its `join_step` (both joins): its name, state, and `eval`s.
macro_rules! sides_state {
    ($name:literal) => {
        fn name(&self) -> &'static str {
            $name
        }

        fn state_types(&self) -> String {
            self.sides.types()
        }

        two_sided_eval!();

        fn stateful(&self) -> bool {
            true
        }

        fn snapshot(&self, only: Option<&Shards>) -> Result<BTreeMap<u32, Vec<u8>>> {
            self.sides.snapshot(only)
        }

        fn restore(&mut self, _name: &str, _shard: u32, piece: &[u8]) -> Result<()> {
            self.sides.restore($name, piece)
        }

        fn forget(&mut self, shards: &Shards) {
            self.sides.forget(shards);
        }

        fn dirty(&self) -> Shards {
            self.sides.dirty.clone()
        }

        fn clean(&mut self, _whole: &Shards) {
            self.sides.dirty = Shards::none();
        }
    };
}

struct Join<K, A, B, O, F> {
    channel: u32,
    f: F,
    sides: Sides<K, A, B>,
    _types: PhantomData<fn() -> O>,
}

impl<K: Data, A: Data, B: Data, O: Data, F: Fn(&K, &A, &B) -> O + 'static> Join<K, A, B, O, F> {
    /// One step: ΔA ⋈ B + A' ⋈ ΔB, and both sides integrated.
    fn join_step(
        &mut self,
        da: Vec<((K, A), Weight)>,
        db: Vec<((K, B), Weight)>,
    ) -> Result<Box<dyn Any>> {
        let mut out: ZSet<O> = Vec::new();
        // ΔA ⋈ B, then A' = A + ΔA.
        for ((k, a), wa) in &da {
            if let Some(group) = self.sides.right.get(k) {
                out.extend(group.iter().map(|(b, wb)| ((self.f)(k, a, b), wa * wb)));
            }
        }
        for ((k, a), wa) in da {
            self.sides.touch(&k)?;
            apply(&mut self.sides.left, &k, a, wa);
        }
        // A' ⋈ ΔB (= A⋈ΔB + ΔA⋈ΔB), then B' = B + ΔB.
        for ((k, b), wb) in &db {
            if let Some(group) = self.sides.left.get(k) {
                out.extend(group.iter().map(|(a, wa)| ((self.f)(k, a, b), wa * wb)));
            }
        }
        for ((k, b), wb) in db {
            self.sides.touch(&k)?;
            apply(&mut self.sides.right, &k, b, wb);
        }
        consolidate(&mut out);
        Ok(Box::new(out))
    }
}

impl<K: Data, A: Data, B: Data, O: Data, F: Fn(&K, &A, &B) -> O + 'static> Operator
    for Join<K, A, B, O, F>
{
    sides_state!("join");
}

struct LeftJoin<K, A, B, O, F> {
    channel: u32,
    f: F,
    sides: Sides<K, A, B>,
    _types: PhantomData<fn() -> O>,
}

impl<K: Data, A: Data, B: Data, O: Data, F: Fn(&K, &A, Option<&B>) -> O + 'static>
    LeftJoin<K, A, B, O, F>
{
    /// The rows of one key, with weight sign `sign`.
    fn rows(&self, k: &K, sign: Weight, out: &mut ZSet<O>) {
        let Some(left) = self.sides.left.get(k) else {
            return;
        };
        match self
            .sides
            .right
            .get(k)
            .filter(|r| r.iter().any(|(_, w)| *w > 0))
        {
            Some(right) => {
                for (a, wa) in left {
                    out.extend(
                        right
                            .iter()
                            .map(|(b, wb)| ((self.f)(k, a, Some(b)), sign * wa * wb)),
                    );
                }
            }
            None => out.extend(left.iter().map(|(a, wa)| ((self.f)(k, a, None), sign * wa))),
        }
    }

    /// One step: the touched keys' rows retracted, both sides
    /// integrated, the rows emitted again.
    fn join_step(
        &mut self,
        da: Vec<((K, A), Weight)>,
        db: Vec<((K, B), Weight)>,
    ) -> Result<Box<dyn Any>> {
        let touched: BTreeSet<K> = da
            .iter()
            .map(|((k, _), _)| k.clone())
            .chain(db.iter().map(|((k, _), _)| k.clone()))
            .collect();
        let mut out: ZSet<O> = Vec::new();
        for k in &touched {
            self.rows(k, -1, &mut out);
        }
        for ((k, a), w) in da {
            self.sides.touch(&k)?;
            apply(&mut self.sides.left, &k, a, w);
        }
        for ((k, b), w) in db {
            self.sides.touch(&k)?;
            apply(&mut self.sides.right, &k, b, w);
        }
        for k in &touched {
            self.rows(k, 1, &mut out);
        }
        consolidate(&mut out);
        Ok(Box::new(out))
    }
}

impl<K: Data, A: Data, B: Data, O: Data, F: Fn(&K, &A, Option<&B>) -> O + 'static> Operator
    for LeftJoin<K, A, B, O, F>
{
    sides_state!("left_join");
}

impl<K: Data, A: Data> Stream<(K, A)> {
    /// Inner join on keys: for every `(k, a)` here and `(k, b)` in `other`,
    /// emits `f(k, a, b)` with the product of their weights. Re-shards both
    /// inputs by key through the exchange.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     let orders = c.input::<(u64, i64)>("orders").key_by(|(customer, _)| *customer);
    ///     let customers = c.input::<(u64, String)>("customers").key_by(|(id, _)| *id);
    ///     orders
    ///         .join(&customers, |_, (_, amount), (_, region)| (region.clone(), *amount))
    ///         .sum_by(|(region, _)| region.clone(), |(_, amount)| *amount)
    ///         .output("revenue_per_region");
    /// }).unwrap();
    /// ```
    pub fn join<B: Data, O: Data>(
        &self,
        other: &Stream<(K, B)>,
        f: impl Fn(&K, &A, &B) -> O + 'static,
    ) -> Stream<O> {
        let channel = self.next_channel();
        self.binary(
            other,
            Join {
                channel,
                f,
                sides: Sides::new(),
                _types: PhantomData,
            },
        )
    }

    /// Left outer join on keys: like [`join`](Self::join), plus
    /// `f(k, a, None)` for every `(k, a)` whose key has no record in `other`.
    /// When the first match arrives the `None` row is deleted, and it comes
    /// back when the last match goes. Re-shards both inputs by key.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     let orders = c.input::<(u64, i64)>("orders").key_by(|(customer, _)| *customer);
    ///     let customers = c.input::<(u64, String)>("customers").key_by(|(id, _)| *id);
    ///     orders
    ///         .left_join(&customers, |id, (_, amount), c| (*id, *amount, c.map(|(_, r)| r.clone())))
    ///         .output("orders_with_region");
    /// }).unwrap();
    /// ```
    pub fn left_join<B: Data, O: Data>(
        &self,
        other: &Stream<(K, B)>,
        f: impl Fn(&K, &A, Option<&B>) -> O + 'static,
    ) -> Stream<O> {
        let channel = self.next_channel();
        self.binary(
            other,
            LeftJoin {
                channel,
                f,
                sides: Sides::new(),
                _types: PhantomData,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::operator::testing::{batches, check2, zset};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn build_join(c: &mut crate::Circuit) {
        let a = c.input::<(u8, u8)>("a");
        let b = c.input::<(u8, char)>("b");
        a.join(&b, |k, x, y| (*k, *x, *y)).output("out");
    }

    fn build_left(c: &mut crate::Circuit) {
        let a = c.input::<(u8, u8)>("a");
        let b = c.input::<(u8, char)>("b");
        a.left_join(&b, |k, x, y| (*k, *x, y.copied()))
            .output("out");
    }

    /// [`build_join`] with its left input also read after the join: the
    /// join is lent that input (clones it) and given the other (moves it).
    fn build_join_shared(c: &mut crate::Circuit) {
        let a = c.input::<(u8, u8)>("a");
        let b = c.input::<(u8, char)>("b");
        a.join(&b, |k, x, y| (*k, *x, *y)).output("out");
        a.output("a");
    }

    fn expect_join(
        a: &BTreeMap<(u8, u8), i64>,
        b: &BTreeMap<(u8, char), i64>,
    ) -> BTreeMap<(u8, u8, char), i64> {
        zset(a.iter().flat_map(|((ka, x), wa)| {
            b.iter()
                .filter(move |((kb, _), _)| kb == ka)
                .map(move |((_, y), wb)| ((*ka, *x, *y), wa * wb))
        }))
    }

    proptest! {
        #[test]
        fn join_with_a_shared_input_equals_recomputation(a in batches((0u8..4, 0u8..5)), b in batches((0u8..4, prop::char::range('a', 'd')))) {
            let steps: Vec<_> = a.into_iter().zip(b).collect();
            check2(build_join_shared, &steps, expect_join)?;
        }

        #[test]
        fn join_equals_recomputation(a in batches((0u8..4, 0u8..5)), b in batches((0u8..4, prop::char::range('a', 'd')))) {
            let steps: Vec<_> = a.into_iter().zip(b).collect();
            check2(build_join, &steps, expect_join)?;
        }

        #[test]
        fn left_join_equals_recomputation(a in batches((0u8..4, 0u8..5)), b in batches((0u8..4, prop::char::range('a', 'd')))) {
            let steps: Vec<_> = a.into_iter().zip(b).collect();
            check2(build_left, &steps, |a, b| {
                let mut right: BTreeMap<u8, Vec<(char, i64)>> = BTreeMap::new();
                for ((k, y), w) in b {
                    right.entry(*k).or_default().push((*y, *w));
                }
                zset(a.iter().flat_map(|((k, x), wa)| {
                    match right.get(k).filter(|r| r.iter().any(|(_, w)| *w > 0)) {
                        Some(r) => r.iter().map(|(y, wb)| ((*k, *x, Some(*y)), wa * wb)).collect::<Vec<_>>(),
                        None => vec![((*k, *x, None), *wa)],
                    }
                }))
            })?;
        }
    }

    /// A piece is the encoding of both sides' split entries as byte
    /// strings, as it was when the join encoded that pair itself (pieces
    /// written then restore now), a side without entries an empty list.
    #[test]
    fn pieces_encode_both_sides_as_byte_strings() {
        use super::Sides;
        use crate::{codec, state};
        let mut sides = Sides::<u32, String, u8>::new();
        for k in 0..3000u32 {
            super::apply(&mut sides.left, &k, format!("value {k}"), 1);
            if k % 5 == 0 {
                super::apply(&mut sides.left, &k, format!("more {k}"), 2);
            }
            if k % 3 == 0 {
                super::apply(&mut sides.right, &k, (k % 7) as u8, -2);
            }
        }
        let pieces = sides.snapshot(None).unwrap();
        let left = state::split(&sides.left, None).unwrap();
        let right = state::split(&sides.right, None).unwrap();
        let empty = codec::to_bytes(&Vec::<()>::new()).unwrap();
        assert_eq!(
            pieces.keys().collect::<Vec<_>>(),
            left.keys().collect::<Vec<_>>()
        );
        for (shard, piece) in &pieces {
            let l = &left[shard];
            let r = right.get(shard).unwrap_or(&empty);
            let pair = (serde_bytes::Bytes::new(l), serde_bytes::Bytes::new(r));
            assert_eq!(*piece, codec::to_bytes(&pair).unwrap(), "shard {shard}");
        }
        assert!(
            pieces.len() > right.len(),
            "some shards without a right side"
        );
    }
}
