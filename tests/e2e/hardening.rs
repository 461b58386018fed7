//! `sluice serve` under hostile clients and tenants (issue #13): each test
//! runs one attack against a real server on 127.0.0.1, bounded in count and
//! time, and checks three things — the attacker gets the documented answer,
//! the server's resident memory (or open files) stays under a stated bound,
//! and another tenant's pipeline keeps committing steps and answering
//! within a stated latency ([`Victim`]).

use crate::support::server::{ADMIN, Server, code, exchange, exchange_full, raw, raw_or_gone};
use sluice::client::Client;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn wordcount() -> PathBuf {
    crate::support::component("examples/wordcount")
}

/// How long the victim's requests may take while an attack runs.
const VICTIM_LATENCY: Duration = Duration::from_millis(1500);

/// A tenant with a running word-count pipeline, pushed to and read from
/// every 100 ms by a thread that records the slowest answer.
struct Victim {
    stop: Arc<AtomicBool>,
    /// Steps committed since the victim started watching.
    steps: Arc<std::sync::atomic::AtomicU64>,
    thread: Option<std::thread::JoinHandle<VictimReport>>,
}

/// What the victim saw.
#[derive(Debug)]
struct VictimReport {
    /// The slowest push or status read.
    slowest: Duration,
    /// Steps committed while it watched.
    steps: u64,
    /// Requests that failed.
    errors: Vec<String>,
}

