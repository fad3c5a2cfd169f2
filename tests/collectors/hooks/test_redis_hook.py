"""The redis-py hook on a real redis server: pool waits, holds, commands, pipelines, gauges, its own faults.

The server comes from `$LATPROF_TEST_REDIS` (default redis://127.0.0.1:6379/0). Without a
server the tests skip on a developer box and fail in CI. Every key starts with this module's
own prefix and is deleted afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from recording import recording

import services

from latprof.capture.reader import read_captures
from latprof.collectors.hooks import runtime
from latprof.events import Gauge, QualityRecord, Request, Segment
from latprof.layers import DB_POOL, DB_QUERY, LOCK
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

REDIS_URL = os.environ.get("LATPROF_TEST_REDIS", "redis://127.0.0.1:6379/0")
IN_CI = os.environ.get("CI", "").lower() == "true"
HOLD_S = 0.4  # how long the first request keeps the only connection (BLPOP's timeout)
PREFIX = f"latprof-test:redis-hook:{uuid.uuid4().hex[:8]}"  # every key of this module
SECRET = "latprof-secret-value-4711"  # a value that must never reach the capture
SECRET_KEY = f"{PREFIX}:latprof-secret-key-0815"  # a key that must never reach the capture


def missing(reason: str) -> None:
    """Skip on a developer box; in CI a missing service or driver is a failure."""
    services.missing(reason, "a redis server and redis-py are")


try:
    import redis
    import redis.asyncio
except ImportError:
    if IN_CI:
        raise
    pytest.skip("redis-py is not installed", allow_module_level=True)

from latprof.collectors.hooks import redis as hook


@pytest.fixture
def recorded():
    with recording() as events:
        assert hook.install() is True
        try:
            yield events
        finally:
            hook.uninstall()


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3, socket_timeout=3)
    try:
        client.ping()
    except Exception as exc:
        missing(f"redis is not reachable at {REDIS_URL}: {type(exc).__name__}: {exc}")
    finally:
        client.close()
    yield REDIS_URL
    cleanup = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3, socket_timeout=3)
    try:
        for key in cleanup.scan_iter(match=f"{PREFIX}*", count=500):
            cleanup.delete(key)
    finally:
        cleanup.close()


def pool_name_of(url: str) -> str:
    name = hook.pool_name(redis.ConnectionPool.from_url(url))
    assert "@" not in name
    return name


def segments(events, request_id: str | None = None) -> list[Segment]:
    return [e for e in events if isinstance(e, Segment) and (request_id is None or e.request_id == request_id)]


def request_of(events, route: str) -> Request:
    (found,) = [e for e in events if isinstance(e, Request) and e.route == route]
    return found


def ms(segment: Segment) -> float:
    return (segment.end_ns - segment.start_ns) / 1e6


def assert_private(text: str) -> None:
    """No value, key or key prefix of this module anywhere in what was recorded."""
    assert SECRET not in text
    assert "latprof-secret-key" not in text and PREFIX not in text


def test_a_pool_is_named_by_host_port_and_db_without_credentials():
    url = "redis://app:hunter2@cache.internal:6380/3"
    assert hook.pool_name(redis.ConnectionPool.from_url(url)) == "cache.internal:6380/3"
    assert hook.pool_name(redis.asyncio.BlockingConnectionPool.from_url(url)) == "cache.internal:6380/3"
    assert hook.pool_name(redis.ConnectionPool.from_url("unix:///run/redis.sock?db=2&password=x")) == "unix:/run/redis.sock?db=2"
    assert hook.pool_name(redis.ConnectionPool(host="::1")) == "[::1]:6379/0"


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (("GET", "user:42"), "GET"),
        ((b"blpop", "queue", 0), "BLPOP"),
        (("CLIENT SETNAME", "worker-1"), "CLIENT SETNAME"),
        (("CONFIG", "GET", "maxmemory"), "CONFIG GET"),
        (("SCRIPT EXISTS", "abc123"), "SCRIPT EXISTS"),
        (("FT.SEARCH", "idx", "hello"), "FT.SEARCH"),
        (("SET secret-key secret-value",), "SET"),  # a whole command line as one string: its word only
        (("CLIENT", "two words"), "CLIENT"),
        (("",), "OTHER"),
        ((42,), "OTHER"),
        (("-ERR not a command",), "OTHER"),
        (("x" * 100,), "OTHER"),
        ((), "OTHER"),
    ],
)
def test_a_command_is_named_by_its_command_word_never_by_its_arguments(args, name):
    assert hook.command_name(args) == name


# --- contention: the second request waits for the first one's connection ----------------------


def check_contention(events, url: str) -> None:
    holder, waiter = request_of(events, "POST /hold"), request_of(events, "POST /wait")
    name = pool_name_of(url)

    waits = [s for s in segments(events, waiter.request_id) if s.layer == DB_POOL]
    wait = waits[0]  # the first command's checkout: the one that waited
    assert wait.name == hook.SEGMENT_CHECKOUT
    assert ms(wait) >= HOLD_S * 1000 * 0.75, f"waited only {ms(wait):.1f} ms for the held connection"
    assert all(ms(s) < 100 for s in waits[1:])
    assert wait.attrs[DB_POOL_NAME] == name and wait.attrs[DB_SYSTEM_NAME] == "redis"
    assert hook.CONNECT_MS not in wait.attrs  # it got the holder's connection back, opened none

    (holder_pool,) = [s for s in segments(events, holder.request_id) if s.layer == DB_POOL]
    assert hook.CONNECT_MS in holder_pool.attrs and ms(holder_pool) < ms(wait)  # the first checkout opened it

    (blpop,) = [s for s in segments(events, holder.request_id) if s.layer == DB_QUERY]
    assert blpop.name == "BLPOP" and ms(blpop) >= HOLD_S * 1000 * 0.95
    assert blpop.start_ns == holder_pool.end_ns  # the command's own time starts when it has its connection
    (hold,) = [s for s in segments(events, holder.request_id) if s.name == SEGMENT_CONNECTION_HOLD]
    assert hold.layer is None and hold.attrs == {DB_POOL_NAME: name}
    assert ms(hold) >= HOLD_S * 1000 * 0.95
    assert hold.start_ns >= holder_pool.end_ns and hold.end_ns <= blpop.end_ns
    assert hold.end_ns <= wait.end_ns + 5_000_000  # released, then handed to the waiter

    queries = [s for s in segments(events, waiter.request_id) if s.layer == DB_QUERY]
    assert [q.name for q in queries] == ["SET", "GET"]
    assert queries[0].start_ns == wait.end_ns
    assert len([s for s in segments(events, waiter.request_id) if s.name == SEGMENT_CONNECTION_HOLD]) == 2
    for query in [blpop, *queries]:
        assert query.attrs == {DB_SYSTEM_NAME: "redis", DB_OPERATION_NAME: query.name, DB_QUERY_SUMMARY: query.name}

    pool_gauges = [g for g in events if isinstance(g, Gauge) and g.attrs.get(DB_POOL_NAME) == name]
    assert any(g.name == GAUGE_POOL_WAITERS and g.value == 1 for g in pool_gauges)
    assert any(g.name == GAUGE_POOL_IN_USE and g.value == 1 for g in pool_gauges)
    assert {g.value for g in pool_gauges if g.name == GAUGE_POOL_MAX} == {1.0}
    assert_private(repr(events))


def test_sync_pool_a_request_waiting_for_the_held_connection_gets_a_pool_segment(recorded, redis_url):
    pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=1, timeout=10)
    client = redis.Redis(connection_pool=pool)
    held = threading.Event()
    failures: list[BaseException] = []

    def holder() -> None:
        token = runtime.begin_request("POST /hold", runtime.now_ns())
        try:
            held.set()
            assert client.blpop([SECRET_KEY + ":empty"], timeout=HOLD_S) is None  # nothing to pop: it holds
        except BaseException as exc:  # reported by the test's thread
            failures.append(exc)
        finally:
            runtime.end_request(token)

    def waiter() -> None:
        held.wait(10)
        deadline = time.monotonic() + 10
        while pool.pool.qsize() and time.monotonic() < deadline:  # until the holder took the only slot
            time.sleep(0.001)
        token = runtime.begin_request("POST /wait", runtime.now_ns())
        try:
            client.set(SECRET_KEY, SECRET, ex=60)
            assert client.get(SECRET_KEY) == SECRET.encode()
        except BaseException as exc:
            failures.append(exc)
        finally:
            runtime.end_request(token)

    threads = [threading.Thread(target=holder), threading.Thread(target=waiter)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    pool.disconnect()
    assert not failures, failures
    check_contention(recorded, redis_url)


def test_asyncio_pool_a_task_waiting_for_the_held_connection_gets_a_pool_segment(recorded, redis_url):
    async def main() -> None:
        pool = redis.asyncio.BlockingConnectionPool.from_url(redis_url, max_connections=1, timeout=10)
        client = redis.asyncio.Redis(connection_pool=pool)
        held = asyncio.Event()

        async def holder() -> None:
            token = runtime.begin_request("POST /hold", runtime.now_ns())
            try:
                held.set()
                assert await client.blpop([SECRET_KEY + ":empty"], timeout=HOLD_S) is None
            finally:
                runtime.end_request(token)

        async def waiter() -> None:
            await held.wait()
            while pool.can_get_connection():  # until the holder took the only connection
                await asyncio.sleep(0.001)
            token = runtime.begin_request("POST /wait", runtime.now_ns())
            try:
                await client.set(SECRET_KEY, SECRET, ex=60)
                assert await client.get(SECRET_KEY) == SECRET.encode()
            finally:
                runtime.end_request(token)

        try:
            await asyncio.wait_for(asyncio.gather(holder(), waiter()), 30)
        finally:
            await client.aclose()
            await pool.disconnect()

    asyncio.run(main())
    check_contention(recorded, redis_url)


# --- pipelines, holds, plain pools ------------------------------------------------------------


def test_a_pipeline_and_a_transaction_are_one_segment_each(recorded, redis_url):
    client = redis.Redis.from_url(redis_url)
    token = runtime.begin_request("POST /batch", runtime.now_ns())
    with client.pipeline(transaction=False) as pipe:
        pipe.set(SECRET_KEY, SECRET).get(SECRET_KEY).expire(SECRET_KEY, 60)
        assert pipe.execute()[1] == SECRET.encode()
    with client.pipeline() as pipe:  # a transaction: MULTI ... EXEC
        pipe.incr(SECRET_KEY + ":n").get(SECRET_KEY + ":n").delete(SECRET_KEY + ":n", SECRET_KEY)
        assert pipe.execute()[1] == b"1"
    runtime.end_request(token)
    client.close()

    mine = segments(recorded, request_of(recorded, "POST /batch").request_id)
    queries = [s for s in mine if s.layer == DB_QUERY]
    assert [(q.name, q.attrs[hook.DB_OPERATION_BATCH_SIZE]) for q in queries] == [("PIPELINE", 3), ("MULTI", 3)]
    assert all(q.attrs[DB_OPERATION_NAME] == q.attrs[DB_QUERY_SUMMARY] == q.name for q in queries)
    assert len([s for s in mine if s.name == SEGMENT_CONNECTION_HOLD]) == 2  # one checkout per pipeline
    assert_private(repr(recorded))


def test_asyncio_pipelines_are_one_segment_each(recorded, redis_url):
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        token = runtime.begin_request("POST /batch", runtime.now_ns())
        try:
            async with client.pipeline(transaction=False) as pipe:
                pipe.set(SECRET_KEY, SECRET).get(SECRET_KEY)
                assert (await pipe.execute())[1] == SECRET.encode()
            async with client.pipeline() as pipe:
                pipe.delete(SECRET_KEY)
                await pipe.execute()
        finally:
            runtime.end_request(token)
            await client.aclose()

    asyncio.run(main())
    queries = [s for s in segments(recorded) if s.layer == DB_QUERY]
    assert [(q.name, q.attrs[hook.DB_OPERATION_BATCH_SIZE]) for q in queries] == [("PIPELINE", 2), ("MULTI", 1)]
    assert_private(repr(recorded))


def test_a_watching_transaction_holds_its_connection_across_the_work_in_between(recorded, redis_url):
    client = redis.Redis.from_url(redis_url)
    token = runtime.begin_request("POST /reserve", runtime.now_ns())
    with client.pipeline() as pipe:
        pipe.watch(SECRET_KEY)
        pipe.get(SECRET_KEY)
        time.sleep(0.15)  # slow work inside the optimistic critical section, connection held
        pipe.multi()
        pipe.set(SECRET_KEY, SECRET, ex=60)
        assert pipe.execute() == [True]
    runtime.end_request(token)
    client.delete(SECRET_KEY)
    client.close()

    mine = segments(recorded, request_of(recorded, "POST /reserve").request_id)
    queries = [s for s in mine if s.layer == DB_QUERY]
    assert [q.name for q in queries] == ["WATCH", "GET", "MULTI"]
    (hold,) = [s for s in mine if s.name == SEGMENT_CONNECTION_HOLD]  # one checkout, from WATCH to EXEC
    assert ms(hold) >= 150 and all(ms(q) < 100 for q in queries)  # the work in between, not the commands
    assert queries[0].start_ns <= hold.start_ns < queries[0].end_ns and hold.end_ns <= queries[-1].end_ns
    assert_private(repr(recorded))


def test_a_hold_nests_under_the_segment_open_at_checkout(recorded, redis_url):
    client = redis.Redis.from_url(redis_url)
    token = runtime.begin_request("POST /agent", runtime.now_ns())
    pipe = client.pipeline()
    with runtime.segment("agent step", None):
        pipe.watch(SECRET_KEY)  # checks the connection out inside the step
    pipe.reset()  # returned outside the step: the hold still belongs to it
    runtime.end_request(token)
    client.close()
    by_name = {s.name: s for s in segments(recorded)}
    assert by_name[SEGMENT_CONNECTION_HOLD].parent_id == by_name["agent step"].segment_id
    assert by_name["WATCH"].parent_id == by_name["agent step"].segment_id


class PoolWithASlowLock(redis.BlockingConnectionPool):
    """A service's own pool subclass whose new connections wait for a lock first (recorded as `lock`)."""

    def make_connection(self):
        with runtime.segment("lock wait", LOCK):
            time.sleep(0.02)
        return super().make_connection()


