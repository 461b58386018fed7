//! **Memory against dbsp**: word count over two inputs as a whole `sluice
//! run` (durable, sandboxed, exactly once) against the `dbsp` crate's word
//! count, native and in memory, in the same run: wall time and the
//! kernel's peak resident figure of each process; and `sluice serve`'s
//! resident memory before, at the peak of and 10 s after deleting a
//! pipeline that processed the key-heavy input (issue #32).
//!
//! The inputs: 400 000 lines of one new word and one of 1 000 repeating
//! words each ("one new key per line"), and 2 000 lines of 200 words never
//! seen before (400 000 new keys). Both engines take the same steps: `sluice
//! run`'s default of 10 000 events per partition per step over 8
//! partitions, so 80 000 lines per dbsp transaction.
//!
//! The peer is `benches/peers/dbsp-wordcount`, built outside the workspace
//! by `scripts/build-peers.sh` into `~/.cache/sluice/peers` (or
//! `$SLUICE_PEERS_DIR`); without it the rows say so.

use super::report::Row;
use super::workloads::Workload;
use anyhow::{Context, bail};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Lines per dbsp transaction: what one `sluice run` step takes by default
/// (10 000 events per partition, 8 partitions).
const STEP_LINES: usize = 80_000;

/// One of the two inputs.
struct Input {
    name: &'static str,
    path: PathBuf,
    lines: usize,
    /// Distinct words and their total count, as every engine must find.
    words: u64,
    total: u64,
}

/// `lines` lines of one new word and one of 1 000 repeating words each.
fn new_key_per_line(dir: &Path, lines: usize) -> anyhow::Result<Input> {
    let path = dir.join("one-new-key-per-line.jsonl");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
    for i in 0..lines {
        writeln!(f, "\"u{i} r{}\"", i % 1000)?;
    }
    f.flush()?;
    Ok(Input {
        name: "lines of one new word and one of 1 000 repeating",
        path,
        lines,
        words: (lines + lines.min(1000)) as u64,
        total: 2 * lines as u64,
    })
}

/// `lines` lines of 200 words never seen before.
fn new_keys(dir: &Path, lines: usize) -> anyhow::Result<Input> {
    let path = dir.join("new-keys.jsonl");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
    for line in 0..lines {
        let words: Vec<String> = (0..200).map(|w| format!("k{}", line * 200 + w)).collect();
        writeln!(f, "\"{}\"", words.join(" "))?;
    }
    f.flush()?;
    Ok(Input {
        name: "lines of 200 new words",
        path,
        lines,
        words: 200 * lines as u64,
        total: 200 * lines as u64,
    })
}

/// Where `scripts/build-peers.sh` puts the dbsp peer.
fn peer_path() -> PathBuf {
    peers_dir().join("dbsp-wordcount")
}

/// Where `scripts/build-peers.sh` puts the peers (`$SLUICE_PEERS_DIR`, or
/// `~/.cache/sluice/peers`).
pub(super) fn peers_dir() -> PathBuf {
    std::env::var_os("SLUICE_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/sluice/peers")
        })
}

/// A finished process: its wall time, its peak resident memory (bytes) and
/// what it printed.
pub(super) struct Ran {
    pub(super) wall: Duration,
    pub(super) peak: u64,
    pub(super) stdout: String,
}

/// Runs `cmd` to its end, which must succeed. The peak is the child's own
/// high-water mark (`VmHWM`), read every few milliseconds while it runs
/// (it only grows): the kernel's `ru_maxrss` would not do, as it counts the
/// memory of the process that spawned the child (this one) too.
pub(super) fn run_measured(cmd: &mut Command) -> anyhow::Result<Ran> {
    let out = tempfile::tempfile()?;
    let t = Instant::now();
    let mut child = cmd
        .stdout(out.try_clone()?)
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let mut peak = 0;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if let Ok(hwm) = status_bytes(child.id(), "VmHWM") {
            peak = peak.max(hwm);
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let wall = t.elapsed();
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    let mut stdout = String::new();
    let mut out = out;
    std::io::Seek::rewind(&mut out)?;
    std::io::Read::read_to_string(&mut out, &mut stdout)?;
    Ok(Ran { wall, peak, stdout })
}

/// The best wall time and the lowest peak of `reps` runs of `make()`.
fn best_of(reps: usize, mut make: impl FnMut() -> anyhow::Result<Ran>) -> anyhow::Result<Ran> {
    let mut best: Option<Ran> = None;
    for _ in 0..reps {
        best = Some(better(best, make()?));
    }
    best.context("no repetition")
}

/// The best wall time and the lowest peak of `best` and `r`.
pub(super) fn better(best: Option<Ran>, r: Ran) -> Ran {
    match best {
        None => r,
        Some(b) => Ran {
            wall: b.wall.min(r.wall),
            peak: b.peak.min(r.peak),
            stdout: r.stdout,
        },
    }
}

/// Bytes in MiB.
pub(super) fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1 << 20) as f64)
}