impl Victim {
    fn start(server: &Server) -> Victim {
        let client = server.tenant("victim");
        client.deploy(&wordcount(), "wc", "wc", 1, false).unwrap();
        let url = server.url.clone();
        let token = client.token().to_owned();
        let stop = Arc::new(AtomicBool::new(false));
        let steps_seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (flag, seen) = (stop.clone(), steps_seen.clone());
        let thread = std::thread::spawn(move || {
            let client = Client::new(&url, &token);
            let steps = |c: &Client| -> Option<u64> {
                let s: serde_json::Value =
                    serde_json::from_str(&c.status(Some("wc")).ok()?).ok()?;
                s["steps"].as_u64()
            };
            let first = steps(&client).unwrap_or(0);
            let mut report = VictimReport {
                slowest: Duration::ZERO,
                steps: 0,
                errors: Vec::new(),
            };
            let mut i = 0;
            while !flag.load(Ordering::Relaxed) {
                i += 1;
                let started = Instant::now();
                let body = format!("\"victim line {i}\"\n");
                let (status, text) = raw(
                    "POST",
                    &format!("{url}/pipelines/wc/input/lines"),
                    Some(&token),
                    "application/x-ndjson",
                    body.as_bytes(),
                );
                if status != 200 {
                    report.errors.push(format!("push: {status} {text}"));
                }
                let now = steps(&client);
                report.slowest = report.slowest.max(started.elapsed());
                match now {
                    Some(n) => {
                        report.steps = n.saturating_sub(first);
                        seen.store(report.steps, Ordering::Relaxed);
                    }
                    None => report.errors.push("status unreadable".into()),
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            report
        });
        Victim {
            stop,
            steps: steps_seen,
            thread: Some(thread),
        }
    }

    /// Stops watching once the victim's pipeline committed a step (at most
    /// 20 s on); returns what it saw.
    fn finish(mut self) -> VictimReport {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.steps.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }

    /// Stops watching; asserts the victim stayed served within
    /// [`VICTIM_LATENCY`].
    fn assert_served(self, what: &str) -> VictimReport {
        self.assert_served_within(what, VICTIM_LATENCY)
    }

    /// Stops watching; asserts the victim saw no error, its pipeline
    /// committed steps, and no request of its took longer than `bound`.
    fn assert_served_within(self, what: &str, bound: Duration) -> VictimReport {
        let report = self.finish();
        eprintln!(
            "{what}: the victim's slowest request took {:?} (bound {bound:?}), {} steps",
            report.slowest, report.steps
        );
        assert!(
            report.errors.is_empty(),
            "{what}: the victim saw errors: {report:?}"
        );
        assert!(
            report.steps > 0,
            "{what}: the victim's pipeline committed no step: {report:?}"
        );
        assert!(
            report.slowest <= bound,
            "{what}: the victim waited {:?} (bound {bound:?})",
            report.slowest
        );
        report
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The server's resident memory, in MiB.
fn rss_mib(server: &Server) -> u64 {
    crate::support::server::status_kib(server.pid(), "VmRSS") >> 10
}

/// The server's open file descriptors.
fn open_files(server: &Server) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", server.pid()))
        .unwrap()
        .count()
}

/// Creates tenant `name` with `limits` (JSON) and returns its token.
fn tenant_with(server: &Server, name: &str, limits: serde_json::Value) -> String {
    let (status, body) = raw(
        "POST",
        &format!("{}/tenants", server.url),
        Some(ADMIN),
        "application/json",
        serde_json::json!({"name": name, "limits": limits})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(status, 201, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["token"].as_str().unwrap().to_owned()
}

/// Uploads word count as component `wc` for `token`.
fn upload_wordcount(server: &Server, token: &str) {
    let (status, body) = server.upload(token, "wc", &std::fs::read(wordcount()).unwrap());
    assert_eq!(status, 201, "{body}");
}

/// Creates tenant `name` with `limits`, running word count as pipeline
/// `wc` (`settings` added to its spec); returns its token.
fn tenant_running_wordcount(
    server: &Server,
    name: &str,
    limits: serde_json::Value,
    settings: serde_json::Value,
) -> String {
    let token = tenant_with(server, name, limits);
    upload_wordcount(server, &token);
    let mut spec = serde_json::json!({"name": "wc", "component": "wc"});
    spec.as_object_mut()
        .unwrap()
        .extend(settings.as_object().unwrap().clone());
    let (status, body) = server.create(&token, &spec);
    assert_eq!(status, 201, "{body}");
    token
}

/// `GET path` with `token`: `(status, body)`.
fn get(server: &Server, path: &str, token: &str) -> (u16, String) {
    raw(
        "GET",
        &format!("{}{path}", server.url),
        Some(token),
        "",
        b"",
    )
}

/// Connects to the server.
fn connect(server: &Server) -> TcpStream {
    let addr = server.url.strip_prefix("http://").unwrap();
    let s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Reads a response's status line within `within`, or `None`.
fn status_within(s: &mut TcpStream, within: Duration) -> Option<u16> {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                if let Some(line) = buf
                    .split(|b| *b == b'\n')
                    .next()
                    .filter(|_| buf.contains(&b'\n'))
                {
                    let line = String::from_utf8_lossy(line);
                    return line.split_whitespace().nth(1).and_then(|c| c.parse().ok());
                }
            }
            Err(_) => break,
        }
    }
    None
}

/// Whether the server closed `s` within `within` (reads end or fail).
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut chunk = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut chunk) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

/// Item 1: a body is read only after the token is checked, and only up to
/// the tenant's own limit.
#[test]
fn bodies_are_read_only_after_the_token_and_only_up_to_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let victim = Victim::start(&server);
    std::thread::sleep(Duration::from_millis(500));
    let before = rss_mib(&server);

    // Anonymous 40 MiB uploads: 401 after the headers, the body never read.
    let big = 40usize << 20;
    for path in [
        "/components/junk",
        "/pipelines",
        "/pipelines/wc/input/lines",
    ] {
        let mut s = connect(&server);
        write!(
            s,
            "{} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/wasm\r\nContent-Length: {big}\r\n\r\n",
            if path.starts_with("/components") { "PUT" } else { "POST" }
        )
        .unwrap();
        s.write_all(&vec![0u8; 64 << 10]).unwrap();
        assert_eq!(
            status_within(&mut s, Duration::from_secs(2)),
            Some(401),
            "{path}: an anonymous 40 MiB body must get 401 without being read"
        );
    }
    // Two anonymous 40 MiB uploads sent whole (as fast as the server
    // takes them): 401, nothing buffered.
    let junk = vec![7u8; big];
    for _ in 0..2 {
        let mut s = connect(&server);
        write!(
            s,
            "PUT /components/junk HTTP/1.1\r\nHost: x\r\nContent-Length: {big}\r\n\r\n"
        )
        .unwrap();
        s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        // The server may close before the body is through: a failed write
        // is fine, the answer is what counts.
        let _ = s.write_all(&junk);
        assert_eq!(status_within(&mut s, Duration::from_secs(2)), Some(401));
    }

    // A tenant whose components may be 1 MiB: a declared 8 MiB upload is
    // refused from its headers, a chunked one as soon as it passes 1 MiB.
    let token = tenant_with(
        &server,
        "small",
        serde_json::json!({"max_component_bytes": 1 << 20}),
    );
    let mut s = connect(&server);
    write!(
        s,
        "PUT /components/big HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: {}\r\n\r\n",
        8 << 20
    )
    .unwrap();
    assert_eq!(status_within(&mut s, Duration::from_secs(2)), Some(413));
    let mut s = connect(&server);
    write!(
        s,
        "PUT /components/big HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Transfer-Encoding: chunked\r\n\r\n"
    )
    .unwrap();
    let chunk = vec![1u8; 256 << 10];
    let mut sent = 0;
    let answered = loop {
        if write!(s, "{:x}\r\n", chunk.len()).is_err()
            || s.write_all(&chunk).is_err()
            || s.write_all(b"\r\n").is_err()
        {
            break status_within(&mut s, Duration::from_secs(2));
        }
        sent += chunk.len();
        if sent >= 2 << 20 {
            break status_within(&mut s, Duration::from_secs(2));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        answered,
        Some(413),
        "a chunked upload past the limit gets 413 (sent {sent})"
    );
    assert!(sent <= 2 << 20);

    let grew = rss_mib(&server).saturating_sub(before);
    eprintln!("refused bodies: the server grew by {grew} MiB");
    assert!(
        grew < 32,
        "the server grew by {grew} MiB reading refused bodies"
    );
    victim.assert_served("oversized and anonymous bodies");
}

/// Item 2: slow clients are cut off (headers and bodies), idle
/// connections end, and the number of connections is capped.
#[test]
fn slow_clients_are_cut_off_and_connections_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        &dir.path().join("data"),
        &[
            "--header-timeout-ms=1000".into(),
            "--body-timeout-ms=2000".into(),
            "--max-connections=48".into(),
        ],
    );
    let victim = Victim::start(&server);
    std::thread::sleep(Duration::from_millis(300));

