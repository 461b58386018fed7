//! Nexmark q19, auction top-10 price: the ten highest bids of every
//! auction.
//!
//! Follows the Flink nexmark SQL (`ROW_NUMBER() OVER (PARTITION BY auction
//! ORDER BY price DESC)`, rows 1 to 10). Deviations: bids of equal price,
//! which the SQL leaves to chance, are decided by the rest of the bid (the
//! largest by its fields in order wins); the row number is not in the
//! output (each new bid in the top ten would renumber, so delete and
//! insert, every row below it).

use nexmark_model::Bid;
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    c.input::<Bid>("bid")
        .top_k_by_owned(|b| b.auction, |b| (b.price, b), 10)
        .map_owned(|(_, (_, b))| b)
        .output("top_bids");
}

sluice_guest::circuit!(build);
