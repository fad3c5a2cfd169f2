"""The outbound hooks' own code is part of what the hooks report they cost (`runtime.cost`).

Around their recording calls, the openai, httpx (raw LLM calls) and DB pool hooks mark their
per-call and per-chunk bookkeeping as stretches of hook code (`runtime.cost_begin` /
`cost_end`). Each test runs real calls inside one request with every call of the runtime timed
(its random gap pinned to 1) and counts:

- the runtime's numbered calls (`recording_calls`: the recording functions and the stretches)
  against the recording calls alone (one per segment, gauge, and two per request: open and
  end), which with the stretches switched off are all there is: the difference is the
  stretches, as many as the hook's code marks per call and per chunk;
- the timed calls: every stretch once, plus the two recording calls outside any stretch (the
  test's own request): the recording calls inside a stretch are taken out of its time, not
  counted again, and no stretch was opened inside another (it would go untimed).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
import types
from typing import Any, Callable, Iterator

import pytest
from recording import recording

import services

from latprof.collectors.hooks import runtime
from latprof.demo.provider import Provider
from latprof.events import Gauge, Request, Segment

TOKENS = 8
MESSAGES = [{"role": "user", "content": "What do the hooks cost?"}]
OUTSIDE = 2  # the recording calls of every run outside any stretch: its request's open and end


def _numbered() -> int:
    """How many calls the runtime has numbered (recording calls and stretches), without taking a number."""
    text = repr(runtime._calls)  # itertools.count(N)
    return int(text[text.index("(") + 1 : -1])


def _recording_calls(events: list[Any]) -> int:
    """The recording calls that emitted `events`: one per segment and gauge, open and end per request."""
    return sum(2 if isinstance(e, Request) else 1 for e in events if isinstance(e, (Segment, Gauge, Request)))


@contextlib.contextmanager
def _every_call_timed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Record to memory with every recording call and stretch timed (none left out as an outlier)."""
    monkeypatch.setattr(runtime, "random", types.SimpleNamespace(random=lambda: 0.0))  # the gap to the next timed call: 1
    monkeypatch.setattr(runtime, "MAX_TIMED_NS", 10_000_000_000)  # a loaded machine: no timed call is an outlier
    with recording() as events:
        yield events