    // Slowloris: 30 sockets sending a header byte every 200 ms.
    let mut slow: Vec<TcpStream> = (0..30).map(|_| connect(&server)).collect();
    let started = Instant::now();
    let request = b"GET /pipelines HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    for i in 0..request.len() {
        if started.elapsed() > Duration::from_secs(3) {
            break;
        }
        for s in &mut slow {
            let _ = s.write_all(&request[i..i + 1]);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    for (i, s) in slow.iter_mut().enumerate() {
        assert!(
            closed_within(s, Duration::from_secs(3)),
            "slow socket {i} still open after {:?}",
            started.elapsed()
        );
    }

    // A 1 byte/s upload from a tenant: cut off by the body deadline.
    let token = tenant_with(&server, "slowpoke", serde_json::json!({}));
    let mut s = connect(&server);
    write!(
        s,
        "POST /pipelines HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    .unwrap();
    let started = Instant::now();
    let mut answer = None;
    while started.elapsed() < Duration::from_secs(6) {
        if s.write_all(b" ").is_err() {
            break;
        }
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0u8; 512];
        match s.read(&mut buf) {
            Ok(0) | Err(_) if started.elapsed() < Duration::from_millis(400) => {}
            Ok(n) if n > 0 => {
                answer = String::from_utf8_lossy(&buf[..n])
                    .split_whitespace()
                    .nth(1)
                    .and_then(|c| c.parse::<u16>().ok());
                break;
            }
            _ => {}
        }
    }
    assert_eq!(
        answer,
        Some(408),
        "a 1 byte/s body gets 408 after the body deadline"
    );
    assert!(started.elapsed() < Duration::from_secs(4));

    // 200 idle connections: the server holds at most 48 at once.
    let base = open_files(&server);
    let idle: Vec<TcpStream> = (0..200).map(|_| connect(&server)).collect();
    std::thread::sleep(Duration::from_millis(500));
    let held = open_files(&server).saturating_sub(base);
    eprintln!("200 idle clients: the server holds {held} more files (cap 48)");
    assert!(
        held <= 48,
        "the server holds {held} more files with 200 idle clients (cap 48)"
    );
    // Idle connections end with the header timeout, 48 at a time: the
    // victim waits behind them, (200 / 48 + 1) header timeouts at most.
    std::thread::sleep(Duration::from_millis(2500));
    drop(idle);
    victim.assert_served_within(
        "slow and idle clients",
        Duration::from_millis(1000) * (200 / 48 + 1) + VICTIM_LATENCY,
    );
}

/// A valid component with no Sluice world and one function of about
/// `size` bytes of code: slow to compile.
fn huge_function_component(size: usize) -> Vec<u8> {
    use wasm_encoder::{
        CodeSection, Component, ExportKind, ExportSection, Function, FunctionSection, Module,
        ModuleSection, TypeSection, ValType,
    };
    let mut types = TypeSection::new();
    types.ty().function([ValType::I32], [ValType::I32]);
    let mut funcs = FunctionSection::new();
    funcs.function(0);
    let mut f = Function::new([(4, ValType::I32)]);
    let mut k = 0u32;
    while f.byte_len() < size {
        k += 1;
        let mut ins = f.instructions();
        ins.local_get(k % 5)
            .i32_const(k as i32)
            .i32_add()
            .local_get((k + 2) % 5)
            .i32_mul()
            .local_set((k + 1) % 5);
    }
    f.instructions().local_get(0).end();
    let mut code = CodeSection::new();
    code.function(&f);
    let mut exports = ExportSection::new();
    exports.export("f", ExportKind::Func, 0);
    let mut module = Module::new();
    module
        .section(&types)
        .section(&funcs)
        .section(&exports)
        .section(&code);
    let mut component = Component::new();
    component.section(&ModuleSection(&module));
    component.finish()
}

/// Item 3: compiling uploads does not stall anyone else, and a component
/// that cannot be a circuit is refused before it is compiled.
#[test]
fn compiling_huge_components_does_not_stall_other_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let victim = Victim::start(&server);
    let token = tenant_with(&server, "compiler", serde_json::json!({}));
    let uploads: Vec<_> = (0..2)
        .map(|i| {
            let (url, token) = (server.url.clone(), token.clone());
            std::thread::spawn(move || {
                let wasm = huge_function_component(1 << 20);
                let started = Instant::now();
                let (status, body) = raw(
                    "PUT",
                    &format!("{url}/components/huge{i}"),
                    Some(&token),
                    "application/wasm",
                    &wasm,
                );
                (status, body, started.elapsed())
            })
        })
        .collect();
    for u in uploads {
        let (status, body, took) = u.join().unwrap();
        assert_eq!(status, 422, "{body}");
        assert_eq!(code(&body), "invalid_component");
        assert!(took < Duration::from_secs(60), "the upload took {took:?}");
    }
    victim.assert_served("two huge uploads");
}

