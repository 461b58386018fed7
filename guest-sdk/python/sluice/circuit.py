"""The circuit: a graph of operators built once by user code, then run one
step at a time on Z-set deltas.

A delta is a list of ``(value, weight)`` pairs: weight +1 inserts a record,
-1 deletes one. Every operator turns the deltas of one step into the delta
of its output, keeping whatever state it needs; stateful operators keep it
split by shard (see ``shard``) so the host can checkpoint it incrementally
and move shards between workers.
"""

import pickle

from . import values as _values
from .errors import CircuitError
from .operators import (
    Distinct,
    Filter,
    FlatMap,
    Group,
    GroupSum,
    Input,
    Join,
    LeftJoin,
    Map,
    Negate,
    Output,
    Union,
    fold,
    largest,
    smallest,
    top,
)
from .shard import SHARDS, xxh3_64

ENVELOPE_FORMAT = 2
"""The format of a snapshot piece this SDK writes: per stateful operator
its identity, kind, state shape and entries. Format 1 (per operator its
node index, kind and entries) still restores."""

INDEXED_FORMAT = 1


class Node:
    """An operator in the graph, with the nodes it reads."""

    __slots__ = ("op", "inputs", "id", "default_id", "formerly")

    def __init__(self, op, inputs):
        self.op = op
        self.inputs = inputs
        # A stateful operator's identity in snapshots (``Stream.named``, else
        # its default ``kind#n/total``), resolved when the circuit is built.
        self.id = ""
        self.default_id = ""
        # Identities of earlier versions it takes state under too
        # (``Stream.formerly``).
        self.formerly = []

    def answers_to(self, id_):
        """Whether a snapshot's state of operator ``id_`` is this node's."""
        return id_ in (self.id, self.default_id) or id_ in self.formerly

    def aliases(self):
        """Its identities other than ``id``."""
        default = [self.default_id] if self.default_id != self.id else []
        return default + list(self.formerly)


class StepContext:
    """What an operator may touch while it runs one step."""

    __slots__ = ("inputs", "outputs", "exchange")

    def __init__(self, inputs, outputs, exchange):
        self.inputs = inputs
        self.outputs = outputs
        self.exchange = exchange


class Circuit:
    """The builder a circuit's build function is given.

    ``c.input("lines")`` declares an input port and returns its ``Stream``;
    the streams' methods add operators; ``stream.output("counts")`` declares
    an output port. The build function runs once per worker instance, so it
    must build the same graph every time.
    """

    def __init__(self):
        self._nodes = []
        self._inputs = []
        self._outputs = []
        self._version = 1
        self._errors = []

    def input(self, name: str) -> "Stream":
        """Declares input port ``name``: its events, JSON decoded (objects as
        ``Record``, arrays as tuples), with their weights."""
        self._port(self._inputs, "input", name)
        return Stream(self, self._add(Input(len(self._inputs) - 1), []))

    def snapshot_version(self, version: int) -> None:
        """Sets the version recorded in snapshots (default 1); a restore of a
        snapshot of another version is refused."""
        self._version = int(version)

    def _port(self, ports, kind, name):
        if not isinstance(name, str) or not name or name in ports:
            self._errors.append(f"{kind} port {name!r} is empty or declared twice")
        ports.append(name)

    def _add(self, op, inputs):
        self._nodes.append(Node(op, inputs))
        return len(self._nodes) - 1

    def _channel(self):
        # As the Rust SDK: a keyed operator's exchange channels are derived
        # from its position, 16 per operator.
        return len(self._nodes) << 4


