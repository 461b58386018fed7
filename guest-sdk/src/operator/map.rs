//! `map`: apply a function to every record.

use crate::circuit::{Data, Operator, StepContext, StepInput, input};
use crate::error::Result;
use crate::{Stream, ZSet};
use std::any::Any;
use std::marker::PhantomData;

struct Map<T, U, F> {
    f: F,
    _types: PhantomData<fn(T) -> U>,
}

impl<T: Data, U: Data, F: Fn(&T) -> U + 'static> Operator for Map<T, U, F> {
    fn name(&self) -> &'static str {
        "map"
    }

    fn eval(&mut self, _: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>> {
        let out: ZSet<U> = input::<T>(inputs, 0)
            .iter()
            .map(|(v, w)| ((self.f)(v), *w))
            .collect();
        Ok(Box::new(out))
    }
}

struct MapOwned<T, U, F> {
    f: F,
    _types: PhantomData<fn(T) -> U>,
}

impl<T: Data, U: Data, F: Fn(T) -> U + 'static> Operator for MapOwned<T, U, F> {
    fn name(&self) -> &'static str {
        "map_owned"
    }

    fn eval(&mut self, cx: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>> {
        self.eval_owned(cx, vec![StepInput::Shared(inputs[0])])
    }

    fn eval_owned(
        &mut self,
        _: &mut StepContext<'_>,
        mut inputs: Vec<StepInput<'_>>,
    ) -> Result<Box<dyn Any>> {
        let records = inputs
            .pop()
            .expect("map_owned has one input")
            .into_zset::<T>();
        let out: ZSet<U> = records.into_iter().map(|(v, w)| ((self.f)(v), w)).collect();
        Ok(Box::new(out))
    }
}

impl<T: Data> Stream<T> {
    /// Applies `f` to every record; weights are kept. Stateless, no exchange.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<String>("names").map(|s| s.len() as i64).output("lengths");
    /// }).unwrap();
    /// ```
    pub fn map<U: Data>(&self, f: impl Fn(&T) -> U + 'static) -> Stream<U> {
        self.unary(Map {
            f,
            _types: PhantomData,
        })
    }

    /// [`map`](Self::map) with `f` taking each record by value: a record
    /// moves into `f` when this stream has no other reader after this
    /// operator (a map after an input, a join or a `top_k_by`, nearly
    /// always), and is cloned for `f` otherwise. For an `f` that keeps most
    /// of its record (one field changed, one part taken out), which `map`
    /// would have to clone whole. Stateless, no exchange.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<(String, i64)>("prices")
    ///         .map_owned(|(item, cents)| (item, cents * 89 / 100))
    ///         .output("euro_prices");
    /// }).unwrap();
    /// ```
    pub fn map_owned<U: Data>(&self, f: impl Fn(T) -> U + 'static) -> Stream<U> {
        self.unary(MapOwned {
            f,
            _types: PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::operator::testing::{batches, check, run_steps, zset};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn equals_recomputation(steps in batches(0i64..20)) {
            check(|c| c.input::<i64>("in").map(|x| x / 3).output("out"), &steps, |input| {
                zset(input.iter().map(|(x, w)| (x / 3, *w)))
            })?;
        }
    }

    proptest! {
        #[test]
        fn map_owned_equals_recomputation(steps in batches(0i64..20)) {
            check(|c| c.input::<i64>("in").map_owned(|x| x / 3).output("out"), &steps, |input| {
                zset(input.iter().map(|(x, w)| (x / 3, *w)))
            })?;
        }

        #[test]
        fn map_owned_of_a_shared_stream_equals_recomputation(steps in batches(0i64..20)) {
            // The filter reads the input after `map_owned`, which is lent
            // it (clones each record) rather than given it.
            let build = |c: &mut crate::Circuit| {
                let input = c.input::<i64>("in");
                let mapped = input.map_owned(|x| x / 3);
                mapped.union(&input.filter(|_| false)).output("out");
            };
            check(build, &steps, |input| zset(input.iter().map(|(x, w)| (x / 3, *w))))?;
        }
    }

    #[test]
    fn maps_values_and_keeps_weights() {
        let out: Vec<Vec<(i64, i64)>> = run_steps(
            |c| c.input::<i64>("in").map(|x| x * 10).output("out"),
            &[vec![(1, 1), (2, -1)], vec![(1, 2), (1, -2)]],
        );
        assert_eq!(out, vec![vec![(10, 1), (20, -1)], vec![]]);
    }
}
