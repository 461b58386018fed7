//! The host's bindings of the `sluice:circuit` world, generated once here.
//! Generated types stay inside the runtime; the rest of the host uses
//! [`storage::Event`](crate::storage::Event) and friends.

#![allow(missing_docs)]

wasmtime::component::bindgen!({
    world: "pipeline-worker",
    path: "../wit",
    imports: { default: async | trappable },
    exports: { default: async },
});

pub(crate) use self::exports::sluice::circuit::circuit::{CircuitError, WorkerInfo};
pub(crate) use self::sluice::circuit::types::{Batch, Event};

/// The world's fully qualified name, for error messages.
pub const WORLD: &str = "sluice:circuit/pipeline-worker@0.1.0";
/// The export a component must provide.
pub const CIRCUIT_EXPORT: &str = "sluice:circuit/circuit@0.1.0";
