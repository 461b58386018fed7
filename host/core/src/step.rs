//! Steps: the durable record of a step, the output entries it commits, and
//! the positions consumers resume from.

use crate::event::{Event, Frontier};
use crate::layout::Layout;
use serde::{Deserialize, Serialize};

/// The durable record of a step: its number, every worker's frontier after
/// it (the division of input into steps), the time the guests saw, the epoch
/// of the host that committed it, and the hash of every worker's output,
/// against which a replay is checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Step number, from 0.
    pub step: u64,
    /// The fencing epoch of the host that committed the step: a commit from
    /// an epoch older than the log's current one is refused.
    pub epoch: u64,
    /// Wall-clock time of the step (ms since the epoch) as the guests' WASI
    /// clocks report it, in this step and in every replay of it (I4).
    pub time_ms: u64,
    /// Frontier of each worker after this step, indexed by worker.
    pub frontiers: Vec<Frontier>,
    /// Hash of each worker's output in this step, indexed by worker
    /// ([`hash_outputs`]); empty for a divided step
    /// ([`is_division`](Self::is_division)), whose hashes are in its
    /// workers' done records.
    pub output_hashes: Vec<u128>,
    /// The deterministic limits the step ran under, which its replays get
    /// too (a replay under a lower fuel or memory limit could fail where the
    /// original run did not).
    pub limits: StepLimits,
    /// The [`chain_hash`](Self::chain_hash) of the previous step's record
    /// (0 for step 0): the records form a chain, so a step rewritten in
    /// place breaks the link of the next one.
    pub prev: u128,
    /// The layout this step runs under, when it differs from the previous
    /// step's (a layout change commits with the first step under it); for
    /// the others `None`: the previous step's layout (step 0's without one:
    /// [`Layout::initial`]).
    pub layout: Option<Layout>,
}

impl StepRecord {
    /// Whether this is the record of a *divided* step: committed first,
    /// with no hashes, each worker's output hash then in the done record
    /// its holder commits with the worker's output (a step across hosts,
    /// where each host commits its own workers' output).
    pub fn is_division(&self) -> bool {
        self.output_hashes.is_empty()
    }

    /// The hash of everything in the record (including its own link), which
    /// the next record holds in `prev`.
    pub fn chain_hash(&self) -> u128 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for n in [self.step, self.epoch, self.time_ms] {
            h.update(&n.to_le_bytes());
        }
        h.update(&(self.frontiers.len() as u64).to_le_bytes());
        for f in &self.frontiers {
            h.update(&(f.len() as u64).to_le_bytes());
            for (id, offset) in f {
                h.update(&id.input.to_le_bytes());
                h.update(&id.partition.to_le_bytes());
                h.update(&offset.to_le_bytes());
            }
        }
        h.update(&(self.output_hashes.len() as u64).to_le_bytes());
        for o in &self.output_hashes {
            h.update(&o.to_le_bytes());
        }
        h.update(&self.limits.fuel_per_call.to_le_bytes());
        h.update(&self.limits.memory.to_le_bytes());
        h.update(&self.prev.to_le_bytes());
        match &self.layout {
            Some(layout) => h.update(&layout.digest().to_le_bytes()),
            None => h.update(&[0]),
        }
        h.digest128()
    }
}

/// The deterministic per-call limits of a step's instances.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepLimits {
    /// Fuel per call into the guest.
    pub fuel_per_call: u64,
    /// Linear memory per instance, bytes.
    pub memory: u64,
}

/// One worker's output on one output port in one step: the unit an output log
/// holds exactly one of per (step, worker).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputEntry {
    /// The step that produced it.
    pub step: u64,
    /// The worker that produced it.
    pub worker: u32,
    /// The input frontier this output covers (the worker's frontier after
    /// the step).
    pub frontier: Frontier,
    /// The deltas, consolidated by the circuit.
    pub events: Vec<Event>,
}

/// Everything one step commits, atomically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepCommit {
    /// The step record (division and hashes).
    pub record: StepRecord,
    /// Per output log name, one entry per worker (indexed by worker).
    pub outputs: Vec<(String, Vec<OutputEntry>)>,
    /// The input records the step skipped as not events, written by the
    /// host (not the guest): per dead-letter log
    /// ([`dead_letter_log`](crate::bad_records::dead_letter_log)), an
    /// entry for each worker that skipped any (in worker order), tagged
    /// like its outputs. Not in the output hash: they follow from the
    /// division's input alone.
    pub dead_letters: Vec<(String, Vec<OutputEntry>)>,
}

impl StepCommit {
    /// A divided step's division: its record alone (each worker's share
    /// commits its outputs and dead letters, with its done record).
    pub fn division(record: StepRecord) -> StepCommit {
        StepCommit {
            record,
            outputs: Vec::new(),
            dead_letters: Vec::new(),
        }
    }

    /// Every log the commit writes to, with its entries: the outputs, then
    /// the dead-letter logs.
    pub fn logs(&self) -> impl Iterator<Item = (&str, &[OutputEntry])> {
        self.outputs
            .iter()
            .chain(&self.dead_letters)
            .map(|(name, entries)| (name.as_str(), entries.as_slice()))
    }
}

/// Where an output event sits in its output log: entries are ordered by
/// step, then worker, and events by their index within the entry. A consumer
/// remembers the last position it processed and resumes after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OutputPosition {
    /// The step that produced the event.
    pub step: u64,
    /// The worker that produced it.
    pub worker: u32,
    /// Its index within that worker's entry for the step.
    pub index: u32,
}

