"""Upgrades: a checkpoint of one version of a circuit taken by another,
operator by operator (as the Rust SDK's ``upgrade.rs`` tests)."""

import unittest

from sluice import CircuitError
from sluice.circuit import Instance, fingerprint
from sluice.testing import Pipeline


def wordcount(c):
    words = c.input("words")
    words.count_by(lambda w: w).named("counts").output("counts")
    return words


def with_lengths(c):
    wordcount(c).count_by(lambda w: len(w)).named("lengths").output("lengths")


def run(pipeline, words):
    return pipeline.step({"words": [(w, 1) for w in words]})


def counted(build, words):
    old = Pipeline(build, 1)
    run(old, words)
    return old.checkpoint()


class Upgrade(unittest.TestCase):
    def test_a_kept_operator_carries_its_state_and_a_new_one_starts_empty(self):
        pieces = counted(wordcount, ["a", "a", "b"])
        new = Pipeline.upgrade(with_lengths, 2, pieces)
        out = run(new, ["a"])
        self.assertEqual(out["counts"], {b'["a",2]': -1, b'["a",3]': 1})
        self.assertEqual(out["lengths"], {b"[1,1]": 1})

    def test_a_removed_operator_is_dropped_where_restore_refuses_it(self):
        pieces = counted(with_lengths, ["a", "bb"])
        with self.assertRaises(CircuitError):
            Pipeline.restore(wordcount, 1, pieces)
        new = Pipeline.upgrade(wordcount, 1, pieces)
        self.assertEqual(run(new, ["bb"])["counts"], {b'["bb",1]': -1, b'["bb",2]': 1})

    def test_a_changed_operator_is_refused_by_name_unless_it_starts_empty(self):
        def sums(c):
            c.input("words").sum_by(lambda w: w, lambda w: len(w)).named("counts").output("counts")

        pieces = counted(wordcount, ["a"])
        with self.assertRaises(CircuitError) as e:
            Pipeline.upgrade(sums, 1, pieces)
        self.assertIn("operator `counts` changed", e.exception.message)
        new = Pipeline.upgrade(sums, 1, pieces, ["counts"])
        self.assertEqual(run(new, ["aa"])["counts"], {b'["aa",2]': 1})
        with self.assertRaises(CircuitError) as e:
            Pipeline.upgrade(sums, 1, pieces, ["cuonts"])
        self.assertIn("`cuonts` is to start empty", e.exception.message)

    def test_another_snapshot_version_stops_an_upgrade(self):
        def versioned(c):
            c.snapshot_version(7)
            wordcount(c)

        pieces = counted(wordcount, ["a"])
        with self.assertRaises(CircuitError) as e:
            Pipeline.upgrade(versioned, 1, pieces)
        self.assertIn("but the circuit reads version 7", e.exception.message)

    def test_formerly_carries_an_unnamed_operators_state_past_a_new_one(self):
        def unnamed(c):
            c.input("words").count_by(lambda w: w).output("counts")

        def two(c):
            words = c.input("words")
            words.count_by(lambda w: w).named("counts").formerly("keyed_sum#0/1").output("counts")
            words.count_by(lambda w: len(w)).output("lengths")

        pieces = counted(unnamed, ["a"])
        # Without `formerly` the count's state would be dropped: its
        # default identity is keyed_sum#0/2 now.
        new = Pipeline.upgrade(two, 1, pieces)
        self.assertEqual(run(new, ["a"])["counts"], {b'["a",1]': -1, b'["a",2]': 1})
        self.assertEqual(Instance(two)._stateful_nodes[0].aliases(), ["keyed_sum#0/2", "keyed_sum#0/1"])

        def clash(c):
            words = c.input("words")
            words.count_by(lambda w: w).named("a").formerly("b").output("x")
            words.count_by(lambda w: w).named("b").output("y")

        with self.assertRaises(CircuitError) as e:
            Instance(clash)
        self.assertIn("'b' answers to that identity too", e.exception.message)

    def test_an_alias_never_takes_a_second_state(self):
        def v1(c):
            words = c.input("words")
            words.count_by(lambda w: w).output("counts")
            words.count_by(lambda w: len(w)).named("lengths").output("lengths")

        def v2(c):
            words = c.input("words")
            words.count_by(lambda w: len(w)).named("lengths").output("lengths")
            words.count_by(lambda w: w).output("counts")

        new = Pipeline.upgrade(v2, 1, counted(v1, ["a", "bb"]))
        out = run(new, ["a"])
        self.assertEqual(out["lengths"], {b"[1,1]": -1, b"[1,2]": 1})
        self.assertEqual(out["counts"], {b'["a",1]': 1})

    def test_start_empty_empties_a_kept_operator_too(self):
        new = Pipeline.upgrade(wordcount, 1, counted(wordcount, ["a"]), ["counts"])
        self.assertEqual(run(new, ["a"])["counts"], {b'["a",1]': 1})

    def test_fingerprints_differ_where_the_shape_does(self):
        ops = {i: (k, s) for i, k, s in Instance(with_lengths).operators()}
        self.assertEqual(ops["counts"], ops["lengths"])
        self.assertNotEqual(fingerprint("keyed_sum", "count"), fingerprint("keyed_sum", "sum"))


