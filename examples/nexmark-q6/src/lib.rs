//! Nexmark q6, average selling price by seller: per seller, the average
//! final price of their last ten auctions, as `(seller, average)`.
//!
//! Follows the Nexmark definition (Flink's SQL for q6, `AVG(final) OVER
//! (PARTITION BY seller ORDER BY dateTime ROWS 10 PRECEDING)`, is marked
//! unsupported there and does not parse as written). The final price is
//! the highest bid placed while the auction was open, as in q4 and q9; an
//! auction's "last" is by its closing time (`expires`, then its id), and
//! every auction with a bid counts as closed in the final result.

use nexmark_model::{Auction, BidNumbers};
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    // Only what the result names: the join keeps every auction, and its
    // name, description and padding are most of its bytes.
    let auctions = c
        .input::<Auction>("auction")
        .map(|a| (a.id, a.seller, a.date_time, a.expires))
        .key_by(|a| a.0);
    let bids = c
        // Read as the bid's numbers: the decoder skips the rest of each line.
        .input::<BidNumbers>("bid")
        .map(|b| (b.auction, b.price, b.date_time))
        .key_by(|b| b.0);
    auctions
        .join(&bids, |_, (id, seller, opened, expires), (_, price, at)| {
            let open = opened <= at && at <= expires;
            (*id, *seller, *expires, *price, open)
        })
        .filter(|(.., open)| *open)
        .max_by(
            |(id, seller, expires, ..)| (*id, *seller, *expires),
            |(_, _, _, price, _)| *price,
        )
        .top_k_by(
            |((_, seller, _), _)| *seller,
            |((id, _, expires), price)| (*expires, *id, *price),
            10,
        )
        .avg_by(|(seller, _)| *seller, |(_, (_, _, price))| *price as i64)
        .output("avg_price_per_seller");
}

sluice_guest::circuit!(build);
