//! The crash campaign shared by the embedded and Kafka crash tests.

use super::{component, recount, sluice_cmd};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Workers of the crashed pipeline.
pub const WORKERS: u32 = 2;
/// Kills that must land for the campaign to count.
pub const MIN_KILLS: usize = 5;

/// xorshift64*: enough randomness for kill times and text, reproducible.
/// xorshift: the campaigns' random numbers, from a printed seed.
pub struct Rng(pub u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A campaign's random numbers: seeded from the variable `var` if set,
/// else from the clock; the seed is printed (for `what`'s test) so that a
/// failing run can be repeated.
pub fn seeded(var: &str, what: &str) -> Rng {
    let seed = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("{what} test seed: {seed} ({var}={seed} to repeat)");
    Rng(seed)
}

/// Whether `stderr` shows the abort at `spec` (`SLUICE_CRASH_AT`'s value,
/// `POINT` or `POINT:N`): the line the process prints before aborting,
/// not just any mention of a crash point (a refused spec names points too).
pub fn aborted_at(stderr: &str, spec: &str) -> bool {
    let (point, n) = spec.split_once(':').unwrap_or((spec, "1"));
    stderr.contains(&format!("sluice: crash point {point} #{n}"))
}

/// The number the variable `var` holds, else `default` (a campaign's
/// trials).
pub fn env_count(var: &str, default: u32) -> u32 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// What a crash campaign left behind, for the backend-specific checks.
pub struct Campaign {
    /// Holds the data directory, input and output (removed on drop).
    pub dir: tempfile::TempDir,
    /// The pipeline's data directory (the last run's).
    pub data: PathBuf,
    /// The from-scratch word count of the input.
    pub expected: BTreeMap<String, i64>,
    /// SIGKILLs that landed.
    pub kills: usize,
}

/// The crash test on any backend: `sluice run` of word count over `lines`
/// lines as a child process, with `extra` arguments (the log backend),
/// SIGKILLed at random moments (during ingest, steps, commits and
/// checkpoints) and rerun each time; asserts that the final output equals
/// the from-scratch count. The seed is printed; `SLUICE_CRASH_SEED` replays
/// a run's kill times.
///
/// With `first_crash` (`POINT:N`), the first run aborts itself at that named
/// crash point instead of being killed. With [`Hosts::EachRunAnother`],
/// every run has a data directory of its own, as if each were another
/// machine taking the pipeline over (its logs and checkpoints must then be
/// somewhere every machine reaches: Kafka and an object store).
pub fn campaign(
    lines_wanted: usize,
    extra: &[String],
    first_crash: Option<&str>,
    positions: Positions,
    hosts: Hosts,
) -> Campaign {
    campaign_of(
        "examples/wordcount",
        lines_wanted,
        extra,
        first_crash,
        positions,
        hosts,
    )
}

/// [`campaign`] with another word-count circuit (a path relative to the
/// repository, e.g. the Python one).
pub fn campaign_of(
    circuit: &str,
    lines_wanted: usize,
    extra: &[String],
    first_crash: Option<&str>,
    positions: Positions,
    hosts: Hosts,
) -> Campaign {
    let mut rng = seeded("SLUICE_CRASH_SEED", "crash");

    // Input: lines of words from a small vocabulary, with some lines later deleted.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("lines.jsonl");
    let vocab: Vec<String> = (0..400).map(|i| format!("w{i}")).collect();
    let mut lines: Vec<(String, i64)> = Vec::with_capacity(lines_wanted);
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&input).unwrap());
        for i in 0..lines_wanted {
            if i > 10 && rng.below(20) == 0 {
                let victim = lines[rng.below(lines.len() as u64) as usize].0.clone();
                writeln!(f, "{}", serde_json::json!({ "delete": victim })).unwrap();
                lines.push((victim, -1));
            } else {
                let n = 1 + rng.below(6);
                let line: Vec<&str> = (0..n)
                    .map(|_| vocab[rng.below(vocab.len() as u64) as usize].as_str())
                    .collect();
                let line = line.join(" ");
                writeln!(f, "{}", serde_json::to_string(&line).unwrap()).unwrap();
                lines.push((line, 1));
            }
        }
    }
    let expected = recount(lines.iter().map(|(l, w)| (l.as_str(), *w)));

    let wasm = component(circuit);
    let data = dir.path().join("data");
    let output = dir.path().join("counts.jsonl");
    let runs = std::cell::Cell::new(0u32);
    let command = || {
        let mut cmd = sluice_cmd();
        runs.set(runs.get() + 1);
        let data = match hosts {
            Hosts::One => data.clone(),
            Hosts::EachRunAnother => dir.path().join(format!("host-{}", runs.get())),
        };
        cmd.arg("run")
            .arg(&wasm)
            .arg("--data")
            .arg(&data)
            .args([
                "--workers",
                &WORKERS.to_string(),
                // One partition per worker: the step sizes this test's
                // timing is tuned for.
                "--partitions",
                &WORKERS.to_string(),
                "--max-batch",
                "300",
                "--checkpoint-every",
                "4",
                "--quiet",
            ])
            .args(extra)
            .arg(format!("--input=lines={}", input.display()))
            .arg(format!("--output=counts={}", output.display()))
            .env("SLUICE_LOG", "sluice=debug")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd
    };
    let spawn = || command().spawn().unwrap();

    // Kill times follow the child's progress, not the clock, so the test
    // holds on a fast or a loaded machine: a quarter of the kills land at a
    // random moment of start-up (ingest, recovery and replay, up to the
    // first commit), the rest a few milliseconds after a random number of
    // step commits (in the next step's run, its commit, or a checkpoint and
    // trim). So no run gets more than 12 steps past its checkpoint.
    let (mut kills, mut attempts, mut after_commits, mut replayed) = (0, 0, 0, 0);
    // The committed output as each kill left it: every line must still be
    // there, at its position, at the end (a rewritten step would not be).
    let mut snapshots: Vec<Vec<String>> = Vec::new();
    let mut finished = false;
    if let Some(point) = first_crash {
        attempts += 1;
        let out = command().env("SLUICE_CRASH_AT", point).output().unwrap();
        assert!(
            !out.status.success() && aborted_at(&String::from_utf8_lossy(&out.stderr), point),
            "the first run should have aborted at crash point {point}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        kills += 1;
    }
    while kills < MIN_KILLS + 3 && attempts < 40 {
        attempts += 1;
        let mut child = spawn();
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
                log.push_str(&line);
                log.push('\n');
            }
            log
        });
        let during_startup = rng.below(4) == 0;
        let (commits_wanted, start) = (1 + rng.below(12), Instant::now());
        let startup_delay = Duration::from_millis(rng.below(300));
        let mut commits = 0;
        let kill_now = loop {
            if during_startup && start.elapsed() >= startup_delay {
                break true;
            }
            match rx.recv_timeout(Duration::from_millis(2)) {
                // A start-up kill lands before the first commit at the
                // latest: on a fast machine a few hundred milliseconds are
                // many steps, and a run that reached the end of the input
                // would leave too few kills for the test.
                Ok(()) if during_startup => break true,
                Ok(()) => {
                    commits += 1;
                    if commits >= commits_wanted {
                        std::thread::sleep(Duration::from_millis(rng.below(15)));
                        break true;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                // The child closed stderr: it has exited.
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break false,
            }
        };
        if kill_now && child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
            kills += 1;
            after_commits += usize::from(!during_startup);
            replayed += replayed_steps(&reader.join().unwrap());
            if positions == Positions::Check {
                snapshots.push(read_positions(&data));
            }
        } else {
            let status = child.wait().unwrap();
            let log = reader.join().unwrap();
            assert!(status.success(), "run failed after {kills} kills: {log}");
            replayed += replayed_steps(&log);
            finished = true;
            break;
        }
    }
    if !finished {
        let out = spawn().wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "final run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!(
        "crash test: {kills} SIGKILLs ({after_commits} after step commits) in {attempts} runs; \
         {replayed} committed steps replayed and dropped as duplicates on recovery"
    );
    assert!(
        kills >= MIN_KILLS,
        "only {kills} kills landed before the pipeline finished; the run is too fast for this test"
    );

    let data = match hosts {
        Hosts::One => data,
        Hosts::EachRunAnother => dir.path().join(format!("host-{}", runs.get())),
    };
    if positions == Positions::Check {
        let last: std::collections::BTreeSet<String> = read_positions(&data).into_iter().collect();
        let lines: usize = snapshots.iter().map(Vec::len).sum();
        for (i, snapshot) in snapshots.iter().enumerate() {
            for line in snapshot {
                assert!(
                    last.contains(line),
                    "after kill {}, the output held {line}; the finished run's output does not",
                    i + 1
                );
            }
        }
        eprintln!(
            "crash test: {} output snapshots ({lines} positioned events) hold at the end",
            snapshots.len()
        );
    }
    let got =
        sluice_tools::demo::integrate_counts(&std::fs::read_to_string(&output).unwrap()).unwrap();
    assert_eq!(got.len(), expected.len());
    assert_eq!(
        got, expected,
        "integrated output equals the from-scratch count"
    );
    Campaign {
        dir,
        data,
        expected,
        kills,
    }
}

