//! `sluice upgrade --group`: an upgrade of a pipeline that a group of
//! `sluice host` processes runs, made by its leader.

use super::progress::bar;
use anyhow::{Context, bail};
use sluice_cluster::{Membership, UpgradeAnswer};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

/// What `sluice upgrade --group` asks.
pub struct GroupUpgrade {
    /// The new version's component file.
    pub component: PathBuf,
    /// The group's etcd endpoints.
    pub etcd: Vec<String>,
    /// The group (the pipeline's name).
    pub group: String,
    /// The pipeline's checkpoint store, where the hosts fetch the new
    /// version.
    pub store: String,
    /// Operators of the new version to start empty.
    pub start_empty: Vec<String>,
    /// Refused: a rebuild across hosts is not made.
    pub rebuild: bool,
    /// How long to wait for the leader's answer.
    pub wait: Duration,
}

/// Publishes the new version in the pipeline's store, asks the group's
/// leader to upgrade to it, and waits for the answer: the leader
/// checkpoints the pipeline's last step, makes the upgrade and runs the
/// new version across the hosts (each fetches it from the store).
pub async fn upgrade_group(a: GroupUpgrade) -> anyhow::Result<()> {
    if a.rebuild {
        bail!(
            "--rebuild is not made across hosts: stop the hosts and upgrade one host's data \
             directory (`sluice upgrade NEW --data DIR --rebuild`)"
        );
    }
    let bytes = std::fs::read(&a.component)
        .with_context(|| format!("reading {}", a.component.display()))?;
    let store = a.store.clone();
    let to = tokio::task::spawn_blocking(move || {
        sluice_pipeline::hosts::publish_component(&store, &bytes)
    })
    .await??;
    let short = sluice_embedded::meta::short_hash(&to).to_owned();
    eprintln!("published component {short} in {}", a.store);
    let group = sluice_cluster::EtcdMembership::connect(&a.etcd, &a.group, Duration::from_secs(10))
        .await
        .context("reaching the group in etcd")?;
    if group.view().await?.members.is_empty() {
        bail!(
            "no host of group {:?} is running: start them (or upgrade a stopped group's data \
             directory with --data)",
            a.group
        );
    }
    let waiting = bar(
        std::io::stderr().is_terminal(),
        "{spinner} {msg} ({elapsed})",
    );
    waiting.set_message(format!(
        "asking the group's leader to upgrade to {short}: waiting for its answer"
    ));
    waiting.enable_steady_tick(Duration::from_millis(120));
    let asked = async {
        let id = sluice_pipeline::hosts::ask_group(&group, &to, a.start_empty.clone()).await?;
        sluice_pipeline::hosts::group_answer(&group, &id, a.wait).await
    };
    let asked = asked.await.context("asking the group's leader");
    waiting.finish_and_clear();
    let Some(answer) = asked? else {
        bail!(
            "no answer from the group's leader within {:?}: the request stays pending (the \
             leader, or the next one, makes it; asking again is refused meanwhile)",
            a.wait
        );
    };
    match answer {
        UpgradeAnswer::Upgraded(said) => {
            eprintln!("upgraded: {said}");
            Ok(())
        }
        UpgradeAnswer::Refused(why) => bail!("upgrade refused: {why}"),
    }
}
