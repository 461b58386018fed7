//! What the campaigns found: the report of each ([`ChaosReport`] of the
//! one-host campaign, [`HostsChaosReport`] of the campaign across hosts),
//! how they are told, and how integrated output is compared with what was
//! expected ([`Differences`]).

use sluice_core::crash::CrashPoint;
use std::collections::BTreeMap;
use std::time::Duration;

/// What a campaign did and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChaosReport {
    /// Trials run.
    pub trials: u32,
    /// Child runs started (first runs and restarts).
    pub runs: u32,
    /// Restarts after a crash.
    pub restarts: u32,
    /// Crashes at named points, per point.
    pub points_hit: BTreeMap<&'static str, u32>,
    /// SIGKILLs at random moments that landed before the run finished.
    pub kills: u32,
    /// Of those, the ones that landed once the run had recovered, while
    /// steps ran (the others hit start-up: ingest, restore, replay).
    pub kills_in_steps: u32,
    /// Trials of the noisy circuit.
    pub noisy_trials: u32,
    /// Trials of the word count (`--wordcount`).
    pub wordcount_trials: u32,
    /// Runs asked to run with another W than the run before (layout
    /// changes asked for; a crash may undo one before it commits).
    pub rescales: u32,
    /// Expected results missing from the output.
    pub lost: u64,
    /// Results present more often than expected.
    pub duplicated: u64,
    /// Results that should not be there.
    pub wrong: u64,
    /// Audits (`sluice verify`) that found a violation.
    pub audit_failures: u32,
    /// The first violation, described, if any.
    pub first_violation: Option<String>,
}

impl ChaosReport {
    /// Total violations of every kind.
    pub fn violations(&self) -> u64 {
        self.lost + self.duplicated + self.wrong + self.audit_failures as u64
    }
}

impl std::fmt::Display for ChaosReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let wordcount = match self.wordcount_trials {
            0 => String::new(),
            n => format!("; {n} of word count"),
        };
        writeln!(
            f,
            "trials: {} ({} of the noisy circuit{wordcount})  runs: {}  restarts: {}  rescales: {}  random kills: {} ({} while steps ran)",
            self.trials,
            self.noisy_trials,
            self.runs,
            self.restarts,
            self.rescales,
            self.kills,
            self.kills_in_steps
        )?;
        write!(f, "crash points hit:")?;
        for p in CrashPoint::ALL.into_iter().chain(CrashPoint::RESCALE) {
            write!(
                f,
                " {}={}",
                p.name(),
                self.points_hit.get(p.name()).copied().unwrap_or(0)
            )?;
        }
        writeln!(f)?;
        write_violations(
            f,
            [self.lost, self.duplicated, self.wrong],
            self.audit_failures,
            self.first_violation.as_deref(),
        )
    }
}

/// The last lines of a campaign's report: violations by kind, the first.
pub(super) fn write_violations(
    f: &mut std::fmt::Formatter<'_>,
    [lost, duplicated, wrong]: [u64; 3],
    audit_failures: u32,
    first: Option<&str>,
) -> std::fmt::Result {
    write!(
        f,
        "violations: {} (lost {lost}, duplicated {duplicated}, wrong {wrong}, audit failures \
         {audit_failures})",
        lost + duplicated + wrong + u64::from(audit_failures)
    )?;
    if let Some(v) = first {
        write!(f, "\nfirst violation: {v}")?;
    }
    Ok(())
}

/// What a campaign across hosts did and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostsChaosReport {
    /// Trials run.
    pub trials: u32,
    /// Worker hosts killed mid-run.
    pub kills: u32,
    /// Worker hosts stalled past the session timeout.
    pub stalls: u32,
    /// Coordinators dropped mid-step.
    pub leader_crashes: u32,
    /// Hosts that joined a running coordinator (workers moved live).
    pub joins: u32,
    /// Hosts that left a running coordinator gracefully (their workers
    /// moved live).
    pub leaves: u32,
    /// Network faults (`--network`): one direction into a host cut.
    pub drops_in: u32,
    /// Network faults: one direction out of a host cut.
    pub drops_out: u32,
    /// Network faults: every byte to and from a host delayed past the
    /// session timeout.
    pub delays: u32,
    /// Network faults: every connection of a host reset.
    pub resets: u32,
    /// Network faults: every connection of a host left half-open for good.
    pub half_opens: u32,
    /// The longest time from a network fault's healing to the next
    /// committed step.
    pub longest_to_commit: Duration,
    /// Trials in which no step committed within the bound after a fault
    /// healed (a stuck pipeline).
    pub stuck: u32,
    /// Coordinators opened (recoveries included).
    pub opens: u32,
    /// Steps replayed by recoveries.
    pub replayed: u64,
    /// Replicas of each worker (`--replicas`).
    pub replicas: u32,
    /// Steps in which a follower took over from a primary whose host
    /// failed (per worker): nothing replayed.
    pub failovers: u64,
    /// Recoveries (a reopen, so a replay) after a single host's fault,
    /// when every worker still had a live replica: each is a violation
    /// with replicas.
    pub replays_with_a_live_replica: u32,
    /// Coordinators opened after a leader crash that adopted the workers
    /// the hosts kept: nothing restored, nothing replayed.
    pub leader_takeovers_adopted: u32,
    /// Coordinators opened after a leader crash that restored a checkpoint
    /// and replayed instead (some worker had no kept instance at the log's
    /// last step: without replicas, always).
    pub leader_takeovers_restored: u32,
    /// Of the adopting take-overs, steps that were in flight when the
    /// leader crashed and that the next one recorded as the workers ran
    /// them.
    pub in_flight_recorded: u64,
    /// Steps committed.
    pub steps: u64,
    /// Of the committed steps' input events, those the hosts read
    /// themselves.
    pub events_read_by_hosts: u64,
    /// Bytes of checkpoint pieces the hosts wrote to the store themselves.
    pub staged_bytes: u64,
    /// Bytes of state restores read from the hosts' own copies.
    pub restored_local_bytes: u64,
    /// Bytes of state restores fetched from the store (or sent).
    pub restored_fetched_bytes: u64,
    /// Expected results missing from the output (by weight).
    pub lost: u64,
    /// Results present too often.
    pub duplicated: u64,
    /// Results never expected.
    pub wrong: u64,
    /// Trials whose audit found a violation.
    pub audit_failures: u32,
    /// The first violation, described.
    pub first_violation: Option<String>,
    /// Wall time of the campaign.
    pub took: Duration,
}

