//! Taking the state of another version of a circuit (an upgrade, issue
//! #31): the pieces of the old version's snapshot go, operator by operator,
//! to the operators of the same identity; what changed starts empty only
//! where the host says so, what the new version lost is dropped, what it
//! gained starts empty.

use crate::circuit::{Data, ENVELOPE_FORMAT, Header, Named};
use crate::{CircuitInstance, Error, Result, Stream, codec};
use std::collections::{BTreeMap, BTreeSet};

/// A migration of a keyed operator's state to new keys: each old key,
/// decoded as the old version's key type, becomes a key of the new one
/// (several may become one: their states add up). Made by
/// [`Stream::migrates_keys_from`]; handed to the operator boxed as
/// `Box<dyn Rekey<K>>`.
pub(crate) trait Rekey<K> {
    /// The old key type's name, as the old version's fingerprint has it.
    fn old_key_type(&self) -> &'static str;
    /// The state version the old version had.
    fn old_version(&self) -> u32;
    /// The new key of the old key encoded as `old`.
    fn rekey(&self, old: &[u8]) -> Result<K>;
}

/// A [`Rekey`] from keys of type `O` through a function.
struct RekeyFn<O, F> {
    from_version: u32,
    f: F,
    _old: std::marker::PhantomData<fn(O)>,
}

impl<O: Data, K, F: Fn(O) -> K> Rekey<K> for RekeyFn<O, F> {
    fn old_key_type(&self) -> &'static str {
        std::any::type_name::<O>()
    }

    fn old_version(&self) -> u32 {
        self.from_version
    }

    fn rekey(&self, old: &[u8]) -> Result<K> {
        let old: O = codec::from_bytes(old).map_err(|m| {
            Error::IncompatibleSnapshot(format!(
                "a key of the old state is no {}: {m}",
                std::any::type_name::<O>()
            ))
        })?;
        Ok((self.f)(old))
    }
}

impl<T: Data> Stream<T> {
    /// Declares that the meaning of the state of the stateful operator
    /// that produced this stream (as [`named`](Self::named) finds it)
    /// changed although its types did not, e.g. its keys are normalized
    /// differently now: version `version` (0 until bumped) is part of its
    /// state fingerprint, so an upgrade from a version of the circuit with
    /// another state version refuses the old state — unless the operator
    /// migrates it ([`migrates_keys_from`](Self::migrates_keys_from)) or
    /// the upgrade starts it empty.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// let instance = CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<String>("words")
    ///         .count_by(|w| w.to_lowercase())
    ///         .named("counts")
    ///         .state_version(1)
    ///         .output("counts");
    /// })
    /// .unwrap();
    /// assert!(instance.operators()[0].state_types.ends_with("state version 1"));
    /// ```
    pub fn state_version(&self, version: u32) -> Stream<T> {
        self.with_stateful(&format!("state_version({version})"), |node| {
            node.state_version = version;
            Ok(())
        })
    }
}

impl<K: Data, V: Data> Stream<(K, V)> {
    /// Gives the keyed sum that produced this stream (`count_by`,
    /// `sum_by`, `avg_by`) a migration of its state from the version of
    /// the circuit whose keys were of type `O` and whose state version
    /// ([`state_version`](Self::state_version)) was `from_version`: on an
    /// upgrade from that version, every old key becomes `rekey(old)` and
    /// keeps its accumulator; old keys that become one key add up. (Keys
    /// of the same type and state version need no migration: the state is
    /// carried as it is.) The diff before an upgrade says `migrated` for
    /// the operator.
    ///
    /// The migration is a function of the new version: it runs when the
    /// new version takes the old one's checkpoint, and again on every
    /// recovery from that checkpoint, so it must be deterministic. A key
    /// that does not decode as `O`, or a panic in `rekey`, fails the
    /// upgrade after other state may have been taken (the host then drops
    /// the instance). The old version's key type is known by its Rust path
    /// (`std::any::type_name`): a type of the circuit's own crate must keep
    /// its crate and module, or the old state is not recognized as `O`'s
    /// (refused as changed).
    /// A migration from the operator's own state types and version fails
    /// the build: it would never run.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// // Version 1 counted words as they came; version 2 counts them
    /// // lower-cased, and folds version 1's counts ("The" and "the")
    /// // together.
    /// let instance = CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<String>("words")
    ///         .count_by(|w| w.to_lowercase())
    ///         .named("counts")
    ///         .state_version(1)
    ///         .migrates_keys_from(0, |old: String| old.to_lowercase())
    ///         .output("counts");
    /// })
    /// .unwrap();
    /// assert_eq!(instance.operators()[0].migrates_from.len(), 1);
    /// ```
    pub fn migrates_keys_from<O: Data>(
        &self,
        from_version: u32,
        rekey: impl Fn(O) -> K + 'static,
    ) -> Stream<(K, V)> {
        let what = format!(
            "migrates_keys_from::<{}>({from_version})",
            std::any::type_name::<O>()
        );
        self.with_stateful(&what, |node| {
            let migration: Box<dyn Rekey<K>> = Box::new(RekeyFn {
                from_version,
                f: rekey,
                _old: std::marker::PhantomData,
            });
            node.op.set_migration(Box::new(migration))
        })
    }
}

