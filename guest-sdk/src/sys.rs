//! The WIT glue: the only module that touches wit-bindgen. It turns the
//! component's exports into calls on a [`CircuitInstance`] and implements
//! [`Exchange`] with the host's `exchange.shuffle` import.
//!
//! Users never name anything here; [`circuit!`](crate::circuit!) does.

use crate::exchange::{Exchange, KeyedBatch};
use crate::{Circuit, CircuitInstance, Error, EventBatch};
use std::cell::RefCell;

#[doc(hidden)]
pub use wit_bindgen::rt;

/// Bindings generated from `wit/`.
#[doc(hidden)]
#[allow(missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "pipeline-worker",
        path: "../wit",
        pub_export_macro: true,
        export_macro_name: "__sluice_export",
        default_bindings_module: "sluice_guest::sys::bindings",
        runtime_path: "sluice_guest::sys::rt",
    });
}

use bindings::sluice::circuit::types as wit;

// The bindings are generated from these files, which the macro does not
// report to cargo: naming them here makes a change to the WIT rebuild this
// crate (and every circuit).
const _: [&str; 4] = [
    include_str!("../../wit/types.wit"),
    include_str!("../../wit/exchange.wit"),
    include_str!("../../wit/circuit.wit"),
    include_str!("../../wit/worlds.wit"),
];

#[doc(hidden)]
pub use bindings::exports::sluice::circuit::circuit::Guest;
#[doc(hidden)]
pub use wit::{Batch, CircuitError, CircuitInfo, ShardState, StateSnapshot, WorkerInfo};

thread_local! {
    /// The instance's circuit: built by `init`, used by every later call.
    static INSTANCE: RefCell<Option<CircuitInstance>> = const { RefCell::new(None) };
    /// The pipeline's number of workers, from `init`.
    static WORKERS: std::cell::Cell<u32> = const { std::cell::Cell::new(1) };
}

impl From<Error> for CircuitError {
    fn from(e: Error) -> Self {
        match e {
            Error::BadInput { .. } => CircuitError::BadInput(e.to_string()),
            Error::IncompatibleSnapshot(m) => CircuitError::IncompatibleSnapshot(m),
            Error::Protocol(m) => CircuitError::Protocol(m),
            Error::Failed(m) => CircuitError::Failed(m),
        }
    }
}

fn with_instance<R>(
    f: impl FnOnce(&mut CircuitInstance) -> Result<R, Error>,
) -> Result<R, CircuitError> {
    INSTANCE.with_borrow_mut(|slot| match slot {
        Some(instance) => f(instance).map_err(CircuitError::from),
        None => Err(CircuitError::Protocol("called before init".into())),
    })
}

/// `describe` export.
#[doc(hidden)]
pub fn describe(build: fn(&mut Circuit)) -> CircuitInfo {
    match CircuitInstance::build(build) {
        Ok(c) => CircuitInfo {
            inputs: c.inputs().to_vec(),
            outputs: c.outputs().to_vec(),
            snapshot_version: c.snapshot_version(),
            operators: c
                .operators()
                .into_iter()
                .map(|o| wit::OperatorInfo {
                    aliases: o.aliases,
                    id: o.id,
                    kind: o.kind,
                    fingerprint: o.fingerprint,
                    state_shape: o.state_types,
                    migrates_from: o.migrates_from,
                })
                .collect(),
        },
        // `init` reports the build error; describe has no error channel.
        Err(_) => CircuitInfo {
            inputs: vec![],
            outputs: vec![],
            snapshot_version: 0,
            operators: vec![],
        },
    }
}

/// `init` export.
#[doc(hidden)]
pub fn init(build: fn(&mut Circuit), info: WorkerInfo) -> Result<(), CircuitError> {
    let instance = CircuitInstance::build(build)?;
    WORKERS.set(info.workers.max(1));
    INSTANCE.with_borrow_mut(|slot| match slot {
        Some(_) => Err(CircuitError::Protocol("init called twice".into())),
        None => {
            *slot = Some(instance);
            Ok(())
        }
    })
}

