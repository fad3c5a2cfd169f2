"""`latprof attach --pid` on real asyncio services under load: a held loop, a pool held across the
LLM call (seen from the sockets, and with `--db` from pg_stat_activity), a healthy service.

Each service is started by hand as a user would (uvicorn or aiohttp, no latprof in it), loaded by
client threads, and sampled for a few seconds through the CLI; the live JSON report and `latprof
analyze` of its capture must agree (`attach.procs.attach_under_load`).
"""

from __future__ import annotations

import sys
import urllib.parse

import pytest

from attach.procs import attach_under_load
from attach.scenarios import REDIS_HOST, REDIS_PORT
import services  # tests/services.py: the local services the tests use
from latprof.demo.provider import Provider

pytestmark = pytest.mark.slow  # real servers, sampled from outside


def uvicorn(loop: str = "asyncio") -> list[str]:
    return [sys.executable, "-m", "uvicorn", "tests.attach.apps.async_app:app", "--port", "{port}", "--loop", loop,
            "--log-level", "warning"]  # fmt: skip


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_blocking_call_in_an_async_handler_gives_event_loop(tmp_path, loop):
    report, _ = attach_under_load(tmp_path, [], "/block?ms=150", 4, server=uvicorn(loop))
    verdict = report["verdict"]
    assert (verdict["layer"], verdict["rule"]) == ("event_loop", "event-loop-blocked"), verdict
    (finding,) = [f for f in report["findings"] if f["rule"] == "event-loop-blocked"]
    evidence = finding["evidence"]
    assert evidence["loop_busy_share"] >= 0.6 and evidence["loop_threads"] == 1
    # the blocking calls follow each other: the loop never waits for events for most of the capture
    assert evidence["blocked_intervals"] >= 1 and evidence["blocked_ms_longest"] >= 140 and evidence["blocked_share"] >= 0.5
    assert list(evidence["hot_frames"])[0].startswith("block (")  # the handler that blocks
    assert list(evidence["held_by"])[0] == "wchan.sleep"  # a time.sleep, told by the wait channel
    census = report["collection"]["census"]  # the clients wait behind the blocked loop: read and unanswered, or not yet accepted
    assert census["requests_in_flight_mean"] + census["accept_backlog_mean"] >= 2.5, census


def test_a_cpu_heavy_aiohttp_handler_gives_event_loop(tmp_path):
    report, _ = attach_under_load(tmp_path, [], "/cpu?ms=60", 3,
                                  server=[sys.executable, "tests/attach/apps/aiohttp_cpu_app.py", "{port}"])  # fmt: skip
    verdict = report["verdict"]
    assert (verdict["layer"], verdict["rule"]) == ("event_loop", "event-loop-blocked"), verdict
    (finding,) = [f for f in report["findings"] if f["rule"] == "event-loop-blocked"]
    evidence = finding["evidence"]
    assert evidence["loop_busy_share"] >= 0.7
    assert list(evidence["held_by"])[0] == "app"  # running Python
    assert any(frame.startswith(("digest (", "<genexpr> (")) for frame in evidence["hot_frames"]), evidence["hot_frames"]


def test_a_healthy_async_service_gets_no_verdict(tmp_path):
    report, _ = attach_under_load(tmp_path, [], "/ok?ms=30", 4, pause_s=0.05, server=uvicorn())
    verdict = report["verdict"]
    assert verdict["layer"] is None and verdict["status"] == "not_saturated", verdict
    assert report["collection"]["event_loop"]["loop_busy_share"] < 0.3
    assert not [f for f in report["findings"] if f["layer"] in ("event_loop", "db.pool")]


