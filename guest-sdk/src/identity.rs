//! Operator identity: what a stateful operator is known by in checkpoints,
//! so that a changed circuit can take its state back (the first part of
//! issue #31, changing a running circuit).
//!
//! Every stateful operator has an identity — the name
//! [`Stream::named`](crate::Stream::named) gave it, else `kind#n`, the
//! n-th stateful operator of its kind in build order — and a state
//! fingerprint: a hash of its kind and the Rust types its state holds.
//! A snapshot piece records both per operator; a restore hands each state
//! to the operator of that identity wherever it now sits in the graph,
//! and refuses it, naming the operator, when the kind or the fingerprint
//! differ. The fingerprint is of the types' names as the compiler writes
//! them (`std::any::type_name`): moving a type to another module changes
//! it, a field added to a struct does not (the state then fails to decode,
//! also naming the operator).

use std::collections::{BTreeMap, BTreeSet};

/// A stateful operator as a circuit describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorInfo {
    /// Its identity in checkpoints.
    pub id: String,
    /// What it is (`keyed_sum`, `join`, `top_k_by`, …).
    pub kind: String,
    /// The Rust types its state holds, as the compiler names them.
    pub state_types: String,
    /// A hash of `kind` and `state_types`: two versions of a circuit carry
    /// an operator's state from one to the other only where it is equal.
    pub fingerprint: u64,
}

impl OperatorInfo {
    pub(crate) fn new(id: &str, kind: &str, state_types: String) -> Self {
        OperatorInfo {
            id: id.to_owned(),
            kind: kind.to_owned(),
            fingerprint: fingerprint(kind, &state_types),
            state_types,
        }
    }
}

/// The state fingerprint of an operator of `kind` whose state holds
/// `state_types`.
pub(crate) fn fingerprint(kind: &str, state_types: &str) -> u64 {
    sluice_shard::hash(format!("{kind}({state_types})").as_bytes())
}

/// The type names of a state holding `A` and `B`, for
/// [`Operator::state_types`](crate::circuit::Operator::state_types).
pub(crate) fn types2<A, B>() -> String {
    format!(
        "{}, {}",
        std::any::type_name::<A>(),
        std::any::type_name::<B>()
    )
}

