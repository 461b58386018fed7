//! Membership in etcd: a key per member, `/sluice/<group>/members/<name>`,
//! holding its record (JSON), attached to a lease of the group's TTL that
//! the member keeps alive. Join order is the keys' create revision.
//!
//! The upgrade request is the key `/sluice/<group>/upgrade` (JSON of an
//! [`UpgradeRequest`]), under no lease: it outlives the members. It is
//! changed only by transactions comparing its revision with the one read
//! just before.

use crate::{Error, Member, Membership, Result, Session, UpgradeAnswer, UpgradeRequest, View};
use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A pipeline's group of hosts in etcd.
pub struct EtcdMembership {
    client: Client,
    prefix: String,
    /// The key of the group's upgrade request.
    upgrade: String,
    ttl: Duration,
}

fn backend(what: impl Into<String>) -> impl FnOnce(etcd_client::Error) -> Error {
    let what = what.into();
    move |e| Error::Backend {
        what,
        source: Box::new(e),
    }
}

impl EtcdMembership {
    /// The stored upgrade request and its key's mod revision, if any.
    async fn read_upgrade(&self, client: &mut Client) -> Result<Option<(i64, UpgradeRequest)>> {
        let got = client
            .get(self.upgrade.as_str(), None)
            .await
            .map_err(backend("reading the upgrade request"))?;
        let Some(kv) = got.kvs().first() else {
            return Ok(None);
        };
        let request: UpgradeRequest =
            serde_json::from_slice(kv.value()).map_err(|e| Error::Corrupt {
                key: self.upgrade.clone(),
                message: e.to_string(),
            })?;
        Ok(Some((kv.mod_revision(), request)))
    }

    /// Writes `request` as the upgrade request if the key is still as read:
    /// absent (`None`) or at mod revision `revision`. Returns whether it
    /// did.
    async fn put_upgrade(
        &self,
        client: &mut Client,
        revision: Option<i64>,
        request: &UpgradeRequest,
        what: &str,
    ) -> Result<bool> {
        let record = serde_json::to_vec(request).map_err(|e| Error::Invalid(e.to_string()))?;
        let key = self.upgrade.as_str();
        let compare = match revision {
            None => Compare::create_revision(key, CompareOp::Equal, 0),
            Some(revision) => Compare::mod_revision(key, CompareOp::Equal, revision),
        };
        let put = TxnOp::put(key, record, None);
        let written = client
            .txn(Txn::new().when([compare]).and_then([put]))
            .await
            .map_err(backend(what))?;
        Ok(written.succeeded())
    }

    /// Connects to etcd at `endpoints` (`http://host:2379`, …) for the
    /// group `group` (the pipeline's name), whose members lapse `ttl` (at
    /// least 2 s: etcd's shortest lease) after they stop renewing.
    pub async fn connect(endpoints: &[String], group: &str, ttl: Duration) -> Result<Self> {
        if group.is_empty() || group.contains('/') {
            return Err(Error::Invalid(format!("group name {group:?}")));
        }
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(5));
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(backend(format!("connecting to {}", endpoints.join(","))))?;
        Ok(EtcdMembership {
            client,
            prefix: format!("/sluice/{group}/members/"),
            upgrade: format!("/sluice/{group}/upgrade"),
            ttl: ttl.max(Duration::from_secs(2)),
        })
    }
}

struct EtcdSession {
    client: Client,
    lease: i64,
    alive: Arc<AtomicBool>,
    renew: tokio::task::JoinHandle<()>,
}

impl Drop for EtcdSession {
    fn drop(&mut self) {
        self.renew.abort();
    }
}

