//! `union` and `minus`: adding and subtracting Z-sets.

use crate::circuit::{Data, Operator, StepContext, StepInput, input};
use crate::error::Result;
use crate::{Stream, ZSet};
use std::any::Any;
use std::marker::PhantomData;

struct Union<T> {
    sign: i64,
    _type: PhantomData<fn(T)>,
}

impl<T: Data> Operator for Union<T> {
    fn name(&self) -> &'static str {
        if self.sign > 0 { "union" } else { "minus" }
    }

    fn eval(&mut self, _: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>> {
        let (a, b) = (input::<T>(inputs, 0), input::<T>(inputs, 1));
        let mut out: ZSet<T> = Vec::with_capacity(a.len() + b.len());
        out.extend(a.iter().cloned());
        out.extend(b.iter().map(|(v, w)| (v.clone(), self.sign * w)));
        Ok(Box::new(out))
    }

    /// Moves the records of the inputs it is given (their last reader)
    /// instead of cloning them: the first one's vector becomes the output.
    fn eval_owned(
        &mut self,
        _: &mut StepContext<'_>,
        inputs: Vec<StepInput<'_>>,
    ) -> Result<Box<dyn Any>> {
        let mut inputs = inputs.into_iter();
        let a = inputs.next().expect("a union has two inputs");
        let b = inputs.next().expect("a union has two inputs");
        let b_len = b.zset::<T>().len();
        let mut out: ZSet<T> = if matches!(a, StepInput::Owned(_)) {
            let mut a = a.into_owned::<T>().expect("an input not lent is given");
            a.reserve(b_len);
            a
        } else {
            let a = a.zset::<T>();
            let mut out = Vec::with_capacity(a.len() + b_len);
            out.extend(a.iter().cloned());
            out
        };
        let sign = self.sign;
        if matches!(b, StepInput::Owned(_)) {
            let b = b.into_owned::<T>().expect("an input not lent is given");
            out.extend(b.into_iter().map(|(v, w)| (v, sign * w)));
        } else {
            out.extend(b.zset::<T>().iter().map(|(v, w)| (v.clone(), sign * w)));
        }
        Ok(Box::new(out))
    }
}

impl<T: Data> Stream<T> {
    /// Both streams' records (Z-set sum: weights add up). Stateless, no
    /// exchange.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     let a = c.input::<String>("a");
    ///     let b = c.input::<String>("b");
    ///     a.union(&b).output("both");
    /// }).unwrap();
    /// ```
    pub fn union(&self, other: &Stream<T>) -> Stream<T> {
        self.binary(
            other,
            Union::<T> {
                sign: 1,
                _type: PhantomData,
            },
        )
    }

    /// This stream's records minus `other`'s (Z-set difference: weights
    /// subtract, and may go negative). Stateless, no exchange.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     let all = c.input::<String>("all");
    ///     let banned = c.input::<String>("banned");
    ///     all.minus(&banned).output("allowed");
    /// }).unwrap();
    /// ```
    pub fn minus(&self, other: &Stream<T>) -> Stream<T> {
        self.binary(
            other,
            Union::<T> {
                sign: -1,
                _type: PhantomData,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::operator::testing::{batches, check2, zset};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn union_and_minus_equal_recomputation(a in batches(0u8..10), b in batches(0u8..10)) {
            let steps: Vec<_> = a.into_iter().zip(b).collect();
            check2(
                |c| { let x = c.input::<u8>("a"); let y = c.input::<u8>("b"); x.union(&y).output("out") },
                &steps,
                |a, b| zset(a.iter().chain(b.iter()).map(|(v, w)| (*v, *w))),
            )?;
            check2(
                |c| { let x = c.input::<u8>("a"); let y = c.input::<u8>("b"); x.minus(&y).output("out") },
                &steps,
                |a, b| zset(a.iter().map(|(v, w)| (*v, *w)).chain(b.iter().map(|(v, w)| (*v, -w)))),
            )?;
        }
    }
}
