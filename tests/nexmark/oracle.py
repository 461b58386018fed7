#!/usr/bin/env python3
"""The Nexmark oracle: one query's expected result, from DuckDB.

    oracle.py DATA_DIR QUERY.sql

loads DATA_DIR's person.jsonl, auction.jsonl and bid.jsonl (as
`sluice gen nexmark` writes them) into the tables `person`, `auction` and
`bid` (and side_input.jsonl, if there, into `side_input`), runs the query and prints every result row as one line of JSON: a
row of one column is that column's value (a STRUCT is an object), a row of
several is an array. The Sluice circuit's integrated output must be the
same bag of values (tests/e2e/nexmark.rs).
"""
import json
import os
import sys

import duckdb

SCHEMAS = {
    "person": {
        "id": "UBIGINT", "name": "VARCHAR", "email_address": "VARCHAR",
        "credit_card": "VARCHAR", "city": "VARCHAR", "state": "VARCHAR",
        "date_time": "UBIGINT", "extra": "VARCHAR",
    },
    "auction": {
        "id": "UBIGINT", "item_name": "VARCHAR", "description": "VARCHAR",
        "initial_bid": "UBIGINT", "reserve": "UBIGINT", "date_time": "UBIGINT",
        "expires": "UBIGINT", "seller": "UBIGINT", "category": "UBIGINT",
        "extra": "VARCHAR",
    },
    "bid": {
        "auction": "UBIGINT", "bidder": "UBIGINT", "price": "UBIGINT",
        "channel": "VARCHAR", "url": "VARCHAR", "date_time": "UBIGINT",
        "extra": "VARCHAR",
    },
    # q13's side input, where the data directory has one.
    "side_input": {"key": "UBIGINT", "value": "VARCHAR"},
}


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: oracle.py DATA_DIR QUERY.sql")
    data, query = sys.argv[1], sys.argv[2]
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    for table, columns in SCHEMAS.items():
        path = os.path.join(data, f"{table}.jsonl")
        if table == "side_input" and not os.path.exists(path):
            continue
        spec = ", ".join(f"'{c}': '{t}'" for c, t in columns.items())
        con.execute(
            f"CREATE TABLE {table} AS SELECT * FROM read_json(?, "
            f"format = 'newline_delimited', columns = {{{spec}}})",
            [path],
        )
    with open(query) as f:
        rows = con.execute(f.read()).fetchall()
    out = sys.stdout
    for row in rows:
        value = row[0] if len(row) == 1 else list(row)
        out.write(json.dumps(value))
        out.write("\n")


if __name__ == "__main__":
    main()
