//! Commands against a `sluice serve`: the client side of the HTTP API.

use crate::cli::{Connection, TenantCommand};
use anyhow::Context;
use std::path::PathBuf;

/// Runs a blocking client call off the async workers.
async fn call<T: Send + 'static>(
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f).await?
}

/// Prints the server's answer: as JSON with `--json`, else as `human`
/// makes it.
fn show(conn: &Connection, answer: &str, human: impl FnOnce(&serde_json::Value) -> String) {
    if conn.wants_json() {
        println!("{answer}");
        return;
    }
    match serde_json::from_str::<serde_json::Value>(answer) {
        Ok(v) => println!("{}", human(&v)),
        Err(_) => println!("{answer}"),
    }
}

/// `sluice tenant …`.
pub async fn tenant(conn: Connection, what: TenantCommand) -> anyhow::Result<()> {
    let c = conn.client();
    match what {
        TenantCommand::Create { name } => {
            let out = call(move || c.create_tenant(&name)).await?;
            show(&conn, &out, |v| crate::human::tenant_token(v, "created"));
        }
        TenantCommand::Rotate { name } => {
            let out = call(move || c.rotate_token(&name)).await?;
            show(&conn, &out, |v| {
                crate::human::tenant_token(v, "new token for")
            });
        }
        TenantCommand::Delete { name } => {
            let shown = name.clone();
            call(move || c.delete_tenant(&name)).await?;
            println!("deleted tenant {shown} and its data");
        }
        TenantCommand::List => {
            let out = call(move || c.tenants()).await?;
            show(&conn, &out, crate::human::host);
        }
    }
    Ok(())
}

/// `sluice components`.
pub async fn components(conn: Connection) -> anyhow::Result<()> {
    let c = conn.client();
    let out = call(move || c.components()).await?;
    show(&conn, &out, crate::human::components);
    Ok(())
}

/// `sluice diff`: OLD a component file, compared here, or a pipeline on
/// a server, compared there.
pub async fn diff(
    old: String,
    new: PathBuf,
    start_empty: Vec<String>,
    rebuild: bool,
    server: String,
    token: Option<String>,
    json: bool,
) -> anyhow::Result<()> {
    let local = old.ends_with(".wasm") || std::path::Path::new(&old).is_file();
    let diff = if std::path::Path::new(&old).join("db").is_dir() {
        let engine = sluice_runtime::SluiceEngine::new(
            sluice_runtime::Limits::default(),
            sluice_runtime::SluiceEngine::default_cache_dir(),
        )?;
        let new_ports = engine.describe(&engine.load_file(&new)?).await?;
        let dir = std::path::PathBuf::from(&old);
        let old_ports =
            tokio::task::spawn_blocking(move || super::local::stored_ports(&dir)).await??;
        sluice_core::CircuitDiff::between(&old_ports, &new_ports, &start_empty)
            .map_err(anyhow::Error::msg)?
    } else if local {
        let engine = sluice_runtime::SluiceEngine::new(
            sluice_runtime::Limits::default(),
            sluice_runtime::SluiceEngine::default_cache_dir(),
        )?;
        let mut ports = Vec::new();
        for path in [std::path::Path::new(&old), new.as_path()] {
            let component = engine.load_file(path)?;
            ports.push(engine.describe(&component).await?);
        }
        sluice_core::CircuitDiff::between(&ports[0], &ports[1], &start_empty)
            .map_err(anyhow::Error::msg)?
    } else {
        let Some(token) = token else {
            anyhow::bail!(
                "`{old}` is no component file, so it names a pipeline on {server}: \
                 give the API token (--token or SLUICE_TOKEN)"
            );
        };
        let c = crate::client::Client::new(&server, &token);
        let out = call(move || c.diff(&old, &new, &start_empty)).await?;
        serde_json::from_str(&out)
            .map_err(|e| anyhow::anyhow!("the server's diff is unreadable ({e}): {out}"))?
    };
    let diff: sluice_core::CircuitDiff = match rebuild {
        true => diff.rebuilding(),
        false => diff,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&diff)?);
    } else {
        println!("{diff}");
    }
    // As diff(1): an error exits 1 (through main), a refusal 2.
    if !diff.accepted {
        std::process::exit(2);
    }
    Ok(())
}

