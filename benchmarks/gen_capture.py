#!/usr/bin/env python3
"""Write a large capture of a fixed shape, for parse/analyze benchmarks.

    python benchmarks/gen_capture.py OUT.jsonl [--requests 100000] [--rate 50] [--seed 7]

Every request is exactly 10 lines: one `request` root and 9 segments (queue, db.pool, a
layer-less connection-hold marker, two db.query, provider, model, http.pool, tool) with 3-5
attributes each, separated by gaps that `cpu_ns` covers only partly (so some time is
unattributed). Requests arrive as a Poisson stream and overlap; lines are written in the order
hooks would write them (each when it ends), so timestamps never go backwards. A few gauges per
second. Plain JSONL (not gzip), written with orjson in batches; deterministic for a seed.
"""

from __future__ import annotations

import argparse
import heapq
import random
import time
from pathlib import Path

import orjson

from latprof import layers, semconv
from latprof.capture.format import encode, make_header
from latprof.events import Gauge, QualityRecord, Request, Segment

EPOCH_NS = 1_764_000_000 * 10**9
PID = 4242
MS = 1_000_000
POOL = {semconv.DB_POOL_NAME: "postgresql://db.internal:5432/app"}
MODEL = "gpt-4o-mini"
BATCH = 20_000  # lines per write


def request_events(rng: random.Random, start: int) -> list[Segment | Request]:
    """The 9 segments and the root of one request arriving at `start` (ns), in end order."""
    rid = f"{rng.getrandbits(128):032x}"
    out: list[Segment | Request] = []
    gaps = 0
    t = start

    def seg(layer: str | None, name: str, dur: int, attrs: dict, at: int | None = None) -> None:
        nonlocal t
        s = t if at is None else at
        e = s + dur if at is None else t
        out.append(Segment(rid, f"{rng.getrandbits(64):016x}", None, name, layer, s, e, PID, attrs))
        if at is None:
            t = e

    def gap(lo_ms: float, hi_ms: float) -> None:
        nonlocal t, gaps
        g = int(rng.uniform(lo_ms, hi_ms) * MS)
        t += g
        gaps += g

    seg(layers.QUEUE, "accept backlog", int(rng.expovariate(1 / 5) * MS),
        {semconv.QUEUE_SOURCE: "backlog", semconv.HTTP_ROUTE: "/chat", semconv.SERVER_ADDRESS: "api.internal"})
    gap(1, 4)
    seg(layers.DB_POOL, "sqlalchemy checkout", int((0.05 + rng.expovariate(1.0)) * MS),
        {**POOL, semconv.DB_SYSTEM_NAME: "postgresql", semconv.SERVER_ADDRESS: "db.internal"})
    held_since = t
    for summary, ms in (("SELECT conversations", 6), ("UPDATE sessions", 3)):
        seg(layers.DB_QUERY, summary, int(rng.uniform(0.5, 2.0) * ms * MS),
            {semconv.DB_SYSTEM_NAME: "postgresql", semconv.DB_QUERY_SUMMARY: summary,
             semconv.DB_OPERATION_NAME: summary.split()[0], semconv.SERVER_ADDRESS: "db.internal"})
        gap(0.1, 0.4)
    seg(None, semconv.SEGMENT_CONNECTION_HOLD, 0, {**POOL, semconv.DB_SYSTEM_NAME: "postgresql",
                                                   semconv.SERVER_ADDRESS: "db.internal"}, at=held_since)
    gap(1, 3)
    call = {semconv.LLM_CALL_ID: f"{rng.getrandbits(64):016x}", semconv.GEN_AI_REQUEST_MODEL: MODEL,
            semconv.GEN_AI_OPERATION_NAME: "chat"}
    seg(layers.PROVIDER, f"chat {MODEL}", int(rng.uniform(300, 1500) * MS),
        {**call, semconv.GEN_AI_INPUT_TOKENS: rng.randint(200, 6000), semconv.TTFT_KNOWN: True})
    seg(layers.MODEL, f"chat {MODEL} stream", int(rng.uniform(100, 2000) * MS),
        {**call, semconv.GEN_AI_OUTPUT_TOKENS: rng.randint(20, 400)})
    gap(0.3, 1)
    seg(layers.HTTP_POOL, "httpx pool wait", int(rng.expovariate(1 / 3) * MS),
        {semconv.SERVER_ADDRESS: "search.internal", "server.port": 443, "url.scheme": "https"})
    seg(layers.TOOL, "tool search_docs", int(rng.uniform(20, 200) * MS),
        {"gen_ai.tool.name": "search_docs", semconv.SERVER_ADDRESS: "search.internal",
         semconv.HTTP_STATUS_CODE: 200, "http.request.method": "POST"})
    gap(1, 3)
    out.append(Request(rid, "POST /chat", start, t, PID, int(gaps * rng.uniform(0.7, 0.95)), 200,
                       {semconv.HTTP_ROUTE: "/chat", semconv.HTTP_STATUS_CODE: 200, semconv.SERVER_ADDRESS: "api.internal"}))
    out.sort(key=lambda e: e.end_ns)  # hooks write each segment when it ends
    return out


