//! Nexmark q15, bidding statistics report: per day, the bids, the
//! distinct bidders and the distinct auctions, in all and in each price
//! rank (under 10 000, under 1 000 000, the rest).
//!
//! Follows the Flink nexmark SQL (`count(*)`, `count(distinct bidder)`,
//! `count(distinct auction)`, each also `filter (where price …)`, `GROUP BY
//! DATE_FORMAT(dateTime, 'yyyy-MM-dd')`), with the day in UTC.
//!
//! Planned as an incremental SQL engine plans it (the model's
//! `bid_counters`): each `count(distinct x) filter (…)` is a `distinct` of
//! `(x, rank, day)` (and of `(x, day)`, fed by the first one's changes),
//! and one `sum_by` adds up the twelve counters per day, so a step's work
//! is its own bids, not the whole day's.

use nexmark_model::{BidNumbers, BidStats, DAY_MS, bid_counters, day};
use serde::{Deserialize, Serialize};
use sluice_guest::Circuit;

/// One day's figures.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Report {
    /// `yyyy-MM-dd`.
    pub day: String,
    /// The figures.
    #[serde(flatten)]
    pub stats: BidStats,
}

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    // Read as the bid's numbers: the decoder skips the rest of each line.
    bid_counters(&c.input::<BidNumbers>("bid"), |b| b.date_time / DAY_MS)
        .map(|(d, c)| Report {
            day: day(d * DAY_MS),
            stats: c.into(),
        })
        .output("bidding_stats");
}

sluice_guest::circuit!(build);
