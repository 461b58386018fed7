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

/// The UTC hour and minute of `ms` as `HH:mm` (Flink's
/// `DATE_FORMAT(dateTime, 'HH:mm')`).
pub fn hour_minute(ms: u64) -> String {
    let minute = ms / 60_000 % 1_440;
    format!("{:02}:{:02}", minute / 60, minute % 60)
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

/// q15's and q16's figures of a group of bids, folded (`fold_by`) over
/// their distinct `(id, price, minute)` values in order, each with its
/// count: bids in all and per price rank, distinct ids (bidders or
/// auctions) in all and per rank, and the latest `HH:mm`. The values of one
/// id come one after another, so distinct ids are counted without a set.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Figures {
    /// Bids in all and per rank.
    pub bids: (i64, [i64; 3]),
    /// Distinct ids in all and per rank.
    pub ids: (i64, [i64; 3]),
    /// The latest `HH:mm` of the bids.
    pub minute: String,
    /// The id of the values folded last, and the ranks it was counted in.
    current: Option<(u64, [bool; 3])>,
}

impl Figures {
    /// `self` with `n` more bids of value `(id, price, minute)`.
    pub fn add(mut self, (id, price, minute): &(u64, u64, String), n: i64) -> Figures {
        let rank = price_rank(*price);
        self.bids.0 += n;
        self.bids.1[rank] += n;
        let seen = match &mut self.current {
            Some((current, seen)) if current == id => seen,
            slot => {
                self.ids.0 += 1;
                &mut slot.insert((*id, [false; 3])).1
            }
        };
        if !seen[rank] {
            seen[rank] = true;
            self.ids.1[rank] += 1;
        }
        if *minute > self.minute {
            self.minute.clone_from(minute);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::{Figures, day, hour_minute, price_rank};

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
    fn minutes_ranks_and_figures() {
        assert_eq!(hour_minute(1_700_000_000_000), "22:13");
        assert_eq!(hour_minute(86_399_999), "23:59");
        assert_eq!(
            [9_999, 10_000, 999_999, 1_000_000].map(price_rank),
            [0, 1, 1, 2]
        );
        // Bidders 1 (two bids under 10 000, one over a million) and 2.
        let values = [
            ((1, 5, "10:00".to_owned()), 2),
            ((1, 2_000_000, "10:05".to_owned()), 1),
            ((2, 5, "09:00".to_owned()), 1),
        ];
        let f = values
            .iter()
            .fold(Figures::default(), |f, (v, n)| f.add(v, *n));
        assert_eq!(f.bids, (4, [3, 0, 1]));
        assert_eq!(f.ids, (2, [2, 0, 1]));
        assert_eq!(f.minute, "10:05");
    }
}
