//! # sluice-core: the vocabulary every Sluice layer shares
//!
//! Plain data and pure functions, no I/O: what an event, a frontier, a step
//! and a pipeline's shape are; the hash a replay is checked against (I4);
//! the one rule for names; how events are written as JSON lines; and the
//! named crash points the protocol is tested at.
//!
//! ```
//! use sluice_core::{Event, wire};
//! let event = wire::parse_input_line(r#"{"delete": "x"}"#).unwrap().unwrap();
//! assert_eq!(event, Event { value: b"\"x\"".to_vec(), weight: -1 });
//! ```

/// Input records that are not events: the policy, dead-letter logs and
/// their entries.
pub mod bad_records;
/// Errors in a pipeline's configuration.
pub mod config;
/// Named crash points of the step protocol (`SLUICE_CRASH_AT`).
pub mod crash;
/// Two versions of a circuit compared before an upgrade.
pub mod diff;
/// Events and frontiers.
pub mod event;
/// Layouts: which worker owns each shard and reads each partition.
pub mod layout;
/// The one rule for names users give (tenants, components, pipelines, ports).
pub mod name;
/// A circuit's ports and a pipeline's shape.
pub mod shape;
/// Steps: records, output entries, commits, positions and the output hash.
pub mod step;
/// Outside text (guest messages) bounded and escaped for keeping and logging.
pub mod text;
/// Events as JSON lines: input lines, output lines.
pub mod wire;

pub use bad_records::{BadRecordPolicy, DeadLetter, dead_letter_input, dead_letter_log};
pub use config::ConfigError;
pub use diff::CircuitDiff;
pub use event::{Event, Frontier, PartitionId};
pub use layout::{Layout, SHARDS, shard_of};
pub use name::{InvalidName, validate_name};
pub use shape::{CircuitPorts, InputLog, OperatorInfo, PipelineShape};
pub use step::{
    OutputEntry, OutputPosition, PositionedEvent, StepCommit, StepLimits, StepRecord, hash_outputs,
    hash_ports,
};
