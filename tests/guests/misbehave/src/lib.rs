//! A circuit for the host's failure tests. Input port `in` takes strings and
//! echoes them to `out`, except:
//! - `"trap"` panics (a trap);
//! - `"spin"` loops forever (stopped by fuel or the deadline);
//! - `"hostspin"` loops forever over 1 MiB WASI random reads, host calls
//!   that burn almost no fuel (stopped by the deadline);
//! - `"grow"` allocates until the memory limit stops it;
//! - values starting with `"nondet"` get a suffix from a counter kept in a
//!   static, outside the snapshot: a replay after a restore differs;
//! - values starting with `"clock"` get `@` and the WASI wall clock in ms;
//! - values starting with `"random"` get `#` and a WASI random `u64`;
//! - values starting with `"sleepy"` sleep 1 ms at a time until 5 ms have
//!   passed on the monotonic clock, and get `#` and how often they slept.
//!
//! - a step whose input holds `"shout"` fails with a 1 MiB message full of
//!   newlines, markup and terminal escapes (the host must bound and escape
//!   what a guest says);
//! - a step whose input holds `"garbage"` returns `{oops` on `out`, which
//!   is not JSON, and one whose input holds `"malformed"` returns a batch
//!   whose value ends past its bytes.
//!
//! Then it counts the echoed values per first letter (so W > 1 exercises the
//! exchange) on output `letters`.

use sluice_guest::Circuit;
use std::sync::atomic::{AtomicU64, Ordering};

static CALLS: AtomicU64 = AtomicU64::new(0);

fn misbehave(s: &String) -> String {
    match s.as_str() {
        "trap" => panic!("the input asked this guest to trap"),
        "spin" => {
            let mut x = 0u64;
            loop {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        "hostspin" => loop {
            // One host call making 1 MiB, a few hundred fuel around it.
            #[cfg(target_arch = "wasm32")]
            std::hint::black_box(wasip2::random::random::get_random_bytes(1 << 20));
            #[cfg(not(target_arch = "wasm32"))]
            std::hint::black_box(0);
        },
        "grow" => {
            let mut hog: Vec<Vec<u8>> = Vec::new();
            loop {
                hog.push(vec![1u8; 16 << 20]);
                std::hint::black_box(&hog);
            }
        }
        _ if s.starts_with("nondet") => format!("{s}#{}", CALLS.fetch_add(1, Ordering::Relaxed)),
        _ if s.starts_with("clock") => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            format!("{s}@{}", now.as_millis())
        }
        _ if s.starts_with("sleepy") => {
            let start = std::time::Instant::now();
            let mut naps = 0;
            while start.elapsed() < std::time::Duration::from_millis(5) {
                std::thread::sleep(std::time::Duration::from_millis(1));
                naps += 1;
            }
            format!("{s}#{naps}")
        }
        _ if s.starts_with("random") => {
            let mut bytes = [0u8; 8];
            getrandom::fill(&mut bytes).expect("WASI random");
            format!("{s}#{}", u64::from_le_bytes(bytes))
        }
        _ => s.clone(),
    }
}

/// Builds the circuit.
pub fn build(c: &mut Circuit) {
    let echoed = c.input::<String>("in").map(misbehave);
    echoed.output("out");
    echoed
        .count_by(|s| s.chars().next().unwrap_or(' '))
        .output("letters");
}

#[cfg(target_arch = "wasm32")]
mod component {
    use sluice_guest::sys::{
        self, Batch, CircuitError, CircuitInfo, Guest, ShardState, StateSnapshot, WorkerInfo,
    };

    struct Misbehave;

    impl Guest for Misbehave {
        fn describe() -> CircuitInfo {
            sys::describe(super::build)
        }
        fn init(info: WorkerInfo) -> Result<(), CircuitError> {
            sys::init(super::build, info)
        }
        fn step(inputs: Vec<Batch>) -> Result<Vec<Batch>, CircuitError> {
            let holds = |wanted: &[u8]| {
                inputs.iter().any(|b| {
                    let mut start = 0;
                    b.ends.iter().any(|&end| {
                        let value = b.values.get(start..end as usize);
                        start = end as usize;
                        value == Some(wanted)
                    })
                })
            };
            if holds(b"\"garbage\"") || holds(b"\"malformed\"") {
                let end = if holds(b"\"garbage\"") { 5 } else { 99 };
                return Ok(vec![Batch {
                    port: 0,
                    values: b"{oops".to_vec(),
                    ends: vec![end],
                    weights: vec![1],
                }]);
            }
            let shout = holds(b"\"shout\"");
            if shout {
                return Err(CircuitError::Failed(format!(
                    "<script>alert(1)</script>\n\u{1b}[31m{}",
                    "shout ".repeat(180_000)
                )));
            }
            sys::step(inputs)
        }
        fn snapshot(changed_only: bool) -> Result<StateSnapshot, CircuitError> {
            sys::snapshot(changed_only)
        }
        fn restore(pieces: Vec<ShardState>) -> Result<(), CircuitError> {
            sys::restore(pieces)
        }
        fn upgrade(pieces: Vec<ShardState>, start_empty: Vec<String>) -> Result<(), CircuitError> {
            sys::upgrade(pieces, start_empty)
        }
        fn export_shards(shards: Vec<u32>) -> Result<Vec<ShardState>, CircuitError> {
            sys::export_shards(shards)
        }
        fn set_workers(workers: u32) {
            sys::set_workers(workers)
        }
    }

    sys::bindings::__sluice_export!(Misbehave);
}
