//! Two versions of a circuit compared before one replaces the other
//! (issue #31): operator by operator — kept, new, removed, changed,
//! migrated — and port by port, with what an upgrade does to each.
//!
//! Operators are matched as the SDKs' `upgrade` matches a snapshot's
//! states: by identity, or by another identity a new operator answers to
//! (`aliases`: its default identity when named since, or one `formerly`
//! gave it). An operator's state goes over as it is only where the kind
//! and the state fingerprint are equal too.

use crate::shape::{CircuitPorts, OperatorInfo};
use serde::{Deserialize, Serialize};
use std::fmt;

/// What an upgrade does with one operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Same identity, kind and fingerprint: its state is carried over.
    Kept,
    /// Same identity, another fingerprint the new version migrates from:
    /// its state is carried over through the migration.
    Migrated,
    /// Same identity, another kind or fingerprint: the upgrade is refused
    /// unless it is started empty.
    Changed,
    /// Named to start empty (changed or not): its state is dropped.
    StartsEmpty,
    /// Only in the new version: it starts empty.
    New,
    /// Only in the old version: its state is dropped.
    Removed,
    /// Any operator of the new version, in an upgrade that rebuilds
    /// (`--rebuild`): its state is computed anew from all of the
    /// pipeline's input.
    Rebuilt,
}

impl Change {
    /// What the upgrade does, in words.
    pub fn action(self) -> &'static str {
        match self {
            Change::Kept => "state carried over",
            Change::Migrated => "state carried over through the new version's migration",
            Change::Changed => {
                "refused: its state's shape changed (start it empty, or keep its kind and \
                 state types)"
            }
            Change::StartsEmpty => "its state is dropped: it starts empty",
            Change::New => "starts empty",
            Change::Removed => "its state is dropped",
            Change::Rebuilt => "rebuilt from the pipeline's input",
        }
    }
}

/// One operator in a [`CircuitDiff`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorDiff {
    /// Its identity (the new version's, where it has one).
    pub id: String,
    /// What the upgrade does with it.
    pub change: Change,
    /// The same, in words.
    pub action: String,
    /// As the old version describes it.
    pub old: Option<OperatorInfo>,
    /// As the new version describes it.
    pub new: Option<OperatorInfo>,
}

/// Ports only one of the two versions has.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortsDiff {
    /// Input ports only the new version has.
    pub inputs_added: Vec<String>,
    /// Input ports only the old version has.
    pub inputs_removed: Vec<String>,
    /// Output ports only the new version has.
    pub outputs_added: Vec<String>,
    /// Output ports only the old version has.
    pub outputs_removed: Vec<String>,
}

/// Two versions of a circuit compared, as `sluice diff` and
/// `POST /pipelines/{name}/diff` show them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CircuitDiff {
    /// Every stateful operator of either version: the new version's in its
    /// build order, then those only the old one has.
    pub operators: Vec<OperatorDiff>,
    /// Ports added or removed.
    pub ports: PortsDiff,
    /// The snapshot versions, old and new: where they differ, the new
    /// version declares the old state unreadable and the upgrade is
    /// refused whole.
    pub snapshot_versions: (u32, u32),
    /// Whether the upgrade would be accepted: the same snapshot version,
    /// and no operator `changed`.
    pub accepted: bool,
}

