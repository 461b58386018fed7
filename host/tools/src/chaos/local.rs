//! `sluice chaos`: a crash campaign against the exactly-once promise.
//!
//! Every trial runs a pipeline over freshly generated input with retractions
//! as a child `sluice run`, crashes it one to three times, either at a named
//! crash point (`SLUICE_CRASH_AT`, see [`crash`](sluice_core::crash)) or with
//! a SIGKILL at a random moment, restarts it until it finishes, and compares
//! the integrated output with a from-scratch computation. It also audits the
//! logs ([`audit_embedded`]). The pipelines, alternating:
//!
//! - a keyed one (orders joined with customers, revenue summed per region:
//!   two exchanges, W workers; deleted orders, customers moving region);
//! - with [`ChaosOptions::noisy`], a circuit written against the WIT
//!   bindings that reads the clock and random numbers, keeps state in its
//!   snapshots and emits in `HashMap` order (`tests/guests/noisy`): a replay
//!   that saw another time, other random numbers or another state would
//!   stop the pipeline (I4), and its values are checked once each.
//!
//! With [`ChaosOptions::rescale`], every run of a trial picks its W at
//! random between 1 and 4, so most restarts change the layout (a live
//! rescale right after recovery, before the steps go on), and the crash
//! points of a layout change (`mid-handoff`, `after-relayout`) join the
//! others.
//!
//! Violations are counted as lost (an expected result missing), duplicated
//! (present too often), wrong (never expected) and audit failures. Random
//! kills are told apart by when they landed: during start-up (ingest,
//! recovery) or while steps ran.

use super::Rng;
use super::report::{ChaosReport, Differences};
use super::workloads::{Workload, noisy, orders_join, wordcount};
use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use sluice_core::crash::CrashPoint;
use sluice_embedded::audit::audit_embedded;
use sluice_storage::audit::Verdict;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Campaign settings.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// Number of trials.
    pub trials: u32,
    /// Seed of the campaign (trial `i` uses `seed + i`).
    pub seed: u64,
    /// The orders-join component.
    pub component: PathBuf,
    /// The noisy component (`tests/guests/noisy`): when given, every second
    /// trial runs it.
    pub noisy: Option<PathBuf>,
    /// Workers W.
    pub workers: u32,
    /// Change W at random (1 to 4) on every run of a trial: layout changes
    /// between and, with crashes, during runs.
    pub rescale: bool,
    /// A word-count component (Rust or Python): when given, the trials
    /// that do not run the noisy circuit run it over lines with deletes,
    /// instead of the orders join.
    pub wordcount: Option<PathBuf>,
    /// Orders per trial (lines, for word count).
    pub orders: u32,
    /// Show a progress bar.
    pub progress: bool,
}

/// How a run is crashed.
enum Crash {
    /// Abort at the n-th reach of a named crash point.
    At(CrashPoint, u64),
    /// SIGKILL this long after the start (start-up: ingest, recovery).
    KillAfter(Duration),
    /// SIGKILL this long after the run recovered (while steps run).
    KillInSteps(Duration),
}

/// How a run ended.
enum Outcome {
    /// It ran to the end.
    Finished,
    /// It crashed as it was told to (or was killed).
    Crashed,
}

