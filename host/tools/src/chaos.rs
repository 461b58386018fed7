//! `sluice chaos`: a crash campaign against the exactly-once promise.
//!
//! Every trial runs a keyed pipeline (orders joined with customers, revenue
//! summed per region: two exchanges, W workers) over freshly generated input
//! with retractions (deleted orders, customers moving region) as a child
//! `sluice run`, crashes it one to three times, either at a named crash
//! point (`SLUICE_CRASH_AT`, see [`crash`](sluice_core::crash)) or with a
//! SIGKILL at a random moment, restarts it until it finishes, and compares
//! the integrated output with a from-scratch computation. It also audits the
//! logs ([`audit_embedded`]). Violations are counted as
//! lost (an expected result missing), duplicated (present too often), wrong
//! (never expected) and audit failures.

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use sluice_core::crash::CrashPoint;
use sluice_embedded::audit::audit_embedded;
use sluice_storage::audit::Verdict;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
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
    /// Workers W.
    pub workers: u32,
    /// Orders per trial.
    pub orders: u32,
    /// Show a progress bar.
    pub progress: bool,
}

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
        writeln!(
            f,
            "trials: {}  runs: {}  restarts: {}  random kills: {}",
            self.trials, self.runs, self.restarts, self.kills
        )?;
        write!(f, "crash points hit:")?;
        for p in CrashPoint::ALL {
            write!(
                f,
                " {}={}",
                p.name(),
                self.points_hit.get(p.name()).copied().unwrap_or(0)
            )?;
        }
        writeln!(f)?;
        write!(
            f,
            "violations: {} (lost {}, duplicated {}, wrong {}, audit failures {})",
            self.violations(),
            self.lost,
            self.duplicated,
            self.wrong,
            self.audit_failures
        )?;
        if let Some(v) = &self.first_violation {
            write!(f, "\nfirst violation: {v}")?;
        }
        Ok(())
    }
}

/// xorshift64*, seeded per trial.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

/// Writes a trial's input and returns the expected integrated output.
fn generate(dir: &Path, rng: &mut Rng, orders: u32) -> anyhow::Result<BTreeMap<String, i64>> {
    let regions = ["north", "south", "east", "west", "central"];
    let customers = 1 + orders as u64 / 20;
    let mut region_of: BTreeMap<u64, usize> = BTreeMap::new();
    let mut customer_lines = Vec::new();
    for id in 0..customers {
        let r = rng.below(regions.len() as u64) as usize;
        customer_lines
            .push(json!({"id": id, "name": format!("c{id}"), "region": regions[r]}).to_string());
        region_of.insert(id, r);
    }
    let mut live: BTreeMap<u64, (u64, i64)> = BTreeMap::new();
    let mut order_lines = Vec::new();
    for id in 0..orders as u64 {
        let (customer, amount) = (rng.below(customers), 1 + rng.below(500) as i64);
        order_lines.push(json!({"id": id, "customer": customer, "amount": amount}).to_string());
        live.insert(id, (customer, amount));
        if rng.below(8) == 0 && !live.is_empty() {
            let victim = *live
                .keys()
                .nth(rng.below(live.len() as u64) as usize)
                .expect("non-empty");
            let (c, a) = live.remove(&victim).expect("present");
            order_lines
                .push(json!({"delete": {"id": victim, "customer": c, "amount": a}}).to_string());
        }
        if rng.below(40) == 0 {
            let c = rng.below(customers);
            let (old, new) = (region_of[&c], rng.below(regions.len() as u64) as usize);
            customer_lines.push(
                json!({"delete": {"id": c, "name": format!("c{c}"), "region": regions[old]}})
                    .to_string(),
            );
            customer_lines.push(
                json!({"id": c, "name": format!("c{c}"), "region": regions[new]}).to_string(),
            );
            region_of.insert(c, new);
        }
    }
    std::fs::write(dir.join("orders.jsonl"), order_lines.join("\n") + "\n")?;
    std::fs::write(
        dir.join("customers.jsonl"),
        customer_lines.join("\n") + "\n",
    )?;
    let mut revenue: BTreeMap<&str, i64> = BTreeMap::new();
    for (customer, amount) in live.values() {
        *revenue.entry(regions[region_of[customer]]).or_default() += amount;
    }
    Ok(revenue
        .into_iter()
        .map(|(region, revenue)| (json!({"region": region, "revenue": revenue}).to_string(), 1))
        .collect())
}

