"""The asyncpg hook on a real PostgreSQL: pool waits, holds, statements, gauges, SQLAlchemy on asyncpg, its own faults.

PostgreSQL comes from `$LATPROF_TEST_PG` (default the local trust-auth server; a
`postgresql+driver://` URL is used without its driver). Without a server or asyncpg the
tests skip on a developer box and fail in CI.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from recording import recording

import services

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

PG_DSN = os.environ.get("LATPROF_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
if PG_DSN.split("://", 1)[0].startswith("postgresql+"):  # a SQLAlchemy URL: asyncpg wants it plain
    PG_DSN = "postgresql://" + PG_DSN.split("://", 1)[1]
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
    import asyncpg
except ImportError:
    if IN_CI:
        raise
    pytest.skip("asyncpg is not installed", allow_module_level=True)

from latprof.collectors.hooks import asyncpg as hook  # noqa: E402


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
    async def probe() -> None:
        conn = await asyncpg.connect(PG_DSN, timeout=3)
        try:
            await conn.fetchval("select 1")
        finally:
            await conn.close()

    try:
        asyncio.run(probe())
    except Exception as exc:
        missing(f"PostgreSQL is not reachable at {hook.pool_name(PG_DSN)}: {type(exc).__name__}: {exc}")
    return PG_DSN


def run(coro, timeout: float = 30):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def segments(events, request_id: str | None = None) -> list[Segment]:
    return [e for e in events if isinstance(e, Segment) and (request_id is None or e.request_id == request_id)]


def request_of(events, route: str) -> Request:
    (found,) = [e for e in events if isinstance(e, Request) and e.route == route]
    return found


def ms(segment: Segment) -> float:
    return (segment.end_ns - segment.start_ns) / 1e6


def query_names(events, request_id: str) -> list[str]:
    return [s.name for s in sorted(segments(events, request_id), key=lambda s: s.start_ns) if s.layer == DB_QUERY]


def assert_private(events) -> None:
    """No parameter value, statement text or credential anywhere in what was recorded."""
    text_of_events = repr(events)
    assert SECRET not in text_of_events
    assert "relname =" not in text_of_events and "pg_sleep(" not in text_of_events
    assert "postgres@" not in text_of_events


def assert_sequential(queries: list[Segment]) -> None:
    """One task's statements: each round trip recorded once, so no two of them overlap."""
    ordered = sorted(queries, key=lambda s: s.start_ns)
    for before, after in zip(ordered, ordered[1:]):
        assert before.end_ns <= after.start_ns, (before, after)


# --- names and summaries ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dsn", "kwargs", "name"),
    [
        ("postgresql://postgres@127.0.0.1:5432/test", {}, "127.0.0.1:5432/test"),
        ("postgres://app:hunter2@db.internal:6432/chat?sslmode=require&password=x", {}, "db.internal:6432/chat"),
        ("postgresql://app@db.internal/chat", {}, "db.internal:5432/chat"),
        (None, {"host": "db", "port": 6543, "user": "app", "password": "hunter2", "database": "chat"}, "db:6543/chat"),
        ("postgresql://app:pw@a:5432,b:5433/chat", {}, "a:5432,b:5433/chat"),
        ("postgresql:///chat?host=/var/run/postgresql", {}, "/var/run/postgresql:5432/chat"),
        ("postgresql://app:pw@[::1]:5433/chat", {}, "[::1]:5433/chat"),
        ("postgresql://ignored:1/ignored", {"host": "db", "port": 7, "database": "chat"}, "db:7/chat"),
        (None, {}, "localhost:5432"),
    ],
)
def test_a_pool_is_named_by_host_port_and_database_never_by_credentials(dsn, kwargs, name):
    assert hook.pool_name(dsn, kwargs, environ={}) == name


def test_a_pool_name_falls_back_on_the_libpq_environment():
    assert hook.pool_name(None, {}, environ={"PGHOST": "pg", "PGPORT": "6000", "PGDATABASE": "app"}) == "pg:6000/app"


