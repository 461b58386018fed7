//! Nexmark q11, user sessions: per bidder, the bids of each session (bids
//! at most 10 seconds apart), as `(bidder, bids, session start, session
//! end)`.
//!
//! Follows the Flink nexmark SQL (`GROUP BY bidder, SESSION(dateTime,
//! INTERVAL '10' SECOND)`; a session ends 10 seconds after its last bid).

use nexmark_model::BidNumbers;
use sluice_guest::Circuit;

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    // Read as the bid's numbers: the decoder skips the rest of each line.
    c.input::<BidNumbers>("bid")
        .session_by(|b| b.bidder, |b| b.date_time as i64, 10_000)
        .count_by(|(session, b)| (b.bidder, *session))
        .map(|((bidder, session), bids)| (*bidder, *bids, session.start, session.end))
        .output("sessions");
}

sluice_guest::circuit!(build);
