//! `distinct`: each record once, while its weight is positive.

use crate::circuit::{Data, Operator, StepContext, StepInput};
use crate::error::Result;
use crate::exchange::shuffle_keyed;
use crate::state::{self, Shards};
use crate::zset::{Weight, consolidate};
use crate::{Stream, ZSet, codec};
use std::any::Any;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

struct Distinct<T> {
    channel: u32,
    weights: BTreeMap<T, Weight>,
}

impl<T: Data> Distinct<T> {
    /// Integrates this step's records (this worker's, not yet
    /// consolidated) into the weights, after the exchange, and returns the
    /// records whose weight crossed zero: +1 for one that became positive,
    /// −1 for one that stopped being.
    fn apply(
        &mut self,
        cx: &mut StepContext<'_>,
        mut local: ZSet<(T, ())>,
    ) -> Result<Box<dyn Any>> {
        consolidate(&mut local);
        let mut out: ZSet<T> = Vec::new();
        for ((t, ()), w) in shuffle_keyed(cx.exchange, self.channel, local)? {
            // One lookup a record; the record is cloned only for an output
            // that also stays in the map.
            match self.weights.entry(t) {
                Entry::Vacant(_) if w == 0 => {}
                Entry::Vacant(slot) => {
                    if w > 0 {
                        out.push((slot.key().clone(), 1));
                    }
                    slot.insert(w);
                }
                Entry::Occupied(mut slot) => {
                    let old = *slot.get();
                    let new = old + w;
                    if new == 0 {
                        let (t, _) = slot.remove_entry();
                        if old > 0 {
                            out.push((t, -1));
                        }
                        continue;
                    }
                    *slot.get_mut() = new;
                    match (old > 0, new > 0) {
                        (false, true) => out.push((slot.key().clone(), 1)),
                        (true, false) => out.push((slot.key().clone(), -1)),
                        _ => {}
                    }
                }
            }
        }
        consolidate(&mut out);
        Ok(Box::new(out))
    }
}

impl<T: Data> Operator for Distinct<T> {
    fn name(&self) -> &'static str {
        "distinct"
    }

    fn state_types(&self) -> String {
        std::any::type_name::<T>().to_owned()
    }

    fn eval(&mut self, cx: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>> {
        self.eval_owned(cx, vec![StepInput::Shared(inputs[0])])
    }

    fn eval_owned(
        &mut self,
        cx: &mut StepContext<'_>,
        mut inputs: Vec<StepInput<'_>>,
    ) -> Result<Box<dyn Any>> {
        // Given its input, it moves the records instead of cloning them.
        let local = inputs
            .pop()
            .expect("distinct has one input")
            .map_records::<T, _>(|(t, w)| ((t, ()), w), |(t, w)| ((t.clone(), ()), *w));
        self.apply(cx, local)
    }

    fn stateful(&self) -> bool {
        true
    }

    fn snapshot(&self, only: Option<&Shards>) -> Result<BTreeMap<u32, Vec<u8>>> {
        state::split(&self.weights, only)
    }

    fn restore(&mut self, _name: &str, _shard: u32, piece: &[u8]) -> Result<()> {
        if self.weights.is_empty() {
            self.weights = codec::from_state_map("distinct", piece)?;
            return Ok(());
        }
        let entries: Vec<(T, Weight)> = codec::from_state("distinct", piece)?;
        crate::zset::integrate(&mut self.weights, &entries);
        Ok(())
    }

    fn forget(&mut self, shards: &Shards) {
        state::forget(&mut self.weights, shards);
    }
}

impl<T: Data> Stream<T> {
    /// Every record whose integrated weight is positive, with weight 1:
    /// set semantics. Re-shards by record through the exchange.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<String>("visits").distinct().output("visitors");
    /// }).unwrap();
    /// ```
    pub fn distinct(&self) -> Stream<T> {
        let channel = self.next_channel();
        self.unary(Distinct::<T> {
            channel,
            weights: BTreeMap::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::operator::testing::{batches, check, zset};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn equals_recomputation(steps in batches(0u8..12)) {
            check(|c| c.input::<u8>("in").distinct().output("out"), &steps, |input| {
                zset(input.iter().filter(|(_, w)| **w > 0).map(|(v, _)| (*v, 1)))
            })?;
        }

        #[test]
        fn equals_recomputation_when_its_input_is_shared(steps in batches(0u8..12)) {
            // The filter reads the input after `distinct`, so `distinct`
            // is lent it (clones) rather than given it (moves).
            let build = |c: &mut crate::Circuit| {
                let input = c.input::<u8>("in");
                let distinct = input.distinct();
                distinct.union(&input.filter(|_| false)).output("out");
            };
            check(build, &steps, |input| {
                zset(input.iter().filter(|(_, w)| **w > 0).map(|(v, _)| (*v, 1)))
            })?;
        }
    }
}