class Stream:
    """A stream of records in the circuit being built. Methods add operators
    and return their output streams; see the SDK's README for the list."""

    __slots__ = ("_circuit", "_node")

    def __init__(self, circuit, node):
        self._circuit = circuit
        self._node = node

    def _unary(self, op):
        return Stream(self._circuit, self._circuit._add(op, [self._node]))

    def _binary(self, other, op):
        if other._circuit is not self._circuit:
            raise ValueError("both streams must belong to the same circuit")
        return Stream(self._circuit, self._circuit._add(op, [self._node, other._node]))

    def map(self, f) -> "Stream":
        """``f(record)`` for every record."""
        return self._unary(Map(f))

    def filter(self, keep) -> "Stream":
        """The records for which ``keep(record)`` is true."""
        return self._unary(Filter(keep))

    def flat_map(self, f) -> "Stream":
        """Every item of the iterable ``f(record)``, for every record."""
        return self._unary(FlatMap(f))

    def key_by(self, key) -> "Stream":
        """``(key(record), record)`` pairs: an indexed stream, as ``join``
        takes."""
        return self.map(lambda r: (key(r), r))

    def union(self, *others) -> "Stream":
        """The records of this stream and of ``others``."""
        node = self._circuit._add(Union(), [self._node] + [o._node for o in others])
        return Stream(self._circuit, node)

    def negate(self) -> "Stream":
        """Every record with its weight negated."""
        return self._unary(Negate())

    def count_by(self, key) -> "Stream":
        """``(key, count)`` for every key with a positive count. When a count
        changes the old pair is deleted and the new one inserted. Re-shards
        by key."""
        return self._unary(GroupSum(self._circuit._channel(), key, None, "count"))

    def sum_by(self, key, value) -> "Stream":
        """``(key, sum of value(record))`` per key with records (each record
        counted with its weight). Re-shards by key."""
        return self._unary(GroupSum(self._circuit._channel(), key, value, "sum"))

    def avg_by(self, key, value) -> "Stream":
        """``(key, average of value(record))`` per key with records, a float
        (the sum and the count as floats, divided: the Rust SDK's rounding).
        ``value`` must return integers. Re-shards by key."""
        return self._unary(GroupSum(self._circuit._channel(), key, value, "avg"))

    def min_by(self, key, value) -> "Stream":
        """``(key, smallest value(record))`` per key with records, exact under
        deletes. Re-shards by key."""
        return self._unary(Group(self._circuit._channel(), "min_by", key, value, smallest))

    def max_by(self, key, value) -> "Stream":
        """``(key, largest value(record))`` per key with records, exact under
        deletes. Re-shards by key."""
        return self._unary(Group(self._circuit._channel(), "max_by", key, value, largest))

    def top_k_by(self, key, value, k: int) -> "Stream":
        """``(key, value)`` for the ``k`` largest values of each key (a value
        present n times counts n times; negate numbers for the smallest).
        When the top k change, what left is deleted and what entered
        inserted. Re-shards by key."""
        return self._unary(Group(self._circuit._channel(), "top_k_by", key, value, top(k)))

    def fold_by(self, key, value, init, step) -> "Stream":
        """``(key, result)`` per key with records: ``step(acc, value,
        weight)`` over the key's distinct values in order, with their
        integrated weights, from ``init``. The values are kept, so deletes
        need no inverse: the key is folded again. Re-shards by key."""
        return self._unary(
            Group(self._circuit._channel(), "fold_by", key, value, fold(init, step))
        )

    def distinct(self) -> "Stream":
        """Each record once, while its weight is positive. Re-shards by
        record."""
        return self._unary(Distinct(self._circuit._channel()))

    def join(self, other: "Stream", f) -> "Stream":
        """Inner join of two indexed streams (``(key, value)`` pairs, see
        ``key_by``): ``f(key, a, b)`` for every ``(key, a)`` here and
        ``(key, b)`` in ``other``, with the product of their weights.
        Re-shards both by key."""
        return self._binary(other, Join(self._circuit._channel(), f))

    def left_join(self, other: "Stream", f) -> "Stream":
        """Left outer join: like ``join``, plus ``f(key, a, None)`` for every
        ``(key, a)`` whose key has no record in ``other``; that row is
        deleted when the first match arrives and comes back when the last
        goes. Re-shards both by key."""
        return self._binary(other, LeftJoin(self._circuit._channel(), f))

    def tumbling(self, ts, size: int) -> "Stream":
        """``(Window, record)`` with the window ``[start, start + size)``
        holding ``ts(record)``, windows starting at multiples of ``size``."""
        return self.hopping(ts, size, size)

    def hopping(self, ts, size: int, hop: int) -> "Stream":
        """``(Window, record)`` for every window ``[start, start + size)``
        holding ``ts(record)``, windows starting at multiples of ``hop``."""
        if size <= 0 or hop <= 0:
            self._circuit._errors.append(f"window size ({size}) and hop ({hop}) must be positive")
            size, hop = max(size, 1), max(hop, 1)
        Window = _values.Window

        def windows(record):
            at = ts(record)
            start = at // hop * hop
            out = []
            while start + size > at:
                out.append((Window(start, start + size), record))
                start -= hop
            return out

        return self.flat_map(windows)

    def named(self, name: str) -> "Stream":
        """Names the stateful operator that produced this stream (the
        nearest one upstream through stateless one-input operators such as
        ``map``): its identity in checkpoints, as the Rust SDK's
        ``Stream::named``. A checkpoint's state goes back to the operator of
        the same identity wherever it sits, so a circuit changed around it
        still restores it. Unnamed, an operator is ``kind#n/total``, the
        n-th of the stateful operators of its kind in build order."""
        c = self._circuit
        node = c._nodes[self._node]
        while not node.op.stateful and len(node.inputs) == 1:
            node = c._nodes[node.inputs[0]]
        if not node.op.stateful:
            c._errors.append(
                f"named({name!r}): no single stateful operator produced this stream (it "
                "comes from an input port or merges several streams: name each of them)"
            )
        elif node.id:
            c._errors.append(f"named({name!r}): the operator is named {node.id!r} already")
        elif not isinstance(name, str) or not name or "#" in name:
            c._errors.append(
                f"named({name!r}): a name is a non-empty string without `#` (kept for defaults)"
            )
        else:
            node.id = name
        return self

    def formerly(self, id_: str) -> "Stream":
        """Gives the stateful operator that produced this stream (as
        ``named`` finds it) an identity of an earlier version of the
        circuit, whose state it takes from that version's snapshots: for an
        operator renamed, or one whose default identity changed because
        another operator of its kind was added or removed (as the Rust
        SDK's ``Stream::formerly``)."""
        c = self._circuit
        node = c._nodes[self._node]
        while not node.op.stateful and len(node.inputs) == 1:
            node = c._nodes[node.inputs[0]]
        if not node.op.stateful or not isinstance(id_, str) or not id_:
            c._errors.append(
                f"formerly({id_!r}): no single stateful operator produced this stream, or "
                "the identity is empty"
            )
        else:
            node.formerly.append(id_)
        return self

    def _stateful(self, what):
        """The stateful node that produced this stream (as ``named`` finds
        it), or None after recording a build error starting with ``what``."""
        c = self._circuit
        node = c._nodes[self._node]
        while not node.op.stateful and len(node.inputs) == 1:
            node = c._nodes[node.inputs[0]]
        if not node.op.stateful:
            c._errors.append(f"{what}: no single stateful operator produced this stream")
            return None
        return node

    def state_version(self, version: int) -> "Stream":
        """Declares that the meaning of the state of the stateful operator
        that produced this stream changed although its shape did not (its
        keys are normalized differently now): version ``version`` (0 until
        bumped) is part of its state shape, so an upgrade from a version of
        the circuit with another state version refuses the old state —
        unless the operator migrates it (``migrates_keys_from``) or the
        upgrade starts it empty. As the Rust SDK's ``Stream::state_version``."""
        node = self._stateful(f"state_version({version!r})")
        if node is not None:
            node.op.state_version = int(version)
        return self

    def migrates_keys_from(self, old_version: int, rekey) -> "Stream":
        """Gives the keyed sum that produced this stream (``count_by``,
        ``sum_by``, ``avg_by``) a migration of its state from the version of
        the circuit whose state version was ``old_version``: on an upgrade
        from that version, every old key ``k`` becomes ``rekey(k)`` and keeps
        its count and sum; old keys that become one key add up. It runs on
        every recovery from the upgrade's checkpoint too, so it must be
        deterministic. As the Rust SDK's ``Stream::migrates_keys_from``
        (whose keys have types; here the state version tells the old state
        from the new)."""
        c = self._circuit
        what = f"migrates_keys_from({old_version!r})"
        node = self._stateful(what)
        if node is None:
            return self
        if not hasattr(node.op, "migrate"):
            c._errors.append(f"{what}: a {node.op.name} has no state migrations")
        elif getattr(node.op, "migration", None) is not None:
            c._errors.append(f"{what}: the operator has a migration already")
        else:
            node.op.migration = (int(old_version), rekey)
        return self

    def output(self, name: str) -> None:
        """Declares output port ``name``: this stream's deltas, consolidated,
        written as JSON."""
        c = self._circuit
        c._port(c._outputs, "output", name)
        self._unary(Output(len(c._outputs) - 1))


