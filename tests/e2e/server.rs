//! `sluice serve` end to end: the real binary on a loopback port, driven
//! over HTTP by the CLI client's library and by raw requests.

use crate::support::server::{ADMIN, Server, code, raw};
use sluice::client::Client;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn wordcount() -> PathBuf {
    crate::support::component("examples/wordcount")
}

/// Writes `lines` as a JSON-lines file.
fn lines_file(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
    let path = dir.join(name);
    let text: String = lines
        .iter()
        .map(|l| serde_json::to_string(l).unwrap() + "\n")
        .collect();
    std::fs::write(&path, text).unwrap();
    path
}

/// Integrates a pipeline's whole output into word counts.
fn counts(client: &Client, pipeline: &str) -> BTreeMap<String, i64> {
    crate::support::server::integrated_counts(client, pipeline)
}

/// Waits until the pipeline's integrated output equals `expected`.
fn await_counts(client: &Client, pipeline: &str, expected: &BTreeMap<String, i64>) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let got = counts(client, pipeline);
        if &got == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{pipeline}: output never reached the expected counts ({} of {} words; status {})",
            got.len(),
            expected.len(),
            client.status(Some(pipeline)).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn status(client: &Client, pipeline: &str) -> serde_json::Value {
    serde_json::from_str(&client.status(Some(pipeline)).unwrap()).unwrap()
}

fn text(n: usize, salt: &str) -> Vec<String> {
    (0..n)
        .map(|i| format!("{salt}{} w{} common", i % 37, i % 11))
        .collect()
}

#[test]
fn two_tenants_run_wordcount_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let (a, b) = (server.tenant("alpha"), server.tenant("beta"));
    a.deploy(&wordcount(), "wc", "wc", 2, false).unwrap();
    b.deploy(&wordcount(), "wc", "wc", 1, false).unwrap();
    let (la, lb) = (text(3_000, "a"), text(2_000, "b"));
    a.push(
        "wc",
        "lines",
        &lines_file(dir.path(), "a.jsonl", &la),
        &Default::default(),
    )
    .unwrap();
    b.push(
        "wc",
        "lines",
        &lines_file(dir.path(), "b.jsonl", &lb),
        &Default::default(),
    )
    .unwrap();
    let ea = crate::support::recount(la.iter().map(|l| (l.as_str(), 1)));
    let eb = crate::support::recount(lb.iter().map(|l| (l.as_str(), 1)));
    await_counts(&a, "wc", &ea);
    await_counts(&b, "wc", &eb);
    assert_ne!(ea, eb, "the tenants' inputs differ, so their outputs must");
    // Long-poll: a reader waiting for output gets it when the step commits.
    let c = server.tenant("gamma");
    c.deploy(&wordcount(), "wc", "wc", 1, false).unwrap();
    let t = Instant::now();
    let reader = {
        let c2 = Client::new(&server.url, c.token());
        std::thread::spawn(move || c2.read("wc", "counts", None, 20_000).unwrap())
    };
    std::thread::sleep(Duration::from_millis(300));
    c.push(
        "wc",
        "lines",
        &lines_file(dir.path(), "c.jsonl", &["late words".to_owned()]),
        &Default::default(),
    )
    .unwrap();
    let got = reader.join().unwrap();
    assert_eq!(
        got.len(),
        2,
        "the long-poll returned the new output: {got:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(15));
}

