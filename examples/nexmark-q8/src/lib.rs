//! Nexmark q8, monitor new users: the people who opened an auction in the
//! same 10-second tumbling window as they registered, as `(id, name,
//! window start)`.
//!
//! Follows the Flink nexmark SQL: people grouped by `(id, name, window)`,
//! auctions by `(seller, window)`, joined on the person and the window.

use nexmark_model::{Auction, Person};
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    let people = c
        .input::<Person>("person")
        .tumbling(|p| p.date_time as i64, 10_000)
        .map(|(w, p)| (w.start, p.id, p.name.clone()))
        .distinct()
        .key_by(|(start, id, _)| (*start, *id));
    let sellers = c
        .input::<Auction>("auction")
        .tumbling(|a| a.date_time as i64, 10_000)
        .map(|(w, a)| (w.start, a.seller))
        .distinct()
        .key_by(|window_and_seller| *window_and_seller);
    people
        .join(&sellers, |_, (start, id, name), _| {
            (*id, name.clone(), *start)
        })
        .output("new_users");
}

sluice_guest::circuit!(build);
