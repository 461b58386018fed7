"""The operators: stateless ones map a delta to a delta; stateful ones
(keyed aggregates, ``distinct``, ``join``) re-shard their input by key
through the exchange and keep their state split by shard.

Every stateful operator has ``stateful = True``, a ``name`` recorded in
snapshots, a ``dirty`` set of changed shards, and ``snapshot(only)``,
``restore(shard, entries)`` and ``forget(shards)``.

A key, and a record in a multiset, is identified by its canonical bytes
(``values.key_bytes``: JSON with sorted object fields), never by Python
equality: ``1``, ``1.0`` and ``True`` are equal in Python but are three
records on the wire, and two objects with their fields in another order
are one. The exchange routes by the same bytes, so a key's state is one
entry on one worker at any W, and values need not be hashable.
"""

import pickle

from . import values as _values
from .errors import CircuitError
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
    """Consolidates the delta by its canonical JSON (object fields sorted):
    one ``(bytes, weight)`` per distinct record with a non-zero weight, in
    byte order (so a replay writes the same bytes whatever order the records
    came in)."""

    name = "output"

    def __init__(self, port):
        self.port = port

    def eval(self, cx, inputs):
        encode = _values.encode
        total = {}
        try:
            for v, w in inputs[0]:
                b = encode(v)
                total[b] = total.get(b, 0) + w
        except (TypeError, ValueError) as e:
            raise CircuitError("failed", f"an output record is not JSON: {e}") from None
        cx.outputs[self.port] = sorted((b, w) for b, w in total.items() if w != 0)
        return None


def _wrap64(n):
    """``n`` wrapped to a signed 64-bit integer, as the Rust SDK's sums."""
    if type(n) is int and not -(1 << 63) <= n < (1 << 63):
        return ((n + (1 << 63)) % (1 << 64)) - (1 << 63)
    return n


class Keyed:
    """Base of stateful operators: entries by key bytes, each key's shard
    remembered (computed once, when the key is new), changed shards in
    ``dirty``. An entry's first element is the key itself."""

    stateful = True

    def __init__(self, channel):
        self.channel = channel
        self.entries = {}
        self.shards = {}
        self.dirty = set()

    def _mark(self, kb):
        shard = self.shards.get(kb)
        if shard is None:
            shard = shard_of(kb)
            self.shards[kb] = shard
        self.dirty.add(shard)

    def _drop(self, kb):
        del self.entries[kb]
        del self.shards[kb]

    def _shuffle(self, cx, channel, items):
        """Sends ``(key bytes, payload)`` items to the workers owning their
        keys; returns what this worker owns, the same way. With one worker
        nothing moves (and nothing is pickled)."""
        exchange = cx.exchange
        if exchange.workers() == 1:
            return items
        dumps, loads = pickle.dumps, pickle.loads
        sent = [(kb, dumps(p, protocol=5), 1) for kb, p in items]
        return [(kb, loads(p)) for kb, p, _ in exchange.shuffle(channel, sent)]

    def snapshot(self, only):
        by_shard = {}
        shards = self.shards
        for kb, entry in self.entries.items():
            s = shards[kb]
            if only is None or s in only:
                by_shard.setdefault(s, []).append((kb, entry))
        return by_shard

    def restore(self, shard, entries):
        """Adds a piece of ``shard`` (its keys all lie there: their shard is
        not computed again)."""
        for kb, entry in entries:
            mine = self.entries.get(kb)
            if mine is None:
                self.entries[kb] = entry
                self.shards[kb] = shard
            else:
                self._merge(mine, entry)
                if self._empty(mine):
                    self._drop(kb)

    def forget(self, shards):
        for kb in [k for k, s in self.shards.items() if s in shards]:
            self.dirty.add(self.shards[kb])
            self._drop(kb)