if __name__ == "__main__":
    unittest.main()


def lowercased(migrates):
    def build(c):
        counts = c.input("words").count_by(lambda w: w.lower()).named("counts").state_version(1)
        if migrates:
            counts = counts.migrates_keys_from(0, lambda old: old.lower())
        counts.output("counts")

    return build


class Migration(unittest.TestCase):
    def test_a_migration_rekeys_the_old_state_and_adds_up_keys_that_meet(self):
        pieces = counted(wordcount, ["The", "the", "THE", "cat"])
        # Three workers: merged keys land in shards of other workers.
        new = Pipeline.upgrade(lowercased(True), 3, pieces)
        out = run(new, ["tHe", "Cat"])
        self.assertEqual(
            out["counts"],
            {b'["cat",1]': -1, b'["cat",2]': 1, b'["the",3]': -1, b'["the",4]': 1},
        )
        # The old state is the migration's, not a restore's.
        with self.assertRaises(CircuitError):
            Pipeline.restore(lowercased(True), 1, pieces)

    def test_the_migration_is_described_by_the_old_fingerprint(self):
        op = Instance(lowercased(True))._stateful_nodes[0].op
        from sluice.circuit import _shape, migrates_from

        self.assertEqual(_shape(op), "count; state version 1")
        self.assertEqual(migrates_from(op), [fingerprint("keyed_sum", "count")])

    def test_a_bumped_state_version_without_a_migration_is_refused(self):
        pieces = counted(wordcount, ["a"])
        with self.assertRaises(CircuitError) as e:
            Pipeline.upgrade(lowercased(False), 1, pieces)
        self.assertIn("operator `counts` changed", e.exception.message)
        self.assertIn("state version 1", e.exception.message)
        self.assertIn("migration", e.exception.message)

    def test_migrations_are_for_keyed_sums_and_from_another_state(self):
        def distinct(c):
            c.input("words").distinct().migrates_keys_from(0, lambda k: k).output("x")

        with self.assertRaises(CircuitError) as e:
            Instance(distinct)
        self.assertIn("has no state migrations", e.exception.message)

        def itself(c):
            c.input("words").count_by(lambda w: w).migrates_keys_from(0, lambda k: k).output("x")

        with self.assertRaises(CircuitError) as e:
            Instance(itself)
        self.assertIn("bump its state_version", e.exception.message)

    def test_a_failing_migration_names_the_operator(self):
        pieces = counted(wordcount, ["a"])

        def broken(c):
            (
                c.input("words")
                .count_by(lambda w: w)
                .named("counts")
                .state_version(1)
                .migrates_keys_from(0, lambda old: old.missing())
                .output("counts")
            )

        with self.assertRaises(CircuitError) as e:
            Pipeline.upgrade(broken, 1, pieces)
        self.assertIn("operator `counts`: its migration failed", e.exception.message)