/// Words counted per second.
fn words_per_s(words: u64, d: Duration) -> String {
    format!(
        "{:.0} k words/s",
        words as f64 / d.as_secs_f64().max(1e-9) / 1e3
    )
}

/// The rows: per input and W ∈ {1, 2}, throughput and peak memory against
/// dbsp's; then the server's resident memory around a pipeline's life.
pub(super) async fn memory(
    wc: &Workload,
    quick: bool,
    reps: usize,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let scale = if quick { 10 } else { 1 };
    let inputs = [
        new_key_per_line(dir.path(), 400_000 / scale)?,
        new_keys(dir.path(), 2_000 / scale)?,
    ];
    let exe = std::env::current_exe()?;
    let peer = peer_path();
    let wasm = wc.wasm.clone();
    // `sluice run`'s peak on the key-heavy input at W=2: what the server's
    // peak is held to.
    let mut run_peak = 0;
    for input in &inputs {
        for workers in [1u32, 2] {
            let data = dir.path().join("run");
            let run_sluice = || {
                let _ = std::fs::remove_dir_all(&data);
                run_measured(
                    Command::new(&exe)
                        .args(["run", "-q", "--workers", &workers.to_string(), "--data"])
                        .arg(&data)
                        .arg("--input")
                        .arg(format!("lines={}", input.path.display()))
                        .arg(&wasm),
                )
            };
            let run_dbsp = || {
                run_measured(
                    Command::new(&peer)
                        .arg(&input.path)
                        .arg(workers.to_string())
                        .arg(STEP_LINES.to_string()),
                )
            };
            let case = format!(
                "wordcount, {} {} (W={workers}): sluice run (durable, sandboxed) vs dbsp 0.349 native, in memory",
                input.lines, input.name
            );
            if !peer.is_file() {
                let sluice = best_of(reps, run_sluice)?;
                if input.name == inputs[1].name && workers == 2 {
                    run_peak = sluice.peak;
                }
                rows.push(Row {
                    scenario: "memory vs dbsp",
                    case,
                    measured: format!(
                        "{}, peak {}",
                        words_per_s(input.total, sluice.wall),
                        mib(sluice.peak)
                    ),
                    baseline: "peer not built: run scripts/build-peers.sh (~10 min)".into(),
                    ratio: 0.0,
                    goal: "≥ 1× dbsp's throughput, ≤ 1.3× its peak memory",
                    met: None,
                });
                continue;
            }
            // The two engines take turns, so that a slow spell of the
            // machine falls on both.
            let (mut sluice, mut dbsp): (Option<Ran>, Option<Ran>) = (None, None);
            for _ in 0..reps.max(1) {
                sluice = Some(better(sluice, run_sluice()?));
                dbsp = Some(better(dbsp, run_dbsp()?));
            }
            let (Some(sluice), Some(dbsp)) = (sluice, dbsp) else {
                bail!("no repetition");
            };
            if input.name == inputs[1].name && workers == 2 {
                run_peak = sluice.peak;
            }
            let expected = format!("words={} total={}", input.words, input.total);
            if !dbsp.stdout.starts_with(&expected) {
                bail!(
                    "the dbsp peer counted {:?} over {}, expected {expected}",
                    dbsp.stdout.trim(),
                    input.path.display()
                );
            }
            let speed = dbsp.wall.as_secs_f64() / sluice.wall.as_secs_f64().max(1e-9);
            rows.push(Row {
                scenario: "memory vs dbsp",
                case: case.clone(),
                measured: format!(
                    "{} ({:.2} s)",
                    words_per_s(input.total, sluice.wall),
                    sluice.wall.as_secs_f64()
                ),
                baseline: format!(
                    "{} ({:.2} s)",
                    words_per_s(input.total, dbsp.wall),
                    dbsp.wall.as_secs_f64()
                ),
                ratio: speed,
                goal: "≥ 1× dbsp's throughput",
                met: Some(speed >= 1.0),
            });
            let footprint = sluice.peak as f64 / dbsp.peak.max(1) as f64;
            rows.push(Row {
                scenario: "memory vs dbsp",
                case: format!("{case}: peak resident"),
                measured: mib(sluice.peak),
                baseline: mib(dbsp.peak),
                ratio: footprint,
                goal: "≤ 1.3× dbsp's peak memory",
                met: Some(footprint <= 1.3),
            });
        }
    }
    server_rows(&exe, &wasm, &inputs[1], run_peak, quick, rows)
}

