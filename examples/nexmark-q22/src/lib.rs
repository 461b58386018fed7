//! Nexmark q22, get URL directories: every bid as `(auction, bidder,
//! price, channel, dir1, dir2, dir3)`, the directories being the URL's
//! parts 3, 4 and 5 when split at `/` (counting from 0; `null` past the
//! end).
//!
//! Follows the Flink nexmark SQL (`SPLIT_INDEX(url, '/', 3)` … `5`).

use nexmark_model::BidWithUrl;
use sluice_guest::Circuit;

/// Output row: `(auction, bidder, price, channel, dir1, dir2, dir3)`.
pub type Row = (
    u64,
    u64,
    u64,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    // Read without the time and padding: the decoder skips them.
    c.input::<BidWithUrl>("bid")
        // By value: each bid's channel moves into its row, not copied.
        .map_owned(|b| -> Row {
            let part = |n: usize| b.url.split('/').nth(n).map(str::to_owned);
            (
                b.auction,
                b.bidder,
                b.price,
                b.channel,
                part(3),
                part(4),
                part(5),
            )
        })
        .output("url_dirs");
}

sluice_guest::circuit!(build);
