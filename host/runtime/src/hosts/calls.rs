//! What a worker's calls do on its host: start, step (reading its own
//! input, holding or committing its share of a divided step), snapshot
//! (to the host's checkpoint store, or back to the coordinator), restore,
//! hand shards off, change layout. One task per worker takes its calls in
//! order.

use super::kept::{Parkable, TaskMsg};
use super::server::WorkerHost;
use super::wire::{Answer, Call, CallError, FromHost, ShareDone, ShareSpec, from_wire, to_wire};
use crate::bindings::Batch;
use crate::error::{Error, Result};
use crate::step_io::{
    DeadLetters, InputRange, Spare, StepRead, convert_output, read_batches, share_error,
};
use crate::worker::{Worker, WorkerInfo};
use sluice_core::StepLimits;
use sluice_storage::{
    CheckpointStore, LogBackend, ReadBytes, StorageError, WorkerCommit, WorkerCommitter,
};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

impl WorkerHost {
    /// Runs one worker's calls in order until the coordinator stops it, or
    /// it is handed to a coordinator in this process.
    pub(super) async fn run_worker(
        self: Arc<Self>,
        index: u32,
        mut calls: mpsc::UnboundedReceiver<TaskMsg>,
        state: Arc<Mutex<Parkable>>,
    ) {
        let mut worker: Option<Worker> = None;
        let mut share = Share::default();
        let lock = || state.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(msg) = calls.recv().await {
            let (id, limits, call, out) = match msg {
                TaskMsg::Call {
                    id,
                    limits,
                    call,
                    out,
                } => (id, limits, *call, out),
                TaskMsg::Release {
                    at,
                    component,
                    config,
                    to,
                } => {
                    if lock().refuses(&at, &component, &config).is_some() {
                        let _ = to.send(None);
                        continue;
                    }
                    let held = share.held.take();
                    let _ = to.send(worker.take().map(|w| (w, held)));
                    return;
                }
            };
            // Adopted only where the coordinator saw it, with its settings.
            let refused = match &call {
                Call::Adopt {
                    at,
                    component,
                    config,
                    ..
                } => lock().refuses(at, component, config),
                _ => None,
            };
            if let Some(why) = refused {
                let result = Err(CallError {
                    message: why,
                    guest: false,
                    exchange: false,
                    refused: false,
                    silent_slot: None,
                });
                let _ = out.send(FromHost::Answer { id, result }).await;
                continue;
            }
            let mark = lock().before(&call, limits);
            let commits = match &call {
                Call::CommitShare { step } => Some(*step),
                _ => None,
            };
            let result = self
                .answer(index, &mut worker, &mut share, limits, call, &out)
                .await;
            let held = share.held.as_ref().map(|c| (c.step, c.hash));
            lock().after(
                mark,
                result.is_ok(),
                held,
                commits.filter(|_| result.is_ok()),
            );
            let result = result.map_err(|e| CallError {
                // Either would fail again anywhere — but an exchange that
                // was aborted (a host, a link or another worker failed) is
                // not the guest's doing: the root cause decides, and a
                // network fault is worth a recovery without the host.
                guest: matches!(e, Error::Guest(_) | Error::Nondeterministic { .. })
                    && !e.is_transient()
                    // A record that is not an event, under the policy
                    // `fail`: every host reads the same record.
                    || matches!(e, Error::Storage(StorageError::BadRecord { .. })),
                exchange: e.kind() == "exchange",
                // Refused until this host runs the coordinator's component
                // (or can fetch it): the leader leaves it out meanwhile.
                refused: matches!(e, Error::ComponentDiffers { .. }),
                silent_slot: e.silent_slot(),
                message: e.to_string(),
            });
            // A connection that ended leaves the worker kept on the host,
            // for the next coordinator.
            let _ = out.send(FromHost::Answer { id, result }).await;
        }
    }

