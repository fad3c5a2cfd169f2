"""The threads hook: work a request hands to a ThreadPoolExecutor or a Thread stays the request's."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from recording import recording

import services
from latprof.collectors.hooks import psycopg_pool as pool_hook
from latprof.collectors.hooks import runtime, threads
from latprof.events import QualityRecord, Request, Segment
from latprof.layers import DB_POOL, QUEUE, TOOL
from latprof.semconv import LAST_ERROR, QUEUE_SOURCE, THREAD_POOL_MAX_WORKERS, THREAD_POOL_NAME


@pytest.fixture
def hooked():
    with recording() as events:
        assert threads.install() is True
        try:
            yield events
        finally:
            threads.uninstall()


def segments(events, name: str | None = None) -> list[Segment]:
    return [e for e in events if isinstance(e, Segment) and (name is None or e.name == name)]


def roots(events) -> list[Request]:
    return [e for e in events if isinstance(e, Request)]


def mark(name: str, ms: float = 0) -> str | None:
    """A segment recorded where it runs (as a hook would), `ms` long; its parent is whatever is open."""
    start = runtime.now_ns()
    if ms:
        time.sleep(ms / 1000)
    return runtime.record(name, TOOL, start, runtime.now_ns())


def test_tasks_submitted_in_a_request_record_into_it_under_the_segment_open_at_submit(hooked):
    with ThreadPoolExecutor(4) as pool:
        token = runtime.begin_request("GET /fan", runtime.now_ns())
        with runtime.segment("agent step", None):
            parent = runtime.current_parent()
            futures = [pool.submit(mark, f"lookup {i}") for i in range(3)]
            ids = [f.result() for f in futures]
            mapped = list(pool.map(mark, ["mapped"]))
        runtime.end_request(token)
    (root,) = roots(hooked)
    looked = [s for s in segments(hooked) if s.name.startswith("lookup")]
    assert sorted(s.segment_id for s in looked) == sorted(ids) and all(ids)
    assert {s.request_id for s in looked} == {root.request_id}
    assert {s.parent_id for s in looked} == {parent}
    (m,) = segments(hooked, "mapped")
    assert mapped == [m.segment_id] and m.parent_id == parent


def test_a_task_that_waited_for_a_busy_pool_gets_a_queue_segment(hooked):
    with ThreadPoolExecutor(1, thread_name_prefix="lookups") as pool:
        token = runtime.begin_request("GET /fan", runtime.now_ns())
        first = pool.submit(mark, "slow", 80)
        second = pool.submit(mark, "quick")
        first.result(), second.result()
        runtime.end_request(token)
    waits = segments(hooked, threads.EXECUTOR_WAIT)
    assert len(waits) == 1, waits  # the first task started at once
    (wait,) = waits
    (quick,) = segments(hooked, "quick")
    (slow,) = segments(hooked, "slow")
    assert wait.layer == QUEUE and wait.parent_id is None
    assert wait.attrs == {QUEUE_SOURCE: "executor", THREAD_POOL_NAME: "lookups", THREAD_POOL_MAX_WORKERS: 1}
    assert wait.end_ns <= quick.start_ns and wait.end_ns >= slow.end_ns - 1_000_000
    assert (wait.end_ns - wait.start_ns) / 1e6 >= 60


def test_outside_a_request_the_pool_runs_the_function_itself(hooked):
    seen = []

    def task():
        seen.append(runtime.current_request())
        return threading.current_thread().name

    with ThreadPoolExecutor(2) as pool:
        assert pool.submit(task).result().startswith("ThreadPoolExecutor")
        assert pool.submit(lambda: 42).result() == 42
        # what the pool's work queue holds outside a request: the caller's own function
        blocker = threading.Event()
        try:
            started = threading.Barrier(3)
            pool.submit(lambda: (started.wait(), blocker.wait()))
            pool.submit(lambda: (started.wait(), blocker.wait()))
            started.wait(10)  # both workers busy
            queued = pool.submit(task)
            item = pool._work_queue.get_nowait()
            pool._work_queue.put(item)
            assert item.fn is task
        finally:
            blocker.set()
        queued.result()
    assert seen == [None, None]
    assert hooked == []


def test_worker_threads_started_by_a_submit_in_a_request_do_not_carry_it(hooked):
    with ThreadPoolExecutor(1) as pool:
        token = runtime.begin_request("GET /first", runtime.now_ns())
        pool.submit(mark, "inside").result()  # starts the pool's only worker thread
        runtime.end_request(token)
        after = pool.submit(lambda: (runtime.current_request(), runtime.current_parent())).result()
        assert after == (None, None)
        assert pool.submit(mark, "outside").result() is None
    assert [s.name for s in segments(hooked)] == ["inside"]


def test_a_task_sees_the_request_but_not_the_callers_other_context_variables(hooked):
    var: contextvars.ContextVar[str] = contextvars.ContextVar("app_var", default="unset")
    with ThreadPoolExecutor(1) as pool:
        token = runtime.begin_request("GET /x", runtime.now_ns())
        var.set("caller")
        state = runtime.current_request()
        got = pool.submit(lambda: (var.get(), runtime.current_request())).result()
        runtime.end_request(token)
    assert got == ("unset", state)


def test_a_failing_task_raises_into_its_future_and_the_request_is_reset(hooked):
    def boom():
        mark("before boom")
        raise ValueError("boom")

    with ThreadPoolExecutor(1) as pool:
        token = runtime.begin_request("GET /x", runtime.now_ns())
        future = pool.submit(boom)
        with pytest.raises(ValueError, match="boom"):
            future.result()
        runtime.end_request(token)
        assert pool.submit(runtime.current_request).result() is None
    assert [s.name for s in segments(hooked)] == ["before boom"]


def test_run_in_executor_in_an_asyncio_request(hooked):
    async def main() -> tuple[str | None, str | None]:
        loop = asyncio.get_running_loop()
        token = runtime.begin_request("GET /async", runtime.now_ns())
        with runtime.segment("handler", None):
            parent = runtime.current_parent()
            a, b = await asyncio.gather(loop.run_in_executor(None, mark, "blocking a", 30),
                                        asyncio.to_thread(mark, "blocking b", 30))
        runtime.end_request(token)
        assert a and b
        return parent, runtime.current_request()

    parent, after = asyncio.run(main())
    assert after is None
    (root,) = roots(hooked)
    blocking = [s for s in segments(hooked) if s.name.startswith("blocking")]
    assert len(blocking) == 2
    assert {(s.request_id, s.parent_id) for s in blocking} == {(root.request_id, parent)}


def test_a_thread_started_in_a_request_records_into_it(hooked):
    class OwnRun(threading.Thread):
        def run(self) -> None:
            self.seen = runtime.current_request()

    token = runtime.begin_request("GET /t", runtime.now_ns())
    with runtime.segment("spawner", None):
        parent = runtime.current_parent()
        t = threading.Thread(target=mark, args=("in thread",))
        t.start()
        t.join()
        own = OwnRun()
        own.start()
        own.join()
    runtime.end_request(token)
    outside = threading.Thread(target=mark, args=("outside",))
    outside.start()
    outside.join()
    (seg,) = segments(hooked, "in thread")
    assert seg.parent_id == parent and seg.request_id == roots(hooked)[0].request_id
    assert own.seen is None and not hasattr(own, threads._CARRIED)  # a run of its own is not followed
    assert not hasattr(t, threads._CARRIED)  # dropped once the thread ran


def test_a_failing_hook_is_counted_and_the_task_still_runs(hooked, monkeypatch):
    monkeypatch.setattr(threads, "_Task", None)  # calling it raises TypeError
    with ThreadPoolExecutor(1) as pool:
        token = runtime.begin_request("GET /x", runtime.now_ns())
        assert pool.submit(lambda: 7).result() == 7
        runtime.end_request(token)
    runtime.report_errors(force=True)
    (error,) = [e for e in hooked if isinstance(e, QualityRecord) and e.kind == "error" and e.attrs.get("collector") == threads.HOOK]
    assert error.occurrences == 1 and "TypeError" in error.attrs[LAST_ERROR]


def test_uninstall_restores_thread_and_executor():
    originals = (threading.Thread.start, threading.Thread.run, ThreadPoolExecutor.submit)
    threads.install()
    assert ThreadPoolExecutor.submit is not originals[2] and threading.Thread.start is not originals[0]
    assert threads.install() is True and ThreadPoolExecutor.submit.__wrapped__ is originals[2]  # patched once
    threads.uninstall()
    assert (threading.Thread.start, threading.Thread.run, ThreadPoolExecutor.submit) == originals
    assert concurrent.futures.ThreadPoolExecutor.submit is originals[2]


def test_a_fan_out_on_a_small_psycopg_pool_records_its_pool_waits_in_the_request(hooked):
    """Four lookups in parallel on a real psycopg_pool of 2 connections: two of them wait for one."""
    services.require_pg()
    from psycopg_pool import ConnectionPool

    pool_hook.install()
    try:
        db = ConnectionPool(services.PG_DSN, min_size=2, max_size=2, name="fan", open=True)
        try:
            db.wait(10)

            def lookup(i: int) -> int:
                with db.connection() as conn:
                    conn.execute("SELECT pg_sleep(0.1)")
                return i

            with ThreadPoolExecutor(4) as pool:
                token = runtime.begin_request("GET /fan", runtime.now_ns())
                assert sorted(pool.map(lookup, range(4))) == [0, 1, 2, 3]
                runtime.end_request(token)
        finally:
            db.close()
    finally:
        pool_hook.uninstall()
    (root,) = roots(hooked)
    waits = [s for s in segments(hooked) if s.layer == DB_POOL and s.end_ns - s.start_ns >= 50_000_000]
    assert len(waits) == 2, [(s.name, (s.end_ns - s.start_ns) / 1e6) for s in segments(hooked) if s.layer == DB_POOL]
    assert {s.request_id for s in waits} == {root.request_id}