impl CircuitDiff {
    /// Compares `old` with `new`, matching operators as the SDKs'
    /// `upgrade` does: an old operator's state goes to the new operator of
    /// the same identity; else, if no new operator has it, to the one that
    /// answers to it under another identity (`aliases`) whose own identity
    /// the old version does not have (there, it takes its own state).
    /// The operators named in `start_empty` start empty whatever their old
    /// state. Fails naming a `start_empty` entry that is no operator of the
    /// new version (a typo would otherwise go unnoticed until the upgrade),
    /// or a new operator that would take two old operators' states.
    pub fn between(
        old: &CircuitPorts,
        new: &CircuitPorts,
        start_empty: &[String],
    ) -> Result<CircuitDiff, String> {
        if let Some(name) = start_empty
            .iter()
            .find(|name| !new.operators.iter().any(|n| n.id == **name))
        {
            return Err(format!(
                "start-empty names `{name}`, which is not an operator of the new version"
            ));
        }
        let old_ids: Vec<&str> = old.operators.iter().map(|o| o.id.as_str()).collect();
        let target = |o: &OperatorInfo| {
            new.operators.iter().position(|n| n.id == o.id).or_else(|| {
                new.operators
                    .iter()
                    .position(|n| n.answers_to(&o.id) && !old_ids.contains(&n.id.as_str()))
            })
        };
        // Which old operator each new one takes the state of: one at most.
        let mut source: Vec<Option<usize>> = vec![None; new.operators.len()];
        let mut removed = Vec::new();
        for (i, o) in old.operators.iter().enumerate() {
            match target(o) {
                None => removed.push(o),
                Some(t) => {
                    if let Some(j) = source[t] {
                        return Err(format!(
                            "the new version's `{}` answers to both `{}` and `{}` of the old \
                             one: give it one of them (`named` or `formerly`)",
                            new.operators[t].id, old.operators[j].id, o.id
                        ));
                    }
                    source[t] = Some(i);
                }
            }
        }
        let mut operators = Vec::new();
        for (n, found) in new.operators.iter().zip(&source) {
            let change = match found {
                None => Change::New,
                Some(_) if start_empty.contains(&n.id) => Change::StartsEmpty,
                Some(i) => {
                    let o = &old.operators[*i];
                    if o.kind == n.kind && o.fingerprint == n.fingerprint {
                        Change::Kept
                    } else if n.migrates_from.contains(&o.fingerprint) {
                        Change::Migrated
                    } else {
                        Change::Changed
                    }
                }
            };
            operators.push(OperatorDiff {
                id: n.id.clone(),
                change,
                action: change.action().to_owned(),
                old: found.map(|i| old.operators[i].clone()),
                new: Some(n.clone()),
            });
        }
        for o in removed {
            operators.push(OperatorDiff {
                id: o.id.clone(),
                change: Change::Removed,
                action: Change::Removed.action().to_owned(),
                old: Some(o.clone()),
                new: None,
            });
        }
        let only = |a: &[String], b: &[String]| -> Vec<String> {
            a.iter().filter(|p| !b.contains(p)).cloned().collect()
        };
        let accepted = old.snapshot_version == new.snapshot_version
            && !operators.iter().any(|d| d.change == Change::Changed);
        Ok(CircuitDiff {
            operators,
            ports: PortsDiff {
                inputs_added: only(&new.inputs, &old.inputs),
                inputs_removed: only(&old.inputs, &new.inputs),
                outputs_added: only(&new.outputs, &old.outputs),
                outputs_removed: only(&old.outputs, &new.outputs),
            },
            snapshot_versions: (old.snapshot_version, new.snapshot_version),
            accepted,
        })
    }

    /// The diff of an upgrade that rebuilds (`--rebuild`): every operator
    /// of the new version is rebuilt from the pipeline's input, whatever
    /// else it would have been (accepted, unless the snapshot versions
    /// differ).
    pub fn rebuilding(mut self) -> CircuitDiff {
        for d in &mut self.operators {
            if d.change != Change::Removed {
                d.change = Change::Rebuilt;
                d.action = Change::Rebuilt.action().to_owned();
            }
        }
        self.accepted = self.snapshot_versions.0 == self.snapshot_versions.1;
        self
    }

    /// The operators that make the upgrade refused.
    pub fn refused(&self) -> impl Iterator<Item = &OperatorDiff> {
        self.operators
            .iter()
            .filter(|d| d.change == Change::Changed)
    }
}

