"""A Python circuit that reads what a sandbox must make deterministic: the
wall clock, the monotonic clock, Python's `random` (seeded by the host's
random numbers at start) and `hash()` of strings (randomised per process
in CPython). Every output record carries them; a replay after a kill that
saw other values would write other bytes, which the host refuses (I4), so
`sluice chaos --noisy-component` over it checks that a Python guest sees
only the host's virtualised time and randomness. The value "raise" makes
it raise, as a circuit's own bug would.
"""

import random
import time

import sluice


def stamp(v):
    if v == "raise":
        # For the test of how a failure in a circuit's own code is reported.
        raise ValueError("asked to")
    return {
        "v": v,
        "wall_ns": time.time_ns(),
        "mono_ns": time.monotonic_ns(),
        "random": random.random(),
        "hash": hash(v),
        "set_order": "".join(sorted({str(v), "a", "b"}, key=hash)),
    }


def build(c):
    c.input("in").map(stamp).output("out")


Circuit = sluice.export(build)