    async fn answer(
        &self,
        index: u32,
        worker: &mut Option<Worker>,
        share: &mut Share,
        limits: StepLimits,
        call: Call,
        out: &mpsc::Sender<FromHost>,
    ) -> Result<Answer> {
        if let Call::Start {
            workers,
            pipeline,
            config,
            inherit_stderr,
            mesh,
            component,
        } = call
        {
            let component = self.component_for(&component).await?;
            let info = WorkerInfo {
                worker: index,
                workers,
                pipeline,
                config,
            };
            let exchange = self.exchange_for(mesh, out);
            let mut started = Worker::start(
                &self.engine,
                &component,
                info,
                Some(exchange),
                inherit_stderr,
            )
            .await?;
            if limits != StepLimits::default() {
                started.set_step_limits(limits);
            }
            *worker = Some(started);
            // A new session: the worker is taken anew when it first commits.
            *share = Share::default();
            return Ok(Answer::Started {
                store: self.reach().checkpoints.and_then(|c| c.location()),
                log: self.log_reached().await,
                commits: !self.reach().read_only_log,
            });
        }
        let w = worker.as_mut().ok_or(Error::WorkersLost)?;
        if limits != StepLimits::default() {
            w.set_step_limits(limits);
        }
        Ok(match call {
            Call::Start { .. } | Call::Stop => Answer::Done,
            Call::Step {
                step,
                time_ms,
                inputs,
                read,
                share: spec,
            } => {
                let exchange = w.exchange();
                if let Some(x) = &exchange {
                    x.begin_step(step);
                }
                let mut batches: Vec<Batch> = Vec::new();
                let mut dead_letters = DeadLetters::default();
                let mut read_failed = None;
                if !read.is_empty() {
                    match self.read_input(read).await {
                        Ok(r) => (batches, dead_letters) = (r.batches, r.dead_letters),
                        Err(e) => read_failed = Some(e),
                    }
                }
                let events: u64 = batches.iter().map(|b| b.weights.len() as u64).sum();
                batches.extend(inputs.into_iter().map(Into::into));
                let stepped = match read_failed {
                    // The exchange learns of it below, like a step failure.
                    Some(e) => Err(e),
                    None => w.step(step, time_ms, &batches).await,
                };
                let stepped = match stepped {
                    Ok(mut out) if self.alter_output.load(Ordering::Relaxed) => {
                        if let Some(b) = out.iter_mut().find(|b| !b.weights.is_empty()) {
                            b.weights[0] = b.weights[0].saturating_mul(2);
                        }
                        Ok(out)
                    }
                    other => other,
                };
                if let Some(x) = &exchange {
                    x.worker_finished(index);
                    if let Err(e) = &stepped {
                        x.worker_failed(index, &e.to_string());
                    }
                }
                let fuel = w.take_fuel_used();
                match spec {
                    None => Answer::Stepped {
                        outputs: stepped?.into_iter().map(Into::into).collect(),
                        fuel,
                        events,
                        shared: None,
                        dead_letters,
                    },
                    Some(spec) => {
                        let (now, follow) = (spec.now, spec.follow);
                        let commit = share_of(index, step, spec, stepped?, dead_letters)?;
                        let done = ShareDone::of(&commit);
                        // Taken now (which ends an earlier holder's open
                        // transaction), committed now or when told. A
                        // follower's share is only held (only its hash goes
                        // back, for the coordinator to check): taking the
                        // worker would fence its primary.
                        if !follow {
                            self.take(index, share).await?;
                        }
                        share.held = Some(commit);
                        if now && !follow {
                            self.commit_held(index, step, share).await?;
                        }
                        Answer::Stepped {
                            outputs: Vec::new(),
                            fuel,
                            events,
                            shared: Some(done),
                            dead_letters: DeadLetters::default(),
                        }
                    }
                }
            }
            Call::CommitShare { step } => {
                // A follower that takes over takes the worker now (fencing
                // its old primary's holder); a primary took it already.
                self.take(index, share).await?;
                let done = self.commit_held(index, step, share).await?;
                Answer::Shared(done)
            }
            Call::Snapshot {
                changed_only,
                stage: None,
            } => {
                let s = w.snapshot(changed_only).await?;
                Answer::Snapshot {
                    pieces: to_wire(s.pieces),
                    changed: s.changed,
                }
            }
            Call::Snapshot {
                changed_only,
                stage: Some(step),
            } => {
                let store = self.store()?;
                let s = w.snapshot(changed_only).await?;
                let staged =
                    tokio::task::spawn_blocking(move || store.stage(step, index, &s.pieces))
                        .await
                        .map_err(Error::task("staging a checkpoint"))??;
                Answer::Staged {
                    staged,
                    changed: s.changed,
                }
            }
            Call::RestoreFrom { step, upgrade } => {
                // A read that fails leaves the instance untouched: say so,
                // and the coordinator sends the pieces instead.
                let read = match self.store() {
                    Ok(store) => {
                        tokio::task::spawn_blocking(move || store.worker_pieces(step, index))
                            .await
                            .map_err(Error::task("reading a checkpoint"))
                            .and_then(|r| r.map_err(Error::from))
                    }
                    Err(e) => Err(e),
                };
                let (pieces, ReadBytes { local, fetched }) = match read {
                    Ok(Some(read)) => read,
                    Ok(None) => {
                        return Ok(Answer::Unread {
                            message: format!(
                                "checkpoint {step} is not in this host's checkpoint store"
                            ),
                        });
                    }
                    Err(e) => {
                        return Ok(Answer::Unread {
                            message: e.to_string(),
                        });
                    }
                };
                let pieces: Vec<(u32, Vec<u8>)> =
                    pieces.into_iter().map(|p| (p.shard, p.state)).collect();
                match upgrade {
                    Some(start_empty) => w.upgrade(pieces, start_empty).await?,
                    None if !pieces.is_empty() => w.restore(pieces).await?,
                    None => {}
                }
                Answer::Restored { local, fetched }
            }
            Call::Restore { pieces, upgrade } => {
                match upgrade {
                    Some(start_empty) => w.upgrade(from_wire(pieces), start_empty).await?,
                    None => w.restore(from_wire(pieces)).await?,
                }
                Answer::Done
            }
            Call::Export { shards } => Answer::Pieces(to_wire(w.export_shards(&shards).await?)),
            Call::Relayout { workers, mesh } => {
                let exchange = self.exchange_for(mesh, out);
                w.relayout(workers, exchange).await?;
                Answer::Done
            }
            Call::Rewire { mesh } => {
                w.rewire(self.exchange_for(mesh, out));
                Answer::Done
            }
            // An instance of another component was refused before (its
            // kept state names the component it was started from).
            Call::Adopt { mesh, .. } => {
                w.rewire(self.exchange_for(mesh, out));
                // A new session: the worker is taken anew when it first
                // commits (its holder from before may have been fenced
                // since, by a replica that committed instead).
                share.holder = None;
                Answer::Started {
                    store: self.reach().checkpoints.and_then(|c| c.location()),
                    log: self.log_reached().await,
                    commits: !self.reach().read_only_log,
                }
            }
        })
    }

