//! A worker: one sandboxed instance of a circuit component, with its store,
//! its limits and its end of the exchange. Every call into the guest goes
//! through here, and every way it can fail becomes a typed [`Error`].

use crate::bindings::{self, Batch, CircuitError, PipelineWorker, ShardState};
use crate::determinism::{GuestEnvironment, StepClock, seed};
use crate::engine::{Limits, LoadedComponent, SluiceEngine, TICK, ticks};
use crate::error::{Error, GuestError, Result};
use crate::exchange::Exchange;
use crate::instance::{InstanceLimiter, WorkerState};
use crate::packed::{pack_batch, slices};
use sluice_core::CircuitPorts;
use sluice_core::layout::SHARDS;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use wasmtime::{CallHook, Store, Trap};
use wasmtime_wasi::{ResourceTable, WasiCtxBuilder};

/// Who an instance is within its pipeline; fixed for its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    /// This worker's index, `0 <= worker < workers`.
    pub worker: u32,
    /// The pipeline's number of workers W.
    pub workers: u32,
    /// The pipeline's identity: seeds the guest's random numbers.
    pub pipeline: String,
    /// Settings handed to the circuit.
    pub config: Vec<(String, String)>,
}

impl From<WorkerInfo> for bindings::WorkerInfo {
    fn from(i: WorkerInfo) -> Self {
        bindings::WorkerInfo {
            worker: i.worker,
            workers: i.workers,
            pipeline: i.pipeline,
            config: i.config,
        }
    }
}

impl SluiceEngine {
    /// Learns a component's ports and snapshot version from a throwaway
    /// instance (`init`, then `describe`).
    pub async fn describe(&self, component: &LoadedComponent) -> Result<CircuitPorts> {
        let info = WorkerInfo {
            worker: 0,
            workers: 1,
            pipeline: "describe".into(),
            config: vec![],
        };
        let mut worker = Worker::start(self, component, info, None, false).await?;
        worker.describe().await
    }
}

/// At most this many bytes of pieces per `restore` call (see
/// [`Worker::restore`]).
pub const RESTORE_BATCH: usize = 8 << 20;

/// What [`Worker::snapshot`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// `(shard, bytes)`, ordered by shard, at most one per shard.
    pub pieces: Vec<(u32, Vec<u8>)>,
    /// For an incremental snapshot, the shards written whole (sorted);
    /// the pieces of other shards are deltas. `None` for a full snapshot.
    pub changed: Option<Vec<u32>>,
}

/// One instance of a circuit.
pub struct Worker {
    index: u32,
    store: Store<WorkerState>,
    bindings: PipelineWorker,
    limits: Limits,
    environment: GuestEnvironment,
    pipeline: String,
    /// Fuel burned by calls since the last [`take_fuel_used`](Self::take_fuel_used).
    fuel_used: u64,
}

/// The step number the guest environment is seeded with outside steps
/// (init, describe, snapshot, restore).
const OUTSIDE_STEP: u64 = u64::MAX;

impl Worker {
    /// Instantiates `component` as worker `info.worker` and calls `init`.
    pub async fn start(
        engine: &SluiceEngine,
        component: &LoadedComponent,
        info: WorkerInfo,
        exchange: Option<Arc<Exchange>>,
        inherit_stderr: bool,
    ) -> Result<Self> {
        let limits = engine.limits();
        let environment = GuestEnvironment::default();
        environment.enter_step(&info.pipeline, info.worker, OUTSIDE_STEP, 0);
        let mut wasi = WasiCtxBuilder::new();
        wasi.wall_clock(environment.clock.clone())
            .monotonic_clock(environment.clock.clone())
            .secure_random(environment.secure.clone())
            .insecure_random(environment.insecure.clone())
            .insecure_random_seed(seed(&info.pipeline, info.worker, 0, "insecure-seed") as u128);
        if inherit_stderr {
            wasi.inherit_stderr();
        }
        let state = WorkerState {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limiter: InstanceLimiter::new(limits.memory),
            exchange,
            worker: info.worker,
            step: OUTSIDE_STEP,
            exchange_error: None,
            deadline_tick: u64::MAX,
            clock: environment.clock.clone(),
        };
        let mut store = new_store(engine, state);
        let index = info.worker;
        let deadline = arm(&mut store, &limits);
        let bindings = match timed(deadline, component.pre.instantiate_async(&mut store)).await {
            Ok(b) => b,
            Err(e) => return Err(instantiate_error(engine, &mut store, index, &limits, e)),
        };
        let pipeline = info.pipeline.clone();
        let mut worker = Worker {
            index,
            store,
            bindings,
            limits,
            environment,
            pipeline,
            fuel_used: 0,
        };
        let deadline = worker.arm();
        let info = info.into();
        let call = worker
            .bindings
            .sluice_circuit_circuit()
            .call_init(&mut worker.store, &info);
        let r = timed(deadline, call).await;
        worker.check("init", r)?;
        Ok(worker)
    }

