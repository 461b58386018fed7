//! Nexmark q9, winning bids: every auction with its winning bid, the
//! highest among the bids placed while it was open (the earliest of equal
//! prices), as `(auction, bid)`.
//!
//! Follows the Flink nexmark SQL (`ROW_NUMBER() OVER (PARTITION BY A.id
//! ORDER BY B.price DESC, B.dateTime ASC)`, row 1, over bids with
//! `B.dateTime BETWEEN A.dateTime AND A.expires`). Deviation: bids equal
//! in price and time, which the SQL leaves to chance, are decided by the
//! rest of the bid (the smallest by its fields in order wins), so the
//! result is one answer, not one of several.

use nexmark_model::{Auction, Bid};
use sluice_guest::Circuit;
use std::cmp::Reverse;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    let auctions = c.input::<Auction>("auction").key_by(|a| a.id);
    let bids = c.input::<Bid>("bid").key_by(|b| b.auction);
    // The winner per auction id, then the auction joined back: the groups
    // of the top-1 keep bids only.
    let winners = auctions
        .join(&bids, |_, a, b| {
            let open = a.date_time <= b.date_time && b.date_time <= a.expires;
            (a.id, open, b.clone())
        })
        .filter(|(_, open, _)| *open)
        .top_k_by_owned(
            |(id, ..)| *id,
            |(.., b)| (b.price, Reverse((b.date_time, b))),
            1,
        )
        .key_by(|(id, _)| *id);
    auctions
        .join(&winners, |_, a, (_, (_, Reverse((_, b))))| {
            (a.clone(), b.clone())
        })
        .output("winning_bids");
}

sluice_guest::circuit!(build);
