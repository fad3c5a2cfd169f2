"""The SQLAlchemy hook on real engines: pool waits, holds, statements, gauges, its own faults.

PostgreSQL tests use `$LATPROF_TEST_PG` (default the local trust-auth server). Without a
server, or without SQLAlchemy or a driver, they skip on a developer box and fail in CI.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
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
    GAUGE_POOL_WAITERS,
    LAST_ERROR,
    SEGMENT_CONNECTION_HOLD,
)

PG_DSN = os.environ.get("LATPROF_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() == "true"
HOLD_S = 0.4  # how long the first request keeps the only connection
SECRET = "latprof-secret-parameter-4711"  # a parameter value that must never reach the capture


def missing(reason: str) -> None:
    """Skip on a developer box; in CI a missing service or driver is a failure."""
    services.missing(reason, "PostgreSQL and the drivers are")


def import_or_missing(module: str) -> None:
    try:
        __import__(module)
    except ImportError as exc:
        missing(f"{module} is not installed: {exc}")


try:
    import sqlalchemy
except ImportError:
    if IN_CI:
        raise
    pytest.skip("sqlalchemy is not installed", allow_module_level=True)
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from latprof.collectors.hooks import sqlalchemy as hook


@pytest.fixture
def recorded():
    with recording() as events:
        assert hook.install() is True
        try:
            yield events
        finally:
            hook.uninstall()


@pytest.fixture(scope="module")
def pg_dsn() -> str:
    import_or_missing("psycopg")
    engine = create_engine(PG_DSN, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1"))
    except Exception as exc:
        missing(f"PostgreSQL is not reachable at {make_url(PG_DSN).render_as_string()}: {type(exc).__name__}: {exc}")
    finally:
        engine.dispose()
    return PG_DSN


def segments(events, request_id: str | None = None) -> list[Segment]:
    return [e for e in events if isinstance(e, Segment) and (request_id is None or e.request_id == request_id)]


def request_of(events, route: str) -> Request:
    (found,) = [e for e in events if isinstance(e, Request) and e.route == route]
    return found


def ms(segment: Segment) -> float:
    return (segment.end_ns - segment.start_ns) / 1e6


def assert_private(events) -> None:
    """No parameter value, statement text or credential anywhere in what was recorded."""
    text_of_events = repr(events)
    assert SECRET not in text_of_events
    assert "relname =" not in text_of_events and "pg_sleep(" not in text_of_events
    assert "postgres@" not in text_of_events


def test_a_pool_is_named_by_its_url_without_credentials_or_options():
    url = make_url("postgresql+psycopg://app:hunter2@db.internal:6432/chat?sslmode=require&password=x")
    assert hook.pool_name(url) == "postgresql://db.internal:6432/chat"
    assert hook.pool_name(make_url("sqlite:////var/lib/app.db")) == "sqlite:////var/lib/app.db"


@pytest.mark.parametrize(
    ("statement", "summary"),
    [
        ("SELECT conversations.id FROM conversations WHERE conversations.id = %(id_1)s", "SELECT conversations"),
        ("select 1", "SELECT"),
        ("INSERT INTO messages (body) VALUES ('hello secret') RETURNING messages.id", "INSERT messages"),
        ('UPDATE public."Users" SET name = $1 WHERE id = 7', "UPDATE public.Users"),
        ("DELETE FROM sessions WHERE token = ?", "DELETE sessions"),
        ("WITH recent AS (SELECT * FROM messages) SELECT count(*) FROM recent", "SELECT recent"),
        ("SELECT extract(year FROM created) FROM orders", "SELECT orders"),
        ("/* app=chat */ SELECT 'FROM secret' FROM audit", "SELECT audit"),
        ("CREATE TABLE IF NOT EXISTS items (id int)", "CREATE TABLE items"),
        ("SAVEPOINT sa_savepoint_1", "SAVEPOINT"),
        ("", "OTHER"),
    ],
)
def test_a_statement_is_summarised_by_operation_and_table_never_by_its_values(statement, summary):
    assert hook.summarize(statement)[0] == summary


def expected_pool_name(dsn: str) -> str:
    name = hook.pool_name(make_url(dsn))
    assert name.startswith("postgresql://") and "@" not in name
    return name


# --- contention: the second request waits for the first one's connection ----------------------


def check_contention(events, holder_route: str, waiter_route: str, dsn: str) -> None:
    holder, waiter = request_of(events, holder_route), request_of(events, waiter_route)
    name = expected_pool_name(dsn)

    (wait,) = [s for s in segments(events, waiter.request_id) if s.layer == DB_POOL]
    assert wait.name == hook.SEGMENT_CHECKOUT
    assert ms(wait) >= HOLD_S * 1000 * 0.5, f"waited only {ms(wait):.1f} ms for the held connection"
    assert wait.attrs[DB_POOL_NAME] == name and wait.attrs[DB_SYSTEM_NAME] == "postgresql"
    assert hook.CONNECT_MS not in wait.attrs  # it got the holder's connection back, opened none

    holder_pool = [s for s in segments(events, holder.request_id) if s.layer == DB_POOL]
    assert len(holder_pool) == 1 and ms(holder_pool[0]) < ms(wait)
    assert hook.CONNECT_MS in holder_pool[0].attrs  # the first checkout opened the connection

    (hold,) = [s for s in segments(events, holder.request_id) if s.name == SEGMENT_CONNECTION_HOLD]
    assert hold.layer is None and hold.attrs == {DB_POOL_NAME: name}
    assert ms(hold) >= HOLD_S * 1000 * 0.9
    assert hold.start_ns >= holder_pool[0].end_ns and hold.end_ns <= wait.end_ns + 5_000_000
    assert [s.name for s in segments(events, waiter.request_id) if s.name == SEGMENT_CONNECTION_HOLD] == [
        SEGMENT_CONNECTION_HOLD
    ]

    for request in (holder, waiter):
        queries = [s for s in segments(events, request.request_id) if s.layer == DB_QUERY]
        assert queries, f"no db.query segment in {request.route}"
        for query in queries:
            assert query.attrs[DB_SYSTEM_NAME] == "postgresql"
            assert query.name == query.attrs[DB_QUERY_SUMMARY]
            assert query.attrs[DB_OPERATION_NAME] == query.name.split()[0]
    holder_queries = {s.name: s for s in segments(events, holder.request_id) if s.layer == DB_QUERY}
    assert ms(holder_queries["SELECT"]) >= HOLD_S * 1000 * 0.9  # the pg_sleep
    assert "SELECT pg_class" in {s.name for s in segments(events, waiter.request_id)}

    pool_gauges = [g for g in events if isinstance(g, Gauge) and g.attrs.get(DB_POOL_NAME) == name]
    assert any(g.name == GAUGE_POOL_WAITERS and g.value == 1 for g in pool_gauges)
    assert any(g.name == GAUGE_POOL_IN_USE and g.value == 1 for g in pool_gauges)
    assert {g.value for g in pool_gauges if g.name == GAUGE_POOL_MAX} == {1.0}
    assert_private(events)


def test_sync_engine_a_request_waiting_for_the_held_connection_gets_a_pool_segment(recorded, pg_dsn):
    engine = create_engine(pg_dsn, pool_size=1, max_overflow=0, pool_timeout=30)
    held, waiting = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def holder() -> None:
        token = runtime.begin_request("POST /hold", runtime.now_ns())
        try:
            with engine.connect() as conn:
                held.set()
                waiting.wait(10)  # keep the connection until the other request asks for it
                conn.execute(text("SELECT pg_sleep(:seconds)"), {"seconds": HOLD_S})
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
            with engine.connect() as conn:
                result = conn.execute(text("SELECT count(*) FROM pg_class WHERE relname = :name"), {"name": SECRET})
                assert result.scalar() == 0
        except BaseException as exc:
            failures.append(exc)
        finally:
            runtime.end_request(token)

    threads = [threading.Thread(target=holder), threading.Thread(target=waiter)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    engine.dispose()
    assert not failures, failures
    check_contention(recorded, "POST /hold", "POST /wait", pg_dsn)


@pytest.mark.parametrize("driver", ["psycopg_async", "asyncpg"])
def test_async_engine_a_task_waiting_for_the_held_connection_gets_a_pool_segment(recorded, pg_dsn, driver):
    from sqlalchemy.ext.asyncio import create_async_engine

    import_or_missing("greenlet")
    import_or_missing("asyncpg" if driver == "asyncpg" else "psycopg")
    dsn = make_url(pg_dsn).set(drivername=f"postgresql+{driver}").render_as_string(hide_password=False)

    async def main() -> None:
        engine = create_async_engine(dsn, pool_size=1, max_overflow=0, pool_timeout=30)
        held, waiting = asyncio.Event(), asyncio.Event()

        async def holder() -> None:
            token = runtime.begin_request("POST /hold", runtime.now_ns())
            try:
                async with engine.connect() as conn:
                    held.set()
                    await waiting.wait()  # the waiter runs on until it blocks in the pool
                    await conn.execute(text("SELECT pg_sleep(:seconds)"), {"seconds": HOLD_S})
            finally:
                held.set()
                runtime.end_request(token)

        async def waiter() -> None:
            await held.wait()
            token = runtime.begin_request("POST /wait", runtime.now_ns())
            try:
                waiting.set()
                async with engine.connect() as conn:
                    statement = text("SELECT count(*) FROM pg_class WHERE relname = :name")
                    result = await conn.execute(statement, {"name": SECRET})
                    assert result.scalar() == 0
            finally:
                runtime.end_request(token)

        try:
            await asyncio.wait_for(asyncio.gather(holder(), waiter()), 30)
        finally:
            await engine.dispose()

    asyncio.run(main())
    check_contention(recorded, "POST /hold", "POST /wait", dsn)


# --- SQLite: no server needed ------------------------------------------------------------------


@pytest.fixture
def sqlite_engine(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    yield engine
    engine.dispose()


def test_sqlite_file_engine_records_queries_holds_and_checkouts(recorded, sqlite_engine, tmp_path):
    token = runtime.begin_request("POST /items", runtime.now_ns())
    with sqlite_engine.begin() as conn:
        conn.execute(text("CREATE TABLE items (id INTEGER PRIMARY KEY, secret TEXT)"))
        conn.execute(text("INSERT INTO items (secret) VALUES (:s)"), [{"s": SECRET}, {"s": SECRET + "2"}])
        assert conn.execute(text("SELECT count(*) FROM items WHERE secret = :s"), {"s": SECRET}).scalar() == 1
    runtime.end_request(token)

    root = request_of(recorded, "POST /items")
    mine = segments(recorded, root.request_id)
    queries = [s.name for s in mine if s.layer == DB_QUERY]
    assert queries[:3] == ["CREATE TABLE items", "INSERT items", "SELECT items"]
    assert all(s.attrs[DB_SYSTEM_NAME] == "sqlite" for s in mine if s.layer == DB_QUERY)
    name = f"sqlite:///{tmp_path / 'app.db'}"
    (checkout,) = [s for s in mine if s.layer == DB_POOL]
    assert checkout.attrs[DB_POOL_NAME] == name and checkout.attrs[DB_SYSTEM_NAME] == "sqlite"
    (hold,) = [s for s in mine if s.name == SEGMENT_CONNECTION_HOLD]
    assert hold.start_ns >= checkout.end_ns
    assert all(hold.start_ns <= s.start_ns and s.end_ns <= hold.end_ns for s in mine if s.layer == DB_QUERY)
    assert all(s.parent_id is None for s in mine)
    assert any(isinstance(g, Gauge) and g.name == GAUGE_POOL_IN_USE and g.attrs[DB_POOL_NAME] == name for g in recorded)
    assert_private(recorded)


def test_a_hold_nests_under_the_segment_open_at_checkout(recorded, sqlite_engine):
    token = runtime.begin_request("POST /agent", runtime.now_ns())
    with runtime.segment("agent step", None):
        conn = sqlite_engine.connect()
        conn.execute(text("select 1"))
    conn.close()  # returned outside the step: the hold still belongs to it
    runtime.end_request(token)
    by_name = {s.name: s for s in segments(recorded)}
    assert by_name[SEGMENT_CONNECTION_HOLD].parent_id == by_name["agent step"].segment_id
    assert by_name["SELECT"].parent_id == by_name["agent step"].segment_id


def test_nothing_is_recorded_outside_a_request(recorded, sqlite_engine):
    with sqlite_engine.connect() as conn:
        assert conn.execute(text("select 1")).scalar() == 1
    assert segments(recorded) == []
    assert any(isinstance(g, Gauge) for g in recorded)  # gauges describe the pool, not a request


def test_a_failing_hook_is_counted_and_the_query_still_succeeds(recorded, sqlite_engine, monkeypatch):
    def broken(statement: str):
        raise RuntimeError("summary exploded")

    monkeypatch.setattr(hook, "summarize", broken)
    token = runtime.begin_request("GET /broken", runtime.now_ns())
    with sqlite_engine.connect() as conn:
        assert conn.execute(text("select 41 + 1")).scalar() == 42
    runtime.end_request(token)
    runtime.report_errors(force=True)
    errors = [q for q in recorded if isinstance(q, QualityRecord) and q.kind == "error" and q.attrs.get("collector") == "sqlalchemy"]
    assert sum(q.occurrences for q in errors) >= 1
    assert errors[-1].attrs[LAST_ERROR].startswith("RuntimeError at ") and "exploded" not in errors[-1].attrs[LAST_ERROR]
    root = request_of(recorded, "GET /broken")
    # only the query was lost: the checkout and the hold were still recorded
    assert [s.layer or s.name for s in segments(recorded, root.request_id)] == [DB_POOL, SEGMENT_CONNECTION_HOLD]


def test_a_failing_statement_is_recorded_with_its_error_type(recorded, sqlite_engine):
    token = runtime.begin_request("GET /error", runtime.now_ns())
    with sqlite_engine.connect() as conn, pytest.raises(sqlalchemy.exc.OperationalError):
        conn.execute(text("SELECT * FROM no_such_table"))
    runtime.end_request(token)
    (query,) = [s for s in segments(recorded) if s.layer == DB_QUERY]
    assert query.name == "SELECT no_such_table" and query.attrs[hook.ERROR_TYPE] == "OperationalError"


def test_shared_segment_attributes_are_never_changed_by_a_failure(recorded, sqlite_engine):
    # A checkout's and a statement's attributes are built once per pool and statement text and
    # shared by their segments: an error goes into a copy, never into them.
    token = runtime.begin_request("POST /shared", runtime.now_ns())
    with sqlite_engine.begin() as conn:
        conn.execute(text("CREATE TABLE items (id INTEGER PRIMARY KEY)"))
    insert = text("INSERT INTO items (id) VALUES (:id)")
    for item in (1, 1, 2):
        with sqlite_engine.connect() as conn:
            if item == 2 or conn.execute(text("SELECT count(*) FROM items")).scalar() == 0:
                conn.execute(insert, {"id": item})
                conn.commit()
            else:
                with pytest.raises(sqlalchemy.exc.IntegrityError):
                    conn.execute(insert, {"id": item})
    runtime.end_request(token)
    mine = segments(recorded, request_of(recorded, "POST /shared").request_id)
    inserts = [s for s in mine if s.name == "INSERT items"]
    assert [hook.ERROR_TYPE in s.attrs for s in inserts] == [False, True, False]
    assert inserts[0].attrs == inserts[2].attrs == {DB_SYSTEM_NAME: "sqlite", DB_QUERY_SUMMARY: "INSERT items", DB_OPERATION_NAME: "INSERT"}
    checkouts = [s for s in mine if s.layer == DB_POOL]
    assert len(checkouts) == 4 and all(hook.ERROR_TYPE not in s.attrs for s in checkouts)
    assert len({tuple(s.attrs.items()) for s in checkouts if hook.CONNECT_MS not in s.attrs}) == 1
    assert not [q for q in recorded if isinstance(q, QualityRecord) and q.kind == "error"] and hook.HOOK not in runtime.errors()


def test_a_new_engines_first_connect_statements_belong_to_its_checkout(recorded, pg_dsn):
    # The dialect initialises itself on the first connection, inside the checkout: its own
    # statements (server version, settings) are not the service's.
    engine = create_engine(pg_dsn, pool_size=1, max_overflow=0)
    try:
        token = runtime.begin_request("GET /first", runtime.now_ns())
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
        runtime.end_request(token)
    finally:
        engine.dispose()
    mine = segments(recorded, request_of(recorded, "GET /first").request_id)
    assert [s.layer or s.name for s in mine] == [DB_POOL, DB_QUERY, SEGMENT_CONNECTION_HOLD]
    assert hook.CONNECT_MS in mine[0].attrs and mine[1].name == "SELECT"


def test_a_dialect_class_loaded_after_install_is_timed_once_even_calling_its_base(recorded, tmp_path):
    from sqlalchemy.dialects import registry
    from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

    executed = []

    class OverridingDialect(SQLiteDialect_pysqlite):
        supports_statement_cache = True

        def do_execute(self, cursor, statement, parameters, context=None):
            executed.append(statement)
            super().do_execute(cursor, statement, parameters, context)

    registry.impls["sqlite.latproftest"] = lambda: OverridingDialect
    try:
        engine = create_engine(f"sqlite+latproftest:///{tmp_path / 'o.db'}")
        assert hasattr(OverridingDialect.__dict__["do_execute"], "__latprof_original__")
        token = runtime.begin_request("GET /override", runtime.now_ns())
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM sqlite_master WHERE name = :n"), {"n": SECRET}).scalar() == 0
        runtime.end_request(token)
        engine.dispose()
        hook.uninstall()
        assert not hasattr(OverridingDialect.__dict__["do_execute"], "__latprof_original__")
    finally:
        registry.impls.pop("sqlite.latproftest", None)
    assert executed == ["SELECT count(*) FROM sqlite_master WHERE name = ?"]
    assert [s.name for s in segments(recorded) if s.layer == DB_QUERY] == ["SELECT sqlite_master"]
    assert_private(recorded)


def test_a_checkout_timeout_is_a_pool_segment_with_its_error(recorded, tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 't.db'}", pool_size=1, max_overflow=0, pool_timeout=0.2)
    token = runtime.begin_request("GET /timeout", runtime.now_ns())
    with engine.connect(), pytest.raises(sqlalchemy.exc.TimeoutError):
        engine.connect()
    runtime.end_request(token)
    engine.dispose()
    failed = [s for s in segments(recorded) if s.layer == DB_POOL and hook.ERROR_TYPE in s.attrs]
    assert len(failed) == 1 and failed[0].attrs[hook.ERROR_TYPE] == "TimeoutError" and ms(failed[0]) >= 150


# --- installing -------------------------------------------------------------------------------


def test_install_twice_patches_once(recorded, sqlite_engine):
    from sqlalchemy.pool import QueuePool

    assert hook.install() is True
    patched = QueuePool.__dict__["_do_get"]
    assert not hasattr(patched.__latprof_original__, "__latprof_original__")
    token = runtime.begin_request("GET /once", runtime.now_ns())
    with sqlite_engine.connect() as conn:
        conn.execute(text("select 1"))
    runtime.end_request(token)
    assert sorted(s.layer or s.name for s in segments(recorded)) == sorted([DB_POOL, DB_QUERY, SEGMENT_CONNECTION_HOLD])


def test_a_do_get_that_calls_itself_is_one_checkout(recorded, tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'r.db'}", pool_size=1, max_overflow=1)
    pool = engine.pool
    lost_races = iter([True])

    def inc_overflow_losing_a_race_once() -> bool:
        # as if another thread took the last overflow slot: QueuePool._do_get calls itself
        if next(lost_races, False):
            return False
        return type(pool)._inc_overflow(pool)

    pool._inc_overflow = inc_overflow_losing_a_race_once
    token = runtime.begin_request("GET /race", runtime.now_ns())
    with engine.connect() as conn:
        conn.execute(text("select 1"))
    runtime.end_request(token)
    engine.dispose()
    assert next(lost_races, None) is None  # the race was taken
    assert len([s for s in segments(recorded) if s.layer == DB_POOL]) == 1
    assert pool.__dict__[hook._STATE_ATTR].waiters == 0


def test_uninstall_restores_sqlalchemy(recorded):
    from sqlalchemy.engine import Engine
    from sqlalchemy.pool import QueuePool

    hook.uninstall()
    assert not hasattr(QueuePool.__dict__["_do_get"], "__latprof_original__")
    assert not hasattr(Engine.__dict__["__init__"], "__latprof_original__")
    assert hook.install() is True
    assert hasattr(QueuePool.__dict__["_do_get"], "__latprof_original__")


def test_a_service_that_never_imports_sqlalchemy_does_not_load_it():
    code = (
        "import sys; from latprof.collectors.hooks import sqlalchemy as hook; assert hook.install();"
        " assert 'sqlalchemy' not in sys.modules, 'imported'; import json; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


ENGINE_EVENTS_SERVICE = textwrap.dedent(
    """
    import sys
    from latprof.collectors.hooks import runtime
    from latprof.collectors.hooks import sqlalchemy as hook

    class Writer:
        events = []
        def emit(self, event):
            self.events.append(event)

    runtime.start(Writer())
    hook.install()  # before the service imports SQLAlchemy, as under `latprof run`
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import Engine
    engine = create_engine("sqlite:///" + sys.argv[1])
    token = runtime.begin_request("GET /x", runtime.now_ns())
    with engine.connect() as conn:
        conn.execute(text("select 1"))
    runtime.end_request(token)
    engine.dispose()
    names = sorted(e.name for e in Writer.events if type(e).__name__ == "Segment")
    print(Engine._has_events, engine._has_events, names)
    """
)


def test_engines_pay_no_connection_event_dispatch_for_the_hook(tmp_path):
    # A listener on Engine (before_cursor_execute, engine_disposed, ...) makes SQLAlchemy build
    # and consult an event dispatcher for every connection and execution, hook or not: the
    # statements are timed around the dialect's execution methods instead.
    result = subprocess.run(
        [sys.executable, "-c", ENGINE_EVENTS_SERVICE, str(tmp_path / "e.db")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"False False {sorted(['SELECT', 'db.connection.hold', hook.SEGMENT_CHECKOUT])}"


OTEL_SERVICE = textwrap.dedent(
    """
    import json, sys
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from latprof.collectors.hooks import sqlalchemy as hook

    reader = InMemoryMetricReader()
    hook.install()  # before the service configures its SDK, as under `latprof run`
    from sqlalchemy import create_engine, text
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    engine = create_engine("sqlite:///" + sys.argv[1])
    for _ in range(3):
        with engine.connect() as conn:
            conn.execute(text("select 1"))
    found = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    found[metric.name] = {"unit": metric.unit, "count": point.count, "attrs": dict(point.attributes)}
    print(json.dumps(found))
    """
)


def test_the_checkout_wait_is_an_opentelemetry_histogram_when_the_service_has_an_sdk(tmp_path):
    pytest.importorskip("opentelemetry.sdk.metrics")  # the service's SDK, not a latprof dependency
    result = subprocess.run(
        [sys.executable, "-c", OTEL_SERVICE, str(tmp_path / "otel.db")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found[hook.OTEL_WAIT_TIME] == {
        "unit": "s",
        "count": 3,
        "attrs": {DB_POOL_NAME: f"sqlite:///{tmp_path / 'otel.db'}"},
    }


# --- under `latprof run` ----------------------------------------------------------------------

SERVICE = textwrap.dedent(
    """
    import sys, threading
    from sqlalchemy import create_engine, text
    from latprof.collectors.hooks import runtime

    assert runtime.active(), "hooks were not loaded"
    engine = create_engine(sys.argv[1], pool_size=1, max_overflow=0)

    start = threading.Barrier(3)

    def handle(route, seconds):
        start.wait(10)
        token = runtime.begin_request(route, runtime.now_ns())
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_sleep(:s)"), {"s": seconds})
        runtime.end_request(token)

    threads = [threading.Thread(target=handle, args=(f"POST /chat{i}", 0.2)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    """
)


@pytest.mark.slow
def test_latprof_run_captures_pool_waits_queries_and_holds(tmp_path: Path, pg_dsn):
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    capture = tmp_path / "capture.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "latprof", "run", "--out", str(capture), "--no-report", "--",
         sys.executable, str(script), pg_dsn],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    data = read_captures([capture])
    assert "sqlalchemy" in data.quality[0].attrs["collectors"]
    assert len(data.requests) == 3
    all_segments = [s for group in data.segments_by_request.values() for s in group]
    names = {(s.layer, s.name) for s in all_segments}
    assert {(DB_POOL, hook.SEGMENT_CHECKOUT), (DB_QUERY, "SELECT"), (None, SEGMENT_CONNECTION_HOLD)} <= names
    waits = sorted(ms(s) for s in all_segments if s.layer == DB_POOL)
    assert waits[-1] >= 200  # the last of three requests on one connection waited for the other two
    assert max(g.value for g in data.gauges if g.name == GAUGE_POOL_WAITERS) >= 1
    assert not [q for q in data.quality if q.kind == "error" and q.attrs.get("collector") == "sqlalchemy"], data.quality
