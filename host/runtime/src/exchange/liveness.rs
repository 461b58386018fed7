//! When each other slot of an exchange was last heard from — a frame, a
//! heartbeat, any byte on the connection it sends over — so that a worker
//! waiting for a slot's part of a round can tell a slot that is slow
//! (heard from: it keeps waiting; fuel and the step deadline bound the
//! guests) from one that is cut off (silent for the session timeout: the
//! step fails).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The last time each slot was heard from, and how long a slot may stay
/// silent.
pub(crate) struct Liveness {
    born: Instant,
    /// Milliseconds after `born` each slot was last heard from.
    heard: Vec<AtomicU64>,
    /// How long a slot may be silent before it is taken for lost.
    pub(crate) silence: Duration,
}

impl Liveness {
    /// `slots` slots, none heard from yet (their silence counts from now),
    /// each lost after `silence` without a word.
    pub(crate) fn new(slots: usize, silence: Duration) -> Self {
        Liveness {
            born: Instant::now(),
            heard: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            silence,
        }
    }

    /// Slot `slot` was heard from just now.
    pub(crate) fn heard(&self, slot: u32) {
        if let Some(at) = self.heard.get(slot as usize) {
            let now = self.born.elapsed().as_millis() as u64;
            at.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// How long slot `slot` has been silent.
    pub(crate) fn quiet(&self, slot: u32) -> Duration {
        let at = self
            .heard
            .get(slot as usize)
            .map_or(0, |a| a.load(Ordering::Relaxed));
        self.born
            .elapsed()
            .saturating_sub(Duration::from_millis(at))
    }

    /// Whether slot `slot` has been silent for the session timeout.
    pub(crate) fn lost(&self, slot: u32) -> bool {
        self.quiet(slot) >= self.silence
    }

    /// How often a waiting worker looks for silent slots: often enough to
    /// fail within a fraction of the timeout after it runs out.
    pub(crate) fn tick(&self) -> Duration {
        (self.silence / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}
