//! `filter_map`: map and filter in one pass.

use crate::circuit::{Data, Operator, StepContext, input};
use crate::error::Result;
use crate::{Stream, ZSet};
use std::any::Any;
use std::marker::PhantomData;

struct FilterMap<T, U, F> {
    f: F,
    _types: PhantomData<fn(T) -> U>,
}

impl<T: Data, U: Data, F: Fn(&T) -> Option<U> + 'static> Operator for FilterMap<T, U, F> {
    fn name(&self) -> &'static str {
        "filter_map"
    }

    fn eval(&mut self, _: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>> {
        let out: ZSet<U> = input::<T>(inputs, 0)
            .iter()
            .filter_map(|(v, w)| Some(((self.f)(v)?, *w)))
            .collect();
        Ok(Box::new(out))
    }
}

impl<T: Data> Stream<T> {
    /// Keeps the records for which `f` returns `Some`, replaced by its
    /// contents; weights are kept. Stateless, no exchange.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<String>("raw").filter_map(|s| s.parse::<i64>().ok()).output("numbers");
    /// }).unwrap();
    /// ```
    pub fn filter_map<U: Data>(&self, f: impl Fn(&T) -> Option<U> + 'static) -> Stream<U> {
        self.unary(FilterMap {
            f,
            _types: PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::operator::testing::{batches, check, zset};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn equals_recomputation(steps in batches(0i64..30)) {
            check(
                |c| c.input::<i64>("in").filter_map(|x| (x % 3 == 0).then_some(x / 3)).output("out"),
                &steps,
                |input| zset(input.iter().filter(|(x, _)| *x % 3 == 0).map(|(x, w)| (x / 3, *w))),
            )?;
        }
    }
}
