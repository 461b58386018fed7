//! The CLI client of `sluice serve`: `sluice deploy`, `push`, `tail`,
//! `status`, `start`, `pause`, `stop`, `delete` and `tenant create`, against
//! a server URL and token (flags or `SLUICE_SERVER` / `SLUICE_TOKEN`).

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use std::io::{BufRead, Read, Seek, Write};
use std::path::Path;
use std::time::Duration;

/// A connection to a server, as one caller.
pub struct Client {
    agent: ureq::Agent,
    server: String,
    token: String,
}

/// Lines per push request of `sluice push`, by default.
pub const PUSH_CHUNK: usize = 5_000;

/// How `sluice push` sends a file.
#[derive(Debug, Clone)]
pub struct PushOptions {
    /// Lines per push request.
    pub chunk_lines: usize,
    /// Start a new producer session and send the whole file again.
    pub restart: bool,
    /// Show a progress bar.
    pub progress: bool,
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions {
            chunk_lines: PUSH_CHUNK,
            restart: false,
            progress: false,
        }
    }
}

/// What `sluice push` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushReport {
    /// Events acknowledged now.
    pub appended: u64,
    /// Push requests sent now.
    pub pushes: u64,
    /// Lines an earlier run had pushed (skipped now).
    pub resumed_after_lines: u64,
}

/// What the server keeps of a `sluice push` producer with its last push:
/// how much of the file was sent, and the SHA-256 of that part.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct PushMark {
    lines: u64,
    bytes: u64,
    prefix_sha256: String,
}

impl PushMark {
    /// Fails if the first `self.bytes` of `f` are not what was sent.
    fn check_prefix(&self, f: &mut std::fs::File, file: &Path) -> anyhow::Result<()> {
        let mut hasher = Sha256::new();
        let copied = std::io::copy(&mut f.take(self.bytes), &mut hasher)?;
        if copied != self.bytes || hex::encode(hasher.finalize()) != self.prefix_sha256 {
            bail!(
                "{} changed since its first {} lines were pushed; refusing to guess what is new \
                 (append to the file only, or push it again from the start with --restart)",
                file.display(),
                self.lines
            );
        }
        Ok(())
    }

    /// A hasher fed with the part already sent.
    fn hasher_after_prefix(&self, file: &Path) -> anyhow::Result<Sha256> {
        let mut hasher = Sha256::new();
        let mut f = std::fs::File::open(file)?;
        std::io::copy(&mut (&mut f).take(self.bytes), &mut hasher)?;
        Ok(hasher)
    }
}

/// The producer identity of `sluice push` of `file` to `port` of `pipeline`
/// on `server`: stable, so a re-run is the same producer and resumes.
fn push_producer_id(server: &str, pipeline: &str, port: &str, file: &Path) -> String {
    let mut h = Sha256::new();
    for part in [server, pipeline, port, &file.to_string_lossy()] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    format!("push-{}", &hex::encode(h.finalize())[..24])
}

