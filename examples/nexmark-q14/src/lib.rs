//! Nexmark q14, calculation: the bids whose price in euro (`0.908 *
//! price`) is over 1 000 000 and under 50 000 000, as `(auction, bidder,
//! euro price, time of day, date_time, extra, c's in extra)`. The time of
//! day is `dayTime` from 8:00 to 18:59, `nightTime` up to 6:59 and from
//! 20:00, else `otherTime` (UTC hours).
//!
//! Follows the Flink nexmark SQL (its `count_char` UDF counts the `c`s).
//! The euro price is a float here, a DECIMAL there.

use nexmark_model::Bid;
use sluice_guest::{Circuit, OrdF64};

/// Output row.
pub type Row = (u64, u64, OrdF64, String, u64, String, u64);

/// The time of day of `ms` (UTC).
pub fn bid_time_type(ms: u64) -> &'static str {
    match ms / 3_600_000 % 24 {
        8..=18 => "dayTime",
        ..=6 | 20.. => "nightTime",
        _ => "otherTime",
    }
}

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    c.input::<Bid>("bid")
        .filter_map(|b| -> Option<Row> {
            let euro = 0.908 * b.price as f64;
            (1_000_000.0 < euro && euro < 50_000_000.0).then(|| {
                (
                    b.auction,
                    b.bidder,
                    OrdF64(euro),
                    bid_time_type(b.date_time).to_owned(),
                    b.date_time,
                    b.extra.clone(),
                    b.extra.matches('c').count() as u64,
                )
            })
        })
        .output("calculated");
}

sluice_guest::circuit!(build);