class LocalExchange:
    """The exchange of a single-worker circuit: every event stays here."""

    def workers(self) -> int:
        return 1

    def shuffle(self, channel, events):
        return events


class Instance:
    """A built circuit that runs steps: what one worker instance holds."""

    def __init__(self, build):
        c = Circuit()
        build(c)
        stateful = [n for n in c._nodes if n.op.stateful]
        _resolve_identities(stateful, c._errors)
        # An earlier identity is one operator's: a snapshot's state must
        # have one place to go.
        for node in stateful:
            for old in node.formerly:
                for other in stateful:
                    if other is not node and other.answers_to(old):
                        c._errors.append(
                            f"formerly({old!r}) of {node.id!r}: {other.id!r} answers to that "
                            "identity too"
                        )
        # A migration from the operator's own state would never run.
        for node in stateful:
            if _shape(node.op) in _migration_shapes(node.op):
                c._errors.append(
                    f"the migration of {node.id!r} is from its own state shape and version: "
                    "bump its state_version to say the state changed meaning"
                )
        if c._errors:
            raise CircuitError("failed", "; ".join(c._errors))
        self.inputs = list(c._inputs)
        self.outputs = list(c._outputs)
        self.snapshot_version = c._version
        self._nodes = c._nodes
        self._stateful = [n.op for n in self._nodes if n.op.stateful]
        self._stateful_nodes = [n for n in self._nodes if n.op.stateful]

    def step(self, inputs, exchange=None):
        """Runs one step. ``inputs[p]`` is input port ``p``'s delta (decoded
        values with weights); returns, per output port, the consolidated
        delta as ``(JSON bytes, weight)`` pairs in byte order."""
        exchange = exchange or LocalExchange()
        if len(inputs) > len(self.inputs):
            raise CircuitError(
                "protocol", f"step got {len(inputs)} input ports, the circuit has {len(self.inputs)}"
            )
        inputs = list(inputs) + [[] for _ in range(len(self.inputs) - len(inputs))]
        outputs = [[] for _ in self.outputs]
        cx = StepContext(inputs, outputs, exchange)
        results = []
        for node in self._nodes:
            results.append(node.op.eval(cx, [results[i] for i in node.inputs]))
        return outputs

    def operators(self):
        """The stateful operators in build order, as ``(identity, kind,
        state shape)``: what two versions of a circuit are compared by."""
        return [(n.id, n.op.name, _shape(n.op)) for n in self._stateful_nodes]

    def _pieces(self, only):
        by_shard = {}
        for node in self._stateful_nodes:
            op = node.op
            for shard, entries in op.snapshot(only).items():
                by_shard.setdefault(shard, []).append((node.id, op.name, _shape(op), entries))
        return {
            shard: pickle.dumps((ENVELOPE_FORMAT, self.snapshot_version, ops), protocol=5)
            for shard, ops in sorted(by_shard.items())
        }

    def snapshot(self):
        """The state as pieces, ``{shard: bytes}`` for every shard holding
        any; every shard is unchanged afterwards."""
        pieces = self._pieces(None)
        for op in self._stateful:
            op.dirty.clear()
        return pieces

    def snapshot_changed(self):
        """The shards changed since the last snapshot (or restore), and their
        pieces written whole: ``(changed, {shard: bytes})``."""
        changed = set()
        for op in self._stateful:
            changed |= op.dirty
        pieces = self._pieces(changed)
        for op in self._stateful:
            op.dirty.clear()
        return sorted(changed), pieces

    def export_shards(self, shards):
        """The pieces of ``shards``, which are then forgotten."""
        only = set(shards)
        pieces = self._pieces(only)
        for op in self._stateful:
            op.forget(only)
        return pieces

    def restore(self, pieces):
        """Adds pieces (``(shard, bytes)`` pairs) of a circuit with the same
        shape and snapshot version to the state."""
        for shard, piece in pieces:
            fmt, version, ops = _read_piece(shard, piece)
            if fmt not in (ENVELOPE_FORMAT, INDEXED_FORMAT):
                raise CircuitError(
                    "incompatible-snapshot",
                    f"piece format {fmt} (this SDK reads {INDEXED_FORMAT} and {ENVELOPE_FORMAT})",
                )
            if version != self.snapshot_version:
                raise CircuitError(
                    "incompatible-snapshot",
                    f"snapshot version {version} but the circuit reads version "
                    f"{self.snapshot_version}",
                )
            if fmt == INDEXED_FORMAT:
                targets = [self._node_at(index, name) for index, name, _ in ops]
                for node, (_, _, entries) in zip(targets, ops):
                    node.op.restore(shard, entries)
                continue
            # Every operator is found before any takes its state: a piece
            # refused is not half restored.
            targets = [self._node_named(id_, kind, shape) for id_, kind, shape, _ in ops]
            for node, (_, _, _, entries) in zip(targets, ops):
                node.op.restore(shard, entries)

    def upgrade(self, pieces, start_empty=()):
        """Adds pieces (``(shard, bytes)`` pairs) written by ``snapshot`` of
        another version of this circuit: each operator's state goes to the
        operator of the same identity if its kind and state shape are the
        same (an identity no operator has goes to the one answering to it,
        ``named`` since or ``formerly``, unless that one's own identity is in
        the pieces). One whose kind or shape changed is refused naming it,
        unless ``start_empty`` names it; an operator ``start_empty`` names
        starts empty whatever its old state; one the new version lacks is
        dropped; one the pieces do not hold starts empty. Pieces of another
        snapshot version are refused, as by ``restore``. Every piece is read
        and every operator's fate decided before any state is taken."""
        start_empty = set(start_empty)
        ids = {n.id for n in self._stateful_nodes}
        for name in sorted(start_empty - ids):
            raise CircuitError(
                "incompatible-snapshot",
                f"`{name}` is to start empty, but the circuit has no stateful operator "
                "of that identity",
            )
        read = []
        for shard, piece in pieces:
            fmt, version, ops = _read_piece(shard, piece)
            if fmt != ENVELOPE_FORMAT:
                raise CircuitError(
                    "incompatible-snapshot",
                    f"a piece of shard {shard} is of format {fmt}, written before operators "
                    f"had identities: an upgrade needs format {ENVELOPE_FORMAT} (restore it "
                    "with the circuit that wrote it and take a checkpoint first)",
                )
            if version != self.snapshot_version:
                raise CircuitError(
                    "incompatible-snapshot",
                    f"snapshot version {version} but the circuit reads version "
                    f"{self.snapshot_version}: it declares the old state unreadable",
                )
            read.append((shard, ops))
        old_ids = {op[0] for _, ops in read for op in ops}
        taken, plans = {}, []
        for shard, ops in read:
            fates = []
            for id_, kind, shape, _ in ops:
                node = self._target(id_, old_ids)
                if node is not None and taken.setdefault(id(node), id_) != id_:
                    raise CircuitError(
                        "incompatible-snapshot",
                        f"operator `{node.id}` answers to both `{taken[id(node)]}` and "
                        f"`{id_}` of the snapshot: give it one of them (`named` or `formerly`)",
                    )
                fates.append(self._fate(node, kind, shape, start_empty))
            plans.append((shard, ops, fates))
        for shard, ops, fates in plans:
            for fate, (id_, _, _, entries) in zip(fates, ops):
                if fate is None:
                    continue
                node, migrate = fate
                if not migrate:
                    node.op.restore(shard, entries)
                    continue
                try:
                    node.op.migrate(entries)
                except CircuitError:
                    raise
                except Exception as e:  # noqa: BLE001 - the user's function
                    raise CircuitError(
                        "incompatible-snapshot", f"operator `{id_}`: its migration failed: {e!r}"
                    ) from None

    def _target(self, id_, old_ids):
        """The node that takes the snapshot's operator ``id_``, if any: the
        one of that identity; else, if no node has it, the one answering to
        it under another identity whose own identity is not in the snapshot
        (there, it takes its own state)."""
        nodes = self._stateful_nodes
        exact = next((n for n in nodes if n.id == id_), None)
        if exact is not None:
            return exact
        return next((n for n in nodes if n.answers_to(id_) and n.id not in old_ids), None)

    def _fate(self, node, kind, shape, start_empty):
        """``(node, migrate)`` if ``node`` takes the old state of the given
        kind and shape — as it is, or through its migration — None where
        the state is dropped."""
        if node is None or node.id in start_empty:
            return None
        if node.op.name == kind and _shape(node.op) == shape:
            return (node, False)
        if node.op.name == kind and shape in _migration_shapes(node.op):
            return (node, True)
        raise CircuitError(
            "incompatible-snapshot",
            f"operator `{node.id}` changed: the snapshot holds a {kind} of another shape "
            f"({shape or 'plain'}) than the circuit's {node.op.name} "
            f"({_shape(node.op) or 'plain'}); start it empty, keep its kind and shape, or "
            "give it a migration from the old state",
        )

    def _node_at(self, index, name):
        node = self._nodes[index] if 0 <= index < len(self._nodes) else None
        if node is None or not node.op.stateful or node.op.name != name:
            raise CircuitError(
                "incompatible-snapshot",
                f"operator {index} `{name}` in the snapshot is not a stateful "
                "operator of that name in the circuit",
            )
        return node

    def _node_named(self, id_, kind, shape):
        def refuse(why):
            return CircuitError(
                "incompatible-snapshot", f"operator `{id_}` ({kind}) in the snapshot {why}"
            )

        node = next((n for n in self._stateful_nodes if n.answers_to(id_)), None)
        if node is None:
            hint = (
                " (an unnamed operator is known by its place among those of its kind: "
                "adding or removing one renames the others)"
                if "#" in id_
                else ""
            )
            raise refuse(f"is not in the circuit{hint}")
        if node.op.name != kind:
            raise refuse(f"is a {node.op.name} in the circuit")
        if _shape(node.op) != shape:
            raise refuse(f"holds state of another shape ({shape}, the circuit's {_shape(node.op)})")
        return node


