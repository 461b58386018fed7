//! q15's and q16's counters of a group of bids, planned as an incremental
//! SQL engine plans `count(*) FILTER (…)` and `count(DISTINCT …) FILTER
//! (…)`: the distinct counts per rank are a `distinct` of `(id, rank,
//! group)`, and the distinct counts in all a `distinct` of `(id, group)`
//! fed by the first one's changes, so a step's work is its own bids, not
//! the whole group's; every bid, and every tuple when it first appears (or
//! last goes), adds 1 (or −1) to the counters it counts in; and one
//! `sum_by` adds the counters up per group.

use crate::{Bid, BidNumbers, BidOnChannel, price_rank};
use serde::{Deserialize, Serialize};
use sluice_guest::{Data, Stream};

/// How many counters [`bid_counters`] keeps per group.
pub const COUNTERS: usize = 12;

/// A group's counters: bids, distinct bidders and distinct auctions, each
/// in all and then per price rank ([`price_rank`]: under 10 000, under
/// 1 000 000, the rest). Slot 0 counts bids, 1–3 bids per rank, 4 distinct
/// bidders, 5–7 distinct bidders per rank, 8 distinct auctions, 9–11
/// distinct auctions per rank.
pub type Counters = [i64; COUNTERS];

/// A group's counters by name, as q15 and q16 report them (flattened
/// into their rows).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BidStats {
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

impl From<&Counters> for BidStats {
    fn from(c: &Counters) -> BidStats {
        BidStats {
            total_bids: c[0],
            rank1_bids: c[1],
            rank2_bids: c[2],
            rank3_bids: c[3],
            total_bidders: c[4],
            rank1_bidders: c[5],
            rank2_bidders: c[6],
            rank3_bidders: c[7],
            total_auctions: c[8],
            rank1_auctions: c[9],
            rank2_auctions: c[10],
            rank3_auctions: c[11],
        }
    }
}

/// The counters with 1 in `slots`.
fn counted(slots: &[usize]) -> Counters {
    let mut c = [0; COUNTERS];
    for slot in slots {
        c[*slot] = 1;
    }
    c
}

/// What [`bid_counters`] reads of a bid, whichever view of it a query's
/// input is.
pub trait CountedBid {
    /// The auction's id.
    fn auction(&self) -> u64;
    /// The bidder's person id.
    fn bidder(&self) -> u64;
    /// Price in cents.
    fn price(&self) -> u64;
}

macro_rules! counted_bid {
    ($($t:ty),*) => {$(
        impl CountedBid for $t {
            fn auction(&self) -> u64 {
                self.auction
            }
            fn bidder(&self) -> u64 {
                self.bidder
            }
            fn price(&self) -> u64 {
                self.price
            }
        }
    )*};
}
counted_bid!(Bid, BidNumbers, BidOnChannel);

/// What the counters keep of a bid.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct Counted<G> {
    group: G,
    rank: usize,
    bidder: u64,
    auction: u64,
}

/// The [`Counters`] of `bids` per `group`, for every group with bids: when
/// a group's counters change, the old pair is deleted and the new one
/// inserted (as `sum_by` does).
pub fn bid_counters<B: Data + CountedBid, G: Data>(
    bids: &Stream<B>,
    group: fn(&B) -> G,
) -> Stream<(G, Counters)> {
    let bids = bids.map(move |b| Counted {
        group: group(b),
        rank: price_rank(b.price()),
        bidder: b.bidder(),
        auction: b.auction(),
    });
    // `count(DISTINCT id)` per rank (the three slots after `first`) and
    // in all (slot `first`): the pairs of all ranks are those of some
    // rank, so the second `distinct` sees only the first's changes. The id
    // comes first in the tuples: most comparisons end there.
    let distinct = |first: usize, id: fn(&Counted<G>) -> u64| {
        let ranked = bids
            .map(move |b| (id(b), b.rank, b.group.clone()))
            .distinct();
        let all = ranked
            .map(|(id, _, g)| (*id, g.clone()))
            .distinct()
            .map(move |(_, g)| (g.clone(), counted(&[first])));
        ranked
            .map(move |(_, rank, g)| (g.clone(), counted(&[first + 1 + rank])))
            .union(&all)
    };
    bids.map(|b| (b.group.clone(), counted(&[0, 1 + b.rank])))
        .union(&distinct(4, |b| b.bidder))
        .union(&distinct(8, |b| b.auction))
        .sum_by(|(g, _)| g.clone(), |(_, c)| *c)
        // A group is there while it has bids (as with `count_by`): its sum
        // also counts the pairs, and a delete that comes before its insert
        // leaves a group without bids but with counters.
        .filter(|(_, c)| c[0] > 0)
}

#[cfg(test)]
mod tests {
    use super::{Counters, bid_counters};
    use crate::Bid;
    use sluice_guest::testing::{events, integrate_port, run};

    fn bid(auction: u64, bidder: u64, price: u64, channel: &str) -> Bid {
        Bid {
            auction,
            bidder,
            price,
            channel: channel.into(),
            url: String::new(),
            date_time: 0,
            extra: String::new(),
        }
    }

    #[test]
    fn counts_bids_and_distinct_ids_per_rank_under_deletes() {
        let build = |c: &mut sluice_guest::Circuit| {
            bid_counters(&c.input::<Bid>("bid"), |b| b.channel.clone()).output("out");
        };
        let steps = vec![
            vec![events(&[
                (bid(1, 7, 5, "a"), 1),
                (bid(1, 7, 6, "a"), 1),
                (bid(2, 7, 2_000_000, "a"), 1),
                (bid(3, 8, 50_000, "b"), 2),
            ])],
            // Bidder 7's only bid over a million goes, and so do auction
            // 2 and the rank-3 counts; channel b's bids all go.
            vec![events(&[
                (bid(2, 7, 2_000_000, "a"), -1),
                (bid(3, 8, 50_000, "b"), -2),
                (bid(4, 9, 10_000, "a"), 1),
            ])],
        ];
        for workers in [1, 3] {
            let out = run(build, workers, &steps[..1], None).unwrap();
            let first = integrate_port::<(String, Counters)>(&out, 0);
            assert_eq!(
                first.into_iter().collect::<Vec<_>>(),
                vec![
                    (("a".into(), [3, 2, 0, 1, 1, 1, 0, 1, 2, 1, 0, 1]), 1),
                    (("b".into(), [2, 0, 2, 0, 1, 0, 1, 0, 1, 0, 1, 0]), 1),
                ],
                "W = {workers}"
            );
            let out = run(build, workers, &steps, None).unwrap();
            let last = integrate_port::<(String, Counters)>(&out, 0);
            assert_eq!(
                last.into_iter().collect::<Vec<_>>(),
                vec![(("a".into(), [3, 2, 1, 0, 2, 1, 1, 0, 2, 1, 1, 0]), 1)],
                "W = {workers}"
            );
            // A delete before its insert, beside another bid, leaves no
            // bids: no group, although its distinct pairs count.
            let early = vec![vec![events(&[
                (bid(5, 5, 5, "c"), -1),
                (bid(6, 6, 5, "c"), 1),
            ])]];
            let out = run(build, workers, &early, None).unwrap();
            assert!(integrate_port::<(String, Counters)>(&out, 0).is_empty());
        }
    }
}