/// What happens to one operator's state of the old version.
enum Fate {
    /// It goes to the node at this index.
    Kept(usize),
    /// It goes to the node at this index through the node's migration
    /// from the old state's fingerprint.
    Migrated(usize, u64),
    /// The new version has no operator of its identity, or starts it empty.
    Dropped,
}

impl CircuitInstance {
    /// Adds pieces written by [`snapshot`](Self::snapshot) of another
    /// version of this circuit: each operator's state goes to the operator
    /// of the same identity — or, for an identity no operator here has and
    /// this operator's own identity not in the pieces, to the operator
    /// that answers to it (its default identity, when named since, or one
    /// [`Stream::formerly`](crate::Stream::formerly) gave it) — if its kind
    /// and state fingerprint are the same. An operator whose fingerprint
    /// (or kind) changed is refused, naming it, unless `start_empty` names
    /// it; an operator `start_empty` names starts empty whatever its old
    /// state; an operator of the old version that this one lacks is
    /// dropped; one the pieces do not hold starts empty. Pieces of another
    /// snapshot version are refused, as by `restore`: bumping it is how a
    /// circuit says its old state is unreadable.
    ///
    /// Every piece is read, and every operator's fate decided, before any
    /// state is taken: an upgrade refused takes nothing. (A state that
    /// fails to decode fails the call part-way; the host then drops the
    /// instance.) Pieces written before operators had identities (formats
    /// 1 and 2) are refused: restore them with the circuit that wrote them
    /// and take a new snapshot first.
    pub fn upgrade(&mut self, pieces: &[(u32, Vec<u8>)], start_empty: &[String]) -> Result<()> {
        let nodes = &self.graph.nodes;
        let start_empty: BTreeSet<&str> = start_empty.iter().map(String::as_str).collect();
        if let Some(name) = start_empty
            .iter()
            .find(|name| !nodes.iter().any(|n| n.op.stateful() && n.id == **name))
        {
            return Err(Error::IncompatibleSnapshot(format!(
                "`{name}` is to start empty, but the circuit has no stateful operator \
                 of that identity"
            )));
        }
        let mut read = Vec::with_capacity(pieces.len());
        for (shard, piece) in pieces {
            read.push((*shard, read_named(*shard, piece, self.snapshot_version())?));
        }
        let old_ids: BTreeSet<&str> = read
            .iter()
            .flat_map(|(_, operators)| operators.iter().map(|(id, ..)| *id))
            .collect();
        // Which old identity each node takes: never two.
        let mut taken: BTreeMap<usize, &str> = BTreeMap::new();
        let mut plans = Vec::with_capacity(read.len());
        for (shard, operators) in read {
            let mut fates = Vec::with_capacity(operators.len());
            for (id, kind, fingerprint, _) in &operators {
                let target = self.target(id, &old_ids);
                let fate = self.fate(target, kind, *fingerprint, &start_empty)?;
                if let Some(node) = target
                    && let Some(other) = taken.insert(node, id)
                    && other != *id
                {
                    return Err(Error::IncompatibleSnapshot(format!(
                        "operator `{}` answers to both `{other}` and `{id}` of the snapshot: \
                         give it one of them (`named` or `formerly`)",
                        self.graph.nodes[node].id
                    )));
                }
                fates.push(fate);
            }
            plans.push((shard, operators, fates));
        }
        for (shard, operators, fates) in plans {
            for ((id, kind, _, bytes), fate) in operators.into_iter().zip(fates) {
                let taken = match fate {
                    Fate::Kept(node) => self.graph.nodes[node].op.restore(kind, shard, bytes),
                    Fate::Migrated(node, from) => {
                        self.graph.nodes[node].op.migrate(from, shard, bytes)
                    }
                    Fate::Dropped => continue,
                };
                taken.map_err(|e| match e {
                    Error::IncompatibleSnapshot(m) => {
                        Error::IncompatibleSnapshot(format!("operator `{id}`: {m}"))
                    }
                    e => e,
                })?;
            }
        }
        Ok(())
    }