/// Item 7: the pipeline quota holds under parallel creates.
#[test]
fn the_pipeline_quota_holds_under_parallel_creates() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let token = tenant_with(&server, "greedy", serde_json::json!({"max_pipelines": 4}));
    upload_wordcount(&server, &token);
    let creates: Vec<_> = (0..30)
        .map(|i| {
            let (url, token) = (server.url.clone(), token.clone());
            std::thread::spawn(move || {
                raw(
                    "POST",
                    &format!("{url}/pipelines"),
                    Some(&token),
                    "application/json",
                    serde_json::json!({"name": format!("p{i}"), "component": "wc"})
                        .to_string()
                        .as_bytes(),
                )
            })
        })
        .collect();
    let mut created = 0;
    for c in creates {
        let (status, body) = c.join().unwrap();
        match status {
            201 => created += 1,
            422 => assert_eq!(code(&body), "limit_exceeded", "{body}"),
            _ => panic!("{status} {body}"),
        }
    }
    assert_eq!(created, 4, "30 parallel creates against max_pipelines = 4");
    let list = Client::new(&server.url, &token).status(None).unwrap();
    let list: Vec<serde_json::Value> = serde_json::from_str(&list).unwrap();
    assert_eq!(list.len(), 4);
}

/// Item 7: every numeric setting has a range; outside it, 400.
#[test]
fn numeric_settings_outside_their_range_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let token = tenant_with(&server, "t", serde_json::json!({}));
    upload_wordcount(&server, &token);
    let bad = [
        serde_json::json!({"max_batch": u64::MAX}),
        serde_json::json!({"max_batch": 0}),
        serde_json::json!({"checkpoint_every_steps": 0}),
        serde_json::json!({"checkpoint_interval_ms": 0}),
        serde_json::json!({"checkpoint_interval_ms": u64::MAX}),
        serde_json::json!({"workers": 0}),
    ];
    for (i, setting) in bad.iter().enumerate() {
        let mut spec = serde_json::json!({"name": format!("p{i}"), "component": "wc"});
        spec.as_object_mut()
            .unwrap()
            .extend(setting.as_object().unwrap().clone());
        let (status, body) = server.create(&token, &spec);
        assert_eq!(status, 400, "{setting}: {body}");
        assert_eq!(code(&body), "out_of_range", "{setting}: {body}");
    }
    // Tenant limits too (the admin's request).
    for limits in [
        serde_json::json!({"memory_mib": 0}),
        serde_json::json!({"memory_mib": u64::MAX}),
        serde_json::json!({"max_workers": 100000}),
        serde_json::json!({"deadline_ms": 0}),
    ] {
        let (status, body) = raw(
            "POST",
            &format!("{}/tenants", server.url),
            Some(ADMIN),
            "application/json",
            serde_json::json!({"name": "bad", "limits": limits})
                .to_string()
                .as_bytes(),
        );
        assert_eq!(status, 400, "{limits}: {body}");
        assert_eq!(code(&body), "out_of_range", "{limits}: {body}");
    }
}

