"""The WIT glue: turns the component's exports into calls on an
``Instance`` and implements the exchange with the host's ``exchange.shuffle``
import. Users only call ``sluice.export(build)``.

Only a component built by componentize-py has the ``wit_world`` bindings;
natively (tests) this module is not imported.
"""

import os
import random
import sys
import traceback

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import exchange as wit_exchange
from wit_world.imports import types as wit

from .circuit import Instance, fingerprint
from .circuit import _shape as shape_of
from .circuit import migrates_from
from .errors import CircuitError
from .values import decode_all

_ERRORS = {
    "bad-input": wit.CircuitError_BadInput,
    "incompatible-snapshot": wit.CircuitError_IncompatibleSnapshot,
    "protocol": wit.CircuitError_Protocol,
    "failed": wit.CircuitError_Failed,
}


class _State:
    instance = None
    workers = 1


def _fail(e):
    if isinstance(e, CircuitError):
        return Err(_ERRORS[e.kind](e.message))
    if isinstance(e, Err):
        return e
    # A failure in the circuit's own code: name where it happened.
    frames = traceback.extract_tb(e.__traceback__)
    at = f" (at {frames[-1].filename}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""
    return Err(wit.CircuitError_Failed(f"{type(e).__name__}: {e}{at}"))


def _pack(events):
    """``(key bytes, value bytes, weight)`` triples as a packed batch."""
    keys, key_ends, values, ends, weights = [], [], [], [], []
    kn = vn = 0
    for k, v, w in events:
        keys.append(k)
        kn += len(k)
        key_ends.append(kn)
        values.append(v)
        vn += len(v)
        ends.append(vn)
        weights.append(w)
    return wit.KeyedEvents(b"".join(keys), key_ends, b"".join(values), ends, weights)


class _HostExchange:
    def workers(self):
        return _State.workers

    def shuffle(self, channel, events):
        try:
            got = wit_exchange.shuffle(channel, _pack(events))
        except Err as e:
            raise CircuitError("failed", f"exchange: {e.value.value}") from None
        out, ks, vs = [], 0, 0
        for ke, ve, w in zip(got.key_ends, got.ends, got.weights):
            out.append((got.keys[ks:ke], got.values[vs:ve], w))
            ks, vs = ke, ve
        return out


def _instance():
    if _State.instance is None:
        raise CircuitError("protocol", "called before init")
    return _State.instance


def _pieces(pieces):
    return [wit.ShardState(shard, state) for shard, state in sorted(pieces.items())]


def export(build):
    """The class componentize-py exports as the component's ``circuit``
    interface, running the circuit ``build`` makes. In the circuit's module:
    ``Circuit = sluice.export(build)``."""

    class Circuit(exports.Circuit):
        def describe(self):
            try:
                i = Instance(build)
                operators = [
                    wit.OperatorInfo(
                        n.id,
                        n.aliases(),
                        n.op.name,
                        fingerprint(n.op.name, shape_of(n.op)),
                        shape_of(n.op),
                        migrates_from(n.op),
                    )
                    for n in i._stateful_nodes
                ]
                return wit.CircuitInfo(i.inputs, i.outputs, i.snapshot_version, operators)
            except Exception:  # noqa: BLE001 - init reports it
                return wit.CircuitInfo([], [], 0, [])

        def init(self, info):
            try:
                if _State.instance is not None:
                    raise CircuitError("protocol", "init called twice")
                _State.instance = Instance(build)
                _State.workers = max(info.workers, 1)
            except Exception as e:  # noqa: BLE001
                raise _fail(e) from None

        def step(self, inputs):
            try:
                instance = _instance()
                # Python's `random` is one generator seeded once: its state
                # is not in the snapshots, so a step replayed on a restored
                # instance would draw other numbers. Seeded at every step
                # from the host's random numbers (seeded per step), it draws
                # the same ones in every replay.
                random.seed(os.urandom(32))
                ports = [[] for _ in instance.inputs]
                for batch in inputs:
                    if not 0 <= batch.port < len(ports):
                        raise CircuitError("protocol", f"input batch for unknown port {batch.port}")
                    if len(batch.weights) != len(batch.ends):
                        raise CircuitError("protocol", f"malformed batch for port {batch.port}")
                    try:
                        decoded = decode_all(batch.values, batch.ends)
                    except ValueError as e:
                        raise CircuitError("bad-input", f"port {batch.port}: {e}") from None
                    ports[batch.port].extend(zip(decoded, batch.weights))
                outputs = instance.step(ports, _HostExchange())
                out = []
                for port, events in enumerate(outputs):
                    if events:
                        values, ends, weights, n = [], [], [], 0
                        for b, w in events:
                            values.append(b)
                            n += len(b)
                            ends.append(n)
                            weights.append(w)
                        out.append(wit.Batch(port, b"".join(values), ends, weights))
                return out
            except Exception as e:  # noqa: BLE001
                raise _fail(e) from None

        def snapshot(self, changed_only):
            try:
                instance = _instance()
                if changed_only:
                    changed, pieces = instance.snapshot_changed()
                    return wit.StateSnapshot(_pieces(pieces), changed)
                return wit.StateSnapshot(_pieces(instance.snapshot()), None)
            except Exception as e:  # noqa: BLE001
                raise _fail(e) from None

        def restore(self, pieces):
            try:
                _instance().restore([(p.shard, p.state) for p in pieces])
            except Exception as e:  # noqa: BLE001
                raise _fail(e) from None

        def upgrade(self, pieces, start_empty):
            try:
                _instance().upgrade([(p.shard, p.state) for p in pieces], start_empty)
            except Exception as e:  # noqa: BLE001
                raise _fail(e) from None

        def export_shards(self, shards):
            try:
                return _pieces(_instance().export_shards(shards))
            except Exception as e:  # noqa: BLE001
                raise _fail(e) from None

        def set_workers(self, workers):
            _State.workers = max(workers, 1)

    Circuit.__module__ = sys._getframe(1).f_globals.get("__name__", Circuit.__module__)
    return Circuit