/// Where the campaign's runs keep their data directories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hosts {
    /// One directory: every run is the same machine restarting.
    One,
    /// A new directory per run: every run is another machine.
    EachRunAnother,
}

/// Whether the campaign checks that committed output stays where it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Positions {
    /// After each kill, read the output by position (`sluice read`), and at
    /// the end require every line read to be there still.
    Check,
    /// Not checked: the backend cannot be read between runs (Kafka: a
    /// killed host's open transaction holds `read_committed` readers back
    /// until the next host fences it).
    Skip,
}

/// The output `counts` of the pipeline in `data`, one line per event with
/// its position and frontier (`sluice read`); empty before the pipeline has
/// a database or its metadata.
fn read_positions(data: &std::path::Path) -> Vec<String> {
    if !data.join("db").is_dir() {
        return Vec::new();
    }
    let out = sluice_cmd()
        .arg("read")
        .arg("--data")
        .arg(data)
        .args(["--output", "counts"])
        .output()
        .unwrap();
    // A run killed at start-up, after it created the database and before
    // it wrote the pipeline's metadata, leaves no output to read.
    if !out.status.success()
        && String::from_utf8_lossy(&out.stderr).contains("no pipeline metadata")
    {
        return Vec::new();
    }
    assert!(
        out.status.success(),
        "sluice read: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Steps replayed by one run, from its `recovered` debug line.
fn replayed_steps(log: &str) -> u64 {
    log.lines()
        .filter(|l| l.contains("recovered"))
        .filter_map(|l| l.split("replayed=").nth(1))
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}
