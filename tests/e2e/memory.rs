//! Issue #32, the server's half: `sluice serve` gives back what a key-heavy
//! pipeline made it hold once the pipeline is deleted, and its peak stays
//! near `sluice run`'s on the same input; the admin sees the server's
//! memory and what each tenant's pipelines hold on the host.

use crate::support::server::{Server, raw, status_kib};
use crate::support::{component, sluice_cmd};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// 2 000 lines of 200 words each never seen before: 400 000 keys.
fn new_keys(path: &Path) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for line in 0..2_000 {
        let words: Vec<String> = (0..200).map(|w| format!("k{}", line * 200 + w)).collect();
        writeln!(f, "{}", serde_json::to_string(&words.join(" ")).unwrap()).unwrap();
    }
}

/// Runs `cmd` to its end, which must succeed, and returns its peak
/// resident memory in KiB: its own high-water mark (`VmHWM`), read every
/// few milliseconds while it runs (it only grows). Not `wait4`'s
/// `ru_maxrss`: Linux counts in it the memory of the process that spawned
/// the child (this test binary, with every other test's threads) as it was
/// at the `exec`.
fn peak_kib_of(cmd: &mut std::process::Command) -> u64 {
    let mut child = cmd.stdout(std::process::Stdio::null()).spawn().unwrap();
    let hwm = |pid: u32| -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    let mut peak = 0;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        peak = hwm(child.id()).unwrap_or(0).max(peak);
        std::thread::sleep(Duration::from_millis(2));
    };
    assert!(status.success(), "{cmd:?} failed ({status})");
    assert!(peak > 0, "no VmHWM read of {cmd:?}");
    peak
}

#[test]
fn a_deleted_pipeline_gives_its_memory_back_and_the_peak_stays_near_sluice_run() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("keys.jsonl");
    new_keys(&input);
    let wasm = component("examples/wordcount");

    let run_peak = peak_kib_of(
        sluice_cmd()
            .args(["run", "-q", "--workers", "2", "--data"])
            .arg(dir.path().join("run"))
            .arg("--input")
            .arg(format!("lines={}", input.display()))
            .arg(&wasm),
    );

    let server = Server::start(&dir.path().join("data"));
    let acme = server.tenant("acme");
    let before = status_kib(server.pid(), "VmRSS");
    acme.deploy(&wasm, "wc", "wc", 2, false).unwrap();
    // The whole file in one push.
    let (code, body) = raw(
        "POST",
        &format!("{}/pipelines/wc/input/lines", server.url),
        Some(acme.token()),
        "application/x-ndjson",
        &std::fs::read(&input).unwrap(),
    );
    assert_eq!(code, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let s: serde_json::Value = serde_json::from_str(&acme.status(Some("wc")).unwrap()).unwrap();
        if s["events_in"] == 2_000 && s["input_lag"] == 0 && s["events_out"] == 400_000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pipeline did not finish: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let peak = status_kib(server.pid(), "VmHWM");
    // The admin sees the server's memory and what acme's pipeline holds on
    // the host besides its instances (its database's write buffers: the
    // step wrote 400 000 output entries and a checkpoint).
    let usage = || -> serde_json::Value {
        serde_json::from_str(&server.admin().tenants().unwrap()).unwrap()
    };
    let u = usage();
    let acme_host = u["tenants"][0]["host_memory_bytes"].as_u64().unwrap();
    assert!(
        (1 << 20..=sluice_pipeline::storage::HOST_MEMORY_BOUND).contains(&acme_host),
        "acme's host memory: {acme_host} bytes"
    );
    assert_eq!(u["host_memory_bytes"].as_u64(), Some(acme_host));
    let resident = u["resident_bytes"].as_u64().unwrap() >> 10;
    let now = status_kib(server.pid(), "VmRSS");
    assert!(
        resident.abs_diff(now) < now / 4,
        "the server says it holds {resident} KiB, /proc says {now} KiB"
    );
    acme.delete("wc").unwrap();
    std::thread::sleep(Duration::from_secs(10));
    let after = status_kib(server.pid(), "VmRSS");
    assert_eq!(usage()["tenants"][0]["host_memory_bytes"], 0);
    let mib = |kib: u64| kib >> 10;
    eprintln!(
        "sluice run peak {} MiB; sluice serve: {} MiB before, peak {} MiB, {} MiB 10 s after the delete; \
         acme's pipeline held {} MiB on the host besides its instances",
        mib(run_peak),
        mib(before),
        mib(peak),
        mib(after),
        acme_host >> 20
    );
    assert!(
        peak * 2 <= run_peak * 3,
        "the server peaked at {} MiB, over 1.5x sluice run's {} MiB",
        mib(peak),
        mib(run_peak)
    );
    assert!(
        after <= before + (64 << 10),
        "10 s after the delete the server holds {} MiB, {} MiB more than before the pipeline",
        mib(after),
        mib(after.saturating_sub(before))
    );
}
