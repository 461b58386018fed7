"""Every operator against a recomputation from the integrated input, at
several worker counts, with retractions, across checkpoints (full and
changed-only), restores and rescales. Random inputs with fixed seeds."""

import random
import unittest

from sluice import Window
from sluice.testing import Pipeline
from sluice.values import encode

WORDS = ["a", "b", "c", "d", "e", "f", "g", "h"]


def random_steps(rng, make, steps=12, per_step=8):
    """Steps of ``(value, weight)``: inserts of ``make(rng)`` and deletes of
    records inserted before (so the multiset stays a set of live rows)."""
    live, out = [], []
    for _ in range(steps):
        step = []
        for _ in range(rng.randrange(per_step + 1)):
            if live and rng.random() < 0.35:
                step.append((live.pop(rng.randrange(len(live))), -1))
            else:
                v = make(rng)
                live.append(v)
                step.append((v, 1))
        out.append(step)
    return out


def integrated(steps):
    z = {}
    for step in steps:
        for v, w in step:
            z[v] = z.get(v, 0) + w
    return {v: w for v, w in z.items() if w != 0}


def as_output(pairs):
    z = {}
    for v, w in pairs:
        b = encode(v)
        z[b] = z.get(b, 0) + w
    return {b: w for b, w in z.items() if w != 0}


def add_into(total, delta):
    for b, w in delta.items():
        total[b] = total.get(b, 0) + w
        if total[b] == 0:
            del total[b]


class Harness:
    """Runs ``steps`` (per port) through a pipeline with checkpoints,
    restores and rescales along the way, checking the integrated output
    against ``expected(prefix)`` after every step."""

    def __init__(self, test, build, expected):
        self.test, self.build, self.expected = test, build, expected

    def run(self, steps_by_port, schedule, seed):
        rng = random.Random(seed)
        workers = schedule[0]
        p = Pipeline(self.build, workers)
        totals = {}
        ckpt = None
        n = max(len(s) for s in steps_by_port.values())
        for i in range(n):
            inputs = {port: steps[i] for port, steps in steps_by_port.items() if i < len(steps)}
            for port, delta in p.step(inputs).items():
                add_into(totals.setdefault(port, {}), delta)
            prefix = {port: steps[: i + 1] for port, steps in steps_by_port.items()}
            want = self.expected(prefix)
            for port, z in want.items():
                self.test.assertEqual(totals.get(port, {}), z, f"port {port} after step {i}")
            action = rng.random()
            if action < 0.25:
                ckpt = p.checkpoint(changed_only=ckpt is not None and rng.random() < 0.7, previous=ckpt)
                workers = rng.choice(schedule)
                p = Pipeline.restore(self.build, workers, ckpt)
            elif action < 0.45:
                workers = rng.choice(schedule)
                p.rescale(workers)
                # A layout change moves pieces outside the checkpoint: the
                # host takes the next checkpoint whole.
                ckpt = None
            elif action < 0.6:
                ckpt = p.checkpoint(changed_only=ckpt is not None, previous=ckpt)


def word_build(c):
    words = c.input("in")
    words.count_by(lambda r: r[0]).output("count")
    words.sum_by(lambda r: r[0], lambda r: r[1]).output("sum")
    words.avg_by(lambda r: r[0], lambda r: r[1]).output("avg")
    words.min_by(lambda r: r[0], lambda r: r[1]).output("min")
    words.max_by(lambda r: r[0], lambda r: r[1]).output("max")
    words.map(lambda r: r[0]).distinct().output("distinct")


