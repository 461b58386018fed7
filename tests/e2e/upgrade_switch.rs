//! Changing a running circuit (issue #31), the switch: `sluice upgrade`
//! moves a pipeline's data directory to another version of its circuit at
//! the checkpoint of its last step, and `sluice run` goes on with the new
//! version — its state carried where the new version keeps an operator, a
//! new operator started empty, a changed one refused by name — exactly
//! once through SIGKILLs before, during and after the switch.

use crate::support::crash::{Rng, aborted_at, env_count, seeded};
use crate::support::{component, python_component, recount, sluice_cmd, stderr};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

/// `lines` lines of words from a small vocabulary, some later deleted
/// (also lines of `earlier`): the file's JSON lines and the (line, weight)
/// pairs they mean.
pub(crate) fn input(
    rng: &mut Rng,
    lines: usize,
    earlier: &[(String, i64)],
) -> (String, Vec<(String, i64)>) {
    let (mut text, mut pairs) = (String::new(), Vec::<(String, i64)>::new());
    for _ in 0..lines {
        let inserted: Vec<&(String, i64)> = earlier.iter().chain(&pairs).collect();
        if inserted.len() > 10 && rng.below(15) == 0 {
            let victim = inserted[rng.below(inserted.len() as u64) as usize]
                .0
                .clone();
            text += &format!("{}\n", serde_json::json!({ "delete": victim }));
            pairs.push((victim, -1));
        } else {
            let n = 1 + rng.below(5);
            let line: Vec<String> = (0..n)
                .map(|_| {
                    // Some plurals, which version 3 counts with their stems.
                    let plural = if rng.below(4) == 0 { "s" } else { "" };
                    format!(
                        "w{}{plural}",
                        "x".repeat(rng.below(6) as usize) + &rng.below(50).to_string()
                    )
                })
                .collect();
            let line = line.join(" ");
            text += &format!("{}\n", serde_json::to_string(&line).unwrap());
            pairs.push((line, 1));
        }
    }
    (text, pairs)
}

/// `sluice run COMPONENT --data DATA` over `file` (input `lines`), writing
/// the outputs named into `dir`.
pub(crate) fn run_cmd(
    wasm: &Path,
    data: &Path,
    file: &Path,
    outputs: &[&str],
    dir: &Path,
) -> std::process::Command {
    let mut cmd = sluice_cmd();
    cmd.arg("run")
        .arg(wasm)
        .arg("--data")
        .arg(data)
        .args(["--workers", "2", "--partitions", "2"])
        .args(["--max-batch", "40", "--checkpoint-every", "3"])
        .arg(format!("--input=lines={}", file.display()))
        .env("SLUICE_LOG", "sluice=debug");
    for o in outputs {
        cmd.arg(format!(
            "--output={o}={}",
            dir.join(format!("{o}.jsonl")).display()
        ));
    }
    cmd
}

/// Runs `cmd` to the end, SIGKILLing it first up to `kills` times at
/// random moments; with `first_crash` (`POINT:N`), the first run aborts at
/// that crash point instead. Returns the kills that landed and every run's
/// standard error.
pub(crate) fn run_with_kills(
    rng: &mut Rng,
    mut cmd: impl FnMut() -> std::process::Command,
    kills: u32,
    first_crash: Option<&str>,
) -> (u32, String) {
    let (mut landed, mut logs) = (0, String::new());
    if let Some(point) = first_crash {
        let out = cmd().env("SLUICE_CRASH_AT", point).output().unwrap();
        assert!(
            !out.status.success() && aborted_at(&stderr(&out), point),
            "the first run should have aborted at {point}: {}",
            stderr(&out)
        );
        logs += &stderr(&out);
    }
    for _ in 0..kills {
        let mut child = cmd()
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut log = String::new();
            for line in
                std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok)
            {
                if line.contains("step committed") {
                    let _ = tx.send(());
                }
                log += &line;
                log.push('\n');
            }
            log
        });
        // Up to a few commits into the run: in its start-up (recovery,
        // replay), a step, a commit or a checkpoint.
        let (start, delay) = (Instant::now(), Duration::from_millis(rng.below(300)));
        let (mut commits, commits_wanted) = (0, 1 + rng.below(4));
        let kill = loop {
            if start.elapsed() >= delay || commits >= commits_wanted {
                break true;
            }
            match rx.recv_timeout(Duration::from_millis(2)) {
                Ok(()) => commits += 1,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break false,
            }
        };
        if kill && child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            child.wait().unwrap();
            landed += 1;
            logs += &reader.join().unwrap();
        } else {
            let status = child.wait().unwrap();
            let log = reader.join().unwrap();
            assert!(status.success(), "run failed: {log}");
            return (landed, logs + &log);
        }
    }
    let out = cmd().output().unwrap();
    assert!(out.status.success(), "final run failed: {}", stderr(&out));
    (landed, logs + &stderr(&out))
}

