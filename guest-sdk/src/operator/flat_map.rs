//! `flat_map`: turn every record into any number of records.

use crate::circuit::{Data, Operator, StepContext, input};
use crate::error::Result;
use crate::{Stream, ZSet};
use std::any::Any;
use std::marker::PhantomData;

struct FlatMap<T, U, F> {
    f: F,
    _types: PhantomData<fn(T) -> U>,
}

impl<T, U, I, F> Operator for FlatMap<T, U, F>
where
    T: Data,
    U: Data,
    I: IntoIterator<Item = U>,
    F: Fn(&T) -> I + 'static,
{
    fn name(&self) -> &'static str {
        "flat_map"
    }

    fn eval(&mut self, _: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>> {
        let records = input::<T>(inputs, 0);
        // At least one record out per record in is the common case (words
        // of lines, windows of records): grown from empty, the output
        // would be copied a dozen times on the way.
        let mut out: ZSet<U> = Vec::with_capacity(records.len());
        for (v, w) in records {
            out.extend((self.f)(v).into_iter().map(|u| (u, *w)));
        }
        Ok(Box::new(out))
    }
}

impl<T: Data> Stream<T> {
    /// Replaces every record by the records `f` returns, each with the
    /// original's weight (deleting a line deletes each of its words).
    /// Stateless, no exchange.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<String>("lines")
    ///         .flat_map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
    ///         .output("words");
    /// }).unwrap();
    /// ```
    pub fn flat_map<U: Data, I: IntoIterator<Item = U> + 'static>(
        &self,
        f: impl Fn(&T) -> I + 'static,
    ) -> Stream<U> {
        self.unary(FlatMap {
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
        fn equals_recomputation(steps in batches(0u8..20)) {
            check(|c| c.input::<u8>("in").flat_map(|x| 0..*x % 4).output("out"), &steps, |input| {
                zset(input.iter().flat_map(|(x, w)| (0..*x % 4).map(move |i| (i, *w))))
            })?;
        }
    }

    #[test]
    fn splits_and_retracts() {
        let out: Vec<Vec<(String, i64)>> = run_steps(
            |c| {
                c.input::<String>("in")
                    .flat_map(|l| l.split(' ').map(str::to_owned).collect::<Vec<_>>())
                    .output("out")
            },
            &[
                vec![("a b a".to_owned(), 1)],
                vec![("a b a".to_owned(), -1)],
            ],
        );
        assert_eq!(
            out,
            vec![
                vec![("a".into(), 2), ("b".into(), 1)],
                vec![("a".into(), -2), ("b".into(), -1)]
            ]
        );
    }
}