enum Crash {
    At(CrashPoint, u64),
    KillAfter(Duration),
}

enum Outcome {
    Finished,
    Crashed,
}

fn run_child(
    exe: &Path,
    opts: &ChaosOptions,
    dir: &Path,
    crash: Option<&Crash>,
    report: &mut ChaosReport,
) -> anyhow::Result<Outcome> {
    let mut cmd = Command::new(exe);
    cmd.arg("run")
        .arg(&opts.component)
        .arg("--data")
        .arg(dir.join("data"))
        .args([
            "--workers",
            &opts.workers.to_string(),
            "--max-batch",
            "40",
            "--checkpoint-every",
            "3",
            "--quiet",
        ])
        .arg(format!(
            "--input=orders={}",
            dir.join("orders.jsonl").display()
        ))
        .arg(format!(
            "--input=customers={}",
            dir.join("customers.jsonl").display()
        ))
        .arg(format!(
            "--output=revenue={}",
            dir.join("revenue.jsonl").display()
        ))
        .env_remove("SLUICE_CRASH_AT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(Crash::At(point, n)) = crash {
        cmd.env("SLUICE_CRASH_AT", format!("{}:{n}", point.name()));
    }
    report.runs += 1;
    let mut child = cmd.spawn().context("starting sluice run")?;
    if let Some(Crash::KillAfter(delay)) = crash {
        let start = Instant::now();
        while start.elapsed() < *delay {
            if child.try_wait()?.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if child.try_wait()?.is_none() {
            child.kill()?;
            child.wait()?;
            report.kills += 1;
            return Ok(Outcome::Crashed);
        }
    }
    let out = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        return Ok(Outcome::Finished);
    }
    if let Some(Crash::At(point, _)) = crash
        && stderr.contains(&format!("sluice: crash point {}", point.name()))
    {
        *report.points_hit.entry(point.name()).or_default() += 1;
        return Ok(Outcome::Crashed);
    }
    bail!("sluice run failed: {}", stderr.trim())
}

fn trial(
    exe: &Path,
    opts: &ChaosOptions,
    seed: u64,
    report: &mut ChaosReport,
) -> anyhow::Result<()> {
    let mut rng = Rng::new(seed);
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let expected = generate(dir, &mut rng, opts.orders)?;
    let crashes = 1 + rng.below(3);
    let mut crashed = false;
    for attempt in 0..crashes {
        let crash = if rng.below(4) == 0 {
            Crash::KillAfter(Duration::from_millis(5 + rng.below(150)))
        } else {
            // Only the first run ingests, and only a restart replays: pick
            // among the points this run can reach.
            let reachable: Vec<CrashPoint> = CrashPoint::ALL
                .into_iter()
                .filter(|p| match p {
                    CrashPoint::MidIngest => attempt == 0,
                    CrashPoint::DuringReplay => attempt > 0,
                    _ => true,
                })
                .collect();
            let point = reachable[rng.below(reachable.len() as u64) as usize];
            let n = match point {
                CrashPoint::MidIngest | CrashPoint::DuringReplay => 1,
                _ => 1 + rng.below(8),
            };
            Crash::At(point, n)
        };
        report.restarts += u32::from(crashed);
        crashed = matches!(
            run_child(exe, opts, dir, Some(&crash), report)?,
            Outcome::Crashed
        );
        if !crashed {
            break;
        }
    }
    report.restarts += u32::from(crashed);
    if let Outcome::Crashed = run_child(exe, opts, dir, None, report)? {
        bail!("a run without a crash point crashed");
    }

    let mut got: BTreeMap<String, i64> = BTreeMap::new();
    for line in std::fs::read_to_string(dir.join("revenue.jsonl"))?.lines() {
        let (v, w) = sluice_core::wire::parse_output_line(line)?;
        *got.entry(v.to_string()).or_default() += w;
    }
    got.retain(|_, w| *w != 0);
    let mut violation = None;
    for (value, e) in &expected {
        let g = got.get(value).copied().unwrap_or(0);
        if g < *e {
            report.lost += (e - g) as u64;
            violation.get_or_insert(format!("lost {value}"));
        } else if g > *e {
            report.duplicated += (g - e) as u64;
            violation.get_or_insert(format!("duplicated {value}"));
        }
    }
    for (value, g) in &got {
        if !expected.contains_key(value) {
            report.wrong += g.unsigned_abs();
            violation.get_or_insert(format!("wrong {value}"));
        }
    }
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
