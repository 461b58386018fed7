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
        component: String,
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
    /// The SHA-256 of the component it was started from (a host runs
    /// several across an upgrade).
    component: String,
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
    /// into a session of `component` with `config`, if it may not: it
    /// moved on since, a call failed, it is an instance of another
    /// component (one from before an upgrade), or it runs with other
    /// settings.
    pub(super) fn refuses(
        &self,
        at: &StepMark,
        component: &str,
        config: &[(String, String)],
    ) -> Option<String> {
        if self.failed || self.busy || self.at.as_ref() != Some(at) {
            return Some("the kept instance is no longer where it was".into());
        }
        if self.component != component {
            return Some(format!(
                "the kept instance runs component {}, not the coordinator's {}",
                short(&self.component),
                short(component)
            ));
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
            component: self.component.clone(),
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
                component,
                ..
            } => {
                *self = Parkable {
                    workers: *workers,
                    owners: mesh.owners.clone(),
                    component: component.clone(),
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

/// A component's hash shortened for messages.
fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept instance is adopted only into a session of the component
    /// it was started from: after an upgrade, the old version's instances
    /// at the log's last step are not the new version's.
    #[test]
    fn a_kept_instance_of_another_component_is_refused() {
        let at = StepMark {
            step: 7,
            epoch: 1,
            frontier: Default::default(),
            time_ms: 0,
            limits: StepLimits::default(),
            own_input: true,
        };
        let kept = Parkable {
            component: "aaaa".repeat(16),
            config: vec![("k".into(), "v".into())],
            at: Some(at.clone()),
            ..Parkable::default()
        };
        let config = [("k".to_owned(), "v".to_owned())];
        assert_eq!(kept.refuses(&at, &"aaaa".repeat(16), &config), None);
        let refused = kept.refuses(&at, &"bbbb".repeat(16), &config);
        assert!(
            refused
                .as_deref()
                .is_some_and(|r| r.contains("aaaaaaaaaaaa")),
            "{refused:?}"
        );
        assert_eq!(kept.describe(0).component, "aaaa".repeat(16));
    }
}