    /// The node that takes the snapshot's operator `id`, if any: the one of
    /// that identity; else, if no node has it, the one answering to it
    /// under another identity whose own identity is not in the snapshot
    /// (`old_ids`: there, it takes its own state).
    pub(crate) fn target(&self, id: &str, old_ids: &BTreeSet<&str>) -> Option<usize> {
        let nodes = &self.graph.nodes;
        nodes
            .iter()
            .position(|n| n.op.stateful() && n.id == id)
            .or_else(|| {
                nodes.iter().position(|n| {
                    n.op.stateful() && n.answers_to(id) && !old_ids.contains(n.id.as_str())
                })
            })
    }

    /// Where the old version's state of an operator of `kind` and
    /// `fingerprint` goes, given the node that takes it
    /// ([`target`](Self::target)).
    fn fate(
        &self,
        target: Option<usize>,
        kind: &str,
        fingerprint: u64,
        start_empty: &BTreeSet<&str>,
    ) -> Result<Fate> {
        let Some(index) = target else {
            return Ok(Fate::Dropped);
        };
        let node = &self.graph.nodes[index];
        if start_empty.contains(node.id.as_str()) {
            return Ok(Fate::Dropped);
        }
        if node.op.reads(kind) && node.fingerprint == fingerprint {
            return Ok(Fate::Kept(index));
        }
        if kind == node.op.name() && node.op.migrates_from().contains(&fingerprint) {
            return Ok(Fate::Migrated(index, fingerprint));
        }
        Err(Error::IncompatibleSnapshot(format!(
            "operator `{}` changed: the snapshot holds a {kind} of other state than the \
             circuit's {} ({}); start it empty, keep its kind and state types, or give it \
             a migration from the old state",
            node.id,
            node.op.name(),
            node.state_types()
        )))
    }
}

/// The operators of a piece in the envelope format with identities.
fn read_named(shard: u32, piece: &[u8], snapshot_version: u32) -> Result<Named<'_>> {
    let unreadable =
        |e: postcard::Error| Error::IncompatibleSnapshot(format!("unreadable envelope: {e}"));
    let (header, rest): (Header, &[u8]) = postcard::take_from_bytes(piece).map_err(unreadable)?;
    if header.format != ENVELOPE_FORMAT {
        return Err(Error::IncompatibleSnapshot(format!(
            "a piece of shard {shard} is of envelope format {}, written before operators \
             had identities: an upgrade needs format {ENVELOPE_FORMAT} (restore it with the \
             circuit that wrote it and take a checkpoint first)",
            header.format
        )));
    }
    if header.snapshot_version != snapshot_version {
        return Err(Error::IncompatibleSnapshot(format!(
            "snapshot version {} but the circuit reads version {snapshot_version}: it \
             declares the old state unreadable",
            header.snapshot_version
        )));
    }
    postcard::from_bytes(rest).map_err(unreadable)
}

#[cfg(test)]
mod tests {
    use crate::exchange::LocalExchange;
    use crate::operator::testing::{decode, events};
    use crate::{Circuit, CircuitInstance, Pieces, Stream};

    fn run(c: &mut CircuitInstance, words: &[&str]) -> Vec<Vec<crate::exchange::RawEvent>> {
        let input: Vec<(String, i64)> = words.iter().map(|w| (w.to_string(), 1)).collect();
        c.step(vec![events(&input)], &mut LocalExchange).unwrap()
    }

    /// Word count, its aggregate named "counts".
    fn wordcount(c: &mut Circuit) -> Stream<String> {
        let words = c.input::<String>("words");
        words
            .count_by(|w| w.clone())
            .named("counts")
            .output("counts");
        words
    }

