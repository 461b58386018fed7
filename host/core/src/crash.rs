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

    /// The point named `name`.
    pub fn from_name(name: &str) -> Option<CrashPoint> {
        CrashPoint::ALL
            .into_iter()
            .chain(CrashPoint::BACKEND)
            .chain(CrashPoint::RESCALE)
            .chain(CrashPoint::UPGRADE)
            .find(|p| p.name() == name)
    }
}

struct Armed {
    point: CrashPoint,
    at: u64,
    seen: AtomicU64,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let spec = std::env::var("SLUICE_CRASH_AT").ok()?;
            let (name, n) = spec.split_once(':').unwrap_or((spec.as_str(), "1"));
            let point = CrashPoint::from_name(name).or_else(|| {
                eprintln!("sluice: ignoring SLUICE_CRASH_AT={spec}: unknown crash point");
                None
            })?;
            Some(Armed {
                point,
                at: n.parse().unwrap_or(1).max(1),
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