/// Item 7: a push of millions of tiny lines is refused as it is parsed,
/// and concurrent pushes are bounded, so the server's memory stays bounded.
#[test]
fn pushes_of_tiny_lines_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let victim = Victim::start(&server);
    let token = tenant_running_wordcount(
        &server,
        "flood",
        serde_json::json!({}),
        serde_json::json!({}),
    );
    std::thread::sleep(Duration::from_millis(300));
    let before = rss_mib(&server);
    // 15 MiB of `1\n`: 7.8 M events in one body, four at once.
    let body = Arc::new("1\n".repeat(15 << 19));
    let results = Arc::new(Mutex::new(Vec::new()));
    let pushes: Vec<_> = (0..4)
        .map(|_| {
            let head = format!(
                "POST /pipelines/wc/input/lines HTTP/1.1\r\nHost: x\r\n\
                 Authorization: Bearer {token}\r\nContent-Type: application/x-ndjson\r\n\
                 Content-Length: {}\r\n\r\n",
                body.len()
            );
            let (url, body, results) = (server.url.clone(), body.clone(), results.clone());
            std::thread::spawn(move || {
                let server = Server::attach(&url);
                let r = exchange(&server, &head, body.as_bytes());
                results.lock().unwrap().push(r);
            })
        })
        .collect();
    for p in pushes {
        p.join().unwrap();
    }
    for (status, body) in results.lock().unwrap().iter() {
        assert!(matches!(*status, 413 | 429), "{status} {body}");
        assert!(
            matches!(code(body).as_str(), "too_many_events" | "too_many_requests"),
            "{body}"
        );
    }
    let grew = rss_mib(&server).saturating_sub(before);
    eprintln!("tiny-line pushes: the server grew by {grew} MiB");
    assert!(
        grew < 160,
        "four 15 MiB pushes of tiny lines grew the server by {grew} MiB"
    );
    victim.assert_served("pushes of tiny lines");
}

/// Item 10: the status page never takes a token in its URL; a browser
/// signs in through a form and gets an HttpOnly, SameSite=Strict cookie;
/// responses say `no-store` and `no-referrer`; the admin rotates a
/// tenant's token (the old one and its sessions stop working) and deletes
/// a tenant with its data.
#[test]
fn tokens_stay_out_of_urls_rotate_and_die_with_their_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data);
    let tenant = server.tenant("alpha");
    tenant.deploy(&wordcount(), "wc", "wc", 1, false).unwrap();
    let fetch = |path: &str, extra: &str| {
        exchange_full(
            &server,
            &format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n"),
            b"",
        )
    };
    // A token in the URL shows nothing, not even the admin's.
    for token in [ADMIN, tenant.token()] {
        let (status, headers, page) = fetch(&format!("/?token={token}"), "");
        assert_eq!(status, 200);
        assert!(
            !page.contains("<td>wc</td>") && !page.contains("id=\"app\""),
            "{page}"
        );
        assert!(
            page.contains("action=\"/login\""),
            "the sign-in form: {page}"
        );
        let headers = headers.to_ascii_lowercase();
        assert!(headers.contains("cache-control: no-store"), "{headers}");
        assert!(
            headers.contains("referrer-policy: no-referrer"),
            "{headers}"
        );
    }
    // Sign in through the form.
    let login = |token: &str| {
        let form = format!("token={token}");
        exchange_full(
            &server,
            &format!(
                "POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                form.len()
            ),
            form.as_bytes(),
        )
    };
    let (status, _, _) = login("sl_not-a-token");
    assert_eq!(status, 401);
    let (status, headers, _) = login(tenant.token());
    assert_eq!(status, 303, "{headers}");
    let cookie = headers
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("set-cookie:")
                .then(|| l["set-cookie:".len()..].trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no cookie: {headers}"));
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_owned();
    let (_, _, page) = fetch("/", &format!("Cookie: {session}\r\n"));
    assert!(
        page.contains("<td>wc</td>"),
        "signed in, the page lists the pipeline: {page}"
    );
    // The API does not take the cookie.
    let (status, _, _) = fetch("/pipelines", &format!("Cookie: {session}\r\n"));
    assert_eq!(status, 401);

    // Rotation: the old token and its session stop working, the new works.
    let (status, body) = raw(
        "POST",
        &format!("{}/tenants/alpha/token", server.url),
        Some(ADMIN),
        "",
        b"",
    );
    assert_eq!(status, 200, "{body}");
    let new_token = serde_json::from_str::<serde_json::Value>(&body).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _) = raw(
        "GET",
        &format!("{}/pipelines", server.url),
        Some(tenant.token()),
        "",
        b"",
    );
    assert_eq!(status, 401, "the old token after rotation");
    let (_, _, page) = fetch("/", &format!("Cookie: {session}\r\n"));
    assert!(
        !page.contains("<td>wc</td>"),
        "the old session after rotation"
    );
    let (status, _) = get(&server, "/pipelines", &new_token);
    assert_eq!(status, 200);

    // Deletion: the token dies, the data goes.
    assert!(data.join("tenants/alpha/pipelines/wc").exists());
    let (status, body) = raw(
        "DELETE",
        &format!("{}/tenants/alpha", server.url),
        Some(ADMIN),
        "",
        b"",
    );
    assert_eq!(status, 204, "{body}");
    let (status, _) = get(&server, "/pipelines", &new_token);
    assert_eq!(status, 401);
    assert!(
        !data.join("tenants/alpha").exists(),
        "the tenant's data is deleted"
    );
    let (status, body) = get(&server, "/tenants", ADMIN);
    assert_eq!(status, 200);
    assert!(!body.contains("\"alpha\""), "{body}");
    // The name can be used again, from scratch.
    let again = server.tenant("alpha");
    assert_eq!(again.status(None).unwrap().trim(), "[]");
}

