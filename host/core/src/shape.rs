//! What a circuit declares ([`CircuitPorts`]) and the fixed shape of a
//! pipeline running it ([`PipelineShape`]): its input logs with their
//! partitions, its output logs, W and the snapshot version. One type for the
//! shape, from storage's invariant checks to the coordinator and the
//! pipeline's stored metadata.

use crate::config::ConfigError;
use crate::event::PartitionId;
use crate::name::validate_name;
use serde::{Deserialize, Serialize};

/// What a circuit reports through `describe`: its ports and snapshot format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CircuitPorts {
    /// Input port names, in port order.
    pub inputs: Vec<String>,
    /// Output port names, in port order.
    pub outputs: Vec<String>,
    /// Version of the snapshot format the circuit writes and reads.
    pub snapshot_version: u32,
    /// Its stateful operators, in build order (what `sluice diff`
    /// compares).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operators: Vec<OperatorInfo>,
}

/// A stateful operator as a circuit describes it (WIT `operator-info`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorInfo {
    /// What its state is known by in snapshots.
    pub id: String,
    /// Other identities its state may be stored under in older snapshots
    /// (its default identity, when it has a name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    /// What it is (`keyed_sum`, `join`, …).
    pub kind: String,
    /// A hash of its kind and state shape.
    pub fingerprint: u64,
    /// Its state's shape in the circuit's own terms, for people.
    pub state_shape: String,
    /// Fingerprints of earlier versions whose state it migrates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migrates_from: Vec<u64>,
}

impl OperatorInfo {
    /// Whether a snapshot's state of operator `id` may be this one's: its
    /// identity or one of its aliases.
    pub fn answers_to(&self, id: &str) -> bool {
        self.id == id || self.aliases.iter().any(|a| a == id)
    }
}

impl CircuitPorts {
    /// Checks every port name against the naming rule; names are distinct
    /// (inputs and outputs together: each is a log) and none starts with
    /// `sluice-` (reserved for the host's own logs, e.g. `sluice-steps`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut seen = std::collections::BTreeSet::new();
        for name in self.inputs.iter().chain(&self.outputs) {
            validate_name("port", name)?;
            if name.starts_with("sluice-") {
                return Err(ConfigError::Invalid(format!(
                    "port {name:?}: names starting with `sluice-` are the host's"
                )));
            }
            if !seen.insert(name.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "port {name:?} is declared twice (ports share one namespace: each is a log)"
                )));
            }
        }
        Ok(())
    }

    /// The index of input port `name`, or an error listing the real ones.
    pub fn input(&self, name: &str) -> Result<usize, ConfigError> {
        port_index("input port", &self.inputs, name)
    }

    /// The index of output port `name`, or an error listing the real ones.
    pub fn output(&self, name: &str) -> Result<usize, ConfigError> {
        port_index("output port", &self.outputs, name)
    }
}

fn port_index(kind: &'static str, names: &[String], name: &str) -> Result<usize, ConfigError> {
    names
        .iter()
        .position(|n| n == name)
        .ok_or_else(|| ConfigError::UnknownPort {
            kind,
            name: name.to_owned(),
            known: names.to_vec(),
        })
}

/// One input log of a pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputLog {
    /// The input port (and log) name.
    pub name: String,
    /// Its number of partitions.
    pub partitions: u32,
}

/// The fixed shape of a pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineShape {
    /// Input logs, in port order.
    pub inputs: Vec<InputLog>,
    /// Output log names, in port order.
    pub outputs: Vec<String>,
    /// The number of workers W the pipeline was created with (its first
    /// layout's); the current W is its newest layout's.
    pub workers: u32,
    /// The circuit's snapshot version, recorded with checkpoints.
    pub snapshot_version: u32,
}

impl PipelineShape {
    /// The shape of a pipeline of `workers` workers running a circuit with
    /// `ports`, its input `i` having `partitions(i)` partitions.
    pub fn new(
        ports: &CircuitPorts,
        workers: u32,
        mut partitions: impl FnMut(&str) -> u32,
    ) -> Result<Self, ConfigError> {
        if workers == 0 {
            return Err(ConfigError::NoWorkers);
        }
        ports.validate()?;
        Ok(PipelineShape {
            inputs: ports
                .inputs
                .iter()
                .map(|name| InputLog {
                    name: name.clone(),
                    partitions: partitions(name).max(1),
                })
                .collect(),
            outputs: ports.outputs.clone(),
            workers,
            snapshot_version: ports.snapshot_version,
        })
    }

    /// Input log names, in port order.
    pub fn input_names(&self) -> Vec<String> {
        self.inputs.iter().map(|i| i.name.clone()).collect()
    }

    /// The name of input `index`, if it exists.
    pub fn input_name(&self, index: u32) -> Option<&str> {
        self.inputs.get(index as usize).map(|i| i.name.as_str())
    }

    /// Every input partition with its log name.
    pub fn partitions(&self) -> impl Iterator<Item = (PartitionId, &str)> {
        self.inputs.iter().enumerate().flat_map(|(i, input)| {
            (0..input.partitions).map(move |p| {
                (
                    PartitionId {
                        input: i as u32,
                        partition: p,
                    },
                    input.name.as_str(),
                )
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports() -> CircuitPorts {
        CircuitPorts {
            inputs: vec!["a".into(), "b".into()],
            outputs: vec!["out".into()],
            snapshot_version: 3,
            operators: Vec::new(),
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(matches!(
            PipelineShape::new(&ports(), 0, |_| 1),
            Err(ConfigError::NoWorkers)
        ));
        let mut p = ports();
        p.outputs.push("Bad.Name".into());
        assert!(matches!(
            PipelineShape::new(&p, 1, |_| 1),
            Err(ConfigError::InvalidName(_))
        ));
        let e = ports().input("c").unwrap_err().to_string();
        assert!(
            e.contains("unknown input port `c`; the circuit has [a, b]"),
            "{e}"
        );
    }
}
