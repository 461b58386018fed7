//! Changing a running circuit (issue #31), its first parts: two versions
//! of a circuit compared before one replaces the other — `sluice diff`
//! between two component files, and against a pipeline on a server
//! (`POST /pipelines/{name}/diff`) — from what each version's `describe`
//! says of its operators (WIT 0.4.0).

use crate::support::server::{Server, raw};
use crate::support::{component, python_component, sluice_cmd, stderr};
use std::path::Path;

/// `sluice diff OLD NEW [extra…]`: its exit code and standard output.
fn diff(old: &str, new: &Path, extra: &[&str]) -> (i32, String) {
    let out = sluice_cmd()
        .arg("diff")
        .arg(old)
        .arg(new)
        .args(extra)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = out.status.code().unwrap_or(-1);
    assert!(
        code == 0 || code == 2,
        "sluice diff failed:\n{text}{}",
        stderr(&out)
    );
    (code, text)
}

/// The line of operator `id` in a diff for people.
fn line<'a>(text: &'a str, id: &str) -> &'a str {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(id))
        .unwrap_or_else(|| panic!("no line for `{id}` in:\n{text}"))
}

/// Word count against its version 2 (`tests/guests/wordcount-v2`: the
/// count kept under its old identity through `formerly`, a count of
/// lengths added on a new port), in both directions, as text and as JSON.
#[test]
fn a_diff_between_two_components_says_what_an_upgrade_keeps_and_adds() {
    let v1 = component("examples/wordcount");
    let v2 = component("tests/guests/wordcount-v2");
    let (code, text) = diff(v1.to_str().unwrap(), &v2, &[]);
    assert_eq!(code, 0, "{text}");
    assert!(line(&text, "counts").contains("kept"), "{text}");
    assert!(line(&text, "lengths").contains("new"), "{text}");
    assert!(text.contains("output ports added: lengths"), "{text}");
    assert!(text.ends_with("the upgrade would be accepted\n"), "{text}");

    let (code, json) = diff(v1.to_str().unwrap(), &v2, &["--json"]);
    assert_eq!(code, 0);
    let d: serde_json::Value = serde_json::from_str(&json).unwrap();
    let ops = d["operators"].as_array().unwrap();
    assert_eq!(ops.len(), 2, "{json}");
    assert_eq!(ops[0]["id"], "counts");
    assert_eq!(ops[0]["old"]["id"], "keyed_sum#0/1");
    assert_eq!(ops[0]["new"]["aliases"][1], "keyed_sum#0/1", "{json}");
    assert_eq!(ops[0]["old"]["fingerprint"], ops[0]["new"]["fingerprint"]);
    assert_eq!(ops[1]["change"], "new");
    assert_eq!(d["accepted"], true);

    // Back to version 1: its unnamed count is `keyed_sum#0/1`, which
    // version 2's `counts` no longer is: the state is dropped, and said so.
    let (code, text) = diff(v2.to_str().unwrap(), &v1, &[]);
    assert_eq!(code, 0, "{text}");
    assert!(line(&text, "keyed_sum#0/1").contains("new"), "{text}");
    assert!(line(&text, "counts").contains("removed"), "{text}");
    assert!(line(&text, "lengths").contains("removed"), "{text}");
    assert!(
        text.contains("output ports removed (no longer written): lengths"),
        "{text}"
    );

    // Starting the kept count empty is allowed; naming no operator is not.
    let (code, text) = diff(v1.to_str().unwrap(), &v2, &["--start-empty", "counts"]);
    assert_eq!(code, 0, "{text}");
    assert!(line(&text, "counts").contains("starts_empty"), "{text}");
    let out = sluice_cmd()
        .arg("diff")
        .arg(&v1)
        .arg(&v2)
        .args(["--start-empty", "cuonts"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("`cuonts`, which is not an operator"),
        "{}",
        stderr(&out)
    );
}

/// A Python circuit whose count became a sum under the same identity: the
/// diff refuses the upgrade naming the operator (exit 2), and accepts it
/// with that operator started empty.
#[test]
fn a_changed_operator_is_refused_by_name() {
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
        .sum_by(lambda word: word, lambda word: len(word))
        .map(lambda pair: {"word": pair[0], "count": pair[1]})
        .output("counts")
    )


Circuit = sluice.export(build)
"#,
    );
    let (code, text) = diff(v1.to_str().unwrap(), &v2, &[]);
    assert_eq!(code, 2, "{text}");
    assert!(line(&text, "keyed_sum#0/1").contains("changed"), "{text}");
    assert!(
        text.contains("was keyed_sum (count)") && text.contains("now keyed_sum (sum)"),
        "{text}"
    );
    assert!(
        text.contains("refused: keyed_sum#0/1 changed")
            && text.contains("--start-empty keyed_sum#0/1"),
        "{text}"
    );
    let (code, text) = diff(
        v1.to_str().unwrap(),
        &v2,
        &["--start-empty", "keyed_sum#0/1"],
    );
    assert_eq!(code, 0, "{text}");
}

/// `sluice diff PIPELINE NEW` against a server: the pipeline's running
/// version against a component not uploaded; the identity with `#` and `/`
/// passes the query intact; a pipeline or a body that is not one answers
/// as the API's other errors do.
#[test]
fn a_diff_against_a_pipeline_on_a_server() {
    let v1 = component("examples/wordcount");
    let v2 = component("tests/guests/wordcount-v2");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let tenant = server.tenant("acme");
    tenant.deploy(&v1, "wc", "wc", 1, false).unwrap();
    let token = tenant.token().to_owned();
    let remote = ["--server", server.url.as_str(), "--token", token.as_str()];
    let (code, text) = diff("wc", &v2, &remote);
    assert_eq!(code, 0, "{text}");
    assert!(line(&text, "counts").contains("kept"), "{text}");
    assert!(line(&text, "lengths").contains("new"), "{text}");

    let mut args = remote.to_vec();
    args.extend(["--start-empty", "counts"]);
    let (code, text) = diff("wc", &v2, &args);
    assert_eq!(code, 0, "{text}");
    assert!(line(&text, "counts").contains("starts_empty"), "{text}");

    // Back to version 1 from version 2: `keyed_sum#0/1` is new there, and
    // a start-empty naming it arrives whole.
    tenant.deploy(&v2, "wc2", "wc2", 1, false).unwrap();
    let mut args = remote.to_vec();
    args.extend(["--start-empty", "keyed_sum#0/1"]);
    let (code, text) = diff("wc2", &v1, &args);
    assert_eq!(code, 0, "{text}");
    assert!(line(&text, "keyed_sum#0/1").contains("new"), "{text}");

    let url = |p: &str| format!("{}/pipelines/{p}/diff", server.url);
    let wasm = std::fs::read(&v2).unwrap();
    // (A small body: the server answers 404 before it reads one.)
    let (status, body) = raw("POST", &url("nope"), Some(&token), "application/wasm", b"x");
    assert_eq!(status, 404, "{body}");
    let (status, body) = raw(
        "POST",
        &url("wc"),
        Some(&token),
        "application/wasm",
        b"not wasm",
    );
    assert_eq!(status, 422, "{body}");
    let (status, body) = raw(
        "POST",
        &format!("{}?start_empty=cuonts", url("wc")),
        Some(&token),
        "application/wasm",
        &wasm,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid_start_empty"), "{body}");
    let (status, _) = raw("POST", &url("wc"), None, "application/wasm", b"x");
    assert_eq!(status, 401);
}