def test_a_wait_recorded_inside_the_checkout_nests_under_it(recorded, redis_url):
    client = redis.Redis(connection_pool=PoolWithASlowLock.from_url(redis_url, max_connections=1))
    token = runtime.begin_request("GET /nested", runtime.now_ns())
    client.ping()
    runtime.end_request(token)
    client.connection_pool.disconnect()
    by_name = {s.name: s for s in segments(recorded)}
    checkout, lock = by_name[hook.SEGMENT_CHECKOUT], by_name["lock wait"]
    assert lock.parent_id == checkout.segment_id and checkout.parent_id is None  # db.pool absorbs the lock wait
    assert checkout.start_ns <= lock.start_ns and lock.end_ns <= checkout.end_ns
    assert by_name["PING"].parent_id is None and by_name[SEGMENT_CONNECTION_HOLD].parent_id is None


def test_a_plain_pool_records_opening_a_connection_but_not_an_instant_checkout(recorded, redis_url):
    client = redis.Redis.from_url(redis_url)  # a ConnectionPool: it never waits, it opens connections
    token = runtime.begin_request("GET /ping", runtime.now_ns())
    assert client.ping() and client.ping()
    runtime.end_request(token)
    client.close()
    mine = segments(recorded)
    pings = [s for s in mine if s.layer == DB_QUERY]
    assert [p.name for p in pings] == ["PING", "PING"]
    # the first checkout opened the connection; the second took microseconds: no segment (unless
    # a loaded machine stretched it past 100 us), so the second PING starts when the command did
    checkout, *instant = [s for s in mine if s.layer == DB_POOL]
    assert 0 < checkout.attrs[hook.CONNECT_MS] <= ms(checkout) + 0.001
    assert checkout.attrs[DB_POOL_NAME] == pool_name_of(redis_url) and pings[0].start_ns == checkout.end_ns
    assert all(hook.CONNECT_MS not in s.attrs for s in instant)
    holds = [s for s in mine if s.name == SEGMENT_CONNECTION_HOLD]
    assert len(holds) == 2
    if not instant:  # the instant checkout is part of the command's own segment
        assert pings[1].start_ns < holds[1].start_ns