/// Runs `sluice upgrade` (`cmd`) to be killed: right after its commit
/// point (`at_commit_point`, crash point `after-upgrade`), or with a
/// SIGKILL at a random moment within `within_ms` (before its commit point
/// nothing changed, after it the pipeline is the new version's). Returns
/// its exit status and whether it was killed.
pub(crate) fn kill_upgrade(
    rng: &mut Rng,
    mut cmd: std::process::Command,
    at_commit_point: bool,
    within_ms: u64,
) -> (std::process::ExitStatus, bool) {
    if at_commit_point {
        let out = cmd
            .env("SLUICE_CRASH_AT", "after-upgrade")
            .output()
            .unwrap();
        assert!(
            aborted_at(&stderr(&out), "after-upgrade"),
            "{}",
            stderr(&out)
        );
        return (out.status, true);
    }
    let mut child = cmd.stderr(Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(rng.below(within_ms)));
    let killed = child.try_wait().unwrap().is_none();
    if killed {
        child.kill().unwrap();
    }
    (child.wait().unwrap(), killed)
}

/// `sluice upgrade COMPONENT --data DATA [extra…]`.
pub(crate) fn upgrade(wasm: &Path, data: &Path, extra: &[&str]) -> Output {
    upgrade_cmd(wasm, data, extra).output().unwrap()
}

/// An object store for a test's checkpoints (`--store`): a directory
/// under `dir`.
pub(crate) fn store_in(dir: &Path) -> String {
    format!("file://{}", dir.join("store").display())
}

/// `cmd` (`sluice run`, `upgrade` or `verify`) with its checkpoints in
/// `store`, if there is one.
pub(crate) fn with_store(
    store: &Option<String>,
    mut cmd: std::process::Command,
) -> std::process::Command {
    if let Some(url) = store {
        cmd.env("SLUICE_CHECKPOINT_STORE", url);
    }
    cmd
}

/// `sluice verify --data DATA`, its checkpoints in `store` if there is
/// one.
pub(crate) fn verify_cmd(data: &Path, store: &Option<String>) -> std::process::Command {
    let mut cmd = with_store(store, sluice_cmd());
    cmd.args(["verify", "--data"]).arg(data);
    cmd
}

