//! What each `sluice` command does, one module per kind of command.

/// Commands against a `sluice serve`: the client side of its HTTP API.
mod api;
/// `sluice upgrade --group`: the upgrade of a group of hosts.
mod group;
/// Commands on this machine's pipelines: `run`, `host`, `upgrade`, `verify`, `read`,
/// `serve`.
mod local;
/// Progress on the terminal.
mod progress;
/// The tool commands: `build`, `chaos`, `bench`, `gen`, `demo`.
mod tools;

use crate::cli::{Cli, Command, GenCommand};
use std::time::Duration;

/// Runs a parsed command line.
pub async fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => local::run(args).await,
        Command::Host(args) => local::host(args).await,
        Command::Verify {
            data,
            brokers,
            store,
        } => local::verify(data, brokers, store).await,
        Command::Read {
            data,
            output,
            after,
            limit,
            brokers,
        } => local::read(data, output, after, limit, brokers).await,
        Command::Serve {
            data,
            listen,
            admin_token_file,
            pool,
            kafka_brokers,
            kafka_replication,
            hosts,
            limits,
        } => {
            local::serve(
                data,
                listen,
                admin_token_file,
                pool,
                kafka_brokers,
                kafka_replication,
                hosts,
                limits.limits(),
            )
            .await
        }
        Command::Tenant { what, conn } => api::tenant(conn, what).await,
        Command::Deploy {
            component,
            pipeline,
            name,
            workers,
            conn,
        } => api::deploy(conn, component, pipeline, name, workers).await,
        Command::Push {
            pipeline,
            port,
            file,
            chunk_lines,
            restart,
            conn,
        } => {
            let opts = crate::client::PushOptions {
                chunk_lines,
                restart,
                progress: true,
            };
            api::push(conn, pipeline, port, file, opts).await
        }
        Command::Tail {
            pipeline,
            port,
            after,
            follow,
            conn,
        } => api::tail(conn, pipeline, port, after, follow).await,
        Command::Status { pipeline, conn } => api::status(conn, pipeline).await,
        Command::Pipelines { conn } => api::status(conn, None).await,
        Command::Components { conn } => api::components(conn).await,
        Command::Diff {
            old,
            new,
            start_empty,
            rebuild,
            server,
            token,
            json,
        } => api::diff(old, new, start_empty, rebuild, server, token, json).await,
        Command::Upgrade(a) => match (a.data, a.group) {
            (Some(data), _) => {
                local::upgrade(
                    a.component,
                    data,
                    a.store,
                    a.brokers,
                    a.start_empty,
                    a.rebuild,
                )
                .await
            }
            (None, Some(group)) => {
                let request = group::GroupUpgrade {
                    component: a.component,
                    etcd: a.etcd,
                    group,
                    store: a.store.unwrap_or_default(),
                    start_empty: a.start_empty,
                    rebuild: a.rebuild,
                    wait: Duration::from_secs(a.wait_secs),
                };
                group::upgrade_group(request).await
            }
            (None, None) => {
                let pipeline = a.pipeline;
                let (server, token) = (a.server, a.token);
                api::upgrade(
                    a.component,
                    pipeline,
                    a.as_name,
                    a.start_empty,
                    a.rebuild,
                    server,
                    token,
                )
                .await
            }
        },
        Command::Scale {
            pipeline,
            workers,
            conn,
        } => api::scale(conn, pipeline, workers).await,
        Command::Start { pipeline, conn } => api::control(conn, pipeline, "start").await,
        Command::Pause { pipeline, conn } => api::control(conn, pipeline, "pause").await,
        Command::Stop { pipeline, conn } => api::control(conn, pipeline, "stop").await,
        Command::Delete { pipeline, conn } => api::delete(conn, pipeline).await,
        Command::Build { path, target_dir } => tools::build(path, target_dir).await,
        Command::Chaos {
            trials,
            seed,
            component,
            noisy_component,
            wordcount,
            workers,
            rescale,
            orders,
            hosts,
            network,
            replicas,
        } => {
            if hosts || network || replicas > 1 {
                return tools::chaos_hosts(trials, seed, component, network, replicas).await;
            }
            let workers = tools::Workers { workers, rescale };
            let circuits = tools::ChaosCircuits {
                component,
                noisy: noisy_component,
                wordcount,
            };
            tools::chaos(trials, seed, circuits, workers, orders).await
        }
        Command::Bench {
            quick,
            markdown,
            chart,
            step_log,
            brokers,
            mut only,
            scenarios,
        } => match step_log {
            true => tools::bench_step_log(brokers, quick).await,
            false => {
                only.extend(scenarios);
                tools::bench(quick, markdown, chart, only).await
            }
        },
        Command::Gen {
            what: GenCommand::Nexmark { events, rate, out },
        } => tools::gen_nexmark(events, rate, out).await,
        Command::Demo {
            workers,
            repeat,
            data,
            save_counts,
            top,
        } => tools::demo(workers, repeat, data, save_counts, top).await,
    }
}