    /// Readies the store for a call into the guest; returns the call's
    /// deadline.
    fn arm(&mut self) -> Instant {
        let deadline = arm(&mut self.store, &self.limits);
        self.environment
            .enter_step(&self.pipeline, self.index, OUTSIDE_STEP, 0);
        deadline
    }

    fn classify(&mut self, call: &'static str, e: wasmtime::Error) -> Error {
        classify(&mut self.store, self.index, call, &self.limits, e)
    }

    fn check<T>(
        &mut self,
        call: &'static str,
        r: wasmtime::Result<std::result::Result<T, CircuitError>>,
    ) -> Result<T> {
        // A failed shuffle fails the call, whatever the guest made of it.
        if r.is_ok()
            && let Some(source) = self.store.data_mut().exchange_error.take()
        {
            return Err(GuestError::Exchange {
                worker: self.index,
                call,
                source,
            }
            .into());
        }
        match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(GuestError::Failed {
                worker: self.index,
                call,
                message: guest_message(e),
            }
            .into()),
            Err(e) => Err(self.classify(call, e)),
        }
    }

    /// Asks the circuit for its ports.
    pub async fn describe(&mut self) -> Result<CircuitPorts> {
        let deadline = self.arm();
        let call = self
            .bindings
            .sluice_circuit_circuit()
            .call_describe(&mut self.store);
        let r = timed(deadline, call).await;
        let info = r.map_err(|e| self.classify("describe", e))?;
        Ok(CircuitPorts {
            inputs: info.inputs,
            outputs: info.outputs,
            snapshot_version: info.snapshot_version,
            operators: info
                .operators
                .into_iter()
                .map(|o| sluice_core::OperatorInfo {
                    id: o.id,
                    aliases: o.aliases,
                    kind: o.kind,
                    fingerprint: o.fingerprint,
                    state_shape: o.state_shape,
                    migrates_from: o.migrates_from,
                })
                .collect(),
        })
    }

    /// Runs step `step` on `inputs`, the guest's clocks showing `time_ms`
    /// and its random numbers seeded for this step; returns the output
    /// batches.
    pub(crate) async fn step(
        &mut self,
        step: u64,
        time_ms: u64,
        inputs: &[Batch],
    ) -> Result<Vec<Batch>> {
        let deadline = self.arm();
        self.store.data_mut().step = step;
        self.environment
            .enter_step(&self.pipeline, self.index, step, time_ms);
        let call = self
            .bindings
            .sluice_circuit_circuit()
            .call_step(&mut self.store, inputs);
        let r = timed(deadline, call).await;
        let left = self.store.get_fuel().unwrap_or(0);
        self.fuel_used += self.limits.fuel_per_call.saturating_sub(left);
        self.check("step", r)
    }

    /// Sets the deterministic limits (fuel per call, memory) of the next
    /// calls: a replayed step runs under the ones it was recorded with.
    pub(crate) fn set_step_limits(&mut self, limits: sluice_core::StepLimits) {
        self.limits.fuel_per_call = limits.fuel_per_call;
        self.limits.memory = usize::try_from(limits.memory).unwrap_or(usize::MAX);
        self.store.data_mut().limiter.max = self.limits.memory;
    }

    /// Fuel burned by steps since the last call, which resets it.
    pub fn take_fuel_used(&mut self) -> u64 {
        std::mem::take(&mut self.fuel_used)
    }

    /// Takes a snapshot of the circuit's state: `(shard, bytes)` pieces,
    /// at most one per shard. With `changed_only`, the circuit may answer
    /// with its changes since its previous snapshot (or restore) only:
    /// [`Snapshot::changed`] lists the shards written whole (replacing the
    /// pieces before), and a piece of a shard not listed is a delta that
    /// adds to the pieces before.
    pub async fn snapshot(&mut self, changed_only: bool) -> Result<Snapshot> {
        let deadline = self.arm();
        let call = self
            .bindings
            .sluice_circuit_circuit()
            .call_snapshot(&mut self.store, changed_only);
        let r = timed(deadline, call).await;
        let snap = self.check("snapshot", r)?;
        let refuse = |message: String| -> Error {
            GuestError::Failed {
                worker: self.index,
                call: "snapshot",
                message,
            }
            .into()
        };
        let mut pieces: Vec<(u32, Vec<u8>)> = snap
            .pieces
            .into_iter()
            .map(|p| (p.shard, p.state))
            .collect();
        pieces.sort_by_key(|(shard, _)| *shard);
        for pair in pieces.windows(2) {
            if pair[0].0 == pair[1].0 {
                return Err(refuse(format!("two pieces of shard {}", pair[0].0)));
            }
        }
        if let Some((shard, _)) = pieces.iter().find(|(s, _)| *s >= SHARDS) {
            return Err(refuse(format!(
                "a piece of shard {shard}; shards are below {SHARDS}"
            )));
        }
        let changed = match snap.changed {
            Some(_) if !changed_only => {
                return Err(refuse("a list of changed shards in a full snapshot".into()));
            }
            Some(mut changed) => {
                changed.sort_unstable();
                changed.dedup();
                if let Some(s) = changed.iter().find(|s| **s >= SHARDS) {
                    return Err(refuse(format!(
                        "changed shard {s}; shards are below {SHARDS}"
                    )));
                }
                Some(changed)
            }
            None => None,
        };
        Ok(Snapshot { pieces, changed })
    }

    /// Adds pieces of state (from a checkpoint, or handed off by other
    /// workers) to the circuit's state, in calls of at most
    /// [`RESTORE_BATCH`] bytes (one piece may exceed it alone): the guest
    /// frees each call's copy of the pieces before the next arrives, so a
    /// restore needs about the state's size in guest memory, not twice it,
    /// and touches fewer fresh pages. Pieces add up, so how they are cut
    /// into calls does not change the result.
    pub async fn restore(&mut self, pieces: Vec<(u32, Vec<u8>)>) -> Result<()> {
        let mut batch: Vec<ShardState> = Vec::new();
        let mut bytes = 0;
        for (shard, state) in pieces {
            if bytes + state.len() > RESTORE_BATCH && !batch.is_empty() {
                self.restore_batch(std::mem::take(&mut batch)).await?;
                bytes = 0;
            }
            bytes += state.len();
            batch.push(ShardState { shard, state });
        }
        if !batch.is_empty() {
            self.restore_batch(batch).await?;
        }
        Ok(())
    }

    async fn restore_batch(&mut self, pieces: Vec<ShardState>) -> Result<()> {
        let deadline = self.arm();
        let call = self
            .bindings
            .sluice_circuit_circuit()
            .call_restore(&mut self.store, &pieces);
        let r = timed(deadline, call).await;
        self.check("restore", r)
    }

    /// Takes pieces that another version of the circuit snapshotted (an
    /// upgrade) through the circuit's `upgrade`, in one call (its operators'
    /// fates are decided over all of them); the operators in `start_empty`
    /// start empty. A refusal names the operator
    /// ([`GuestError::Failed`](crate::GuestError) with the guest's message).
    pub async fn upgrade(
        &mut self,
        pieces: Vec<(u32, Vec<u8>)>,
        start_empty: Vec<String>,
    ) -> Result<()> {
        let pieces: Vec<ShardState> = pieces
            .into_iter()
            .map(|(shard, state)| ShardState { shard, state })
            .collect();
        let deadline = self.arm();
        let call = self.bindings.sluice_circuit_circuit().call_upgrade(
            &mut self.store,
            &pieces,
            &start_empty,
        );
        let r = timed(deadline, call).await;
        self.check("upgrade", r)
    }

    /// Hands shards off: the circuit returns their pieces and forgets them.
    pub async fn export_shards(&mut self, shards: &[u32]) -> Result<Vec<(u32, Vec<u8>)>> {
        let deadline = self.arm();
        let call = self
            .bindings
            .sluice_circuit_circuit()
            .call_export_shards(&mut self.store, shards);
        let r = timed(deadline, call).await;
        Ok(self
            .check("export-shards", r)?
            .into_iter()
            .map(|p| (p.shard, p.state))
            .collect())
    }

    /// Sends the worker's shuffles to `exchange` from the next step on (the
    /// same layout, workers placed anew).
    pub(crate) fn rewire(&mut self, exchange: Arc<Exchange>) {
        self.store.data_mut().exchange = Some(exchange);
    }

    /// Where the worker's shuffles go.
    pub(crate) fn exchange(&self) -> Option<Arc<Exchange>> {
        self.store.data().exchange.clone()
    }

    /// Moves the worker to a new layout of `workers` workers: its exchange
    /// from now on is `exchange`, and the circuit is told W.
    pub async fn relayout(&mut self, workers: u32, exchange: Arc<Exchange>) -> Result<()> {
        self.store.data_mut().exchange = Some(exchange);
        let deadline = self.arm();
        let call = self
            .bindings
            .sluice_circuit_circuit()
            .call_set_workers(&mut self.store, workers);
        let r = timed(deadline, call).await;
        r.map_err(|e| self.classify("set-workers", e))
    }

    /// Instantiates `component` without calling anything in it: the bare
    /// wasmtime cost a worker start builds on (the baseline of `sluice bench`).
    pub async fn instantiate_only(
        engine: &SluiceEngine,
        component: &LoadedComponent,
    ) -> Result<()> {
        let limits = engine.limits();
        let state = WorkerState {
            wasi: WasiCtxBuilder::new().build(),
            table: ResourceTable::new(),
            limiter: InstanceLimiter::new(limits.memory),
            exchange: None,
            worker: 0,
            step: OUTSIDE_STEP,
            exchange_error: None,
            deadline_tick: u64::MAX,
            clock: StepClock::default(),
        };
        let mut store = new_store(engine, state);
        let deadline = arm(&mut store, &limits);
        match timed(deadline, component.pre.instantiate_async(&mut store)).await {
            Ok(_) => Ok(()),
            Err(e) => Err(instantiate_error(engine, &mut store, 0, &limits, e)),
        }
    }

    /// Starts a single worker (W=1) with its own exchange: for benchmarks
    /// and tools that drive a circuit directly, without storage.
    pub async fn standalone(
        engine: &SluiceEngine,
        component: &LoadedComponent,
        pipeline: &str,
    ) -> Result<Self> {
        let info = WorkerInfo {
            worker: 0,
            workers: 1,
            pipeline: pipeline.to_owned(),
            config: vec![],
        };
        Worker::start(engine, component, info, Some(Exchange::single()), false).await
    }

    /// Runs step `step` with host-typed events: `inputs[p]` are input port
    /// `p`'s events; returns each output port's events (ports the circuit
    /// left empty come back empty).
    pub async fn step_ports(
        &mut self,
        step: u64,
        time_ms: u64,
        inputs: Vec<Vec<sluice_core::Event>>,
    ) -> Result<Vec<Vec<sluice_core::Event>>> {
        let batches: Vec<Batch> = inputs
            .iter()
            .enumerate()
            .map(|(port, events)| pack_batch(port as u32, events))
            .collect();
        let mut out: Vec<Vec<sluice_core::Event>> = Vec::new();
        for batch in self.step(step, time_ms, &batches).await? {
            let port = batch.port as usize;
            if out.len() <= port {
                out.resize_with(port + 1, Vec::new);
            }
            let values =
                slices(&batch.values, &batch.ends, batch.weights.len()).ok_or_else(|| {
                    GuestError::Failed {
                        worker: self.index,
                        call: "step",
                        message: format!("returned a malformed batch for output port {port}"),
                    }
                })?;
            out[port].extend(values.into_iter().zip(&batch.weights).map(|(v, w)| {
                sluice_core::Event {
                    value: v.to_vec(),
                    weight: *w,
                }
            }));
        }
        Ok(out)
    }
}