def test_statements_are_summarised_by_the_sqlalchemy_hooks_function_which_needs_no_sqlalchemy():
    # SQLAlchemy cannot be imported at all in this process, and the hook works all the same.
    code = textwrap.dedent(
        """
        import sys

        class NoSqlalchemy:
            def find_spec(self, name, path=None, target=None):
                if name == "sqlalchemy" or name.startswith("sqlalchemy."):
                    raise ImportError("no sqlalchemy here")

        sys.meta_path.insert(0, NoSqlalchemy())
        from latprof.collectors.hooks import asyncpg as hook
        assert hook.install()
        print(hook.summarize("SELECT m.id FROM messages m WHERE m.body = $1")[0])
        print(hook.summarize("COPY \\"public\\".\\"notes\\"")[0])
        assert "sqlalchemy" not in sys.modules
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["SELECT", "messages", "COPY", "public.notes"]


# --- contention: the second request waits for the first one's connection ------------------------


def test_a_request_waiting_for_the_held_connection_gets_a_pool_segment(recorded, pg_dsn):
    pool_statements: list[str] = []

    async def init(conn) -> None:  # the pool's own statements are not the request's
        pool_statements.append("init")
        await conn.execute("SET application_name = 'latprof-test'")

    async def setup(conn) -> None:
        pool_statements.append("setup")
        await conn.fetchval("SELECT 1")

    async def main() -> None:
        pool = await asyncpg.create_pool(pg_dsn, min_size=0, max_size=1, init=init, setup=setup)
        held, waiting = asyncio.Event(), asyncio.Event()

        async def holder() -> None:
            token = runtime.begin_request("POST /hold", runtime.now_ns())
            try:
                async with pool.acquire() as conn:
                    held.set()
                    await waiting.wait()  # the waiter runs on until it blocks in the pool
                    await conn.execute("SELECT pg_sleep($1)", HOLD_S)
            finally:
                held.set()
                runtime.end_request(token)

        async def waiter() -> None:
            await held.wait()
            token = runtime.begin_request("POST /wait", runtime.now_ns())
            try:
                waiting.set()
                conn = await pool.acquire(timeout=10)  # through asyncio.wait_for: another task
                try:
                    assert await conn.fetchval("SELECT count(*) FROM pg_class WHERE relname = $1", SECRET) == 0
                finally:
                    await pool.release(conn)
            finally:
                runtime.end_request(token)

        try:
            await asyncio.gather(holder(), waiter())
        finally:
            await pool.close()

    run(main())
    assert pool_statements[:2] == ["init", "setup"] and pool_statements.count("setup") == 2
    events = recorded
    holder, waiter = request_of(events, "POST /hold"), request_of(events, "POST /wait")
    name = hook.pool_name(pg_dsn)
    assert "@" not in name

    (wait,) = [s for s in segments(events, waiter.request_id) if s.layer == DB_POOL]
    assert wait.name == hook.SEGMENT_ACQUIRE
    assert ms(wait) >= HOLD_S * 1000 * 0.75, f"waited only {ms(wait):.1f} ms for the held connection"
    assert wait.attrs == {DB_POOL_NAME: name, DB_SYSTEM_NAME: "postgresql"}  # no connect: the holder's came back

    (opened,) = [s for s in segments(events, holder.request_id) if s.layer == DB_POOL]
    assert ms(opened) < ms(wait)
    assert 0 < opened.attrs[hook.CONNECT_MS] <= ms(opened) + 0.001  # the first acquire opened the connection

    (hold,) = [s for s in segments(events, holder.request_id) if s.name == SEGMENT_CONNECTION_HOLD]
    assert hold.layer is None and hold.attrs == {DB_POOL_NAME: name} and hold.parent_id is None
    assert ms(hold) >= HOLD_S * 1000 * 0.9
    assert hold.start_ns >= opened.end_ns and hold.end_ns <= wait.end_ns + 5_000_000
    (waiter_hold,) = [s for s in segments(events, waiter.request_id) if s.name == SEGMENT_CONNECTION_HOLD]
    assert waiter_hold.start_ns >= wait.end_ns

    # Exactly the requests' statements: not init's, setup's or the release's reset query.
    assert query_names(events, holder.request_id) == ["SELECT"]
    assert query_names(events, waiter.request_id) == ["SELECT pg_class"]
    for query in [s for s in segments(events) if s.layer == DB_QUERY]:
        assert query.attrs[DB_SYSTEM_NAME] == "postgresql"
        assert query.name == query.attrs[DB_QUERY_SUMMARY]
        assert query.attrs[DB_OPERATION_NAME] == "SELECT"
    (sleep,) = [s for s in segments(events, holder.request_id) if s.layer == DB_QUERY]
    assert ms(sleep) >= HOLD_S * 1000 * 0.95
    assert hold.start_ns <= sleep.start_ns and sleep.end_ns <= hold.end_ns

    pool_gauges = [g for g in events if isinstance(g, Gauge) and g.attrs == {DB_POOL_NAME: name}]
    assert {g.value for g in pool_gauges if g.name == GAUGE_POOL_MAX} == {1.0}
    assert any(g.name == GAUGE_POOL_WAITERS and g.value == 1 for g in pool_gauges)
    assert any(g.name == GAUGE_POOL_IN_USE and g.value == 1 for g in pool_gauges)
    assert max(g.value for g in pool_gauges if g.name == GAUGE_POOL_SIZE) == 1
    assert_private(events)


def test_the_pools_shortcuts_acquire_and_a_hold_nests_under_the_segment_open_at_acquire(recorded, pg_dsn):
    async def main() -> None:
        async with asyncpg.create_pool(pg_dsn, min_size=1, max_size=2) as pool:
            token = runtime.begin_request("GET /shortcut", runtime.now_ns())
            assert await pool.fetchval("SELECT count(*) FROM pg_class WHERE relname = $1", SECRET) == 0
            runtime.end_request(token)

            token = runtime.begin_request("POST /agent", runtime.now_ns())
            with runtime.segment("agent step", None):
                conn = await pool.acquire()
                assert await conn.fetchval("SELECT 1") == 1
            await pool.release(conn)  # returned outside the step: the hold still belongs to it
            runtime.end_request(token)

    run(main())
    shortcut = request_of(recorded, "GET /shortcut")
    mine = sorted(segments(recorded, shortcut.request_id), key=lambda s: s.start_ns)
    assert [s.layer or s.name for s in mine] == [DB_POOL, SEGMENT_CONNECTION_HOLD, DB_QUERY]
    pool_segment, hold, query = mine
    assert hook.CONNECT_MS not in pool_segment.attrs  # min_size=1: opened when the pool was made
    assert hold.start_ns <= query.start_ns and query.end_ns <= hold.end_ns

    agent = request_of(recorded, "POST /agent")
    by_name = {s.name: s for s in segments(recorded, agent.request_id)}
    step = by_name["agent step"].segment_id
    assert by_name[SEGMENT_CONNECTION_HOLD].parent_id == step
    assert by_name[hook.SEGMENT_ACQUIRE].parent_id == step and by_name["SELECT"].parent_id == step
    assert by_name[SEGMENT_CONNECTION_HOLD].end_ns > by_name["agent step"].end_ns
    assert_private(recorded)


def test_an_acquire_timeout_is_a_pool_segment_with_its_error(recorded, pg_dsn):
    async def main() -> None:
        async with asyncpg.create_pool(pg_dsn, min_size=1, max_size=1) as pool:
            token = runtime.begin_request("GET /timeout", runtime.now_ns())
            async with pool.acquire():
                with pytest.raises(asyncio.TimeoutError):
                    await pool.acquire(timeout=0.2)
            runtime.end_request(token)

    run(main())
    waits = [s for s in segments(recorded) if s.layer == DB_POOL]
    assert len(waits) == 2
    (failed,) = [s for s in waits if hook.ERROR_TYPE in s.attrs]
    assert failed.attrs[hook.ERROR_TYPE] == "TimeoutError" and ms(failed) >= 150
    assert len([s for s in segments(recorded) if s.name == SEGMENT_CONNECTION_HOLD]) == 1  # the failed one held nothing
    assert any(isinstance(g, Gauge) and g.name == GAUGE_POOL_WAITERS and g.value == 1 for g in recorded)


# --- statements ---------------------------------------------------------------------------------


def test_every_statement_api_of_a_plain_connection_is_a_query_segment(recorded, pg_dsn):
    async def main() -> list[str]:
        conn = await asyncpg.connect(pg_dsn)
        expected: list[str] = []
        token = runtime.begin_request("POST /notes", runtime.now_ns())
        try:
            await conn.execute("CREATE TEMP TABLE notes (id int, body text)")
            expected += ["CREATE TABLE notes"]
            async with conn.transaction():
                await conn.execute("INSERT INTO notes VALUES ($1, $2)", 1, SECRET)
                await conn.executemany("INSERT INTO notes VALUES ($1, $2)", [(2, SECRET), (3, "b")])
                assert await conn.fetchval("SELECT count(*) FROM notes WHERE body = $1", SECRET) == 2
                assert (await conn.fetchrow("SELECT id FROM notes WHERE id = $1", 3))["id"] == 3
                assert len(await conn.fetch("SELECT * FROM notes")) == 3
                expected += ["BEGIN", "INSERT notes", "INSERT notes", "SELECT notes", "SELECT notes", "SELECT notes"]
                if hasattr(conn, "fetchmany"):  # asyncpg >= 0.30
                    rows = await conn.fetchmany("UPDATE notes SET id = id WHERE body = $1 RETURNING id", [(SECRET,)])
                    assert sorted(r["id"] for r in rows) == [1, 2]
                    expected += ["UPDATE notes"]
                update = await conn.prepare("UPDATE notes SET body = $2 WHERE id = $1")
                await update.executemany([(1, "x"), (2, "y")])
                select = await conn.prepare("SELECT body FROM notes WHERE id = $1")
                assert await select.fetchval(3) == "b"
                assert (await select.fetchrow(1))["body"] == "x" and len(await select.fetch(2)) == 1
                expected += ["PREPARE UPDATE notes", "UPDATE notes", "PREPARE SELECT notes"] + ["SELECT notes"] * 3
                assert [r["id"] async for r in conn.cursor("SELECT id FROM notes ORDER BY id")] == [1, 2, 3]
                cursor = await conn.cursor("SELECT id FROM notes ORDER BY id")
                assert await cursor.forward(1) == 1 and (await cursor.fetchrow())["id"] == 2
                assert len(await cursor.fetch(5)) == 1
                expected += ["SELECT notes"] * 5  # iteration's bind, cursor open, forward, fetchrow, fetch
                await conn.copy_records_to_table("notes", records=[(4, SECRET)])
                await conn.copy_to_table("notes", source=io.BytesIO(b"5\tz\n"))
                await conn.copy_from_table("notes", output=io.BytesIO(), schema_name="pg_temp")
                await conn.copy_from_query("SELECT * FROM notes WHERE body = $1", SECRET, output=io.BytesIO())
                expected += ["COPY notes", "COPY notes", "COPY pg_temp.notes", "COPY"]
            expected += ["COMMIT"]
            with pytest.raises(asyncpg.UndefinedTableError):
                await conn.fetch("SELECT * FROM no_such_table WHERE id = $1", 7)
            expected += ["SELECT no_such_table"]
        finally:
            runtime.end_request(token)
            await conn.close()
        return expected

    expected = run(main())
    root = request_of(recorded, "POST /notes")
    mine = segments(recorded, root.request_id)
    assert query_names(recorded, root.request_id) == expected
    assert all(s.layer == DB_QUERY and s.parent_id is None for s in mine)  # a plain connection: no pool, no hold
    assert_sequential(mine)
    for query in mine:
        assert query.attrs[DB_SYSTEM_NAME] == "postgresql" and query.attrs[DB_QUERY_SUMMARY] == query.name
        assert query.attrs[DB_OPERATION_NAME] == query.name.split()[0]
    (failed,) = [s for s in mine if hook.ERROR_TYPE in s.attrs]
    assert failed.name == "SELECT no_such_table" and failed.attrs[hook.ERROR_TYPE] == "UndefinedTableError"
    assert_private(recorded)


def test_nothing_but_gauges_is_recorded_outside_a_request(recorded, pg_dsn):
    async def main() -> None:
        async with asyncpg.create_pool(pg_dsn, min_size=1, max_size=1) as pool:
            async with pool.acquire() as conn:
                assert await conn.fetchval("SELECT 1") == 1
            assert await pool.fetchval("SELECT 2") == 2
        conn = await asyncpg.connect(pg_dsn)
        try:
            assert await conn.fetchval("SELECT 3") == 3
        finally:
            await conn.close()

    run(main())
    assert segments(recorded) == []
    assert {e.name for e in recorded if isinstance(e, Gauge)} == {
        GAUGE_POOL_SIZE,
        GAUGE_POOL_MAX,
        GAUGE_POOL_IN_USE,
        GAUGE_POOL_WAITERS,
    }
    assert all(isinstance(e, Gauge) for e in recorded)


def test_a_failing_hook_is_counted_and_the_query_still_succeeds(recorded, pg_dsn, monkeypatch):
    def broken(statement: str):
        raise RuntimeError("summary exploded")

    monkeypatch.setattr(hook, "summarize", broken)

    async def main() -> None:
        async with asyncpg.create_pool(pg_dsn, min_size=1, max_size=1) as pool:
            token = runtime.begin_request("GET /broken", runtime.now_ns())
            async with pool.acquire() as conn:
                assert await conn.fetchval("SELECT 41 + 1") == 42
            runtime.end_request(token)

    run(main())
    runtime.report_errors(force=True)
    errors = [q for q in recorded if isinstance(q, QualityRecord) and q.kind == "error" and q.attrs.get("collector") == "asyncpg"]
    assert sum(q.occurrences for q in errors) >= 1
    assert errors[-1].attrs[LAST_ERROR].startswith("RuntimeError at ") and "exploded" not in errors[-1].attrs[LAST_ERROR]
    root = request_of(recorded, "GET /broken")
    # only the query was lost: the acquire and the hold were still recorded
    assert [s.layer or s.name for s in segments(recorded, root.request_id)] == [DB_POOL, SEGMENT_CONNECTION_HOLD]


# --- SQLAlchemy's asyncio engine on asyncpg ---------------------------------------------------------


@pytest.fixture
def sqlalchemy_hook():
    try:
        import sqlalchemy  # noqa: F401
    except ImportError as exc:
        missing(f"sqlalchemy is not installed: {exc}")
    import_or_missing("greenlet")
    from latprof.collectors.hooks import sqlalchemy as sqlalchemy_hook

    return sqlalchemy_hook


def sqlalchemy_session(dsn: str, warm: bool = True) -> None:
    """An async engine (`warm`: its first connect made outside any request), then a request's work."""
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    url = "postgresql+asyncpg://" + dsn.split("://", 1)[1]

    async def main() -> None:
        engine = create_async_engine(url, pool_size=1, max_overflow=0)
        try:
            if warm:
                async with engine.connect() as conn:  # the dialect's first-connect queries, outside any request
                    await conn.execute(text("SELECT 1"))
            token = runtime.begin_request("POST /chat", runtime.now_ns())
            try:
                async with engine.connect() as conn:  # rolled back when returned
                    statement = text("SELECT count(*) FROM pg_class WHERE relname = :name")
                    assert (await conn.execute(statement, {"name": SECRET})).scalar() == 0
                    await conn.execute(text("SELECT pg_sleep(:seconds)"), {"seconds": 0.05})
                async with engine.begin() as conn:  # committed
                    await conn.execute(text("SELECT 1"))
            finally:
                runtime.end_request(token)
        finally:
            await engine.dispose()

    run(main())


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "connects-in-the-request"])
def test_sqlalchemy_on_asyncpg_under_both_hooks_counts_each_statement_and_checkout_once(
    recorded, pg_dsn, sqlalchemy_hook, warm
):
    assert sqlalchemy_hook.install() is True
    try:
        sqlalchemy_session(pg_dsn, warm)
    finally:
        sqlalchemy_hook.uninstall()
    root = request_of(recorded, "POST /chat")
    mine = segments(recorded, root.request_id)
    queries = [s for s in mine if s.layer == DB_QUERY]
    # SQLAlchemy's statements once each (its hook's: their BEGIN, prepare and fetch are inside
    # them); the COMMIT and the ROLLBACK on return once, from the asyncpg hook: no other sees them.
    assert query_names(recorded, root.request_id) == ["SELECT pg_class", "SELECT", "ROLLBACK", "SELECT", "COMMIT"]
    assert_sequential(queries)
    assert ms(queries[1]) >= 50
    # Two checkouts of SQLAlchemy's pool, each one `db.pool`; asyncpg's own pool is not involved.
    # (Opening the connection, with the dialect's first-connect queries and asyncpg's type
    # introspection, is inside SQLAlchemy's checkout: no `db.query` of its own.)
    pool_segments = [s for s in mine if s.layer == DB_POOL]
    assert [s.name for s in pool_segments] == [sqlalchemy_hook.SEGMENT_CHECKOUT] * 2
    assert (sqlalchemy_hook.CONNECT_MS in pool_segments[0].attrs) is not warm
    assert len([s for s in mine if s.name == SEGMENT_CONNECTION_HOLD]) == 2
    assert_private(recorded)


