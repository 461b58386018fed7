//! Membership: which hosts run a pipeline now, and which of them leads.
//!
//! Hosts join a pipeline's group and stay in it while they renew their
//! membership; a host that dies, stalls or is cut off longer than the
//! group's time-to-live drops out, and the others see it gone. The leader —
//! the host that runs the pipeline's coordinator — is the member that
//! joined first: every host computes the same leader from the same view.
//!
//! Safety never rests on this: two hosts that both believe they lead (a
//! stalled leader waking up) cannot both commit, because the pipeline's
//! commits are fenced by Kafka's transactional id. Membership only decides
//! who *tries*.
//!
//! The group also carries one request to upgrade the pipeline to a new
//! component ([`UpgradeRequest`]): any host (an operator's command) asks,
//! the leader acts and answers ([`UpgradeAnswer`]), and the asker reads the
//! answer back. At most one request is pending at a time.
//!
//! [`EtcdMembership`] keeps the group in etcd (a key per member under a
//! lease with the group's TTL, the upgrade request under a key of its own
//! that outlives the members). [`conformance`] is the suite any
//! implementation must pass.

pub mod conformance;
mod etcd;

pub use etcd::EtcdMembership;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Errors of a membership backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The backend (etcd) failed or could not be reached.
    #[error("membership ({what}): {source}")]
    Backend {
        /// What the host was doing.
        what: String,
        /// The backend's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A record of the group (a member's, the upgrade request) could not be
    /// read.
    #[error("membership: record {key}: {message}")]
    Corrupt {
        /// Its key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// A name or address that cannot be a member's.
    #[error("membership: {0}")]
    Invalid(String),
    /// Another host, at another address, is a member under this name (it
    /// renewed its membership past the TTL this host waited).
    #[error(
        "membership: the name {name:?} is taken by the host at {holder}: give every host its \
         own --name"
    )]
    NameTaken {
        /// The name.
        name: String,
        /// The address the member under it gave.
        holder: String,
    },
    /// An upgrade was asked while another, not answered yet, is pending:
    /// one at a time.
    #[error("membership: an upgrade to {to} is pending: wait for its answer")]
    UpgradePending {
        /// The pending request's component (SHA-256, hex).
        to: String,
    },
}

/// Result with the membership [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One host of a pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Its name, unique in the group and stable across restarts.
    pub name: String,
    /// Where its worker host listens (`IP:PORT`).
    pub addr: String,
    /// Its failure domain (a rack, an availability zone), if labelled:
    /// replicas of one worker go to different zones where they can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// The group as one read saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// The live members, in the order they joined.
    pub members: Vec<Member>,
}

impl View {
    /// The member that leads: the first to join.
    pub fn leader(&self) -> Option<&Member> {
        self.members.first()
    }

    /// Whether `name` is a member.
    pub fn contains(&self, name: &str) -> bool {
        self.members.iter().any(|m| m.name == name)
    }
}

/// An upgrade of the pipeline's component asked of the group's leader: at
/// most one is pending at a time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradeRequest {
    /// The asker's name for this request (unique: a nonce); the answer is
    /// set only on the request it names.
    pub id: String,
    /// The new component's SHA-256 (hex), published in the pipeline's
    /// checkpoint store.
    pub to: String,
    /// Operators of the new component to start empty.
    pub start_empty: Vec<String>,
    /// The leader's answer once it acted: `None` while pending.
    pub answer: Option<UpgradeAnswer>,
}

/// What the leader made of an upgrade request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "message")]
pub enum UpgradeAnswer {
    /// The pipeline runs the new component (a message saying what was kept
    /// and what started empty).
    Upgraded(String),
    /// Refused with nothing changed (why).
    Refused(String),
}

/// A pipeline's group of hosts.
#[async_trait::async_trait]
pub trait Membership: Send + Sync {
    /// Joins the group as `me` and keeps renewing the membership until the
    /// session is left or dropped (then it lapses after the TTL). A member
    /// that joins again under its name and address while its earlier
    /// membership still lives keeps its place in the order (a quick
    /// restart changes nothing). A name another address holds is waited
    /// for up to the TTL (the holder may be dead), then refused
    /// ([`Error::NameTaken`]).
    async fn join(&self, me: Member) -> Result<Box<dyn Session>>;

    /// The live members, in join order.
    async fn view(&self) -> Result<View>;

    /// How long a member that stops renewing stays in the group.
    fn ttl(&self) -> Duration;

    /// Asks the leader to upgrade the pipeline: stores `request` as the
    /// group's upgrade request, whoever is a member (the request outlives
    /// the members, and the asker need not be one).
    ///
    /// The request must not carry an answer yet, and must name a component
    /// ([`Error::Invalid`] otherwise). While a stored request has no answer,
    /// another is refused ([`Error::UpgradePending`], naming the pending
    /// one's component); a request already answered is replaced. The check
    /// and the store are one atomic step: of two hosts asking at once while
    /// none is pending, exactly one succeeds and the other is refused. A
    /// stored request that cannot be read is [`Error::Corrupt`] (nothing is
    /// replaced).
    async fn request_upgrade(&self, request: &UpgradeRequest) -> Result<()>;

    /// The group's upgrade request, pending or answered (`None` if none was
    /// ever asked); [`Error::Corrupt`] if the stored one cannot be read.
    async fn upgrade_request(&self) -> Result<Option<UpgradeRequest>>;

    /// Answers the group's upgrade request (the leader, once it acted):
    /// sets `answer` on the stored request if it is pending and is request
    /// `id`. The check and the write are one atomic step: of two hosts
    /// answering at once, only one answer is kept, and a request is never
    /// answered twice. Returns whether it set the answer: `false` when no
    /// request is stored, when it is answered already, or when it is
    /// another request. A stored request that cannot be read is
    /// [`Error::Corrupt`].
    async fn answer_upgrade(&self, id: &str, answer: UpgradeAnswer) -> Result<bool>;
}

/// One host's membership.
#[async_trait::async_trait]
pub trait Session: Send + Sync {
    /// Whether the membership still holds: `false` once it lapsed (the host
    /// stalled or was cut off past the TTL and the others saw it leave) —
    /// and then for good: the host must stop acting as a member and join
    /// again.
    fn alive(&self) -> bool;

    /// Leaves the group now (the others see it at their next read).
    async fn leave(self: Box<Self>) -> Result<()>;
}
