//! The web console in a real browser (issue #15): `tests/browser/console.mjs`
//! drives Debian's headless Chromium through playwright-core against a real
//! `sluice serve`: sign in, deploy word count, start it, push lines, watch
//! the charts and the output tail, pause it, and see no other tenant's
//! pipeline; then the admin's view. Screenshots land in
//! `$CARGO_TARGET_TMPDIR/console-screenshots`.

use crate::support::server::{ADMIN, Server};
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
        .arg(&server.url)
        .arg(acme.token())
        .arg(&wasm)
        .arg("rivalpipe")
        .arg(&shots)
        .arg(ADMIN)
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
        "4-paused",
        "5-admin",
    ] {
        let png = shots.join(format!("{shot}.png"));
        let len = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
        assert!(len > 10_000, "{} is missing or empty", png.display());
    }
    // What the browser did, the API confirms: the pipeline it deployed is
    // paused and counted the 80 lines it pushed.
    let status: serde_json::Value =
        serde_json::from_str(&acme.status(Some("wc")).unwrap()).unwrap();
    assert_eq!(status["state"], "paused", "{status}");
    assert_eq!(status["events_in"], 80, "{status}");
}