def test_sqlalchemy_on_asyncpg_without_the_sqlalchemy_hook_is_recorded_by_the_asyncpg_hook(recorded, pg_dsn, sqlalchemy_hook):
    sqlalchemy_hook.uninstall()
    sqlalchemy_session(pg_dsn)
    root = request_of(recorded, "POST /chat")
    names = query_names(recorded, root.request_id)
    assert names == [
        "BEGIN",
        "PREPARE SELECT pg_class",
        "SELECT pg_class",
        "PREPARE SELECT",
        "SELECT",
        "ROLLBACK",
        "BEGIN",
        "SELECT",  # prepared by the warm-up: SQLAlchemy's statement cache
        "COMMIT",
    ], names
    assert_sequential([s for s in segments(recorded, root.request_id) if s.layer == DB_QUERY])
    assert not [s for s in segments(recorded) if s.layer == DB_POOL]  # SQLAlchemy's pool is not asyncpg's
    assert_private(recorded)


# --- installing -----------------------------------------------------------------------------------


def test_install_twice_patches_once(recorded, pg_dsn):
    from asyncpg.connection import Connection
    from asyncpg.pool import Pool

    assert hook.install() is True
    for patched in (Pool.__dict__["_acquire"], Connection.__dict__["execute"]):
        assert not hasattr(patched.__latprof_original__, "__latprof_original__")

    async def main() -> None:
        async with asyncpg.create_pool(pg_dsn, min_size=1, max_size=1) as pool:
            token = runtime.begin_request("GET /once", runtime.now_ns())
            async with pool.acquire() as conn:
                await conn.execute("SELECT 1")
            runtime.end_request(token)

    run(main())
    assert sorted(s.layer or s.name for s in segments(recorded)) == sorted([DB_POOL, DB_QUERY, SEGMENT_CONNECTION_HOLD])


