//! The web console in a real browser (issue #15): `tests/browser/console.mjs`
//! drives Debian's headless Chromium through playwright-core against a real
//! `sluice serve`: sign in, deploy word count, start it, push lines, watch
//! the charts and the output tail, pause it, and see no other tenant's
//! pipeline; then the admin's view. Screenshots land in
//! `$CARGO_TARGET_TMPDIR/console-screenshots`.

use crate::support::server::{ADMIN, Server, integrated_counts};
use crate::support::{component, repo, scratch};

/// Chromium and the script's node_modules, or `None` (outside CI) to skip.
fn browser() -> Option<()> {
    let chromium = std::path::Path::new("/usr/bin/chromium").exists();
    let playwright = repo()
        .join("tests/browser/node_modules/playwright-core")
        .exists();
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if chromium && playwright && node {
        return Some(());
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "CI is set but the console test cannot run (chromium: {chromium}, node: {node}, \
             playwright-core: {playwright}): scripts/setup.sh --tests installs them"
        );
    }
    eprintln!("skipped: run scripts/setup.sh --tests to install Chromium and playwright-core");
    None
}

#[test]
fn the_console_works_in_a_real_browser() {
    if browser().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let acme = server.tenant("acme");
    let rival = server.tenant("rival");
    let wasm = component("examples/wordcount");
    rival
        .deploy(&wasm, "rivalpipe", "rivalpipe", 1, false)
        .unwrap();
    let shots = scratch().join("console-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    let out = std::process::Command::new("node")
        .arg("console.mjs")
        .args(["--url", &server.url, "--token", acme.token()])
        .arg("--wasm")
        .arg(&wasm)
        .args(["--other", "rivalpipe", "--admin-token", ADMIN])
        .arg("--upgrade-wasm")
        .arg(component("tests/guests/wordcount-v2"))
        .arg("--out-dir")
        .arg(&shots)
        .current_dir(repo().join("tests/browser"))
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("console test: passed"), "{stdout}");
    for shot in [
        "1-pipelines",
        "2-deployed",
        "3-pipeline",
        "4-upgrade-diff",
        "5-paused",
        "6-admin",
    ] {
        let png = shots.join(format!("{shot}.png"));
        let len = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
        assert!(len > 10_000, "{} is missing or empty", png.display());
    }
    // What the browser did, the API confirms: the pipeline it deployed
    // runs version 2, is paused, and counted the 80 lines pushed before the
    // upgrade and the 40 after it (each holds `hello` once).
    let status: serde_json::Value =
        serde_json::from_str(&acme.status(Some("wc")).unwrap()).unwrap();
    assert_eq!(status["state"], "paused", "{status}");
    assert_eq!(status["component"], "wc-v2", "{status}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while integrated_counts(&acme, "wc").get("hello") != Some(&120) {
        assert!(std::time::Instant::now() < deadline, "{status}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The script refuses a call whose screenshots would not land under the
/// test's scratch directory — the positional call that once took the admin
/// token for the output directory and wrote `tests/browser/<token>/` — and
/// creates nothing. Needs only node.
#[test]
fn the_browser_script_refuses_an_odd_screenshot_directory() {
    let has_node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_node {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but node is missing"
        );
        eprintln!("skipped: no node");
        return;
    }
    let browser_dir = repo().join("tests/browser");
    let url = "http://127.0.0.1:9";
    let inside = browser_dir.join("shots");
    let inside = inside.to_str().unwrap();
    let named = |more: &[&str]| -> Vec<String> {
        let base = [
            "--url", url, "--token", "t", "--wasm", "/w.wasm", "--other", "o",
        ];
        base.iter().chain(more).map(|s| s.to_string()).collect()
    };
    let tokened = format!("/tmp/{ADMIN}");
    let calls = [
        // The old positional call, OUT_DIR left out: ADMIN in its place.
        (
            [url, "sl_0123456789abcdef", "/w.wasm", "rivalpipe", ADMIN]
                .map(String::from)
                .to_vec(),
            "does not take positional arguments",
        ),
        (named(&[]), "--out-dir is missing"),
        (named(&["--out-dir", ADMIN]), "must be an absolute path"),
        (named(&["--out-dir", inside]), "is inside"),
        (
            named(&["--admin-token", ADMIN, "--out-dir", &tokened]),
            "contains a token",
        ),
    ];
    for (args, why) in calls {
        let out = std::process::Command::new("node")
            .arg("console.mjs")
            .args(&args)
            .current_dir(&browser_dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(why) && stderr.contains("usage:"),
            "{args:?}: {stderr}"
        );
    }
    for stray in [browser_dir.join(ADMIN), browser_dir.join("shots")] {
        assert!(!stray.exists(), "{} was created", stray.display());
    }
    assert!(!std::path::Path::new(&tokened).exists());
}
