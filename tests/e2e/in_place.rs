//! Input files read in place (`sluice run --read-in-place`): the file is
//! the input's log. A step reads the same records at the same offsets as
//! from a copy, exactly once through SIGKILLs (during the registration,
//! steps, commits and checkpoints); lines appended to the file are read
//! by the next run; a file changed, truncated or swapped under the
//! pipeline stops it (and `sluice verify`) with a clear error, and runs
//! again once restored.

use crate::support::crash::{Hosts, Positions, campaign};
use crate::support::{component, recount, sluice_cmd, stderr, verified};
use sluice_core::{DeadLetter, Event};
use std::io::Write;
use std::path::Path;
use std::process::Output;

/// `sluice run` of word count on `data` over `input`, W = 3 (3
/// partitions), steps of 50 events, dead-lettering bad lines, writing the
/// counts and the dead letters to `out`; `extra` arguments after.
fn run(data: &Path, input: &Path, out: &Path, extra: &[&str]) -> Output {
    sluice_cmd()
        .arg("run")
        .arg(component("examples/wordcount"))
        .arg("--data")
        .arg(data)
        .args(["--workers", "3", "--partitions", "3", "--max-batch", "50"])
        .args(["--bad-records", "lines=dead-letter", "--quiet"])
        .arg(format!("--input=lines={}", input.display()))
        .arg(format!(
            "--output=counts={}",
            out.join("counts.jsonl").display()
        ))
        .arg(format!(
            "--output=lines.dead-letter={}",
            out.join("dead.jsonl").display()
        ))
        .args(extra)
        .output()
        .unwrap()
}

/// A dead letter as both runs must write it: (partition, offset, error,
/// value); its position also names the file when read in place.
type Letter = (u32, u64, String, Option<Vec<u8>>);

/// What a run left in `out`: the counts' lines as written, and the dead
/// letters.
fn outputs(out: &Path) -> (String, Vec<Letter>) {
    let counts = std::fs::read_to_string(out.join("counts.jsonl")).unwrap();
    let letters = std::fs::read_to_string(out.join("dead.jsonl")).unwrap();
    let letters = letters
        .lines()
        .map(|line| {
            let (v, weight) = sluice_core::wire::parse_output_line(line).unwrap();
            let d = DeadLetter::from_event(&Event {
                value: serde_json::to_vec(&v).unwrap(),
                weight,
            })
            .unwrap();
            (d.partition, d.offset, d.error, d.value)
        })
        .collect();
    (counts, letters)
}

/// Appends lines `from..to` to `file`: lines of words, some deleted
/// again, some with escapes and a CRLF ending, and every 97th not an
/// event (every other of those with a CRLF ending). Returns the events as (line, weight).
fn write_lines(file: &Path, from: usize, to: usize) -> Vec<(String, i64)> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .unwrap();
    let mut events: Vec<(String, i64)> = Vec::new();
    for i in from..to {
        let line = format!("w{} w{} \u{e9}t\u{e9}{}", i % 37, i % 11, i % 3);
        let written = match i % 97 {
            0 if i % 2 == 0 => format!("{{not json {i}"),
            0 => format!("{{not json {i}\r"),
            5 => {
                let victim = format!(
                    "w{} w{} \u{e9}t\u{e9}{}",
                    (i - 1) % 37,
                    (i - 1) % 11,
                    (i - 1) % 3
                );
                events.push((victim.clone(), -1));
                serde_json::json!({ "delete": victim }).to_string()
            }
            13 => {
                events.push((format!("w{} caf\u{e9}", i % 5), 1));
                format!("\"w{} caf\\u00e9\"\r", i % 5)
            }
            _ => {
                events.push((line.clone(), 1));
                serde_json::to_string(&line).unwrap()
            }
        };
        writeln!(f, "{written}").unwrap();
    }
    events
}

/// The same file, copied into the log or read in place: the same counts,
/// line for line, and the same dead letters at the same offsets; `sluice
/// verify` accepts both.
#[test]
fn a_file_read_in_place_gives_what_its_copy_gives() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("lines.jsonl");
    write_lines(&input, 0, 9000);
    let (copied, in_place) = (dir.path().join("copied"), dir.path().join("in-place"));
    for (out, extra) in [(&copied, &[][..]), (&in_place, &["--read-in-place"][..])] {
        std::fs::create_dir_all(out).unwrap();
        let ran = run(&out.join("data"), &input, out, extra);
        assert!(ran.status.success(), "{}", stderr(&ran));
        verified(&out.join("data"));
    }
    let (a, b) = (outputs(&copied), outputs(&in_place));
    assert!(!b.0.is_empty());
    assert_eq!(a.0, b.0, "the counts, line for line");
    assert_eq!(b.1.len(), 9000usize.div_ceil(97), "every bad line");
    assert_eq!(a.1.len(), b.1.len(), "the dead letters");
    if let Some(i) = (0..a.1.len()).find(|i| a.1[*i] != b.1[*i]) {
        panic!(
            "dead letter {i}: copied {:?}, in place {:?}",
            a.1[i], b.1[i]
        );
    }
}

/// SIGKILLs at random moments of runs reading their input in place: the
/// output equals the from-scratch count, every committed line stays where
/// it was, and the audit accepts the pipeline.
#[test]
fn sigkill_at_random_moments_of_a_run_in_place_loses_and_duplicates_nothing() {
    let run = campaign(
        60_000,
        &["--read-in-place".into()],
        None,
        Positions::Check,
        Hosts::One,
    );
    verified(&run.data);
}

