"""Operator identity: a checkpoint's state goes back to the operator of the
same identity wherever it sits in a changed circuit, or is refused naming
it (as the Rust SDK's ``identity.rs`` tests)."""

import pickle
import unittest

from sluice import CircuitError
from sluice.circuit import Instance
from sluice.testing import Pipeline


def counts_of(words):
    words.count_by(lambda w: w).output("counts")
    words.count_by(lambda w: len(w)).output("lengths")


def counts(lowercase):
    def build(c):
        words = c.input("words")
        if lowercase:
            words = words.map(lambda w: w.lower())
        counts_of(words)

    return build


def run(pipeline, words):
    return pipeline.step({"words": [(w, 1) for w in words]})


def counted(words):
    old = Pipeline(counts(False), 1)
    run(old, words)
    return old.checkpoint()


def restored(build, pieces):
    return Pipeline.restore(build, 1, pieces)


class Identity(unittest.TestCase):
    def test_defaults_count_per_kind_and_names_keep_the_others(self):
        ids = [i for i, _, _ in Instance(counts(False)).operators()]
        self.assertEqual(ids, ["keyed_sum#0/2", "keyed_sum#1/2"])

        def named(c):
            words = c.input("words")
            words.count_by(lambda w: w).named("words").output("counts")
            words.count_by(lambda w: len(w)).output("lengths")

        ids = [i for i, _, _ in Instance(named).operators()]
        self.assertEqual(ids, ["words", "keyed_sum#1/2"])

    def test_a_stateless_operator_added_before_keeps_the_state(self):
        pieces = counted(["a", "a", "bb"])
        out = run(restored(counts(True), pieces), ["A"])
        self.assertEqual(out["counts"], {b'["a",2]': -1, b'["a",3]': 1})
        self.assertEqual(out["lengths"], {b"[1,2]": -1, b"[1,3]": 1})

    def test_a_same_kind_operator_added_renames_and_names_restore(self):
        pieces = counted(["a"])

        def more(c):
            words = c.input("words")
            words.count_by(lambda w: "#" + w).output("tags")
            counts_of(words)

        with self.assertRaises(CircuitError) as e:
            restored(more, pieces)
        refused = r"`keyed_sum#[01]/2` \(keyed_sum\) in the snapshot is not"
        self.assertRegex(str(e.exception), refused)
        self.assertIn("renames the others", str(e.exception))

        def named(c):
            words = c.input("words")
            words.count_by(lambda w: "#" + w).named("tags").output("tags")
            words.count_by(lambda w: w).named("words").output("counts")
            words.count_by(lambda w: len(w)).named("lengths").output("lengths")

        # Naming them in the same change does not help: the snapshot knows
        # them by defaults of a total of two, and there are three now.
        with self.assertRaises(CircuitError):
            restored(named, pieces)

        # Named with the total unchanged, they take their state under their
        # defaults.
        def renamed(c):
            words = c.input("words")
            words.count_by(lambda w: w).named("words").output("counts")
            words.count_by(lambda w: len(w)).named("lengths").output("lengths")

        out = run(restored(renamed, pieces), ["a"])
        self.assertEqual(out["counts"], {b'["a",1]': -1, b'["a",2]': 1})

    def test_a_count_does_not_restore_as_a_sum(self):
        def count(c):
            c.input("sales").count_by(lambda s: s[0]).output("out")

        def total(c):
            c.input("sales").sum_by(lambda s: s[0], lambda s: s[1]).output("out")

        old = Pipeline(count, 1)
        old.step({"sales": [(["eu", 5], 1)]})
        with self.assertRaises(CircuitError) as e:
            restored(total, old.checkpoint())
        self.assertIn("another shape", str(e.exception))

    def test_pieces_of_operators_known_by_index_still_restore(self):
        # As an SDK before identities wrote them (format 1: node index,
        # kind, entries): the counts sit at nodes 1 and 3.
        indexed = {}
        for shard, pieces in counted(["a"]).items():
            for piece in pieces:
                _, version, ops = pickle.loads(piece)
                ops = [(1 if i == "keyed_sum#0/2" else 3, kind, e) for i, kind, _, e in ops]
                indexed.setdefault(shard, []).append(pickle.dumps((1, version, ops), protocol=5))
        out = run(restored(counts(False), indexed), ["a"])
        self.assertEqual(out["counts"], {b'["a",1]': -1, b'["a",2]': 1})
        with self.assertRaises(CircuitError):
            restored(counts(True), indexed)

    def test_names_must_be_unique_and_name_a_stateful_operator(self):
        def dup(c):
            words = c.input("words")
            words.count_by(lambda w: w).named("n").output("a")
            words.distinct().named("n").output("b")

        def stateless(c):
            c.input("words").map(lambda w: w).named("m").output("a")

        for build, message in [(dup, "named 'n'"), (stateless, "no single stateful")]:
            with self.assertRaises(CircuitError) as e:
                Instance(build)
            self.assertIn(message, str(e.exception))


if __name__ == "__main__":
    unittest.main()