def _without_stretches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switch every stretch off: `cost_begin` (and the hooks' own bindings of it) takes no number."""
    begin = runtime.cost_begin
    for name, module in list(sys.modules.items()):
        if module is not None and name.startswith("latprof.collectors.hooks."):
            for attr, value in list(vars(module).items()):
                if value is begin:
                    monkeypatch.setattr(module, attr, lambda: 0)


class Counted:
    """What one run cost: numbered calls, recording calls, timed calls and their time, its wall time."""

    def __init__(self, numbered: int, recording_calls: int, timed: int, timed_ns: int, wall_ns: int) -> None:
        self.numbered = numbered
        self.recording_calls = recording_calls
        self.timed = timed
        self.timed_ns = timed_ns
        self.wall_ns = wall_ns

    @property
    def stretches(self) -> int:
        return self.numbered - self.recording_calls


def _run(events: list[Any], fn: Callable[[], Any]) -> tuple[Counted, Any]:
    """`fn()` inside one request; what it cost the runtime's counters."""
    before = len(events)
    numbered, timed, timed_ns = _numbered(), runtime._timed, runtime._timed_ns
    t0 = time.perf_counter_ns()
    token = runtime.begin_request("POST /agent", runtime.now_ns())
    try:
        result = fn()
    finally:
        runtime.end_request(token)
    wall_ns = time.perf_counter_ns() - t0
    counted = Counted(
        _numbered() - numbered, _recording_calls(events[before:]), runtime._timed - timed, runtime._timed_ns - timed_ns, wall_ns
    )
    return counted, result


def _assert_stretches(monkeypatch: pytest.MonkeyPatch, fn: Callable[[], Any], expected: Callable[[Any], int]) -> None:
    """`fn` (run once to warm up, then measured) marks `expected(its result)` stretches, each timed once."""
    with _every_call_timed(monkeypatch) as events:
        fn()  # imports, connections, the first call's one-time work
        with_stretches, result = _run(events, fn)
        with monkeypatch.context() as off:
            _without_stretches(off)
            alone, _ = _run(events, fn)
        cost = runtime.cost()

    # Without stretches, the numbered calls are the recording calls alone, each timed on its own.
    assert alone.stretches == 0 and alone.timed == alone.numbered == alone.recording_calls > OUTSIDE
    # With them: as many more as the hook's code marks.
    assert with_stretches.stretches == expected(result) > 0
    # Each stretch timed once (none opened inside another), the recording calls inside them not on their own.
    assert with_stretches.timed == with_stretches.stretches + OUTSIDE
    assert 0 < with_stretches.timed_ns <= with_stretches.wall_ns
    assert cost["timed_calls"] == runtime._timed and cost["recording_calls"] >= with_stretches.numbered


# --- openai ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    with Provider(ttft_ms=5, tpot_ms=1, output_tokens=TOKENS, seed=7, subprocess=True) as running:
        yield running


@pytest.fixture
def openai_hook() -> Iterator[Any]:
    pytest.importorskip("openai")
    from latprof.collectors.hooks import httpx as httpx_hook
    from latprof.collectors.hooks import openai as hook

    httpx_installed, openai_installed = httpx_hook.scaffold.installed, hook.scaffold.installed
    httpx_hook.uninstall()  # the SDK's own HTTP request: the httpx hook's pool note would be a stretch too
    hook.install()
    try:
        yield hook
    finally:  # as the tests before left them
        if not openai_installed:
            hook.uninstall()
        if httpx_installed:
            httpx_hook.install()
        gc.collect()  # the calls' clients, streams and spans: not in a later test's timing


@pytest.fixture
def openai_client(provider: Provider, openai_hook: Any) -> Iterator[Any]:
    import openai

    with openai.OpenAI(base_url=provider.url, api_key="unused", max_retries=0) as client:
        yield client


# _begin (the call and its span), _enter, _leave, returned's own part, finish.
OPENAI_PER_CALL = 5


def test_an_openai_call_is_five_stretches_of_hook_code(monkeypatch, openai_client):
    def call() -> Any:
        return openai_client.chat.completions.create(model="demo", messages=MESSAGES)

    _assert_stretches(monkeypatch, call, lambda answer: OPENAI_PER_CALL)


def test_an_openai_stream_is_a_stretch_more_per_chunk(monkeypatch, openai_client):
    def call() -> int:
        stream = openai_client.chat.completions.create(model="demo", messages=MESSAGES, stream=True)
        return sum(1 for _ in stream)

    _assert_stretches(monkeypatch, call, lambda chunks: OPENAI_PER_CALL + chunks)


# --- httpx: raw LLM calls ----------------------------------------------------------------------


@pytest.fixture
def httpx_hook() -> Iterator[Any]:
    pytest.importorskip("httpx")
    from latprof.collectors.hooks import httpx as hook

    hook.install()
    try:
        yield hook
    finally:
        hook.uninstall()


@pytest.fixture
def chunks_seen(monkeypatch: pytest.MonkeyPatch, httpx_hook: Any) -> list[int]:
    """How many raw chunks `Exchange.seen` was handed (each a stretch of its own)."""
    from latprof.collectors.hooks import _outbound

    seen = _outbound.Exchange.seen
    count = [0]

    def counting(self: Any, chunk: bytes) -> None:
        count[0] += 1
        seen(self, chunk)

    monkeypatch.setattr(_outbound.Exchange, "seen", counting)
    return count


# send before the call, its pool note, send after it (responded), finish; and one per chunk.
HTTPX_PER_CALL = 4


def test_a_raw_llm_call_through_httpx_is_stretches_per_call_and_per_chunk(monkeypatch, provider, chunks_seen):
    import httpx

    with httpx.Client() as client:

        def call() -> int:
            chunks_seen[0] = 0
            response = client.post(f"{provider.url}/chat/completions", json={"model": "demo", "messages": MESSAGES})
            assert response.json()["usage"]["completion_tokens"] == TOKENS
            return chunks_seen[0]

        _assert_stretches(monkeypatch, call, lambda chunks: HTTPX_PER_CALL + chunks)


def test_a_streamed_raw_llm_call_through_httpx_is_a_stretch_more_per_chunk(monkeypatch, provider, chunks_seen):
    import httpx

    with httpx.Client() as client:

        def call() -> int:
            chunks_seen[0] = 0
            body = {"model": "demo", "messages": MESSAGES, "stream": True}
            with client.stream("POST", f"{provider.url}/chat/completions", json=body) as response:
                lines = [line for line in response.iter_lines() if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]"
            return chunks_seen[0]

        _assert_stretches(monkeypatch, call, lambda chunks: HTTPX_PER_CALL + chunks)


# --- a DB pool: psycopg_pool on the real PostgreSQL ----------------------------------------------


@pytest.fixture
def pg_pool() -> Iterator[Any]:
    services.require_pg()
    try:
        from psycopg_pool import ConnectionPool
    except ImportError as exc:
        services.missing(f"psycopg_pool is not installed: {exc}", "psycopg and psycopg_pool are")
    from latprof.collectors.hooks import psycopg_pool as hook

    assert hook.install() is True
    try:
        with ConnectionPool(services.PG_DSN, min_size=1, max_size=1, open=True, kwargs={"connect_timeout": 5}) as pool:
            yield pool
    finally:
        hook.uninstall()


# getconn before and after the checkout, execute before and after the statement, putconn.
PSYCOPG_POOL_PER_STATEMENT = 5


def test_a_checkout_and_statement_of_psycopg_pool_are_stretches_of_hook_code(monkeypatch, pg_pool):
    def call() -> Any:
        with pg_pool.connection() as conn:
            return conn.execute("SELECT 1").fetchone()

    _assert_stretches(monkeypatch, call, lambda row: PSYCOPG_POOL_PER_STATEMENT)


# --- a DB pool: SQLAlchemy's QueuePool on the real PostgreSQL --------------------------------------


@pytest.fixture
def sa_engine() -> Iterator[Any]:
    services.require_pg()
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from latprof.collectors.hooks import sqlalchemy as hook

    assert hook.install() is True
    engine = sqlalchemy.create_engine(services.PG_DSN, pool_size=1, max_overflow=0, connect_args={"connect_timeout": 5})
    try:
        yield engine
    finally:
        engine.dispose()
        hook.uninstall()


# the checkout's begin and end, the checkout and checkin events, the statement's end.
SQLALCHEMY_PER_STATEMENT = 5


def test_a_checkout_and_statement_of_sqlalchemy_are_stretches_of_hook_code(monkeypatch, sa_engine):
    from sqlalchemy import text

    def call() -> Any:
        with sa_engine.connect() as conn:
            return conn.execute(text("SELECT 1")).scalar()

    _assert_stretches(monkeypatch, call, lambda value: SQLALCHEMY_PER_STATEMENT)


# --- redis-py on the real Redis ----------------------------------------------------------------


@pytest.fixture
def redis_client() -> Iterator[Any]:
    redis = pytest.importorskip("redis")
    from latprof.collectors.hooks import redis as hook

    url = os.environ.get("LATPROF_TEST_REDIS", "redis://127.0.0.1:6379/0")
    assert hook.install() is True
    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
    try:
        try:
            client.ping()
        except redis.RedisError as exc:
            services.missing(f"redis is not reachable at {url}: {type(exc).__name__}: {exc}", "Redis is")
        yield client
    finally:
        client.close()
        hook.uninstall()


# the checkout's begin and end, the command's end, the release's hold and gauges.
REDIS_PER_COMMAND = 5


def test_a_redis_command_is_stretches_of_hook_code(monkeypatch, redis_client):
    _assert_stretches(monkeypatch, lambda: redis_client.get("latprof:cost:absent"), lambda value: REDIS_PER_COMMAND)


# --- asyncpg's pool on the real PostgreSQL ----------------------------------------------------------


@pytest.fixture
def asyncpg_pool() -> Iterator[tuple[Any, Any]]:
    import asyncio

    asyncpg = pytest.importorskip("asyncpg")
    services.require_pg()
    from latprof.collectors.hooks import asyncpg as hook

    assert hook.install() is True
    loop = asyncio.new_event_loop()
    dsn = "postgresql://" + services.PG_DSN.split("://", 1)[1]

    async def create() -> Any:
        return await asyncpg.create_pool(dsn, min_size=1, max_size=1, timeout=5)

    pool = loop.run_until_complete(create())
    try:
        yield loop, pool
    finally:
        loop.run_until_complete(pool.close())
        loop.close()
        hook.uninstall()


# the checkout's begin and end, the statement's end, the release's hold lookup and its end.
ASYNCPG_PER_QUERY = 5


def test_an_asyncpg_checkout_is_stretches_of_hook_code(monkeypatch, asyncpg_pool):
    loop, pool = asyncpg_pool

    async def query() -> Any:
        async with pool.acquire() as conn:
            return await conn.fetchval("SELECT 1")

    _assert_stretches(monkeypatch, lambda: loop.run_until_complete(query()), lambda value: ASYNCPG_PER_QUERY)
