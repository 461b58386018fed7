//! `distinct`: each record once, while its weight is positive.

use crate::circuit::{Data, Operator, StepContext, input};
use crate::error::Result;
use crate::exchange::shuffle_keyed;
use crate::state::{self, Shards};
use crate::zset::{Weight, consolidate};
use crate::{Stream, ZSet, codec};
use std::any::Any;
use std::collections::BTreeMap;

struct Distinct<T> {
    channel: u32,
    weights: BTreeMap<T, Weight>,
}

impl<T: Data> Operator for Distinct<T> {
    fn name(&self) -> &'static str {
        "distinct"
    }

    fn state_types(&self) -> String {
        std::any::type_name::<T>().to_owned()
    }

    fn eval(&mut self, cx: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>> {
        let mut local: ZSet<(T, ())> = input::<T>(inputs, 0)
            .iter()
            .map(|(t, w)| ((t.clone(), ()), *w))
            .collect();
        consolidate(&mut local);
        let mut out: ZSet<T> = Vec::new();
        for ((t, ()), w) in shuffle_keyed(cx.exchange, self.channel, local)? {
            let old = self.weights.get(&t).copied().unwrap_or(0);
            let new = old + w;
            if new == 0 {
                self.weights.remove(&t);
            } else {
                self.weights.insert(t.clone(), new);
            }
            match (old > 0, new > 0) {
                (false, true) => out.push((t, 1)),
                (true, false) => out.push((t, -1)),
                _ => {}
            }
        }
        consolidate(&mut out);
        Ok(Box::new(out))
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
    }
}