/// Lines appended to a file read in place are read by the next run (with
/// or without the flag); a file changed, truncated or removed stops the
/// run and the audit, naming the file, until it is restored; another file,
/// an input whose log holds copied events and a blank line are refused.
#[test]
fn a_file_read_in_place_may_grow_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let (input, out, data) = (
        dir.path().join("lines.jsonl"),
        dir.path().join("out"),
        dir.path().join("data"),
    );
    std::fs::create_dir_all(&out).unwrap();
    let mut lines = write_lines(&input, 0, 3000);
    let ran = run(&data, &input, &out, &["--read-in-place"]);
    assert!(ran.status.success(), "{}", stderr(&ran));
    lines.extend(write_lines(&input, 3000, 5000));
    // The same file again, without the flag: read in place all the same.
    let ran = run(&data, &input, &out, &[]);
    assert!(ran.status.success(), "{}", stderr(&ran));
    let expected = recount(lines.iter().map(|(l, w)| (l.as_str(), *w)));
    let counts = std::fs::read_to_string(out.join("counts.jsonl")).unwrap();
    assert_eq!(
        sluice_tools::demo::integrate_counts(&counts).unwrap(),
        expected
    );
    verified(&data);

    // Changed in the middle (same length), then truncated, then removed.
    let original = std::fs::read(&input).unwrap();
    let mut changed = original.clone();
    let at = changed.len() / 2;
    let at = at + changed[at..].iter().position(|b| *b == b'w').unwrap() + 1;
    changed[at] = if changed[at] == b'1' { b'2' } else { b'1' };
    let truncated = original[..original.len() / 3].to_vec();
    for (what, bytes) in [
        ("changed", Some(changed)),
        ("truncated", Some(truncated)),
        ("removed", None),
    ] {
        match bytes {
            Some(bytes) => std::fs::write(&input, bytes).unwrap(),
            None => std::fs::remove_file(&input).unwrap(),
        }
        let ran = run(&data, &input, &out, &["--read-in-place"]);
        let err = stderr(&ran);
        assert!(!ran.status.success(), "a {what} file ran");
        let expected = match what {
            "removed" => "does not exist",
            _ => "is read in place from",
        };
        assert!(err.contains(expected), "{what}: {err}");
        if what == "removed" {
            // Without the --input, the pipeline's open finds it gone.
            let ran = sluice_cmd()
                .arg("run")
                .arg(component("examples/wordcount"))
                .arg("--data")
                .arg(&data)
                .arg("--quiet")
                .output()
                .unwrap();
            let err = stderr(&ran);
            assert!(!ran.status.success(), "a removed file ran");
            assert!(
                err.contains("is read in place from") && err.contains("cannot be opened"),
                "{err}"
            );
            // Reading an output takes no input.
            let read = sluice_cmd()
                .args(["read", "--output", "counts", "--limit", "1", "--data"])
                .arg(&data)
                .output()
                .unwrap();
            assert!(read.status.success(), "{}", stderr(&read));
            assert_eq!(String::from_utf8_lossy(&read.stdout).lines().count(), 1);
        }
        let audit = sluice_cmd()
            .arg("verify")
            .arg("--data")
            .arg(&data)
            .output()
            .unwrap();
        assert!(!audit.status.success(), "the audit of a {what} file passed");
        assert!(
            stderr(&audit).contains("is read in place from"),
            "{what}: {}",
            stderr(&audit)
        );
    }
    std::fs::write(&input, &original).unwrap();
    let ran = run(&data, &input, &out, &[]);
    assert!(ran.status.success(), "{}", stderr(&ran));
    verified(&data);

    // Another file for the same input.
    let other = dir.path().join("other.jsonl");
    std::fs::write(&other, &original).unwrap();
    let ran = run(&data, &other, &out, &["--read-in-place"]);
    assert!(!ran.status.success());
    assert!(
        stderr(&ran).contains("(an input is read from one file)"),
        "{}",
        stderr(&ran)
    );
    // Without the flag, another file would be appended: refused too.
    let ran = run(&data, &other, &out, &[]);
    assert!(!ran.status.success());
    assert!(
        stderr(&ran).contains("it takes no appends"),
        "{}",
        stderr(&ran)
    );

    // An input whose log holds copied events.
    let copied = dir.path().join("copied");
    let ran = run(&copied, &input, &out, &[]);
    assert!(ran.status.success(), "{}", stderr(&ran));
    let ran = run(&copied, &other, &out, &["--read-in-place"]);
    assert!(!ran.status.success());
    assert!(
        stderr(&ran).contains("events appended to its log"),
        "{}",
        stderr(&ran)
    );

    // A blank line (as the parser sees it: a vertical tab too), refused
    // with its line number; mended, the file runs.
    let blank = dir.path().join("blank.jsonl");
    let fresh = dir.path().join("fresh");
    for line in ["  ", "\u{b}"] {
        std::fs::write(&blank, format!("\"a b\"\n{line}\n\"c\"\n")).unwrap();
        let ran = run(&fresh, &blank, &out, &["--read-in-place"]);
        assert!(!ran.status.success(), "{line:?} ran");
        assert!(
            stderr(&ran).contains("line 2: a blank line"),
            "{line:?}: {}",
            stderr(&ran)
        );
    }
    std::fs::write(&blank, "\"a b\"\n\"c\"\n").unwrap();
    let ran = run(&fresh, &blank, &out, &["--read-in-place"]);
    assert!(ran.status.success(), "{}", stderr(&ran));
    let counts = std::fs::read_to_string(out.join("counts.jsonl")).unwrap();
    assert_eq!(
        sluice_tools::demo::integrate_counts(&counts).unwrap(),
        recount([("a b", 1), ("c", 1)])
    );
}