/// A circuit's error as the host keeps it: bounded and escaped (the guest
/// chose the words).
fn guest_message(e: CircuitError) -> String {
    let (what, m) = match e {
        CircuitError::BadInput(m) => ("bad input: ", m),
        CircuitError::IncompatibleSnapshot(m) => ("incompatible snapshot: ", m),
        CircuitError::Protocol(m) => ("protocol error: ", m),
        CircuitError::Failed(m) => ("", m),
    };
    format!("{what}{}", sluice_core::text::guest_message(&m))
}

/// A store with the instance limits: the memory limiter; fuel handed to
/// the guest in slices of [`YIELD_FUEL`], so that a long call yields to
/// other tasks between slices (and [`timed`] can stop it at its deadline;
/// the slices add up to the call's fuel, so where it runs out does not
/// move); and the deadline checked after each host call.
fn new_store(engine: &SluiceEngine, state: WorkerState) -> Store<WorkerState> {
    let mut store = Store::new(engine.engine(), state);
    store.limiter(|s| &mut s.limiter);
    // wasmtime caps what one call may hand the host at 128 MiB by default,
    // which a worker's snapshot outgrows; the instance's memory limit is
    // the natural cap (a guest cannot hand over more than it holds).
    store.set_hostcall_fuel(engine.limits().memory);
    // Fuel is enabled on every engine `SluiceEngine` builds and the
    // interval is not zero, so this cannot fail.
    let _ = store.fuel_async_yield_interval(Some(YIELD_FUEL));
    // A host call burns no fuel, so a guest looping over slow ones (a
    // large `get-random-bytes`) would not yield: its deadline is also
    // checked each time a host call or libcall returns to it.
    store.call_hook(|cx, hook| {
        if matches!(hook, CallHook::ReturningFromHost) && ticks() > cx.data().deadline_tick {
            return Err(wasmtime::Error::new(DeadlinePassed));
        }
        Ok(())
    });
    store
}

