"""Junk for the trace readers' fuzz tests: documents with one value replaced or one key deleted, and damaged bytes."""

from __future__ import annotations

import random
from typing import Any, Sequence

import orjson


def mutations(doc: Any, rng: random.Random, count: int, junk: Sequence[Any]) -> list[Any]:
    """`count` copies of `doc`, each with one value somewhere replaced by one of `junk`, or one key deleted."""
    paths: list[list[Any]] = []

    def walk(node: Any, where: list[Any]) -> None:
        if where:
            paths.append(where)
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, [*where, key])
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, [*where, index])

    walk(doc, [])
    out = []
    for _ in range(count):
        copy = orjson.loads(orjson.dumps(doc))
        *parents, last = rng.choice(paths)
        node = copy
        for step in parents:
            node = node[step]
        if isinstance(node, dict) and rng.random() < 0.2:
            del node[last]
        else:
            node[last] = rng.choice(junk)
        out.append(copy)
    return out


def damaged(data: bytes, rng: random.Random) -> bytes:
    """`data` with 1 to 4 byte-level injuries: a byte changed, a run cut out, junk inserted, or the rest torn off."""
    raw = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice, at = rng.random(), rng.randrange(len(raw))
        if choice < 0.4:
            raw[at] = rng.randrange(256)
        elif choice < 0.7:
            del raw[at:at + rng.randint(1, 40)]
        elif choice < 0.85:
            raw[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:
            del raw[at:]
            break
    return bytes(raw)