impl OutputPosition {
    /// Parses `STEP:WORKER:INDEX`, the form positions take on the command
    /// line, in HTTP queries and as server-sent event ids.
    pub fn parse(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        match parts.as_slice() {
            [step, worker, index] => Ok(OutputPosition {
                step: step.parse().map_err(|e| format!("step in {s:?}: {e}"))?,
                worker: worker
                    .parse()
                    .map_err(|e| format!("worker in {s:?}: {e}"))?,
                index: index.parse().map_err(|e| format!("index in {s:?}: {e}"))?,
            }),
            _ => Err(format!("expected STEP:WORKER:INDEX, got {s:?}")),
        }
    }
}

impl std::fmt::Display for OutputPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.step, self.worker, self.index)
    }
}

/// An output event with its position and the input frontier its entry
/// covers (every input event below the frontier has had its effect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PositionedEvent {
    /// Where it sits.
    pub position: OutputPosition,
    /// The frontier of its entry.
    pub frontier: Frontier,
    /// The event.
    pub event: Event,
}

/// The hash of one worker's output of one step (events per output port),
/// recorded at commit and compared on replay (I4) and by the audit.
///
/// It sees each port's events as a multiset: the order a guest returns
/// them in does not count (a circuit may emit in `HashMap` order, which a
/// restored instance iterates differently), any difference in content —
/// an event more or less, another value or weight, another port — does.
/// Each event's 128-bit hash is summed (wrapping) per port, a commutative
/// combination; the count and the port index are hashed in.
pub fn hash_outputs(ports: &[Vec<Event>]) -> u128 {
    hash_ports(ports.iter().map(Vec::as_slice))
}

/// [`hash_outputs`] of ports given one by one (in port order), for callers
/// that hold them elsewhere than in one slice.
pub fn hash_ports<'a>(ports: impl IntoIterator<Item = &'a [Event]>) -> u128 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    // An event's hash is XXH3-128 of its weight (8 bytes, little endian)
    // followed by its value, hashed in one call over a reused buffer: a
    // streaming state per event costs more than the copy.
    let mut bytes = Vec::new();
    for (port, events) in ports.into_iter().enumerate() {
        let mut sum = 0u128;
        for e in events {
            bytes.clear();
            bytes.extend_from_slice(&e.weight.to_le_bytes());
            bytes.extend_from_slice(&e.value);
            sum = sum.wrapping_add(xxhash_rust::xxh3::xxh3_128(&bytes));
        }
        h.update(&(port as u64).to_le_bytes());
        h.update(&(events.len() as u64).to_le_bytes());
        h.update(&sum.to_le_bytes());
    }
    h.digest128()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_print_and_parse_back() {
        let p = OutputPosition {
            step: 12,
            worker: 1,
            index: 7,
        };
        assert_eq!(p.to_string(), "12:1:7");
        assert_eq!(OutputPosition::parse("12:1:7"), Ok(p));
        assert!(OutputPosition::parse("12:1").is_err());
        assert!(OutputPosition::parse("a:1:7").unwrap_err().contains("step"));
    }

    #[test]
    fn the_output_hash_sees_content_ports_and_weights_but_not_order() {
        let e = |v: &str, w| Event {
            value: v.as_bytes().to_vec(),
            weight: w,
        };
        let base = hash_outputs(&[vec![e("1", 1), e("2", 1)]]);
        assert_eq!(base, hash_outputs(&[vec![e("2", 1), e("1", 1)]]), "order");
        assert_ne!(base, hash_outputs(&[vec![e("1", 1), e("2", -1)]]), "weight");
        assert_ne!(base, hash_outputs(&[vec![e("1", 1), e("3", 1)]]), "value");
        assert_ne!(base, hash_outputs(&[vec![e("1", 1)]]), "an event less");
        assert_ne!(
            base,
            hash_outputs(&[vec![e("1", 1), e("2", 1), e("2", 1)]]),
            "an event more"
        );
        assert_ne!(
            base,
            hash_outputs(&[vec![], vec![e("1", 1), e("2", 1)]]),
            "port"
        );
        assert_ne!(
            hash_outputs(&[vec![e("1", 1), e("1", -1)]]),
            hash_outputs(&[vec![]]),
            "a multiset, not a consolidated Z-set"
        );
        assert_ne!(
            hash_outputs(&[vec![e("12", 1)]]),
            hash_outputs(&[vec![e("1", 1), e("2", 1)]]),
            "event boundaries"
        );
    }

    /// The hash is recorded in step records and done records, and a replay
    /// by a later version compares against it: it must not change. This is
    /// its definition, computed with a streaming state per event.
    #[test]
    fn the_output_hash_is_the_recorded_definition() {
        let e = |v: &str, w| Event {
            value: v.as_bytes().to_vec(),
            weight: w,
        };
        // Values of every length class XXH3 treats apart (with the 8 bytes
        // of the weight: up to 16, 128, 240 bytes, and longer).
        let ports = vec![
            vec![e("{\"a\":1}", 1), e(&"x".repeat(300), -2)],
            vec![],
            vec![e("", 7), e(&"y".repeat(60), 1), e(&"z".repeat(200), 3)],
            vec![e(&"w".repeat(5000), -1)],
        ];
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for (port, events) in ports.iter().enumerate() {
            let mut sum = 0u128;
            for ev in events {
                let mut eh = xxhash_rust::xxh3::Xxh3::new();
                eh.update(&ev.weight.to_le_bytes());
                eh.update(&ev.value);
                sum = sum.wrapping_add(eh.digest128());
            }
            h.update(&(port as u64).to_le_bytes());
            h.update(&(events.len() as u64).to_le_bytes());
            h.update(&sum.to_le_bytes());
        }
        assert_eq!(hash_outputs(&ports), h.digest128());
    }
}
