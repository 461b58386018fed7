//! Commands against a `sluice serve`: the client side of the HTTP API.

use crate::cli::{Connection, TenantCommand};
use std::path::PathBuf;

/// Runs a blocking client call off the async workers.
async fn call<T: Send + 'static>(
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f).await?
}

/// `sluice tenant …`.
pub async fn tenant(conn: Connection, what: TenantCommand) -> anyhow::Result<()> {
    let c = conn.client();
    match what {
        TenantCommand::Create { name } => {
            println!("{}", call(move || c.create_tenant(&name)).await?)
        }
        TenantCommand::Rotate { name } => {
            println!("{}", call(move || c.rotate_token(&name)).await?)
        }
        TenantCommand::Delete { name } => {
            let shown = name.clone();
            call(move || c.delete_tenant(&name)).await?;
            println!("deleted tenant {shown} and its data");
        }
        TenantCommand::List => println!("{}", call(move || c.tenants()).await?),
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
    println!("{out}");
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
    println!("{}", call(move || c.status(pipeline.as_deref())).await?);
    Ok(())
}

/// `sluice scale`.
pub async fn scale(conn: Connection, pipeline: String, workers: u32) -> anyhow::Result<()> {
    let c = conn.client();
    println!("{}", call(move || c.scale(&pipeline, workers)).await?);
    Ok(())
}

/// `sluice start`, `pause`, `stop`.
pub async fn control(
    conn: Connection,
    pipeline: String,
    action: &'static str,
) -> anyhow::Result<()> {
    let c = conn.client();
    println!("{}", call(move || c.control(&pipeline, action)).await?);
    Ok(())
}

/// `sluice delete`.
pub async fn delete(conn: Connection, pipeline: String) -> anyhow::Result<()> {
    let c = conn.client();
    call(move || c.delete(&pipeline)).await
}
