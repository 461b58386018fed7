"""sluice: write Sluice circuits in Python.

A circuit is a dataflow over Z-sets: each record carries a weight, +1 for an
insert and -1 for a delete, and every operator turns the deltas of one step
into the deltas of its output, keeping whatever state it needs (which the
host checkpoints). A whole circuit is a build function and one line::

    import sluice

    def build(c):
        (c.input("lines")
            .flat_map(str.split)
            .count_by(lambda word: word)
            .output("counts"))

    Circuit = sluice.export(build)

``sluice build DIR`` turns the directory holding it (``circuit.py``) into a
component with componentize-py; the host runs it like a Rust one, with the
same sandbox, limits and exactly-once rules. Natively, ``sluice.Instance``
runs the same circuit (how circuits are tested).
"""

from .circuit import Circuit, Instance, LocalExchange, Stream
from .errors import CircuitError
from .shard import SHARDS, shard_of
from .values import Record, Window


def export(build):
    """The component's export class for the circuit ``build`` makes (see
    the module's docs). Only a component build has the WIT bindings:
    natively (importing the circuit's module in a test) the class it
    returns only says so, and ``build`` runs through ``sluice.testing``."""
    try:
        from .component import export as _export
    except ImportError:
        native_build = build

        class Circuit:
            """Native stand-in: the component's class exists only in a
            component build (``sluice build``)."""

            build = staticmethod(native_build)

            def __getattr__(self, name):
                raise RuntimeError(
                    "this circuit runs natively through sluice.testing.Pipeline(build); "
                    "its component export exists only in a `sluice build`"
                )

        return Circuit
    return _export(build)


__all__ = [
    "Circuit",
    "CircuitError",
    "Instance",
    "LocalExchange",
    "Record",
    "SHARDS",
    "Stream",
    "Window",
    "export",
    "shard_of",
]
