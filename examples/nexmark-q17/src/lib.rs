//! Nexmark q17, auction statistics report: per auction and day, the number
//! of bids (all, and in three price ranks), and the lowest, highest,
//! average and total price, as `(auction, day, total_bids, rank1_bids,
//! rank2_bids, rank3_bids, min_price, max_price, avg_price, sum_price)`.
//!
//! Follows the Flink nexmark SQL (`GROUP BY auction, DATE_FORMAT(dateTime,
//! 'yyyy-MM-dd')`, ranks `price < 10 000`, `< 1 000 000`, the rest), with
//! the day in UTC.

use nexmark_model::{BidNumbers, day};
use serde::{Deserialize, Serialize};
use sluice_guest::{Circuit, OrdF64, Weight};

/// One group's figures, folded over its prices (each with its count).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Stats {
    /// Bids.
    pub total: i64,
    /// Bids under 10 000.
    pub rank1: i64,
    /// Bids from 10 000 to under 1 000 000.
    pub rank2: i64,
    /// Bids of 1 000 000 or more.
    pub rank3: i64,
    /// Lowest price.
    pub min: u64,
    /// Highest price.
    pub max: u64,
    /// Total price.
    pub sum: u64,
}

impl Stats {
    /// `self` with `n` more bids at `price` (prices come in increasing
    /// order: the first is the lowest).
    pub fn add(mut self, price: u64, n: Weight) -> Stats {
        if self.total == 0 {
            self.min = price;
        }
        self.total += n;
        match price {
            ..10_000 => self.rank1 += n,
            10_000..1_000_000 => self.rank2 += n,
            _ => self.rank3 += n,
        }
        self.max = self.max.max(price);
        self.sum += price * n as u64;
        self
    }
}

/// Output row.
pub type Row = (u64, String, i64, i64, i64, i64, u64, u64, OrdF64, u64);

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    // Read as the bid's numbers: the decoder skips the rest of each line.
    c.input::<BidNumbers>("bid")
        .fold_by(
            |b| (b.auction, day(b.date_time)),
            |b| b.price,
            Stats::default(),
            |s, price, n| s.add(*price, n),
        )
        .map(|((auction, day), s)| -> Row {
            let avg = OrdF64(s.sum as f64 / s.total as f64);
            let (t, r1, r2, r3) = (s.total, s.rank1, s.rank2, s.rank3);
            (
                *auction,
                day.clone(),
                t,
                r1,
                r2,
                r3,
                s.min,
                s.max,
                avg,
                s.sum,
            )
        })
        .output("auction_stats");
}

sluice_guest::circuit!(build);