/// The diff for people: a line per operator, then the ports, then the
/// verdict.
impl fmt::Display for CircuitDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self.operators.iter().map(|d| d.id.len()).max().unwrap_or(0);
        if self.operators.is_empty() {
            writeln!(f, "no stateful operators in either version")?;
        }
        for d in &self.operators {
            let change = serde_json::to_string(&d.change).unwrap_or_default();
            let change = change.trim_matches('"');
            let kind = d.new.as_ref().or(d.old.as_ref()).map_or("", |o| &o.kind);
            let was = match &d.old {
                Some(o) if o.id != d.id => format!(" (the old version's `{}`)", o.id),
                _ => String::new(),
            };
            writeln!(
                f,
                "{:<width$}  {change:<12} {kind}: {}{was}",
                d.id, d.action
            )?;
            if let (Change::Changed | Change::StartsEmpty, Some(o), Some(n)) =
                (d.change, &d.old, &d.new)
            {
                writeln!(f, "{:<width$}    was {} ({})", "", o.kind, o.state_shape)?;
                writeln!(f, "{:<width$}    now {} ({})", "", n.kind, n.state_shape)?;
            }
        }
        if let Some(d) = self
            .operators
            .iter()
            .find(|d| d.change == Change::Removed && d.id.contains('#'))
        {
            writeln!(
                f,
                "(an unnamed operator is known by its place among those of its kind: to carry \
                 `{}`'s state, give its new version `.formerly(\"{}\")`)",
                d.id, d.id
            )?;
        }
        let p = &self.ports;
        for (what, ports) in [
            ("input ports added (read from their start)", &p.inputs_added),
            ("input ports removed (no longer read)", &p.inputs_removed),
            ("output ports added", &p.outputs_added),
            (
                "output ports removed (no longer written)",
                &p.outputs_removed,
            ),
        ] {
            if !ports.is_empty() {
                writeln!(f, "{what}: {}", ports.join(", "))?;
            }
        }
        let (old, new) = self.snapshot_versions;
        if self.accepted {
            write!(f, "the upgrade would be accepted")
        } else if old != new {
            write!(
                f,
                "the upgrade would be refused: the new version's snapshot version is {new}, \
                 the running one's {old} (a circuit bumps it to declare its old state \
                 unreadable; keep it, and name or start empty the operators that changed)"
            )
        } else {
            let names: Vec<&str> = self.refused().map(|d| d.id.as_str()).collect();
            write!(
                f,
                "the upgrade would be refused: {} changed (start {} empty with --start-empty {})",
                names.join(", "),
                if names.len() == 1 { "it" } else { "them" },
                names.join(",")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(id: &str, kind: &str, fingerprint: u64) -> OperatorInfo {
        OperatorInfo {
            id: id.into(),
            aliases: Vec::new(),
            kind: kind.into(),
            fingerprint,
            state_shape: format!("shape{fingerprint}"),
            migrates_from: Vec::new(),
        }
    }

    fn circuit(inputs: &[&str], outputs: &[&str], operators: Vec<OperatorInfo>) -> CircuitPorts {
        CircuitPorts {
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            snapshot_version: 1,
            operators,
        }
    }

    fn changes(d: &CircuitDiff) -> Vec<(&str, Change)> {
        d.operators
            .iter()
            .map(|o| (o.id.as_str(), o.change))
            .collect()
    }

    #[test]
    fn every_kind_of_change_is_told_apart() {
        let mut renamed = op("words", "keyed_sum", 1);
        renamed.aliases.push("keyed_sum#0/1".into());
        let mut migrating = op("totals", "keyed_sum", 9);
        migrating.migrates_from.push(5);
        let old = circuit(
            &["lines"],
            &["counts", "gone"],
            vec![
                op("keyed_sum#0/1", "keyed_sum", 1),
                op("lengths", "keyed_sum", 2),
                op("totals", "keyed_sum", 5),
                op("dropped", "join", 3),
            ],
        );
        let new = circuit(
            &["lines", "extra"],
            &["counts"],
            vec![
                renamed,
                op("lengths", "keyed_sum", 4),
                migrating,
                op("fresh", "top_k", 7),
            ],
        );
        let d = CircuitDiff::between(&old, &new, &[]).unwrap();
        assert_eq!(
            changes(&d),
            [
                ("words", Change::Kept),
                ("lengths", Change::Changed),
                ("totals", Change::Migrated),
                ("fresh", Change::New),
                ("dropped", Change::Removed),
            ]
        );
        assert!(!d.accepted);
        assert_eq!(d.ports.inputs_added, ["extra"]);
        assert_eq!(d.ports.outputs_removed, ["gone"]);
        let text = d.to_string();
        assert!(
            text.contains("refused: lengths changed") && text.contains("--start-empty lengths"),
            "{text}"
        );

        // Rebuilding: every operator of the new version is rebuilt, the
        // upgrade accepted.
        let rebuilt = CircuitDiff::between(&old, &new, &[]).unwrap().rebuilding();
        assert_eq!(
            changes(&rebuilt),
            [
                ("words", Change::Rebuilt),
                ("lengths", Change::Rebuilt),
                ("totals", Change::Rebuilt),
                ("fresh", Change::Rebuilt),
                ("dropped", Change::Removed),
            ]
        );
        assert!(rebuilt.accepted);

        let d = CircuitDiff::between(&old, &new, &["lengths".into()]).unwrap();
        assert!(d.accepted);
        assert_eq!(d.operators[1].change, Change::StartsEmpty);

        let mut bumped = new.clone();
        bumped.snapshot_version = 2;
        let d = CircuitDiff::between(&old, &bumped, &["lengths".into()]).unwrap();
        assert!(!d.accepted);
        assert!(d.to_string().contains("snapshot version is 2"), "{d}");
    }

    #[test]
    fn start_empty_names_an_operator_of_the_new_version() {
        let old = circuit(&["in"], &["out"], vec![op("a", "keyed_sum", 1)]);
        let new = circuit(&["in"], &["out"], vec![op("a", "keyed_sum", 1)]);
        let d = CircuitDiff::between(&old, &new, &["a".into()]).unwrap();
        assert_eq!(changes(&d), [("a", Change::StartsEmpty)]);
        let e = CircuitDiff::between(&old, &new, &["b".into()]).unwrap_err();
        assert!(
            e.contains("`b`, which is not an operator of the new version"),
            "{e}"
        );
    }

    #[test]
    fn an_alias_never_takes_a_second_state() {
        // Two counts built the other way round: the named one's default
        // is the other's old identity, but it takes its own state.
        let old = circuit(
            &["in"],
            &["out"],
            vec![
                op("keyed_sum#0/2", "keyed_sum", 1),
                op("lengths", "keyed_sum", 2),
            ],
        );
        let mut lengths = op("lengths", "keyed_sum", 2);
        lengths.aliases.push("keyed_sum#0/2".into());
        let new = circuit(
            &["in"],
            &["out"],
            vec![lengths.clone(), op("keyed_sum#1/2", "keyed_sum", 1)],
        );
        let d = CircuitDiff::between(&old, &new, &[]).unwrap();
        assert_eq!(
            changes(&d),
            [
                ("lengths", Change::Kept),
                ("keyed_sum#1/2", Change::New),
                ("keyed_sum#0/2", Change::Removed),
            ]
        );
        // One new operator answering to two old ones is refused.
        let mut both = op("counts", "keyed_sum", 1);
        both.aliases = vec!["a".into(), "b".into()];
        let old = circuit(
            &["in"],
            &["out"],
            vec![op("a", "keyed_sum", 1), op("b", "keyed_sum", 1)],
        );
        let new = circuit(&["in"], &["out"], vec![both]);
        let e = CircuitDiff::between(&old, &new, &[]).unwrap_err();
        assert!(e.contains("answers to both `a` and `b`"), "{e}");
    }
}
