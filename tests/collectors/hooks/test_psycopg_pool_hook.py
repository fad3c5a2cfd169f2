"""The psycopg_pool hook on real pools: checkout waits, holds, statements, gauges, its own faults, a verdict.

Every pool talks to the real PostgreSQL of `$LATPROF_TEST_PG` (default the local trust-auth
server; a SQLAlchemy URL is turned into a plain conninfo). Without a server, or without psycopg
and psycopg_pool, the tests skip on a developer box and fail in CI.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from apps.harness import ROOT, Pending, Server, get
from recording import recording

import services

from latprof.capture.reader import read_captures
from latprof.collectors.hooks import runtime
from latprof.events import Gauge, QualityRecord, Request, Segment
from latprof.layers import DB_POOL, DB_QUERY
from latprof.semconv import (
    DB_OPERATION_NAME,
    DB_POOL_NAME,
    DB_QUERY_SUMMARY,
    DB_SYSTEM_NAME,
    GAUGE_POOL_IN_USE,
    GAUGE_POOL_MAX,
    GAUGE_POOL_SIZE,
    GAUGE_POOL_WAITERS,
    LAST_ERROR,
    SEGMENT_CONNECTION_HOLD,
)

# A plain libpq URL: the SQLAlchemy tests' `postgresql+psycopg://` form works too.
PG_CONNINFO = re.sub(
    r"^postgresql\+\w+://", "postgresql://", os.environ.get("LATPROF_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
)
IN_CI = os.environ.get("CI", "").lower() == "true"
HOLD_S = 0.4  # how long the first request keeps the only connection
SECRET = "latprof-secret-parameter-4711"  # a parameter value that must never reach the capture


def missing(reason: str) -> None:
    """Skip on a developer box; in CI a missing service or driver is a failure."""
    services.missing(reason, "PostgreSQL, psycopg and psycopg_pool are")


try:
    import psycopg
    from psycopg_pool import AsyncConnectionPool, ConnectionPool, NullConnectionPool, PoolTimeout
except ImportError:
    if IN_CI:
        raise
    pytest.skip("psycopg or psycopg_pool is not installed", allow_module_level=True)

from latprof.collectors.hooks import psycopg_pool as hook


@pytest.fixture
def recorded():
    with recording() as events:
        assert hook.install() is True
        try:
            yield events
        finally:
            hook.uninstall()


@pytest.fixture(scope="module")
def conninfo() -> str:
    try:
        with psycopg.connect(PG_CONNINFO, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        missing(f"PostgreSQL is not reachable at {PG_CONNINFO}: {type(exc).__name__}: {str(exc).strip()[:200]}")
    return PG_CONNINFO


@contextlib.contextmanager
def sync_pool(conninfo: str, cls: type = ConnectionPool, **options: Any) -> Iterator[Any]:
    pool = cls(conninfo, open=True, kwargs={"connect_timeout": 5}, **options)
    try:
        yield pool
    finally:
        pool.close()


def segments(events, request_id: str | None = None) -> list[Segment]:
    return [e for e in events if isinstance(e, Segment) and (request_id is None or e.request_id == request_id)]


def request_of(events, route: str) -> Request:
    (found,) = [e for e in events if isinstance(e, Request) and e.route == route]
    return found


def ms(segment: Segment) -> float:
    return (segment.end_ns - segment.start_ns) / 1e6


def pool_gauges(events, name: str) -> list[Gauge]:
    return [g for g in events if isinstance(g, Gauge) and g.attrs.get(DB_POOL_NAME) == name]


def hook_errors(events) -> list[QualityRecord]:
    return [q for q in events if isinstance(q, QualityRecord) and q.kind == "error" and q.attrs.get("collector") == hook.HOOK]


def assert_private(events) -> None:
    """No parameter value, statement text or credential anywhere in what was recorded."""
    text_of_events = repr(events)
    assert SECRET not in text_of_events
    assert "relname =" not in text_of_events and "pg_sleep(" not in text_of_events and "VALUES" not in text_of_events
    assert "postgres@" not in text_of_events


# --- contention: the second request waits for the first one's connection ----------------------

WAITER_STATEMENTS = (
    "SELECT pg_class",  # conn.execute: one statement, although it runs through a cursor
    "CREATE TABLE latprof_items",
    "INSERT latprof_items",  # executemany: one statement
    "SELECT latprof_items",
)


def check_contention(events, name: str) -> None:
    holder, waiter = request_of(events, "POST /hold"), request_of(events, "POST /wait")

    (wait,) = [s for s in segments(events, waiter.request_id) if s.layer == DB_POOL]
    assert wait.name == hook.SEGMENT_CHECKOUT
    assert ms(wait) >= HOLD_S * 1000 * 0.75, f"waited only {ms(wait):.1f} ms for the held connection"
    assert wait.attrs == {DB_POOL_NAME: name, DB_SYSTEM_NAME: "postgresql"}  # it got the holder's connection back

    (holder_pool,) = [s for s in segments(events, holder.request_id) if s.layer == DB_POOL]
    assert ms(holder_pool) < ms(wait)
    # min_size=0: the first checkout queued while the pool opened its connection
    assert 0 < holder_pool.attrs[hook.CONNECT_MS] <= ms(holder_pool) + 0.01

    (hold,) = [s for s in segments(events, holder.request_id) if s.name == SEGMENT_CONNECTION_HOLD]
    assert hold.layer is None and hold.attrs == {DB_POOL_NAME: name} and hold.parent_id is None
    assert ms(hold) >= HOLD_S * 1000 * 0.9
    assert hold.start_ns >= holder_pool.end_ns and hold.end_ns <= wait.end_ns + 5_000_000
    (waiter_hold,) = [s for s in segments(events, waiter.request_id) if s.name == SEGMENT_CONNECTION_HOLD]
    assert waiter_hold.start_ns >= wait.end_ns

    for request in (holder, waiter):
        queries = [s for s in segments(events, request.request_id) if s.layer == DB_QUERY]
        assert queries, f"no db.query segment in {request.route}"
        for query in queries:
            assert query.attrs[DB_SYSTEM_NAME] == "postgresql"
            assert query.name == query.attrs[DB_QUERY_SUMMARY]
            assert query.attrs[DB_OPERATION_NAME] == query.name.split()[0]
    (sleep,) = [s for s in segments(events, holder.request_id) if s.layer == DB_QUERY]
    assert sleep.name == "SELECT" and ms(sleep) >= HOLD_S * 1000 * 0.9  # the pg_sleep
    waiter_queries = [s for s in segments(events, waiter.request_id) if s.layer == DB_QUERY]
    assert tuple(s.name for s in waiter_queries) == WAITER_STATEMENTS  # each statement once, in order
    assert all(waiter_hold.start_ns <= s.start_ns and s.end_ns <= waiter_hold.end_ns for s in waiter_queries)

    gauges = pool_gauges(events, name)
    assert {g.value for g in gauges if g.name == GAUGE_POOL_MAX} == {1.0}
    assert any(g.name == GAUGE_POOL_WAITERS and g.value >= 1 for g in gauges)
    assert any(g.name == GAUGE_POOL_IN_USE and g.value == 1 for g in gauges)
    assert any(g.name == GAUGE_POOL_SIZE and g.value == 1 for g in gauges)
    # While the waiter queued, the gauge said someone waited: readings are emitted when a value
    # changes, so the one in force at a moment is the last one before it.
    waiters = sorted((g.ts_ns, g.value) for g in gauges if g.name == GAUGE_POOL_WAITERS)
    in_force = [v for ts, v in waiters if ts <= wait.start_ns][-1:] + [v for ts, v in waiters if wait.start_ns < ts <= wait.end_ns]
    assert max(in_force, default=0) >= 1, [(round((ts - wait.start_ns) / 1e6, 1), v) for ts, v in waiters]
    assert not hook_errors(events) and hook.HOOK not in runtime.errors()
    assert_private(events)


def test_sync_pool_a_request_waiting_for_the_held_connection_gets_a_pool_segment(recorded, conninfo):
    held, waiting = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    with sync_pool(conninfo, min_size=0, max_size=1, name="latprof-sync", timeout=30) as pool:

        def holder() -> None:
            token = runtime.begin_request("POST /hold", runtime.now_ns())
            try:
                with pool.connection() as conn:
                    held.set()
                    waiting.wait(10)  # keep the connection until the other request asks for it
                    conn.execute("SELECT pg_sleep(%s)", (HOLD_S,))
            except BaseException as exc:  # reported by the test's thread
                failures.append(exc)
            finally:
                held.set()
                runtime.end_request(token)

        def waiter() -> None:
            held.wait(10)
            token = runtime.begin_request("POST /wait", runtime.now_ns())
            try:
                waiting.set()
                with pool.connection() as conn:
                    assert conn.execute("SELECT count(*) FROM pg_class WHERE relname = %s", (SECRET,)).fetchone() == (0,)
                    with conn.cursor() as cur:
                        cur.execute("CREATE TEMP TABLE IF NOT EXISTS latprof_items (secret text)")
                        cur.executemany("INSERT INTO latprof_items (secret) VALUES (%s)", [(SECRET,), (SECRET + "2",)])
                        cur.execute("SELECT count(*) FROM latprof_items WHERE secret = %s", (SECRET,))
                        assert cur.fetchone() == (1,)
            except BaseException as exc:
                failures.append(exc)
            finally:
                runtime.end_request(token)

        threads = [threading.Thread(target=holder), threading.Thread(target=waiter)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert not failures, failures
    check_contention(recorded, "latprof-sync")


def test_async_pool_a_task_waiting_for_the_held_connection_gets_a_pool_segment(recorded, conninfo):
    async def main() -> None:
        pool = AsyncConnectionPool(
            conninfo, min_size=0, max_size=1, name="latprof-async", timeout=30, open=False, kwargs={"connect_timeout": 5}
        )
        await pool.open()
        held, waiting = asyncio.Event(), asyncio.Event()

        async def holder() -> None:
            token = runtime.begin_request("POST /hold", runtime.now_ns())
            try:
                async with pool.connection() as conn:
                    held.set()
                    await waiting.wait()  # the waiter runs on until it queues in the pool
                    await conn.execute("SELECT pg_sleep(%s)", (HOLD_S,))
            finally:
                held.set()
                runtime.end_request(token)

        async def waiter() -> None:
            await held.wait()
            token = runtime.begin_request("POST /wait", runtime.now_ns())
            try:
                waiting.set()
                async with pool.connection() as conn:
                    cur = await conn.execute("SELECT count(*) FROM pg_class WHERE relname = %s", (SECRET,))
                    assert await cur.fetchone() == (0,)
                    async with conn.cursor() as cur:
                        await cur.execute("CREATE TEMP TABLE IF NOT EXISTS latprof_items (secret text)")
                        await cur.executemany("INSERT INTO latprof_items (secret) VALUES (%s)", [(SECRET,), (SECRET + "2",)])
                        await cur.execute("SELECT count(*) FROM latprof_items WHERE secret = %s", (SECRET,))
                        assert await cur.fetchone() == (1,)
            finally:
                runtime.end_request(token)

        try:
            await asyncio.wait_for(asyncio.gather(holder(), waiter()), 30)
        finally:
            await pool.close()

    asyncio.run(main())
    check_contention(recorded, "latprof-async")


# --- other checkouts ----------------------------------------------------------------------------


def test_a_null_pool_checkout_is_mostly_opening_the_connection(recorded, conninfo):
    with sync_pool(conninfo, NullConnectionPool, max_size=1, name="latprof-null") as pool:
        token = runtime.begin_request("GET /null", runtime.now_ns())
        with pool.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        runtime.end_request(token)
    root = request_of(recorded, "GET /null")
    mine = segments(recorded, root.request_id)
    (checkout,) = [s for s in mine if s.layer == DB_POOL]
    assert checkout.attrs[DB_POOL_NAME] == "latprof-null"
    # the null pool opened the connection in the caller: most of the checkout was that
    assert 0.5 * ms(checkout) <= checkout.attrs[hook.CONNECT_MS] <= ms(checkout) + 0.01
    assert [s.name for s in mine if s.layer != DB_POOL] == ["SELECT", SEGMENT_CONNECTION_HOLD]


def test_a_checkout_timeout_is_a_pool_segment_with_its_error(recorded, conninfo):
    with sync_pool(conninfo, min_size=1, max_size=1, name="latprof-timeout") as pool:
        pool.wait(10)
        token = runtime.begin_request("GET /timeout", runtime.now_ns())
        with pool.connection(), pytest.raises(PoolTimeout):
            pool.getconn(timeout=0.2)
        runtime.end_request(token)
    failed = [s for s in segments(recorded) if s.layer == DB_POOL and hook.ERROR_TYPE in s.attrs]
    assert len(failed) == 1 and failed[0].attrs[hook.ERROR_TYPE] == "PoolTimeout" and ms(failed[0]) >= 150
    assert len([s for s in segments(recorded) if s.name == SEGMENT_CONNECTION_HOLD]) == 1  # the one it got


def test_a_failing_statement_is_recorded_with_its_error_type(recorded, conninfo):
    with sync_pool(conninfo, min_size=1, max_size=1) as pool:
        token = runtime.begin_request("GET /error", runtime.now_ns())
        with pool.connection() as conn, pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("SELECT * FROM no_such_table WHERE id = %s", (SECRET,))
        runtime.end_request(token)
    (query,) = [s for s in segments(recorded) if s.layer == DB_QUERY]
    assert query.name == "SELECT no_such_table" and query.attrs[hook.ERROR_TYPE] == "UndefinedTable"
    assert_private(recorded)


def test_shared_segment_attributes_are_never_changed_by_a_failure(recorded, conninfo):
    # A checkout's and a statement's attributes are built once per pool and statement text and
    # shared by their segments: an error or a connect time goes into a copy, never into them.
    statement = "SELECT 1 / %s"
    with sync_pool(conninfo, min_size=0, max_size=1, name="latprof-shared") as pool:
        token = runtime.begin_request("GET /shared", runtime.now_ns())
        for divisor in (1, 0, 1):
            with pool.connection() as conn:
                if divisor:
                    assert conn.execute(statement, (divisor,)).fetchone() == (1,)
                else:
                    with pytest.raises(psycopg.errors.DivisionByZero):
                        conn.execute(statement, (divisor,))
        with pool.connection(), pytest.raises(PoolTimeout):
            pool.getconn(timeout=0.05)
        with pool.connection():
            pass
        runtime.end_request(token)
    mine = segments(recorded, request_of(recorded, "GET /shared").request_id)
    queries = [s for s in mine if s.layer == DB_QUERY]
    assert [hook.ERROR_TYPE in s.attrs for s in queries] == [False, True, False]
    assert queries[0].attrs == queries[2].attrs == {DB_SYSTEM_NAME: "postgresql", DB_QUERY_SUMMARY: "SELECT", DB_OPERATION_NAME: "SELECT"}
    checkouts = [s for s in mine if s.layer == DB_POOL]
    assert len(checkouts) == 6
    assert hook.CONNECT_MS in checkouts[0].attrs  # min_size=0: the first one waited for the connection to open
    assert checkouts[4].attrs[hook.ERROR_TYPE] == "PoolTimeout"
    plain = {DB_POOL_NAME: "latprof-shared", DB_SYSTEM_NAME: "postgresql"}
    assert [s.attrs for s in checkouts[1:4]] + [checkouts[5].attrs] == [plain] * 4
    assert {tuple(s.attrs.items()) for s in mine if s.name == SEGMENT_CONNECTION_HOLD} == {((DB_POOL_NAME, "latprof-shared"),)}
    assert not hook_errors(recorded) and hook.HOOK not in runtime.errors()


def test_the_statement_cache_is_bounded(recorded, conninfo, monkeypatch):
    monkeypatch.setattr(hook, "STATEMENT_CACHE_SIZE", 3)
    monkeypatch.setattr(hook, "_statements", {})
    long_statement = "SELECT 1 AS " + "x" * hook.STATEMENT_SCAN_CHARS
    with sync_pool(conninfo, min_size=1, max_size=1) as pool:
        token = runtime.begin_request("GET /many", runtime.now_ns())
        with pool.connection() as conn:
            for n in range(10):
                conn.execute(f"SELECT {n} FROM pg_class LIMIT 1")
                assert len(hook._statements) <= 3
            conn.execute(long_statement)  # too long to be remembered: summarised all the same
        runtime.end_request(token)
    assert long_statement not in hook._statements
    names = [s.name for s in segments(recorded) if s.layer == DB_QUERY]
    assert names == ["SELECT pg_class"] * 10 + ["SELECT"]


def test_a_composed_statement_is_summarised_without_its_literals(recorded, conninfo):
    from psycopg import sql

    statement = sql.SQL("SELECT count(*) FROM {} WHERE relname = {}").format(sql.Identifier("pg_class"), sql.Literal(SECRET))
    with sync_pool(conninfo, min_size=1, max_size=1) as pool:
        token = runtime.begin_request("GET /composed", runtime.now_ns())
        with pool.connection() as conn:
            assert conn.execute(statement).fetchone() == (0,)
            assert conn.execute(b"SELECT relname FROM pg_class WHERE relname = %s", (SECRET,)).fetchone() is None
        runtime.end_request(token)
    assert [s.name for s in segments(recorded) if s.layer == DB_QUERY] == ["SELECT pg_class", "SELECT pg_class"]
    assert_private(recorded)


def test_gauges_of_a_busy_pool_are_rate_limited(recorded, conninfo):
    with sync_pool(conninfo, min_size=1, max_size=1, name="latprof-busy") as pool:
        pool.wait(10)
        start = time.monotonic()
        token = runtime.begin_request("GET /busy", runtime.now_ns())
        for _ in range(300):
            with pool.connection():
                pass
        runtime.end_request(token)
        elapsed = time.monotonic() - start
    readings = [g for g in pool_gauges(recorded, "latprof-busy") if g.name == GAUGE_POOL_IN_USE]
    # at most one reading per 100 ms (and only when a value changed), not one per checkout
    assert 1 <= len(readings) <= elapsed / (hook.GAUGE_INTERVAL_NS / 1e9) + 2, (len(readings), elapsed)
    assert len([s for s in segments(recorded) if s.layer == DB_POOL]) == 300  # every checkout is still a segment


def test_a_hold_nests_under_the_segment_open_at_checkout(recorded, conninfo):
    with sync_pool(conninfo, min_size=1, max_size=1) as pool:
        token = runtime.begin_request("POST /agent", runtime.now_ns())
        with runtime.segment("agent step", None):
            conn = pool.getconn()
            conn.execute("SELECT 1")
        pool.putconn(conn)  # returned outside the step: the hold still belongs to it
        runtime.end_request(token)
    by_name = {s.name: s for s in segments(recorded)}
    assert by_name[SEGMENT_CONNECTION_HOLD].parent_id == by_name["agent step"].segment_id
    assert by_name["SELECT"].parent_id == by_name["agent step"].segment_id
    assert by_name[hook.SEGMENT_CHECKOUT].parent_id == by_name["agent step"].segment_id


def test_nothing_but_gauges_is_recorded_outside_a_request(recorded, conninfo):
    with sync_pool(conninfo, min_size=1, max_size=1, name="latprof-outside") as pool:
        with pool.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            with conn.cursor() as cur:
                cur.executemany("SELECT %s::text", [(SECRET,)])
    assert [e for e in recorded if not isinstance(e, Gauge)] == []
    assert pool_gauges(recorded, "latprof-outside")  # gauges describe the pool, not a request


def test_connections_not_from_a_pool_are_left_alone(recorded, conninfo):
    token = runtime.begin_request("GET /direct", runtime.now_ns())
    with psycopg.connect(conninfo) as conn:
        conn.execute("SELECT 1")
    runtime.end_request(token)
    assert hasattr(psycopg.Cursor.__dict__["execute"], "__latprof_original__")  # patched, yet silent
    assert segments(recorded) == []


# --- SQLAlchemy on the same driver --------------------------------------------------------------


def test_sqlalchemy_on_psycopg_without_a_psycopg_pool_records_nothing_here(recorded, conninfo):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    engine = sqlalchemy.create_engine(conninfo.replace("postgresql://", "postgresql+psycopg://", 1), pool_size=1)
    try:
        token = runtime.begin_request("GET /sqlalchemy", runtime.now_ns())
        with engine.connect() as conn:
            statement = sqlalchemy.text("SELECT count(*) FROM pg_class WHERE relname = :name")
            assert conn.execute(statement, {"name": SECRET}).scalar() == 0
        runtime.end_request(token)
    finally:
        engine.dispose()
    assert segments(recorded) == []  # the SQLAlchemy hook (not installed here) owns these


def test_sqlalchemy_on_a_psycopg_pool_counts_each_statement_and_hold_once(recorded, conninfo):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from latprof.collectors.hooks import sqlalchemy as sqlalchemy_hook

    assert sqlalchemy_hook.install() is True
    try:
        with sync_pool(conninfo, min_size=1, max_size=1, name="latprof-under-sqlalchemy") as pool:
            engine = sqlalchemy.create_engine("postgresql+psycopg://", creator=pool.getconn, pool_size=1, max_overflow=0)
            try:
                token = runtime.begin_request("GET /both", runtime.now_ns())
                with engine.connect() as conn:
                    statement = sqlalchemy.text("SELECT count(*) FROM pg_class WHERE relname = :name")
                    assert conn.execute(statement, {"name": SECRET}).scalar() == 0
                runtime.end_request(token)
            finally:
                engine.dispose()
    finally:
        sqlalchemy_hook.uninstall()
    root = request_of(recorded, "GET /both")
    mine = segments(recorded, root.request_id)
    assert [s.name for s in mine if s.name == "SELECT pg_class"] == ["SELECT pg_class"]
    assert len([s for s in mine if s.name == SEGMENT_CONNECTION_HOLD]) == 1  # SQLAlchemy's
    checkouts = {s.name: s for s in mine if s.layer == DB_POOL}
    assert set(checkouts) == {sqlalchemy_hook.SEGMENT_CHECKOUT, hook.SEGMENT_CHECKOUT}
    ours, theirs = checkouts[hook.SEGMENT_CHECKOUT], checkouts[sqlalchemy_hook.SEGMENT_CHECKOUT]
    assert theirs.start_ns <= ours.start_ns and ours.end_ns <= theirs.end_ns  # the same wait, seen from inside
    assert_private(recorded)


# --- the hook's own faults ----------------------------------------------------------------------


class StatsFailingPool(ConnectionPool):
    """A pool whose statistics cannot be read (as a subclass with a broken `get_stats` would)."""

    def get_stats(self) -> dict[str, int]:
        raise RuntimeError("stats exploded")


def test_a_failing_hook_is_counted_and_the_service_call_still_succeeds(recorded, conninfo):
    with sync_pool(conninfo, StatsFailingPool, min_size=1, max_size=1, name="latprof-broken") as pool:
        token = runtime.begin_request("GET /broken", runtime.now_ns())
        with pool.connection() as conn:
            assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
        runtime.end_request(token)
    runtime.report_errors(force=True)
    errors = hook_errors(recorded)
    assert sum(q.occurrences for q in errors) >= 1
    assert errors[-1].attrs[LAST_ERROR].startswith("RuntimeError at ") and "exploded" not in errors[-1].attrs[LAST_ERROR]
    root = request_of(recorded, "GET /broken")
    # only the gauges were lost: the checkout, the statement and the hold were still recorded
    assert [s.layer or s.name for s in segments(recorded, root.request_id)] == [DB_POOL, DB_QUERY, SEGMENT_CONNECTION_HOLD]
    assert pool_gauges(recorded, "latprof-broken") == []


# --- installing -------------------------------------------------------------------------------


def test_install_twice_patches_once(recorded, conninfo):
    assert hook.install() is True
    for cls, name in ((ConnectionPool, "getconn"), (psycopg.Cursor, "execute"), (psycopg.AsyncCursor, "execute")):
        assert not hasattr(cls.__dict__[name].__latprof_original__, "__latprof_original__")
    assert "getconn" not in NullConnectionPool.__dict__  # it inherits the patched one
    with sync_pool(conninfo, min_size=1, max_size=1) as pool:
        token = runtime.begin_request("GET /once", runtime.now_ns())
        with pool.connection() as conn:
            conn.execute("SELECT 1")
        runtime.end_request(token)
    assert sorted(s.layer or s.name for s in segments(recorded)) == sorted([DB_POOL, DB_QUERY, SEGMENT_CONNECTION_HOLD])


def test_uninstall_restores_psycopg_pool_and_psycopg(recorded):
    patched = [
        (ConnectionPool, "getconn"), (ConnectionPool, "putconn"), (ConnectionPool, "_connect"),
        (AsyncConnectionPool, "getconn"), (AsyncConnectionPool, "putconn"), (AsyncConnectionPool, "_connect"),
        (psycopg.Cursor, "execute"), (psycopg.Cursor, "executemany"), (psycopg.ServerCursor, "execute"),
        (psycopg.AsyncCursor, "execute"), (psycopg.AsyncCursor, "executemany"), (psycopg.AsyncServerCursor, "execute"),
    ]  # fmt: skip
    originals = {(cls, name): cls.__dict__[name].__latprof_original__ for cls, name in patched}
    hook.uninstall()
    for (cls, name), original in originals.items():
        assert cls.__dict__[name] is original, (cls, name)
    assert "executemany" not in psycopg.ServerCursor.__dict__ or not hasattr(
        psycopg.ServerCursor.__dict__["executemany"], "__latprof_original__"
    )
    assert hook.install() is True
    assert all(hasattr(cls.__dict__[name], "__latprof_original__") for cls, name in patched)


def test_a_service_that_never_imports_psycopg_pool_does_not_load_it():
    code = (
        "import sys; from latprof.collectors.hooks import psycopg_pool as hook; assert hook.install();"
        " assert 'psycopg_pool' not in sys.modules and 'psycopg' not in sys.modules, 'imported'; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


OTEL_SERVICE = textwrap.dedent(
    """
    import json, sys
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from latprof.capture.writer import CaptureWriter
    from latprof.collectors.hooks import psycopg_pool as hook, runtime

    reader = InMemoryMetricReader()
    runtime.start(CaptureWriter(sys.argv[2], source="run"))  # as under `latprof run`
    hook.install()  # before the service configures its SDK
    from psycopg_pool import ConnectionPool
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    with ConnectionPool(sys.argv[1], min_size=1, max_size=1, name="otel-pool", open=True) as pool:
        for _ in range(3):
            with pool.connection() as conn:
                conn.execute("select 1")
    found = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    found[metric.name] = {"unit": metric.unit, "count": point.count, "attrs": dict(point.attributes)}
    print(json.dumps(found))
    """
)


def test_the_checkout_wait_is_an_opentelemetry_histogram_when_the_service_has_an_sdk(tmp_path, conninfo):
    pytest.importorskip("opentelemetry.sdk.metrics")  # the service's SDK, not a latprof dependency
    result = subprocess.run(
        [sys.executable, "-c", OTEL_SERVICE, conninfo, str(tmp_path / "capture.jsonl")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found[hook.OTEL_WAIT_TIME] == {"unit": "s", "count": 3, "attrs": {DB_POOL_NAME: "otel-pool"}}


# --- under `latprof run` ----------------------------------------------------------------------

SERVICE = textwrap.dedent(
    """
    import sys, threading
    from psycopg_pool import ConnectionPool
    from latprof.collectors.hooks import runtime

    assert runtime.active(), "hooks were not loaded"
    pool = ConnectionPool(sys.argv[1], min_size=1, max_size=1, name="service-pool", open=True)
    pool.wait(10)
    start = threading.Barrier(3)

    def handle(route, seconds):
        start.wait(10)
        token = runtime.begin_request(route, runtime.now_ns())
        with pool.connection() as conn:
            conn.execute("SELECT pg_sleep(%s)", (seconds,))
        runtime.end_request(token)

    threads = [threading.Thread(target=handle, args=(f"POST /chat{i}", 0.2)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    pool.close()
    """
)


@pytest.mark.slow
def test_latprof_run_captures_pool_waits_queries_and_holds(tmp_path: Path, conninfo):
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    capture = tmp_path / "capture.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "latprof", "run", "--out", str(capture), "--no-report", "--",
         sys.executable, str(script), conninfo],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = read_captures([capture])
    assert "psycopg_pool" in data.quality[0].attrs["collectors"]
    assert len(data.requests) == 3
    all_segments = [s for group in data.segments_by_request.values() for s in group]
    names = {(s.layer, s.name) for s in all_segments}
    assert {(DB_POOL, hook.SEGMENT_CHECKOUT), (DB_QUERY, "SELECT"), (None, SEGMENT_CONNECTION_HOLD)} <= names
    waits = sorted(ms(s) for s in all_segments if s.layer == DB_POOL)
    assert waits[-1] >= 300  # the last of three requests on one connection waited for the other two
    assert max(g.value for g in data.gauges if g.name == GAUGE_POOL_WAITERS) >= 1
    assert not [q for q in data.quality if q.kind == "error" and q.attrs.get("collector") == hook.HOOK], data.quality


# --- end to end: a uvicorn service whose requests queue for connections -------------------------

E2E_APP = "tests.collectors.hooks.apps.psycopg_pool_app:app"
E2E_HOLD_MS = 150  # every request holds one of the pool's 2 connections this long
E2E_ROUNDS = 3  # each: 2 clients one request after the other (no queueing), then a burst
E2E_SEQUENTIAL = 9  # requests per client per round
E2E_BURST = 6  # requests sent at once: 2 served, 2 wait one hold, 2 wait two holds


def drive_pool_queueing(port: int) -> int:
    """Mostly unqueued requests, and bursts that queue for the pool; returns how many were sent."""
    path = f"/work?ms={E2E_HOLD_MS}"
    failures: list[BaseException] = []

    def client() -> None:
        try:
            for _ in range(E2E_SEQUENTIAL):
                response = get(port, path)
                assert response.status == 200, (response.status, response.body[:200])
        except BaseException as exc:
            failures.append(exc)

    for _ in range(E2E_ROUNDS):
        clients = [threading.Thread(target=client) for _ in range(2)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(60)
        assert not failures, failures
        burst = [Pending(port, path) for _ in range(E2E_BURST)]
        assert [p.response().status for p in burst] == [200] * E2E_BURST
        time.sleep(0.05)
    return E2E_ROUNDS * (2 * E2E_SEQUENTIAL + E2E_BURST)


@pytest.mark.slow
def test_a_uvicorn_service_queueing_for_pool_connections_gets_the_db_pool_verdict(tmp_path: Path, conninfo):
    """Async FastAPI endpoints on an AsyncConnectionPool(max_size=2) under `latprof run`: bursts make requests
    queue for a connection, and the analysis names db.pool with db-pool-exhaustion."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")

    server = Server(E2E_APP, "asyncio", "h11", tmp_path, env={"APP_PG_CONNINFO": conninfo, "APP_POOL_MAX": "2"})
    server.start()
    try:
        sent = drive_pool_queueing(server.port)
        server.stop()
        capture = server.capture()
    finally:
        server.kill()

    work = capture.routes("GET /work")
    assert len(work) == sent
    waits = sorted(capture.layer_ms(r, DB_POOL) for r in work)
    assert waits[-1] >= 1.5 * E2E_HOLD_MS, waits[-8:]  # the last of a burst waited for two holds
    assert all(
        s.attrs[DB_POOL_NAME] == "app-pool" for r in work for s in capture.segments(r, DB_POOL)
    )
    assert all(len([s for s in capture.segments(r) if s.name == SEGMENT_CONNECTION_HOLD]) == 1 for r in work)
    assert not [q for q in capture.data.quality if q.kind == "error" and q.attrs.get("collector") == hook.HOOK]

    out = subprocess.run(
        [sys.executable, "-m", "latprof", "analyze", "--format", "json", "--skip-warmup", "0", str(server.capture_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    verdict, latency = report["verdict"], report["latency_ms"]
    print(f"verdict {verdict}; latency {latency}; {report['window']['requests']} requests")
    assert verdict["layer"] == "db.pool" and verdict["status"] == "layer", verdict
    assert verdict["rule"] == "db-pool-exhaustion", verdict
    (finding,) = [f for f in report["findings"] if f["rule"] == "db-pool-exhaustion"]
    assert finding["evidence"]["pool_max"] == 2 and finding["evidence"]["peak_waiters"] >= 2, finding["evidence"]
    assert finding["evidence"]["pools"] == ["app-pool"]
