//! `filter`: keep the records a predicate accepts.

use crate::circuit::{Data, Operator, StepContext, input};
use crate::error::Result;
use crate::{Stream, ZSet};
use std::any::Any;
use std::marker::PhantomData;

struct Filter<T, F> {
    f: F,
    _type: PhantomData<fn(T)>,
}

impl<T: Data, F: Fn(&T) -> bool + 'static> Operator for Filter<T, F> {
    fn name(&self) -> &'static str {
        "filter"
    }

    fn eval(&mut self, _: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>> {
        let out: ZSet<T> = input::<T>(inputs, 0)
            .iter()
            .filter(|(v, _)| (self.f)(v))
            .cloned()
            .collect();
        Ok(Box::new(out))
    }
}

impl<T: Data> Stream<T> {
    /// Keeps the records for which `f` returns true. Stateless, no exchange.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<i64>("n").filter(|n| n % 2 == 0).output("even");
    /// }).unwrap();
    /// ```
    pub fn filter(&self, f: impl Fn(&T) -> bool + 'static) -> Stream<T> {
        self.unary(Filter {
            f,
            _type: PhantomData,
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
            check(|c| c.input::<i64>("in").filter(|x| x % 3 != 0).output("out"), &steps, |input| {
                zset(input.iter().filter(|(x, _)| *x % 3 != 0).map(|(x, w)| (*x, *w)))
            })?;
        }
    }

    #[test]
    fn keeps_matching_inserts_and_deletes() {
        let out: Vec<Vec<(i64, i64)>> = run_steps(
            |c| c.input::<i64>("in").filter(|x| x % 2 == 0).output("out"),
            &[vec![(1, 1), (2, 1), (4, -1)]],
        );
        assert_eq!(out, vec![vec![(2, 1), (4, -1)]]);
    }
}