    /// Takes the worker for its shares of divided steps, unless this
    /// session took it already: fences every earlier holder.
    async fn take(&self, index: u32, share: &mut Share) -> Result<()> {
        if share.holder.is_some() {
            return Ok(());
        }
        if self.reach().read_only_log {
            return Err(Error::Storage(sluice_storage::StorageError::Config(
                sluice_core::ConfigError::Invalid(format!(
                    "worker {index}'s share was sent to a host that may not write the \
                     pipeline's logs (--read-only-log)"
                )),
            )));
        }
        let log = self.log()?;
        let holder = tokio::task::spawn_blocking(move || log.take_worker(index))
            .await
            .map_err(Error::task("taking a worker"))??;
        share.holder = Some(holder);
        Ok(())
    }

    /// Commits the share of divided step `step` the worker holds (unless
    /// its done record exists: then checked against it).
    async fn commit_held(&self, index: u32, step: u64, share: &mut Share) -> Result<ShareDone> {
        let Some(commit) = share.held.take().filter(|c| c.step == step) else {
            return Err(Error::Storage(
                sluice_storage::StorageError::InvalidCommit {
                    step,
                    message: format!("worker {index} holds no share of step {step}"),
                },
            ));
        };
        // The step that computed the share took the worker.
        let Some(mut holder) = share.holder.take() else {
            return Err(Error::WorkersLost);
        };
        let done = ShareDone::of(&commit);
        let (holder, committed) = tokio::task::spawn_blocking(move || {
            let committed = holder.commit(&commit);
            (holder, committed)
        })
        .await
        .map_err(Error::task("committing a worker's share"))?;
        // Kept whatever happened: a holder that failed stays failed (it
        // never takes the worker back by itself); a new session takes anew.
        share.holder = Some(holder);
        committed.map_err(share_error)?;
        Ok(done)
    }