def _read_piece(shard, piece):
    """A snapshot piece of ``shard`` as ``(format, snapshot version,
    operators)``, or the error of a piece no instance reads."""
    if not 0 <= shard < SHARDS:
        raise CircuitError("incompatible-snapshot", f"a piece of shard {shard}")
    try:
        fmt, version, ops = pickle.loads(piece)
    except Exception as e:  # noqa: BLE001 - any unreadable piece
        raise CircuitError("incompatible-snapshot", f"unreadable piece: {e}") from None
    return fmt, version, ops


def fingerprint(kind, shape):
    """An operator's state fingerprint, as the component describes it: a
    hash of its kind and state shape (XXH3 of ``kind(shape)``)."""
    return xxh3_64(f"{kind}({shape})".encode())


def _shape(op):
    """What an operator's state holds beyond its kind (a keyed sum's: counts
    only, or sums of values), with its state version if bumped
    (``Stream.state_version``), checked on restore."""
    return _versioned(getattr(op, "state_shape", ""), getattr(op, "state_version", 0))


def _versioned(shape, version):
    """A state shape of state version ``version``: as it is for version 0
    (so that shapes from before versions stay what they were), else with
    the version after it (as the Rust SDK's ``identity::versioned``)."""
    return shape if version == 0 else f"{shape}; state version {version}"