#[test]
fn every_route_is_authorized_and_crafted_names_touch_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data);
    let a = server.tenant("alpha");
    let b = server.tenant("beta");
    a.deploy(&wordcount(), "wc", "wc", 1, false).unwrap();
    let u = |p: &str| format!("{}{p}", server.url);
    let tenant_routes: Vec<(&str, String)> = vec![
        ("GET", u("/pipelines/wc")),
        ("POST", u("/pipelines/wc/start")),
        ("POST", u("/pipelines/wc/pause")),
        ("POST", u("/pipelines/wc/stop")),
        ("POST", u("/pipelines/wc/input/lines")),
        ("GET", u("/pipelines/wc/output/counts")),
        ("DELETE", u("/pipelines/wc")),
        ("DELETE", u("/components/wc")),
    ];
    for (m, url) in &tenant_routes {
        let (s, body) = raw(m, url, Some(b.token()), "application/x-ndjson", b"\"x\"\n");
        assert_eq!(s, 404, "{m} {url} with another tenant's token: {body}");
        assert_eq!(code(&body), "not_found");
        let (s, body) = raw(m, url, None, "application/x-ndjson", b"\"x\"\n");
        assert_eq!(s, 401, "{m} {url} without a token: {body}");
        assert_eq!(code(&body), "unauthorized");
        let (s, _) = raw(
            m,
            url,
            Some("sl_forged"),
            "application/x-ndjson",
            b"\"x\"\n",
        );
        assert_eq!(s, 401, "{m} {url} with a forged token");
    }
    for (m, url) in [
        ("GET", u("/pipelines")),
        ("POST", u("/pipelines")),
        ("GET", u("/components")),
        ("PUT", u("/components/x")),
        ("POST", u("/tenants")),
        ("GET", u("/metrics")),
    ] {
        let (s, body) = raw(m, &url, None, "application/json", b"{}");
        assert_eq!(s, 401, "{m} {url} without a token: {body}");
    }
    let (s, body) = raw(
        "POST",
        &u("/tenants"),
        Some(a.token()),
        "application/json",
        br#"{"name":"evil"}"#,
    );
    assert_eq!(
        (s, code(&body).as_str()),
        (403, "forbidden"),
        "tenants cannot create tenants"
    );
    let (s, _) = raw("GET", &u("/metrics"), Some(a.token()), "", b"");
    assert_eq!(s, 403, "metrics are the admin's");
    // b sees only its own (empty) world.
    assert_eq!(b.status(None).unwrap(), "[]");
    let (s, body) = raw("GET", &u("/components"), Some(b.token()), "", b"");
    assert_eq!((s, body.as_str()), (200, "[]"));
    // a still has its pipeline: nothing b tried reached it.
    assert_eq!(status(&a, "wc")["name"], "wc");

    // Crafted names: refused with a 4xx, and nothing is created outside the
    // tenant's directory.
    let before = tree(dir.path());
    let huge = "a".repeat(5000);
    for name in [
        "%2E%2E%2Fx",
        "..%2F..%2Fescaped",
        "%2Fetc%2Fpasswd",
        "a%2Fb",
        "UPPER",
        "dot.dot",
        "-dash",
        huge.as_str(),
        "%00",
    ] {
        let (s, body) = raw(
            "PUT",
            &u(&format!("/components/{name}")),
            Some(a.token()),
            "application/wasm",
            b"\0asm",
        );
        assert!(
            (400..500).contains(&s),
            "component name {name:.40}: {s} {body:.200}"
        );
        let spec = serde_json::json!({ "name": name.replace("%2F", "/").replace("%2E", "."), "component": "wc" });
        let (s, body) = raw(
            "POST",
            &u("/pipelines"),
            Some(a.token()),
            "application/json",
            spec.to_string().as_bytes(),
        );
        assert!(
            (400..500).contains(&s),
            "pipeline name {name:.40}: {s} {body:.200}"
        );
        let (s, _) = raw(
            "GET",
            &u(&format!("/pipelines/{name}")),
            Some(a.token()),
            "",
            b"",
        );
        assert!((400..500).contains(&s));
    }
    let (s, body) = raw(
        "POST",
        &u("/tenants"),
        Some(ADMIN),
        "application/json",
        br#"{"name":"../root"}"#,
    );
    assert_eq!((s, code(&body).as_str()), (400, "invalid_name"));
    let after = tree(dir.path());
    let new: Vec<&String> = after.iter().filter(|p| !before.contains(*p)).collect();
    assert!(
        new.iter()
            .all(|p| p.starts_with("data/tenants/alpha/pipelines/wc/")),
        "crafted names created files: {new:?}"
    );
    let _ = &server.data;
}

/// Every path under `dir`, relative.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().to_string_lossy().into_owned());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

/// `(method, url, content type, body, expected status, expected code)`.
type Case<'a> = (&'a str, String, &'a str, Vec<u8>, u16, &'a str);