/// What the server remembers of a producer (`GET …/producers/{id}`).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ProducerInfo {
    /// Its session.
    pub epoch: u64,
    /// The last sequence number acknowledged in it.
    pub last_seq: u64,
    /// The mark sent with that push.
    pub mark: Option<String>,
}

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
                let mut r = match m {
                    "PUT" => self.agent.put(&url),
                    "PATCH" => self.agent.patch(&url),
                    _ => self.agent.post(&url),
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

    /// Issues a new token for a tenant (admin); returns the server's
    /// answer (with the token).
    pub fn rotate_token(&self, name: &str) -> anyhow::Result<String> {
        self.call("POST", &format!("/tenants/{name}/token"), None, &[])
    }

    /// Deletes a tenant with all its data (admin).
    pub fn delete_tenant(&self, name: &str) -> anyhow::Result<()> {
        self.call("DELETE", &format!("/tenants/{name}"), None, &[])
            .map(|_| ())
    }

    /// The host's budgets and every tenant's usage (admin), as JSON.
    pub fn tenants(&self) -> anyhow::Result<String> {
        self.call("GET", "/tenants", None, &[])
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
        self.upload(component, &bytes)?;
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

    /// `GET …/input/{port}/producers/{id}`: what the pipeline remembers of
    /// a producer.
    pub fn producer(&self, pipeline: &str, port: &str, id: &str) -> anyhow::Result<ProducerInfo> {
        let answer = self.call(
            "GET",
            &format!("/pipelines/{pipeline}/input/{port}/producers/{id}"),
            None,
            &[],
        )?;
        serde_json::from_str(&answer).with_context(|| format!("the server answered {answer:?}"))
    }

    /// Pushes a JSON-lines file, durably and exactly once, even across a
    /// crash of this client: the file is sent in chunks of `opts.chunk_lines`
    /// complete lines, each a push of one producer whose identity is stable
    /// for (server, pipeline, port, file) with the next sequence number, and
    /// a mark (lines and bytes sent, SHA-256 of the bytes sent) that the
    /// server keeps with it. A re-run asks the server for the producer's
    /// mark and resumes after it, after checking that the part already sent
    /// has not changed; `opts.restart` starts a new session (epoch) that
    /// sends the whole file again. A last line without its newline is left
    /// for the next run (the file may still be being written).
    pub fn push(
        &self,
        pipeline: &str,
        port: &str,
        file: &Path,
        opts: &PushOptions,
    ) -> anyhow::Result<PushReport> {
        let canonical = file
            .canonicalize()
            .with_context(|| file.display().to_string())?;
        let mut f = std::fs::File::open(&canonical).with_context(|| file.display().to_string())?;
        let total = f.metadata().map(|m| m.len()).unwrap_or(0);
        let producer = push_producer_id(&self.server, pipeline, port, &canonical);
        let known = self.producer(pipeline, port, &producer)?;
        let (epoch, mut seq, mut mark) = match (&known.mark, opts.restart) {
            (Some(text), false) => {
                let mark: PushMark = serde_json::from_str(text)
                    .with_context(|| format!("the server's mark of producer {producer}"))?;
                mark.check_prefix(&mut f, file)?;
                (known.epoch, known.last_seq, mark)
            }
            (None, false) if known.last_seq > 0 => bail!(
                "producer {producer} pushed to `{port}` without a mark (not by sluice push?); \
                 push the file again from the start with --restart"
            ),
            (None, false) => (known.epoch, 0, PushMark::default()),
            (_, true) => (
                known.epoch + u64::from(known.last_seq > 0),
                0,
                PushMark::default(),
            ),
        };
        let mut report = PushReport {
            resumed_after_lines: mark.lines,
            ..PushReport::default()
        };
        let bar = if opts.progress {
            let b = ProgressBar::new(total);
            b.set_style(style("pushing {msg} {wide_bar} {bytes}/{total_bytes}"));
            b.set_message(file.display().to_string());
            b.set_position(mark.bytes);
            b
        } else {
            ProgressBar::hidden()
        };
        f.seek(std::io::SeekFrom::Start(mark.bytes))?;
        let mut hasher = mark.hasher_after_prefix(&canonical)?;
        let mut reader = std::io::BufReader::new(f);
        let path = format!("/pipelines/{pipeline}/input/{port}");
        let mut line = String::new();
        loop {
            let mut chunk = String::new();
            let mut lines = 0;
            while lines < opts.chunk_lines.max(1) {
                line.clear();
                let n = reader.read_line(&mut line)?;
                if n == 0 || !line.ends_with('\n') {
                    break; // the end, or a line still being written
                }
                chunk.push_str(&line);
                hasher.update(line.as_bytes());
                lines += 1;
            }
            if lines == 0 {
                break;
            }
            seq += 1;
            mark.lines += lines as u64;
            mark.bytes += chunk.len() as u64;
            mark.prefix_sha256 = hex::encode(hasher.clone().finalize());
            let headers = [
                ("Sluice-Producer-Id", producer.clone()),
                ("Sluice-Producer-Epoch", epoch.to_string()),
                ("Sluice-Producer-Seq", seq.to_string()),
                ("Sluice-Producer-Mark", serde_json::to_string(&mark)?),
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
                    Err(e) => {
                        bar.finish_and_clear();
                        let before = mark.lines - lines as u64;
                        bail!(
                            "{}\n{before} lines of {} are pushed and acknowledged ({} events \
                             appended by this run); the server refused lines {}-{}. Fix the file \
                             and run the same command again: it resumes after line {before}.",
                            in_file_lines(&format!("{e:#}"), before),
                            file.display(),
                            report.appended,
                            before + 1,
                            mark.lines,
                        );
                    }
                }
            };
            let v: serde_json::Value = serde_json::from_str(&ack)?;
            report.appended += v["events"].as_u64().unwrap_or(0);
            report.pushes += 1;
            bar.set_position(mark.bytes);
        }
        bar.finish_and_clear();
        Ok(report)
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

    /// `GET /components`: the caller's components, as JSON.
    pub fn components(&self) -> anyhow::Result<String> {
        self.call("GET", "/components", None, &[])
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

    /// `PATCH /pipelines/{name}`: changes a pipeline's number of workers (a
    /// layout change that moves only the shards the new balance needs);
    /// returns its status.
    pub fn scale(&self, pipeline: &str, workers: u32) -> anyhow::Result<String> {
        let body = serde_json::json!({ "workers": workers }).to_string();
        self.call(
            "PATCH",
            &format!("/pipelines/{pipeline}"),
            Some(("application/json", body.as_bytes())),
            &[],
        )
    }

    /// `POST /pipelines/{name}/diff` with the component file `wasm`.
    pub fn diff(
        &self,
        pipeline: &str,
        wasm: &Path,
        start_empty: &[String],
    ) -> anyhow::Result<String> {
        let bytes = std::fs::read(wasm).with_context(|| wasm.display().to_string())?;
        // Default identities hold `#` and `/`: the value is encoded.
        let query = if start_empty.is_empty() {
            String::new()
        } else {
            let value = start_empty.join(",");
            let value =
                percent_encoding::utf8_percent_encode(&value, percent_encoding::NON_ALPHANUMERIC);
            format!("?start_empty={value}")
        };
        self.call(
            "POST",
            &format!("/pipelines/{pipeline}/diff{query}"),
            Some(("application/wasm", &bytes)),
            &[],
        )
    }

    /// `PUT /components/{name}`: uploads (or replaces) a component.
    fn upload(&self, component: &str, bytes: &[u8]) -> anyhow::Result<String> {
        self.call(
            "PUT",
            &format!("/components/{component}"),
            Some(("application/wasm", bytes)),
            &[],
        )
    }

    /// Uploads the component file `wasm` as `component` and switches
    /// `pipeline` to it (`PATCH /pipelines/{name}` with `component`,
    /// `start_empty`); returns its status.
    pub fn upgrade(
        &self,
        pipeline: &str,
        wasm: &Path,
        component: &str,
        start_empty: &[String],
        rebuild: bool,
    ) -> anyhow::Result<String> {
        let bytes = std::fs::read(wasm).with_context(|| wasm.display().to_string())?;
        self.upload(component, &bytes)?;
        let body = serde_json::json!({
            "component": component,
            "start_empty": start_empty,
            "rebuild": rebuild,
        });
        self.call(
            "PATCH",
            &format!("/pipelines/{pipeline}"),
            Some(("application/json", body.to_string().as_bytes())),
            &[],
        )
    }

    /// `DELETE /pipelines/{name}`.
    pub fn delete(&self, pipeline: &str) -> anyhow::Result<()> {
        self.call("DELETE", &format!("/pipelines/{pipeline}"), None, &[])
            .map(|_| ())
    }
}

/// The server's error about a chunk, its `line N` made the file's line (the
/// chunk starts after line `before` of the file).
pub(crate) fn in_file_lines(message: &str, before: u64) -> String {
    let mut out = String::new();
    let mut rest = message;
    while let Some(i) = rest.find("line ") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 5..];
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        match digits.parse::<u64>() {
            Ok(n) => out.push_str(&format!("line {} of the file", before + n)),
            Err(_) => out.push_str("line "),
        }
        rest = &after[digits.len()..];
    }
    out.push_str(rest);
    out
}