/// Item 11: a component named like a version's hash cannot replace the
/// version a pipeline runs.
#[test]
fn a_component_name_cannot_overwrite_a_pinned_version() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data);
    let tenant = server.tenant("alpha");
    let wc = std::fs::read(wordcount()).unwrap();
    let (status, body) = server.upload(tenant.token(), "wc", &wc);
    assert_eq!(status, 201, "{body}");
    let (status, body) = server.create(
        tenant.token(),
        &serde_json::json!({"name": "p", "component": "wc"}),
    );
    assert_eq!(status, 201, "{body}");
    let hash = serde_json::from_str::<serde_json::Value>(&body).unwrap()["component_hash"]
        .as_str()
        .unwrap()
        .to_owned();
    // Another circuit uploaded under the pinned version's hash.
    let other = std::fs::read(crate::support::component("tests/guests/misbehave")).unwrap();
    let (status, body) = server.upload(tenant.token(), &hash, &other);
    assert_eq!(status, 201, "{body}");
    // After a restart the pipeline still runs word count.
    server.kill();
    let server = Server::start(&data);
    let client = Client::new(&server.url, tenant.token());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s: serde_json::Value =
            serde_json::from_str(&client.status(Some("p")).unwrap()).unwrap();
        assert_eq!(s["component_hash"], hash.as_str());
        assert!(s["last_error"].is_null(), "{s}");
        if s["inputs"] == serde_json::json!(["lines"]) && s["state"] != "starting" {
            break;
        }
        assert!(Instant::now() < deadline, "{s}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Both names are listed, each with its own bytes.
    let list = raw(
        "GET",
        &format!("{}/components", server.url),
        Some(tenant.token()),
        "",
        b"",
    )
    .1;
    assert!(
        list.contains("\"wc\"") && list.contains(&format!("\"{hash}\"")),
        "{list}"
    );
}