def word_expected(prefix):
    z = integrated(prefix["in"])
    count, total, values = {}, {}, {}
    for (k, x), w in z.items():
        count[k] = count.get(k, 0) + w
        total[k] = total.get(k, 0) + x * w
        values.setdefault(k, {})
        values[k][x] = values[k].get(x, 0) + w
    live = [k for k in count if count[k] > 0]
    return {
        "count": as_output(((k, count[k]), 1) for k in live),
        "sum": as_output(((k, total[k]), 1) for k in live),
        "avg": as_output(((k, float(total[k]) / float(count[k])), 1) for k in live),
        "min": as_output(((k, min(x for x, w in values[k].items() if w > 0)), 1) for k in live),
        "max": as_output(((k, max(x for x, w in values[k].items() if w > 0)), 1) for k in live),
        "distinct": as_output((k, 1) for k in live),
    }


def join_build(c):
    left = c.input("left").key_by(lambda r: r[0])
    right = c.input("right").key_by(lambda r: r[0])
    left.join(right, lambda k, a, b: (k, a[1], b[1])).output("joined")


def join_expected(prefix):
    a, b = integrated(prefix["left"]), integrated(prefix.get("right", []))
    out = []
    for (ka, xa), wa in a.items():
        for (kb, xb), wb in b.items():
            if ka == kb:
                out.append(((ka, xa, xb), wa * wb))
    return {"joined": as_output(out)}


def group_build(c):
    x = c.input("in")
    x.top_k_by(lambda r: r[0], lambda r: r[1], 3).output("top")
    x.fold_by(lambda r: r[0], lambda r: r[1], 0, lambda acc, v, w: acc + v * v * w).output("fold")


def group_expected(prefix):
    copies, squares = {}, {}
    for (k, v), w in integrated(prefix["in"]).items():
        copies.setdefault(k, []).extend([v] * max(w, 0))
        squares[k] = squares.get(k, 0) + v * v * w
    top = []
    for k, vs in copies.items():
        top.extend(((k, v), 1) for v in sorted(vs, reverse=True)[:3])
    return {"top": as_output(top), "fold": as_output(((k, n), 1) for k, n in squares.items())}


def left_join_build(c):
    left = c.input("left").key_by(lambda r: r[0])
    right = c.input("right").key_by(lambda r: r[0])
    left.left_join(right, lambda k, a, b: (k, a[1], None if b is None else b[1])).output("joined")


def left_join_expected(prefix):
    a, b = integrated(prefix["left"]), integrated(prefix.get("right", []))
    out = []
    for (ka, xa), wa in a.items():
        matches = [((kb, xb), wb) for (kb, xb), wb in b.items() if kb == ka]
        if any(wb > 0 for _, wb in matches):
            out.extend(((ka, xa, xb), wa * wb) for (_, xb), wb in matches)
        else:
            out.append(((ka, xa, None), wa))
    return {"joined": as_output(out)}


def window_build(c):
    (
        c.input("in")
        .hopping(lambda r: r[1], 10, 4)
        .count_by(lambda wr: (wr[0], wr[1][0]))
        .output("per_window")
    )


def window_expected(prefix):
    out = {}
    for (k, t), w in integrated(prefix["in"]).items():
        for start in range(-200, 200):
            if start % 4 == 0 and start <= t < start + 10:
                key = (Window(start, start + 10), k)
                out[key] = out.get(key, 0) + w
    return {"per_window": as_output(((key, n), 1) for key, n in out.items() if n > 0)}


def word(rng):
    return (rng.choice(WORDS), rng.randrange(-5, 20))


