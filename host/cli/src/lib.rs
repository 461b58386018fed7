//! # sluice: the command line
//!
//! The `sluice` binary is a thin layer over the host's crates: its
//! arguments ([`cli`]), what each command does ([`commands`]) and the
//! client of `sluice serve` ([`client`]). The host itself is
//! `sluice-core`, `sluice-storage`, `sluice-embedded`, `sluice-kafka`,
//! `sluice-runtime`, `sluice-pipeline`, `sluice-server` and `sluice-tools`
//! (see `docs/architecture.md`).
//!
//! ```no_run
//! use clap::Parser;
//! # async fn demo() -> anyhow::Result<()> {
//! let cli = sluice::cli::Cli::parse_from(["sluice", "verify", "--data", "/tmp/wc"]);
//! sluice::commands::dispatch(cli).await
//! # }
//! ```

pub mod cli;
pub mod client;
pub mod commands;
pub mod human;
mod parse;
pub mod upgrade_args;
