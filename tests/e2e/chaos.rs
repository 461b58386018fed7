//! The crash campaign, short: `sluice chaos` crashes a keyed pipeline
//! (join + aggregate, W=2, inserts and deletes) at named crash points and
//! random moments and finds no lost, duplicated or wrong result and no
//! audit violation.

use crate::support::{component, sluice_cmd};

/// Runs `sluice chaos` with `args` (plus the two circuits); asserts it
/// found no violation and returns its report.
fn campaign(args: &[&str]) -> String {
    let mut cmd = sluice_cmd();
    cmd.arg("chaos")
        .args(args)
        .arg("--component")
        .arg(component("examples/orders-join"))
        .arg("--noisy-component")
        .arg(component("tests/guests/noisy"));
    no_violation(cmd)
}

/// Runs a `sluice chaos` command; asserts it passed with no violation and
/// returns its report.
fn no_violation(mut cmd: std::process::Command) -> String {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("violations: 0 (lost 0, duplicated 0, wrong 0, audit failures 0)"),
        "{stdout}"
    );
    stdout
}

#[test]
fn a_short_crash_campaign_finds_no_violation() {
    let stdout = campaign(&["--trials", "30", "--seed", "7"]);
    assert!(
        stdout.contains("trials: 30 (15 of the noisy circuit)"),
        "{stdout}"
    );
    // The campaign really crashed the pipeline at named points.
    let hits: u32 = stdout
        .lines()
        .find(|l| l.starts_with("crash points hit:"))
        .unwrap()
        .split_whitespace()
        .filter_map(|kv| kv.split_once('=')?.1.parse::<u32>().ok())
        .sum();
    assert!(hits >= 15, "{stdout}");
}

#[test]
fn three_workers_survive_a_crash_campaign_too() {
    campaign(&["--trials", "10", "--seed", "31", "--workers", "3"]);
}

/// Layout changes in the campaign (issue #12): every run picks its W
/// between 1 and 4, so restarts rescale (after recovery, before the steps
/// go on), and crashes land in the middle of the hand-off and right after
/// the new layout's first step too.
#[test]
fn rescales_between_and_during_runs_survive_a_crash_campaign() {
    let stdout = campaign(&["--trials", "24", "--seed", "12012", "--rescale"]);
    let rescales: u32 = stdout
        .split("rescales: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(rescales >= 10, "{stdout}");
}

/// The campaign across hosts: worker hosts killed and stalled past the
/// session timeout, the coordinator crashed mid-step, hosts joining and
/// leaving live; every kind of fault lands and no trial loses or repeats an
/// effect, with the hosts reading their own input and writing and restoring
/// their own checkpoint pieces.
#[test]
fn a_short_campaign_across_hosts_finds_no_violation() {
    let mut cmd = sluice_cmd();
    cmd.args(["chaos", "--hosts", "--trials", "16", "--seed", "4242"])
        .arg("--component")
        .arg(component("examples/wordcount"));
    let stdout = no_violation(cmd);
    let count = |what: &str| -> u32 {
        let at = stdout
            .find(what)
            .unwrap_or_else(|| panic!("{what} in {stdout}"));
        stdout[..at]
            .split_whitespace()
            .last()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(
        count(" host kills") > 0
            && count(" host stalls") > 0
            && count(" leader crashes") > 0
            && count(" joins") > 0
            && count(" leaves") > 0,
        "every kind of fault landed: {stdout}"
    );
    // The hosts read their own input, wrote their own checkpoint pieces,
    // and restores read some state from the hosts' own copies.
    assert!(
        count(" input events themselves") > 0
            && count(" bytes of checkpoint pieces") > 0
            && count(" bytes from the hosts' own copies") > 0,
        "{stdout}"
    );
}
