//! Changing the component of a pipeline that `sluice serve` servers run
//! across hosts (issue #31 on the server): asked of any of its servers,
//! made by its hosts' leader, followed by every server's registry.
#![cfg(feature = "kafka")]

use crate::kafka::fresh_name;
use crate::support::cluster::{Cluster, input, integrated, parts, produce_lines, server_host_args};
use crate::support::server::Server;
use crate::support::{component, sluice_cmd, stderr};
use crate::upgrade_hosts::{current_lengths, pairs_of};
use crate::upgrade_switch::recount_lengths;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Two servers run word count across hosts (version 1, uploaded to both).
/// The tenant upgrades it through the server that does not lead, with
/// `sluice upgrade --server`: a refused upgrade (`--start-empty` of no
/// operator) changes nothing; then version 2 — uploaded to that server
/// alone — is published in the hosts' store and made by the leader on the
/// other server, whose registry follows (it fetches the version from the
/// store). Input produced after the switch doubles the counts, and
/// `lengths` counts it from the switch. The leading server is killed and
/// started again: it loads version 2 from its registry at once, rejoins,
/// and input produced once more triples the counts.
#[test]
fn servers_running_a_pipeline_across_hosts_are_upgraded_from_any_of_them() {
    let Some((brokers, etcd)) = parts() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "a secret the servers share").unwrap();
    let store = format!("s3://sluice-tests/{}", fresh_name("upgrade-servers"));
    let tenant = fresh_name("t").replace('-', "");
    let start = |name: &str| {
        let args = server_host_args(name, &brokers, &etcd, &store, &secret, false);
        Server::start_with(&dir.path().join(name), &args)
    };
    let v1 = std::fs::read(component("examples/wordcount")).unwrap();
    let v2 = component("tests/guests/wordcount-v2");
    let v2_hash = sha256(&std::fs::read(&v2).unwrap());
    let spec = serde_json::json!({
        "name": "wc", "component": "wc", "workers": 2, "partitions": 4, "log": "kafka",
        "across_hosts": true, "max_batch": 50, "checkpoint_every_steps": 4,
    });
    let (mut servers, mut clients) = (Vec::new(), Vec::new());
    for name in ["a", "b"] {
        let server = start(name);
        let client = server.tenant(&tenant);
        let (s, body) = server.upload(client.token(), "wc", &v1);
        assert_eq!(s, 201, "{body}");
        let (s, body) = server.create(client.token(), &spec);
        assert_eq!(s, 201, "{body}");
        servers.push(server);
        clients.push(client);
    }
    let status = |client: &sluice::client::Client| -> serde_json::Value {
        serde_json::from_str(&client.status(Some("wc")).unwrap()).unwrap()
    };
    let wait = |what: &str, limit: Duration, done: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < limit, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let leads_both = |client: &sluice::client::Client| {
        let h = status(client)["hosts"].clone();
        h["leading"] == true && h["group"].as_array().is_some_and(|g| g.len() == 2)
    };
    wait(
        "one to lead on both servers",
        Duration::from_secs(60),
        &|| clients.iter().any(leads_both),
    );
    let (leader, other) = if leads_both(&clients[0]) {
        (0, 1)
    } else {
        (1, 0)
    };
    let kafka_name = format!("sl.{tenant}.wc");
    let topic = |port: &str| format!("{kafka_name}.{port}");
    let file = dir.path().join("lines.jsonl");
    let expected = input(&file, 2_000);
    produce_lines(&brokers, &topic("lines"), &file);
    let reader = Cluster::reader(dir.path(), &brokers, &kafka_name);
    let times = |k: i64| -> BTreeMap<String, i64> {
        expected.iter().map(|(w, n)| (w.clone(), k * n)).collect()
    };
    wait("the counts", Duration::from_secs(120), &|| {
        reader.counts() == expected
    });

    // Asked through the server that does not lead.
    let upgrade = |extra: &[&str]| {
        sluice_cmd()
            .arg("upgrade")
            .arg(&v2)
            .args(["--pipeline", "wc", "--server", servers[other].url.as_str()])
            .args(["--token", clients[other].token()])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = upgrade(&["--start-empty", "nosuch"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("upgrade refused") && stderr(&out).contains("nosuch"),
        "{}",
        stderr(&out)
    );
    for client in &clients {
        assert_eq!(status(client)["component"], "wc");
    }
    let out = upgrade(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let asked = status(&clients[other]);
    assert_eq!(asked["component"], "wordcount_v2", "{asked}");
    assert_eq!(asked["component_hash"], v2_hash.as_str(), "{asked}");
    // The leading server made it: its registry follows, under the name the
    // pipeline was created with (it never had version 2 uploaded).
    wait(
        "the leading server to show version 2",
        Duration::from_secs(60),
        &|| status(&clients[leader])["component_hash"] == v2_hash.as_str(),
    );
    assert_eq!(status(&clients[leader])["component"], "wc");

    let more = dir.path().join("more.jsonl");
    assert_eq!(input(&more, 2_000), expected);
    produce_lines(&brokers, &topic("lines"), &more);
    wait("the counts doubled", Duration::from_secs(180), &|| {
        reader.counts() == times(2)
    });
    let mut pairs = pairs_of(&more);
    wait("version 2's lengths", Duration::from_secs(120), &|| {
        current_lengths(&integrated(&brokers, &topic("lengths"))) == Some(recount_lengths(&pairs))
    });

    // The leading server dies and starts again: its registry names
    // version 2 (the version kept on its disk), before its host reports
    // anything.
    servers[leader].kill();
    servers[leader] = start(["a", "b"][leader]);
    clients[leader] = sluice::client::Client::new(&servers[leader].url, clients[leader].token());
    assert_eq!(status(&clients[leader])["component_hash"], v2_hash.as_str());
    produce_lines(&brokers, &topic("lines"), &more);
    wait("the counts tripled", Duration::from_secs(180), &|| {
        reader.counts() == times(3)
    });
    pairs.extend(pairs_of(&more));
    wait(
        "version 2's lengths again",
        Duration::from_secs(120),
        &|| {
            current_lengths(&integrated(&brokers, &topic("lengths")))
                == Some(recount_lengths(&pairs))
        },
    );
    wait(
        "one to lead on both again",
        Duration::from_secs(120),
        &|| clients.iter().any(leads_both),
    );
    for client in &clients {
        assert_eq!(status(client)["component_hash"], v2_hash.as_str());
    }
}

/// SHA-256 of `bytes`, hex.
fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}