    /// Where this host reads the pipeline's logs, if it does *now*: the
    /// reach it opened with, checked again at each session's start (a host
    /// that lost Kafka since is sent its workers' input, rather than fail
    /// every step it is given to read).
    async fn log_reached(&self) -> Option<String> {
        let log = self.reach().log?;
        let location = log.location()?;
        match tokio::task::spawn_blocking(move || log.reachable()).await {
            Ok(Ok(())) => Some(location),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the pipeline's logs do not answer here: the coordinator sends this host's workers their input this session");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "checking the pipeline's logs failed");
                None
            }
        }
    }

    /// The pipeline's logs, or why a call that needs them fails.
    fn log(&self) -> Result<Arc<dyn LogBackend>> {
        self.reach().log.ok_or_else(|| {
            Error::Storage(sluice_storage::StorageError::Config(
                sluice_core::ConfigError::Invalid(
                    "this host reads none of the pipeline's logs (start it with the pipeline's \
                     --brokers)"
                        .into(),
                ),
            ))
        })
    }

    /// Reads a worker's input ranges from the pipeline's logs.
    async fn read_input(&self, read: Vec<InputRange>) -> Result<StepRead> {
        let log = self.log()?;
        tokio::task::spawn_blocking(move || read_batches(&*log, &read, true, &Spare::default()))
            .await
            .map_err(Error::task("reading input"))?
    }

    /// The checkpoint store, or why a call that needs one fails.
    fn store(&self) -> Result<Arc<dyn CheckpointStore>> {
        self.reach().checkpoints.ok_or_else(|| {
            Error::Storage(sluice_storage::StorageError::Config(
                sluice_core::ConfigError::Invalid(
                    "this host reaches no checkpoint store (start it with the pipeline's --store)"
                        .into(),
                ),
            ))
        })
    }
}

/// A worker's share of divided steps on its host: the holder of the
/// worker (taken at the session's first divided step) and the share
/// computed but not committed yet.
#[derive(Default)]
pub(super) struct Share {
    holder: Option<Box<dyn WorkerCommitter>>,
    held: Option<WorkerCommit>,
}

/// A worker's output of divided step `step` as its share: checked, hashed,
/// its entries tagged with the step, the worker and its frontier, with the
/// input records it skipped (`dead_letters`), which commit with it.
pub(super) fn share_of(
    index: u32,
    step: u64,
    spec: ShareSpec,
    batches: Vec<Batch>,
    dead_letters: DeadLetters,
) -> Result<WorkerCommit> {
    let out = convert_output(&spec.checks, index, step, batches)?;
    let outputs = spec.outputs.into_iter().zip(out.ports);
    Ok(
        WorkerCommit::new(step, index, &spec.frontier, outputs, out.hash)
            .with_dead_letters(&spec.frontier, dead_letters.0),
    )
}

impl ShareDone {
    /// What a share reports back: its hash, its events and the records it
    /// skipped.
    fn of(commit: &WorkerCommit) -> Self {
        ShareDone {
            hash: commit.hash,
            events: commit.events(),
            dead_letters: commit.dead_letter_count(),
        }
    }
}
