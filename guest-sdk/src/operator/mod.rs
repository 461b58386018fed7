//! The operators, one per file, each with its tests. Stateless operators
//! (`map`, `map_owned`, `filter`, `filter_map`, `flat_map`, `union`,
//! `minus`, `negate`, `key_by`, windows) work on each worker's share as it
//! is and never touch the exchange; keyed operators (aggregates,
//! `distinct`, joins, `top_k_by`) re-shard by key through the exchange
//! first, so each key's state lives on exactly one worker. `session_by` is a window but keyed: a session is
//! per key, so it re-shards too.

pub mod aggregate;
pub mod distinct;
pub mod filter;
pub mod filter_map;
pub mod flat_map;
pub mod fold;
pub(crate) mod group;
pub(crate) mod input;
pub mod integrate;
pub mod join;
pub mod key_by;
pub mod map;
pub mod min_max;
pub mod negate;
pub(crate) mod output;
pub mod session;
pub mod top_k;
pub mod union;
pub mod window;

pub use aggregate::Sum;

#[cfg(test)]
pub(crate) mod testing {
    use crate::exchange::{LocalExchange, RawEvent};
    use crate::testing::{Rescale, run_rescaled};
    use crate::{Circuit, CircuitInstance, Data, Weight};
    use proptest::prelude::*;
    use serde::Serialize;
    use serde::de::DeserializeOwned;
    use std::collections::BTreeMap;

    pub use crate::testing::{decode, events};

    /// A single-worker circuit with one input and one output port.
    pub fn run_steps<I: Serialize, O: DeserializeOwned>(
        build: impl FnOnce(&mut Circuit),
        steps: &[Vec<(I, i64)>],
    ) -> Vec<Vec<(O, i64)>> {
        let mut c = CircuitInstance::build(build).unwrap();
        steps
            .iter()
            .map(|s| {
                let out = c.step(vec![events(s)], &mut LocalExchange).unwrap();
                decode(&out[0])
            })
            .collect()
    }

    /// Random batches of inserts and deletes over `values`.
    pub fn batches<T: std::fmt::Debug + Clone>(
        values: impl Strategy<Value = T> + Clone,
    ) -> impl Strategy<Value = Vec<Vec<(T, Weight)>>> {
        proptest::collection::vec(
            proptest::collection::vec(
                (
                    values,
                    prop_oneof![3 => Just(1i64), 2 => Just(-1i64), 1 => -2i64..=2],
                ),
                0..10,
            ),
            1..8,
        )
    }

    fn integrate<T: Data>(into: &mut BTreeMap<T, Weight>, delta: &[(T, Weight)]) {
        crate::zset::integrate(into, delta)
    }