def test_nothing_is_recorded_outside_a_request_but_gauges(recorded, redis_url):
    client = redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(redis_url, max_connections=3))
    assert client.set(SECRET_KEY, SECRET, ex=60) and client.get(SECRET_KEY) == SECRET.encode()
    with client.pipeline() as pipe:
        pipe.delete(SECRET_KEY).execute()
    client.close()
    client.connection_pool.disconnect()
    assert segments(recorded) == []
    name = pool_name_of(redis_url)
    assert {g.name for g in recorded if isinstance(g, Gauge) and g.attrs[DB_POOL_NAME] == name} >= {
        GAUGE_POOL_MAX,
        GAUGE_POOL_IN_USE,
        GAUGE_POOL_WAITERS,
    }
    assert_private(repr(recorded))


def test_a_checkout_timeout_is_a_pool_segment_with_its_error(recorded, redis_url):
    pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=1, timeout=0.2)
    client = redis.Redis(connection_pool=pool)
    taken = pool.get_connection()  # someone else has the only connection
    token = runtime.begin_request("GET /timeout", runtime.now_ns())
    with pytest.raises(redis.ConnectionError):
        client.get(SECRET_KEY)
    runtime.end_request(token)
    pool.release(taken)
    pool.disconnect()
    (failed,) = [s for s in segments(recorded) if s.layer == DB_POOL]
    assert failed.attrs[hook.ERROR_TYPE] == "ConnectionError" and ms(failed) >= 150
    (query,) = [s for s in segments(recorded) if s.layer == DB_QUERY]
    assert query.name == "GET" and query.attrs[hook.ERROR_TYPE] == "ConnectionError"
    assert query.start_ns == failed.end_ns
    assert not [s for s in segments(recorded) if s.name == SEGMENT_CONNECTION_HOLD]  # it never had one