def generate(path: Path, requests: int, rate: float, seed: int) -> int:
    rng = random.Random(seed)
    pending: list[tuple[int, int, object]] = []  # (emit ts, seq, event) not yet written
    seq = 0
    lines = 0
    batch: list[bytes] = []
    header = make_header("run", generator="benchmarks/gen_capture.py", simulated=True)
    header.update(pid=PID, ppid=1, host="bench-host", python="3.12.8", latprof="0.1.0",
                  wall_ns=EPOCH_NS, monotonic_ns=86_400 * 10**9)
    with path.open("wb") as f:

        def put(event: object) -> None:
            nonlocal lines
            batch.append(orjson.dumps(encode(event)))  # type: ignore[arg-type]
            lines += 1
            if len(batch) >= BATCH:
                f.write(b"\n".join(batch) + b"\n")
                batch.clear()

        batch.append(orjson.dumps(header))
        lines += 1
        put(QualityRecord(semconv.NOTE_HOOKS_LOADED, EPOCH_NS, PID, "asgi, sqlalchemy, openai, httpx",
                          attrs={"collectors": ["asgi", "sqlalchemy", "openai", "httpx"]}))
        now = EPOCH_NS
        next_gauge = EPOCH_NS + 1_000 * MS
        for _ in range(requests):
            now += int(rng.expovariate(rate) * 1e9)
            while next_gauge <= now:  # a few gauges per second
                heapq.heappush(pending, (next_gauge, seq, None))
                seq += 1
                next_gauge += 1_000 * MS
            for event in request_events(rng, now):
                heapq.heappush(pending, (event.end_ns, seq, event))
                seq += 1
            while pending and pending[0][0] <= now:
                ts, _, event = heapq.heappop(pending)
                if event is None:
                    for name, value in ((semconv.GAUGE_POOL_IN_USE, rng.randint(0, 10)),
                                        (semconv.GAUGE_POOL_WAITERS, rng.randint(0, 3)),
                                        (semconv.GAUGE_ACCEPT_QUEUE, rng.randint(0, 5)),
                                        (semconv.GAUGE_CPU_PERCENT, round(rng.uniform(5, 60), 1))):
                        put(Gauge(name, float(value), ts, PID, POOL if name.startswith("db.") else {}))
                else:
                    put(event)
        while pending:
            _, _, event = heapq.heappop(pending)
            if event is not None:
                put(event)
        if batch:
            f.write(b"\n".join(batch) + b"\n")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the capture to write (plain JSONL)")
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=50.0, help="arrivals per second")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    lines = generate(args.out, args.requests, args.rate, args.seed)
    size = args.out.stat().st_size
    print(f"{args.out}: {lines} lines, {size} bytes ({size / 2**20:.1f} MiB) "
          f"in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