    /// A layout for `workers` workers drawn from `seed`: every shard to a
    /// random worker (any table routes correctly; balance does not count
    /// here).
    fn random_owners(seed: &mut u64, workers: usize) -> Vec<u32> {
        (0..crate::state::SHARDS)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*seed >> 33) % workers as u64) as u32
            })
            .collect()
    }

    /// Checks an operator against recomputation: after every step, the
    /// integrated output equals `expect` of the integrated inputs, with 1 and
    /// with 3 workers, with 3 workers restored from a snapshot midway, and
    /// across layout changes — W workers whose snapshot pieces go, by
    /// shard, to W′ workers of a random layout midway and again near the
    /// end (W, W′ in 1..5, drawn from the steps).
    /// `steps[i][p]` is step `i`'s delta on input port `p`, encoded.
    pub fn check_ports<O: Data>(
        build: fn(&mut Circuit),
        steps: &[Vec<Vec<RawEvent>>],
        expect_after: impl Fn(usize) -> BTreeMap<O, Weight>,
    ) -> Result<(), TestCaseError> {
        let cut = steps.len() / 2;
        let mut seed = steps
            .iter()
            .flatten()
            .flatten()
            .fold(0x9e37_79b9u64, |h, e| {
                e.value
                    .iter()
                    .fold(h.rotate_left(5) ^ e.weight as u64, |h, b| {
                        h.rotate_left(7) ^ *b as u64
                    })
            });
        let mut pick = |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            (seed >> 33) % n
        };
        let (w0, w1, w2) = (
            1 + pick(4) as usize,
            1 + pick(4) as usize,
            1 + pick(4) as usize,
        );
        let mut owners_seed = seed;
        let rescaled = vec![
            Rescale {
                at: cut,
                workers: w1,
                owners: random_owners(&mut owners_seed, w1),
            },
            Rescale {
                at: steps.len().saturating_sub(1).max(cut),
                workers: w2,
                owners: random_owners(&mut owners_seed, w2),
            },
        ];
        let plans: Vec<(usize, Vec<Rescale>)> = vec![
            (1, vec![]),
            (3, vec![]),
            (
                3,
                vec![Rescale {
                    at: cut,
                    workers: 3,
                    owners: crate::testing::modulo_owners(3),
                }],
            ),
            (
                2,
                vec![Rescale {
                    at: 0,
                    workers: 2,
                    owners: crate::testing::modulo_owners(2),
                }],
            ),
            (w0, rescaled),
        ];
        for (workers, plan) in plans {
            let out = run_rescaled(build, workers, steps, &plan)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut got = BTreeMap::new();
            for (i, step) in out.iter().enumerate() {
                integrate(&mut got, &decode::<O>(&step[0]));
                prop_assert_eq!(
                    &got,
                    &expect_after(i),
                    "workers={}, layout changes={:?}, after step {}",
                    workers,
                    plan.iter().map(|r| (r.at, r.workers)).collect::<Vec<_>>(),
                    i
                );
            }
        }
        Ok(())
    }

    /// [`check_ports`] for a one-input operator: `expect` maps the integrated
    /// input to the expected integrated output.
    pub fn check<I: Data, O: Data>(
        build: fn(&mut Circuit),
        steps: &[Vec<(I, Weight)>],
        expect: impl Fn(&BTreeMap<I, Weight>) -> BTreeMap<O, Weight>,
    ) -> Result<(), TestCaseError> {
        let raw: Vec<Vec<Vec<RawEvent>>> = steps.iter().map(|s| vec![events(s)]).collect();
        check_ports(build, &raw, |i| {
            let mut input = BTreeMap::new();
            for s in &steps[..=i] {
                integrate(&mut input, s);
            }
            expect(&input)
        })
    }

    /// One step's deltas on two input ports.
    pub type TwoPorts<A, B> = (Vec<(A, Weight)>, Vec<(B, Weight)>);

    /// [`check_ports`] for a two-input operator.
    pub fn check2<A: Data, B: Data, O: Data>(
        build: fn(&mut Circuit),
        steps: &[TwoPorts<A, B>],
        expect: impl Fn(&BTreeMap<A, Weight>, &BTreeMap<B, Weight>) -> BTreeMap<O, Weight>,
    ) -> Result<(), TestCaseError> {
        let raw: Vec<Vec<Vec<RawEvent>>> = steps
            .iter()
            .map(|(a, b)| vec![events(a), events(b)])
            .collect();
        check_ports(build, &raw, |i| {
            let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
            for (da, db) in &steps[..=i] {
                integrate(&mut a, da);
                integrate(&mut b, db);
            }
            expect(&a, &b)
        })
    }

    /// Turns `(record, weight)` pairs into a multiset without zero weights.
    pub fn zset<T: Data>(pairs: impl IntoIterator<Item = (T, Weight)>) -> BTreeMap<T, Weight> {
        let mut m = BTreeMap::new();
        for (t, w) in pairs {
            *m.entry(t).or_insert(0) += w;
        }
        m.retain(|_, w| *w != 0);
        m
    }
}