#[test]
fn malformed_requests_get_a_4xx_with_a_stable_code() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let a = server.tenant("alpha");
    a.deploy(&wordcount(), "wc", "wc", 1, false).unwrap();
    let u = |p: &str| format!("{}{p}", server.url);
    let t = Some(a.token());
    let cases: Vec<Case> = vec![
        (
            "POST",
            u("/pipelines"),
            "application/json",
            b"{not json".to_vec(),
            400,
            "invalid_json",
        ),
        (
            "POST",
            u("/pipelines"),
            "application/json",
            br#"{"name": 7, "component": "wc"}"#.to_vec(),
            400,
            "invalid_request",
        ),
        (
            "POST",
            u("/pipelines"),
            "application/json",
            br#"{"name": "p", "component": "wc", "wokers": 2}"#.to_vec(),
            400,
            "invalid_request",
        ),
        (
            "POST",
            u("/pipelines"),
            "application/json",
            br#"{"name": "p", "component": "wc", "workers": 99}"#.to_vec(),
            422,
            "limit_exceeded",
        ),
        (
            "POST",
            u("/pipelines"),
            "application/json",
            br#"{"name": "p", "component": "nope"}"#.to_vec(),
            404,
            "not_found",
        ),
        (
            "POST",
            u("/pipelines/wc/input/lines"),
            "application/x-ndjson",
            b"{\"insert\": 1, \"delete\": 2}\n".to_vec(),
            400,
            "invalid_event",
        ),
        (
            "POST",
            u("/pipelines/wc/input/lines"),
            "application/x-ndjson",
            b"not json\n".to_vec(),
            400,
            "invalid_event",
        ),
        (
            "POST",
            u("/pipelines/wc/input/lines"),
            "application/json",
            b"[1, 2".to_vec(),
            400,
            "invalid_json",
        ),
        (
            "POST",
            u("/pipelines/wc/input/lines"),
            "application/x-ndjson",
            vec![b'1'; 17 << 20],
            413,
            "body_too_large",
        ),
        (
            "POST",
            u("/pipelines/wc/input/nope"),
            "application/x-ndjson",
            b"1\n".to_vec(),
            404,
            "not_found",
        ),
        (
            "GET",
            u("/pipelines/wc/output/counts?after=1:2"),
            "",
            Vec::new(),
            400,
            "invalid_position",
        ),
        (
            "GET",
            u("/pipelines/wc/output/counts?bogus=1"),
            "",
            Vec::new(),
            400,
            "invalid_query",
        ),
        (
            "POST",
            u("/pipelines/wc/explode"),
            "",
            Vec::new(),
            404,
            "not_found",
        ),
        (
            "PUT",
            u("/components/junk"),
            "application/wasm",
            b"not a component".to_vec(),
            422,
            "invalid_component",
        ),
        ("GET", u("/no/such/route"), "", Vec::new(), 404, "not_found"),
    ];
    for (m, url, ct, body, want, want_code) in cases {
        let (s, got) = if body.len() > 1 << 20 {
            server.send(m, url.strip_prefix(&server.url).unwrap(), t, ct, &body)
        } else {
            raw(m, &url, t, ct, &body)
        };
        assert_eq!(s, want, "{m} {url}: {got:.300}");
        assert_eq!(code(&got), want_code, "{m} {url}: {got:.300}");
    }
    // The server is still fine.
    assert_eq!(status(&a, "wc")["name"], "wc");
    // The OpenAPI document lists the routes; the status page the pipelines.
    let (s, doc) = raw("GET", &u("/openapi.json"), None, "", b"");
    assert_eq!(s, 200);
    let doc: serde_json::Value = serde_json::from_str(&doc).unwrap();
    for path in [
        "/tenants",
        "/components/{name}",
        "/pipelines",
        "/pipelines/{name}/input/{port}",
    ] {
        assert!(
            doc["paths"][path].is_object(),
            "{path} missing from /openapi.json"
        );
    }
    let (s, page) = raw("GET", &u("/"), t, "", b"");
    assert_eq!(s, 200);
    assert!(
        page.contains("<td>wc</td>"),
        "the status page lists the pipeline"
    );
    let (_, page) = raw("GET", &u("/"), None, "", b"");
    assert!(!page.contains("<td>wc</td>"), "not without a token");
}

