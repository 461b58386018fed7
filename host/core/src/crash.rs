//! Named crash points: every place in the step protocol where a crash
//! matters, reachable deterministically in tests.
//!
//! Set `SLUICE_CRASH_AT=POINT:N` and the process aborts (like `kill -9`: no
//! destructors, no flushing) the N-th time it reaches `POINT` (N from 1).
//! Before aborting it prints `sluice: crash point POINT #N` to stderr, so a
//! harness can count what it hit. Unset, a crash point costs one relaxed
//! atomic load.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The named points, in protocol order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrashPoint {
    /// After an input chunk was appended (ingest; written, not yet
    /// synced: a process that dies there loses nothing).
    MidIngest,
    /// After a replayed step ran during recovery, before the next.
    DuringReplay,
    /// After the step's division was fixed, before any worker ran.
    AfterDivide,
    /// After the workers ran the step, before its commit.
    MidStep,
    /// Right before the step's commit batch is written.
    BeforeCommit,
    /// Right after the step's commit batch is durable.
    AfterCommit,
    /// After the snapshots were taken, before the checkpoint is written.
    MidCheckpoint,
    /// After the checkpoint is committed, before any trim.
    AfterCheckpoint,
    /// After the first input partition was trimmed, before the others.
    MidTrim,
    /// A layout change: the moving shards were handed off by their old
    /// owners, not yet taken by the new ones, nothing committed.
    MidHandoff,
    /// A layout change: the first step under the new layout is committed,
    /// its checkpoint not yet taken.
    AfterRelayout,
    /// Kafka only: the step's records are in an open transaction, not yet
    /// committed (a crash here leaves records a `read_committed` consumer
    /// must never see).
    InsideTransaction,
    /// An upgrade (a change of component): the pipeline's metadata names
    /// the new component (the commit point), nothing else done yet — on a
    /// server, its registry still names the old one.
    AfterUpgrade,
    /// An upgrade on a shared log (Kafka): the change is recorded there
    /// (the commit point), the data directory's metadata not yet.
    AfterUpgradeRecord,
}

impl CrashPoint {
    /// Every point.
    pub const ALL: [CrashPoint; 9] = [
        CrashPoint::MidIngest,
        CrashPoint::DuringReplay,
        CrashPoint::AfterDivide,
        CrashPoint::MidStep,
        CrashPoint::BeforeCommit,
        CrashPoint::AfterCommit,
        CrashPoint::MidCheckpoint,
        CrashPoint::AfterCheckpoint,
        CrashPoint::MidTrim,
    ];

    /// Points only some log backends reach.
    pub const BACKEND: [CrashPoint; 1] = [CrashPoint::InsideTransaction];

    /// Points only a layout change reaches.
    pub const RESCALE: [CrashPoint; 2] = [CrashPoint::MidHandoff, CrashPoint::AfterRelayout];

    /// Points only an upgrade reaches.
    pub const UPGRADE: [CrashPoint; 2] = [CrashPoint::AfterUpgrade, CrashPoint::AfterUpgradeRecord];

    /// The point's name in `SLUICE_CRASH_AT`.
    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::MidIngest => "mid-ingest",
            CrashPoint::DuringReplay => "during-replay",
            CrashPoint::AfterDivide => "after-divide",
            CrashPoint::MidStep => "mid-step",
            CrashPoint::BeforeCommit => "before-commit",
            CrashPoint::AfterCommit => "after-commit",
            CrashPoint::MidCheckpoint => "mid-checkpoint",
            CrashPoint::AfterCheckpoint => "after-checkpoint",
            CrashPoint::MidTrim => "mid-trim",
            CrashPoint::InsideTransaction => "inside-transaction",
            CrashPoint::MidHandoff => "mid-handoff",
            CrashPoint::AfterRelayout => "after-relayout",
            CrashPoint::AfterUpgrade => "after-upgrade",
            CrashPoint::AfterUpgradeRecord => "after-upgrade-record",
        }
    }

    /// Every point there is: [`ALL`](Self::ALL), then those only a
    /// backend, a layout change or an upgrade reaches.
    pub fn every() -> impl Iterator<Item = CrashPoint> {
        CrashPoint::ALL
            .into_iter()
            .chain(CrashPoint::BACKEND)
            .chain(CrashPoint::RESCALE)
            .chain(CrashPoint::UPGRADE)
    }

    /// The point named `name`.
    pub fn from_name(name: &str) -> Option<CrashPoint> {
        CrashPoint::every().find(|p| p.name() == name)
    }
}

struct Armed {
    point: CrashPoint,
    at: u64,
    seen: AtomicU64,
}

/// Parses `SLUICE_CRASH_AT`'s value, `POINT` or `POINT:N` (N from 1).
fn parse(spec: &str) -> Result<(CrashPoint, u64), String> {
    let (name, n) = spec.split_once(':').unwrap_or((spec, "1"));
    let point = CrashPoint::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = CrashPoint::every().map(CrashPoint::name).collect();
        format!(
            "SLUICE_CRASH_AT={spec}: {name:?} names no point of the protocol (they are: {})",
            known.join(", ")
        )
    })?;
    match n.parse::<u64>() {
        Ok(at) if at >= 1 => Ok((point, at)),
        _ => Err(format!(
            "SLUICE_CRASH_AT={spec}: {n:?} is not a count from 1 (POINT:N aborts at the N-th reach)"
        )),
    }
}

/// Checks `SLUICE_CRASH_AT`, if set: a misspelt point or count would
/// otherwise arm nothing, and a crash test would pass without its crash.
/// The CLI calls it before any command.
pub fn check_env() -> Result<(), String> {
    match std::env::var("SLUICE_CRASH_AT") {
        Ok(spec) => parse(&spec).map(|_| ()),
        Err(std::env::VarError::NotPresent) => Ok(()),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err("SLUICE_CRASH_AT: not valid UTF-8".to_owned())
        }
    }
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let spec = std::env::var("SLUICE_CRASH_AT").ok()?;
            let (point, at) = parse(&spec)
                .map_err(|e| eprintln!("sluice: ignoring {e}"))
                .ok()?;
            Some(Armed {
                point,
                at,
                seen: AtomicU64::new(0),
            })
        })
        .as_ref()
}

/// Marks a crash point; aborts the process if `SLUICE_CRASH_AT` names it
/// and this is the chosen occurrence.
pub fn crash_point(point: CrashPoint) {
    if let Some(a) = armed()
        && a.point == point
        && a.seen.fetch_add(1, Ordering::Relaxed) + 1 == a.at
    {
        eprintln!("sluice: crash point {} #{}", point.name(), a.at);
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::{CrashPoint, parse};

    #[test]
    fn every_point_parses_by_its_name_with_and_without_a_count() {
        for point in CrashPoint::every() {
            assert_eq!(parse(point.name()), Ok((point, 1)));
            assert_eq!(parse(&format!("{}:7", point.name())), Ok((point, 7)));
        }
    }

    #[test]
    fn a_misspelt_point_or_a_bad_count_is_refused_by_name() {
        let e = parse("after-comit:5").unwrap_err();
        assert!(e.contains("\"after-comit\" names no point"), "{e}");
        // Not the words a harness looks for in an abort's line.
        assert!(!e.contains("crash point"), "{e}");
        assert!(
            e.contains("after-commit"),
            "the known points are listed: {e}"
        );
        for bad in [
            "after-commit:0",
            "after-commit:x",
            "after-commit:",
            "after-commit:-1",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains("not a count from 1"), "{bad}: {e}");
        }
    }
}