/// Gives every stateful operator without a name (in build order, with its
/// kind) its default identity, `kind#n`, counting the named ones too (so
/// naming one operator leaves the others' identities as they were), and
/// records an error for a name used twice.
pub(crate) fn resolve<'a>(
    operators: impl Iterator<Item = (&'static str, &'a mut String)>,
    errors: &mut Vec<String>,
) {
    let mut per_kind: BTreeMap<&str, usize> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for (kind, id) in operators {
        let n = per_kind.entry(kind).or_default();
        if id.is_empty() {
            *id = format!("{kind}#{n}");
        }
        *n += 1;
        if !seen.insert(id.clone()) {
            errors.push(format!("two stateful operators are named \"{id}\""));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::exchange::LocalExchange;
    use crate::operator::testing::events;
    use crate::{Circuit, CircuitInstance};

    /// Word counts, with a `map` before them or not, and a second count.
    fn counts(c: &mut Circuit, lowercase: bool) {
        let words = c.input::<String>("words");
        let words = if lowercase {
            words.map(|w| w.to_lowercase())
        } else {
            words
        };
        words.count_by(|w| w.clone()).output("counts");
        words.count_by(|w| w.len() as u64).output("lengths");
    }

    fn run(c: &mut CircuitInstance, words: &[&str]) -> Vec<Vec<crate::exchange::RawEvent>> {
        let input: Vec<(String, i64)> = words.iter().map(|w| (w.to_string(), 1)).collect();
        c.step(vec![events(&input)], &mut LocalExchange).unwrap()
    }

    #[test]
    fn defaults_count_per_kind_and_names_keep_the_others() {
        let c = CircuitInstance::build(|c: &mut Circuit| counts(c, false)).unwrap();
        let ids: Vec<String> = c.operators().into_iter().map(|o| o.id).collect();
        assert_eq!(ids, ["keyed_sum#0", "keyed_sum#1"]);
        let c = CircuitInstance::build(|c: &mut Circuit| {
            let words = c.input::<String>("words");
            words
                .count_by(|w| w.clone())
                .named("words")
                .output("counts");
            words.count_by(|w| w.len() as u64).output("lengths");
        })
        .unwrap();
        let ids: Vec<String> = c.operators().into_iter().map(|o| o.id).collect();
        assert_eq!(ids, ["words", "keyed_sum#1"]);
    }

    #[test]
    fn a_stateless_operator_added_before_keeps_the_state() {
        let mut old = CircuitInstance::build(|c: &mut Circuit| counts(c, false)).unwrap();
        run(&mut old, &["a", "a", "bb"]);
        let pieces = old.snapshot().unwrap();
        // The upgraded circuit lowercases first: every node index after
        // the input moved, the identities did not.
        let mut new = CircuitInstance::build(|c: &mut Circuit| counts(c, true)).unwrap();
        new.restore(&pieces).unwrap();
        let out = run(&mut new, &["A"]);
        let words: Vec<((String, i64), i64)> = crate::operator::testing::decode(&out[0]);
        assert_eq!(words, [(("a".into(), 2), -1), (("a".into(), 3), 1)]);
        let lengths: Vec<((u64, i64), i64)> = crate::operator::testing::decode(&out[1]);
        assert_eq!(lengths, [((1, 2), -1), ((1, 3), 1)]);
    }

    #[test]
    fn other_state_types_are_refused_naming_the_operator() {
        let mut old = CircuitInstance::build(|c: &mut Circuit| counts(c, false)).unwrap();
        run(&mut old, &["a"]);
        let pieces = old.snapshot().unwrap();
        let mut new = CircuitInstance::build(|c: &mut Circuit| {
            let words = c.input::<String>("words");
            words.count_by(|w| w.clone()).output("counts");
            words.count_by(|w| w.len() as u32).output("lengths");
        })
        .unwrap();
        let err = new.restore(&pieces).unwrap_err().to_string();
        assert!(
            err.contains("operator `keyed_sum#1` (keyed_sum)") && err.contains("u32"),
            "{err}"
        );
        // An operator the snapshot has and the circuit lost is named too.
        let mut fewer = CircuitInstance::build(|c: &mut Circuit| {
            c.input::<String>("words")
                .count_by(|w| w.clone())
                .output("counts");
        })
        .unwrap();
        let err = fewer.restore(&pieces).unwrap_err().to_string();
        assert!(err.contains("`keyed_sum#1` (keyed_sum) in the snapshot is not in the circuit"));
    }

    #[test]
    fn pieces_of_operators_known_by_index_still_restore() {
        let mut old = CircuitInstance::build(|c: &mut Circuit| counts(c, false)).unwrap();
        run(&mut old, &["a"]);
        // The same states as an SDK before identities wrote them (format
        // 2: node index, kind, state): the counts sit at nodes 1 and 3.
        type Named<'a> = (
            u32,
            u32,
            Vec<(&'a str, &'a str, u64, &'a serde_bytes::Bytes)>,
        );
        let pieces = old.snapshot().unwrap();
        let indexed: Vec<(u32, Vec<u8>)> = pieces
            .iter()
            .map(|(shard, piece)| {
                let (_, version, states): Named = postcard::from_bytes(piece).unwrap();
                let states: Vec<(u32, &str, &serde_bytes::Bytes)> = states
                    .into_iter()
                    .map(|(id, kind, _, state)| {
                        (if id == "keyed_sum#0" { 1 } else { 3 }, kind, state)
                    })
                    .collect();
                (
                    *shard,
                    postcard::to_allocvec(&(2u32, version, states)).unwrap(),
                )
            })
            .collect();
        let mut new = CircuitInstance::build(|c: &mut Circuit| counts(c, false)).unwrap();
        new.restore(&indexed).unwrap();
        let out = run(&mut new, &["a"]);
        let words: Vec<((String, i64), i64)> = crate::operator::testing::decode(&out[0]);
        assert_eq!(words, [(("a".into(), 1), -1), (("a".into(), 2), 1)]);
        // By index, a node that moved is refused, as before.
        let mut moved = CircuitInstance::build(|c: &mut Circuit| counts(c, true)).unwrap();
        assert!(moved.restore(&indexed).is_err());
    }

    #[test]
    fn names_must_be_unique_and_name_a_stateful_operator() {
        let dup = CircuitInstance::build(|c: &mut Circuit| {
            let words = c.input::<String>("words");
            words.count_by(|w| w.clone()).named("n").output("a");
            words.distinct().named("n").output("b");
        });
        assert!(dup.err().unwrap().to_string().contains("named \"n\""));
        let stateless = CircuitInstance::build(|c: &mut Circuit| {
            c.input::<String>("words")
                .map(|w| w.clone())
                .named("m")
                .output("a");
        });
        let err = stateless.err().unwrap().to_string();
        assert!(err.contains("no stateful operator"), "{err}");
        let twice = CircuitInstance::build(|c: &mut Circuit| {
            c.input::<String>("words")
                .distinct()
                .named("a")
                .named("b")
                .output("a");
        });
        assert!(
            twice
                .err()
                .unwrap()
                .to_string()
                .contains("named \"a\" already")
        );
        // A name reaches back through stateless operators after it.
        let through = CircuitInstance::build(|c: &mut Circuit| {
            c.input::<String>("words")
                .distinct()
                .map(|w| w.len())
                .named("lengths")
                .output("a");
        })
        .unwrap();
        assert_eq!(through.operators()[0].id, "lengths");
    }
}
