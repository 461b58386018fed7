//! What a guest may observe besides its input, made deterministic (I4).
//!
//! WASI clocks report the step's time, taken from its step record (so a
//! replay sees the time the original run saw). Within a call, time moves
//! only when the guest waits: a timer (`subscribe-duration`,
//! `subscribe-instant`) is ready at once and moves the guest's clocks to its
//! deadline, so a guest that sleeps or polls a timer sees the same times, and
//! polls as often, in every replay. WASI random numbers come from ChaCha20
//! (a specified algorithm, so a dependency upgrade cannot change them)
//! seeded by (pipeline, worker, step). The seed that std's `HashMap` uses is
//! fixed per (pipeline, worker). A guest that reads the clock or random
//! numbers therefore produces the same output when a step is replayed.
//! Threads are not compiled into the engine; NaNs are canonicalized and
//! relaxed SIMD is deterministic (see the engine).

use chacha20::ChaCha20Rng;
use rand::{SeedableRng, TryRng};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasmtime::component::{HasData, Resource, ResourceTable};
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock};

/// A seed for one purpose of one worker of one pipeline at one step.
pub fn seed(pipeline: &str, worker: u32, step: u64, purpose: &str) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for part in [
        pipeline.as_bytes(),
        &worker.to_le_bytes(),
        &step.to_le_bytes(),
        purpose.as_bytes(),
    ] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.digest()
}

/// The clock a worker's guest sees: the current step's time, plus whatever
/// the guest has waited for in the current call. The wall clock and the
/// monotonic clock show the same instant (the monotonic one in ns since the
/// epoch); the coordinator keeps step times non-decreasing.
#[derive(Clone, Default)]
pub struct StepClock {
    ms: Arc<AtomicU64>,
    /// Nanoseconds the guest waited for in this call.
    waited: Arc<AtomicU64>,
}

impl StepClock {
    /// Sets the time the guest sees (and forgets what it waited for).
    pub fn set(&self, ms: u64) {
        self.ms.store(ms, Ordering::Relaxed);
        self.waited.store(0, Ordering::Relaxed);
    }

    /// The instant the guest sees, in ns since the epoch.
    fn now_ns(&self) -> u64 {
        self.ms
            .load(Ordering::Relaxed)
            .saturating_mul(1_000_000)
            .saturating_add(self.waited.load(Ordering::Relaxed))
    }

    /// Moves the guest's time forward to `instant` (ns), never back.
    fn advance_to(&self, instant: u64) {
        let base = self.ms.load(Ordering::Relaxed).saturating_mul(1_000_000);
        self.waited
            .fetch_max(instant.saturating_sub(base), Ordering::Relaxed);
    }
}

impl HostWallClock for StepClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        Duration::from_nanos(self.now_ns())
    }
}

impl HostMonotonicClock for StepClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        self.now_ns()
    }
}

/// A timer of the guest: ready at once, it moves the guest's clocks to its
/// deadline when the guest sees it ready.
struct StepTimer {
    clock: StepClock,
    deadline: u64,
}

#[async_trait::async_trait]
impl Pollable for StepTimer {
    async fn ready(&mut self) {
        self.clock.advance_to(self.deadline);
    }
}

/// The guest's view of `wasi:clocks/monotonic-clock`: the step's time, and
/// timers that follow it (see [`StepClock`]).
pub struct StepClockView<'a> {
    /// The worker's clock.
    pub clock: &'a StepClock,
    /// Where the timers' resources go.
    pub table: &'a mut ResourceTable,
}

/// Selects [`StepClockView`] as the host of `wasi:clocks/monotonic-clock`.
pub struct StepClocks;

impl HasData for StepClocks {
    type Data<'a> = StepClockView<'a>;
}

impl StepClockView<'_> {
    fn timer(&mut self, deadline: u64) -> wasmtime::Result<Resource<DynPollable>> {
        let timer = self.table.push(StepTimer {
            clock: self.clock.clone(),
            deadline,
        })?;
        subscribe(self.table, timer)
    }
}

impl monotonic_clock::Host for StepClockView<'_> {
    fn now(&mut self) -> wasmtime::Result<monotonic_clock::Instant> {
        Ok(self.clock.now_ns())
    }

    fn resolution(&mut self) -> wasmtime::Result<monotonic_clock::Duration> {
        Ok(1)
    }

    fn subscribe_instant(
        &mut self,
        when: monotonic_clock::Instant,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        self.timer(when)
    }

    fn subscribe_duration(
        &mut self,
        duration: monotonic_clock::Duration,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        let deadline = self.clock.now_ns().saturating_add(duration);
        self.timer(deadline)
    }
}

/// A random generator the host reseeds at every step: ChaCha20, whose
/// output is fixed by its specification (rand's `StdRng` may change with a
/// release, and a replay must draw the numbers the original run drew).
#[derive(Clone)]
pub struct StepRandom {
    rng: Arc<Mutex<ChaCha20Rng>>,
}

impl Default for StepRandom {
    fn default() -> Self {
        StepRandom {
            rng: Arc::new(Mutex::new(ChaCha20Rng::seed_from_u64(0))),
        }
    }
}

impl StepRandom {
    /// Restarts the sequence from `seed`.
    pub fn reseed(&self, seed: u64) {
        *self.rng.lock().unwrap_or_else(|p| p.into_inner()) = ChaCha20Rng::seed_from_u64(seed);
    }
}

impl TryRng for StepRandom {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        self.rng
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .try_next_u32()
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        self.rng
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .try_next_u64()
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        self.rng
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .try_fill_bytes(dst)
    }
}

/// Everything a worker reseeds or resets before a call into its guest.
#[derive(Clone, Default)]
pub struct GuestEnvironment {
    /// The clocks.
    pub clock: StepClock,
    /// `wasi:random/random`.
    pub secure: StepRandom,
    /// `wasi:random/insecure`.
    pub insecure: StepRandom,
}

impl GuestEnvironment {
    /// Prepares the environment of worker `worker` for `step` at `time_ms`.
    pub fn enter_step(&self, pipeline: &str, worker: u32, step: u64, time_ms: u64) {
        self.clock.set(time_ms);
        self.secure.reseed(seed(pipeline, worker, step, "random"));
        self.insecure
            .reseed(seed(pipeline, worker, step, "insecure-random"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_random_numbers_are_chacha20s() {
        // ChaCha20 (RFC 8439 block function, rand_core's seed_from_u64
        // expansion): a change of algorithm or expansion changes this.
        let mut r = StepRandom::default();
        r.reseed(seed("p", 0, 7, "random"));
        let first = r.try_next_u64().unwrap();
        let mut again = StepRandom::default();
        again.reseed(seed("p", 0, 7, "random"));
        assert_eq!(again.try_next_u64().unwrap(), first);
        let mut rng = ChaCha20Rng::seed_from_u64(seed("p", 0, 7, "random"));
        assert_eq!(rng.try_next_u64().unwrap(), first);
    }

    #[test]
    fn time_moves_only_as_the_guest_waits() {
        let clock = StepClock::default();
        clock.set(1_000);
        assert_eq!(clock.now_ns(), 1_000_000_000);
        clock.advance_to(1_000_000_000 + 5_000);
        assert_eq!(clock.now_ns(), 1_000_005_000);
        clock.advance_to(1_000_000_000 + 1_000);
        assert_eq!(clock.now_ns(), 1_000_005_000, "never back");
        clock.set(2_000);
        assert_eq!(
            clock.now_ns(),
            2_000_000_000,
            "a new call starts at its step's time"
        );
    }
}
