//! Nexmark q5, hot items: in every 10-second window sliding by 2 seconds,
//! the auctions with the most bids, as `(window start, auction, bids)`.
//!
//! Follows the Flink nexmark SQL (`HOP(bid, dateTime, 2 s, 10 s)`, count
//! per auction and window, joined with the window's maximum on
//! `num >= maxn`). Deviation: the window's start is in the output, so a
//! row says which window it is the hottest of.

use nexmark_model::BidNumbers;
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    let counts = c
        // Read as the bid's numbers: the decoder skips its channel, URL and
        // padding, and each bid enters its five windows as four integers.
        .input::<BidNumbers>("bid")
        .hopping(|b| b.date_time as i64, 10_000, 2_000)
        .count_by(|(w, b)| (w.start, b.auction));
    let most = counts
        .max_by(|((start, _), _)| *start, |(_, n)| *n)
        .key_by(|(start, n)| (*start, *n));
    counts
        .key_by(|((start, _), n)| (*start, *n))
        .join(&most, |_, ((start, auction), n), _| (*start, *auction, *n))
        .output("hot_items");
}

sluice_guest::circuit!(build);
