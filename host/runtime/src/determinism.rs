//! What a guest may observe besides its input, made deterministic (I4).
//!
//! WASI clocks report the step's time, taken from its step record (so a
//! replay sees the time the original run saw), and WASI random numbers come
//! from a generator seeded by (pipeline, worker, step). The seed that std's
//! `HashMap` uses is fixed per (pipeline, worker). A guest that reads the
//! clock or random numbers therefore produces the same output when a step is
//! replayed. Threads are not compiled into the engine; NaNs are canonicalized
//! (see the engine).

use rand::rngs::StdRng;
use rand::{SeedableRng, TryRng};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
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

/// The clock a worker's guest sees: the current step's time, frozen for the
/// step. Wall clock in ms resolution; the monotonic clock is the same
/// instant in ns (the coordinator keeps step times non-decreasing).
#[derive(Clone, Default)]
pub struct StepClock {
    ms: Arc<AtomicU64>,
}

impl StepClock {
    /// Sets the time the guest sees.
    pub fn set(&self, ms: u64) {
        self.ms.store(ms, Ordering::Relaxed);
    }
}

impl HostWallClock for StepClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }

    fn now(&self) -> Duration {
        Duration::from_millis(self.ms.load(Ordering::Relaxed))
    }
}

impl HostMonotonicClock for StepClock {
    fn resolution(&self) -> u64 {
        1_000_000
    }

    fn now(&self) -> u64 {
        self.ms.load(Ordering::Relaxed).saturating_mul(1_000_000)
    }
}

/// A random generator the host reseeds at every step.
#[derive(Clone)]
pub struct StepRandom {
    rng: Arc<Mutex<StdRng>>,
}

impl Default for StepRandom {
    fn default() -> Self {
        StepRandom {
            rng: Arc::new(Mutex::new(StdRng::seed_from_u64(0))),
        }
    }
}

impl StepRandom {
    /// Restarts the sequence from `seed`.
    pub fn reseed(&self, seed: u64) {
        *self.rng.lock().unwrap_or_else(|p| p.into_inner()) = StdRng::seed_from_u64(seed);
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