def test_requests_waiting_inside_the_process_on_nothing_visible_are_unattributed_with_latprof_run(tmp_path):
    """Requests queue for an asyncio.Semaphore(1) held 200 ms each: the loop is free, no DB, nothing on the wire."""
    report, _ = attach_under_load(tmp_path, [], "/gate?ms=200", 6, server=uvicorn())
    verdict = report["verdict"]
    assert (verdict["layer"], verdict["status"]) == ("unattributed", "unattributed"), verdict
    assert "latprof run" in verdict["summary"]
    census = report["collection"]["census"]
    assert census["requests_in_flight_mean"] >= 4 and census["requests_waiting_in_process_mean"] >= 4
    assert census["requests_in_flight_age_ms_p50"] >= 200
    assert report["collection"]["event_loop"]["loop_busy_share"] < 0.3


@pytest.fixture(scope="module")
def slow_provider():
    """An OpenAI-compatible provider whose first token takes 400 ms (a subprocess of its own)."""
    with Provider(ttft_ms=400, tpot_ms=10, output_tokens=8, subprocess=True) as provider:
        yield provider


def held_across_llm(tmp_path, provider, db: str, *, with_db: bool) -> dict:
    services.require_pg()
    env = {"APP_DB": db, "APP_PG": services.PG_DSN, "APP_PROVIDER": provider.url, "APP_POOL_SIZE": "3"}
    report, _ = attach_under_load(tmp_path, [], "/chat", 12, env=env, server=uvicorn(), duration_s=5,
                                  attach_args=("--db", services.PG_DSN) if with_db else ())  # fmt: skip
    return report


@pytest.mark.parametrize("db, state", [("sqlalchemy", "idle in transaction"), ("asyncpg", "idle")])
def test_connections_held_across_a_slow_llm_call_give_db_pool_with_pg_stat_activity(tmp_path, slow_provider, db, state):
    """12 clients, a pool of 3 each request holds across a 400 ms LLM call: SQLAlchemy asyncio
    (autobegin: the connection sits idle in transaction) and asyncpg without a transaction (idle)."""
    report = held_across_llm(tmp_path, slow_provider, db, with_db=True)
    verdict = report["verdict"]
    assert (verdict["layer"], verdict["rule"]) == ("db.pool", "db-pool-exhaustion"), verdict
    assert verdict["confidence"] >= 0.8  # pg_stat_activity confirms what the sockets suggest
    (finding,) = [f for f in report["findings"] if f["rule"] == "db-pool-exhaustion"]
    evidence = finding["evidence"]
    assert evidence["db_connections_ceiling"] == 3 and evidence["db_connections_at_ceiling_share"] >= 0.8
    assert evidence["requests_in_flight_mean"] >= 8  # the clients' requests, most of them waiting for a connection
    assert evidence["requests_waiting_in_process_mean"] >= 4
    pg = evidence["pg_stat_activity"]
    assert pg["backends"] == 3 and list(pg["state_share"])[0] == state and pg["held_share"] >= 0.6
    assert pg["idle_age_ms_p50"] >= 100  # held for a good part of the LLM call since the last statement
    assert "held across something else" in finding["summary"]


def test_without_db_the_sockets_alone_point_at_the_pool_and_say_it_is_inferred(tmp_path, slow_provider):
    report = held_across_llm(tmp_path, slow_provider, "sqlalchemy", with_db=False)
    verdict = report["verdict"]
    assert (verdict["layer"], verdict["rule"]) == ("db.pool", "db-pool-exhaustion"), verdict
    assert verdict["confidence"] == 0.5  # inferred from the wire only
    (finding,) = [f for f in report["findings"] if f["rule"] == "db-pool-exhaustion"]
    assert finding["evidence"]["inferred"] is True and "pg_stat_activity" not in finding["evidence"]
    assert "--db DSN" in finding["summary"] and "stable ceiling of 3 connections to 127.0.0.1:5432" in finding["summary"]


