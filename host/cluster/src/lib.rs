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
//! [`EtcdMembership`] keeps the group in etcd (a key per member under a
//! lease with the group's TTL). [`conformance`] is the suite any
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
    /// A member's record could not be read.
    #[error("membership: member record {key}: {message}")]
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
