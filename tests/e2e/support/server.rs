//! A `sluice serve` child process for the server tests.

use super::sluice_cmd;
use sluice::client::Client;
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

/// The admin token the test servers run with.
pub const ADMIN: &str = "test-admin-token-0123456789";

/// A running `sluice serve`.
pub struct Server {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The server's data directory.
    pub data: PathBuf,
}

impl Server {
    /// Starts `sluice serve` on `data` with `extra` arguments.
    pub fn start_with(data: &Path, extra: &[String]) -> Server {
        Self::start_with_cache(data, extra, &super::cache_dir())
    }

    /// Like [`start_with`](Self::start_with), with its own cache of
    /// compiled components (so uploads compile from scratch).
    pub fn start_with_cache(data: &Path, extra: &[String], cache: &Path) -> Server {
        Self::spawn(data, extra, cache, &[])
    }

    /// Like [`start_with`](Self::start_with), with extra environment
    /// variables (e.g. `SLUICE_CRASH_AT`).
    pub fn start_with_env(data: &Path, extra: &[String], env: &[(&str, &str)]) -> Server {
        Self::spawn(data, extra, &super::cache_dir(), env)
    }

    fn spawn(data: &Path, extra: &[String], cache: &Path, env: &[(&str, &str)]) -> Server {
        let mut cmd = sluice_cmd();
        cmd.env_remove("SLUICE_CRASH_AT");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .env("SLUICE_CACHE_DIR", cache)
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .args(extra)
            .env("SLUICE_ADMIN_TOKEN", ADMIN)
            // Brokers only when a test passes --kafka-brokers.
            .env_remove("SLUICE_KAFKA_BROKERS")
            .env("SLUICE_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("sluice: listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Server {
            child: Some(child),
            url,
            data: data.to_owned(),
        }
    }

    /// A handle on a server another handle started (to use its URL from
    /// another thread); it does not stop the server.
    pub fn attach(url: &str) -> Server {
        Server {
            child: None,
            url: url.to_owned(),
            data: PathBuf::new(),
        }
    }

    /// Starts `sluice serve` on `data`.
    pub fn start(data: &Path) -> Server {
        Self::start_with(data, &[])
    }

    /// A client with the admin token.
    pub fn admin(&self) -> Client {
        Client::new(&self.url, ADMIN)
    }

    /// Creates a tenant and returns a client with its token.
    pub fn tenant(&self, name: &str) -> Client {
        let created = self.admin().create_tenant(name).unwrap();
        let v: serde_json::Value = serde_json::from_str(&created).unwrap();
        Client::new(&self.url, v["token"].as_str().unwrap())
    }

    /// `PUT /components/{name}` with `token`: `(status, body)`.
    pub fn upload(&self, token: &str, name: &str, wasm: &[u8]) -> (u16, String) {
        let url = format!("{}/components/{name}", self.url);
        raw("PUT", &url, Some(token), "application/wasm", wasm)
    }

    /// `POST /pipelines` with `token` and `spec`: `(status, body)`.
    pub fn create(&self, token: &str, spec: &serde_json::Value) -> (u16, String) {
        let url = format!("{}/pipelines", self.url);
        raw(
            "POST",
            &url,
            Some(token),
            "application/json",
            spec.to_string().as_bytes(),
        )
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("a started server").id()
    }

    /// A request sent whole over a fresh connection — for bodies the server
    /// refuses before reading them (an HTTP client library fails the
    /// request when the server answers while it still sends).
    pub fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        content_type: &str,
        body: &[u8],
    ) -> (u16, String) {
        let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: {content_type}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        exchange(self, &head, body)
    }

    /// Waits up to `timeout` for the server to exit by itself (a crash
    /// point); whether it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> bool {
        let child = self.child.as_mut().expect("a started server");
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// SIGKILLs the server.
    pub fn kill(&mut self) {
        let child = self.child.as_mut().expect("a started server");
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A raw request: `(status, body)`.
pub fn raw(
    method: &str,
    url: &str,
    token: Option<&str>,
    content_type: &str,
    body: &[u8],
) -> (u16, String) {
    raw_or_gone(method, url, token, content_type, body)
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

/// [`raw`], or the transport's error when the server went away before it
/// answered (a crash point it was armed with may strike first).
pub fn raw_or_gone(
    method: &str,
    url: &str,
    token: Option<&str>,
    content_type: &str,
    body: &[u8],
) -> Result<(u16, String), ureq::Error> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let auth = token.map(|t| format!("Bearer {t}"));
    let response = match method {
        "GET" => {
            let mut r = agent.get(url);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.call()
        }
        "DELETE" => {
            let mut r = agent.delete(url);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.call()
        }
        m => {
            let mut r = match m {
                "PUT" => agent.put(url),
                "PATCH" => agent.patch(url),
                _ => agent.post(url),
            }
            .header("Content-Type", content_type);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.send(body)
        }
    };
    let mut response = response?;
    let status = response.status().as_u16();
    let text = response
        .body_mut()
        .with_config()
        .limit(1 << 30)
        .read_to_string()
        .unwrap_or_default();
    Ok((status, text))
}

/// Sends a whole request (a server that answers early and closes makes the
/// write fail: that is fine) and reads the answer: `(status, body)`.
pub fn exchange(server: &Server, head: &str, body: &[u8]) -> (u16, String) {
    let (status, _, body) = exchange_full(server, head, body);
    (status, body)
}

/// Like [`exchange`], with the response's header block too:
/// `(status, headers, body)`.
pub fn exchange_full(server: &Server, head: &str, body: &[u8]) -> (u16, String, String) {
    let addr = server.url.strip_prefix("http://").unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s
        .write_all(head.as_bytes())
        .and_then(|()| s.write_all(body));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
        }
        let text = String::from_utf8_lossy(&answer);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_owned())
                })
                .and_then(|v| v.parse::<usize>().ok());
            if length.is_some_and(|n| body.len() >= n) {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.to_owned(), body.to_owned())
}

/// The error code of an error response.
pub fn code(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("error body is not JSON ({e}): {body:?}"));
    v["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("no error.code in {body}"))
        .to_owned()
}

/// The integrated output of a server pipeline's `counts` port (word count):
/// word → count, read through the API from the start.
pub fn integrated_counts(
    client: &Client,
    pipeline: &str,
) -> std::collections::BTreeMap<String, i64> {
    sluice_tools::demo::integrate_counts(&output_lines(client, pipeline, "counts")).unwrap()
}

/// A server pipeline's output `port` from the start, read through the API,
/// as the JSON lines `sluice run --output` writes (no positions).
pub fn output_lines(client: &Client, pipeline: &str, port: &str) -> String {
    let mut text = String::new();
    let mut after: Option<String> = None;
    loop {
        let lines = client.read(pipeline, port, after.as_deref(), 0).unwrap();
        let Some(last) = lines.last() else { break };
        let v: serde_json::Value = serde_json::from_str(last).unwrap();
        after = v["position"].as_str().map(str::to_owned);
        for l in &lines {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("position");
            text.push_str(&v.to_string());
            text.push('\n');
        }
    }
    text
}

/// A field of `/proc/PID/status` in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}
