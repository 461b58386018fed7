"""Nexmark q1 in Python, currency conversion: every bid with its price in
euros (x 0.89, rounded down). The same circuit as examples/nexmark-q1
(Rust), with the same output records.
"""

import sluice


def build(c):
    c.input("bid").map(lambda b: b.but(price=b.price * 89 // 100)).output("euro_bids")


Circuit = sluice.export(build)
