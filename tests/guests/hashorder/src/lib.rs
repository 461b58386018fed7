//! A circuit written against the `sluice:circuit` bindings directly, as a
//! component in another language would be, without the SDK (whose `output`
//! operator sorts every delta): each step counts its input values in a
//! fresh `HashMap` and emits the counts in the map's iteration order.
//!
//! Rust gives every new `HashMap` other hash keys (a counter on top of a
//! per-process seed), so an instance restored from a checkpoint iterates a
//! step's map in another order than the instance that first ran the step:
//! the same output as a multiset, in another order. The host's replay check
//! must accept that and still reject any difference in content.

#![cfg(target_arch = "wasm32")]

use std::collections::HashMap;

#[allow(missing_docs)]
mod bindings {
    wit_bindgen::generate!({
        world: "pipeline-worker",
        path: "../../../wit",
    });
}

// Name the WIT files to cargo, so that a change to them rebuilds this crate.
const _: [&str; 4] = [
    include_str!("../../../../wit/types.wit"),
    include_str!("../../../../wit/exchange.wit"),
    include_str!("../../../../wit/circuit.wit"),
    include_str!("../../../../wit/worlds.wit"),
];

use bindings::exports::sluice::circuit::circuit::Guest;
use bindings::sluice::circuit::types::{
    Batch, CircuitError, CircuitInfo, ShardState, StateSnapshot, WorkerInfo,
};

struct HashOrder;

/// Packs `(value, weight)` events into output port 0's batch.
fn batch(events: Vec<(Vec<u8>, i64)>) -> Batch {
    let mut b = Batch {
        port: 0,
        values: Vec::new(),
        ends: Vec::new(),
        weights: Vec::new(),
    };
    for (value, weight) in events {
        b.values.extend_from_slice(&value);
        b.ends.push(b.values.len() as u32);
        b.weights.push(weight);
    }
    b
}

impl Guest for HashOrder {
    fn describe() -> CircuitInfo {
        CircuitInfo {
            inputs: vec!["in".into()],
            outputs: vec!["out".into()],
            snapshot_version: 1,
            operators: Vec::new(),
        }
    }

    fn init(_info: WorkerInfo) -> Result<(), CircuitError> {
        Ok(())
    }

    fn step(inputs: Vec<Batch>) -> Result<Vec<Batch>, CircuitError> {
        let mut counts: HashMap<Vec<u8>, i64> = HashMap::new();
        for batch in inputs {
            let mut start = 0;
            for (end, weight) in batch.ends.iter().zip(&batch.weights) {
                let end = *end as usize;
                let value = batch
                    .values
                    .get(start..end)
                    .ok_or_else(|| CircuitError::Protocol("malformed input batch".into()))?;
                *counts.entry(value.to_vec()).or_default() += weight;
                start = end;
            }
        }
        let events = counts
            .into_iter()
            .filter(|(_, n)| *n != 0)
            .collect::<Vec<_>>();
        Ok(vec![batch(events)])
    }

    fn snapshot(_changed_only: bool) -> Result<StateSnapshot, CircuitError> {
        Ok(StateSnapshot {
            pieces: Vec::new(),
            changed: None,
        })
    }

    fn restore(_pieces: Vec<ShardState>) -> Result<(), CircuitError> {
        Ok(())
    }

    fn upgrade(_pieces: Vec<ShardState>, _start_empty: Vec<String>) -> Result<(), CircuitError> {
        Ok(())
    }

    fn export_shards(_shards: Vec<u32>) -> Result<Vec<ShardState>, CircuitError> {
        Ok(Vec::new())
    }

    fn set_workers(_workers: u32) {}
}

bindings::export!(HashOrder with_types_in bindings);
