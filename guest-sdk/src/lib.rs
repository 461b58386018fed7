//! # sluice-guest: write Sluice circuits in Rust
//!
//! A circuit is a dataflow over *Z-sets*: each record carries a weight, +1
//! for an insert and −1 for a delete, and every operator turns the deltas of
//! one step into the deltas of its output, keeping whatever state it needs
//! (which the host checkpoints through [`CircuitInstance::snapshot`]).
//!
//! A whole circuit is a build function plus one macro call:
//!
//! ```
//! use sluice_guest::Circuit;
//!
//! fn build(c: &mut Circuit) {
//!     c.input::<String>("lines")
//!         .flat_map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
//!         .count_by(|w| w.clone())
//!         .output("counts");
//! }
//! sluice_guest::circuit!(build);
//! # fn main() {}
//! ```
//!
//! Compile the crate (with `crate-type = ["cdylib"]`) for `wasm32-wasip2`,
//! for example with `sluice build PATH`, and the result is a component the
//! Sluice host runs. The same circuit runs natively through
//! [`CircuitInstance`], which is how operators are tested.
//!
//! Values cross the ports as JSON (serde); inside the circuit, exchange and
//! snapshots use postcard.
//!
//! A `wasm32-wasip2` build links the SDK's own `memcmp` (eight bytes at a
//! time) in place of the C library's, which compares a byte at a time:
//! every comparison of strings in a circuit ends there. A crate that
//! defines `memcmp` itself cannot be linked beside it.

extern crate self as sluice_guest;

pub mod batch;
mod circuit;
pub mod codec;
mod error;
pub mod exchange;
mod identity;
#[cfg(any(all(target_arch = "wasm32", target_os = "wasi"), test))]
mod mem;
pub mod operator;
mod shared;
pub mod state;
// The WIT glue exists in the WebAssembly build only (wit-bindgen is a
// wasm32-only dependency): native builds use circuits through
// `CircuitInstance`.
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod sys;
mod table;
pub mod testing;
mod types;
mod upgrade;
pub mod zset;

pub use batch::{EventBatch, KeyedBatch};
pub use circuit::{Circuit, CircuitInstance, Data, Pieces, Stream};
pub use error::{Error, Result};
pub use identity::OperatorInfo;
pub use operator::Sum;
pub use shared::SharedStr;
pub use types::{OrdF64, Window};
pub use zset::{Weight, ZSet};

/// What circuit code usually needs.
pub mod prelude {
    pub use crate::{Circuit, Data, OrdF64, SharedStr, Stream, Weight, Window, ZSet};
    pub use serde::{Deserialize, Serialize};
}

#[doc(hidden)]
pub use serde as __serde;

/// Exports a circuit as the component's implementation of the
/// `sluice:circuit` world.
///
/// Takes the path of a `fn(&mut Circuit)` that builds the circuit. The
/// function runs once per worker instance (and again for `describe`), so it
/// must build the same graph every time.
#[macro_export]
macro_rules! circuit {
    ($build:path) => {
        // Only a WebAssembly build exports the world: a native build of the
        // same crate (tests, benchmarks) uses the circuit through
        // `CircuitInstance` and must not emit component export symbols.
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            #[doc(hidden)]
            pub struct __SluiceCircuit;

            impl $crate::sys::Guest for __SluiceCircuit {
                fn describe() -> $crate::sys::CircuitInfo {
                    $crate::sys::describe($build)
                }
                fn init(
                    info: $crate::sys::WorkerInfo,
                ) -> ::core::result::Result<(), $crate::sys::CircuitError> {
                    $crate::sys::init($build, info)
                }
                fn step(
                    inputs: ::std::vec::Vec<$crate::sys::Batch>,
                ) -> ::core::result::Result<
                    ::std::vec::Vec<$crate::sys::Batch>,
                    $crate::sys::CircuitError,
                > {
                    $crate::sys::step(inputs)
                }
                fn snapshot(
                    changed_only: bool,
                ) -> ::core::result::Result<$crate::sys::StateSnapshot, $crate::sys::CircuitError>
                {
                    $crate::sys::snapshot(changed_only)
                }
                fn restore(
                    pieces: ::std::vec::Vec<$crate::sys::ShardState>,
                ) -> ::core::result::Result<(), $crate::sys::CircuitError> {
                    $crate::sys::restore(pieces)
                }
                fn upgrade(
                    pieces: ::std::vec::Vec<$crate::sys::ShardState>,
                    start_empty: ::std::vec::Vec<::std::string::String>,
                ) -> ::core::result::Result<(), $crate::sys::CircuitError> {
                    $crate::sys::upgrade(pieces, start_empty)
                }
                fn export_shards(
                    shards: ::std::vec::Vec<u32>,
                ) -> ::core::result::Result<
                    ::std::vec::Vec<$crate::sys::ShardState>,
                    $crate::sys::CircuitError,
                > {
                    $crate::sys::export_shards(shards)
                }
                fn set_workers(workers: u32) {
                    $crate::sys::set_workers(workers)
                }
            }

            $crate::sys::bindings::__sluice_export!(__SluiceCircuit);
        };
    };
}
