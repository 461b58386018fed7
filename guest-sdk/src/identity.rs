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
    /// Other identities its state is taken under from older snapshots:
    /// its default identity (`kind#n/total`) when it has a name, and those
    /// [`Stream::formerly`](crate::Stream::formerly) gave it.
    pub aliases: Vec<String>,
    /// What it is (`keyed_sum`, `join`, `top_k_by`, …).
    pub kind: String,
    /// The Rust types its state holds, as the compiler names them.
    pub state_types: String,
    /// A hash of `kind` and `state_types`: two versions of a circuit carry
    /// an operator's state from one to the other only where it is equal.
    pub fingerprint: u64,
    /// The fingerprints of earlier shapes of its state it takes through a
    /// migration ([`Stream::migrates_keys_from`](crate::Stream::migrates_keys_from)).
    pub migrates_from: Vec<u64>,
}

impl OperatorInfo {
    pub(crate) fn new(id: &str, aliases: Vec<String>, kind: &str, state_types: String) -> Self {
        OperatorInfo {
            id: id.to_owned(),
            aliases,
            kind: kind.to_owned(),
            fingerprint: fingerprint(kind, &state_types),
            state_types,
            migrates_from: Vec::new(),
        }
    }
}

/// `state_types` of an operator whose state version
/// ([`Stream::state_version`](crate::Stream::state_version)) is `version`:
/// as they are for version 0 (so that fingerprints from before versions
/// stay as they were), else with the version after them.
pub(crate) fn versioned(state_types: String, version: u32) -> String {
    if version == 0 {
        state_types
    } else {
        format!("{state_types}; state version {version}")
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

/// Gives every stateful operator (in build order, with its kind) its
/// default identity, `kind#n/total` — the n-th of the `total` operators
/// of its kind, named ones counted (so naming one leaves the others'
/// defaults as they were), and `total` in it so that adding or removing an
/// operator of a kind renames all of them instead of shifting their states
/// to their neighbours — and that identity when it has no name; records an
/// error for a name used twice.
pub(crate) fn resolve<'a>(
    operators: impl Iterator<Item = (&'static str, &'a mut String, &'a mut String)>,
    errors: &mut Vec<String>,
) {
    let operators: Vec<_> = operators.collect();
    let mut totals: BTreeMap<&str, usize> = BTreeMap::new();
    for (kind, _, _) in &operators {
        *totals.entry(kind).or_default() += 1;
    }
    let mut per_kind: BTreeMap<&str, usize> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for (kind, id, default_id) in operators {
        let n = per_kind.entry(kind).or_default();
        *default_id = format!("{kind}#{n}/{}", totals[kind]);
        *n += 1;
        if id.is_empty() {
            id.clone_from(default_id);
        }
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
        counts_of(&words);
    }

    fn run(c: &mut CircuitInstance, words: &[&str]) -> Vec<Vec<crate::exchange::RawEvent>> {
        let input: Vec<(String, i64)> = words.iter().map(|w| (w.to_string(), 1)).collect();
        c.step(vec![events(&input)], &mut LocalExchange).unwrap()
    }

    /// The pieces of [`counts`] (without the `map`) after a step of `words`.
    fn counted(words: &[&str]) -> crate::Pieces {
        let mut old = CircuitInstance::build(|c: &mut Circuit| counts(c, false)).unwrap();
        run(&mut old, words);
        old.snapshot().unwrap()
    }

    #[test]
    fn defaults_count_per_kind_and_names_keep_the_others() {
        let c = CircuitInstance::build(|c: &mut Circuit| counts(c, false)).unwrap();
        let ids: Vec<String> = c.operators().into_iter().map(|o| o.id).collect();
        assert_eq!(ids, ["keyed_sum#0/2", "keyed_sum#1/2"]);
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
        assert_eq!(ids, ["words", "keyed_sum#1/2"]);
    }

    #[test]
    fn a_stateless_operator_added_before_keeps_the_state() {
        let pieces = counted(&["a", "a", "bb"]);
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
        let pieces = counted(&["a"]);
        let mut new = CircuitInstance::build(|c: &mut Circuit| {
            let words = c.input::<String>("words");
            words.count_by(|w| w.clone()).output("counts");
            words.count_by(|w| w.len() as u32).output("lengths");
        })
        .unwrap();
        let err = new.restore(&pieces).unwrap_err().to_string();
        assert!(
            err.contains("operator `keyed_sum#1/2` (keyed_sum)") && err.contains("u32"),
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
        assert!(err.contains("`keyed_sum#0/2` (keyed_sum) in the snapshot is not in the circuit"));
    }

    #[test]
    fn an_operator_of_the_same_kind_added_renames_instead_of_shifting() {
        let pieces = counted(&["a"]);
        // A third count of the same types before the two: by place alone
        // the word counts' state would go to it.
        let mut more = CircuitInstance::build(|c: &mut Circuit| {
            let words = c.input::<String>("words");
            words.count_by(|w| format!("#{w}")).output("tags");
            counts_of(&words);
        })
        .unwrap();
        let err = more.restore(&pieces).unwrap_err().to_string();
        assert!(
            err.contains("`keyed_sum#0/2`") && err.contains("renames the others"),
            "{err}"
        );
        // Named, the two keep their state (under their defaults, as the
        // snapshot knows them), and the new one starts empty.
        let mut named = CircuitInstance::build(|c: &mut Circuit| {
            let words = c.input::<String>("words");
            words
                .count_by(|w| w.clone())
                .named("words")
                .output("counts");
            words
                .count_by(|w| w.len() as u64)
                .named("lengths")
                .output("lengths");
        })
        .unwrap();
        named.restore(&pieces).unwrap();
        let out = run(&mut named, &["a"]);
        let words: Vec<((String, i64), i64)> = crate::operator::testing::decode(&out[0]);
        assert_eq!(words, [(("a".into(), 1), -1), (("a".into(), 2), 1)]);
    }

    /// The two counts of [`counts`], on `words`.
    fn counts_of(words: &crate::Stream<String>) {
        words.count_by(|w| w.clone()).output("counts");
        words.count_by(|w| w.len() as u64).output("lengths");
    }

    #[test]
    fn a_count_does_not_restore_as_a_sum() {
        let mut old = CircuitInstance::build(|c: &mut Circuit| {
            c.input::<(String, i64)>("sales")
                .count_by(|(r, _)| r.clone())
                .output("out");
        })
        .unwrap();
        let input = [(("eu".to_string(), 5i64), 1i64)];
        old.step(vec![events(&input)], &mut LocalExchange).unwrap();
        let pieces = old.snapshot().unwrap();
        let mut sums = CircuitInstance::build(|c: &mut Circuit| {
            c.input::<(String, i64)>("sales")
                .sum_by(|(r, _)| r.clone(), |(_, n)| *n)
                .output("out");
        })
        .unwrap();
        let err = sums.restore(&pieces).unwrap_err().to_string();
        assert!(err.contains("other types") && err.contains("sum:"), "{err}");
    }

    #[test]
    fn pieces_of_operators_known_by_index_still_restore() {
        // The same states as an SDK before identities wrote them (format
        // 2: node index, kind, state): the counts sit at nodes 1 and 3.
        type Named<'a> = (
            u32,
            u32,
            Vec<(&'a str, &'a str, u64, &'a serde_bytes::Bytes)>,
        );
        let pieces = counted(&["a"]);
        let indexed: Vec<(u32, Vec<u8>)> = pieces
            .iter()
            .map(|(shard, piece)| {
                let (_, version, states): Named = postcard::from_bytes(piece).unwrap();
                let states: Vec<(u32, &str, &serde_bytes::Bytes)> = states
                    .into_iter()
                    .map(|(id, kind, _, state)| {
                        (if id == "keyed_sum#0/2" { 1 } else { 3 }, kind, state)
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
        assert!(err.contains("no single stateful operator"), "{err}");
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