class GroupSum(Keyed):
    """``count_by``, ``sum_by``, ``avg_by``: per key ``[key, count, sum]``,
    combined on this worker before they cross the exchange."""

    name = "keyed_sum"

    def __init__(self, channel, key, value, kind):
        super().__init__(channel)
        self.key = key
        self.value = value
        self.kind = kind
        # A count does not restore as a sum (its sums hold nothing).
        self.state_shape = "count" if kind == "count" else "sum"
        # (old state version, rekey) of `migrates_keys_from`, if given.
        self.migration = None

    def migrate(self, entries):
        """Adds entries of an earlier version's state through the migration:
        each key ``k`` becomes ``rekey(k)``, in that key's shard; entries
        whose new keys meet add up."""
        rekey, kb_of = self.migration[1], _values.key_bytes
        for _, entry in entries:
            key = rekey(entry[0])
            kb = kb_of(key)
            mine = self.entries.get(kb)
            if mine is None:
                self.entries[kb] = [key, entry[1], entry[2]]
                self._mark(kb)
                continue
            self._merge(mine, entry)
            self._mark(kb)
            if self._empty(mine):
                self._drop(kb)

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
        mine[1] += other[1]
        mine[2] = _wrap64(mine[2] + other[2])

    @staticmethod
    def _empty(entry):
        return entry[1] == 0 and entry[2] == 0

    def eval(self, cx, inputs):
        key, value, kb_of = self.key, self.value, _values.key_bytes
        local = {}
        for v, w in inputs[0]:
            k = key(v)
            kb = kb_of(k)
            acc = local.get(kb)
            if acc is None:
                local[kb] = acc = [k, 0, 0]
            acc[1] += w
            if value is not None:
                acc[2] += value(v) * w
        items = [(kb, acc) for kb, acc in local.items() if acc[1] != 0 or acc[2] != 0]
        touched = {}
        entries = self.entries
        for kb, (k, c, s) in self._shuffle(cx, self.channel, items):
            entry = entries.get(kb)
            if entry is None:
                entries[kb] = entry = [k, 0, 0]
            if kb not in touched:
                touched[kb] = (entry[1], entry[2])
            self._mark(kb)
            entry[1] += c
            entry[2] = _wrap64(entry[2] + s)
        out = []
        for kb, (count, total) in touched.items():
            entry = entries[kb]
            old = self._emit(count, total)
            new = self._emit(entry[1], entry[2])
            if entry[1] == 0 and entry[2] == 0:
                self._drop(kb)
            if old != new:
                k = entry[0]
                if old is not None:
                    out.append(((k, old), -1))
                if new is not None:
                    out.append(((k, new), 1))
        return out


def _add(group, vb, value, weight):
    """Adds ``weight`` copies of ``value`` (canonical bytes ``vb``) to the
    multiset ``group`` (``{bytes: [value, weight]}``)."""
    slot = group.get(vb)
    if slot is None:
        if weight != 0:
            group[vb] = [value, weight]
    else:
        slot[1] += weight
        if slot[1] == 0:
            del group[vb]


def _merge_groups(mine, other):
    for vb, (value, weight) in other.items():
        _add(mine, vb, value, weight)


def _pairs(delta, key, value):
    """The delta as ``(key bytes, [key, value bytes, value, weight])``,
    consolidated by the bytes of both."""
    kb_of = _values.key_bytes
    total = {}
    for r, w in delta:
        k, v = key(r), value(r)
        kb, vb = kb_of(k), kb_of(v)
        slot = total.get((kb, vb))
        if slot is None:
            total[(kb, vb)] = [k, vb, v, w]
        else:
            slot[3] += w
    return [(kb, slot) for (kb, _), slot in total.items() if slot[3] != 0]


class Group(Keyed):
    """The keyed group behind ``min_by``, ``max_by``, ``top_k_by`` and
    ``fold_by``: per key ``[key, multiset of values]``; for a touched key,
    ``reduce`` of its values (sorted, with their weights) before and after
    the change, and the difference emitted. Exact under deletes."""

    def __init__(self, channel, name, key, value, reduce):
        super().__init__(channel)
        self.name = name
        self.key = key
        self.value = value
        self.reduce = reduce

    @staticmethod
    def _merge(mine, other):
        _merge_groups(mine[1], other[1])

    @staticmethod
    def _empty(entry):
        return not entry[1]

    def _result(self, group):
        """``reduce`` of the group's ``(value, weight)`` in value order (the
        values' bytes break ties between equal values), as ``{out bytes:
        [out, weight]}``."""
        if not group:
            return {}
        try:
            items = sorted(group.items(), key=lambda e: (e[1][0], e[0]))
        except TypeError as e:
            raise CircuitError(
                "failed",
                f"{self.name}: values must be orderable (numbers, strings, tuples of them): {e}",
            ) from None
        result = {}
        kb_of = _values.key_bytes
        for out, w in self.reduce([(v, w) for _, (v, w) in items]):
            _add(result, kb_of(out), out, w)
        return result

    def eval(self, cx, inputs):
        items = _pairs(inputs[0], self.key, self.value)
        touched = {}
        entries = self.entries
        for kb, (k, vb, v, w) in self._shuffle(cx, self.channel, items):
            entry = entries.get(kb)
            if entry is None:
                entries[kb] = entry = [k, {}]
            if kb not in touched:
                touched[kb] = self._result(entry[1])
            self._mark(kb)
            _add(entry[1], vb, v, w)
        out = []
        for kb, old in touched.items():
            entry = entries[kb]
            new = self._result(entry[1])
            if not entry[1]:
                self._drop(kb)
            k = entry[0]
            for ob, (o, w) in old.items():
                n = new.get(ob)
                diff = (n[1] if n else 0) - w
                if diff:
                    out.append(((k, o), diff))
            for ob, (o, w) in new.items():
                if ob not in old:
                    out.append(((k, o), w))
        return out


def smallest(values):
    """The smallest value with a positive weight, once."""
    return [(v, 1) for v, w in values if w > 0][:1]


def largest(values):
    """The largest value with a positive weight, once."""
    return [(v, 1) for v, w in reversed(values) if w > 0][:1]


