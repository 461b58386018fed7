//! Nexmark q18, find last bid: the latest bid of every bidder on every
//! auction.
//!
//! Follows the Flink nexmark SQL (`ROW_NUMBER() OVER (PARTITION BY bidder,
//! auction ORDER BY dateTime DESC)`, row 1). Deviation: bids at the same
//! time, which the SQL leaves to chance, are decided by the rest of the bid
//! (the largest by its fields in order wins).

use nexmark_model::Bid;
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    c.input::<Bid>("bid")
        .top_k_by_owned(|b| (b.bidder, b.auction), |b| (b.date_time, b), 1)
        .map_owned(|(_, (_, b))| b)
        .output("last_bids");
}

sluice_guest::circuit!(build);