def test_a_failing_command_is_recorded_with_its_error_type(recorded, redis_url):
    client = redis.Redis.from_url(redis_url)
    client.set(SECRET_KEY, SECRET, ex=60)
    token = runtime.begin_request("GET /wrongtype", runtime.now_ns())
    with pytest.raises(redis.ResponseError):
        client.lpush(SECRET_KEY, SECRET)  # WRONGTYPE: the key holds a string
    runtime.end_request(token)
    client.delete(SECRET_KEY)
    client.close()
    (query,) = [s for s in segments(recorded) if s.layer == DB_QUERY]
    assert query.name == "LPUSH" and query.attrs[hook.ERROR_TYPE] == "ResponseError"
    assert_private(repr(recorded))


def test_a_failing_hook_is_counted_and_the_command_still_succeeds(recorded, redis_url, monkeypatch):
    def broken(args):
        raise RuntimeError("naming exploded")

    monkeypatch.setattr(hook, "command_name", broken)
    client = redis.Redis.from_url(redis_url)
    token = runtime.begin_request("GET /broken", runtime.now_ns())
    assert client.set(SECRET_KEY, SECRET, ex=60) is True
    assert client.get(SECRET_KEY) == SECRET.encode()
    runtime.end_request(token)
    client.delete(SECRET_KEY)
    client.close()
    runtime.report_errors(force=True)
    errors = [q for q in recorded if isinstance(q, QualityRecord) and q.kind == "error" and q.attrs.get("collector") == "redis"]
    assert sum(q.occurrences for q in errors) == 2
    assert errors[-1].attrs[LAST_ERROR].startswith("RuntimeError at ") and "exploded" not in errors[-1].attrs[LAST_ERROR]
    root = request_of(recorded, "GET /broken")
    # only the commands were lost: the checkout that opened the connection and the holds were recorded
    kinds = [s.layer or s.name for s in segments(recorded, root.request_id)]
    assert kinds[0] == DB_POOL and kinds.count(SEGMENT_CONNECTION_HOLD) == 2 and DB_QUERY not in kinds