impl HostsChaosReport {
    /// Total violations of every kind.
    pub fn violations(&self) -> u64 {
        self.lost
            + self.duplicated
            + self.wrong
            + self.audit_failures as u64
            + self.stuck as u64
            + self.replays_with_a_live_replica as u64
    }
}

impl std::fmt::Display for HostsChaosReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "trials: {}  faults: {} host kills, {} host stalls, {} leader crashes  live moves: {} \
             joins, {} leaves  coordinators opened: {}  steps: {} committed, {} replayed  ({:.1?})",
            self.trials,
            self.kills,
            self.stalls,
            self.leader_crashes,
            self.joins,
            self.leaves,
            self.opens,
            self.steps,
            self.replayed,
            self.took
        )?;
        writeln!(
            f,
            "hosts read {} input events themselves, wrote {} bytes of checkpoint pieces; \
             restores read {} bytes from the hosts' own copies, fetched {}",
            self.events_read_by_hosts,
            self.staged_bytes,
            self.restored_local_bytes,
            self.restored_fetched_bytes
        )?;
        if self.leader_crashes > 0 {
            writeln!(
                f,
                "leader take-overs: {} adopted the workers the hosts kept (nothing restored or \
                 replayed; {} of them recorded the step in flight), {} restored and replayed",
                self.leader_takeovers_adopted,
                self.in_flight_recorded,
                self.leader_takeovers_restored
            )?;
        }
        if self.replicas > 1 {
            writeln!(
                f,
                "replicas: {} per worker; failovers (a follower took over, nothing replayed): {}; \
                 recoveries after one host's fault (replays with a live replica): {}",
                self.replicas, self.failovers, self.replays_with_a_live_replica
            )?;
        }
        if self.drops_in + self.drops_out + self.delays + self.resets + self.half_opens > 0 {
            writeln!(
                f,
                "network faults: {} one-way cuts into a host, {} out of a host, {} delays past the \
                 session timeout, {} resets, {} half-open cuts; longest from healing to the next \
                 commit: {:.1?}; stuck trials: {}",
                self.drops_in,
                self.drops_out,
                self.delays,
                self.resets,
                self.half_opens,
                self.longest_to_commit,
                self.stuck
            )?;
        }
        write_violations(
            f,
            [self.lost, self.duplicated, self.wrong],
            self.audit_failures,
            self.first_violation.as_deref(),
        )
    }
}

/// How integrated output differs from what was expected.
#[derive(Debug, Default)]
pub(super) struct Differences {
    /// Weight of expected results missing.
    pub lost: u64,
    /// Weight of results present too often.
    pub duplicated: u64,
    /// Weight of results never expected.
    pub wrong: u64,
    /// The first difference, described.
    pub first: Option<String>,
}

impl Differences {
    /// Compares `got` (results with non-zero weight) with `expected`.
    pub(super) fn of(expected: &BTreeMap<String, i64>, got: &BTreeMap<String, i64>) -> Self {
        let mut d = Differences::default();
        for (value, e) in expected {
            let g = got.get(value).copied().unwrap_or(0);
            if g < *e {
                d.lost += (e - g) as u64;
                d.first.get_or_insert(format!("lost {value}: {g} of {e}"));
            } else if g > *e {
                d.duplicated += (g - e) as u64;
                d.first
                    .get_or_insert(format!("duplicated {value}: {g} for {e}"));
            }
        }
        for (value, g) in got {
            if !expected.contains_key(value) {
                d.wrong += g.unsigned_abs();
                d.first.get_or_insert(format!("wrong {value}"));
            }
        }
        d
    }
}
