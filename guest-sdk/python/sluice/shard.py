"""Which shard a key belongs to: the host's function, in pure Python.

The key space of every pipeline is cut into ``SHARDS`` shards by one hash of
the key's bytes: XXH3 (64 bits, seed 0, default secret), the function the
host's exchange routes by (``sluice-shard`` in the Rust workspace). The
Python SDK keeps each keyed operator's state split by the same shards, so a
layout change moves whole shards of state and the key's events and its state
land on the same worker. ``tests/test_shard.py`` checks this module against
vectors the Rust crate computes.
"""

SHARDS = 1024
"""The number of shards of the key space (fixed)."""

_M = 0xFFFFFFFFFFFFFFFF
_P32_1 = 0x9E3779B1
_P32_2 = 0x85EBCA77
_P32_3 = 0xC2B2AE3D
_P64_1 = 0x9E3779B185EBCA87
_P64_2 = 0xC2B2AE3D27D4EB4F
_P64_3 = 0x165667B19E3779F9
_P64_4 = 0x85EBCA77C2B2AE63
_P64_5 = 0x27D4EB2F165667C5
_MX1 = 0x165667919E3779F9
_MX2 = 0x9FB21C651E98DF25

_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)


def _r64(b, i):
    return int.from_bytes(b[i : i + 8], "little")


def _r32(b, i):
    return int.from_bytes(b[i : i + 4], "little")


def _fold(a, b):
    p = a * b
    return (p ^ (p >> 64)) & _M


def _avalanche(h):
    h ^= h >> 37
    h = (h * _MX1) & _M
    return h ^ (h >> 32)


def _xxh64_avalanche(h):
    h ^= h >> 33
    h = (h * _P64_2) & _M
    h ^= h >> 29
    h = (h * _P64_3) & _M
    return h ^ (h >> 32)


def _mix16(data, i, s):
    return _fold(
        _r64(data, i) ^ _r64(_SECRET, s),
        _r64(data, i + 8) ^ _r64(_SECRET, s + 8),
    )


def _short(data, n):
    if n > 8:
        lo = _r64(data, 0) ^ (_r64(_SECRET, 24) ^ _r64(_SECRET, 32))
        hi = _r64(data, n - 8) ^ (_r64(_SECRET, 40) ^ _r64(_SECRET, 48))
        swapped = int.from_bytes(lo.to_bytes(8, "little"), "big")
        return _avalanche((n + swapped + hi + _fold(lo, hi)) & _M)
    if n >= 4:
        x = (_r32(data, n - 4) + (_r32(data, 0) << 32)) ^ (_r64(_SECRET, 8) ^ _r64(_SECRET, 16))
        x ^= ((x << 49) | (x >> 15)) & _M ^ ((x << 24) | (x >> 40)) & _M
        x = (x * _MX2) & _M
        x ^= (x >> 35) + n
        x = (x * _MX2) & _M
        return x ^ (x >> 28)
    if n > 0:
        combined = (data[0] << 16) | (data[n >> 1] << 24) | data[n - 1] | (n << 8)
        return _xxh64_avalanche(combined ^ (_r32(_SECRET, 0) ^ _r32(_SECRET, 4)))
    return _xxh64_avalanche(_r64(_SECRET, 56) ^ _r64(_SECRET, 64))


def _mid(data, n):
    acc = (n * _P64_1) & _M
    if n <= 128:
        if n > 32:
            if n > 64:
                if n > 96:
                    acc += _mix16(data, 48, 96) + _mix16(data, n - 64, 112)
                acc += _mix16(data, 32, 64) + _mix16(data, n - 48, 80)
            acc += _mix16(data, 16, 32) + _mix16(data, n - 32, 48)
        acc += _mix16(data, 0, 0) + _mix16(data, n - 16, 16)
        return _avalanche(acc & _M)
    for i in range(8):
        acc += _mix16(data, 16 * i, 16 * i)
    acc = _avalanche(acc & _M)
    for i in range(8, n // 16):
        acc += _mix16(data, 16 * i, 16 * (i - 8) + 3)
    acc += _mix16(data, n - 16, 136 - 17)
    return _avalanche(acc & _M)


def _accumulate(acc, data, i, s):
    for lane in range(8):
        value = _r64(data, i + 8 * lane)
        key = value ^ _r64(_SECRET, s + 8 * lane)
        acc[lane ^ 1] = (acc[lane ^ 1] + value) & _M
        acc[lane] = (acc[lane] + (key & 0xFFFFFFFF) * (key >> 32)) & _M


def _scramble(acc):
    for lane in range(8):
        a = acc[lane]
        a ^= a >> 47
        a ^= _r64(_SECRET, 128 + 8 * lane)
        acc[lane] = (a * _P32_1) & _M


def _long(data, n):
    acc = [_P32_3, _P64_1, _P64_2, _P64_3, _P64_4, _P32_2, _P64_5, _P32_1]
    stripes_per_block = (len(_SECRET) - 64) // 8
    block = 64 * stripes_per_block
    blocks = (n - 1) // block
    for b in range(blocks):
        for s in range(stripes_per_block):
            _accumulate(acc, data, b * block + 64 * s, 8 * s)
        _scramble(acc)
    for s in range(((n - 1) - block * blocks) // 64):
        _accumulate(acc, data, blocks * block + 64 * s, 8 * s)
    _accumulate(acc, data, n - 64, len(_SECRET) - 64 - 7)
    result = (n * _P64_1) & _M
    for i in range(4):
        result += _fold(acc[2 * i] ^ _r64(_SECRET, 11 + 16 * i), acc[2 * i + 1] ^ _r64(_SECRET, 19 + 16 * i))
    return _avalanche(result & _M)


def xxh3_64(data: bytes) -> int:
    """XXH3's 64-bit hash of ``data`` (seed 0, default secret)."""
    n = len(data)
    if n <= 16:
        return _short(data, n)
    if n <= 240:
        return _mid(data, n)
    return _long(data, n)


def shard_of(key: bytes) -> int:
    """The shard of a key's bytes, as the host's exchange computes it."""
    return xxh3_64(key) % SHARDS