/// How much fuel a guest burns between two yields to the executor: about
/// 5–20 ms of guest code on current CPUs. It sets how often a long call
/// lets other tasks run and how late past its deadline a spinning guest is
/// stopped.
pub const YIELD_FUEL: u64 = 10_000_000;

/// The guest's call did not finish within the call's wall-clock deadline.
#[derive(Debug)]
struct DeadlinePassed;

impl std::fmt::Display for DeadlinePassed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("wall-clock deadline exceeded")
    }
}

impl std::error::Error for DeadlinePassed {}

/// Runs `call`, a call into the guest, under `deadline` (I6): at each of
/// its yields (every [`YIELD_FUEL`] of fuel, or a wait in a host call) past
/// the deadline the call is dropped, which unwinds the guest's stack, and
/// fails with [`DeadlinePassed`]; the store's call hook (see `new_store`)
/// checks it after each host call too. Wall-clock deadlines used to be
/// epoch checks compiled into every loop of the guest, which cost about
/// 9 % of a run's instructions; fuel is checked there anyway.
async fn timed<T>(
    deadline: Instant,
    call: impl Future<Output = wasmtime::Result<T>>,
) -> wasmtime::Result<T> {
    let mut call = std::pin::pin!(call);
    std::future::poll_fn(|cx| match call.as_mut().poll(cx) {
        Poll::Pending if Instant::now() > deadline => {
            Poll::Ready(Err(wasmtime::Error::new(DeadlinePassed)))
        }
        other => other,
    })
    .await
}

