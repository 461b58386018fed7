//! The crash test on the embedded log: `sluice run` as a child process,
//! SIGKILLed at random moments (see `crate::support::crash::campaign`); the final
//! output must equal a from-scratch computation exactly, and the output log
//! must hold exactly one entry per step per worker.
//!
//! The seed is printed; set `SLUICE_CRASH_SEED` to replay a run's kill times.

use crate::support::crash::{Hosts, Positions, WORKERS, campaign};
use sluice_embedded::{EmbeddedLog, db};
use sluice_storage::LogBackend;
use std::collections::BTreeMap;

#[test]
fn sigkill_at_random_moments_loses_and_duplicates_nothing() {
    let run = campaign(100_000, &[], None, Positions::Check, Hosts::One);
    let data = &run.data;
    // The output log: exactly one entry per step per worker.
    let db = db::open(data).unwrap();
    let log = EmbeddedLog::open(db).unwrap();
    let last = log.last_step().unwrap().expect("steps were committed");
    let mut entries: BTreeMap<(u64, u32), usize> = BTreeMap::new();
    log.scan_output("counts", 0, &mut |e| {
        *entries.entry((e.step, e.worker)).or_default() += 1;
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    assert_eq!(entries.len() as u64, (last + 1) * WORKERS as u64);
    assert!(entries.values().all(|n| *n == 1));
    for step in 0..=last {
        for w in 0..WORKERS {
            assert!(
                entries.contains_key(&(step, w)),
                "missing entry of step {step} worker {w}"
            );
        }
    }
    eprintln!(
        "crash test: {} steps committed, {} distinct words",
        last + 1,
        run.expected.len()
    );
}
