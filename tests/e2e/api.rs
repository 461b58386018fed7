//! The API document says what the API does (issue #15): schemathesis
//! generates requests from `/openapi.json` — every operation, with valid
//! and broken inputs (coverage and fuzzing phases) and chains that follow
//! the document's links from a created pipeline (stateful phase) — against
//! a real `sluice serve` with a tenant token, and checks every answer:
//! no server error, no status the document does not list, every body and
//! content type as documented.

use crate::support::server::Server;
use crate::support::{component, repo};
use std::path::PathBuf;

/// The schemathesis command, or `None` (outside CI) to skip.
fn schemathesis() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("SLUICE_SCHEMATHESIS").map(PathBuf::from),
        std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".cache/sluice/venv/bin/schemathesis")),
    ];
    if let Some(found) = candidates.into_iter().flatten().find(|p| p.is_file()) {
        return Some(found);
    }
    if std::env::var_os("CI").is_some() {
        panic!("CI is set but schemathesis is missing: scripts/setup.sh --tests installs it");
    }
    eprintln!("skipped: run scripts/setup.sh --tests to install schemathesis");
    None
}

#[test]
fn the_api_document_says_what_the_api_does() {
    let Some(st) = schemathesis() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let tenant = server.tenant("acme");
    // Something to read, push to and control.
    tenant
        .deploy(&component("examples/wordcount"), "wc", "wc", 1, false)
        .unwrap();
    let out = std::process::Command::new(st)
        .arg("run")
        .arg(format!("{}/openapi.json", server.url))
        .args(["-H", &format!("Authorization: Bearer {}", tenant.token())])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            "--phases",
            "coverage,fuzzing,stateful",
            "--max-time",
            "60",
            // One worker: CPython 3.11's `ast` (which hypothesis uses to
            // describe its strategies) is not safe across threads.
            "--workers",
            "1",
            "--seed",
            "20261130",
        ])
        .env("PYTHONPATH", repo().join("tests/api"))
        .env("SCHEMATHESIS_HOOKS", "sluice_hooks")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: String = stdout
        .lines()
        .skip_while(|l| !l.contains("SUMMARY"))
        .collect::<Vec<_>>()
        .join("\n");
    eprintln!("{summary}");
    assert!(
        out.status.success(),
        "schemathesis found failures:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        summary.contains("Tested: 20") || summary.contains("Tested:"),
        "{summary}"
    );
    assert!(!summary.contains("failures"), "{summary}");
}
