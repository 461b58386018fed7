//! Event-time windows: `tumbling` and `hopping` assign each record to the
//! windows containing its timestamp. Stateless; aggregate per window by
//! keying on it, e.g. `.tumbling(ts, 60).count_by(|(w, r)| (*w, r.user))`.

use crate::Stream;
use crate::circuit::Data;
use crate::types::Window;

impl<T: Data> Stream<T> {
    /// Pairs every record with the window `[start, start + size)` holding
    /// `ts(record)`, windows starting at multiples of `size`. `size` must be
    /// positive (else the circuit fails to build).
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<(i64, String)>("clicks")
    ///         .tumbling(|(ts, _)| *ts, 60_000)
    ///         .count_by(|(window, (_, page))| (*window, page.clone()))
    ///         .output("clicks_per_minute");
    /// }).unwrap();
    /// ```
    pub fn tumbling(
        &self,
        ts: impl Fn(&T) -> i64 + 'static,
        size: i64,
    ) -> Stream<(crate::Window, T)> {
        self.hopping(ts, size, size)
    }

    /// Pairs every record with each window `[start, start + size)` holding
    /// `ts(record)`, windows starting at multiples of `hop` (so a record is in
    /// about `size / hop` windows). `size` and `hop` must be positive.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<(i64, i64)>("bids")
    ///         .hopping(|(ts, _)| *ts, 10_000, 2_000)
    ///         .max_by(|(window, _)| *window, |(_, (_, price))| *price)
    ///         .output("max_price_10s_every_2s");
    /// }).unwrap();
    /// ```
    pub fn hopping(
        &self,
        ts: impl Fn(&T) -> i64 + 'static,
        size: i64,
        hop: i64,
    ) -> Stream<(crate::Window, T)> {
        if size <= 0 || hop <= 0 {
            self.build_error(format!(
                "window size ({size}) and hop ({hop}) must be positive"
            ));
        }
        let (size, hop) = (size.max(1), hop.max(1));
        // The windows a record lies in: at most `size / hop + 1` (fewer
        // near the start of time), reserved up to 64.
        let per_record = usize::try_from(size.div_euclid(hop) + 1).map_or(1, |n| n.min(64));
        self.flat_map(move |t| {
            let at = ts(t);
            let mut start = at.div_euclid(hop) * hop;
            let mut windows = Vec::with_capacity(per_record);
            while start.saturating_add(size) > at {
                windows.push((
                    Window {
                        start,
                        end: start.saturating_add(size),
                    },
                    t.clone(),
                ));
                match start.checked_sub(hop) {
                    Some(s) => start = s,
                    None => break,
                }
            }
            windows
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::operator::testing::{batches, check, zset};
    use crate::{Circuit, CircuitInstance, Window};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn hopping_equals_recomputation(steps in batches(-50i64..50)) {
            check(|c| c.input::<i64>("in").hopping(|t| *t, 10, 4).output("out"), &steps, |input| {
                zset(input.iter().flat_map(|(t, w)| {
                    (-100i64..100)
                        .filter(|s| s.rem_euclid(4) == 0 && *s <= *t && *t < s + 10)
                        .map(move |s| ((Window { start: s, end: s + 10 }, *t), *w))
                }))
            })?;
        }

        #[test]
        fn tumbling_equals_recomputation(steps in batches(-50i64..50)) {
            check(|c| c.input::<i64>("in").tumbling(|t| *t, 7).output("out"), &steps, |input| {
                zset(input.iter().map(|(t, w)| {
                    let s = t.div_euclid(7) * 7;
                    ((Window { start: s, end: s + 7 }, *t), *w)
                }))
            })?;
        }
    }

    #[test]
    fn a_non_positive_size_is_a_build_error() {
        let err = CircuitInstance::build(|c: &mut Circuit| {
            c.input::<i64>("in").tumbling(|t| *t, 0).output("out");
        })
        .err()
        .expect("size 0 is refused");
        assert!(err.to_string().contains("must be positive"), "{err}");
    }
}
