//! A `sluice serve` child process for the server tests.

use super::sluice_cmd;
use sluice::client::Client;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

/// The admin token the test servers run with.
pub const ADMIN: &str = "test-admin-token-0123456789";

/// A running `sluice serve`.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The server's data directory.
    pub data: PathBuf,
}

impl Server {
    /// Starts `sluice serve` on `data` with `extra` arguments.
    pub fn start_with(data: &Path, extra: &[String]) -> Server {
        let mut child = sluice_cmd()
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
            child,
            url,
            data: data.to_owned(),
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

    /// SIGKILLs the server.
    pub fn kill(&mut self) {
        self.child.kill().unwrap(); // SIGKILL
        self.child.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
            let mut r = if m == "PUT" {
                agent.put(url)
            } else {
                agent.post(url)
            }
            .header("Content-Type", content_type);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.send(body)
        }
    };
    let mut response = response.unwrap();
    let status = response.status().as_u16();
    let text = response
        .body_mut()
        .with_config()
        .limit(1 << 30)
        .read_to_string()
        .unwrap_or_default();
    (status, text)
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
