//! Nexmark q7, highest bid: in every 10-second tumbling window, the bids
//! with the window's highest price, as `(window start, auction, price,
//! bidder, date_time)`.

use nexmark_model::BidNumbers;
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    let windowed = c
        // Read as the bid's numbers: the decoder skips its channel, URL and
        // padding (most of its bytes), which the result does not name and
        // the window's group and the join would keep for every bid.
        .input::<BidNumbers>("bid")
        .map(|b| (b.auction, b.price, b.bidder, b.date_time))
        .tumbling(|(.., at)| *at as i64, 10_000);
    let highest = windowed
        .max_by(|(w, _)| *w, |(_, (_, price, ..))| *price)
        .key_by(|(w, price)| (*w, *price));
    windowed
        .key_by(|(w, (_, price, ..))| (*w, *price))
        .join(&highest, |_, (w, (auction, price, bidder, at)), _| {
            (w.start, *auction, *price, *bidder, *at)
        })
        .output("highest_bids");
}

sluice_guest::circuit!(build);
