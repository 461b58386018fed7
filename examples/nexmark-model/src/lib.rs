//! The Nexmark benchmark's records, as `sluice gen nexmark` writes them (one
//! JSON object per line in `person.jsonl`, `auction.jsonl`, `bid.jsonl`).
//! Times are milliseconds since the epoch; states are lower-case.

use serde::{Deserialize, Serialize};

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

/// The UTC day of `ms` (milliseconds since the epoch) as `yyyy-MM-dd`, as
/// Flink's `DATE_FORMAT(dateTime, 'yyyy-MM-dd')` writes it (q15–q17 group
/// by it). The proleptic Gregorian calendar, from the day number.
pub fn day(ms: u64) -> String {
    // Howard Hinnant's civil_from_days, for days since 1970-01-01.
    let z = (ms / 86_400_000) as i64 + 719_468;
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

#[cfg(test)]
mod tests {
    use super::day;

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
}
