//! Nexmark q0, pass-through: every bid, unchanged. Measures the platform's
//! own cost (decode, step, encode, commit).

use nexmark_model::Bid;
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    c.input::<Bid>("bid").output("bids");
}

sluice_guest::circuit!(build);
