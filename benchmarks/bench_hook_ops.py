"""What each hook adds to a real operation, per operation and per recorded segment, next to an OpenTelemetry span.

    python benchmarks/bench_hook_ops.py [--ops 2000] [--trials 7] [--only NAME,...]

For each hook, a real operation is run `--ops` times inside a request, with the hook installed
and recording into a real `CaptureWriter` (as under `latprof run`) and without it, alternating
trial by trial (this machine is noisy). The cost is process CPU time (`time.process_time`,
all threads: the writer's encoding counts) from the start of the loop to the end of a drain,
per operation; "added" is on minus off, and "per segment" divides it by the events the hook
emitted per operation. In the same run, an OpenTelemetry SDK span (a `TracerProvider` with a
`BatchSpanProcessor` and an exporter that drops everything, two attributes) is timed the same
way: the target is at most half its cost per recorded segment.

Operations: `sqlalchemy` (a QueuePool connection, `SELECT 1`, on PostgreSQL), `psycopg_pool`
(`with pool.connection(): execute("SELECT 1")`), `asyncpg` (`async with pool.acquire():
fetchval("SELECT 1")`), `redis` (`GET` on a BlockingConnectionPool), `httpx` (a GET to a
local server). The `locks` hook has its own benchmark (`bench_locks.py`). PostgreSQL at `$LATPROF_TEST_PG`
(default the local server), Redis at 127.0.0.1:6379.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import importlib
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from latprof.capture.writer import CaptureWriter
from latprof.collectors import runtime

PG = os.environ.get("LATPROF_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test").replace("+psycopg", "")


class CountingWriter:
    """A real CaptureWriter that also counts what it is given."""

    def __init__(self, path: Path) -> None:
        self.writer = CaptureWriter(str(path), source="run")
        self.events = 0

    def emit(self, event: Any) -> None:
        self.events += 1
        self.writer.emit(event)

    def flush(self) -> None:
        self.writer.flush()


class NullExporter(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


# --- operations: (setup -> (op, teardown)) ----------------------------------------------------


def op_sqlalchemy() -> tuple[Callable[[], None], Callable[[], None]]:
    from sqlalchemy import create_engine, text

    engine = create_engine(PG.replace("postgresql://", "postgresql+psycopg://"), pool_size=2, max_overflow=0)
    query = text("SELECT 1")

    def op() -> None:
        with engine.connect() as conn:
            conn.execute(query).scalar()

    return op, engine.dispose


def op_psycopg_pool() -> tuple[Callable[[], None], Callable[[], None]]:
    from psycopg_pool import ConnectionPool

    pool = ConnectionPool(PG, min_size=2, max_size=2, open=True)

    def op() -> None:
        with pool.connection() as conn:
            conn.execute("SELECT 1").fetchone()

    return op, pool.close


def op_asyncpg() -> tuple[Callable[[], None], Callable[[], None]]:
    import asyncpg

    loop = asyncio.new_event_loop()

    async def make() -> Any:
        return await asyncpg.create_pool(PG, min_size=2, max_size=2)

    pool = loop.run_until_complete(make())
    batch = 50

    async def some() -> None:
        for _ in range(batch):
            async with pool.acquire() as conn:
                await conn.fetchval("SELECT 1")

    def op() -> None:  # `batch` operations per call: one event loop turn-around per call is not the hook's
        loop.run_until_complete(some())

    def close() -> None:
        loop.run_until_complete(pool.close())
        loop.close()

    op.batch = batch  # type: ignore[attr-defined]
    return op, close


def op_redis() -> tuple[Callable[[], None], Callable[[], None]]:
    import redis

    client = redis.Redis(connection_pool=redis.BlockingConnectionPool(host="127.0.0.1", port=6379, max_connections=2))
    client.set("latprof-bench-key", "x")

    def op() -> None:
        client.get("latprof-bench-key")

    def close() -> None:
        client.delete("latprof-bench-key")
        client.close()

    return op, close


def op_httpx() -> tuple[Callable[[], None], Callable[[], None]]:
    import httpx

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # one write: headers and body in two would cost a delayed ACK each
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = httpx.Client(base_url=f"http://127.0.0.1:{server.server_address[1]}")

    def op() -> None:
        client.get("/tool")

    def close() -> None:
        client.close()
        server.shutdown()

    return op, close


OPERATIONS: dict[str, Callable[[], tuple[Callable[[], None], Callable[[], None]]]] = {
    "sqlalchemy": op_sqlalchemy,
    "psycopg_pool": op_psycopg_pool,
    "asyncpg": op_asyncpg,
    "redis": op_redis,
    "httpx": op_httpx,
}


def timed(op: Callable[[], None], n: int, writer: CountingWriter | None) -> tuple[float, int]:
    """Process CPU ns per operation (to the end of the writer's drain) and events emitted."""
    batch = getattr(op, "batch", 1)
    calls = max(1, n // batch)
    before = writer.events if writer else 0
    token = runtime.begin_request("GET /bench", runtime.now_ns())
    cpu0 = time.process_time_ns()
    for _ in range(calls):
        op()
    runtime.end_request(token)
    if writer is not None:
        writer.flush()
    cpu = time.process_time_ns() - cpu0
    events = (writer.events - before - 1) if writer else 0  # less the request root
    return cpu / (calls * batch), events


def otel_span_ns(n: int) -> float:
    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(NullExporter(), max_queue_size=max(n + 10, 1024), max_export_batch_size=512)
    )
    tracer = provider.get_tracer("bench")
    attrs = {"db.system.name": "postgresql", "db.query.summary": "SELECT 1"}
    with tracer.start_as_current_span("root"):
        cpu0 = time.process_time_ns()
        for _ in range(n):
            with tracer.start_as_current_span("SELECT 1", attributes=attrs):
                pass
        provider.force_flush()
        cpu = time.process_time_ns() - cpu0
    provider.shutdown()
    return cpu / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--only", default="", help="comma-separated hooks (default all)")
    args = parser.parse_args()
    names = [n for n in (args.only.split(",") if args.only else OPERATIONS) if n]

    with tempfile.TemporaryDirectory(prefix="latprof-bench-") as tmp:
        writer = CountingWriter(Path(tmp) / "capture.jsonl")
        print(f"python {sys.version.split()[0]}, {args.ops} operations per trial, median of {args.trials} trials;"
              " process CPU per operation (ns)")
        print(f"{'hook':<14}{'off':>10}{'on':>10}{'added':>10}{'segments':>10}{'per seg.':>10}{'OTel span':>11}{'ratio':>8}")
        for name in names:
            hook = importlib.import_module(f"latprof.collectors.{name}")
            try:
                op, close = OPERATIONS[name]()
            except Exception as exc:  # a service that is not there: say so, go on
                print(f"{name:<14} skipped: {type(exc).__name__}: {exc}")
                continue
            off: list[float] = []
            on: list[float] = []
            otel: list[float] = []
            events = 0
            try:
                for _ in range(3):  # warm-up: connections, caches, first imports
                    op()
                for trial in range(args.trials):
                    for hooked in ((False, True) if trial % 2 == 0 else (True, False)):
                        if hooked:
                            runtime.start(writer)
                            hook.install()
                            cpu, events = timed(op, args.ops, writer)
                            on.append(cpu)
                            hook.uninstall()
                            runtime.stop()
                        else:
                            runtime.start(writer)
                            cpu, _ = timed(op, args.ops, writer)
                            off.append(cpu)
                            runtime.stop()
                    otel.append(otel_span_ns(args.ops))
            finally:
                close()
            a, b, o = statistics.median(off), statistics.median(on), statistics.median(otel)
            per_op_segments = events / args.ops
            per_segment = (b - a) / per_op_segments if per_op_segments else float("nan")
            ratio = per_segment / o if per_op_segments else float("nan")
            print(f"{name:<14}{a:>10.0f}{b:>10.0f}{b - a:>+10.0f}{per_op_segments:>10.2f}{per_segment:>10.0f}{o:>11.0f}{ratio:>8.2f}")
        writer.writer.close()


if __name__ == "__main__":
    main()
