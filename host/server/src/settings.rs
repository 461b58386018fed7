//! The server's Kafka settings, as the admin starts it: the brokers its
//! Kafka pipelines keep their logs on ([`KafkaSettings`]), how it runs
//! pipelines across hosts ([`HostsSettings`]), and the Kafka name each
//! pipeline's topics derive from ([`kafka_name`]).

use sha2::{Digest, Sha256};
use std::time::Duration;

/// Where the server's Kafka pipelines keep their logs (set by the admin
/// with `sluice serve --kafka-brokers`).
#[derive(Debug, Clone)]
pub struct KafkaSettings {
    /// Bootstrap servers.
    pub brokers: String,
    /// Replication factor of the topics the server creates (`0`: what the
    /// cluster offers, `min(3, brokers)`).
    pub replication: i32,
    /// How the server runs pipelines across hosts, if it does.
    pub hosts: Option<HostsSettings>,
}

/// How the server runs pipelines across hosts (`sluice serve --hosts-etcd
/// …`): every server given the same settings on which a tenant creates a
/// pipeline with `"across_hosts": true` runs it as one host of it, like
/// `sluice host`.
#[derive(Clone)]
pub struct HostsSettings {
    /// etcd endpoints for the pipelines' groups.
    pub etcd: Vec<String>,
    /// The checkpoint store every server reaches (a URL); each pipeline's
    /// checkpoints are under `<store>/<its Kafka name>`.
    pub store: String,
    /// The secret the servers share (they accept coordinators that prove
    /// it).
    pub secret: Vec<u8>,
    /// The address this server's worker listeners bind (any port), which
    /// the other servers dial.
    pub bind: std::net::IpAddr,
    /// This server's name in every pipeline's group (stable across
    /// restarts).
    pub name: String,
    /// A host that renews nothing for this long leaves a group.
    pub session_timeout: Duration,
    /// Mutual TLS on every connection between the servers, if set.
    pub tls: Option<sluice_runtime::Tls>,
    /// This server's failure domain, if labelled: replicas of a worker go
    /// to servers in different zones where they can.
    pub zone: Option<String>,
}

impl HostsSettings {
    /// The checkpoint store of the pipeline across hosts named `group` (its
    /// Kafka name): `<store>/<group>`, where its hosts also fetch the
    /// components an upgrade moves it to.
    pub fn pipeline_store(&self, group: &str) -> String {
        format!("{}/{group}", self.store.trim_end_matches('/'))
    }
}

impl std::fmt::Debug for HostsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostsSettings")
            .field("etcd", &self.etcd)
            .field("store", &self.store)
            .field("bind", &self.bind)
            .field("name", &self.name)
            .field("session_timeout", &self.session_timeout)
            .field("tls", &self.tls.is_some())
            .field("zone", &self.zone)
            .finish_non_exhaustive()
    }
}

/// The Kafka name of a server pipeline: `sl.<tenant>.<pipeline>` with each
/// name written in `[a-z0-9-]` (`-` as `--`, `_` as `-u`), so no two
/// (tenant, pipeline) pairs share topics, even under Kafka's rule that
/// `.` and `_` collide; a hash when that would be too long for topic
/// names. Topics are `<this>.<port>` and `<this>.sluice-steps`.
pub fn kafka_name(tenant: &str, pipeline: &str) -> String {
    let encode = |s: &str| {
        s.chars()
            .map(|c| match c {
                '-' => "--".to_owned(),
                '_' => "-u".to_owned(),
                c => c.to_string(),
            })
            .collect::<String>()
    };
    let readable = format!("sl.{}.{}", encode(tenant), encode(pipeline));
    // Room for `.` + a 64-character port or `.sluice-steps`.
    if readable.len() <= 249 - 65 {
        readable
    } else {
        format!(
            "sl.h{}",
            &hex::encode(Sha256::digest(format!("{tenant}/{pipeline}").as_bytes()))[..40]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::kafka_name;

    #[test]
    fn kafka_names_do_not_collide_even_when_dots_and_underscores_do() {
        // Kafka treats `.` and `_` alike in topic names.
        let kafka_key = |s: &str| s.replace('_', ".");
        let pairs = [
            ("a_b", "c"),
            ("a", "b_c"),
            ("a-b", "c"),
            ("a", "b-c"),
            ("a-u", "c"),
            ("a_", "uc"),
            ("a", "_uc"),
        ];
        let names: Vec<String> = pairs.iter().map(|(t, p)| kafka_name(t, p)).collect();
        for (i, a) in names.iter().enumerate() {
            for b in &names[i + 1..] {
                assert_ne!(kafka_key(a), kafka_key(b), "{a} vs {b}");
            }
            sluice_kafka_free_topic_check(a);
        }
        assert_eq!(kafka_name("alpha", "wc"), "sl.alpha.wc");
        // Long names fit Kafka's 249 characters with a port after them.
        let long = "x".repeat(64);
        let name = kafka_name(&long.replace('x', "_"), &long);
        assert!(name.len() + 1 + 64 <= 249, "{name}");
    }

    /// Kafka's topic alphabet.
    fn sluice_kafka_free_topic_check(name: &str) {
        assert!(
            name.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-'),
            "{name}"
        );
    }
}
