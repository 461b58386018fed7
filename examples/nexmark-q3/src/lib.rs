//! Nexmark q3, local item suggestion: `(name, city, state, auction id)` for
//! every auction in category 10 by a seller from Oregon, Idaho or
//! California. An incremental join of people and auctions on the seller.

use nexmark_model::{Auction, Person};
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    let sellers = c
        .input::<Person>("person")
        .filter(|p| ["or", "id", "ca"].contains(&p.state.as_str()))
        .key_by(|p| p.id);
    c.input::<Auction>("auction")
        .filter(|a| a.category == 10)
        .key_by(|a| a.seller)
        .join(&sellers, |_, a, p| {
            (p.name.clone(), p.city.clone(), p.state.clone(), a.id)
        })
        .output("suggestions");
}

sluice_guest::circuit!(build);
