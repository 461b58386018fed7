//! Nexmark q16, channel statistics report: q15's figures per channel and
//! day, with the latest minute (`HH:mm`) of the group's bids.
//!
//! Follows the Flink nexmark SQL (`GROUP BY channel, DATE_FORMAT(dateTime,
//! 'yyyy-MM-dd')`, `max(DATE_FORMAT(dateTime, 'HH:mm'))`), with days and
//! minutes in UTC.
//!
//! Planned as q15 (the model's `bid_counters`), per channel and day, joined
//! with the group's latest minute (`max_by`).

use nexmark_model::{
    BidOnChannel, BidStats, DAY_MS, MINUTE_MS, bid_counters, day, fingerprint, hour_minute,
};
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
    /// The figures.
    #[serde(flatten)]
    pub stats: BidStats,
}

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    // Read without the URL and padding: the decoder skips them.
    let bids = c.input::<BidOnChannel>("bid");
    // The channel's fingerprint before its text: see `fingerprint`. The
    // text is shared, not copied, into each aggregate's key.
    let group = |b: &BidOnChannel| {
        (
            b.date_time / DAY_MS,
            fingerprint(&b.channel),
            b.channel.clone(),
        )
    };
    // The latest minute of the day, as minutes since midnight: their order
    // is that of the `HH:mm` texts.
    let latest = bids.max_by(group, |b| b.date_time / MINUTE_MS % 1_440);
    bid_counters(&bids, group)
        .join(&latest, |(d, _, channel), c, minute| Report {
            channel: channel.to_string(),
            day: day(d * DAY_MS),
            minute: hour_minute(minute * MINUTE_MS),
            stats: c.into(),
        })
        .output("channel_stats");
}

sluice_guest::circuit!(build);
