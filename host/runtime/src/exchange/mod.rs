//! The exchange: routes keyed events between the W workers of a pipeline
//! within one step.
//!
//! A key is hashed into one of [`SHARDS`] shards ([`shard_of`], the hash the
//! guest SDK splits its state by); the pipeline's [`Layout`] says which
//! worker owns each shard. Every worker contributes once per channel per
//! step; when all have, each gets the events it owns, in worker order, so
//! the result is deterministic.
//!
//! **Across hosts** each host runs one [`Exchange`] for its own workers (a
//! *slot* of the pipeline's placement), joined to the others' by
//! links: once every local worker has contributed on a channel, the
//! host sends each other host one frame with everything its workers sent
//! that host's workers — frames batched per destination host, each host to
//! each host directly — and a round completes when the local workers and
//! every other host have contributed. Received events are concatenated in
//! global worker order whatever host they came from, so any placement of
//! the workers computes what one host computes. A failure (a broken
//! contract, a host that cannot be reached) fails the step on every host:
//! the failing host sends the others an abort frame, and every host that
//! hears of a failure first passes it on to the others (once per step), so
//! a host that the failing one cannot reach still learns of it.
//!
//! **Waits are bounded by progress**: a worker waiting for another slot's
//! part of a round fails the step once that slot has been silent — no
//! frame, no heartbeat — for the session timeout ([`liveness`]); a slot
//! that is slow but still heard from is waited for.

mod frame;
mod liveness;
mod rounds;
#[cfg(test)]
mod silence_tests;
#[cfg(test)]
mod tests;

pub use crate::error::ExchangeError;
pub(crate) use frame::{Frame, FrameBody, Link, Placement};
pub use rounds::Exchange;
pub use sluice_core::{Layout, SHARDS, shard_of};