/// Runs `work` as a child `sluice run` with W = `workers` on the data in
/// `dir`, crashing it as `crash` says; counts the run, and the crash if it
/// landed, in `report`.
fn run_child(
    exe: &Path,
    workers: u32,
    dir: &Path,
    work: &Workload,
    crash: Option<&Crash>,
    report: &mut ChaosReport,
) -> anyhow::Result<Outcome> {
    let mut cmd = Command::new(exe);
    cmd.arg("run")
        .arg(&work.component)
        .arg("--data")
        .arg(dir.join("data"))
        .args([
            "--workers",
            &workers.to_string(),
            "--max-batch",
            "40",
            "--checkpoint-every",
            "3",
            "--quiet",
        ])
        .args(
            work.inputs
                .iter()
                .map(|(port, file)| format!("--input={port}={}", file.display())),
        )
        .arg(format!(
            "--output={}={}",
            work.output.0,
            work.output.1.display()
        ))
        .env_remove("SLUICE_CRASH_AT")
        // The `recovered` line says when start-up ended.
        .env("SLUICE_LOG", "sluice_runtime::coordinator=debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(Crash::At(point, n)) = crash {
        cmd.env("SLUICE_CRASH_AT", format!("{}:{n}", point.name()));
    }
    report.runs += 1;
    let mut child = cmd.spawn().context("starting sluice run")?;
    let recovered = Arc::new(AtomicBool::new(false));
    let stderr = child.stderr.take().context("the child's stderr")?;
    let reader = {
        let recovered = recovered.clone();
        std::thread::spawn(move || {
            let mut log = String::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("recovered") {
                    recovered.store(true, Ordering::Relaxed);
                }
                log.push_str(&line);
                log.push('\n');
            }
            log
        })
    };
    if let Some(Crash::KillAfter(delay) | Crash::KillInSteps(delay)) = crash {
        if matches!(crash, Some(Crash::KillInSteps(_))) {
            while !recovered.load(Ordering::Relaxed) && child.try_wait()?.is_none() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let start = Instant::now();
        while start.elapsed() < *delay {
            if child.try_wait()?.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if child.try_wait()?.is_none() {
            let in_steps = recovered.load(Ordering::Relaxed);
            child.kill()?;
            child.wait()?;
            let _ = reader.join();
            report.kills += 1;
            report.kills_in_steps += u32::from(in_steps);
            return Ok(Outcome::Crashed);
        }
    }
    let status = child.wait()?;
    let log = reader.join().unwrap_or_default();
    if status.success() {
        return Ok(Outcome::Finished);
    }
    if let Some(Crash::At(point, _)) = crash
        && log.contains(&format!("sluice: crash point {}", point.name()))
    {
        *report.points_hit.entry(point.name()).or_default() += 1;
        return Ok(Outcome::Crashed);
    }
    let errors: Vec<&str> = log.lines().filter(|l| !l.contains(" DEBUG ")).collect();
    bail!("sluice run failed: {}", errors.join("\n").trim())
}

/// One trial (seed `seed`): its input, one to three crashed runs (each
/// restarting the one before), a run to the end, then the output compared
/// and the logs audited, into `report`.
fn trial(
    exe: &Path,
    opts: &ChaosOptions,
    seed: u64,
    report: &mut ChaosReport,
) -> anyhow::Result<()> {
    let mut rng = Rng::new(seed);
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let work = match &opts.noisy {
        Some(component) if seed % 2 == 1 => {
            report.noisy_trials += 1;
            noisy(dir, &mut rng, opts.orders, component)?
        }
        _ => match &opts.wordcount {
            Some(component) => {
                report.wordcount_trials += 1;
                wordcount(dir, &mut rng, opts.orders, component)?
            }
            None => orders_join(dir, &mut rng, opts.orders, &opts.component)?,
        },
    };
    let expected = &work.expected;
    let crashes = 1 + rng.below(3);
    let mut crashed = false;
    // The W of each run: fixed, or drawn anew for every run.
    let mut last_workers = opts.workers;
    let mut workers_for = |rng: &mut Rng, report: &mut ChaosReport, attempt: u64| {
        if !opts.rescale {
            return opts.workers;
        }
        let w = 1 + rng.below(4) as u32;
        if attempt > 0 && w != last_workers {
            report.rescales += 1;
        }
        last_workers = w;
        w
    };
    for attempt in 0..crashes {
        let workers = workers_for(&mut rng, report, attempt);
        let crash = if rng.below(4) == 0 {
            if rng.below(2) == 0 {
                Crash::KillAfter(Duration::from_millis(5 + rng.below(80)))
            } else {
                Crash::KillInSteps(Duration::from_millis(rng.below(25)))
            }
        } else {
            // Only the first run ingests, and only a restart replays: pick
            // among the points this run can reach.
            // A layout change only happens on a restart with another W.
            let rescaling = opts.rescale && attempt > 0;
            let reachable: Vec<CrashPoint> = CrashPoint::ALL
                .into_iter()
                .chain(CrashPoint::RESCALE.into_iter().filter(|_| rescaling))
                .filter(|p| match p {
                    CrashPoint::MidIngest => attempt == 0,
                    CrashPoint::DuringReplay => attempt > 0,
                    _ => true,
                })
                .collect();
            let point = reachable[rng.below(reachable.len() as u64) as usize];
            let n = match point {
                CrashPoint::MidIngest
                | CrashPoint::DuringReplay
                | CrashPoint::MidHandoff
                | CrashPoint::AfterRelayout => 1,
                _ => 1 + rng.below(8),
            };
            Crash::At(point, n)
        };
        report.restarts += u32::from(crashed);
        crashed = matches!(
            run_child(exe, workers, dir, &work, Some(&crash), report)?,
            Outcome::Crashed
        );
        if !crashed {
            break;
        }
    }
    report.restarts += u32::from(crashed);
    let workers = workers_for(&mut rng, report, crashes);
    if let Outcome::Crashed = run_child(exe, workers, dir, &work, None, report)? {
        bail!("a run without a crash point crashed");
    }

    let mut got: BTreeMap<String, i64> = BTreeMap::new();
    for line in std::fs::read_to_string(&work.output.1)?.lines() {
        let (v, w) = sluice_core::wire::parse_output_line(line)?;
        *got.entry((work.key)(&v)).or_default() += w;
    }
    got.retain(|_, w| *w != 0);
    let diff = Differences::of(expected, &got);
    report.lost += diff.lost;
    report.duplicated += diff.duplicated;
    report.wrong += diff.wrong;
    let mut violation = diff.first;
    let database = sluice_embedded::db::open(&dir.join("data"))?;
    if let Verdict::Violation(v) = audit_embedded(&database)? {
        report.audit_failures += 1;
        violation.get_or_insert(format!("audit: {v}"));
    }
    if let Some(v) = violation
        && report.first_violation.is_none()
    {
        report.first_violation = Some(format!("trial seed {seed}: {v}"));
    }
    Ok(())
}

/// Runs a campaign. `exe` is the `sluice` binary to crash.
pub fn chaos(exe: &Path, opts: &ChaosOptions) -> anyhow::Result<ChaosReport> {
    let mut report = ChaosReport::default();
    let bar = if opts.progress {
        ProgressBar::new(opts.trials as u64)
    } else {
        ProgressBar::hidden()
    };
    if let Ok(style) = ProgressStyle::with_template("chaos {wide_bar} {pos}/{len} trials {msg}") {
        bar.set_style(style);
    }
    for i in 0..opts.trials {
        let seed = opts.seed.wrapping_add(i as u64);
        trial(exe, opts, seed, &mut report).with_context(|| format!("trial with seed {seed}"))?;
        report.trials += 1;
        bar.inc(1);
        bar.set_message(format!("{} violations", report.violations()));
    }
    bar.finish_and_clear();
    Ok(report)
}
