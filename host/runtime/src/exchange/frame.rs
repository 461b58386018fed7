//! What crosses between hosts' exchanges: a round's [`Frame`] (a host's
//! contribution, or its abort), the [`Link`] it travels over, and the
//! [`Placement`] of the workers on hosts that says where each goes.

use crate::bindings::KeyedEvents;
use crate::error::ExchangeError;
use std::sync::Arc;
use std::time::Duration;

/// One host's contribution to one round (or its abort), for another host.
#[derive(Debug)]
pub(crate) struct Frame {
    /// The exchange it belongs to (one per coordinator, layout and
    /// placement): frames of any other are stale and dropped.
    pub session: u64,
    /// The step.
    pub step: u64,
    /// The channel (the round within the step).
    pub channel: u32,
    /// The slot that sent it.
    pub from: u32,
    /// What it carries.
    pub body: FrameBody,
}

/// What a [`Frame`] carries.
#[derive(Debug)]
pub(crate) enum FrameBody {
    /// `(source worker, destination worker, events)`: everything the
    /// sender's workers sent the receiver's on this channel (pairs with no
    /// events left out).
    Parts(Vec<(u32, u32, KeyedEvents)>),
    /// The step failed on the sender.
    Abort(ExchangeError),
}

/// The way to another host's exchange. Sending waits while the link's queue
/// is full (backpressure); an error means the host cannot be reached.
#[async_trait::async_trait]
pub(crate) trait Link: Send + Sync {
    async fn send(&self, frame: Frame) -> Result<(), String>;

    /// Who is at the other end, for messages ("host 10.0.0.2:7000").
    fn peer(&self) -> String {
        "another host".into()
    }

    /// Ends the way for good, as a host that went would (the other end
    /// gives this slot up): the session it served is over.
    fn close(&self) {}
}

/// Where the workers run: the slot of each, this exchange's slot, and the
/// links to the other slots.
pub(crate) struct Placement {
    /// Tells this exchange's frames from stale ones.
    pub session: u64,
    /// This host's slot.
    pub slot: u32,
    /// The slot of each worker (of its primary, with replicas).
    pub slots: Vec<u32>,
    /// The other slots each worker runs on (`followers[w]`; empty, or
    /// shorter than `slots`, without replicas): every replica of a worker
    /// receives what is sent to it and sends what it sends — the same
    /// bytes (I4), which each receiver checks.
    pub followers: Vec<Vec<u32>>,
    /// `links[s]`: the way to slot `s` (`None` for this slot and slots
    /// without workers).
    pub links: Vec<Option<Arc<dyn Link>>>,
    /// How long another slot may send nothing (no frame, no heartbeat)
    /// before a worker waiting for its part of a round fails the step: the
    /// session timeout.
    pub silence: Duration,
}