    /// [`wordcount`] and a count of word lengths named "lengths".
    fn with_lengths(c: &mut Circuit) {
        wordcount(c)
            .count_by(|w| w.len() as u64)
            .named("lengths")
            .output("lengths");
    }

    fn counted(words: &[&str]) -> Pieces {
        let mut old = CircuitInstance::build(|c: &mut Circuit| {
            wordcount(c);
        })
        .unwrap();
        run(&mut old, words);
        old.snapshot().unwrap()
    }

    #[test]
    fn a_kept_operator_carries_its_state_and_a_new_one_starts_empty() {
        let pieces = counted(&["a", "a", "b"]);
        let mut new = CircuitInstance::build(with_lengths).unwrap();
        new.upgrade(&pieces, &[]).unwrap();
        let out = run(&mut new, &["a"]);
        let counts: Vec<((String, i64), i64)> = decode(&out[0]);
        assert_eq!(counts, [(("a".into(), 2), -1), (("a".into(), 3), 1)]);
        let lengths: Vec<((u64, i64), i64)> = decode(&out[1]);
        assert_eq!(lengths, [((1, 1), 1)]);
    }

    #[test]
    fn a_removed_operator_is_dropped_where_restore_refuses_it() {
        let mut old = CircuitInstance::build(with_lengths).unwrap();
        run(&mut old, &["a", "bb"]);
        let pieces = old.snapshot().unwrap();
        let build = |c: &mut Circuit| {
            wordcount(c);
        };
        let mut fewer = CircuitInstance::build(build).unwrap();
        assert!(fewer.restore(&pieces).is_err());
        let mut fewer = CircuitInstance::build(build).unwrap();
        fewer.upgrade(&pieces, &[]).unwrap();
        let counts: Vec<((String, i64), i64)> = decode(&run(&mut fewer, &["bb"])[0]);
        assert_eq!(counts, [(("bb".into(), 1), -1), (("bb".into(), 2), 1)]);
    }