/// Item 4: pipelines are admitted against the host's memory budget (the
/// sum of workers × memory limit of every pipeline holding instances).
#[test]
fn pipelines_are_admitted_against_the_host_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    // Each pipeline is promised its instances and its database's bound.
    let db = sluice_pipeline::storage::HOST_MEMORY_BOUND;
    assert_eq!(db, 56 << 20);
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--memory-budget-mib=700".into()],
    );
    let token = tenant_with(&server, "big", serde_json::json!({"memory_mib": 256}));
    upload_wordcount(&server, &token);
    let create = |name: &str, workers: u32| {
        server.create(
            &token,
            &serde_json::json!({"name": name, "component": "wc", "workers": workers}),
        )
    };
    // 2 × 256 + 56 MiB fits 700 MiB; one more worker (256 + 56) does not.
    let (status, body) = create("first", 2);
    assert_eq!(status, 201, "{body}");
    let (status, body) = create("second", 1);
    assert_eq!(
        (status, code(&body).as_str()),
        (503, "host_memory_exhausted"),
        "{body}"
    );
    // A pipeline asking for less memory (64 + 56) fits.
    let (status, body) = server.create(
        &token,
        &serde_json::json!({"name": "small", "component": "wc", "limits": {"memory_mib": 64}}),
    );
    assert_eq!(status, 201, "{body}");
    // Stopping frees the promise; starting takes it again, if it fits.
    let client = Client::new(&server.url, &token);
    client.control("first", "stop").unwrap();
    let (status, body) = create("second", 1);
    assert_eq!(status, 201, "{body}");
    let (status, body) = raw(
        "POST",
        &format!("{}/pipelines/first/start", server.url),
        Some(&token),
        "",
        b"",
    );
    assert_eq!(
        (status, code(&body).as_str()),
        (503, "host_memory_exhausted"),
        "{body}"
    );
    // The admin sees the budget and what is promised.
    let (_, usage) = get(&server, "/tenants", ADMIN);
    let usage: serde_json::Value = serde_json::from_str(&usage).unwrap();
    assert_eq!(usage["memory_budget_bytes"], 700u64 << 20);
    assert_eq!(
        usage["memory_promised_bytes"],
        ((256u64 + 64) << 20) + 2 * db
    );
    assert!(usage["disk_free_bytes"].as_u64().unwrap() > 0);

    // Upgrading the stopped pipeline starts its instances for the trial:
    // they are reserved, so the upgrade is refused while the budget has no
    // room for them, and made once it has (the pipeline stays stopped).
    let v2 = std::fs::read(crate::support::component("tests/guests/wordcount-v2")).unwrap();
    let (status, body) = server.upload(&token, "wc2", &v2);
    assert_eq!(status, 201, "{body}");
    let upgrade = || {
        raw(
            "PATCH",
            &format!("{}/pipelines/first", server.url),
            Some(&token),
            "application/json",
            br#"{"component": "wc2"}"#,
        )
    };
    let (status, body) = upgrade();
    assert_eq!(
        (status, code(&body).as_str()),
        (503, "host_memory_exhausted"),
        "{body}"
    );
    client.control("second", "stop").unwrap();
    let (status, body) = upgrade();
    assert_eq!(status, 200, "{body}");
    let upgraded: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(upgraded["component"], "wc2", "{body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status: serde_json::Value =
            serde_json::from_str(&client.status(Some("first")).unwrap()).unwrap();
        if status["state"] == "stopped" {
            break;
        }
        assert!(Instant::now() < deadline, "not stopped again: {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The trial's reservation ended with it.
    let (_, usage) = get(&server, "/tenants", ADMIN);
    let usage: serde_json::Value = serde_json::from_str(&usage).unwrap();
    assert_eq!(usage["memory_promised_bytes"], (64u64 << 20) + db);
}

/// Item 6: long-polls and output streams are capped per tenant (and in
/// total); a closed stream frees its place.
#[test]
fn output_streams_and_long_polls_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let token = tenant_running_wordcount(
        &server,
        "reader",
        serde_json::json!({"max_streams": 2}),
        serde_json::json!({}),
    );
    let open_stream = || {
        let mut s = connect(&server);
        write!(
            s,
            "GET /pipelines/wc/output/counts/stream HTTP/1.1\r\nHost: x\r\n\
             Authorization: Bearer {token}\r\n\r\n"
        )
        .unwrap();
        let status = status_within(&mut s, Duration::from_secs(5));
        (s, status)
    };
    let (first, status) = open_stream();
    assert_eq!(status, Some(200));
    let (_second, status) = open_stream();
    assert_eq!(status, Some(200));
    let (_, status) = open_stream();
    assert_eq!(status, Some(429), "a third stream");
    let (status, body) = get(&server, "/pipelines/wc/output/counts?wait_ms=5000", &token);
    assert_eq!(
        (status, code(&body).as_str()),
        (429, "too_many_requests"),
        "a long-poll"
    );
    // A read that does not wait is not a stream.
    let (status, _) = get(&server, "/pipelines/wc/output/counts", &token);
    assert_eq!(status, 200);
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_s, status) = open_stream();
        if status == Some(200) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a closed stream never freed its place"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Item 5: a tenant's disk quota refuses pushes (507) once used up; output
