//! Changing a running circuit (issue #31), rebuilding: a pipeline that
//! keeps all its input (`--retain-input`) is upgraded with `--rebuild`, and
//! the operators the new version adds are rebuilt from that input instead
//! of starting empty; each output port gets, in the first step after the
//! switch, the difference between the new version's output (as the rebuild
//! computed it) and its log — exactly once through SIGKILLs before, during
//! and after the switch.

use crate::support::crash::{Rng, env_count, seeded};
use crate::support::{component, recount, sluice_cmd, stderr};
use crate::upgrade_switch::{
    assert_verified, input, integrate_pairs, kill_upgrade, recount_lengths, run_cmd,
    run_with_kills, stem_counts, store_in, upgrade, upgrade_cmd, verify_cmd, with_store,
};

/// Word count keeping its input, then `sluice upgrade --rebuild` to
/// version 2, then more input: the count of word lengths that version 2
/// adds is rebuilt from all the input, and its new output port gets the
/// rebuilt counts at the switch, so the `lengths` log integrates to the
/// lengths of *all* the input (without `--rebuild` it counts only the
/// input after the switch); the kept word counts go on as before. Each
/// trial kills the old version's runs, the upgrade (at random, and every
/// third trial right after its commit point), and the new version's first
/// run right after its first commit, so that recoveries make the rebuild
/// again and replay the step that carries the switch's output, its hash
/// checked. Every other trial upgrades to version 3 instead, whose word
/// count keys by stem (`cats` counts as `cat`): rebuilt, its counts are
/// those of all the input by stem, and the switch retracts version 1's
/// counts of words and inserts the counts of stems, so that the `counts`
/// log integrates to the stem counts of all the input. A pipeline that did
/// not keep its input is refused, saying why.
#[test]
fn an_upgrade_rebuilds_a_new_operator_from_the_retained_input_exactly_once() {
    let v1 = component("examples/wordcount");
    let v2 = component("tests/guests/wordcount-v2");
    let v3 = component("tests/guests/wordcount-v3");
    let mut rng = seeded("SLUICE_REBUILD_SEED", "rebuild");
    let trials = env_count("SLUICE_REBUILD_TRIALS", 6);
    let (mut kills, mut upgrade_kills, mut rebuilds) = (0, 0, 0);
    for trial in 0..trials {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        // Every other pair of trials keeps its checkpoints in an object
        // store: the rebuild's snapshot is checkpointed there.
        let store = (trial % 4 >= 2).then(|| store_in(dir.path()));
        let on_store = |cmd| with_store(&store, cmd);
        let (before, before_pairs) = input(&mut rng, 500, &[]);
        let (after, after_pairs) = input(&mut rng, 500, &before_pairs);
        let (a, b) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
        std::fs::write(&a, before).unwrap();
        std::fs::write(&b, after).unwrap();

        if trial == 0 {
            // Without --retain-input, the checkpoints trimmed the input.
            let plain = dir.path().join("plain");
            let out = run_cmd(&v1, &plain, &a, &["counts"], dir.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", stderr(&out));
            let out = upgrade(&v2, &plain, &["--rebuild"]);
            assert!(!out.status.success());
            assert!(
                stderr(&out).contains("was trimmed up to offset")
                    && stderr(&out).contains("--retain-input"),
                "{}",
                stderr(&out)
            );
        }
        let n = 1 + rng.below(2) as u32;
        let (k, _) = run_with_kills(
            &mut rng,
            || {
                let mut cmd = on_store(run_cmd(&v1, &data, &a, &["counts"], dir.path()));
                cmd.arg("--retain-input");
                cmd
            },
            n,
            None,
        );
        kills += k;

        if trial == 0 {
            // `sluice diff DATA NEW --rebuild`: what a rebuild does.
            let out = sluice_cmd()
                .arg("diff")
                .arg(&data)
                .arg(&v2)
                .arg("--rebuild")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{text}{}", stderr(&out));
            assert!(
                text.contains("counts   rebuilt") && text.contains("lengths  rebuilt"),
                "{text}"
            );
            // A rebuild gives every operator the rebuilt state: none
            // starts empty.
            let out = upgrade(&v2, &data, &["--rebuild", "--start-empty", "lengths"]);
            assert!(!out.status.success());
            assert!(
                stderr(&out).contains("--start-empty and --rebuild"),
                "{}",
                stderr(&out)
            );
        }
        // The upgrade, killed first: at a random moment, or every third
        // trial right after its commit point; then made (or found made).
        let stems = trial % 2 == 1;
        let next = if stems { &v3 } else { &v2 };
        let first = on_store(upgrade_cmd(next, &data, &["--rebuild"]));
        let (status, killed) = kill_upgrade(&mut rng, first, trial % 3 == 2, 80);
        upgrade_kills += u32::from(killed);
        let out = on_store(upgrade_cmd(next, &data, &["--rebuild"]))
            .output()
            .unwrap();
        if out.status.success() {
            assert!(!status.success(), "made twice: {}", stderr(&out));
            assert!(
                stderr(&out).contains("lengths  rebuilt")
                    && stderr(&out).contains("rebuilt from the input: counts, lengths"),
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

        let n = rng.below(3) as u32;
        let (k, log) = run_with_kills(
            &mut rng,
            || on_store(run_cmd(next, &data, &b, &["counts", "lengths"], dir.path())),
            n,
            Some("after-commit:1"),
        );
        kills += k;
        let this = log.matches("rebuilt the state from the input").count();
        assert!(
            this >= 2,
            "trial {trial}: the rebuild made {this} times by the new version's runs"
        );
        rebuilds += this;

        let all: Vec<(String, i64)> = before_pairs.iter().chain(&after_pairs).cloned().collect();
        let counts = std::fs::read_to_string(dir.path().join("counts.jsonl")).unwrap();
        let expected = match stems {
            true => stem_counts(&all),
            false => recount(all.iter().map(|(l, w)| (l.as_str(), *w))),
        };
        assert_eq!(
            sluice_tools::demo::integrate_counts(&counts).unwrap(),
            expected,
            "trial {trial}: the counts log integrates to the new version's counts of all input"
        );
        let lengths = std::fs::read_to_string(dir.path().join("lengths.jsonl")).unwrap();
        assert_eq!(
            integrate_pairs(&lengths),
            recount_lengths(&all),
            "trial {trial}: the rebuilt count of lengths, of all the input"
        );
        let out = verify_cmd(&data, &store).output().unwrap();
        assert_verified(&out, &format!("trial {trial}"));
    }
    eprintln!(
        "rebuild test: {trials} trials, {kills} SIGKILLs of runs, {upgrade_kills} of upgrades; \
         the rebuild made {rebuilds} times by the new version's runs"
    );
}

/// The same on a server: a pipeline created with `"retain_input": true`,
/// upgraded with `sluice upgrade --pipeline wc --rebuild` (`PATCH` with
/// `"rebuild": true`): its `lengths` output integrates to the lengths of
/// all the input pushed, before and after the switch; a pipeline created
/// without retention is refused (422), running on as before.
#[test]
fn a_pipeline_on_a_server_keeping_its_input_is_upgraded_with_a_rebuild() {
    use crate::support::server::{Server, integrated_counts, output_lines};
    use crate::upgrade_switch::wait_for;
    let v1 = component("examples/wordcount");
    let v2 = component("tests/guests/wordcount-v2");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let tenant = server.tenant("acme");
    let token = tenant.token().to_owned();
    let (status, body) = server.upload(&token, "wordcount", &std::fs::read(&v1).unwrap());
    assert_eq!(status, 201, "{body}");
    for (name, retain) in [("wc", true), ("plain", false)] {
        let spec = serde_json::json!({
            "name": name,
            "component": "wordcount",
            "workers": 2,
            "checkpoint_every_steps": 1,
            "retain_input": retain,
        });
        let (status, body) = server.create(&token, &spec);
        assert_eq!(status, 201, "{body}");
    }
    let mut rng = Rng(23);
    let (before, before_pairs) = input(&mut rng, 300, &[]);
    let (after, after_pairs) = input(&mut rng, 300, &before_pairs);
    let (a, b) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
    std::fs::write(&a, before).unwrap();
    std::fs::write(&b, after).unwrap();
    for name in ["wc", "plain"] {
        tenant.push(name, "lines", &a, &Default::default()).unwrap();
    }
    let expected = recount(before_pairs.iter().map(|(l, w)| (l.as_str(), *w)));
    wait_for(&tenant, "version 1's counts", &|| {
        integrated_counts(&tenant, "wc") == expected
            && integrated_counts(&tenant, "plain") == expected
    });

    // The diff of a rebuild: every operator rebuilt, none refused.
    let (status, body) = crate::support::server::raw(
        "POST",
        &format!("{}/pipelines/wc/diff?rebuild=true", server.url),
        Some(&token),
        "application/wasm",
        &std::fs::read(&v2).unwrap(),
    );
    assert_eq!(status, 200, "{body}");
    let diff: serde_json::Value = serde_json::from_str(&body).unwrap();
    let changes: Vec<&str> = diff["operators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["change"].as_str().unwrap())
        .collect();
    assert_eq!(changes, ["rebuilt", "rebuilt"], "{body}");
    assert_eq!(diff["accepted"], true, "{body}");

    let upgrade = |pipeline: &str| {
        sluice_cmd()
            .arg("upgrade")
            .arg(&v2)
            .args(["--pipeline", pipeline, "--rebuild"])
            .args(["--server", server.url.as_str(), "--token", &token])
            .output()
            .unwrap()
    };
    let out = upgrade("plain");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--retain-input") && stderr(&out).contains("trimmed"),
        "{}",
        stderr(&out)
    );
    let out = upgrade("wc");
    assert!(out.status.success(), "{}", stderr(&out));
    tenant.push("wc", "lines", &b, &Default::default()).unwrap();
    let all: Vec<(String, i64)> = before_pairs.iter().chain(&after_pairs).cloned().collect();
    let expected = recount(all.iter().map(|(l, w)| (l.as_str(), *w)));
    wait_for(&tenant, "version 2's counts", &|| {
        integrated_counts(&tenant, "wc") == expected
    });
    let lengths = recount_lengths(&all);
    wait_for(&tenant, "version 2's rebuilt lengths", &|| {
        integrate_pairs(&output_lines(&tenant, "wc", "lengths")) == lengths
    });
}