/// `sluice deploy`.
pub async fn deploy(
    conn: Connection,
    component: PathBuf,
    pipeline: String,
    name: Option<String>,
    workers: u32,
) -> anyhow::Result<()> {
    let c = conn.client();
    let name = name.unwrap_or_else(|| pipeline.clone());
    let out = call(move || c.deploy(&component, &name, &pipeline, workers, true)).await?;
    show(&conn, &out, crate::human::deployed);
    Ok(())
}

/// `sluice push`.
pub async fn push(
    conn: Connection,
    pipeline: String,
    port: String,
    file: PathBuf,
    opts: crate::client::PushOptions,
) -> anyhow::Result<()> {
    let c = conn.client();
    let report = call(move || c.push(&pipeline, &port, &file, &opts)).await?;
    if report.resumed_after_lines > 0 {
        eprintln!(
            "resumed after the {} lines an earlier run pushed",
            report.resumed_after_lines
        );
    }
    eprintln!(
        "appended {} events in {} pushes",
        report.appended, report.pushes
    );
    Ok(())
}

/// `sluice tail`.
pub async fn tail(
    conn: Connection,
    pipeline: String,
    port: String,
    after: Option<String>,
    follow: bool,
) -> anyhow::Result<()> {
    let c = conn.client();
    call(move || c.tail(&pipeline, &port, after, follow)).await
}

/// `sluice status`.
pub async fn status(conn: Connection, pipeline: Option<String>) -> anyhow::Result<()> {
    let c = conn.client();
    let one = pipeline.is_some();
    let out = call(move || c.status(pipeline.as_deref())).await?;
    show(&conn, &out, |v| {
        if one {
            crate::human::pipeline(v)
        } else {
            crate::human::pipelines(v)
        }
    });
    Ok(())
}

/// `sluice scale`.
pub async fn scale(conn: Connection, pipeline: String, workers: u32) -> anyhow::Result<()> {
    let c = conn.client();
    let out = call(move || c.scale(&pipeline, workers)).await?;
    show(&conn, &out, |p| {
        format!(
            "{}: changing to {workers} workers (now {}); `sluice status {}` shows when it is done",
            p["name"].as_str().unwrap_or("?"),
            p["workers"],
            p["name"].as_str().unwrap_or("?"),
        )
    });
    Ok(())
}

/// `sluice upgrade --pipeline`.
pub async fn upgrade(
    wasm: PathBuf,
    pipeline: Option<String>,
    as_name: Option<String>,
    start_empty: Vec<String>,
    rebuild: bool,
    server: String,
    token: Option<String>,
) -> anyhow::Result<()> {
    let pipeline = pipeline.context("give the pipeline: --data DIR, or --pipeline NAME")?;
    let token = token.context(
        "--pipeline names a pipeline on a server: give the API token (--token or SLUICE_TOKEN)",
    )?;
    let name = match as_name {
        Some(n) => n,
        None => wasm
            .file_stem()
            .and_then(|s| s.to_str())
            .map(str::to_owned)
            .context("the component file has no name: give one with --as")?,
    };
    let c = crate::client::Client::new(&server, &token);
    let (p, n) = (pipeline.clone(), name.clone());
    let out = call(move || c.upgrade(&p, &wasm, &n, &start_empty, rebuild)).await?;
    let status: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    eprintln!(
        "upgraded: pipeline {pipeline} runs component {name} now; it is {}",
        status["state"].as_str().unwrap_or("?")
    );
    Ok(())
}

/// `sluice start`, `pause`, `stop`.
pub async fn control(
    conn: Connection,
    pipeline: String,
    action: &'static str,
) -> anyhow::Result<()> {
    let c = conn.client();
    let out = call(move || c.control(&pipeline, action)).await?;
    show(&conn, &out, |p| {
        format!(
            "{}: {action} asked; it is {}",
            p["name"].as_str().unwrap_or("?"),
            p["state"].as_str().unwrap_or("?")
        )
    });
    Ok(())
}

/// `sluice delete`.
pub async fn delete(conn: Connection, pipeline: String) -> anyhow::Result<()> {
    let c = conn.client();
    let shown = pipeline.clone();
    call(move || c.delete(&pipeline)).await?;
    if !conn.wants_json() {
        println!("deleted {shown} and its data");
    }
    Ok(())
}
