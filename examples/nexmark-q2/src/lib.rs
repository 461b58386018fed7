//! Nexmark q2, selection: `(auction, price)` of the bids on auctions whose
//! id is a multiple of 123.

use nexmark_model::BidNumbers;
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    // Read as the bid's numbers: the decoder skips the rest of each line.
    c.input::<BidNumbers>("bid")
        .filter(|b| b.auction.is_multiple_of(123))
        .map(|b| (b.auction, b.price))
        .output("selected");
}

sluice_guest::circuit!(build);