    #[test]
    fn a_changed_operator_is_refused_by_name_unless_it_starts_empty() {
        let pieces = counted(&["a"]);
        let build = |c: &mut Circuit| {
            c.input::<String>("words")
                .count_by(|w| w.len() as u32)
                .named("counts")
                .output("counts");
        };
        let mut new = CircuitInstance::build(build).unwrap();
        let err = new.upgrade(&pieces, &[]).unwrap_err().to_string();
        assert!(
            err.contains("operator `counts` changed") && err.contains("u32"),
            "{err}"
        );
        // Refused whole: nothing was taken, the instance still works empty.
        let out = run(&mut new, &["a"]);
        let counts: Vec<((u32, i64), i64)> = decode(&out[0]);
        assert_eq!(counts, [((1, 1), 1)]);

        let mut new = CircuitInstance::build(build).unwrap();
        new.upgrade(&pieces, &["counts".to_string()]).unwrap();
        let counts: Vec<((u32, i64), i64)> = decode(&run(&mut new, &["a"])[0]);
        assert_eq!(counts, [((1, 1), 1)]);

        let mut new = CircuitInstance::build(build).unwrap();
        let err = new
            .upgrade(&pieces, &["cuonts".to_string()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`cuonts` is to start empty"), "{err}");
    }

    #[test]
    fn formerly_carries_an_unnamed_operators_state_past_a_new_one() {
        let mut old = CircuitInstance::build(|c: &mut Circuit| {
            c.input::<String>("words")
                .count_by(|w| w.clone())
                .output("counts");
        })
        .unwrap();
        run(&mut old, &["a"]);
        let pieces = old.snapshot().unwrap();
        let two = |formerly: bool| {
            move |c: &mut Circuit| {
                let words = c.input::<String>("words");
                let counts = words.count_by(|w| w.clone()).named("counts");
                let counts = if formerly {
                    counts.formerly("keyed_sum#0/1")
                } else {
                    counts
                };
                counts.output("counts");
                words.count_by(|w| w.len() as u64).output("lengths");
            }
        };
        // Its default identity is keyed_sum#0/2 now: without `formerly`
        // the old count's state is dropped, with it carried.
        let mut new = CircuitInstance::build(two(false)).unwrap();
        new.upgrade(&pieces, &[]).unwrap();
        let counts: Vec<((String, i64), i64)> = decode(&run(&mut new, &["a"])[0]);
        assert_eq!(counts, [(("a".into(), 1), 1)]);
        let mut new = CircuitInstance::build(two(true)).unwrap();
        new.upgrade(&pieces, &[]).unwrap();
        let counts: Vec<((String, i64), i64)> = decode(&run(&mut new, &["a"])[0]);
        assert_eq!(counts, [(("a".into(), 1), -1), (("a".into(), 2), 1)]);

        let err = CircuitInstance::build(|c: &mut Circuit| {
            let words = c.input::<String>("words");
            words
                .count_by(|w| w.clone())
                .named("a")
                .formerly("b")
                .output("x");
            words.count_by(|w| w.clone()).named("b").output("y");
        })
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("\"b\" answers to that identity too"), "{err}");
    }

    #[test]
    fn an_alias_never_takes_a_second_state() {
        // Version 1: the word count unnamed (`keyed_sum#0/2`), then the
        // length count named. Version 2 builds them the other way round:
        // the length count's default is `keyed_sum#0/2` now, but it takes
        // its own state, not the word count's as well.
        let mut old = CircuitInstance::build(|c: &mut Circuit| {
            let words = c.input::<String>("words");
            words.count_by(|w| w.clone()).output("counts");
            words
                .count_by(|w| w.len() as u64)
                .named("lengths")
                .output("lengths");
        })
        .unwrap();
        run(&mut old, &["a", "bb"]);
        let pieces = old.snapshot().unwrap();
        let mut new = CircuitInstance::build(|c: &mut Circuit| {
            let words = c.input::<String>("words");
            words
                .count_by(|w| w.len() as u64)
                .named("lengths")
                .output("lengths");
            words.count_by(|w| w.clone()).output("counts");
        })
        .unwrap();
        new.upgrade(&pieces, &[]).unwrap();
        let out = run(&mut new, &["a"]);
        let lengths: Vec<((u64, i64), i64)> = decode(&out[0]);
        assert_eq!(lengths, [((1, 1), -1), ((1, 2), 1)]);
        // The word count (now `keyed_sum#1/2`) started empty.
        let counts: Vec<((String, i64), i64)> = decode(&out[1]);
        assert_eq!(counts, [(("a".into(), 1), 1)]);
    }

    #[test]
    fn start_empty_empties_a_kept_operator_too() {
        let pieces = counted(&["a"]);
        let mut new = CircuitInstance::build(|c: &mut Circuit| {
            wordcount(c);
        })
        .unwrap();
        new.upgrade(&pieces, &["counts".to_string()]).unwrap();
        let counts: Vec<((String, i64), i64)> = decode(&run(&mut new, &["a"])[0]);
        assert_eq!(counts, [(("a".into(), 1), 1)]);
    }

    /// Word count keyed by lower-cased words, state version 1, with or
    /// without the migration from version 0's keys as they came.
    fn lowercased(migrates: bool) -> impl Fn(&mut Circuit) {
        move |c: &mut Circuit| {
            let counts = c
                .input::<String>("words")
                .count_by(|w| w.to_lowercase())
                .named("counts")
                .state_version(1);
            let counts = if migrates {
                counts.migrates_keys_from(0, |old: String| old.to_lowercase())
            } else {
                counts
            };
            counts.output("counts");
        }
    }

    #[test]
    fn a_migration_rekeys_the_old_state_and_adds_up_keys_that_meet() {
        let pieces = counted(&["The", "the", "THE", "cat"]);
        let mut new = CircuitInstance::build(lowercased(true)).unwrap();
        let info = &new.operators()[0];
        assert_eq!(info.migrates_from.len(), 1);
        assert_ne!(info.migrates_from[0], info.fingerprint);
        new.upgrade(&pieces, &[]).unwrap();
        let counts: Vec<((String, i64), i64)> = decode(&run(&mut new, &["tHe", "Cat"])[0]);
        assert_eq!(
            counts,
            [
                (("cat".into(), 1), -1),
                (("cat".into(), 2), 1),
                (("the".into(), 3), -1),
                (("the".into(), 4), 1)
            ]
        );
        // Snapshotted, the migrated state is the new version's own: it
        // restores plainly.
        let again = new.snapshot().unwrap();
        let mut restored = CircuitInstance::build(lowercased(true)).unwrap();
        restored.restore(&again).unwrap();
        let counts: Vec<((String, i64), i64)> = decode(&run(&mut restored, &["the"])[0]);
        assert_eq!(counts, [(("the".into(), 4), -1), (("the".into(), 5), 1)]);
        // The migration is no restore: the old state does not restore.
        let mut plain = CircuitInstance::build(lowercased(true)).unwrap();
        assert!(plain.restore(&pieces).is_err());
    }

    #[test]
    fn a_bumped_state_version_without_a_migration_is_refused() {
        let pieces = counted(&["a"]);
        let mut new = CircuitInstance::build(lowercased(false)).unwrap();
        let err = new.upgrade(&pieces, &[]).unwrap_err().to_string();
        assert!(
            err.contains("operator `counts` changed")
                && err.contains("state version 1")
                && err.contains("migration"),
            "{err}"
        );
    }

    #[test]
    fn a_migration_changes_the_key_type() {
        let pieces = counted(&["a", "bb", "cc"]);
        let mut new = CircuitInstance::build(|c: &mut Circuit| {
            c.input::<String>("words")
                .count_by(|w| w.len() as u64)
                .named("counts")
                .migrates_keys_from(0, |old: String| old.len() as u64)
                .output("counts");
        })
        .unwrap();
        new.upgrade(&pieces, &[]).unwrap();
        let counts: Vec<((u64, i64), i64)> = decode(&run(&mut new, &["dd"])[0]);
        assert_eq!(counts, [((2, 2), -1), ((2, 3), 1)]);
        // A migration from keys of the wrong type is no migration of this
        // state: refused as changed.
        let mut wrong = CircuitInstance::build(|c: &mut Circuit| {
            c.input::<String>("words")
                .count_by(|w| w.len() as u64)
                .named("counts")
                .migrates_keys_from(0, |old: u32| old as u64)
                .output("counts");
        })
        .unwrap();
        let err = wrong.upgrade(&pieces, &[]).unwrap_err().to_string();
        assert!(err.contains("operator `counts` changed"), "{err}");
    }

    #[test]
    fn migrations_are_for_keyed_sums_of_those_keys() {
        let not_a_sum = CircuitInstance::build(|c: &mut Circuit| {
            c.input::<(String, i64)>("words")
                .distinct()
                .migrates_keys_from(0, |old: String| old)
                .output("x");
        });
        let err = not_a_sum.err().unwrap().to_string();
        assert!(err.contains("a distinct has no state migrations"), "{err}");
        let from_itself = CircuitInstance::build(|c: &mut Circuit| {
            c.input::<String>("words")
                .count_by(|w| w.to_lowercase())
                .named("counts")
                .migrates_keys_from(0, |old: String| old.to_lowercase())
                .output("x");
        });
        let err = from_itself.err().unwrap().to_string();
        assert!(err.contains("bump its state_version"), "{err}");
        let other_keys = CircuitInstance::build(|c: &mut Circuit| {
            c.input::<String>("words")
                .count_by(|w| w.clone())
                .map(|(w, n)| (w.len() as u64, *n))
                .migrates_keys_from(0, |old: String| old.len() as u64)
                .output("x");
        });
        let err = other_keys.err().unwrap().to_string();
        assert!(
            err.contains("keys of this keyed_sum are not of that type"),
            "{err}"
        );
        let unversioned = CircuitInstance::build(|c: &mut Circuit| {
            c.input::<String>("words")
                .map(|w| w.clone())
                .state_version(2)
                .output("x");
        });
        let err = unversioned.err().unwrap().to_string();
        assert!(
            err.contains("state_version(2): no single stateful"),
            "{err}"
        );
    }

    #[test]
    fn another_snapshot_version_stops_an_upgrade() {
        let pieces = counted(&["a"]);
        let mut new = CircuitInstance::build(|c: &mut Circuit| {
            c.snapshot_version(7);
            wordcount(c);
        })
        .unwrap();
        let err = new.upgrade(&pieces, &[]).unwrap_err().to_string();
        assert!(
            err.contains("snapshot version 1 but the circuit reads version 7"),
            "{err}"
        );
    }
}
