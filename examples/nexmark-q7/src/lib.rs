//! Nexmark q7, highest bid: in every 10-second tumbling window, the bids
//! with the window's highest price, as `(window start, auction, price,
//! bidder, date_time)`.

use nexmark_model::Bid;
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    let windowed = c
        .input::<Bid>("bid")
        .tumbling(|b| b.date_time as i64, 10_000);
    let highest = windowed
        .max_by(|(w, _)| *w, |(_, b)| b.price)
        .key_by(|(w, price)| (*w, *price));
    windowed
        .key_by(|(w, b)| (*w, b.price))
        .join(&highest, |_, (w, b), _| {
            (w.start, b.auction, b.price, b.bidder, b.date_time)
        })
        .output("highest_bids");
}

sluice_guest::circuit!(build);