/// Waits until `pipeline` fails; returns its error.
fn await_failure(client: &Client, pipeline: &str) -> String {
    await_state(client, pipeline, "failed")["last_error"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn hostile_guests_fail_only_their_own_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let victim = server.tenant("victim");
    let hostile = server.tenant("hostile");
    victim.deploy(&wordcount(), "wc", "wc", 2, false).unwrap();
    let misbehave = crate::support::component("tests/guests/misbehave");
    let upload = |name: &str, limits: serde_json::Value| {
        let bytes = std::fs::read(&misbehave).unwrap();
        let (s, body) = server.upload(hostile.token(), "misbehave", &bytes);
        assert_eq!(s, 201, "{body}");
        let spec = serde_json::json!({ "name": name, "component": "misbehave", "workers": 1, "limits": limits });
        let (s, body) = server.create(hostile.token(), &spec);
        assert_eq!(s, 201, "{body}");
    };
    let mut round = 0;
    let feed_victim = |round: &mut usize| {
        *round += 1;
        let f = lines_file(dir.path(), &format!("v{round}.jsonl"), &text(200, "v"));
        victim.push("wc", "lines", &f, &Default::default()).unwrap();
    };
    for (name, limits, input, cause) in [
        (
            "spin",
            serde_json::json!({ "fuel_per_step": 200_000_000u64, "deadline_ms": 5000 }),
            "\"spin\"\n".to_owned(),
            "fuel",
        ),
        (
            "grow",
            serde_json::json!({ "memory_mib": 64 }),
            "\"grow\"\n".to_owned(),
            "memory limit",
        ),
        (
            "trap",
            serde_json::json!({}),
            "\"trap\"\n".to_owned(),
            "trapped",
        ),
        (
            "flood",
            serde_json::json!({ "max_output_per_step": 10 }),
            (0..100).map(|i| format!("\"x{i}\"\n")).collect::<String>(),
            "output limit",
        ),
        (
            "shout",
            serde_json::json!({}),
            "\"shout\"\n".to_owned(),
            "the circuit failed",
        ),
    ] {
        upload(name, limits);
        feed_victim(&mut round);
        let before = status(&victim, "wc")["steps"].as_u64().unwrap();
        let (s, body) = raw(
            "POST",
            &format!("{}/pipelines/{name}/input/in", server.url),
            Some(hostile.token()),
            "application/x-ndjson",
            input.as_bytes(),
        );
        assert_eq!(s, 200, "{body}");
        let error = await_failure(&hostile, name);
        assert!(
            error.contains(cause),
            "{name}: the error names the cause ({cause}): {error}"
        );
        // The victim keeps committing steps.
        feed_victim(&mut round);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let now = status(&victim, "wc");
            assert_ne!(now["state"], "failed", "the victim failed: {now}");
            if now["steps"].as_u64().unwrap() > before {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the victim stopped committing after {name}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // What a guest says is kept bounded and escaped (issue #13, item 9):
    // its 1 MiB message with newlines, markup and terminal escapes.
    let error = await_failure(&hostile, "shout");
    assert!(error.len() <= 4200, "{} bytes kept", error.len());
    assert!(
        error.ends_with("more bytes)"),
        "{:.200}",
        &error[error.len() - 100..]
    );
    assert!(error.contains("<script>"), "the message is kept (as text)");
    assert!(
        !error.contains('\n') && !error.contains('\u{1b}'),
        "control characters escaped"
    );
    let (_, page) = raw(
        "GET",
        &format!("{}/", server.url),
        Some(hostile.token()),
        "",
        b"",
    );
    assert!(!page.contains("<script>"), "markup escaped on the page");
    let all: Vec<String> = (1..=round).flat_map(|_| text(200, "v")).collect();
    await_counts(
        &victim,
        "wc",
        &crate::support::recount(all.iter().map(|l| (l.as_str(), 1))),
    );
}

#[test]
fn sigkill_of_the_server_resumes_pipelines_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data);
    let a = server.tenant("alpha");
    let spec = serde_json::json!({ "name": "wc", "component": "wc", "workers": 2, "max_batch": 200, "checkpoint_every_steps": 3 });
    let bytes = std::fs::read(wordcount()).unwrap();
    let (s, body) = server.upload(a.token(), "wc", &bytes);
    assert_eq!(s, 201, "{body}");
    let (s, body) = server.create(a.token(), &spec);
    assert_eq!(s, 201, "{body}");
    let token = a.token().to_owned();
    let chunks: Vec<Vec<String>> = (0..12).map(|i| text(1_000, &format!("c{i}_"))).collect();
    let push = |url: &str, seq: usize| {
        let body: String = chunks[seq]
            .iter()
            .map(|l| serde_json::to_string(l).unwrap() + "\n")
            .collect();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut r = agent
            .post(&format!("{url}/pipelines/wc/input/lines"))
            .header("Authorization", &format!("Bearer {token}"))
            .header("Sluice-Producer-Id", "loader")
            .header("Sluice-Producer-Seq", &(seq + 1).to_string())
            .send(body.as_bytes())
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        r.body_mut().read_to_string().unwrap()
    };
    let mut last_ack = String::new();
    for seq in 0..6 {
        last_ack = push(&server.url, seq);
    }
    // Let it commit some steps (and a checkpoint), then kill it mid-work.
    let deadline = Instant::now() + Duration::from_secs(60);
    while status(&a, "wc")["steps"].as_u64().unwrap() < 4 {
        assert!(Instant::now() < deadline, "no steps before the kill");
        std::thread::sleep(Duration::from_millis(20));
    }
    server.kill();
    let mut server = Server::start(&data);
    let a = Client::new(&server.url, &token);
    // The last acknowledged push again: a retry, appended nothing.
    let retry = push(&server.url, 5);
    assert_eq!(
        retry, last_ack,
        "a retried push is acknowledged with the original offsets (and appends nothing: the \
         final counts would be off otherwise)"
    );
    for seq in 6..12 {
        push(&server.url, seq);
    }
    let all: Vec<String> = chunks.iter().flatten().cloned().collect();
    await_counts(
        &a,
        "wc",
        &crate::support::recount(all.iter().map(|l| (l.as_str(), 1))),
    );
    let s = status(&a, "wc");
    assert!(
        s["last_checkpoint"].as_u64().is_some(),
        "checkpoints were taken: {s}"
    );
    server.kill();
}

/// Reads server-sent events from `url` until `n` have arrived; returns
/// `(id, data)` pairs.
fn sse(url: &str, token: &str, last_event_id: Option<&str>, n: usize) -> Vec<(String, String)> {
    use std::io::BufRead;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut req = agent
        .get(url)
        .header("Authorization", &format!("Bearer {token}"));
    if let Some(id) = last_event_id {
        req = req.header("Last-Event-ID", id);
    }
    let response = req.call().unwrap();
    assert_eq!(
        response.headers().get("content-type").unwrap(),
        "text/event-stream"
    );
    let reader = std::io::BufReader::new(response.into_body().into_reader());
    let (mut out, mut id) = (Vec::new(), String::new());
    for line in reader.lines() {
        let line = line.unwrap();
        if let Some(v) = line.strip_prefix("id: ") {
            id = v.to_owned();
        } else if let Some(v) = line.strip_prefix("data: ") {
            out.push((id.clone(), v.to_owned()));
            if out.len() == n {
                break;
            }
        }
    }
    out
}

#[test]
fn output_streams_as_server_sent_events() {
    let dir = tempfile::tempdir().unwrap();
    let first = text(500, "s");
    let (server, a) = wordcount_with(dir.path(), &first);
    let url = format!("{}/pipelines/wc/output/counts/stream", server.url);
    let existing = a.read("wc", "counts", None, 0).unwrap().len();
    // A stream from the start replays what is there, in position order.
    let events = sse(&url, a.token(), None, existing);
    let ids: Vec<&String> = events.iter().map(|(id, _)| id).collect();
    let parse = |id: &str| -> (u64, u32, u32) {
        let p: Vec<u64> = id.split(':').map(|x| x.parse().unwrap()).collect();
        (p[0], p[1] as u32, p[2] as u32)
    };
    assert!(
        ids.windows(2).all(|w| parse(w[0]) < parse(w[1])),
        "ids increase"
    );
    let text_of = |events: &[(String, String)]| -> String {
        events.iter().map(|(_, d)| format!("{d}\n")).collect()
    };
    assert_eq!(
        sluice_tools::demo::integrate_counts(&text_of(&events)).unwrap(),
        crate::support::recount(first.iter().map(|l| (l.as_str(), 1)))
    );
    // Resuming with Last-Event-ID continues right after that event.
    let k = existing / 2;
    let resumed = sse(&url, a.token(), Some(&events[k].0), 1);
    assert_eq!(resumed[0], events[k + 1]);
    // An open stream delivers new steps' output as they commit.
    let last = events.last().unwrap().0.clone();
    let reader = {
        let (url, token) = (url.clone(), a.token().to_owned());
        std::thread::spawn(move || sse(&url, &token, Some(&last), 2))
    };
    std::thread::sleep(Duration::from_millis(300));
    a.push(
        "wc",
        "lines",
        &lines_file(
            dir.path(),
            "2.jsonl",
            &["brandnew brandnew other".to_owned()],
        ),
        &Default::default(),
    )
    .unwrap();
    let live = reader.join().unwrap();
    assert!(
        live.iter().any(|(_, d)| d.contains("brandnew")),
        "the new step's output arrived on the open stream: {live:?}"
    );
}

/// A server in `dir/data` with tenant `alpha` running word count (W=2)
/// over `lines`, its output complete.
fn wordcount_with(dir: &Path, lines: &[String]) -> (Server, Client) {
    let server = Server::start(&dir.join("data"));
    let a = server.tenant("alpha");
    a.deploy(&wordcount(), "wc", "wc", 2, false).unwrap();
    a.push(
        "wc",
        "lines",
        &lines_file(dir, "1.jsonl", lines),
        &Default::default(),
    )
    .unwrap();
    await_counts(
        &a,
        "wc",
        &crate::support::recount(lines.iter().map(|l| (l.as_str(), 1))),
    );
    (server, a)
}

/// Waits until `pipeline`'s state is `state`.
fn await_state(client: &Client, pipeline: &str, state: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = status(client, pipeline);
        if s["state"] == state {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{pipeline} never became {state}: {s}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn pause_stop_start_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let first = text(300, "p");
    let (server, a) = wordcount_with(dir.path(), &first);
    // Paused: input is accepted but no step runs.
    a.control("wc", "pause").unwrap();
    let paused = await_state(&a, "wc", "paused");
    a.push(
        "wc",
        "lines",
        &lines_file(dir.path(), "2.jsonl", &["later words".to_owned()]),
        &Default::default(),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        status(&a, "wc")["steps"],
        paused["steps"],
        "no steps while paused"
    );
    // Stopped: checkpointed.
    a.control("wc", "stop").unwrap();
    let stopped = await_state(&a, "wc", "stopped");
    assert_eq!(
        stopped["last_checkpoint"].as_u64(),
        stopped["steps"].as_u64().map(|s| s - 1),
        "stop checkpoints the last step: {stopped}"
    );
    // Started again: restores and catches up with the input pushed meanwhile.
    a.control("wc", "start").unwrap();
    let all: Vec<String> = first
        .iter()
        .cloned()
        .chain(["later words".to_owned()])
        .collect();
    await_counts(
        &a,
        "wc",
        &crate::support::recount(all.iter().map(|l| (l.as_str(), 1))),
    );
    // Deleted: gone from the API and from the disk.
    a.delete("wc").unwrap();
    let (s, _) = raw(
        "GET",
        &format!("{}/pipelines/wc", server.url),
        Some(a.token()),
        "",
        b"",
    );
    assert_eq!(s, 404);
    assert!(
        !data.join("tenants/alpha/pipelines/wc").exists(),
        "its data is removed"
    );
    assert_eq!(a.status(None).unwrap(), "[]");
}

/// A push's status and body, with producer headers `(id, epoch, seq)`.
fn push_as(
    server: &Server,
    token: &str,
    port: &str,
    producer: (&str, u64, u64),
    lines: &[serde_json::Value],
) -> (u16, serde_json::Value) {
    let body: String = lines.iter().map(|l| l.to_string() + "\n").collect();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut r = agent
        .post(&format!("{}/pipelines/oj/input/{port}", server.url))
        .header("Authorization", &format!("Bearer {token}"))
        .header("Sluice-Producer-Id", producer.0)
        .header("Sluice-Producer-Epoch", &producer.1.to_string())
        .header("Sluice-Producer-Seq", &producer.2.to_string())
        .send(body.as_bytes())
        .unwrap();
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap();
    (status, serde_json::from_str(&text).unwrap())
}

/// Producers get Kafka's idempotent-producer rules, per (producer, port):
/// the same sequence number on two ports appends on both; a gap, an older
/// number and an older session are refused (409, naming what was expected)
/// and append nothing; a retry of the last push gets its acknowledgement;
/// a producer that restarts its numbering starts a new session. The join's
/// output shows exactly the accepted pushes.
#[test]
fn producers_follow_kafka_idempotence_rules_per_port() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let a = server.tenant("alpha");
    a.deploy(
        &crate::support::component("examples/orders-join"),
        "oj",
        "oj",
        1,
        false,
    )
    .unwrap();
    let t = a.token().to_owned();
    let order = |id: u64, amount: u64| json!({"id": id, "customer": 1, "amount": amount});
    // (x, 1) on `customers`, then (x, 1) on `orders`: both are appended.
    let (s, ack) = push_as(
        &server,
        &t,
        "customers",
        ("x", 0, 1),
        &[json!({"id": 1, "name": "c1", "region": "north"})],
    );
    assert_eq!((s, ack["events"].as_u64()), (200, Some(1)), "{ack}");
    let (s, first) = push_as(&server, &t, "orders", ("x", 0, 1), &[order(1, 5)]);
    assert_eq!((s, first["events"].as_u64()), (200, Some(1)), "{first}");
    // A gap (3 before 2): refused, naming the expected number.
    let (s, err) = push_as(&server, &t, "orders", ("x", 0, 3), &[order(3, 1000)]);
    assert_eq!(
        (s, err["error"]["code"].as_str()),
        (409, Some("out_of_order_sequence"))
    );
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expected is 2"),
        "{err}"
    );
    let (s, _) = push_as(&server, &t, "orders", ("x", 0, 2), &[order(2, 7)]);
    assert_eq!(s, 200);
    // A retry of the last push: the original acknowledgement, nothing more.
    let (s, second) = push_as(&server, &t, "orders", ("x", 0, 2), &[order(2, 7)]);
    assert_eq!(s, 200);
    let (s, again) = push_as(&server, &t, "orders", ("x", 0, 2), &[order(2, 7)]);
    assert_eq!((s, &again), (200, &second), "a retry is acknowledged alike");
    // An older number: refused, naming the last acknowledged.
    let (s, err) = push_as(&server, &t, "orders", ("x", 0, 1), &[order(1, 5)]);
    assert_eq!(
        (s, err["error"]["code"].as_str()),
        (409, Some("duplicate_sequence"))
    );
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("2 was already acknowledged")
    );
    // A restart of the numbering is a new session, which fences the old one.
    let (s, _) = push_as(&server, &t, "orders", ("x", 1, 1), &[order(4, 100)]);
    assert_eq!(s, 200);
    let (s, err) = push_as(&server, &t, "orders", ("x", 0, 3), &[order(3, 1000)]);
    assert_eq!(
        (s, err["error"]["code"].as_str()),
        (409, Some("producer_fenced"))
    );
    let p: serde_json::Value = serde_json::from_str(
        &raw(
            "GET",
            &format!("{}/pipelines/oj/input/orders/producers/x", server.url),
            Some(&t),
            "",
            b"",
        )
        .1,
    )
    .unwrap();
    assert_eq!(
        (p["epoch"].as_u64(), p["last_seq"].as_u64()),
        (Some(1), Some(1)),
        "{p}"
    );
    // Exactly the accepted orders count: 5 + 7 + 100.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let lines = a.read("oj", "revenue", None, 1_000).unwrap();
        let mut z: BTreeMap<String, i64> = BTreeMap::new();
        for l in &lines {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let w = if v.get("insert").is_some() { 1 } else { -1 };
            let value = v.get("insert").or(v.get("delete")).unwrap().to_string();
            *z.entry(value).or_default() += w;
        }
        z.retain(|_, w| *w != 0);
        if z.keys().any(|k| k.contains("112")) {
            assert_eq!(z.len(), 1, "{z:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "revenue never reached 112: {z:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `sluice push` survives its own crash: SIGKILLed mid-file and run again,
/// it resumes after what the server acknowledged, and every line counts
/// once.
#[test]
fn sluice_push_resumes_after_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let a = server.tenant("alpha");
    a.deploy(&wordcount(), "wc", "wc", 1, false).unwrap();
    let lines: Vec<String> = (0..30_000)
        .map(|i| format!("p{} q{}", i % 101, i % 7))
        .collect();
    let file = lines_file(dir.path(), "big.jsonl", &lines);
    let push = || {
        let mut cmd = crate::support::sluice_cmd();
        cmd.args(["push", "wc", "lines"])
            .arg(&file)
            .args(["--chunk-lines", "100"])
            .env("SLUICE_SERVER", &server.url)
            .env("SLUICE_TOKEN", a.token())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        cmd
    };
    let mut child = push().spawn().unwrap();
    // Kill it once some pushes are acknowledged, long before the end.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = status(&a, "wc");
        let seen = s["events_in"].as_u64().unwrap() + s["input_lag"].as_u64().unwrap();
        if seen >= 2_000 {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the push finished before it could be killed"
        );
        assert!(Instant::now() < deadline, "the push made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let out = push().output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("resumed after the"), "{stderr}");
    await_counts(
        &a,
        "wc",
        &crate::support::recount(lines.iter().map(|l| (l.as_str(), 1))),
    );
    // Once more: nothing left to push.
    let out = push().output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("appended 0 events in 0 pushes"), "{stderr}");
}

/// The server commands print for people by default (aligned tables, short
/// sentences) and JSON with `--json`; a push refused on a bad line says
/// which line of the file, how much is already pushed, and how to resume.
#[test]
fn the_cli_talks_to_people_and_to_scripts() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let admin = |args: &[&str]| {
        crate::support::sluice_cmd()
            .args(args)
            .env("SLUICE_SERVER", &server.url)
            .env("SLUICE_TOKEN", ADMIN)
            .output()
            .unwrap()
    };
    let out = admin(&["tenant", "create", "acme"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.starts_with("created tenant acme\ntoken: sl_"),
        "{text}"
    );
    let token = text
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .unwrap()
        .to_owned();
    let run = |args: &[&str]| {
        let out = crate::support::sluice_cmd()
            .args(args)
            .env("SLUICE_SERVER", &server.url)
            .env("SLUICE_TOKEN", &token)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let wc = wordcount();
    let (ok, text, err) = run(&[
        "deploy",
        wc.to_str().unwrap(),
        "--pipeline",
        "wc",
        "--workers",
        "2",
    ]);
    assert!(ok, "{err}");
    assert!(text.starts_with("deployed wc: component wc ("), "{text}");
    assert!(
        text.contains("2 workers, inputs [lines], outputs [counts]"),
        "{text}"
    );

    let (ok, text, _) = run(&["pipelines"]);
    assert!(ok);
    let header = text.lines().next().unwrap();
    for column in [
        "PIPELINE",
        "STATE",
        "W",
        "STEPS/S",
        "IN/S",
        "LAG",
        "CHECKPOINT",
        "LAST ERROR",
    ] {
        assert!(header.contains(column), "{header}");
    }
    assert!(
        text.lines().nth(1).unwrap().trim_start().starts_with("wc"),
        "{text}"
    );
    let (ok, text, _) = run(&["status", "wc"]);
    assert!(ok);
    assert!(
        text.lines()
            .any(|l| l.starts_with("workers") && l.trim_end().ends_with('2')),
        "{text}"
    );
    let (ok, text, _) = run(&["components"]);
    assert!(
        ok && text.contains("COMPONENT") && text.contains("wc"),
        "{text}"
    );

    // Scripts get the JSON.
    let (ok, text, _) = run(&["status", "wc", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["workers"], 2);
    let (_, text, _) = run(&["pipelines", "-o", "json"]);
    assert!(
        serde_json::from_str::<Vec<serde_json::Value>>(&text).is_ok(),
        "{text}"
    );

    // A bad line: which line, what is pushed, how to resume.
    let file = dir.path().join("in.jsonl");
    let mut body: String = (0..10).map(|i| format!("\"line {i}\"\n")).collect();
    body.push_str("{oops\n\"after\"\n");
    std::fs::write(&file, body).unwrap();
    let (ok, _, err) = run(&[
        "push",
        "wc",
        "lines",
        file.to_str().unwrap(),
        "--chunk-lines",
        "4",
    ]);
    assert!(!ok);
    assert!(err.contains("line 11 of the file"), "{err}");
    assert!(err.contains("8 lines of"), "{err}");
    assert!(err.contains("resumes after line 8"), "{err}");
    assert_eq!(
        err.trim().lines().count(),
        2,
        "one line for the error, one for what to do: {err}"
    );
}
