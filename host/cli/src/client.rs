//! The CLI client of `sluice serve`: `sluice deploy`, `push`, `tail`,
//! `status`, `start`, `pause`, `stop`, `delete` and `tenant create`, against
//! a server URL and token (flags or `SLUICE_SERVER` / `SLUICE_TOKEN`).

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Duration;

/// A connection to a server, as one caller.
pub struct Client {
    agent: ureq::Agent,
    server: String,
    token: String,
}

/// Lines per push request of `sluice push`.
pub const PUSH_CHUNK: usize = 5_000;

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

impl Client {
    /// A client of `server` (e.g. `http://127.0.0.1:7878`) with `token`.
    pub fn new(server: &str, token: &str) -> Self {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(300)))
            .build()
            .into();
        Client {
            agent,
            server: server.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
        }
    }

    /// The token this client sends.
    pub fn token(&self) -> &str {
        &self.token
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server)
    }

    /// Sends a request and returns the body of a 2xx answer, or the
    /// server's error message.
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, &[u8])>,
        headers: &[(&str, String)],
    ) -> anyhow::Result<String> {
        let auth = format!("Bearer {}", self.token);
        let url = self.url(path);
        let result = match (method, body) {
            ("GET", _) => {
                let mut r = self.agent.get(&url).header("Authorization", &auth);
                for (k, v) in headers {
                    r = r.header(*k, v);
                }
                r.call()
            }
            ("DELETE", _) => self
                .agent
                .delete(&url)
                .header("Authorization", &auth)
                .call(),
            (m, b) => {
                let (content_type, bytes) = b.unwrap_or(("application/json", b""));
                let mut r = if m == "PUT" {
                    self.agent.put(&url)
                } else {
                    self.agent.post(&url)
                }
                .header("Authorization", &auth)
                .header("Content-Type", content_type);
                for (k, v) in headers {
                    r = r.header(*k, v);
                }
                r.send(bytes)
            }
        };
        let mut response = result.with_context(|| format!("{method} {url}"))?;
        let status = response.status();
        let text = response
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_string()
            .with_context(|| format!("reading the answer to {method} {url}"))?;
        if !status.is_success() {
            let message = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| {
                    Some(format!(
                        "{} ({})",
                        v["error"]["message"].as_str()?,
                        v["error"]["code"].as_str()?
                    ))
                })
                .unwrap_or(text);
            bail!("{method} {path}: {status}: {message}");
        }
        Ok(text)
    }

    /// `POST /tenants` (admin token): prints the new tenant's token.
    pub fn create_tenant(&self, name: &str) -> anyhow::Result<String> {
        let body = serde_json::json!({ "name": name }).to_string();
        self.call(
            "POST",
            "/tenants",
            Some(("application/json", body.as_bytes())),
            &[],
        )
    }

    /// Uploads a component and creates (and starts) a pipeline running it.
    pub fn deploy(
        &self,
        wasm: &Path,
        component: &str,
        pipeline: &str,
        workers: u32,
        progress: bool,
    ) -> anyhow::Result<String> {
        let bytes = std::fs::read(wasm).with_context(|| wasm.display().to_string())?;
        let bar = if progress {
            let b = ProgressBar::new_spinner();
            b.set_style(style("{spinner} {msg}"));
            b.set_message(format!(
                "uploading {} ({} KiB) and validating it",
                wasm.display(),
                bytes.len() / 1024
            ));
            b.enable_steady_tick(Duration::from_millis(100));
            b
        } else {
            ProgressBar::hidden()
        };
        self.call(
            "PUT",
            &format!("/components/{component}"),
            Some(("application/wasm", &bytes)),
            &[],
        )?;
        bar.set_message(format!("creating pipeline {pipeline}"));
        let spec =
            serde_json::json!({ "name": pipeline, "component": component, "workers": workers });
        let out = self.call(
            "POST",
            "/pipelines",
            Some(("application/json", spec.to_string().as_bytes())),
            &[],
        );
        bar.finish_and_clear();
        out
    }

    /// Pushes a JSON-lines file in chunks, each with a producer id and
    /// sequence number so a retried chunk is appended once. Returns the
    /// events appended.
    pub fn push(
        &self,
        pipeline: &str,
        port: &str,
        file: &Path,
        progress: bool,
    ) -> anyhow::Result<u64> {
        let f = std::fs::File::open(file).with_context(|| file.display().to_string())?;
        let total = f.metadata().map(|m| m.len()).unwrap_or(0);
        let bar = if progress {
            let b = ProgressBar::new(total);
            b.set_style(style("pushing {msg} {wide_bar} {bytes}/{total_bytes}"));
            b.set_message(file.display().to_string());
            b
        } else {
            ProgressBar::hidden()
        };
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce).map_err(|e| anyhow::anyhow!("randomness: {e}"))?;
        let producer = format!("push-{}", hex::encode(nonce));
        let mut appended = 0;
        let mut chunk = String::new();
        let (mut lines, mut seq) = (0, 0u64);
        let mut reader = std::io::BufReader::new(f);
        let path = format!("/pipelines/{pipeline}/input/{port}");
        let mut line = String::new();
        loop {
            line.clear();
            let n = reader.read_line(&mut line)?;
            if n > 0 {
                chunk.push_str(&line);
                if !line.ends_with('\n') {
                    chunk.push('\n');
                }
                lines += 1;
                bar.inc(n as u64);
            }
            if (n == 0 && !chunk.is_empty()) || lines == PUSH_CHUNK {
                seq += 1;
                let headers = [
                    ("Sluice-Producer-Id", producer.clone()),
                    ("Sluice-Producer-Seq", seq.to_string()),
                ];
                // Retry transport errors: the sequence number makes it safe.
                let mut attempt = 0;
                let ack = loop {
                    match self.call(
                        "POST",
                        &path,
                        Some(("application/x-ndjson", chunk.as_bytes())),
                        &headers,
                    ) {
                        Ok(ack) => break ack,
                        Err(e) if attempt < 5 && e.downcast_ref::<ureq::Error>().is_some() => {
                            attempt += 1;
                            std::thread::sleep(Duration::from_millis(200 << attempt));
                        }
                        Err(e) => return Err(e),
                    }
                };
                let v: serde_json::Value = serde_json::from_str(&ack)?;
                appended += v["events"].as_u64().unwrap_or(0);
                chunk.clear();
                lines = 0;
            }
            if n == 0 {
                break;
            }
        }
        bar.finish_and_clear();
        Ok(appended)
    }

    /// Reads output after `after` (a position `S:W:I`), waiting up to
    /// `wait_ms` for some; returns the NDJSON lines.
    pub fn read(
        &self,
        pipeline: &str,
        port: &str,
        after: Option<&str>,
        wait_ms: u64,
    ) -> anyhow::Result<Vec<String>> {
        let mut path = format!("/pipelines/{pipeline}/output/{port}?wait_ms={wait_ms}");
        if let Some(a) = after {
            path.push_str(&format!("&after={a}"));
        }
        Ok(self
            .call("GET", &path, None, &[])?
            .lines()
            .map(str::to_owned)
            .collect())
    }

    /// Prints output lines after `after`; with `follow`, keeps
    /// long-polling for new output until interrupted.
    pub fn tail(
        &self,
        pipeline: &str,
        port: &str,
        after: Option<String>,
        follow: bool,
    ) -> anyhow::Result<()> {
        let mut after = after;
        let stdout = std::io::stdout();
        loop {
            let lines = self.read(
                pipeline,
                port,
                after.as_deref(),
                if follow { 10_000 } else { 0 },
            )?;
            let mut out = stdout.lock();
            for l in &lines {
                writeln!(out, "{l}")?;
            }
            out.flush()?;
            if let Some(last) = lines.last() {
                let v: serde_json::Value = serde_json::from_str(last)?;
                after = v["position"].as_str().map(str::to_owned);
            } else if !follow {
                return Ok(());
            }
        }
    }

    /// `GET /pipelines[/{name}]`.
    pub fn status(&self, pipeline: Option<&str>) -> anyhow::Result<String> {
        match pipeline {
            Some(p) => self.call("GET", &format!("/pipelines/{p}"), None, &[]),
            None => self.call("GET", "/pipelines", None, &[]),
        }
    }

    /// `POST /pipelines/{name}/{action}` (start, pause, stop).
    pub fn control(&self, pipeline: &str, action: &str) -> anyhow::Result<String> {
        self.call(
            "POST",
            &format!("/pipelines/{pipeline}/{action}"),
            None,
            &[],
        )
    }

    /// `DELETE /pipelines/{name}`.
    pub fn delete(&self, pipeline: &str) -> anyhow::Result<()> {
        self.call("DELETE", &format!("/pipelines/{pipeline}"), None, &[])
            .map(|_| ())
    }
}
