//! Nexmark q20, expand bid with auction: every bid on an auction of
//! category 10, with the auction, as `(bid, auction)`.
//!
//! Follows the Flink nexmark SQL (`bid JOIN auction ON B.auction = A.id
//! WHERE A.category = 10`).

use nexmark_model::{Auction, Bid};
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    let auctions = c
        .input::<Auction>("auction")
        .filter(|a| a.category == 10)
        .key_by(|a| a.id);
    c.input::<Bid>("bid")
        .key_by(|b| b.auction)
        .join(&auctions, |_, b, a| (b.clone(), a.clone()))
        .output("expanded_bids");
}

sluice_guest::circuit!(build);