# --- installing -------------------------------------------------------------------------------

PATCHED = [
    (redis.connection.ConnectionPool, "get_connection"),
    (redis.connection.BlockingConnectionPool, "get_connection"),
    (redis.connection.BlockingConnectionPool, "release"),
    (redis.client.Pipeline, "execute"),
    (redis.asyncio.connection.BlockingConnectionPool, "get_connection"),
    (redis.asyncio.client.Redis, "execute_command"),
    (redis.asyncio.client.Pipeline, "execute"),
]


def test_install_twice_patches_once(recorded, redis_url):
    assert hook.install() is True
    for cls, name in PATCHED:
        patched = cls.__dict__[name]
        assert hasattr(patched, "__latprof_original__") and not hasattr(patched.__latprof_original__, "__latprof_original__")
    client = redis.Redis.from_url(redis_url)
    token = runtime.begin_request("GET /once", runtime.now_ns())
    client.ping()
    runtime.end_request(token)
    client.close()
    assert sorted(s.layer or s.name for s in segments(recorded)) == sorted([DB_POOL, DB_QUERY, SEGMENT_CONNECTION_HOLD])


def test_uninstall_restores_redis(recorded):
    originals = {(cls, name): cls.__dict__[name].__latprof_original__ for cls, name in PATCHED}
    hook.uninstall()
    for cls, name in PATCHED:
        assert cls.__dict__[name] is originals[cls, name]
    assert hook.install() is True
    assert all(hasattr(cls.__dict__[name], "__latprof_original__") for cls, name in PATCHED)


