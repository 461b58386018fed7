//! Nexmark q12, processing-time windows: bids per bidder in each
//! 10-second window, as `(bidder, bids, window start, window end)`.
//!
//! Deviation from the Flink nexmark SQL: its windows are over processing
//! time (`PROCTIME()`), which no replay could reproduce; these are over the
//! bid's event time, so the result is the same however the steps fall.

use nexmark_model::BidNumbers;
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    // Read as the bid's numbers: the decoder skips its channel, URL and
    // padding (most of its bytes).
    c.input::<BidNumbers>("bid")
        .map(|b| (b.bidder, b.date_time))
        .tumbling(|(_, at)| *at as i64, 10_000)
        .count_by(|(w, (bidder, _))| (*bidder, *w))
        .map(|((bidder, w), bids)| (*bidder, *bids, w.start, w.end))
        .output("bids_per_window");
}

sluice_guest::circuit!(build);
