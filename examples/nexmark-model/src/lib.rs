//! The Nexmark benchmark's records, as `sluice gen nexmark` writes them (one
//! JSON object per line in `person.jsonl`, `auction.jsonl`, `bid.jsonl`).
//! Times are milliseconds since the epoch; states are lower-case.

use serde::{Deserialize, Serialize};

mod counters;
pub use counters::{BidStats, COUNTERS, CountedBid, Counters, bid_counters};
pub use sluice_guest::SharedStr;

/// Someone who sells or bids.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Person {
    /// Unique id.
    pub id: u64,
    /// Full name.
    pub name: String,
    /// E-mail address.
    pub email_address: String,
    /// Credit card number.
    pub credit_card: String,
    /// City.
    pub city: String,
    /// US state, lower-case (`"or"`, `"id"`, `"ca"`, …).
    pub state: String,
    /// When the person registered.
    pub date_time: u64,
    /// Padding.
    pub extra: String,
}

/// An item for sale.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Auction {
    /// Unique id.
    pub id: u64,
    /// Item name.
    pub item_name: String,
    /// Item description.
    pub description: String,
    /// Starting price.
    pub initial_bid: u64,
    /// Reserve price.
    pub reserve: u64,
    /// When the auction opened.
    pub date_time: u64,
    /// When it closes.
    pub expires: u64,
    /// The seller's person id.
    pub seller: u64,
    /// Category id.
    pub category: u64,
    /// Padding.
    pub extra: String,
}

/// A bid on an auction.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Bid {
    /// The auction's id.
    pub auction: u64,
    /// The bidder's person id.
    pub bidder: u64,
    /// Price in cents.
    pub price: u64,
    /// Channel the bid came through.
    pub channel: String,
    /// Referring URL.
    pub url: String,
    /// When the bid was placed.
    pub date_time: u64,
    /// Padding.
    pub extra: String,
}

/// Milliseconds in a day.
pub const DAY_MS: u64 = 86_400_000;

/// A bid's numbers, without its channel, URL and padding (most of its
/// bytes). A query that reads only these declares its input as
/// `BidNumbers`: each line is decoded into four integers, and the decoder
/// skips the other fields without building them, as a SQL engine pushes a
/// projection into its scan.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BidNumbers {
    /// The auction's id.
    pub auction: u64,
    /// The bidder's person id.
    pub bidder: u64,
    /// Price in cents.
    pub price: u64,
    /// When the bid was placed.
    pub date_time: u64,
}

/// [`BidNumbers`] and the channel (q16's input). The channel is a
/// [`SharedStr`]: q16 copies it into the keys of its operators, about a
/// dozen times per bid.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BidOnChannel {
    /// The auction's id.
    pub auction: u64,
    /// The bidder's person id.
    pub bidder: u64,
    /// Price in cents.
    pub price: u64,
    /// Channel the bid came through.
    pub channel: SharedStr,
    /// When the bid was placed.
    pub date_time: u64,
}

/// A bid's auction, bidder, price, channel and URL: a bid without its time
/// and padding (q21's and q22's input; the decoder skips the padding).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BidWithUrl {
    /// The auction's id.
    pub auction: u64,
    /// The bidder's person id.
    pub bidder: u64,
    /// Price in cents.
    pub price: u64,
    /// Channel the bid came through.
    pub channel: String,
    /// Referring URL.
    pub url: String,
}

/// Milliseconds in a minute.
pub const MINUTE_MS: u64 = 60_000;

/// The UTC day of `ms` (milliseconds since the epoch) as `yyyy-MM-dd`, as
/// Flink's `DATE_FORMAT(dateTime, 'yyyy-MM-dd')` writes it (q15–q17 group
/// by it). The proleptic Gregorian calendar, from the day number.
pub fn day(ms: u64) -> String {
    // Howard Hinnant's civil_from_days, for days since 1970-01-01.
    let z = (ms / DAY_MS) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The UTC hour and minute of `ms` as `HH:mm` (Flink's
/// `DATE_FORMAT(dateTime, 'HH:mm')`).
pub fn hour_minute(ms: u64) -> String {
    let minute = ms / MINUTE_MS % 1_440;
    format!("{:02}:{:02}", minute / 60, minute % 60)
}

/// A 64-bit FNV-1a hash of `text`. A key that leads with it, as
/// `(fingerprint(&s), s)`, sorts the same texts together and compares
/// unequal ones by an integer almost always: in the guest, a string
/// comparison is a call that walks bytes, and a key's tree search makes
/// a dozen of them.
pub fn fingerprint(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A price's rank in q15–q17: 0 under 10 000, 1 under 1 000 000, 2 from
/// there on.
pub fn price_rank(price: u64) -> usize {
    match price {
        ..10_000 => 0,
        10_000..1_000_000 => 1,
        _ => 2,
    }
}

/// A row of q13's side input: a key and its value.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SideInput {
    /// The key bids are joined on (`auction % 10 000`).
    pub key: u64,
    /// Its value.
    pub value: String,
}

#[cfg(test)]
mod tests {
    use super::{day, hour_minute, price_rank};

    #[test]
    fn days_are_utc_calendar_dates() {
        assert_eq!(day(0), "1970-01-01");
        assert_eq!(day(86_399_999), "1970-01-01");
        assert_eq!(day(86_400_000), "1970-01-02");
        // 2023-11-14T22:13:20Z, the generator's base time.
        assert_eq!(day(1_700_000_000_000), "2023-11-14");
        // A leap day and the turn of a century that is a leap year.
        assert_eq!(day(951_782_400_000), "2000-02-29");
        assert_eq!(day(951_868_800_000), "2000-03-01");
        assert_eq!(day(1_704_067_199_999), "2023-12-31");
        assert_eq!(day(1_704_067_200_000), "2024-01-01");
    }

    #[test]
    fn minutes_and_ranks() {
        assert_eq!(hour_minute(1_700_000_000_000), "22:13");
        assert_eq!(hour_minute(86_399_999), "23:59");
        assert_eq!(
            [9_999, 10_000, 999_999, 1_000_000].map(price_rank),
            [0, 1, 1, 2]
        );
    }
}
