//! Nexmark q13, bounded side input join: every bid with the side input's
//! value for `auction % 10 000`, as `(auction, bidder, price, date_time,
//! value)`. The side input is a second input port, `side_input`, of
//! `{"key": …, "value": …}` records (loaded from a file like any input).
//!
//! Deviation from the Flink nexmark SQL: Flink joins each bid with the side
//! table as of the bid's processing time (`FOR SYSTEM_TIME AS OF`), so a
//! later change to the table leaves earlier output alone. Here it is a
//! regular join: a changed side-input row changes the output of every bid
//! it matches (deleted with the old value, inserted with the new), so the
//! output is always the join of the bids with the table as it is now. A
//! bid with no matching key is left out.

use nexmark_model::{BidNumbers, SideInput};
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    let side = c.input::<SideInput>("side_input").key_by(|s| s.key);
    // Read as the bid's numbers: the decoder skips its channel, URL and
    // padding (most of its bytes), which the result does not name and the
    // join would keep for every bid.
    c.input::<BidNumbers>("bid")
        .map(|b| (b.auction, b.bidder, b.price, b.date_time))
        .key_by(|(auction, ..)| auction % 10_000)
        .join(&side, |_, (auction, bidder, price, at), s| {
            (*auction, *bidder, *price, *at, s.value.clone())
        })
        .output("joined");
}

sluice_guest::circuit!(build);