def top(k):
    """The ``k`` largest values, a value present n times counted n times."""

    def reduce(values):
        left, out = k, []
        for v, w in reversed(values):
            if left <= 0:
                break
            if w > 0:
                n = min(w, left)
                out.append((v, n))
                left -= n
        return out

    return reduce


def fold(init, step):
    """``step(acc, value, weight)`` over the group's values in order, from
    ``init``: the one result."""

    def reduce(values):
        acc = init
        for v, w in values:
            acc = step(acc, v, w)
        return [(acc, 1)]

    return reduce


class Distinct(Keyed):
    """``distinct``: each record once while its weight is positive; per
    record ``[record, weight]``."""

    name = "distinct"

    @staticmethod
    def _merge(mine, other):
        mine[1] += other[1]

    @staticmethod
    def _empty(entry):
        return entry[1] == 0

    def eval(self, cx, inputs):
        kb_of = _values.key_bytes
        local = {}
        for v, w in inputs[0]:
            vb = kb_of(v)
            slot = local.get(vb)
            if slot is None:
                local[vb] = [v, w]
            else:
                slot[1] += w
        items = [(vb, slot) for vb, slot in local.items() if slot[1] != 0]
        out = []
        entries = self.entries
        for vb, (v, w) in self._shuffle(cx, self.channel, items):
            entry = entries.get(vb)
            if entry is None:
                entries[vb] = entry = [v, 0]
            old = entry[1]
            entry[1] = new = old + w
            self._mark(vb)
            if new == 0:
                self._drop(vb)
            if old <= 0 < new:
                out.append((entry[0], 1))
            elif new <= 0 < old:
                out.append((entry[0], -1))
        return out


def _first(pair):
    return pair[0]


def _second(pair):
    return pair[1]


class Join(Keyed):
    """Inner join of two indexed streams: Δ(A⋈B) = ΔA⋈B + A'⋈ΔB, each side
    integrated per key as a multiset: per key ``[key, left, right]``."""

    name = "join"

    def __init__(self, channel, f):
        super().__init__(channel)
        self.f = f

    @staticmethod
    def _merge(mine, other):
        _merge_groups(mine[1], other[1])
        _merge_groups(mine[2], other[2])

    @staticmethod
    def _empty(entry):
        return not entry[1] and not entry[2]

    def _entry(self, kb, k):
        entry = self.entries.get(kb)
        if entry is None:
            self.entries[kb] = entry = [k, {}, {}]
        self._mark(kb)
        return entry

    def eval(self, cx, inputs):
        da = self._shuffle(cx, self.channel, _pairs(inputs[0], _first, _second))
        db = self._shuffle(cx, self.channel + 1, _pairs(inputs[1], _first, _second))
        f, entries, out = self.f, self.entries, []
        for kb, (k, _, a, wa) in da:
            entry = entries.get(kb)
            if entry is not None:
                out.extend((f(k, a, b), wa * wb) for b, wb in entry[2].values())
        for kb, (k, vb, a, wa) in da:
            _add(self._entry(kb, k)[1], vb, a, wa)
        for kb, (k, _, b, wb) in db:
            entry = entries.get(kb)
            if entry is not None:
                out.extend((f(k, a, b), wa * wb) for a, wa in entry[1].values())
        for kb, (k, vb, b, wb) in db:
            _add(self._entry(kb, k)[2], vb, b, wb)
        for kb, _ in da + db:
            entry = entries.get(kb)
            if entry is not None and self._empty(entry):
                self._drop(kb)
        return out


class LeftJoin(Join):
    """Left outer join: ``f(k, a, b)`` for every match, and ``f(k, a, None)``
    for a left record whose key has no right record with a positive weight.
    Each touched key's rows are recomputed: deleted before the change,
    inserted after."""

    name = "left_join"

    def _rows(self, kb, sign, out):
        entry = self.entries.get(kb)
        if entry is None or not entry[1]:
            return
        k, left, right = entry
        f = self.f
        if any(w > 0 for _, w in right.values()):
            for a, wa in left.values():
                out.extend((f(k, a, b), sign * wa * wb) for b, wb in right.values())
        else:
            out.extend((f(k, a, None), sign * wa) for a, wa in left.values())

    def eval(self, cx, inputs):
        da = self._shuffle(cx, self.channel, _pairs(inputs[0], _first, _second))
        db = self._shuffle(cx, self.channel + 1, _pairs(inputs[1], _first, _second))
        touched = list(dict.fromkeys(kb for kb, _ in da + db))
        out = []
        for kb in touched:
            self._rows(kb, -1, out)
        for kb, (k, vb, a, wa) in da:
            _add(self._entry(kb, k)[1], vb, a, wa)
        for kb, (k, vb, b, wb) in db:
            _add(self._entry(kb, k)[2], vb, b, wb)
        for kb in touched:
            self._rows(kb, 1, out)
            entry = self.entries.get(kb)
            if entry is not None and self._empty(entry):
                self._drop(kb)
        return out
