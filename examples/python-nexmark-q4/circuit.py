"""Nexmark q4 in Python, average price per category: the winning (highest)
bid of every auction, among bids placed while it was open, averaged per
category. The same circuit as examples/nexmark-q4 (Rust), with the same
output records ``[category, average]``: a join, a keyed max and a keyed
average, all incremental.

Input: ``sluice gen nexmark`` writes ``auction.jsonl`` and ``bid.jsonl``;
each record reads as a ``sluice.Record`` (``a.category``, ``b.price``).
"""

import sluice


def build(c):
    auctions = c.input("auction").key_by(lambda a: a.id)
    bids = c.input("bid").map(lambda b: (b.auction, b.price, b.date_time)).key_by(lambda b: b[0])
    (
        auctions.join(
            bids,
            lambda id, a, b: (id, a.category, b[1], a.date_time <= b[2] <= a.expires),
        )
        .filter(lambda r: r[3])
        .max_by(lambda r: (r[0], r[1]), lambda r: r[2])
        .avg_by(lambda winner: winner[0][1], lambda winner: winner[1])
        .output("avg_price_per_category")
    )


Circuit = sluice.export(build)
