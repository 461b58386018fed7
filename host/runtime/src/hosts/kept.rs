//! What a host keeps of a worker for the next coordinator: the messages a
//! worker's task takes ([`TaskMsg`]), and what its instance holds as far
//! as its calls say ([`Parkable`]) — read when a new coordinator asks
//! which workers it may adopt.

use super::wire::{Call, FromHost, StepMark, WireParked};
use crate::worker::Worker;
use sluice_core::StepLimits;
use sluice_storage::WorkerCommit;
use tokio::sync::{mpsc, oneshot};

/// What a worker's task takes.
pub(super) enum TaskMsg {
    /// A coordinator's call, answered on `out` (the connection it came on:
    /// a worker adopted by a new coordinator answers on the new one).
    Call {
        id: u64,
        limits: StepLimits,
        call: Box<Call>,
        out: mpsc::Sender<FromHost>,
    },
    /// Hand the instance, and the share it holds, to a coordinator in this
    /// process, if it is still at `at`; and end.
    Release {
        at: StepMark,
        config: Vec<(String, String)>,
        to: oneshot::Sender<Option<(Worker, Option<WorkerCommit>)>>,
    },
}

/// What a worker's instance holds, as far as its calls say: kept up to
/// date by its task, read when a new coordinator asks what it may adopt
/// ([`WireParked`]).
#[derive(Debug, Default)]
pub(super) struct Parkable {
    workers: u32,
    owners: Vec<u32>,
    /// The pipeline settings it was started with.
    config: Vec<(String, String)>,
    at: Option<StepMark>,
    before: Option<StepMark>,
    held_hash: Option<u128>,
    /// A call failed (the instance may be half-way through it).
    failed: bool,
    /// A call is running.
    busy: bool,
    held: Option<u64>,
    committed: Option<u64>,
}

impl Parkable {
    /// Whether a call is running.
    pub(super) fn is_busy(&self) -> bool {
        self.busy
    }

    /// Why a coordinator that saw the instance at `at` may not adopt it
    /// with `config`, if it may not: it moved on since, a call failed, or
    /// it runs with other settings.
    pub(super) fn refuses(&self, at: &StepMark, config: &[(String, String)]) -> Option<String> {
        if self.failed || self.busy || self.at.as_ref() != Some(at) {
            return Some("the kept instance is no longer where it was".into());
        }
        (self.config != config).then(|| {
            "the kept instance runs with other pipeline settings than the coordinator's".into()
        })
    }

    pub(super) fn describe(&self, worker: u32) -> WireParked {
        WireParked {
            worker,
            workers: self.workers,
            owners: self.owners.clone(),
            at: self.at.clone(),
            before: self.before.clone(),
            held_hash: self.held_hash,
            clean: !self.failed,
            busy: self.busy,
            held: self.held,
            committed: self.committed,
        }
    }

    /// What `call` will do to the instance's state, noted before it runs:
    /// the step it ends at, if it is a step whose share is kept here.
    pub(super) fn before(&mut self, call: &Call, limits: StepLimits) -> Option<StepMark> {
        self.busy = true;
        match call {
            Call::Start {
                workers,
                mesh,
                config,
                ..
            } => {
                *self = Parkable {
                    workers: *workers,
                    owners: mesh.owners.clone(),
                    config: config.clone(),
                    busy: true,
                    ..Parkable::default()
                };
                None
            }
            Call::Step {
                step,
                time_ms,
                share: Some(spec),
                ..
            } => Some(StepMark {
                step: *step,
                epoch: spec.epoch,
                frontier: spec.frontier.clone(),
                time_ms: *time_ms,
                limits,
                own_input: spec.own_input,
            }),
            // State no step of the log names: not adoptable until the next
            // step.
            Call::Step { .. }
            | Call::Restore { .. }
            | Call::RestoreFrom { .. }
            | Call::Export { .. } => {
                (self.at, self.before) = (None, None);
                None
            }
            Call::Relayout { workers, mesh } => {
                (self.at, self.before) = (None, None);
                self.workers = *workers;
                self.owners = mesh.owners.clone();
                None
            }
            Call::Rewire { mesh } => {
                self.owners = mesh.owners.clone();
                None
            }
            Call::Adopt { mesh, recorded, .. } => {
                self.owners = mesh.owners.clone();
                if let (Some(epoch), Some(at)) = (recorded, self.at.as_mut()) {
                    at.epoch = *epoch;
                }
                None
            }
            Call::CommitShare { .. } | Call::Snapshot { .. } | Call::Stop => None,
        }
    }

    /// After the call: whether it succeeded, the share held now (its step
    /// and hash), the step whose share it committed.
    pub(super) fn after(
        &mut self,
        mark: Option<StepMark>,
        ok: bool,
        held: Option<(u64, u128)>,
        committed: Option<u64>,
    ) {
        self.busy = false;
        if !ok {
            self.failed = true;
            (self.at, self.before) = (None, None);
        } else if mark.is_some() {
            self.before = std::mem::replace(&mut self.at, mark);
        }
        self.held = held.map(|(step, _)| step);
        self.held_hash = held.map(|(_, hash)| hash);
        if committed.is_some() {
            self.committed = committed;
        }
    }
}