/// `step` export. The host's buffers become the step's input batches as
/// they are, and the output batches go back as they are.
#[doc(hidden)]
pub fn step(inputs: Vec<Batch>) -> Result<Vec<Batch>, CircuitError> {
    with_instance(|c| {
        let mut ports: Vec<EventBatch> = vec![EventBatch::new(); c.inputs().len()];
        for batch in inputs {
            let slot = ports.get_mut(batch.port as usize).ok_or_else(|| {
                Error::Protocol(format!("input batch for unknown port {}", batch.port))
            })?;
            let events = EventBatch::from_parts(batch.values, batch.ends, batch.weights)
                .map_err(|_| Error::Protocol(format!("malformed batch for port {}", batch.port)))?;
            if slot.is_empty() {
                *slot = events;
            } else {
                for (value, weight) in events.iter() {
                    slot.push(value, weight)?;
                }
            }
        }
        let outputs = c.step_batches(ports, &mut HostExchange)?;
        Ok(outputs
            .into_iter()
            .enumerate()
            .filter(|(_, events)| !events.is_empty())
            .map(|(port, events)| {
                let (values, ends, weights) = events.into_parts();
                Batch {
                    port: port as u32,
                    values,
                    ends,
                    weights,
                }
            })
            .collect())
    })
}

fn to_wit_pieces(pieces: crate::Pieces) -> Vec<ShardState> {
    pieces
        .into_iter()
        .map(|(shard, state)| ShardState { shard, state })
        .collect()
}

/// `snapshot` export: incremental when asked (the SDK's keyed operators
/// track their changed shards; the others count as changed everywhere).
#[doc(hidden)]
pub fn snapshot(changed_only: bool) -> Result<StateSnapshot, CircuitError> {
    with_instance(|c| {
        if changed_only {
            let (changed, pieces) = c.snapshot_changed()?;
            Ok(StateSnapshot {
                pieces: to_wit_pieces(pieces),
                changed: Some(changed),
            })
        } else {
            Ok(StateSnapshot {
                pieces: to_wit_pieces(c.snapshot()?),
                changed: None,
            })
        }
    })
}

/// `restore` export.
#[doc(hidden)]
pub fn restore(pieces: Vec<ShardState>) -> Result<(), CircuitError> {
    let pieces: crate::Pieces = pieces.into_iter().map(|p| (p.shard, p.state)).collect();
    with_instance(|c| c.restore(&pieces))
}

/// `upgrade` export.
#[doc(hidden)]
pub fn upgrade(pieces: Vec<ShardState>, start_empty: Vec<String>) -> Result<(), CircuitError> {
    let pieces: crate::Pieces = pieces.into_iter().map(|p| (p.shard, p.state)).collect();
    with_instance(|c| c.upgrade(&pieces, &start_empty))
}

/// `export-shards` export.
#[doc(hidden)]
pub fn export_shards(shards: Vec<u32>) -> Result<Vec<ShardState>, CircuitError> {
    with_instance(|c| c.export_shards(&shards).map(to_wit_pieces))
}

/// `set-workers` export.
#[doc(hidden)]
pub fn set_workers(workers: u32) {
    WORKERS.set(workers.max(1));
}

/// The host's exchange, reached through the `exchange` import.
struct HostExchange;

impl Exchange for HostExchange {
    fn shuffle(&mut self, channel: u32, events: KeyedBatch) -> crate::Result<KeyedBatch> {
        use bindings::sluice::circuit::exchange::{ExchangeError, shuffle};
        let (keys, key_ends, values, ends, weights) = events.into_parts();
        let sent = wit::KeyedEvents {
            keys,
            key_ends,
            values,
            ends,
            weights,
        };
        match shuffle(channel, &sent) {
            Ok(got) => {
                drop(sent);
                KeyedBatch::from_parts(got.keys, got.key_ends, got.values, got.ends, got.weights)
                    .map_err(|_| {
                        Error::Failed("exchange: the host returned a malformed batch".into())
                    })
            }
            // The step fails; the host already knows why and reports it.
            Err(ExchangeError::ContractViolation(m) | ExchangeError::Aborted(m)) => {
                Err(Error::Failed(format!("exchange: {m}")))
            }
        }
    }

    fn workers(&self) -> u32 {
        WORKERS.get()
    }
}
