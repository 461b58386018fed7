//! `key_by`: pair every record with a key, for joins.

use crate::Stream;
use crate::circuit::Data;

impl<T: Data> Stream<T> {
    /// Pairs every record with `key(record)`: the indexed form that
    /// [`join`](Stream::join) and [`left_join`](Stream::left_join) take.
    /// Stateless, no exchange (the join re-shards).
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<(u64, String)>("people").key_by(|(id, _)| *id).output("by_id");
    /// }).unwrap();
    /// ```
    pub fn key_by<K: Data>(&self, key: impl Fn(&T) -> K + 'static) -> Stream<(K, T)> {
        self.map(move |t| (key(t), t.clone()))
    }
}

#[cfg(test)]
mod tests {
    use crate::operator::testing::{batches, check, zset};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn equals_recomputation(steps in batches(0u8..20)) {
            check(|c| c.input::<u8>("in").key_by(|x| x % 4).output("out"), &steps, |input| {
                zset(input.iter().map(|(v, w)| ((v % 4, *v), *w)))
            })?;
        }
    }
}