def test_uninstall_restores_asyncpg(recorded, pg_dsn):
    from asyncpg.connection import Connection
    from asyncpg.pool import Pool, PoolConnectionHolder
    from asyncpg.prepared_stmt import PreparedStatement

    patched = [(Pool, "_acquire"), (PoolConnectionHolder, "_release"), (Connection, "_execute"), (PreparedStatement, "fetch")]
    hook.uninstall()
    for cls, name in patched:
        assert not hasattr(cls.__dict__[name], "__latprof_original__"), (cls, name)

    async def main() -> None:
        async with asyncpg.create_pool(pg_dsn, min_size=1, max_size=1) as pool:
            token = runtime.begin_request("GET /off", runtime.now_ns())
            assert await pool.fetchval("SELECT 1") == 1
            runtime.end_request(token)

    run(main())
    assert segments(recorded) == []
    assert hook.install() is True
    for cls, name in patched:
        assert hasattr(cls.__dict__[name], "__latprof_original__"), (cls, name)


def test_a_service_that_never_imports_asyncpg_does_not_load_it():
    code = (
        "import sys; from latprof.collectors.hooks import asyncpg as hook; assert hook.install();"
        " assert 'asyncpg' not in sys.modules, 'imported'; import json; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


OTEL_SERVICE = textwrap.dedent(
    """
    import asyncio, json, sys
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from latprof.collectors.hooks import asyncpg as hook

    reader = InMemoryMetricReader()
    hook.install()  # before the service configures its SDK, as under `latprof run`
    import asyncpg
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

    async def main():
        async with asyncpg.create_pool(sys.argv[1], min_size=1, max_size=1) as pool:
            for _ in range(3):
                async with pool.acquire() as conn:
                    await conn.fetchval("select 1")

    asyncio.run(main())
    found = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    found[metric.name] = {"unit": metric.unit, "count": point.count, "attrs": dict(point.attributes)}
    print(json.dumps(found))
    """
)


def test_the_acquire_wait_is_an_opentelemetry_histogram_when_the_service_has_an_sdk(pg_dsn):
    pytest.importorskip("opentelemetry.sdk.metrics")  # the service's SDK, not a latprof dependency
    result = subprocess.run([sys.executable, "-c", OTEL_SERVICE, pg_dsn], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found[hook.OTEL_WAIT_TIME] == {"unit": "s", "count": 3, "attrs": {DB_POOL_NAME: hook.pool_name(pg_dsn)}}


# --- end to end: uvicorn (uvloop + httptools) under `latprof run`, then `latprof analyze` ---------------

E2E_APP = "tests.collectors.hooks.apps.asyncpg_app:app"
E2E_HOLD_MS = 150  # each request keeps its connection this long (a pg_sleep), on a pool of 2
E2E_PAIRS = 24  # two requests at a time: both get a connection at once (latency ~ one hold)
E2E_BURSTS = 4  # six at a time: two wait one hold, two wait two holds (latency up to ~3 holds)
E2E_BURST_SIZE = 6


@pytest.mark.slow
def test_latprof_run_on_a_uvicorn_service_with_an_exhausted_asyncpg_pool_is_a_db_pool_verdict(tmp_path: Path, pg_dsn):
    import_or_missing("uvloop")
    import_or_missing("httptools")
    import_or_missing("starlette")
    from apps.harness import Pending, Server

    from latprof.capture.reader import read_captures

    server = Server(E2E_APP, "uvloop", "httptools", tmp_path, env={"APP_PG_DSN": pg_dsn}).start()
    started = time.monotonic()
    try:
        sent = 0
        for i in range(E2E_PAIRS + E2E_BURSTS):
            size = E2E_BURST_SIZE if i % 7 == 3 else 2  # bursts at 3, 10, 17, 24: spread over the run
            pending = [Pending(server.port, f"/db?ms={E2E_HOLD_MS}") for _ in range(size)]
            responses = [p.response() for p in pending]
            assert [r.status for r in responses] == [200] * size, [r.body[:200] for r in responses]
            sent += size
        server.stop()  # SIGTERM: uvicorn finishes, the capture is flushed
    finally:
        server.kill()
    driven_s = time.monotonic() - started

    data = read_captures([server.capture_path])
    assert "asyncpg" in data.quality[0].attrs["collectors"]
    assert not [q for q in data.quality if q.kind == "error" and q.attrs.get("collector") == "asyncpg"], data.quality
    db_requests = [r for r in data.requests if r.route == "GET /db"]
    assert len(db_requests) == sent == E2E_PAIRS * 2 + E2E_BURSTS * E2E_BURST_SIZE
    waited = 0
    for request in db_requests:
        mine = data.segments_by_request.get(request.request_id, [])
        assert [s.name for s in mine if s.layer == DB_QUERY] == ["SELECT pg_class", "SELECT"], mine
        (acquire,) = [s for s in mine if s.layer == DB_POOL]
        assert acquire.attrs[DB_POOL_NAME] == hook.pool_name(pg_dsn)
        assert len([s for s in mine if s.name == SEGMENT_CONNECTION_HOLD]) == 1
        waited += ms(acquire) >= E2E_HOLD_MS * 0.7
    assert waited >= E2E_BURSTS * (E2E_BURST_SIZE - 2) * 0.75, waited  # four of each burst queued
    assert SECRET not in server.capture_path.read_text()

    result = subprocess.run(
        [sys.executable, "-m", "latprof", "analyze", "--format", "json", "--skip-warmup", "0", str(server.capture_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    verdict, latency = report["verdict"], report["latency_ms"]
    print(
        f"asyncpg e2e: driven in {driven_s:.1f} s; verdict {verdict['layer']} rule {verdict['rule']}"
        f" share {verdict['share_of_tail_excess']} confidence {verdict['confidence']};"
        f" p50 {latency['p50']:.0f} ms p99 {latency['p99']:.0f} ms; {report['window']['requests']} requests"
    )
    assert report["window"]["requests"] >= 50
    assert latency["p99"] >= 2.25 * latency["p50"], latency
    assert verdict["layer"] == DB_POOL and verdict["status"] == "layer", verdict
    assert verdict["rule"] == "db-pool-exhaustion", verdict
    assert verdict["share_of_tail_excess"] >= 0.8 and verdict["confidence"] >= 0.8, verdict
    (finding,) = [f for f in report["findings"] if f["rule"] == "db-pool-exhaustion"]
    evidence = finding["evidence"]
    assert evidence["pools"] == [hook.pool_name(pg_dsn)]
    assert evidence["pool_max"] == 2 and evidence["peak_in_use"] == 2 and evidence["peak_waiters"] >= 3, evidence
