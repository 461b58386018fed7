"""Running a circuit natively, as the host would: W workers stepping side by
side with an exchange between them, checkpoints, restores and layout
changes. How the SDK's operators (and users' circuits) are tested without a
host.
"""

import threading

from . import values as _values
from .circuit import Instance
from .shard import SHARDS, shard_of


def owner(shard, workers):
    """The worker that owns ``shard`` in a fresh layout of ``workers``
    (contiguous ranges, as the host's first layout). Tests only need some
    fixed assignment; the exchange and the state agree on it."""
    return shard * workers // SHARDS


class _Exchange:
    """The exchange of W workers in one process: every worker's shuffle on a
    channel waits for the others, then gets the events whose key's shard it
    owns, in worker order."""

    def __init__(self, workers, layout):
        self.n = workers
        self.layout = layout
        self.barrier = threading.Barrier(workers)
        self.sent = {}

    def for_worker(self, me):
        ex = self

        class Worker:
            def workers(self):
                return ex.n

            def shuffle(self, channel, events):
                ex.sent[(channel, me)] = events
                ex.barrier.wait()
                mine = []
                for src in range(ex.n):
                    for k, v, w in ex.sent[(channel, src)]:
                        if ex.layout[shard_of(k)] == me:
                            mine.append((k, v, w))
                ex.barrier.wait()
                if me == 0:
                    for src in range(ex.n):
                        del ex.sent[(channel, src)]
                ex.barrier.wait()
                return mine

        return Worker()


class Pipeline:
    """``workers`` instances of the circuit ``build`` makes, run together.

    ``step(inputs)`` spreads each input port's events over the workers
    (round robin, as input partitions would) and returns the step's output
    per port as ``{json bytes: weight}``. ``checkpoint()`` and
    ``Pipeline.restore(build, workers, pieces)`` go through the same
    snapshot pieces the host stores; ``rescale(n)`` moves shards with
    ``export_shards``/``restore`` as a layout change does."""

    def __init__(self, build, workers=1, layout=None):
        self.build = build
        self.workers = [Instance(build) for _ in range(workers)]
        self.layout = layout or [owner(s, workers) for s in range(SHARDS)]

    def step(self, inputs):
        """``inputs``: per port name, a list of ``(value, weight)`` (values as
        Python data, encoded to JSON and decoded as the host would)."""
        n = len(self.workers)
        first = self.workers[0]
        shares = [[[] for _ in first.inputs] for _ in range(n)]
        for port, name in enumerate(first.inputs):
            events = inputs.get(name, [])
            values = [_values.encode(v) for v, _ in events]
            ends, total = [], 0
            for b in values:
                total += len(b)
                ends.append(total)
            decoded = _values.decode_all(b"".join(values), ends)
            for i, (value, (_, w)) in enumerate(zip(decoded, events)):
                shares[i % n][port].append((value, w))
        exchange = _Exchange(n, self.layout)
        results = [None] * n
        errors = []

        def run(i):
            try:
                results[i] = self.workers[i].step(shares[i], exchange.for_worker(i))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)
                exchange.barrier.abort()

        if n == 1:
            run(0)
        else:
            threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
        out = {}
        for port, name in enumerate(first.outputs):
            total = {}
            for r in results:
                for b, w in r[port]:
                    total[b] = total.get(b, 0) + w
            out[name] = {b: w for b, w in total.items() if w != 0}
        return out

    def checkpoint(self, changed_only=False, previous=None):
        """Every worker's pieces, merged as the host keeps them: with
        ``changed_only``, applied over ``previous`` (shard -> list of
        pieces)."""
        pieces = {s: list(p) for s, p in (previous or {}).items()} if changed_only else {}
        for w in self.workers:
            if changed_only:
                changed, got = w.snapshot_changed()
                for s in changed:
                    pieces.pop(s, None)
                for s, b in got.items():
                    pieces.setdefault(s, []).append(b)
            else:
                for s, b in w.snapshot().items():
                    pieces.setdefault(s, []).append(b)
        return pieces

    @classmethod
    def restore(cls, build, workers, pieces):
        """A pipeline of ``workers`` fresh instances given the checkpoint
        ``pieces`` (shard -> list of pieces), each shard to its owner."""
        p = cls(build, workers)
        for s, bs in pieces.items():
            p.workers[p.layout[s]].restore([(s, b) for b in bs])
        return p

    @classmethod
    def upgrade(cls, build, workers, pieces, start_empty=()):
        """A pipeline of ``workers`` fresh instances of a new version of a
        circuit given the old version's checkpoint ``pieces`` (shard -> list
        of pieces), each shard to its owner, as an upgrade does."""
        p = cls(build, workers)
        for s, bs in pieces.items():
            p.workers[p.layout[s]].upgrade([(s, b) for b in bs], start_empty)
        # A migration may give state keys of shards other workers own: each
        # worker hands those to their owners, as the host does.
        moved = {}
        for i, w in enumerate(p.workers):
            foreign = [s for s in range(SHARDS) if p.layout[s] != i]
            for s, b in w.export_shards(foreign).items():
                moved.setdefault(s, []).append(b)
        for s, bs in moved.items():
            p.workers[p.layout[s]].restore([(s, b) for b in bs])
        return p

    def rescale(self, workers):
        """Moves to ``workers`` workers as a live layout change does: each
        shard whose owner changes is exported by the old owner and restored
        into the new one."""
        new_layout = [owner(s, workers) for s in range(SHARDS)]
        while len(self.workers) < workers:
            self.workers.append(Instance(self.build))
        moved = {}
        for i, w in enumerate(self.workers):
            shards = [s for s in range(SHARDS) if self.layout[s] == i and new_layout[s] != i]
            if shards:
                for s, b in w.export_shards(shards).items():
                    moved.setdefault(s, []).append(b)
        self.workers = self.workers[:workers]
        for s, bs in moved.items():
            self.workers[new_layout[s]].restore([(s, b) for b in bs])
        self.layout = new_layout