/// Resident KiB of `pid` (`field`: `VmRSS` now, `VmHWM` the peak).
fn status_bytes(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| kib << 10)
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// Kills the server when the row is done (or fails).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `sluice serve`'s resident memory before a W=2 word count is deployed,
/// at the peak of processing `input` pushed at once (against `run_peak`,
/// `sluice run`'s on the same), and 10 s after the pipeline is deleted; the
/// client is the `sluice` CLI itself.
fn server_rows(
    exe: &Path,
    wasm: &Path,
    input: &Input,
    run_peak: u64,
    quick: bool,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let admin = "bench-admin-token-0123456789";
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let server = KillOnDrop(
        Command::new(exe)
            .arg("serve")
            .arg("--data")
            .arg(dir.path().join("data"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("SLUICE_ADMIN_TOKEN", admin)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let pid = server.0.id();
    let cli = |token: &str, args: &[&str]| -> anyhow::Result<String> {
        let out = Command::new(exe)
            .args(args)
            .env("SLUICE_SERVER", &url)
            .env("SLUICE_TOKEN", token)
            .output()?;
        if !out.status.success() {
            bail!(
                "sluice {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let started = Instant::now();
    let created = loop {
        match cli(admin, &["tenant", "create", "bench", "--json"]) {
            Ok(out) => break out,
            Err(e) if started.elapsed() > Duration::from_secs(30) => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let token: serde_json::Value = serde_json::from_str(&created)?;
    let token = token["token"]
        .as_str()
        .context("tenant create gave no token")?
        .to_owned();
    std::thread::sleep(Duration::from_secs(1));
    let before = status_bytes(pid, "VmRSS")?;
    let wasm = wasm.to_string_lossy();
    cli(
        &token,
        &["deploy", &wasm, "--pipeline", "wc", "--workers", "2"],
    )?;
    let path = input.path.to_string_lossy();
    cli(&token, &["push", "wc", "lines", &path])?;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let s: serde_json::Value =
            serde_json::from_str(&cli(&token, &["status", "wc", "--json"])?)?;
        if s["events_in"] == input.lines as u64 && s["input_lag"] == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("the server's pipeline did not finish: {s}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let peak = status_bytes(pid, "VmHWM")?;
    cli(&token, &["delete", "wc"])?;
    std::thread::sleep(Duration::from_secs(if quick { 2 } else { 10 }));
    let after = status_bytes(pid, "VmRSS")?;
    let held = after.saturating_sub(before);
    let case = |what: &str| {
        format!(
            "sluice serve: wordcount W=2, {} {} pushed at once{what}",
            input.lines, input.name
        )
    };
    let over_run = peak as f64 / run_peak.max(1) as f64;
    rows.push(Row {
        scenario: "memory vs dbsp",
        case: case(": peak resident"),
        measured: mib(peak),
        baseline: format!("{} (sluice run, the same pipeline)", mib(run_peak)),
        ratio: over_run,
        goal: "≤ 1.5× sluice run's peak",
        met: Some(over_run <= 1.5),
    });
    rows.push(Row {
        scenario: "memory vs dbsp",
        case: case(", then deleted"),
        measured: format!(
            "{} before, peak {}, {} {} s after the delete",
            mib(before),
            mib(peak),
            mib(after),
            if quick { 2 } else { 10 }
        ),
        baseline: format!("{} held after the delete", mib(held)),
        ratio: held as f64 / (64u64 << 20) as f64,
        goal: "≤ 64 MiB above the start 10 s after the delete",
        met: Some(held <= 64 << 20),
    });
    Ok(())
}
