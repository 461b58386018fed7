//! `session_by`: session windows per key.

use super::group::Multiset;
use crate::Stream;
use crate::circuit::Data;
use crate::types::Window;
use crate::zset::Weight;

impl<T: Data> Stream<T> {
    /// Pairs every record with its session window. Per `key`, the records
    /// in `ts` order fall into sessions: maximal runs in which each record
    /// comes at most `gap` after the one before. A session's window is
    /// `[first ts, last ts + gap)`. This is Flink's `SESSION(ts, gap)`: each
    /// record's window `[ts, ts + gap)` merged with every window it
    /// intersects or touches.
    /// Aggregate per session by keying on the window, e.g.
    /// `.session_by(user, ts, 600).count_by(|(w, r)| (r.user, *w))`.
    ///
    /// A record that extends a session, or joins two, moves the session's
    /// records to the new window (their old pairs deleted, the new ones
    /// inserted), and a deleted record splits or shrinks its session the
    /// same way. Keeps each key's records; re-shards by key through the
    /// exchange. `gap` must be positive (else the circuit fails to build).
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<(String, i64)>("clicks")
    ///         .session_by(|(user, _)| user.clone(), |(_, ts)| *ts, 30_000)
    ///         .count_by(|(session, (user, _))| (user.clone(), *session))
    ///         .output("clicks_per_session");
    /// }).unwrap();
    /// ```
    pub fn session_by<K: Data>(
        &self,
        key: impl Fn(&T) -> K + 'static,
        ts: impl Fn(&T) -> i64 + 'static,
        gap: i64,
    ) -> Stream<(Window, T)> {
        if gap <= 0 {
            self.build_error(format!("the session gap ({gap}) must be positive"));
        }
        let gap = gap.max(1);
        // Each record moves into the group when the operator is given its
        // input, and the pair it emits moves out of the key's.
        self.group_reduce_owned(
            "session_by",
            key,
            move |t| (ts(&t), t),
            move |_, group| sessions(group, gap),
        )
        .map_owned(|(_, in_session)| in_session)
    }
}

/// Every record of `group` (ordered by time) with its session's window.
fn sessions<T: Data>(group: &Multiset<(i64, T)>, gap: i64) -> Vec<((Window, T), Weight)> {
    let live: Vec<(&(i64, T), Weight)> = group
        .iter()
        .filter(|(_, w)| **w > 0)
        .map(|(v, w)| (v, *w))
        .collect();
    let mut out = Vec::with_capacity(live.len());
    let mut first = 0;
    while first < live.len() {
        let mut last = first;
        while last + 1 < live.len() && live[last + 1].0.0.saturating_sub(live[last].0.0) <= gap {
            last += 1;
        }
        let window = Window {
            start: live[first].0.0,
            end: live[last].0.0.saturating_add(gap),
        };
        out.extend(
            live[first..=last]
                .iter()
                .map(|((_, t), w)| ((window, t.clone()), *w)),
        );
        first = last + 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::Window;
    use crate::operator::testing::{batches, check, zset};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        #[test]
        fn equals_recomputation(steps in batches((0u8..3, -20i64..40, 0u8..2))) {
            check(
                |c| c.input::<(u8, i64, u8)>("in")
                    .session_by(|(k, ..)| *k, |(_, ts, _)| *ts, 4)
                    .output("out"),
                &steps,
                |input| {
                    // Per key, the records present (with their counts) in time
                    // order, and the sessions found by walking them: two
                    // records of a time are in one session.
                    let mut records: BTreeMap<u8, BTreeMap<(i64, u8), i64>> = BTreeMap::new();
                    for ((k, ts, tag), w) in input {
                        if *w > 0 {
                            *records.entry(*k).or_default().entry((*ts, *tag)).or_default() += w;
                        }
                    }
                    let mut rows = Vec::new();
                    for (k, at) in records {
                        let mut runs: Vec<Vec<((i64, u8), i64)>> = Vec::new();
                        for (r, n) in at {
                            match runs.last_mut() {
                                Some(run) if r.0 - run.last().unwrap().0.0 <= 4 => run.push((r, n)),
                                _ => runs.push(vec![(r, n)]),
                            }
                        }
                        for run in runs {
                            let window = Window { start: run[0].0.0, end: run.last().unwrap().0.0 + 4 };
                            rows.extend(run.into_iter().map(|((ts, tag), n)| ((window, (k, ts, tag)), n)));
                        }
                    }
                    zset(rows)
                },
            )?;
        }
    }

    #[test]
    fn a_gap_that_is_not_positive_fails_the_build() {
        let built = crate::CircuitInstance::build(|c| {
            c.input::<(u8, i64)>("in")
                .session_by(|(k, _)| *k, |(_, ts)| *ts, 0)
                .output("out");
        });
        let err = built
            .err()
            .expect("a zero gap must fail the build")
            .to_string();
        assert!(err.contains("session gap (0) must be positive"), "{err}");
    }
}