def test_a_service_that_never_imports_redis_does_not_load_it():
    code = (
        "import sys; from latprof.collectors.hooks import redis as hook; assert hook.install();"
        " assert 'redis' not in sys.modules, 'imported'; import json; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


OTEL_SERVICE = textwrap.dedent(
    """
    import json, sys
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from latprof.collectors.hooks import redis as hook

    reader = InMemoryMetricReader()
    hook.install()  # before the service configures its SDK, as under `latprof run`
    import redis
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

    def counts():
        found = {}
        for resource in reader.get_metrics_data().resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == hook.OTEL_WAIT_TIME:
                        for point in metric.data.data_points:
                            key = scope.scope.name + " " + dict(point.attributes)["db.client.connection.pool.name"]
                            found[key] = {"unit": metric.unit, "count": point.count}
        return found

    url = sys.argv[1]
    blocking = redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(url, max_connections=2))
    plain = redis.Redis.from_url(url)
    for _ in range(3):
        blocking.ping()
    out = {"before": counts(), "observability": False}
    try:
        from redis.observability.config import MetricGroup, OTelConfig
        from redis.observability.providers import get_observability_instance
    except ImportError:  # redis-py without its own observability
        pass
    else:
        get_observability_instance().init(OTelConfig(metric_groups=[MetricGroup.CONNECTION_ADVANCED]))
        out["observability"] = hook.redis_records_wait_time()
        for _ in range(3):
            blocking.ping()
            plain.ping()
    out["after"] = counts()
    print(json.dumps(out))
    """
)


def test_the_checkout_wait_is_an_opentelemetry_histogram_unless_redis_py_records_it(redis_url):
    pytest.importorskip("opentelemetry.sdk.metrics")  # the service's SDK, not a latprof dependency
    result = subprocess.run([sys.executable, "-c", OTEL_SERVICE, redis_url], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    name = pool_name_of(redis_url)
    assert found["before"] == {f"latprof {name}": {"unit": "s", "count": 3}}
    if not found["observability"]:
        return
    after = found["after"]
    # Both pools are named alike: 3 more of ours are the plain pool's (redis-py records none for
    # it); the BlockingConnectionPool's 3 are only redis-py's own now, under its own pool name.
    assert after[f"latprof {name}"] == {"unit": "s", "count": 6}
    redis_own = [v for k, v in after.items() if k.startswith("redis-py ")]
    assert [v["count"] for v in redis_own] == [3]


# --- under `latprof run`: a uvicorn service that waits for its redis pool ----------------------

APP = "tests.collectors.hooks.apps.redis_app:app"
POOL_SIZE = 2
HOLD_MS = 200  # each request holds a pooled connection this long (WATCH ... EXEC around a sleep)
#: Concurrent requests per wave, waves one after the other: 2 (the pool's size) never wait;
#: in a wave of 6, two wait one hold and two wait two holds - the tail.
WAVES = ([POOL_SIZE] * 6 + [6]) * 4 + [POOL_SIZE] * 3


@pytest.mark.slow
def test_a_uvicorn_service_waiting_for_its_redis_pool_gets_the_db_pool_verdict(tmp_path: Path, redis_url):
    from apps.harness import Pending, Server

    env = {
        "LATPROF_TEST_REDIS": redis_url,
        "LATPROF_TEST_REDIS_POOL": str(POOL_SIZE),
        "LATPROF_TEST_REDIS_PREFIX": PREFIX,
        "LATPROF_TEST_REDIS_SECRET": SECRET,
    }
    server = Server(APP, "asyncio", "h11", tmp_path, env=env).start()
    seat = 0
    try:
        for size in WAVES:
            pending = []
            for _ in range(size):
                pending.append(Pending(server.port, f"/reserve/{seat}?ms={HOLD_MS}"))
                seat += 1
            statuses = [p.response().status for p in pending]
            assert statuses == [200] * size, server.output()
        assert server.stop() == 128 + signal.SIGTERM, server.output()  # uvicorn re-raises SIGTERM after a graceful stop
    finally:
        server.kill()
    assert_private(server.capture_path.read_text())

    data = read_captures([server.capture_path])
    (loaded,) = [q for q in data.quality if q.kind == "hooks_loaded"]
    assert {"asgi", "redis"} <= set(loaded.attrs["collectors"])
    assert not [q for q in data.quality if q.kind == "error" and q.attrs.get("collector") == "redis"], data.quality
    assert len([r for r in data.requests if r.route == "GET /reserve/{seat}"]) == sum(WAVES)
    all_segments = [s for group in data.segments_by_request.values() for s in group]
    waits = sorted(ms(s) for s in all_segments if s.layer == DB_POOL)
    assert waits[-1] >= 1.5 * HOLD_MS  # the last of a wave of 6 waited for two holds
    assert {s.name for s in all_segments if s.layer == DB_QUERY} == {"WATCH", "GET", "MULTI"}
    holds = [ms(s) for s in all_segments if s.name == SEGMENT_CONNECTION_HOLD]
    assert len(holds) == sum(WAVES) and min(holds) >= HOLD_MS * 0.95
    gauges = [g for g in data.gauges if g.attrs.get(DB_POOL_NAME) == pool_name_of(redis_url)]
    assert {g.value for g in gauges if g.name == GAUGE_POOL_MAX} == {float(POOL_SIZE)}
    assert max(g.value for g in gauges if g.name == GAUGE_POOL_WAITERS) >= 2

    result = subprocess.run(
        [sys.executable, "-m", "latprof", "analyze", "--format", "json", "--skip-warmup", "0", str(server.capture_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    verdict, latency = report["verdict"], report["latency_ms"]
    print(f"redis pool verdict: {verdict}; p50 {latency['p50']:.0f} ms p99 {latency['p99']:.0f} ms")
    assert verdict["layer"] == "db.pool" and verdict["rule"] == "db-pool-exhaustion", verdict
    assert verdict["share_of_tail_excess"] >= 0.8 and verdict["confidence"] >= 0.8, verdict
    (finding,) = [f for f in report["findings"] if f["rule"] == "db-pool-exhaustion"]
    assert finding["evidence"]["pool_max"] == POOL_SIZE and finding["evidence"]["peak_waiters"] >= 2, finding
    assert finding["evidence"]["pools"] == [pool_name_of(redis_url)]
