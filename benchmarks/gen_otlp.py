#!/usr/bin/env python3
"""Write a large OTLP JSON trace file as the Collector's `file` exporter does, for reader benchmarks.

    python benchmarks/gen_otlp.py OUT.json [--spans 1000000] [--spans-per-trace 10] [--batch-spans 512] [--seed 0]

One `ExportTraceServiceRequest` per line, `batch_spans` spans a line, grouped by resource and
then by instrumentation scope the way the Collector batches them; hex ids, decimal-string
nanoseconds, integer kinds, `intValue` as a string. Each trace is a FastAPI service request:
a SERVER root (`opentelemetry.instrumentation.fastapi`), an SQLAlchemy `connect` and 3-4
`SELECT`/`UPDATE` statements, an httpx call to an OpenAI-compatible endpoint on
127.0.0.1:8000, another HTTP call and INTERNAL spans, 3-5 attributes each, from one of two
service instances. Children lie inside their parent; 1.5% of traces wait long on `connect`
(the tail). Spans are written in the order they end, so a trace can straddle two lines.
Deterministic for a seed.
"""

from __future__ import annotations

import argparse
import heapq
import random
import time
from pathlib import Path
from typing import Any

import orjson

EPOCH_NS = 1_764_000_000 * 10**9
MS = 1_000_000
SCHEMA_URL = "https://opentelemetry.io/schemas/1.11.0"
FASTAPI = ("opentelemetry.instrumentation.fastapi", "0.48b0")
SQLALCHEMY = ("opentelemetry.instrumentation.sqlalchemy", "0.48b0")
HTTPX = ("opentelemetry.instrumentation.httpx", "0.48b0")
APP = ("chat_api.handlers", "")
ROUTES = ("/v1/chat", "/v1/chat/{conversation_id}", "/v1/search")
STATEMENTS = (
    ("SELECT conversations", "SELECT id, title, created_at FROM conversations WHERE user_id = %(user_id)s"),
    ("SELECT messages", "SELECT role, content FROM messages WHERE conversation_id = %(cid)s ORDER BY seq"),
    ("SELECT users", "SELECT id, plan, quota FROM users WHERE id = %(user_id)s"),
    ("UPDATE sessions", "UPDATE sessions SET last_seen = now() WHERE id = %(sid)s"),
)
LLM_URL = "http://127.0.0.1:8000/v1/chat/completions"
SEARCH_URL = "http://search.internal:9200/docs/_search"
INTERNAL_NAMES = ("build prompt", "render response", "check quota", "load settings")
CAMEL_KINDS = {"internal": 1, "server": 2, "client": 3}


def _str(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"stringValue": value}}


def _int(key: str, value: int) -> dict[str, Any]:
    return {"key": key, "value": {"intValue": str(value)}}


RESOURCES = [
    {"attributes": [_str("service.name", "chat-api"), _str("service.instance.id", instance),
                    _str("telemetry.sdk.language", "python"), _str("telemetry.sdk.name", "opentelemetry"),
                    _str("telemetry.sdk.version", "1.27.0")]}
    for instance in ("chat-api-7d9f8-1", "chat-api-7d9f8-2")
]