/// Fails, saying `what` and what `sluice verify` printed, unless it found
/// the logs consistent.
pub(crate) fn assert_verified(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        stderr(out),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The command of [`upgrade`].
pub(crate) fn upgrade_cmd(wasm: &Path, data: &Path, extra: &[&str]) -> std::process::Command {
    let mut cmd = sluice_cmd();
    cmd.arg("upgrade")
        .arg(wasm)
        .arg("--data")
        .arg(data)
        .args(extra);
    cmd
}

/// The current value of every key of an output of `(key, count)` pairs:
/// its JSON lines integrated (each key must have one value of weight 1).
pub(crate) fn integrate_pairs(jsonl: &str) -> BTreeMap<u64, i64> {
    let mut z: BTreeMap<(u64, i64), i64> = BTreeMap::new();
    for line in jsonl.lines() {
        let (v, w) = sluice_core::wire::parse_output_line(line).unwrap();
        *z.entry((v[0].as_u64().unwrap(), v[1].as_i64().unwrap()))
            .or_default() += w;
    }
    let mut current = BTreeMap::new();
    for ((key, count), w) in z.into_iter().filter(|(_, w)| *w != 0) {
        assert_eq!(w, 1, "length {key}: count {count} has weight {w}");
        assert!(
            current.insert(key, count).is_none(),
            "length {key}: two counts"
        );
    }
    current
}

/// The counts of word lengths in `pairs`, as version 2's `lengths` counts
/// them (characters of each word; a length is there while its count is
/// positive).
pub(crate) fn recount_lengths(pairs: &[(String, i64)]) -> BTreeMap<u64, i64> {
    let mut by_len: BTreeMap<u64, i64> = BTreeMap::new();
    for (line, w) in pairs {
        for word in line.split_whitespace() {
            *by_len.entry(word.chars().count() as u64).or_default() += w;
        }
    }
    by_len.retain(|_, n| *n > 0);
    by_len
}

/// The counts of `pairs` by stem, as version 3 counts them: each word as
/// `examples/wordcount` normalizes it, without a plural's `s`; a stem is
/// there while the sum of its words' weights is positive. (Words' own
/// counts may be negative: the input deletes some lines twice. Version 3
/// adds them up as they are, and so does its migration of version 1's
/// counts.)
pub(crate) fn stem_counts(pairs: &[(String, i64)]) -> BTreeMap<String, i64> {
    let mut by_stem: BTreeMap<String, i64> = BTreeMap::new();
    for (line, w) in pairs {
        for raw in line.split_whitespace() {
            let word = raw
                .trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase();
            if !word.is_empty() {
                *by_stem.entry(stem(&word)).or_default() += w;
            }
        }
    }
    by_stem.retain(|_, n| *n > 0);
    by_stem
}

/// Version 3's stem of a normalized word (its `stem`).
fn stem(word: &str) -> String {
    match word.strip_suffix('s') {
        Some(stem) if !stem.is_empty() => stem.to_owned(),
        _ => word.to_owned(),
    }
}

/// The counts after a switch to version 3: version 1's counts of the
/// input before the switch as version 3's migration makes them — by stem,
/// the counts of a stem's words added up — with version 3's output after
/// the switch (`after`) applied. Each count version 3 retracts must be one
/// it holds, so a migration that merged wrongly (or a count a worker holds
/// for a key another worker owns) shows here as a weight other than 1.
fn migrated_then_counted(before: &[(String, i64)], after: &str) -> BTreeMap<String, i64> {
    let mut z: BTreeMap<(String, i64), i64> = stem_counts(before)
        .into_iter()
        .map(|count| (count, 1))
        .collect();
    for line in after.lines() {
        let (v, w) = sluice_core::wire::parse_output_line(line).unwrap();
        let word = v["word"].as_str().unwrap().to_owned();
        *z.entry((word, v["count"].as_i64().unwrap())).or_default() += w;
    }
    let mut current = BTreeMap::new();
    for ((word, count), w) in z.into_iter().filter(|(_, w)| *w != 0) {
        assert_eq!(w, 1, "`{word}`: count {count} has weight {w}");
        assert!(
            current.insert(word.clone(), count).is_none(),
            "`{word}`: two counts"
        );
    }
    current
}

/// Word count, then `sluice upgrade` to version 2 (its count kept under a
/// new name, a count of word lengths added on a new port), then more
/// input: the counts go on from the carried state (equal to a count of all
/// the input), the lengths count only the input after the switch (it
/// started empty). Every fourth trial upgrades to version 3 instead, whose
/// count takes version 1's through a migration to new keys (a word and
/// its plural counted as one): its counts go on from the migrated state
/// (equal to a count of all the input by stem), on two workers, so that
/// merged keys land in shards of the other worker. Each trial kills every phase — the old version's runs,
/// the upgrade itself, and the new version's, its first run right after
/// its first step, before its first checkpoint, so that the recovery
/// takes the old version's checkpoint through `upgrade` again. `sluice
/// verify` then finds the log consistent across the switch.
#[test]
fn an_upgrade_carries_the_state_exactly_once_through_kills_before_during_and_after_it() {
    let v1 = component("examples/wordcount");
    let v2 = component("tests/guests/wordcount-v2");
    let v3 = component("tests/guests/wordcount-v3");
    let mut rng = seeded("SLUICE_UPGRADE_SEED", "upgrade");
    let trials = env_count("SLUICE_UPGRADE_TRIALS", 20);
    let (mut kills, mut upgrade_kills, mut retaken) = (0, 0, 0);
    for trial in 0..trials {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        // Every other trial keeps its checkpoints in an object store
        // (`--store`, here a directory): the upgrade reads the newest
        // there, and recoveries after it restore from there.
        let store = (trial % 2 == 1).then(|| store_in(dir.path()));
        let on_store = |cmd| with_store(&store, cmd);
        let (before, before_pairs) = input(&mut rng, 600, &[]);
        let (after, after_pairs) = input(&mut rng, 600, &before_pairs);
        let (a, b) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
        std::fs::write(&a, before).unwrap();
        std::fs::write(&b, after).unwrap();

        if trial == 0 {
            // A pipeline stopped between checkpoints is not upgraded.
            let out = run_cmd(&v1, &data, &a, &["counts"], dir.path())
                .env("SLUICE_CRASH_AT", "after-commit:2")
                .output()
                .unwrap();
            assert!(
                aborted_at(&stderr(&out), "after-commit:2"),
                "{}",
                stderr(&out)
            );
            let out = upgrade(&v2, &data, &[]);
            assert!(!out.status.success());
            assert!(
                stderr(&out).contains("the pipeline's last step is 1, its newest checkpoint none")
                    && stderr(&out).contains("until it stops"),
                "{}",
                stderr(&out)
            );
            // `sluice diff DATA NEW`: the pipeline's recorded operators
            // against the new version's.
            let out = sluice_cmd()
                .arg("diff")
                .arg(&data)
                .arg(&v2)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{text}{}", stderr(&out));
            assert!(
                text.contains("state carried over (the old version's `keyed_sum#0/1`)"),
                "{text}"
            );
            assert!(text.contains("output ports added: lengths"), "{text}");
        }
        let n = 1 + rng.below(2) as u32;
        let (k, _) = run_with_kills(
            &mut rng,
            || on_store(run_cmd(&v1, &data, &a, &["counts"], dir.path())),
            n,
            None,
        );
        kills += k;
        let counts_file = dir.path().join("counts.jsonl");
        let before_lines = std::fs::read_to_string(&counts_file)
            .unwrap()
            .lines()
            .count();
        // Every other trial starts the kept count empty: the new version's
        // counts then count the input after the switch only — also after
        // a recovery, which must start it empty again.
        let fresh = trial % 2 == 0;
        let migrated = trial % 4 == 3;
        let next = if migrated { &v3 } else { &v2 };
        if trial == 3 {
            let out = sluice_cmd()
                .arg("diff")
                .arg(&data)
                .arg(next)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{text}{}", stderr(&out));
            assert!(
                text.contains("state carried over through the new version's migration"),
                "{text}"
            );
        }
        let extra: &[&str] = if fresh {
            &["--start-empty", "counts"]
        } else {
            &[]
        };
        if trial == 1 {
            // Checkpoints in a store the upgrade is not told of: refused,
            // by name (its data directory holds no checkpoint).
            let out = upgrade(next, &data, extra);
            assert!(!out.status.success());
            assert!(
                stderr(&out).contains("upgrade it with the --store it runs with"),
                "{}",
                stderr(&out)
            );
            let stored = std::fs::read_dir(dir.path().join("store")).unwrap().count();
            assert!(stored > 0, "no checkpoint in the store");
        }
        // The upgrade, killed first: at a random moment (before its commit
        // point nothing changed, after it the pipeline is version 2's), or
        // every third trial right after its commit point.
        let first = on_store(upgrade_cmd(next, &data, extra));
        let (status, killed) = kill_upgrade(&mut rng, first, trial % 3 == 2, 60);
        upgrade_kills += u32::from(killed);
        // Again: made now, or it was made before the kill (a kill can land
        // after the commit point too).
        let out = on_store(upgrade_cmd(next, &data, extra)).output().unwrap();
        if out.status.success() {
            assert!(!status.success(), "made twice: {}", stderr(&out));
            assert!(
                stderr(&out).contains("new outputs, written from the next step on: lengths"),
                "{}",
                stderr(&out)
            );
        } else {
            assert!(
                stderr(&out).contains("already runs component"),
                "{}",
                stderr(&out)
            );
        }

        if trial == 0 {
            // Another change before version 2 ran a step is refused.
            let out = upgrade(&v1, &data, &[]);
            assert!(!out.status.success());
            assert!(
                stderr(&out).contains("has run no step since its last upgrade"),
                "{}",
                stderr(&out)
            );
        }
        // Version 2's first run aborts right after its first commit,
        // before its first checkpoint: the next takes version 1's
        // checkpoint through `upgrade` again and replays that step.
        let n = rng.below(3) as u32;
        let (k, log) = run_with_kills(
            &mut rng,
            || on_store(run_cmd(next, &data, &b, &["counts", "lengths"], dir.path())),
            n,
            Some("after-commit:1"),
        );
        kills += k;
        let this = log
            .matches("taking the checkpoint of the component before the upgrade")
            .count();
        assert!(
            this >= 2,
            "trial {trial}: the old checkpoint taken through `upgrade` {this} times"
        );
        retaken += this;

        let counts = std::fs::read_to_string(&counts_file).unwrap();
        if migrated {
            let after: String = counts
                .lines()
                .skip(before_lines)
                .map(|l| format!("{l}\n"))
                .collect();
            let all: Vec<(String, i64)> =
                before_pairs.iter().chain(&after_pairs).cloned().collect();
            assert_eq!(
                migrated_then_counted(&before_pairs, &after),
                stem_counts(&all),
                "trial {trial}: the counts go on from the migrated state"
            );
        } else if fresh {
            // No retraction is invented for version 1's counts: the log
            // after the switch holds the new counts alone.
            let after: String = counts
                .lines()
                .skip(before_lines)
                .map(|l| format!("{l}\n"))
                .collect();
            let got = sluice_tools::demo::integrate_counts(&after).unwrap();
            let expected = recount(after_pairs.iter().map(|(l, w)| (l.as_str(), *w)));
            assert_eq!(
                got, expected,
                "trial {trial}: the count started empty at the switch"
            );
        } else {
            let got = sluice_tools::demo::integrate_counts(&counts).unwrap();
            let all: Vec<(String, i64)> =
                before_pairs.iter().chain(&after_pairs).cloned().collect();
            let expected = recount(all.iter().map(|(l, w)| (l.as_str(), *w)));
            assert_eq!(
                got, expected,
                "trial {trial}: the counts go on from the carried state"
            );
        }
        let lengths = std::fs::read_to_string(dir.path().join("lengths.jsonl")).unwrap();
        assert_eq!(
            integrate_pairs(&lengths),
            recount_lengths(&after_pairs),
            "trial {trial}: the new count started empty at the switch"
        );
        let out = verify_cmd(&data, &store).output().unwrap();
        assert_verified(&out, &format!("trial {trial}"));
        // The old version no longer opens the pipeline.
        let out = on_store(run_cmd(&v1, &data, &a, &["counts"], dir.path()))
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(
            stderr(&out).contains("`sluice upgrade` moves"),
            "{}",
            stderr(&out)
        );
    }
    eprintln!(
        "upgrade test: {trials} trials, {kills} SIGKILLs of runs, {upgrade_kills} of upgrades; \
         the old version's checkpoint taken through `upgrade` {retaken} times"
    );
}

/// A Python word count whose count became a sum under the same identity:
/// `sluice upgrade` refuses it naming the operator and changes nothing
/// (the old version runs on); with the operator started empty it is
/// made, and the sums start from the input after the switch.
#[test]
fn an_upgrade_that_changes_an_operator_is_refused_by_name_unless_it_starts_empty() {
    let v1 = component("examples/python-wordcount");
    let dir = tempfile::tempdir().unwrap();
    let v2 = python_component(
        dir.path(),
        "sums",
        r#"import sluice


def build(c):
    (
        c.input("lines")
        .flat_map(lambda line: line.lower().split())
        .sum_by(lambda word: word, lambda word: 2)
        .map(lambda pair: {"word": pair[0], "count": pair[1]})
        .output("counts")
    )


Circuit = sluice.export(build)
"#,
    );
    let data = dir.path().join("data");
    let (a, b) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
    let mut f = std::fs::File::create(&a).unwrap();
    writeln!(f, "\"the cat\"\n\"the dog\"").unwrap();
    std::fs::write(&b, "\"the end\"\n").unwrap();
    let run = |wasm: &Path, file: &Path| {
        let out = run_cmd(wasm, &data, file, &["counts"], dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        std::fs::read_to_string(dir.path().join("counts.jsonl")).unwrap()
    };
    let counts = |text: &str| sluice_tools::demo::integrate_counts(text).unwrap();
    run(&v1, &a);

    let out = upgrade(&v2, &data, &[]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("keyed_sum#0/1"),
        "the refusal names the operator: {}",
        stderr(&out)
    );
    // Nothing changed: version 1 runs on, from its state.
    let before = run(&v1, &b);
    assert_eq!(counts(&before)["the"], 3);

    let out = upgrade(&v2, &data, &["--start-empty", "keyed_sum#0/1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let c = dir.path().join("c.jsonl");
    std::fs::write(&c, "\"the cat again\"\n").unwrap();
    // The log holds version 1's counts (no retraction is invented for
    // them), then version 2's sums from empty: two per word of the line.
    let text = run(&v2, &c);
    let events: Vec<(String, i64, i64)> = text
        .lines()
        .map(|l| {
            let (v, w) = sluice_core::wire::parse_output_line(l).unwrap();
            (
                v["word"].as_str().unwrap().to_owned(),
                v["count"].as_i64().unwrap(),
                w,
            )
        })
        .collect();
    let switch = before.lines().count();
    assert!(
        text.starts_with(&before),
        "the log before the switch stays: {text}"
    );
    let mut new: Vec<(String, i64, i64)> = events[switch..].to_vec();
    new.sort();
    let expected: Vec<(String, i64, i64)> = ["again", "cat", "the"]
        .iter()
        .map(|w| (w.to_string(), 2, 1))
        .collect();
    assert_eq!(new, expected, "{text}");
    let out = upgrade(&v2, &data, &["--start-empty", "keyed_sum#0/1"]);
    assert!(
        stderr(&out).contains("already runs component"),
        "{}",
        stderr(&out)
    );
}

/// A Python word count upgraded to a version that counts stems (`cats` as
/// `cat`) and migrates the old counts' keys (`state_version(1)`,
/// `migrates_keys_from(0, stem)`): `sluice diff` says migrated, and after
/// the switch the counts go on from the merged state, on two workers.
#[test]
fn a_python_count_takes_the_old_counts_through_its_migration() {
    let v1 = component("examples/python-wordcount");
    let dir = tempfile::tempdir().unwrap();
    let v2 = python_component(
        dir.path(),
        "stems",
        r#"import sluice


def stem(w):
    return w[:-1] if w.endswith("s") and len(w) > 1 else w


def build(c):
    (
        c.input("lines")
        .flat_map(lambda line: line.lower().split())
        .count_by(stem)
        .state_version(1)
        .migrates_keys_from(0, stem)
        .map(lambda pair: {"word": pair[0], "count": pair[1]})
        .output("counts")
    )


Circuit = sluice.export(build)
"#,
    );
    let data = dir.path().join("data");
    let (a, b) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
    std::fs::write(&a, "\"the cats\"\n\"a cat\"\n\"cats\"\n").unwrap();
    std::fs::write(&b, "\"cats and dogs\"\n").unwrap();
    let run = |wasm: &Path, file: &Path| {
        let out = run_cmd(wasm, &data, file, &["counts"], dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        std::fs::read_to_string(dir.path().join("counts.jsonl")).unwrap()
    };
    let before = run(&v1, &a);
    let out = sluice_cmd()
        .arg("diff")
        .arg(&data)
        .arg(&v2)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("migrated") && text.contains("the upgrade would be accepted"),
        "{text}{}",
        stderr(&out)
    );
    let out = upgrade(&v2, &data, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = run(&v2, &b);
    let mut after: Vec<(String, i64, i64)> = text
        .lines()
        .skip(before.lines().count())
        .map(|l| {
            let (v, w) = sluice_core::wire::parse_output_line(l).unwrap();
            let word = v["word"].as_str().unwrap().to_owned();
            (word, v["count"].as_i64().unwrap(), w)
        })
        .collect();
    after.sort();
    // `cats` 2 and `cat` 1 became `cat` 3; one more `cats` makes it 4.
    let expected: Vec<(String, i64, i64)> =
        [("and", 1, 1), ("cat", 3, -1), ("cat", 4, 1), ("dog", 1, 1)]
            .iter()
            .map(|(w, n, d)| (w.to_string(), *n, *d))
            .collect();
    assert_eq!(after, expected, "{text}");
}

/// Word count on a server, upgraded to version 2 with `sluice upgrade
/// --pipeline`: a refused upgrade (a start-empty naming no operator) leaves
/// it running version 1; the upgrade checkpoints it and switches, the
/// counts go on from the carried state and the new `lengths` count the
/// input pushed after the switch.
#[test]
fn a_pipeline_on_a_server_is_upgraded_and_its_counts_go_on() {
    use crate::support::server::Server;
    let v1 = component("examples/wordcount");
    let v2 = component("tests/guests/wordcount-v2");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let tenant = server.tenant("acme");
    tenant.deploy(&v1, "wordcount", "wc", 2, false).unwrap();
    let input = ServerInput::new(&mut Rng(7), 400, dir.path());
    input.push_first(&tenant);

    let upgrade = |extra: &[&str]| {
        sluice_cmd()
            .arg("upgrade")
            .arg(&v2)
            .args(["--pipeline", "wc", "--server", server.url.as_str()])
            .args(["--token", tenant.token()])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = upgrade(&["--start-empty", "nope"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no operator of the new component"),
        "{}",
        stderr(&out)
    );
    let status: serde_json::Value =
        serde_json::from_str(&tenant.status(Some("wc")).unwrap()).unwrap();
    assert_eq!(status["component"], "wordcount", "{status}");

    // Listed all through the upgrade (in state `upgrading` while it is
    // unloaded), never missing; and its own status answers all through
    // too (the console polls it), never an error.
    let upgraded = std::sync::atomic::AtomicBool::new(false);
    let listed = std::thread::scope(|scope| {
        let lister = scope.spawn(|| {
            let mut states = Vec::new();
            while !upgraded.load(std::sync::atomic::Ordering::SeqCst) {
                let list: serde_json::Value =
                    serde_json::from_str(&tenant.status(None).unwrap()).unwrap();
                let wc = list
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|p| p["name"] == "wc")
                    .map(|p| p["state"].as_str().unwrap().to_owned());
                states.push(wc);
                let own = tenant.status(Some("wc")).map(|s| {
                    serde_json::from_str::<serde_json::Value>(&s).unwrap()["state"]
                        .as_str()
                        .unwrap()
                        .to_owned()
                });
                states.push(own.ok());
                std::thread::sleep(Duration::from_millis(2));
            }
            states
        });
        let out = upgrade(&[]);
        upgraded.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(out.status.success(), "{}", stderr(&out));
        lister.join().unwrap()
    });
    assert!(
        listed.iter().all(Option::is_some),
        "the pipeline went missing from the list, or its status failed, during its upgrade: \
         {listed:?}"
    );
    eprintln!(
        "listings during the upgrade: {}, {} of them `upgrading`",
        listed.len(),
        listed
            .iter()
            .filter(|s| s.as_deref() == Some("upgrading"))
            .count()
    );
    let status: serde_json::Value =
        serde_json::from_str(&tenant.status(Some("wc")).unwrap()).unwrap();
    assert_eq!(status["component"], "wordcount_v2", "{status}");
    input.push_second_to_version_2(&tenant);
}

/// A server that dies right after an upgrade's commit point — the
/// pipeline's data directory runs version 2, the server's registry still
/// names version 1 — settles the upgrade when it starts again: the
/// pipeline loads as version 2 (not "belongs to another component"), and
/// counts on from version 1's state.
#[test]
fn a_server_that_dies_inside_an_upgrade_settles_it_when_it_starts_again() {
    use crate::support::server::Server;
    let v1 = component("examples/wordcount");
    let v2 = component("tests/guests/wordcount-v2");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start_with_env(&data, &[], &[("SLUICE_CRASH_AT", "after-upgrade")]);
    let tenant = server.tenant("acme");
    let token = tenant.token().to_owned();
    tenant.deploy(&v1, "wordcount", "wc", 2, false).unwrap();
    let input = ServerInput::new(&mut Rng(11), 300, dir.path());
    input.push_first(&tenant);

    let out = sluice_cmd()
        .arg("upgrade")
        .arg(&v2)
        .args([
            "--pipeline",
            "wc",
            "--server",
            server.url.as_str(),
            "--token",
            &token,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the server should have died");
    assert!(
        server.wait_exit(Duration::from_secs(30)),
        "the server did not stop at the crash point"
    );

    let server = Server::start(&data);
    let tenant = sluice::client::Client::new(&server.url, &token);
    let status: serde_json::Value =
        serde_json::from_str(&tenant.status(Some("wc")).unwrap()).unwrap();
    assert_eq!(status["component"], "wordcount_v2", "{status}");
    assert!(status["last_error"].is_null(), "{status}");
    input.push_second_to_version_2(&tenant);
}

/// Word count's input for the server upgrade tests: `a.jsonl` and
/// `b.jsonl` in a directory (`lines` lines each, the second deleting some
/// of the first's), and the (line, weight) pairs of each.
pub(crate) struct ServerInput {
    pub(crate) a: std::path::PathBuf,
    pub(crate) b: std::path::PathBuf,
    pub(crate) before: Vec<(String, i64)>,
    pub(crate) after: Vec<(String, i64)>,
}

impl ServerInput {
    pub(crate) fn new(rng: &mut Rng, lines: usize, dir: &Path) -> ServerInput {
        let (before_text, before) = input(rng, lines, &[]);
        let (after_text, after) = input(rng, lines, &before);
        let (a, b) = (dir.join("a.jsonl"), dir.join("b.jsonl"));
        std::fs::write(&a, before_text).unwrap();
        std::fs::write(&b, after_text).unwrap();
        ServerInput {
            a,
            b,
            before,
            after,
        }
    }

    /// Pushes `a.jsonl` to pipeline `wc` (version 1) and waits for its
    /// counts.
    pub(crate) fn push_first(&self, tenant: &sluice::client::Client) {
        use crate::support::server::integrated_counts;
        tenant
            .push("wc", "lines", &self.a, &Default::default())
            .unwrap();
        let expected = recount(self.before.iter().map(|(l, w)| (l.as_str(), *w)));
        wait_for(tenant, "version 1's counts", &|| {
            integrated_counts(tenant, "wc") == expected
        });
    }

    /// Pushes `b.jsonl` to pipeline `wc`, upgraded to version 2: its counts
    /// go on from version 1's, and the new `lengths` count what came after
    /// the switch.
    pub(crate) fn push_second_to_version_2(&self, tenant: &sluice::client::Client) {
        use crate::support::server::{integrated_counts, output_lines};
        tenant
            .push("wc", "lines", &self.b, &Default::default())
            .unwrap();
        let all: Vec<(String, i64)> = self.before.iter().chain(&self.after).cloned().collect();
        let expected = recount(all.iter().map(|(l, w)| (l.as_str(), *w)));
        wait_for(tenant, "version 2's counts", &|| {
            integrated_counts(tenant, "wc") == expected
        });
        let lengths = recount_lengths(&self.after);
        wait_for(tenant, "version 2's lengths", &|| {
            integrate_pairs(&output_lines(tenant, "wc", "lengths")) == lengths
        });
    }
}

/// Waits up to 120 s until `done`, failing with `what` and pipeline `wc`'s
/// status.
pub(crate) fn wait_for(client: &sluice::client::Client, what: &str, done: &dyn Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}: {}",
            client.status(Some("wc")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
