//! The operators, one per file, each with its tests. Stateless operators
//! (`map`, `filter`, `flat_map`) work on each worker's share as it is; keyed
//! operators (`count_by`, `sum_by`) re-shard through the exchange first.

pub mod aggregate;
pub mod filter;
pub mod flat_map;
pub(crate) mod input;
pub mod map;
pub(crate) mod output;

pub use aggregate::Sum;

#[cfg(test)]
pub(crate) mod testing {
    use crate::exchange::{LocalExchange, RawEvent};
    use crate::{Circuit, CircuitInstance};
    use serde::Serialize;
    use serde::de::DeserializeOwned;

    /// Encodes typed input as one port's JSON events.
    pub fn events<T: Serialize>(zset: &[(T, i64)]) -> Vec<RawEvent> {
        zset.iter()
            .map(|(v, w)| RawEvent {
                key: vec![],
                value: serde_json::to_vec(v).unwrap(),
                weight: *w,
            })
            .collect()
    }

    /// Decodes one output port's events.
    pub fn decode<T: DeserializeOwned>(events: &[RawEvent]) -> Vec<(T, i64)> {
        events
            .iter()
            .map(|e| (serde_json::from_slice(&e.value).unwrap(), e.weight))
            .collect()
    }

    /// A single-worker circuit with one input and one output port.
    pub fn run_steps<I: Serialize, O: DeserializeOwned>(
        build: impl FnOnce(&mut Circuit),
        steps: &[Vec<(I, i64)>],
    ) -> Vec<Vec<(O, i64)>> {
        let mut c = CircuitInstance::build(build).unwrap();
        steps
            .iter()
            .map(|s| {
                let out = c.step(vec![events(s)], &mut LocalExchange).unwrap();
                decode(&out[0])
            })
            .collect()
    }
}