def trace_spans(rng: random.Random, start: int, spans_per_trace: int) -> list[tuple[int, tuple[str, str], dict[str, Any]]]:
    """The spans of one request arriving at `start` (ns): (end ns, scope, span), root first."""
    trace_id = f"{rng.getrandbits(128):032x}"
    root_id = f"{rng.getrandbits(64):016x}"
    children: list[tuple[tuple[str, str], str, str, int, int, list[dict[str, Any]]]] = []
    t = start + int(rng.uniform(0.2, 1.0) * MS)

    def child(scope: tuple[str, str], name: str, kind: str, dur: int, attrs: list[dict[str, Any]]) -> None:
        nonlocal t
        children.append((scope, name, kind, t, t + dur, attrs))
        t += dur + int(rng.uniform(0.05, 0.5) * MS)

    db = [_str("db.system.name", "postgresql"), _str("server.address", "db.internal"), _int("server.port", 5432)]
    # The tail: one request in 70 waits for the pool to open a new connection.
    connect_ms = rng.uniform(80, 400) if rng.random() < 0.015 else rng.uniform(0.3, 2.0)
    child(SQLALCHEMY, "connect", "client", int(connect_ms * MS), [*db, _str("db.namespace", "app")])
    for summary, text in rng.sample(STATEMENTS, rng.choice((3, 4))):
        child(SQLALCHEMY, summary, "client", int(rng.uniform(0.4, 8.0) * MS),
              [db[0], _str("db.query.text", text), _str("db.namespace", "app"), db[1]])
    child(APP, "build prompt", "internal", int(rng.uniform(0.1, 1.5) * MS),
          [_str("code.function.name", "build_prompt"), _int("prompt.messages", rng.randint(2, 40)),
           _str("code.file.path", "chat_api/handlers.py")])
    child(HTTPX, "POST", "client", int(rng.uniform(300, 1500) * MS),
          [_str("http.request.method", "POST"), _str("url.full", LLM_URL), _str("server.address", "127.0.0.1"),
           _int("server.port", 8000), _int("http.response.status_code", 200)])
    while len(children) + 1 < spans_per_trace:
        if rng.random() < 0.4:
            child(HTTPX, "GET", "client", int(rng.uniform(3, 40) * MS),
                  [_str("http.request.method", "GET"), _str("url.full", SEARCH_URL),
                   _str("server.address", "search.internal"), _int("http.response.status_code", 200)])
        else:
            child(APP, rng.choice(INTERNAL_NAMES), "internal", int(rng.uniform(0.05, 2.0) * MS),
                  [_str("code.function.name", "handler"), _str("code.file.path", "chat_api/handlers.py"),
                   _int("code.line.number", rng.randint(10, 400))])
    del children[max(spans_per_trace - 1, 0):]
    end = t + int(rng.uniform(0.2, 2.0) * MS)
    route = rng.choice(ROUTES)
    out = [(end, FASTAPI, {
        "traceId": trace_id, "spanId": root_id, "flags": 257, "name": f"POST {route}", "kind": 2,
        "startTimeUnixNano": str(start), "endTimeUnixNano": str(end),
        "attributes": [_str("http.request.method", "POST"), _str("http.route", route),
                       _int("http.response.status_code", 200), _str("url.scheme", "http")],
        "status": {},
    })]
    for scope, name, kind, s, e, attrs in children:
        out.append((e, scope, {
            "traceId": trace_id, "spanId": f"{rng.getrandbits(64):016x}", "parentSpanId": root_id, "flags": 257,
            "name": name, "kind": CAMEL_KINDS[kind], "startTimeUnixNano": str(s), "endTimeUnixNano": str(e),
            "attributes": attrs, "status": {},
        }))
    return out[:spans_per_trace]


def _request(batch: list[tuple[int, tuple[str, str], dict[str, Any]]]) -> bytes:
    """One ExportTraceServiceRequest line: the batch grouped by resource, then scope, in order."""
    grouped: dict[int, dict[tuple[str, str], list[dict[str, Any]]]] = {}
    for resource, scope, span in batch:
        grouped.setdefault(resource, {}).setdefault(scope, []).append(span)
    doc = {"resourceSpans": [
        {"resource": RESOURCES[resource],
         "scopeSpans": [{"scope": {"name": name, **({"version": version} if version else {})}, "spans": spans}
                        for (name, version), spans in scopes.items()],
         "schemaUrl": SCHEMA_URL}
        for resource, scopes in grouped.items()
    ]}
    return orjson.dumps(doc) + b"\n"


def generate(path: str | Path, spans: int = 1_000_000, spans_per_trace: int = 10, batch_spans: int = 512,
             seed: int = 0) -> int:
    """Write `spans` spans to `path` (plain JSON lines); return the number of lines written."""
    rng = random.Random(seed)
    pending: list[tuple[int, int, int, tuple[str, str], dict[str, Any]]] = []  # (end, seq, resource, scope, span)
    batch: list[tuple[int, tuple[str, str], dict[str, Any]]] = []
    seq = lines = 0
    now = EPOCH_NS
    with open(path, "wb") as f:

        def flush() -> None:
            nonlocal lines
            f.write(_request(batch))
            batch.clear()
            lines += 1

        while seq < spans or pending:
            if seq < spans:
                now += int(rng.expovariate(40.0) * 1e9)  # 40 requests a second, overlapping
                resource = rng.randrange(len(RESOURCES))
                for end, scope, span in trace_spans(rng, now, spans_per_trace)[: spans - seq]:
                    heapq.heappush(pending, (end, seq, resource, scope, span))
                    seq += 1
            # Export what has ended by now (all of it once every span is generated).
            while pending and (seq >= spans or pending[0][0] <= now):
                _, _, resource, scope, span = heapq.heappop(pending)
                batch.append((resource, scope, span))
                if len(batch) >= batch_spans:
                    flush()
        if batch:
            flush()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the file to write (OTLP JSON lines, plain)")
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--spans-per-trace", type=int, default=10)
    parser.add_argument("--batch-spans", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    lines = generate(args.out, args.spans, args.spans_per_trace, args.batch_spans, args.seed)
    size = args.out.stat().st_size
    print(f"{args.out}: {args.spans} spans in {lines} lines, {size / 2**20:.1f} MiB, in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
