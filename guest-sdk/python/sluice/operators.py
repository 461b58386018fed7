"""The operators: stateless ones map a delta to a delta; stateful ones
(keyed aggregates, ``distinct``, ``join``) re-shard their input by key
through the exchange and keep their state split by shard.

Every stateful operator has ``stateful = True``, a ``name`` recorded in
snapshots, a ``dirty`` set of changed shards, and ``snapshot(only)``,
``restore(shard, entries)`` and ``forget(shards)``.
"""

import pickle

from . import values as _values
from .shard import shard_of


class Stateless:
    """Base of operators that keep nothing between steps."""

    stateful = False
    name = "stateless"


class Input(Stateless):
    name = "input"

    def __init__(self, port):
        self.port = port

    def eval(self, cx, inputs):
        return cx.inputs[self.port]


class Map(Stateless):
    name = "map"

    def __init__(self, f):
        self.f = f

    def eval(self, cx, inputs):
        f = self.f
        return [(f(v), w) for v, w in inputs[0]]


class Filter(Stateless):
    name = "filter"

    def __init__(self, keep):
        self.keep = keep

    def eval(self, cx, inputs):
        keep = self.keep
        return [(v, w) for v, w in inputs[0] if keep(v)]


class FlatMap(Stateless):
    name = "flat_map"

    def __init__(self, f):
        self.f = f

    def eval(self, cx, inputs):
        f = self.f
        return [(u, w) for v, w in inputs[0] for u in f(v)]


class Union(Stateless):
    name = "union"

    def eval(self, cx, inputs):
        out = []
        for delta in inputs:
            out.extend(delta)
        return out


class Negate(Stateless):
    name = "negate"

    def eval(self, cx, inputs):
        return [(v, -w) for v, w in inputs[0]]


class Output(Stateless):
    """Consolidates the delta by its JSON encoding: one ``(bytes, weight)``
    per distinct record with a non-zero weight, in byte order (so a replay
    writes the same bytes whatever order the records came in)."""

    name = "output"

    def __init__(self, port):
        self.port = port

    def eval(self, cx, inputs):
        encode = _values.encode
        total = {}
        for v, w in inputs[0]:
            b = encode(v)
            total[b] = total.get(b, 0) + w
        cx.outputs[self.port] = sorted((b, w) for b, w in total.items() if w != 0)
        return None


class Keyed:
    """Base of stateful operators: entries by key, each key's shard
    remembered (computed once, when the key is new), changed shards in
    ``dirty``."""

    stateful = True

    def __init__(self, channel):
        self.channel = channel
        self.entries = {}
        self.shards = {}
        self.dirty = set()

    def _mark(self, key, kb):
        shard = self.shards.get(key)
        if shard is None:
            shard = shard_of(kb if kb is not None else _values.key_bytes(key))
            self.shards[key] = shard
        self.dirty.add(shard)

    def _drop(self, key):
        del self.entries[key]
        del self.shards[key]

    def _shuffle(self, cx, channel, items):
        """Sends ``(key, payload)`` items to the workers owning their keys;
        returns what this worker owns as ``(key bytes or None, payload)``.
        With one worker nothing moves (and nothing is encoded)."""
        exchange = cx.exchange
        if exchange.workers() == 1:
            return [(None, p) for _, p in items]
        kb, dumps = _values.key_bytes, pickle.dumps
        sent = [(kb(k), dumps(p, protocol=5), 1) for k, p in items]
        loads = pickle.loads
        return [(k, loads(p)) for k, p, _ in exchange.shuffle(channel, sent)]

    def snapshot(self, only):
        by_shard = {}
        shards = self.shards
        for key, entry in self.entries.items():
            s = shards[key]
            if only is None or s in only:
                by_shard.setdefault(s, []).append((key, entry))
        return by_shard

    def restore(self, shard, entries):
        """Adds a piece of ``shard`` (its keys all lie there: their shard is
        not computed again)."""
        for key, entry in entries:
            mine = self.entries.get(key)
            if mine is None:
                self.entries[key] = entry
                self.shards[key] = shard
            else:
                self._merge(mine, entry)
                if self._empty(mine):
                    self._drop(key)

    def forget(self, shards):
        for key in [k for k, s in self.shards.items() if s in shards]:
            self.dirty.add(self.shards[key])
            self._drop(key)


class GroupSum(Keyed):
    """``count_by``, ``sum_by``, ``avg_by``: a count and a weighted sum per
    key, combined on this worker before they cross the exchange."""

    name = "keyed_sum"

    def __init__(self, channel, key, value, kind):
        super().__init__(channel)
        self.key = key
        self.value = value
        self.kind = kind

    def _emit(self, count, total):
        if count <= 0:
            return None
        if self.kind == "count":
            return count
        if self.kind == "sum":
            return total
        return float(total) / float(count)

    @staticmethod
    def _merge(mine, other):
        mine[0] += other[0]
        mine[1] += other[1]

    @staticmethod
    def _empty(entry):
        return entry[0] == 0 and entry[1] == 0

    def eval(self, cx, inputs):
        key, value = self.key, self.value
        local = {}
        for v, w in inputs[0]:
            k = key(v)
            acc = local.get(k)
            if acc is None:
                local[k] = acc = [0, 0]
            acc[0] += w
            if value is not None:
                acc[1] += value(v) * w
        items = [(k, (k, c, s)) for k, (c, s) in local.items() if c != 0 or s != 0]
        touched = {}
        entries = self.entries
        for kb, (k, c, s) in self._shuffle(cx, self.channel, items):
            entry = entries.get(k)
            if entry is None:
                entries[k] = entry = [0, 0]
            if k not in touched:
                touched[k] = (entry[0], entry[1])
            self._mark(k, kb)
            entry[0] += c
            entry[1] += s
        out = []
        for k, (count, total) in touched.items():
            entry = entries[k]
            old = self._emit(count, total)
            new = self._emit(entry[0], entry[1])
            if entry[0] == 0 and entry[1] == 0:
                self._drop(k)
            if old != new:
                if old is not None:
                    out.append(((k, old), -1))
                if new is not None:
                    out.append(((k, new), 1))
        return out


