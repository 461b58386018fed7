//! Nexmark q10, log to file system: every bid as `(auction, bidder, price,
//! date_time, extra, day, minute)`, the day as `yyyy-MM-dd` and the minute
//! as `HH:mm` (UTC), on the output port `fs_sink`.
//!
//! Follows the Flink nexmark SQL. Deviation: Flink's sink writes files
//! partitioned by day and minute; here the host writes the port as a file
//! (`sluice run --output fs_sink=FILE`, one JSON line per change), and
//! partitioning is left to whoever reads it.

use nexmark_model::{Bid, day, hour_minute};
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    c.input::<Bid>("bid")
        // By value: each bid's padding moves into its row, not copied.
        .map_owned(|b| {
            (
                b.auction,
                b.bidder,
                b.price,
                b.date_time,
                b.extra,
                day(b.date_time),
                hour_minute(b.date_time),
            )
        })
        .output("fs_sink");
}

sluice_guest::circuit!(build);