def test_idle_persistent_connections_while_requests_wait_on_the_provider_are_no_pool(tmp_path, slow_provider):
    """12 clients; the service keeps 3 PostgreSQL and 3 Redis connections open (a stable ceiling
    of 6 at the databases, 12 requests in flight) but gives them back at once: the requests
    wait on the provider. A steady number of persistent connections is no pool at its limit
    (it once was read as a saturated pool, confidently)."""
    services.require_pg()
    env = {"APP_DB": "asyncpg", "APP_PG": services.PG_DSN, "APP_REDIS": f"redis://{REDIS_HOST}:{REDIS_PORT}/0",
           "APP_PROVIDER": slow_provider.url, "APP_POOL_SIZE": "3"}  # fmt: skip
    report, _ = attach_under_load(tmp_path, [], "/ask", 12, env=env, server=uvicorn(), duration_s=5)
    verdict = report["verdict"]
    assert verdict["layer"] != "db.pool" and not [f for f in report["findings"] if f["layer"] == "db.pool"], report["findings"]
    if verdict["layer"] == "event_loop":  # on openai 2.x (a connection per call) the loop really is held, in blocks
        assert report["collection"]["event_loop"]["blocked_intervals"] >= 3, report["collection"]["event_loop"]
    else:
        assert verdict["layer"] in (None, "provider", "tool"), verdict  # never a wrong layer
    census = report["collection"]["census"]
    endpoints = census["endpoints"]
    pg_port = urllib.parse.urlsplit(services.PG_DSN).port or 5432
    assert {f"127.0.0.1:{pg_port}", f"{REDIS_HOST}:{REDIS_PORT}"} <= set(endpoints), endpoints
    assert census["requests_in_flight_mean"] >= 8 and census["requests_waiting_in_process_mean"] < 3, census


def test_requests_waiting_on_a_semaphore_beside_idle_persistent_db_connections_are_no_pool(tmp_path):
    """Requests queue for an asyncio.Semaphore(1) (200 ms each) while the service keeps 3
    PostgreSQL connections open and never uses them: a stable ceiling of DB connections and
    requests waiting in the process, but no connection is ever busy. A steady number of
    persistent connections alone is no evidence that requests wait for them: not db.pool."""
    services.require_pg()
    env = {"APP_DB": "asyncpg", "APP_PG": services.PG_DSN, "APP_POOL_SIZE": "3"}
    report, _ = attach_under_load(tmp_path, [], "/gate?ms=200", 6, env=env, server=uvicorn())
    verdict = report["verdict"]
    assert (verdict["layer"], verdict["status"]) == ("unattributed", "unattributed"), verdict
    assert "latprof run" in verdict["summary"]
    assert not [f for f in report["findings"] if f["layer"] == "db.pool"], report["findings"]
    census = report["collection"]["census"]
    assert census["db_connections_ceiling"] == 3 and census["db_connections_active_share"] == 0.0, census


def test_requests_behind_an_http_clients_connection_limit_give_http_pool_inferred(tmp_path, slow_provider):
    """12 clients; the openai client may open 2 connections (httpx limits) to a provider whose
    first token takes 400 ms: 2 requests at the provider, about 10 waiting in the process, none
    at a database. From outside: a stable ceiling of 2 busy connections to one endpoint, named
    http.pool as an inference under 0.5 (a semaphore of the service's own looks the same)."""
    env = {"APP_PROVIDER": slow_provider.url, "APP_HTTP_LIMIT": "2"}
    report, _ = attach_under_load(tmp_path, [], "/llm", 12, env=env, server=uvicorn(), duration_s=5)
    verdict = report["verdict"]
    assert (verdict["layer"], verdict["rule"]) == ("http.pool", "http-pool-exhaustion"), verdict
    assert verdict["confidence"] < 0.5
    (finding,) = [f for f in report["findings"] if f["rule"] == "http-pool-exhaustion"]
    evidence = finding["evidence"]
    assert evidence["inferred"] is True and evidence["http_connections_ceiling"] == 2
    assert evidence["http_endpoint"] == f"127.0.0.1:{slow_provider.port}"
    assert evidence["requests_waiting_in_process_mean"] >= 6