def _migration_shapes(op):
    """The shapes of earlier versions of an operator's state it migrates
    from (``Stream.migrates_keys_from``)."""
    migration = getattr(op, "migration", None)
    if migration is None:
        return []
    return [_versioned(getattr(op, "state_shape", ""), migration[0])]


def migrates_from(op):
    """The fingerprints of the earlier states ``op`` migrates from, as the
    component describes them."""
    return [fingerprint(op.name, shape) for shape in _migration_shapes(op)]


def _resolve_identities(nodes, errors):
    """Gives every stateful node its default identity, ``kind#n/total`` (named
    ones counted, so naming one leaves the others' as they were; ``total``
    so that adding or removing one of a kind renames the others instead of
    shifting their states), and that identity when it has no name; records
    an error for a name used twice."""
    totals = {}
    for node in nodes:
        totals[node.op.name] = totals.get(node.op.name, 0) + 1
    seen, per_kind = set(), {}
    for node in nodes:
        kind = node.op.name
        n = per_kind.get(kind, 0)
        per_kind[kind] = n + 1
        node.default_id = f"{kind}#{n}/{totals[kind]}"
        if not node.id:
            node.id = node.default_id
        if node.id in seen:
            errors.append(f"two stateful operators are named {node.id!r}")
        seen.add(node.id)
