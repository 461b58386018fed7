//! `sluice chaos`: crash and fault campaigns against the exactly-once
//! promise, each trial's integrated output compared with a from-scratch
//! computation and its logs audited.
//!
//! - [`local`]: `sluice chaos`, the campaign on one host: child
//!   `sluice run`s crashed at named crash points or killed at random, and
//!   restarted until they finish;
//! - [`hosts`]: `sluice chaos --hosts`, the campaign across hosts: worker
//!   hosts killed, stalled, joining and leaving, and the leader crashing,
//!   around a running pipeline.
//!
//! What they share is here: the trials' random numbers ([`Rng`]); the
//! reports and the comparison of output are in `report`.

pub mod hosts;
pub mod local;
/// The worker hosts of the campaign across hosts, behind proxies.
mod proxy;
/// The reports of both campaigns, and the comparison of output.
mod report;
/// The workloads of the one-host campaign.
mod workloads;

pub use hosts::chaos_hosts;
pub use local::{ChaosOptions, chaos};
pub use report::{ChaosReport, HostsChaosReport};

/// xorshift64*, seeded per trial.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// The generator of the trial with `seed` (spread, and never zero).
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// The next number, below `n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}