def _add(group, value, weight):
    w = group.get(value, 0) + weight
    if w == 0:
        group.pop(value, None)
    else:
        group[value] = w


def _consolidated(pairs):
    total = {}
    for p, w in pairs:
        total[p] = total.get(p, 0) + w
    return [(p, w) for p, w in total.items() if w != 0]


class Group(Keyed):
    """``min_by`` and ``max_by``: each key's values as a multiset; a touched
    key's result is recomputed before and after the change."""

    def __init__(self, channel, name, key, value, pick):
        super().__init__(channel)
        self.name = name
        self.key = key
        self.value = value
        self.pick = pick

    @staticmethod
    def _merge(mine, other):
        for v, w in other.items():
            _add(mine, v, w)

    @staticmethod
    def _empty(entry):
        return not entry

    def _result(self, group):
        live = [v for v, w in group.items() if w > 0]
        return self.pick(live) if live else None

    def eval(self, cx, inputs):
        key, value = self.key, self.value
        pairs = _consolidated(((key(v), value(v)), w) for v, w in inputs[0])
        items = [(k, (k, x, w)) for (k, x), w in pairs]
        touched = {}
        entries = self.entries
        for kb, (k, x, w) in self._shuffle(cx, self.channel, items):
            group = entries.get(k)
            if group is None:
                entries[k] = group = {}
            if k not in touched:
                touched[k] = self._result(group)
            self._mark(k, kb)
            _add(group, x, w)
        out = []
        for k, old in touched.items():
            group = entries[k]
            new = self._result(group)
            if not group:
                self._drop(k)
            if old != new:
                if old is not None:
                    out.append(((k, old), -1))
                if new is not None:
                    out.append(((k, new), 1))
        return out


class Distinct(Keyed):
    """``distinct``: each record once while its weight is positive."""

    name = "distinct"

    @staticmethod
    def _merge(mine, other):
        raise AssertionError("distinct entries are weights, merged in restore")

    def restore(self, shard, entries):
        for key, w in entries:
            total = self.entries.get(key, 0) + w
            if total == 0:
                self.entries.pop(key, None)
                self.shards.pop(key, None)
            else:
                self.entries[key] = total
                self.shards[key] = shard

    def eval(self, cx, inputs):
        items = [(v, (v, w)) for v, w in _consolidated(inputs[0])]
        out = []
        entries = self.entries
        for kb, (v, w) in self._shuffle(cx, self.channel, items):
            old = entries.get(v, 0)
            new = old + w
            self._mark(v, kb)
            if new == 0:
                self._drop(v)
            else:
                entries[v] = new
            if old <= 0 < new:
                out.append((v, 1))
            elif new <= 0 < old:
                out.append((v, -1))
        return out


class Join(Keyed):
    """Inner join of two indexed streams: Δ(A⋈B) = ΔA⋈B + A'⋈ΔB, each side
    integrated per key as a multiset."""

    name = "join"

    def __init__(self, channel, f):
        super().__init__(channel)
        self.f = f

    @staticmethod
    def _merge(mine, other):
        for side in (0, 1):
            for v, w in other[side].items():
                _add(mine[side], v, w)

    @staticmethod
    def _empty(entry):
        return not entry[0] and not entry[1]

    def _side(self, cx, channel, delta):
        items = [(k, (k, v, w)) for (k, v), w in _consolidated(delta)]
        return self._shuffle(cx, channel, items)

    def eval(self, cx, inputs):
        da = self._side(cx, self.channel, inputs[0])
        db = self._side(cx, self.channel + 1, inputs[1])
        f, entries, out = self.f, self.entries, []
        for _, (k, a, wa) in da:
            entry = entries.get(k)
            if entry is not None:
                out.extend((f(k, a, b), wa * wb) for b, wb in entry[1].items())
        for kb, (k, a, wa) in da:
            entry = entries.get(k)
            if entry is None:
                entries[k] = entry = ({}, {})
            self._mark(k, kb)
            _add(entry[0], a, wa)
        for _, (k, b, wb) in db:
            entry = entries.get(k)
            if entry is not None:
                out.extend((f(k, a, b), wa * wb) for a, wa in entry[0].items())
        for kb, (k, b, wb) in db:
            entry = entries.get(k)
            if entry is None:
                entries[k] = entry = ({}, {})
            self._mark(k, kb)
            _add(entry[1], b, wb)
        for k in {k for _, (k, _, _) in da} | {k for _, (k, _, _) in db}:
            entry = entries.get(k)
            if entry is not None and self._empty(entry):
                self._drop(k)
        return out
