//! `map`: apply a function to every record.

use crate::circuit::{Data, Operator, StepContext, input};
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

    #[test]
    fn maps_values_and_keeps_weights() {
        let out: Vec<Vec<(i64, i64)>> = run_steps(
            |c| c.input::<i64>("in").map(|x| x * 10).output("out"),
            &[vec![(1, 1), (2, -1)], vec![(1, 2), (1, -2)]],
        );
        assert_eq!(out, vec![vec![(10, 1), (20, -1)], vec![]]);
    }
}