#[async_trait::async_trait]
impl Membership for EtcdMembership {
    async fn join(&self, me: Member) -> Result<Box<dyn Session>> {
        if me.name.is_empty() || me.name.contains('/') {
            return Err(Error::Invalid(format!("member name {:?}", me.name)));
        }
        let mut client = self.client.clone();
        let ttl_secs = self.ttl.as_secs().max(2) as i64;
        let record = serde_json::to_vec(&me).map_err(|e| Error::Invalid(e.to_string()))?;
        let key = format!("{}{}", self.prefix, me.name);
        // The name is this host's: free, or held by this host's address (a
        // restart, which keeps its place in the join order). Held by
        // another address, it may be a host that moved and died: wait for
        // its lease to lapse, then refuse (two hosts under one name would
        // both lead, and fence each other in turn).
        let deadline = tokio::time::Instant::now() + self.ttl * 2 + Duration::from_secs(1);
        let lease = loop {
            let holder = client
                .get(key.as_str(), None)
                .await
                .map_err(backend(format!("reading member {}", me.name)))?;
            let held = holder.kvs().first().map(|kv| {
                let member: Option<Member> = serde_json::from_slice(kv.value()).ok();
                (kv.mod_revision(), member.map(|m| m.addr))
            });
            let compare = match &held {
                None => Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                Some((revision, Some(addr))) if *addr == me.addr => {
                    Compare::mod_revision(key.as_str(), CompareOp::Equal, *revision)
                }
                Some((_, addr)) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(Error::NameTaken {
                            name: me.name.clone(),
                            holder: addr.clone().unwrap_or_else(|| "?".into()),
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                }
            };
            let lease = client
                .lease_grant(ttl_secs, None)
                .await
                .map_err(backend("taking a lease"))?
                .id();
            let put = TxnOp::put(
                key.as_str(),
                record.clone(),
                Some(PutOptions::new().with_lease(lease)),
            );
            let joined = client
                .txn(Txn::new().when([compare]).and_then([put]))
                .await
                .map_err(backend(format!("joining as {}", me.name)))?;
            if joined.succeeded() {
                break lease;
            }
            // Taken between the read and the put: look again.
            let _ = client.lease_revoke(lease).await;
        };
        let (mut keeper, mut answers) = client
            .lease_keep_alive(lease)
            .await
            .map_err(backend("renewing the lease"))?;
        let alive = Arc::new(AtomicBool::new(true));
        let every = self.ttl / 3;
        let flag = alive.clone();
        let name = me.name.clone();
        let renew = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last = tokio::time::Instant::now();
            loop {
                tick.tick().await;
                // A process stalled past the TTL (SIGSTOP, a long pause)
                // comes back to a lease etcd may already have expired: it
                // is no longer a member, whatever the next renewal says.
                if last.elapsed() >= every * 3 {
                    tracing::warn!(member = %name, "membership lapsed: renewals stalled past the TTL");
                    break;
                }
                let renewed = async {
                    keeper.keep_alive().await?;
                    answers.message().await
                };
                match tokio::time::timeout(every, renewed).await {
                    Ok(Ok(Some(r))) if r.ttl() > 0 => last = tokio::time::Instant::now(),
                    Ok(Ok(_)) => {
                        tracing::warn!(member = %name, "membership lapsed: the lease expired");
                        break;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(member = %name, error = %e, "renewing the membership failed")
                    }
                    Err(_) => tracing::warn!(member = %name, "renewing the membership timed out"),
                }
            }
            flag.store(false, Ordering::SeqCst);
        });
        Ok(Box::new(EtcdSession {
            client,
            lease,
            alive,
            renew,
        }))
    }

    async fn view(&self) -> Result<View> {
        let mut client = self.client.clone();
        let got = client
            .get(self.prefix.as_str(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(backend("reading the members"))?;
        let mut members = Vec::with_capacity(got.kvs().len());
        for kv in got.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let member: Member =
                serde_json::from_slice(kv.value()).map_err(|e| Error::Corrupt {
                    key: key.clone(),
                    message: e.to_string(),
                })?;
            members.push((kv.create_revision(), member));
        }
        members.sort_by(|a, b| (a.0, &a.1.name).cmp(&(b.0, &b.1.name)));
        Ok(View {
            members: members.into_iter().map(|(_, m)| m).collect(),
        })
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    async fn request_upgrade(&self, request: &UpgradeRequest) -> Result<()> {
        if request.answer.is_some() {
            return Err(Error::Invalid(format!(
                "an upgrade request to {} comes with an answer: the leader answers",
                request.to
            )));
        }
        if request.to.is_empty() {
            return Err(Error::Invalid(
                "an upgrade request names no component".into(),
            ));
        }
        let mut client = self.client.clone();
        // Read, then write if nothing changed in between; if something did
        // (another host asked, or the leader answered), look again.
        loop {
            let revision = match self.read_upgrade(&mut client).await? {
                None => None,
                Some((_, stored)) if stored.answer.is_none() => {
                    return Err(Error::UpgradePending { to: stored.to });
                }
                Some((revision, _)) => Some(revision),
            };
            let what = format!("asking for an upgrade to {}", request.to);
            if self
                .put_upgrade(&mut client, revision, request, &what)
                .await?
            {
                return Ok(());
            }
        }
    }

    async fn upgrade_request(&self) -> Result<Option<UpgradeRequest>> {
        let mut client = self.client.clone();
        Ok(self.read_upgrade(&mut client).await?.map(|(_, r)| r))
    }

    async fn answer_upgrade(&self, id: &str, answer: UpgradeAnswer) -> Result<bool> {
        let mut client = self.client.clone();
        // As in `request_upgrade`: a change between the read and the write
        // (another host answered) is looked at again.
        loop {
            let Some((revision, mut stored)) = self.read_upgrade(&mut client).await? else {
                return Ok(false);
            };
            if stored.answer.is_some() || stored.id != id {
                return Ok(false);
            }
            stored.answer = Some(answer.clone());
            let what = format!("answering the upgrade to {}", stored.to);
            if self
                .put_upgrade(&mut client, Some(revision), &stored, &what)
                .await?
            {
                return Ok(true);
            }
        }
    }
}

#[async_trait::async_trait]
impl Session for EtcdSession {
    fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst) && !self.renew.is_finished()
    }

    async fn leave(self: Box<Self>) -> Result<()> {
        self.renew.abort();
        let mut client = self.client.clone();
        client
            .lease_revoke(self.lease)
            .await
            .map_err(backend("leaving"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// etcd at `SLUICE_ETCD_ENDPOINT` (scripts/test.sh starts one), or
    /// `None` (outside CI) to skip.
    fn endpoint() -> Option<String> {
        match std::env::var("SLUICE_ETCD_ENDPOINT") {
            Ok(e) if !e.is_empty() => Some(e),
            _ if std::env::var_os("CI").is_some() => {
                panic!("CI is set but SLUICE_ETCD_ENDPOINT is not: scripts/test.sh must start etcd")
            }
            _ => {
                eprintln!(
                    "skipped: set SLUICE_ETCD_ENDPOINT=http://host:port to run the etcd tests"
                );
                None
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_passes_the_membership_conformance_suite() {
        let Some(endpoint) = endpoint() else { return };
        // The upgrade request outlives the members: a group name of an
        // earlier run (in an etcd kept between runs) is not reused.
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        let run = format!("{}-{since}", std::process::id());
        let n = std::sync::atomic::AtomicU32::new(0);
        crate::conformance::membership(|| {
            let group = format!("conformance-{run}-{}", n.fetch_add(1, Ordering::Relaxed));
            let endpoint = endpoint.clone();
            async move {
                Box::new(
                    EtcdMembership::connect(&[endpoint], &group, Duration::from_secs(2))
                        .await
                        .unwrap(),
                ) as Box<dyn Membership>
            }
        })
        .await;
    }

    #[tokio::test]
    async fn names_with_slashes_are_refused() {
        let Some(endpoint) = endpoint() else { return };
        assert!(
            EtcdMembership::connect(
                std::slice::from_ref(&endpoint),
                "a/b",
                Duration::from_secs(2)
            )
            .await
            .is_err()
        );
        let m = EtcdMembership::connect(&[endpoint], "ok", Duration::from_secs(2))
            .await
            .unwrap();
        let bad = Member {
            name: "x/y".into(),
            addr: "127.0.0.1:1".into(),
            zone: None,
        };
        assert!(m.join(bad).await.is_err());
    }

    #[tokio::test]
    async fn an_unreadable_upgrade_request_is_reported() {
        let Some(endpoint) = endpoint() else { return };
        let group = format!("corrupt-upgrade-{}", std::process::id());
        let m = EtcdMembership::connect(&[endpoint], &group, Duration::from_secs(2))
            .await
            .unwrap();
        m.client
            .clone()
            .put(m.upgrade.as_str(), "not json", None)
            .await
            .unwrap();
        let request = UpgradeRequest {
            id: "id-aa11".into(),
            to: "aa11".into(),
            start_empty: vec![],
            answer: None,
        };
        assert!(matches!(
            m.upgrade_request().await,
            Err(Error::Corrupt { .. })
        ));
        assert!(matches!(
            m.request_upgrade(&request).await,
            Err(Error::Corrupt { .. })
        ));
        let answer = UpgradeAnswer::Refused("no".into());
        assert!(matches!(
            m.answer_upgrade("id-aa11", answer).await,
            Err(Error::Corrupt { .. })
        ));
        m.client
            .clone()
            .delete(m.upgrade.as_str(), None)
            .await
            .unwrap();
    }
}
