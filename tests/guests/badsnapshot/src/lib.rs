//! A circuit that counts its input strings, takes snapshots like any other,
//! and refuses every snapshot on `restore`: recovery of a pipeline running
//! it must fail that pipeline alone, with an error naming the restore.
//!
//! It implements the world by hand (instead of `circuit!`) to override
//! `restore`.

use sluice_guest::Circuit;

/// Builds the circuit: strings in, counts per string out.
pub fn build(c: &mut Circuit) {
    c.input::<String>("in")
        .count_by(|s| s.clone())
        .output("counts");
}

#[cfg(target_arch = "wasm32")]
mod component {
    use sluice_guest::sys::{
        self, Batch, CircuitError, CircuitInfo, Guest, ShardState, StateSnapshot, WorkerInfo,
    };

    struct BadSnapshot;

    impl Guest for BadSnapshot {
        fn describe() -> CircuitInfo {
            sys::describe(super::build)
        }
        fn init(info: WorkerInfo) -> Result<(), CircuitError> {
            sys::init(super::build, info)
        }
        fn step(inputs: Vec<Batch>) -> Result<Vec<Batch>, CircuitError> {
            sys::step(inputs)
        }
        fn snapshot(changed_only: bool) -> Result<StateSnapshot, CircuitError> {
            sys::snapshot(changed_only)
        }
        fn restore(_pieces: Vec<ShardState>) -> Result<(), CircuitError> {
            Err(CircuitError::IncompatibleSnapshot(
                "this guest refuses every snapshot".into(),
            ))
        }
        fn upgrade(
            _pieces: Vec<ShardState>,
            _start_empty: Vec<String>,
        ) -> Result<(), CircuitError> {
            Err(CircuitError::IncompatibleSnapshot(
                "this guest refuses every snapshot".into(),
            ))
        }
        fn export_shards(shards: Vec<u32>) -> Result<Vec<ShardState>, CircuitError> {
            sys::export_shards(shards)
        }
        fn set_workers(workers: u32) {
            sys::set_workers(workers)
        }
    }

    sys::bindings::__sluice_export!(BadSnapshot);
}