/// A failed instantiation: a full instance pool is a capacity error, not a
/// fault of the guest.
fn instantiate_error(
    engine: &SluiceEngine,
    store: &mut Store<WorkerState>,
    worker: u32,
    limits: &Limits,
    e: wasmtime::Error,
) -> Error {
    if let Some(limit) = engine.pool_size()
        && format!("{e:#}").contains("maximum concurrent")
    {
        return Error::PoolExhausted { limit };
    }
    classify(store, worker, "instantiate", limits, e)
}

/// Resets fuel before a call into the guest and returns the call's
/// wall-clock deadline, which [`timed`] enforces at the call's yields and
/// the store's call hook, by [`ticks`], after each host call.
fn arm(store: &mut Store<WorkerState>, limits: &Limits) -> Instant {
    // Fuel is enabled on every engine `SluiceEngine` builds, so this cannot fail.
    let _ = store.set_fuel(limits.fuel_per_call);
    let s = store.data_mut();
    s.exchange_error = None;
    // The tick after which a host call returning to the guest fails it.
    let ticks_allowed = limits.deadline.as_millis() / TICK.as_millis() + 1;
    s.deadline_tick = ticks().saturating_add(u64::try_from(ticks_allowed).unwrap_or(u64::MAX));
    // A limit too large to add to now is no limit: a year stands for it.
    let now = Instant::now();
    now.checked_add(limits.deadline)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// Turns a failed call into the error that names its cause.
fn classify(
    store: &mut Store<WorkerState>,
    worker: u32,
    call: &'static str,
    limits: &Limits,
    e: wasmtime::Error,
) -> Error {
    let s = store.data_mut();
    let guest = if let Some(requested) = s.limiter.refused.take() {
        GuestError::MemoryExceeded {
            worker,
            call,
            requested,
            limit: limits.memory,
        }
    } else if e.downcast_ref::<DeadlinePassed>().is_some() {
        GuestError::DeadlineExceeded {
            worker,
            call,
            deadline: limits.deadline,
        }
    } else if let Some(source) = s.exchange_error.take() {
        GuestError::Exchange {
            worker,
            call,
            source,
        }
    } else {
        match e.downcast_ref::<Trap>() {
            Some(Trap::OutOfFuel) => GuestError::FuelExhausted {
                worker,
                call,
                limit: limits.fuel_per_call,
            },
            // A trap's text names the guest's functions: bounded too.
            _ => GuestError::Trap {
                worker,
                call,
                trap: sluice_core::text::guest_message(&format!("{e:#}")),
            },
        }
    };
    guest.into()
}
