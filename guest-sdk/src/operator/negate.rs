//! `negate`: flip every weight (inserts become deletes).

use crate::circuit::{Data, Operator, StepContext, input};
use crate::error::Result;
use crate::{Stream, ZSet};
use std::any::Any;
use std::marker::PhantomData;

struct Negate<T>(PhantomData<fn(T)>);

impl<T: Data> Operator for Negate<T> {
    fn name(&self) -> &'static str {
        "negate"
    }

    fn eval(&mut self, _: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>> {
        let out: ZSet<T> = input::<T>(inputs, 0)
            .iter()
            .map(|(v, w)| (v.clone(), -w))
            .collect();
        Ok(Box::new(out))
    }
}

impl<T: Data> Stream<T> {
    /// The same records with opposite weights. Stateless, no exchange.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<String>("in").negate().output("undo");
    /// }).unwrap();
    /// ```
    pub fn negate(&self) -> Stream<T> {
        self.unary(Negate::<T>(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use crate::operator::testing::{batches, check, zset};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn equals_recomputation(steps in batches(0u8..10)) {
            check(|c| c.input::<u8>("in").negate().output("out"), &steps, |input| {
                zset(input.iter().map(|(v, w)| (*v, -w)))
            })?;
        }
    }
}