/// older than the retention (and every checkpoint) is deleted; a component
/// version no pipeline runs is deleted.
#[test]
fn disk_quota_output_retention_and_unused_versions() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data);
    let token = tenant_with(&server, "hoarder", serde_json::json!({"disk_quota_mib": 8}));
    let client = Client::new(&server.url, &token);
    upload_wordcount(&server, &token);
    let (status, body) = server.create(
        &token,
        &serde_json::json!({"name": "wc", "component": "wc", "output_retention_steps": 3,
                            "checkpoint_every_steps": 1}),
    );
    assert_eq!(status, 201, "{body}");

    // Retention: ten steps of distinct words, then the output starts late.
    for i in 0..10 {
        let before = serde_json::from_str::<serde_json::Value>(&client.status(Some("wc")).unwrap())
            .unwrap()["steps"]
            .as_u64()
            .unwrap();
        let body = format!("\"batch{i} word{i}\"\n");
        let (status, text) = raw(
            "POST",
            &format!("{}/pipelines/wc/input/lines", server.url),
            Some(&token),
            "application/x-ndjson",
            body.as_bytes(),
        );
        assert_eq!(status, 200, "{text}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while serde_json::from_str::<serde_json::Value>(&client.status(Some("wc")).unwrap())
            .unwrap()["steps"]
            .as_u64()
            .unwrap()
            == before
        {
            assert!(Instant::now() < deadline, "no step for push {i}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let lines = client.read("wc", "counts", None, 1).unwrap();
        let first: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
        let step: u64 = first["position"]
            .as_str()
            .unwrap()
            .split(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        if step >= 6 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "output of step {step} is still kept"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Quota: 512 KiB pushes until the quota refuses them.
    let chunk: String = (0..16_384)
        .map(|i| format!("\"filler line {i:>10}\"\n"))
        .collect();
    let mut refused = None;
    let push = |body: &[u8]| {
        let url = format!("{}/pipelines/wc/input/lines", server.url);
        raw_or_gone("POST", &url, Some(&token), "application/x-ndjson", body)
    };
    for n in 0..200 {
        let (status, body) = match push(chunk.as_bytes()) {
            Ok(answer) => answer,
            // A server may refuse a push over the quota before it reads
            // the body, and close the connection: the client's write of
            // the rest fails (a broken pipe). Asked again with one line,
            // it says why.
            Err(e) => {
                eprintln!("push {n}: {e}; pushing one line");
                push(b"\"one line\"\n").unwrap()
            }
        };
        if status != 200 {
            refused = Some((n, status, body));
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (n, status, body) = refused.expect("the quota never refused a push");
    assert_eq!(
        (status, code(&body).as_str()),
        (507, "quota_exceeded"),
        "{body}"
    );
    let usage: serde_json::Value = serde_json::from_str(&get(&server, "/usage", &token).1).unwrap();
    let used = usage["disk_used_bytes"].as_u64().unwrap();
    eprintln!(
        "disk quota: push {n} refused at {used} bytes used (quota {})",
        8 << 20
    );
    assert!(used >= 8 << 20, "refused at {used} bytes, under the quota");
    assert!(
        used < 24 << 20,
        "{used} bytes used after {n} pushes: the quota let far too much in"
    );

    // Versions: deleting the only pipeline running a version deletes it.
    let versions = data.join("tenants/hoarder/components/versions");
    assert_eq!(std::fs::read_dir(&versions).unwrap().count(), 1);
    client.delete("wc").unwrap();
    assert_eq!(std::fs::read_dir(&versions).unwrap().count(), 0);
    // Deleting data frees the quota.
    let usage: serde_json::Value = serde_json::from_str(&get(&server, "/usage", &token).1).unwrap();
    assert!(
        usage["disk_used_bytes"].as_u64().unwrap() < 4 << 20,
        "{usage}"
    );
}

/// Item 8: a tenant spamming pipeline control (each a durable registry
/// write) does not slow another tenant's requests past the bound.
#[test]
fn control_spam_does_not_hold_up_other_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let victim = Victim::start(&server);
    let token = tenant_running_wordcount(
        &server,
        "spammer",
        serde_json::json!({}),
        serde_json::json!({}),
    );
    let until = Instant::now() + Duration::from_secs(3);
    let spam: Vec<_> = (0..4)
        .map(|i| {
            let (url, token) = (server.url.clone(), token.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while Instant::now() < until {
                    let action = ["pause", "start", "stop", "start"][(n + i) % 4];
                    let (status, body) = raw(
                        "POST",
                        &format!("{url}/pipelines/wc/{action}"),
                        Some(&token),
                        "",
                        b"",
                    );
                    assert_eq!(status, 200, "{action}: {body}");
                    n += 1;
                }
                n
            })
        })
        .collect();
    let sent: usize = spam.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(sent > 20, "only {sent} control requests went through");
    victim.assert_served("control spam");
}

/// Item 3: a compile that outlasts the server's compile timeout answers
/// 422; it still finishes on the pool (holding its place, so the tenant's
/// next upload waits for it) and is cached once it passed the world check.
#[test]
fn a_compile_past_the_timeout_is_refused_and_its_work_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with_cache(
        &dir.path().join("data"),
        &["--compile-timeout-ms=100".into()],
        &dir.path().join("cache"),
    );
    let token = tenant_with(&server, "slow", serde_json::json!({}));
    let wasm = std::fs::read(wordcount()).unwrap();
    let (status, body) = server.upload(&token, "wc", &wasm);
    assert_eq!(
        (status, code(&body).as_str()),
        (422, "invalid_component"),
        "{body}"
    );
    assert!(body.contains("compile timeout"), "{body}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = server.upload(&token, "wc", &wasm);
        if status == 201 {
            break;
        }
        assert!(body.contains("compile timeout"), "{body}");
        assert!(
            Instant::now() < deadline,
            "the compile never landed in the cache"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let cached = std::fs::read_dir(dir.path().join("cache/components"))
        .unwrap()
        .count();
    assert_eq!(cached, 1, "one compiled component, cached after its check");
}
