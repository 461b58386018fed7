//! Nexmark q1, currency conversion: every bid with its price in euro
//! (`price * 89 / 100`, as the reference implementation).

use nexmark_model::Bid;
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    c.input::<Bid>("bid")
        // By value: each bid moves through with its price changed, its
        // strings not copied.
        .map_owned(|b| Bid {
            price: b.price * 89 / 100,
            ..b
        })
        .output("euro_bids");
}

sluice_guest::circuit!(build);
