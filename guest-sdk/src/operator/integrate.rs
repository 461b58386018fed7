//! `integrate` and `differentiate`: between a stream of changes and a stream
//! of whole states. `s.integrate().differentiate()` is `s` again.

use crate::circuit::{Data, Operator, StepContext, input};
use crate::error::Result;
use crate::state::{self, Shards};
use crate::zset::{Weight, consolidate, integrate};
use crate::{Stream, ZSet, codec};
use std::any::Any;
use std::collections::BTreeMap;

struct Integrate<T> {
    sum: BTreeMap<T, Weight>,
}

impl<T: Data> Operator for Integrate<T> {
    fn name(&self) -> &'static str {
        "integrate"
    }

    fn state_types(&self) -> String {
        std::any::type_name::<T>().to_owned()
    }

    fn eval(&mut self, _: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>> {
        integrate(&mut self.sum, input::<T>(inputs, 0));
        let out: ZSet<T> = self.sum.iter().map(|(t, w)| (t.clone(), *w)).collect();
        Ok(Box::new(out))
    }

    fn stateful(&self) -> bool {
        true
    }

    fn snapshot(&self, only: Option<&Shards>) -> Result<BTreeMap<u32, Vec<u8>>> {
        state::split(&self.sum, only)
    }

    fn restore(&mut self, _name: &str, _shard: u32, piece: &[u8]) -> Result<()> {
        if self.sum.is_empty() {
            self.sum = codec::from_state_map("integrate", piece)?;
            return Ok(());
        }
        let entries: Vec<(T, Weight)> = codec::from_state("integrate", piece)?;
        integrate(&mut self.sum, &entries);
        Ok(())
    }

    fn forget(&mut self, shards: &Shards) {
        state::forget(&mut self.sum, shards);
    }
}

struct Differentiate<T> {
    previous: ZSet<T>,
}

impl<T: Data> Operator for Differentiate<T> {
    fn name(&self) -> &'static str {
        "differentiate"
    }

    fn state_types(&self) -> String {
        std::any::type_name::<T>().to_owned()
    }

    fn eval(&mut self, _: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>> {
        let mut current = input::<T>(inputs, 0).clone();
        consolidate(&mut current);
        let mut out: ZSet<T> = current.clone();
        out.extend(self.previous.iter().map(|(t, w)| (t.clone(), -w)));
        consolidate(&mut out);
        self.previous = current;
        Ok(Box::new(out))
    }

    fn stateful(&self) -> bool {
        true
    }

    fn snapshot(&self, only: Option<&Shards>) -> Result<BTreeMap<u32, Vec<u8>>> {
        state::split(self.previous.iter().map(|(t, w)| (t, w)), only)
    }

    fn restore(&mut self, _name: &str, _shard: u32, piece: &[u8]) -> Result<()> {
        let entries: ZSet<T> = codec::from_state("differentiate", piece)?;
        self.previous.extend(entries);
        consolidate(&mut self.previous);
        Ok(())
    }

    fn forget(&mut self, shards: &Shards) {
        self.previous
            .retain(|(t, _)| state::shard_of_key(t).is_ok_and(|s| !shards.contains(s)));
    }
}

impl<T: Data> Stream<T> {
    /// At every step, the sum of all changes so far: the whole current
    /// Z-set (this worker's share of it). Each step's output is the full
    /// state, not a change: send it to a port only when a snapshot per step
    /// is what you want.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<String>("changes").integrate().output("snapshots");
    /// }).unwrap();
    /// ```
    pub fn integrate(&self) -> Stream<T> {
        self.unary(Integrate::<T> {
            sum: BTreeMap::new(),
        })
    }

    /// The change from the previous step's Z-set to this step's: turns a
    /// stream of whole states back into changes.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<String>("states").differentiate().output("changes");
    /// }).unwrap();
    /// ```
    pub fn differentiate(&self) -> Stream<T> {
        self.unary(Differentiate::<T> {
            previous: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::operator::testing::{batches, check};
    use crate::testing::{decode, events, run};
    use crate::zset::{consolidate, integrate};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        #[test]
        fn differentiate_undoes_integrate(steps in batches(0u8..10)) {
            check(|c| c.input::<u8>("in").integrate().differentiate().output("out"), &steps, |input| input.clone())?;
        }

        #[test]
        fn integrate_emits_the_running_sum(steps in batches(0u8..10)) {
            let raw: Vec<_> = steps.iter().map(|s| vec![events(s)]).collect();
            for workers in [1, 3] {
                let out = run(|c| c.input::<u8>("in").integrate().output("out"), workers, &raw, Some(steps.len() / 2)).unwrap();
                let mut sum = BTreeMap::new();
                for (step, got) in steps.iter().zip(&out) {
                    integrate(&mut sum, step);
                    let mut got = decode::<u8>(&got[0]);
                    consolidate(&mut got);
                    prop_assert_eq!(got, sum.iter().map(|(k, w)| (*k, *w)).collect::<Vec<_>>());
                }
            }
        }
    }
}