class OperatorsEqualRecomputation(unittest.TestCase):
    def test_aggregates_min_max_distinct(self):
        for seed in range(12):
            rng = random.Random(seed)
            steps = random_steps(rng, word)
            for schedule in ([1], [3], [1, 2, 3]):
                Harness(self, word_build, word_expected).run({"in": steps}, schedule, seed)

    def test_join(self):
        for seed in range(12):
            rng = random.Random(100 + seed)
            left = random_steps(rng, lambda r: (r.choice(WORDS[:4]), r.randrange(5)))
            right = random_steps(rng, lambda r: (r.choice(WORDS[:4]), r.randrange(5)))
            for schedule in ([1], [3], [2, 3]):
                Harness(self, join_build, join_expected).run(
                    {"left": left, "right": right}, schedule, seed
                )

    def test_top_k_and_fold(self):
        for seed in range(10):
            rng = random.Random(300 + seed)
            steps = random_steps(rng, lambda r: (r.choice(WORDS[:3]), r.randrange(8)))
            for schedule in ([1], [3], [1, 2, 3]):
                Harness(self, group_build, group_expected).run({"in": steps}, schedule, seed)

    def test_left_join(self):
        for seed in range(10):
            rng = random.Random(400 + seed)
            left = random_steps(rng, lambda r: (r.choice(WORDS[:4]), r.randrange(4)))
            right = random_steps(rng, lambda r: (r.choice(WORDS[:4]), r.randrange(4)))
            for schedule in ([1], [3], [2, 3]):
                Harness(self, left_join_build, left_join_expected).run(
                    {"left": left, "right": right}, schedule, seed
                )

    def test_hopping_windows(self):
        for seed in range(8):
            rng = random.Random(200 + seed)
            steps = random_steps(rng, lambda r: (r.choice(WORDS[:3]), r.randrange(-50, 50)))
            for schedule in ([1], [2, 3]):
                Harness(self, window_build, window_expected).run({"in": steps}, schedule, seed)


class Determinism(unittest.TestCase):
    def test_output_bytes_do_not_depend_on_input_order(self):
        rng = random.Random(7)
        steps = random_steps(rng, word, steps=1, per_step=40)[0]
        a = Pipeline(word_build, 1).step({"in": steps})
        shuffled = list(steps)
        rng.shuffle(shuffled)
        b = Pipeline(word_build, 1).step({"in": shuffled})
        self.assertEqual(a, b)

    def test_records_are_identified_by_their_canonical_json_at_any_w(self):
        # 1, 1.0 and True are equal in Python but three records on the
        # wire; objects with their fields in another order are one.
        def build(c):
            x = c.input("in")
            x.count_by(lambda r: r).output("count")
            x.distinct().output("distinct")
            x.map(lambda r: {"v": r, "n": [r]}).distinct().output("dicts")

        steps = [
            [(1, 1), (1.0, 1), (True, 1), ({"a": 1, "b": 2}, 1)],
            [({"b": 2, "a": 1}, -1), (1.0, 1), (True, -1)],
        ]
        results = []
        for workers in (1, 2, 4):
            p = Pipeline(build, workers)
            totals = {}
            for step in steps:
                for port, delta in p.step({"in": step}).items():
                    add_into(totals.setdefault(port, {}), delta)
            results.append(totals)
        self.assertEqual(results[0], results[1])
        self.assertEqual(results[0], results[2])
        self.assertEqual(
            results[0]["count"], {b'[1,1]': 1, b'[1.0,2]': 1}, "the object came and went"
        )
        self.assertTrue(all(w > 0 for t in results for z in t.values() for w in z.values()))

    def test_a_record_cannot_be_changed_in_place(self):
        from sluice.values import decode_all

        (r,) = decode_all(b'{"a":1}', [7])
        with self.assertRaises(TypeError):
            r |= {"a": 2}
        self.assertEqual(r.but(a=2).a, 2)
        self.assertEqual(r.a, 1)

    def test_nan_is_refused_with_a_clear_error(self):
        from sluice import CircuitError

        p = Pipeline(lambda c: c.input("in").map(lambda r: float("nan")).output("out"), 1)
        with self.assertRaises(CircuitError) as e:
            p.step({"in": [(1, 1)]})
        self.assertIn("not JSON", e.exception.message)

    def test_a_snapshot_of_another_shape_is_refused(self):
        p = Pipeline(word_build, 1)
        p.step({"in": [(("a", 1), 1)]})
        pieces = p.checkpoint()
        from sluice import CircuitError

        with self.assertRaises(CircuitError) as e:
            Pipeline.restore(join_build, 1, pieces)
        self.assertEqual(e.exception.kind, "incompatible-snapshot")


if __name__ == "__main__":
    unittest.main()
