"""Values on streams: how JSON port values become hashable Python values and
back, and the canonical bytes a key is routed and sharded by.

A port value is one JSON document. Read from an input port it becomes a
hashable Python value: objects become ``Record`` (a read-only ``dict``
whose fields also read as attributes, so ``bid.price``), arrays become
tuples. Written to an output port, tuples and lists become arrays,
``Record``/``dict`` objects with their fields sorted (as serde_json's
``Value`` writes them), ``Window`` an object ``{"start": …, "end": …}``
(as the Rust SDK writes it). NaN and infinities are refused: they are not
JSON.

The canonical bytes of a value (``key_bytes``, the same JSON) are its
identity in keyed state and on the exchange.
"""

import json


class Record(dict):
    """A JSON object read from a port: a ``dict`` that is hashable and
    read-only, whose fields are also attributes (``r.price == r["price"]``).
    Build a changed copy with ``r.but(price=…)``."""

    __slots__ = ()

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __hash__(self):
        return hash(frozenset(self.items()))

    def _read_only(self, *args, **kwargs):
        raise TypeError("a Record is read-only: build a new one with .but(field=value)")

    __setitem__ = __delitem__ = __setattr__ = __ior__ = _read_only
    update = pop = popitem = clear = setdefault = _read_only

    def __or__(self, other):
        return self.but(**other)

    def but(self, **fields):
        """A copy with ``fields`` replaced or added."""
        merged = dict(self)
        merged.update({k: freeze(v) for k, v in fields.items()})
        return Record(merged)

    def __reduce__(self):
        return (Record, (dict(self),))


class Window:
    """An event-time window ``[start, end)``, as ``tumbling`` and ``hopping``
    assign them. Ordered by start, then end; written as
    ``{"start": …, "end": …}``."""

    __slots__ = ("start", "end")

    def __init__(self, start: int, end: int):
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "end", end)

    def __setattr__(self, name, value):
        raise TypeError("a Window is read-only")

    def _key(self):
        return (self.start, self.end)

    def __eq__(self, other):
        return isinstance(other, Window) and self._key() == other._key()

    def __lt__(self, other):
        return self._key() < other._key()

    def __le__(self, other):
        return self._key() <= other._key()

    def __gt__(self, other):
        return self._key() > other._key()

    def __ge__(self, other):
        return self._key() >= other._key()

    def __hash__(self):
        return hash(("window", self.start, self.end))

    def __repr__(self):
        return f"Window(start={self.start}, end={self.end})"

    def __reduce__(self):
        return (Window, (self.start, self.end))


def freeze(value):
    """``value`` with lists made tuples and dicts made ``Record``s, all the
    way down: hashable, as a stream value must be."""
    t = type(value)
    if t is list or t is tuple:
        return tuple(freeze(v) for v in value)
    if t is dict:
        return Record((k, freeze(v)) for k, v in value.items())
    return value


def _object_pairs(pairs):
    return Record((k, freeze(v) if type(v) is list else v) for k, v in pairs)


def _default(value):
    if isinstance(value, Window):
        return {"start": value.start, "end": value.end}
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"a {type(value).__name__} cannot be written as JSON")


_decoder = json.JSONDecoder(object_pairs_hook=_object_pairs)
_encoder = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, sort_keys=True, allow_nan=False, default=_default
)
_key_encoder = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, sort_keys=True, default=_default
)


def decode_all(values: bytes, ends) -> list:
    """The values of a packed batch (``values`` cut at ``ends``), decoded.

    One JSON parse for the whole batch: the values are joined into one
    array, so the per-value cost stays in the C parser."""
    parts = []
    start = 0
    for end in ends:
        parts.append(values[start:end])
        start = end
    if not parts:
        return []
    try:
        decoded = _decoder.decode("[" + b",".join(parts).decode("utf-8") + "]")
    except (ValueError, UnicodeDecodeError):
        # Find the bad one to name it.
        decoded = []
        for i, part in enumerate(parts):
            try:
                decoded.append(_decoder.decode(part.decode("utf-8")))
            except (ValueError, UnicodeDecodeError) as e:
                raise ValueError(f"event {i} is not JSON: {e}") from None
    if len(decoded) != len(parts):
        raise ValueError(f"{len(parts)} events hold {len(decoded)} JSON values")
    return [tuple(freeze(x) for x in v) if type(v) is list else v for v in decoded]


def encode(value) -> bytes:
    """A value's JSON, as an output port carries it (object fields sorted;
    NaN and infinities refused)."""
    return _encoder.encode(value).encode("utf-8")


def key_bytes(key) -> bytes:
    """The canonical bytes of a key: what the exchange routes it by and its
    state's shard is computed from. JSON with sorted object fields, so equal
    keys have equal bytes (a key's parts should keep one type: ``1`` and
    ``1.0`` are equal in Python but not here)."""
    return _key_encoder.encode(key).encode("utf-8")
