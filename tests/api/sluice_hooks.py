"""Schemathesis hooks for Sluice's API (SCHEMATHESIS_HOOKS=sluice_hooks).

Teaches schemathesis the two bodies that are not JSON: a component upload
(`application/wasm`, bytes) and a push (`application/x-ndjson`, lines).
"""

import json

import schemathesis


@schemathesis.serializer("application/wasm")
def wasm(ctx, value):
    if isinstance(value, bytes):
        return {"data": value}
    return {"data": str(value).encode("utf-8")}


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx, value):
    if isinstance(value, bytes):
        return {"data": value}
    if isinstance(value, str):
        return {"data": value.encode("utf-8")}
    if isinstance(value, list):
        return {"data": "".join(json.dumps(v) + "\n" for v in value).encode("utf-8")}
    return {"data": (json.dumps(value) + "\n").encode("utf-8")}
