//! Nexmark q15, bidding statistics report: per day, the bids, the
//! distinct bidders and the distinct auctions, in all and in each price
//! rank (under 10 000, under 1 000 000, the rest).
//!
//! Follows the Flink nexmark SQL (`count(*)`, `count(distinct bidder)`,
//! `count(distinct auction)`, each also `filter (where price …)`, `GROUP BY
//! DATE_FORMAT(dateTime, 'yyyy-MM-dd')`), with the day in UTC. Two folds per
//! day, over `(bidder, price, minute)` and over `(auction, price, minute)`
//! (`Figures` of the model; the minute is q16's), joined.

use nexmark_model::{Bid, Figures, day, hour_minute};
use serde::{Deserialize, Serialize};
use sluice_guest::Circuit;

/// One day's figures.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Report {
    /// `yyyy-MM-dd`.
    pub day: String,
    /// Bids.
    pub total_bids: i64,
    /// Bids under 10 000.
    pub rank1_bids: i64,
    /// Bids from 10 000 to under 1 000 000.
    pub rank2_bids: i64,
    /// Bids from 1 000 000.
    pub rank3_bids: i64,
    /// Distinct bidders.
    pub total_bidders: i64,
    /// Distinct bidders of rank-1 bids.
    pub rank1_bidders: i64,
    /// Distinct bidders of rank-2 bids.
    pub rank2_bidders: i64,
    /// Distinct bidders of rank-3 bids.
    pub rank3_bidders: i64,
    /// Distinct auctions.
    pub total_auctions: i64,
    /// Distinct auctions with rank-1 bids.
    pub rank1_auctions: i64,
    /// Distinct auctions with rank-2 bids.
    pub rank2_auctions: i64,
    /// Distinct auctions with rank-3 bids.
    pub rank3_auctions: i64,
}

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    let bids = c.input::<Bid>("bid");
    let fold = |id: fn(&Bid) -> u64| {
        bids.fold_by(
            |b| day(b.date_time),
            move |b| (id(b), b.price, hour_minute(b.date_time)),
            Figures::default(),
            |f, v, n| f.add(v, n),
        )
        .key_by(|(day, _)| day.clone())
    };
    let bidders = fold(|b| b.bidder);
    let auctions = fold(|b| b.auction);
    bidders
        .join(&auctions, |day, (_, b), (_, a)| Report {
            day: day.clone(),
            total_bids: b.bids.0,
            rank1_bids: b.bids.1[0],
            rank2_bids: b.bids.1[1],
            rank3_bids: b.bids.1[2],
            total_bidders: b.ids.0,
            rank1_bidders: b.ids.1[0],
            rank2_bidders: b.ids.1[1],
            rank3_bidders: b.ids.1[2],
            total_auctions: a.ids.0,
            rank1_auctions: a.ids.1[0],
            rank2_auctions: a.ids.1[1],
            rank3_auctions: a.ids.1[2],
        })
        .output("bidding_stats");
}

sluice_guest::circuit!(build);
