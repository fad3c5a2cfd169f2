"""What each hook adds to a real operation, per operation and per recorded segment, next to an OpenTelemetry span.

    python benchmarks/bench_hook_ops.py [--ops 2000] [--trials 7] [--only NAME,...]

For each hook, a real operation is run `--ops` times inside a request three ways, alternating
trial by trial (this machine is noisy): plain; with the hook installed and recording into a real
`CaptureWriter` (as under `latprof run`); and without the hook but inside an OpenTelemetry SDK
span per operation (a `TracerProvider` with a `BatchSpanProcessor` and an exporter that drops
everything, two attributes). The cost is process CPU time (`time.process_time`, all threads:
the writer's encoding and the span processor count) from the start of the loop to the end of
both drains, per operation. "added" is hooked minus plain; "per segment" divides it by the
events the hook emitted per operation; "OTel span" is traced minus plain: what one span costs
around the same operation, with the caches as cold as the hook finds them. The target is at
most half of that per recorded segment. "(loop)" is a span in a loop that does nothing else,
for reference: warm caches make it cheaper than in situ, the hook's cost is measured in situ.

Operations: `sqlalchemy` (a QueuePool connection, `SELECT 1`, on PostgreSQL), `psycopg_pool`
(`with pool.connection(): execute("SELECT 1")`), `asyncpg` (`async with pool.acquire():
fetchval("SELECT 1")`), `redis` (`GET` on a BlockingConnectionPool), `httpx` (a GET to a
server in its own process), `aiohttp_client` (`session.get` + `read()` to the same server),
`sleeps` (a 1 ms `time.sleep`), `threads` (`submit` to an idle ThreadPoolExecutor and `result()`:
no segment, the cost of carrying the request into the task), `agent_tools` (a LangChain tool
`invoke`d with a tool call). The `locks` hook has its own benchmark (`bench_locks.py`).
PostgreSQL at `$LATPROF_TEST_PG` (default the local server), Redis at 127.0.0.1:6379.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Optional

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from latprof.capture.writer import CaptureWriter
from latprof.collectors.hooks import bootstrap, runtime

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


#: What an operation runs inside: an OpenTelemetry span per operation, or nothing.
Span = Optional[Callable[[], ContextManager[Any]]]
_NOTHING = contextlib.nullcontext()

# --- operations: (setup -> (op, teardown)) ----------------------------------------------------


def op_sqlalchemy() -> tuple[Callable[..., None], Callable[[], None]]:
    from sqlalchemy import create_engine, text

    engine = create_engine(PG.replace("postgresql://", "postgresql+psycopg://"), pool_size=2, max_overflow=0)
    query = text("SELECT 1")

    def op(span: Span = None) -> None:
        with span() if span else _NOTHING:
            with engine.connect() as conn:
                conn.execute(query).scalar()

    return op, engine.dispose


def op_psycopg_pool() -> tuple[Callable[..., None], Callable[[], None]]:
    from psycopg_pool import ConnectionPool

    pool = ConnectionPool(PG, min_size=2, max_size=2, open=True)

    def op(span: Span = None) -> None:
        with span() if span else _NOTHING:
            with pool.connection() as conn:
                conn.execute("SELECT 1").fetchone()

    return op, pool.close


def op_asyncpg() -> tuple[Callable[..., None], Callable[[], None]]:
    import asyncpg

    loop = asyncio.new_event_loop()

    async def make() -> Any:
        return await asyncpg.create_pool(PG, min_size=2, max_size=2)

    pool = loop.run_until_complete(make())
    batch = 50

    async def some(span: Span) -> None:
        for _ in range(batch):
            with span() if span else _NOTHING:
                async with pool.acquire() as conn:
                    await conn.fetchval("SELECT 1")

    def op(span: Span = None) -> None:  # `batch` operations per call: one event loop turn-around per call is not the hook's
        loop.run_until_complete(some(span))

    def close() -> None:
        loop.run_until_complete(pool.close())
        loop.close()

    op.batch = batch  # type: ignore[attr-defined]
    return op, close


def op_redis() -> tuple[Callable[..., None], Callable[[], None]]:
    import redis

    client = redis.Redis(connection_pool=redis.BlockingConnectionPool(host="127.0.0.1", port=6379, max_connections=2))
    client.set("latprof-bench-key", "x")

    def op(span: Span = None) -> None:
        with span() if span else _NOTHING:
            client.get("latprof-bench-key")

    def close() -> None:
        client.delete("latprof-bench-key")
        client.close()

    return op, close


_HTTP_SERVER = """
import http.server, sys

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # one write: headers and body in two would cost a delayed ACK each
        self.wfile.write(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok")

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def op_httpx() -> tuple[Callable[..., None], Callable[[], None]]:
    """A GET to a server in its own process: in this one, its CPU and its GIL handoffs with the
    client would be counted as the client's (and move with the hook's timing)."""
    import httpx

    server = subprocess.Popen([sys.executable, "-c", _HTTP_SERVER], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    port = int(server.stdout.readline())
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}")

    def op(span: Span = None) -> None:
        with span() if span else _NOTHING:
            client.get("/tool")

    def close() -> None:
        client.close()
        server.terminate()
        server.wait(10)

    return op, close


def op_aiohttp_client() -> tuple[Callable[..., None], Callable[[], None]]:
    """`session.get` + `read()` to the same server in its own process, `batch` per event loop run."""
    import aiohttp

    server = subprocess.Popen([sys.executable, "-c", _HTTP_SERVER], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    url = f"http://127.0.0.1:{int(server.stdout.readline())}/tool"
    loop = asyncio.new_event_loop()
    session = loop.run_until_complete(_session(aiohttp))
    batch = 50

    async def some(span: Span) -> None:
        for _ in range(batch):
            with span() if span else _NOTHING:
                async with session.get(url) as response:
                    await response.read()

    def op(span: Span = None) -> None:
        loop.run_until_complete(some(span))

    def close() -> None:
        loop.run_until_complete(session.close())
        loop.close()
        server.terminate()
        server.wait(10)

    op.batch = batch  # type: ignore[attr-defined]
    return op, close


async def _session(aiohttp: Any) -> Any:
    return aiohttp.ClientSession()


def op_sleeps() -> tuple[Callable[..., None], Callable[[], None]]:
    """A 1 ms `time.sleep` (a sleep segment): CPU is the system call's and the hook's, not the wait."""

    def op(span: Span = None) -> None:
        with span() if span else _NOTHING:
            time.sleep(0.001)

    return op, lambda: None


def op_threads() -> tuple[Callable[..., None], Callable[[], None]]:
    """A task handed to an idle ThreadPoolExecutor and waited for (no segment: the hook's cost is carrying the request)."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(2)

    def task() -> int:
        return 1

    def op(span: Span = None) -> None:
        with span() if span else _NOTHING:
            pool.submit(task).result()

    return op, pool.shutdown


def op_agent_tools() -> tuple[Callable[..., None], Callable[[], None]]:
    """A LangChain tool called with a tool call, as an agent calls it."""
    from langchain_core.tools import tool

    @tool
    def lookup(customer_id: str) -> str:
        """A customer's plan."""
        return "pro"

    call = {"name": "lookup", "args": {"customer_id": "cust_48213"}, "id": "call_1", "type": "tool_call"}

    def op(span: Span = None) -> None:
        with span() if span else _NOTHING:
            lookup.invoke(call)

    return op, lambda: None


OPERATIONS: dict[str, Callable[[], tuple[Callable[..., None], Callable[[], None]]]] = {
    "sqlalchemy": op_sqlalchemy,
    "psycopg_pool": op_psycopg_pool,
    "asyncpg": op_asyncpg,
    "redis": op_redis,
    "httpx": op_httpx,
    "aiohttp_client": op_aiohttp_client,
    "sleeps": op_sleeps,
    "threads": op_threads,
    "agent_tools": op_agent_tools,
}


def timed(op: Callable[..., None], n: int, writer: CountingWriter | None, span: Span = None,
          provider: TracerProvider | None = None) -> tuple[float, int]:
    """Process CPU ns per operation (to the end of the writer's and the span processor's drain)
    and events emitted."""
    batch = getattr(op, "batch", 1)
    calls = max(1, n // batch)
    before = writer.events if writer else 0
    token = runtime.begin_request("GET /bench", runtime.now_ns())
    cpu0 = time.process_time_ns()
    for _ in range(calls):
        op(span)
    runtime.end_request(token)
    if writer is not None:
        writer.flush()
    if provider is not None:
        provider.force_flush()
    cpu = time.process_time_ns() - cpu0
    events = (writer.events - before - 1) if writer else 0  # less the request root
    return cpu / (calls * batch), events


def otel_provider(n: int) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(NullExporter(), max_queue_size=max(n + 10, 1024), max_export_batch_size=512)
    )
    return provider


def otel_in_situ(op: Callable[..., None], n: int, writer: CountingWriter) -> float:
    """Process CPU ns per operation with an OpenTelemetry span around each (no hook)."""
    provider = otel_provider(n)
    tracer = provider.get_tracer("bench")
    attrs = {"db.system.name": "postgresql", "db.query.summary": "SELECT 1"}

    def span() -> ContextManager[Any]:
        return tracer.start_as_current_span("SELECT 1", attributes=attrs)

    runtime.start(writer)
    with tracer.start_as_current_span("root"):
        cpu, _ = timed(op, n, writer, span, provider)
    runtime.stop()
    provider.shutdown()
    return cpu


def otel_span_ns(n: int) -> float:
    """Process CPU ns of an OpenTelemetry span in a loop that does nothing else (warm caches)."""
    provider = otel_provider(n)
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
        print(f"{'hook':<14}{'off':>10}{'on':>10}{'added':>10}{'segments':>10}{'per seg.':>10}{'OTel span':>11}{'(loop)':>11}{'ratio':>8}")
        for name in names:
            hook = bootstrap.HOOKS[name]
            try:
                op, close = OPERATIONS[name]()
            except Exception as exc:  # a service that is not there: say so, go on
                print(f"{name:<14} skipped: {type(exc).__name__}: {exc}")
                continue
            off: list[float] = []
            on: list[float] = []
            traced: list[float] = []
            loop_span: list[float] = []
            events = 0
            try:
                for _ in range(3):  # warm-up: connections, caches, first imports
                    op()
                for trial in range(args.trials):
                    for variant in (("off", "on", "otel") if trial % 2 == 0 else ("otel", "on", "off")):
                        if variant == "on":
                            runtime.start(writer)
                            hook.install()
                            cpu, events = timed(op, args.ops, writer)
                            on.append(cpu)
                            hook.uninstall()
                            runtime.stop()
                        elif variant == "off":
                            runtime.start(writer)
                            cpu, _ = timed(op, args.ops, writer)
                            off.append(cpu)
                            runtime.stop()
                        else:
                            traced.append(otel_in_situ(op, args.ops, writer))
                    loop_span.append(otel_span_ns(args.ops))
            finally:
                close()
            a, b = statistics.median(off), statistics.median(on)
            o = statistics.median(traced) - a
            per_op_segments = events / args.ops
            per_segment = (b - a) / per_op_segments if per_op_segments else float("nan")
            ratio = per_segment / o if per_op_segments and o > 0 else float("nan")
            print(f"{name:<14}{a:>10.0f}{b:>10.0f}{b - a:>+10.0f}{per_op_segments:>10.2f}{per_segment:>10.0f}"
                  f"{o:>+11.0f}{statistics.median(loop_span):>11.0f}{ratio:>8.2f}")
        writer.writer.close()


if __name__ == "__main__":
    main()
