//! The WIT glue: the only module that touches wit-bindgen. It turns the
//! component's exports into calls on a [`CircuitInstance`] and implements
//! [`Exchange`] with the host's `exchange.shuffle` import.
//!
//! Users never name anything here; [`circuit!`](crate::circuit!) does.

use crate::exchange::{Exchange, RawEvent};
use crate::{Circuit, CircuitInstance, Error};
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
        },
        // `init` reports the build error; describe has no error channel.
        Err(_) => CircuitInfo {
            inputs: vec![],
            outputs: vec![],
            snapshot_version: 0,
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

/// `step` export.
#[doc(hidden)]
pub fn step(inputs: Vec<Batch>) -> Result<Vec<Batch>, CircuitError> {
    with_instance(|c| {
        let mut ports: Vec<Vec<RawEvent>> = vec![Vec::new(); c.inputs().len()];
        for batch in inputs {
            let slot = ports.get_mut(batch.port as usize).ok_or_else(|| {
                Error::Protocol(format!("input batch for unknown port {}", batch.port))
            })?;
            let values =
                Packed::new(&batch.values, &batch.ends, batch.weights.len()).ok_or_else(|| {
                    Error::Protocol(format!("malformed batch for port {}", batch.port))
                })?;
            slot.extend(values.zip(&batch.weights).map(|(value, weight)| RawEvent {
                key: Vec::new(),
                value: value.to_vec(),
                weight: *weight,
            }));
        }
        let outputs = c.step(ports, &mut HostExchange)?;
        Ok(outputs
            .into_iter()
            .enumerate()
            .filter(|(_, events)| !events.is_empty())
            .map(|(port, events)| {
                let (values, ends, weights) = pack(events.iter().map(|e| (&e.value[..], e.weight)));
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

/// The slices of a packed buffer: `ends[i]` is where slice `i` ends.
struct Packed<'a> {
    bytes: &'a [u8],
    ends: std::slice::Iter<'a, u32>,
    start: usize,
}

impl<'a> Packed<'a> {
    /// `None` unless there are `count` ends, ascending, within `bytes`.
    fn new(bytes: &'a [u8], ends: &'a [u32], count: usize) -> Option<Self> {
        let ascending = ends.windows(2).all(|w| w[0] <= w[1]);
        let within = ends.last().is_none_or(|e| *e as usize <= bytes.len());
        (ends.len() == count && ascending && within).then(|| Packed {
            bytes,
            ends: ends.iter(),
            start: 0,
        })
    }
}

impl<'a> Iterator for Packed<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let end = *self.ends.next()? as usize;
        let slice = &self.bytes[self.start..end];
        self.start = end;
        Some(slice)
    }
}

/// Packs `(bytes, weight)` pairs: the bytes back to back, where each ends,
/// the weights.
fn pack<'a>(items: impl Iterator<Item = (&'a [u8], i64)>) -> (Vec<u8>, Vec<u32>, Vec<i64>) {
    let (mut bytes, mut ends, mut weights) = (Vec::new(), Vec::new(), Vec::new());
    for (b, w) in items {
        bytes.extend_from_slice(b);
        ends.push(bytes.len() as u32);
        weights.push(w);
    }
    (bytes, ends, weights)
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
    fn shuffle(&mut self, channel: u32, events: Vec<RawEvent>) -> crate::Result<Vec<RawEvent>> {
        use bindings::sluice::circuit::exchange::{ExchangeError, shuffle};
        let (keys, key_ends, _) = pack(events.iter().map(|e| (&e.key[..], 0)));
        let (values, ends, weights) = pack(events.iter().map(|e| (&e.value[..], e.weight)));
        let sent = wit::KeyedEvents {
            keys,
            key_ends,
            values,
            ends,
            weights,
        };
        match shuffle(channel, &sent) {
            Ok(got) => {
                let n = got.weights.len();
                let malformed =
                    || Error::Failed("exchange: the host returned a malformed batch".into());
                let keys = Packed::new(&got.keys, &got.key_ends, n).ok_or_else(malformed)?;
                let values = Packed::new(&got.values, &got.ends, n).ok_or_else(malformed)?;
                Ok(keys
                    .zip(values)
                    .zip(&got.weights)
                    .map(|((key, value), weight)| RawEvent {
                        key: key.to_vec(),
                        value: value.to_vec(),
                        weight: *weight,
                    })
                    .collect())
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
