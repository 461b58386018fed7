//! Nexmark q4, average price per category: the winning (highest) bid of
//! every auction, among bids placed while it was open, averaged per
//! category. A join, a keyed max and a keyed average, all incremental.

use nexmark_model::{Auction, BidNumbers};
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    // Only what the result names: the join keeps every auction, and its
    // name, description and padding are most of its bytes.
    let auctions = c
        .input::<Auction>("auction")
        .map(|a| (a.id, a.category, a.date_time, a.expires))
        .key_by(|a| a.0);
    let bids = c
        // Read as the bid's numbers: the decoder skips the rest of each line.
        .input::<BidNumbers>("bid")
        .map(|b| (b.auction, b.price, b.date_time))
        .key_by(|b| b.0);
    auctions
        .join(
            &bids,
            |id, (_, category, opened, expires), (_, price, at)| {
                (*id, *category, *price, opened <= at && at <= expires)
            },
        )
        .filter(|(_, _, _, open)| *open)
        .max_by(
            |(id, category, _, _)| (*id, *category),
            |(_, _, price, _)| *price,
        )
        .avg_by(|((_, category), _)| *category, |(_, price)| *price as i64)
        .output("avg_price_per_category");
}

sluice_guest::circuit!(build);
