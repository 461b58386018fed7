//! `sluice serve` itself: [`serve`] builds the engine, the metrics
//! recorder and the [`Service`], recovers the pipelines, and serves the
//! router until Ctrl-C or SIGTERM (HTTP/1.1 with a header timeout and a
//! connection cap), then checkpoints every running pipeline.

use crate::limits::ServerLimits;
use crate::routes::{AppState, router};
use crate::service::Service;
use crate::settings::KafkaSettings;
use sluice_runtime::{Limits, SluiceEngine};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The data directory (registry, components, pipelines).
    pub data: PathBuf,
    /// Where to listen.
    pub listen: SocketAddr,
    /// The admin token.
    pub admin_token: String,
    /// Size the pooling allocator for this many instances (0: allocate on
    /// demand).
    pub pool: u32,
    /// Kafka brokers for pipelines created with `"log": "kafka"`.
    pub kafka: Option<KafkaSettings>,
    /// Timeouts, connection and concurrency bounds, the memory budget.
    pub limits: ServerLimits,
}

/// Runs the server until Ctrl-C / SIGTERM, then checkpoints every running
/// pipeline and returns.
pub async fn serve(opts: ServeOptions) -> anyhow::Result<()> {
    sluice_runtime::memory::configure();
    let admin_token = opts.admin_token.trim();
    if admin_token.len() < 16 {
        anyhow::bail!("the admin token must be at least 16 characters");
    }
    let engine = Arc::new(if opts.pool > 0 {
        SluiceEngine::with_pooling(
            Limits::default(),
            SluiceEngine::default_cache_dir(),
            opts.pool,
        )?
    } else {
        SluiceEngine::new(Limits::default(), SluiceEngine::default_cache_dir())?
    });
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&[
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ])?
        .build_recorder();
    let metrics = recorder.handle();
    if metrics::set_global_recorder(recorder).is_err() {
        tracing::warn!("a metrics recorder was already installed; /metrics will be empty");
    }
    let service = Arc::new(Service::new(
        opts.data.clone(),
        admin_token,
        engine,
        opts.kafka.clone(),
        opts.limits,
    )?);
    service.recover().await;

    let app = router(Arc::new(AppState::new(service.clone(), metrics)));
    let listener = tokio::net::TcpListener::bind(opts.listen).await?;
    let addr = listener.local_addr()?;
    // Tests and scripts read this line to learn the port.
    println!("sluice: listening on http://{addr}");
    tracing::info!("listening on http://{addr}");
    let housekeeping = tokio::spawn({
        let service = service.clone();
        async move {
            let mut every = tokio::time::interval(std::time::Duration::from_secs(3600));
            every.tick().await;
            loop {
                every.tick().await;
                let service = service.clone();
                let _ = tokio::task::spawn_blocking(move || service.collect_garbage()).await;
            }
        }
    });
    // Each pipeline across hosts runs the component its hosts moved it to
    // (an upgrade another server asked for): the registry follows.
    let follow = tokio::spawn({
        let service = service.clone();
        async move {
            let mut every = tokio::time::interval(crate::service::FOLLOW_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                service.follow_components().await;
            }
        }
    });
    // What pipelines freed goes back to the kernel within seconds, not at
    // the allocator's leisure (see `memory`).
    let give_back = tokio::spawn(async {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            every.tick().await;
            let _ =
                tokio::task::spawn_blocking(|| sluice_runtime::memory::give_back_over(16 << 20))
                    .await;
        }
    });
    accept(listener, app, &opts.limits, shutdown_signal()).await;
    housekeeping.abort();
    follow.abort();
    give_back.abort();
    service.shutdown().await;
    Ok(())
}

/// Serves connections until `shutdown` resolves, then lets the open ones
/// finish (for up to ten seconds).
///
/// Each connection is HTTP/1.1 (hyper) with a header-read timeout — which
/// also closes a keep-alive connection left idle that long — and at most
/// `max_connections` are served at once: past it, new clients wait in the
/// listen backlog, and no file descriptor is spent on them.
async fn accept(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: &ServerLimits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let connections = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = connections.clone().acquire_owned() => p.expect("never closed"),
            () = &mut shutdown => break,
        };
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors, or the peer left: pause
                    // instead of spinning.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            let _ = connection.await;
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(std::time::Duration::from_secs(10), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("some connections were still open after ten seconds; closing them");
    }
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} },
        Err(e) => {
            tracing::warn!("no SIGTERM handler ({e}); stop the server with Ctrl-C");
            let _ = ctrl_c.await;
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
