//! The host's bindings of the `sluice:circuit` world, generated once here.
//! Generated types stay inside this crate; the rest of the host uses
//! [`sluice_core::Event`] and the runtime's own types, converted at the edge
//! (the worker).

#![allow(missing_docs)]

wasmtime::component::bindgen!({
    world: "pipeline-worker",
    path: "../../wit",
    imports: { default: async | trappable },
    exports: { default: async },
    // A failed shuffle is the host's typed error: the worker turns it into
    // the WIT `exchange-error` the guest sees, and remembers the cause.
    trappable_error_type: {
        "sluice:circuit/exchange.exchange-error" => crate::error::ExchangeError,
    },
});

// Name the WIT files to cargo, so that a change to them rebuilds the host
// (the macro alone does not make cargo watch them).
const _: [&str; 4] = [
    include_str!("../../../wit/types.wit"),
    include_str!("../../../wit/exchange.wit"),
    include_str!("../../../wit/circuit.wit"),
    include_str!("../../../wit/worlds.wit"),
];

pub(crate) use self::exports::sluice::circuit::circuit::{CircuitError, ShardState, WorkerInfo};
pub(crate) use self::sluice::circuit::exchange::ExchangeError as WitExchangeError;
pub(crate) use self::sluice::circuit::types::{Batch, KeyedEvents};

/// The world's fully qualified name, for error messages.
pub const WORLD: &str = "sluice:circuit/pipeline-worker@0.4.0";
/// The export a component must provide.
pub const CIRCUIT_EXPORT: &str = "sluice:circuit/circuit@0.4.0";
