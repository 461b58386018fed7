//! A circuit for the crash campaign, written against the `sluice:circuit`
//! bindings directly (no SDK): everything a replay must reproduce that an
//! SDK circuit does not exercise.
//!
//! Input port `in` takes JSON values (inserts and deletes). Each step counts
//! them in a fresh `HashMap` (whose iteration order differs between
//! instances) and emits, in that order, one event per value with the net
//! count as its weight and the value `{"v": value, "t": clock ms, "r": a WASI
//! random number, "k": steps seen}` on output `out`. The step count `k` is
//! the instance's state, carried through snapshots. A replay of a step must
//! give the same events (I4): same clock, same random numbers, same state;
//! the campaign checks the sum of weights per `v` against the input.

#![cfg(target_arch = "wasm32")]

use std::cell::Cell;
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

thread_local! {
    /// Steps this instance has run (restored from snapshots).
    static STEPS: Cell<u64> = const { Cell::new(0) };
}

struct Noisy;

/// The shard the step count lies in.
const STATE_SHARD: u32 = 0;

/// A WASI random number (the host seeds it per step).
fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).unwrap_or_default();
    u64::from_le_bytes(bytes)
}

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

impl Guest for Noisy {
    fn describe() -> CircuitInfo {
        CircuitInfo {
            inputs: vec!["in".into()],
            outputs: vec!["out".into()],
            snapshot_version: 1,
            // Its state (a step count) is its own, not an SDK operator's.
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
        let k = STEPS.get() + 1;
        STEPS.set(k);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        let r = random_u64();
        let events = counts
            .into_iter()
            .filter(|(_, n)| *n != 0)
            .map(|(value, weight)| {
                let v = String::from_utf8_lossy(&value);
                (
                    format!("{{\"v\":{v},\"t\":{t},\"r\":{r},\"k\":{k}}}").into_bytes(),
                    weight,
                )
            })
            .collect::<Vec<_>>();
        Ok(vec![batch(events)])
    }

    /// The step count lies in shard 0 (it is the instance's, not a key's:
    /// pieces of it add up wherever they land).
    /// Always whole (`changed` none), which the host must accept.
    fn snapshot(_changed_only: bool) -> Result<StateSnapshot, CircuitError> {
        Ok(StateSnapshot {
            pieces: vec![ShardState {
                shard: STATE_SHARD,
                state: STEPS.get().to_le_bytes().to_vec(),
            }],
            changed: None,
        })
    }

    fn restore(pieces: Vec<ShardState>) -> Result<(), CircuitError> {
        for piece in pieces {
            let bytes: [u8; 8] = piece
                .state
                .try_into()
                .map_err(|_| CircuitError::IncompatibleSnapshot("expected 8 bytes".into()))?;
            STEPS.set(STEPS.get() + u64::from_le_bytes(bytes));
        }
        Ok(())
    }

    fn upgrade(pieces: Vec<ShardState>, _start_empty: Vec<String>) -> Result<(), CircuitError> {
        Self::restore(pieces)
    }

    fn export_shards(shards: Vec<u32>) -> Result<Vec<ShardState>, CircuitError> {
        if !shards.contains(&STATE_SHARD) {
            return Ok(Vec::new());
        }
        let pieces = Self::snapshot(false)?.pieces;
        STEPS.set(0);
        Ok(pieces)
    }

    fn set_workers(_workers: u32) {}
}

bindings::export!(Noisy with_types_in bindings);
