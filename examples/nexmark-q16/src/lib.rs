//! Nexmark q16, channel statistics report: q15's figures per channel and
//! day, with the latest minute (`HH:mm`) of the group's bids.
//!
//! Follows the Flink nexmark SQL (`GROUP BY channel, DATE_FORMAT(dateTime,
//! 'yyyy-MM-dd')`, `max(DATE_FORMAT(dateTime, 'HH:mm'))`), with days and
//! minutes in UTC.

use nexmark_model::{Bid, Figures, day, hour_minute};
use serde::{Deserialize, Serialize};
use sluice_guest::Circuit;

/// One channel's figures of one day.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Report {
    /// The channel.
    pub channel: String,
    /// `yyyy-MM-dd`.
    pub day: String,
    /// The latest `HH:mm` of the bids.
    pub minute: String,
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
            |b| (b.channel.clone(), day(b.date_time)),
            move |b| (id(b), b.price, hour_minute(b.date_time)),
            Figures::default(),
            |f, v, n| f.add(v, n),
        )
        .key_by(|(group, _)| group.clone())
    };
    let bidders = fold(|b| b.bidder);
    let auctions = fold(|b| b.auction);
    bidders
        .join(&auctions, |(channel, day), (_, b), (_, a)| Report {
            channel: channel.clone(),
            day: day.clone(),
            minute: b.minute.clone(),
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
        .output("channel_stats");
}

sluice_guest::circuit!(build);
