"""The locks hook: contended acquires of real threading and asyncio locks inside a request are `lock`."""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from recording import recording

from apps.harness import ROOT, GunicornServer, get

from latprof.analysis.requests import analyze
from latprof.collectors.hooks import locks, runtime
from latprof.events import Request, Segment
from latprof.layers import DB_POOL, LOCK
from latprof.semconv import LOCK_KIND, LOCK_SITE
from latprof.analysis.timeline import RequestTimeline, Timeline

HOLD_S = 0.3


@pytest.fixture
def hooked():
    """The factories replaced for the test; events recorded in memory."""
    with recording() as events:
        locks.install()
        try:
            yield events
        finally:
            locks.uninstall()


def lock_waits(events: list) -> list[Segment]:
    return [e for e in events if isinstance(e, Segment) and e.layer == LOCK]


def hold_elsewhere(lock, seconds: float = HOLD_S) -> threading.Thread:
    """Another thread takes `lock` now and releases it after `seconds`."""
    taken = threading.Event()

    def holder() -> None:
        with lock:
            taken.set()
            time.sleep(seconds)

    t = threading.Thread(target=holder)
    t.start()
    assert taken.wait(5)
    return t


def in_request(fn) -> None:
    token = runtime.begin_request("GET /x", runtime.now_ns())
    try:
        fn()
    finally:
        runtime.end_request(token)


@pytest.mark.parametrize("factory", ["Lock", "RLock"])
def test_a_contended_acquire_in_a_request_is_a_lock_wait_named_by_where_the_lock_was_made(hooked, factory):
    lock = getattr(threading, factory)()  # made here: this file and line are its site
    line = sys._getframe().f_lineno - 1
    assert type(lock).__name__.startswith("_Timed")
    holder = hold_elsewhere(lock)
    in_request(lambda: lock.acquire() and lock.release())
    holder.join()
    (wait,) = lock_waits(hooked)
    assert 0.2e9 <= wait.end_ns - wait.start_ns <= HOLD_S * 1e9 + 0.2e9
    assert wait.attrs[LOCK_KIND] == f"threading.{factory}"
    assert wait.attrs[LOCK_SITE] == f"hooks/test_locks_hook.py:{line}"


def test_uncontended_reentrant_and_outside_request_acquires_record_nothing(hooked):
    lock, rlock = threading.Lock(), threading.RLock()

    def work() -> None:
        for _ in range(100):
            with lock:
                pass
            with rlock, rlock:  # re-entry by the owner is the fast path
                pass
        assert lock.acquire(blocking=False) and not lock.acquire(blocking=False)
        lock.release()
        assert not lock.locked()

    in_request(work)

    class Map:  # werkzeug keeps the factory as a class attribute and calls it through self
        lock_class = threading.Lock
        rlock_class = threading.RLock

    assert Map().lock_class().acquire(False) and Map().rlock_class().acquire(False)
    holder = hold_elsewhere(lock, 0.1)
    with lock:  # contended, but outside any request
        pass
    holder.join()
    assert lock_waits(hooked) == []


def test_waiting_for_work_is_not_contention(hooked):
    """Condition notifications, Events and queues are waits for work, not for a lock."""
    cond = threading.Condition(threading.RLock())
    event = threading.Event()
    q: queue.Queue[int] = queue.Queue()
    ready: list[int] = []

    def producer() -> None:
        time.sleep(0.15)
        with cond:
            ready.append(1)
            cond.notify_all()
        time.sleep(0.1)
        event.set()
        time.sleep(0.1)
        q.put(1)

    def consume() -> None:
        with cond:
            assert cond.wait_for(lambda: ready, timeout=5)
        assert event.wait(5)
        assert q.get(timeout=5) == 1

    t = threading.Thread(target=producer)
    t.start()
    in_request(consume)
    t.join()
    assert lock_waits(hooked) == []


def test_semaphores_threading_and_asyncio(hooked):
    sem = threading.BoundedSemaphore(1)
    holder = hold_elsewhere(sem)
    in_request(lambda: sem.acquire() and sem.release())
    holder.join()
    (wait,) = lock_waits(hooked)
    assert wait.attrs[LOCK_KIND] == "threading.Semaphore" and wait.end_ns - wait.start_ns >= 0.2e9
    hooked.clear()

    async def main() -> None:
        alock, asem = asyncio.Lock(), asyncio.Semaphore(1)

        async def hold(primitive) -> None:
            async with primitive:
                await asyncio.sleep(HOLD_S)

        async def wait_for(primitive) -> None:
            await asyncio.sleep(0.02)
            token = runtime.begin_request("GET /a", runtime.now_ns())
            try:
                async with primitive:
                    pass
                async with primitive:  # free now: not recorded
                    pass
            finally:
                runtime.end_request(token)

        for primitive in (alock, asem):
            await asyncio.gather(hold(primitive), wait_for(primitive))

    asyncio.run(main())
    waits = lock_waits(hooked)
    assert [w.attrs[LOCK_KIND] for w in waits] == ["asyncio.Lock", "asyncio.Semaphore"]
    for w in waits:
        assert 0.2e9 <= w.end_ns - w.start_ns <= HOLD_S * 1e9 + 0.2e9
        assert w.attrs[LOCK_SITE].startswith("hooks/test_locks_hook.py:")


def test_a_lock_wait_inside_a_pool_checkout_counts_as_the_checkout(hooked):
    lock = threading.Lock()
    holder = hold_elsewhere(lock)
    start = runtime.now_ns()
    token = runtime.begin_request("GET /x", start)
    with runtime.segment("checkout", DB_POOL):
        with lock:
            pass
    runtime.end_request(token)
    holder.join()
    request = next(e for e in hooked if isinstance(e, Request))
    segments = tuple(e for e in hooked if isinstance(e, Segment))
    (wait,) = lock_waits(hooked)
    assert wait.parent_id is not None  # nested under the checkout
    timeline = Timeline("run", ["<test>"], [RequestTimeline(request, segments)], {}, [], [])
    breakdown = analyze(timeline, warmup_s=0).breakdowns[0]
    assert LOCK not in breakdown and breakdown[DB_POOL] >= 200


def test_latprof_and_threading_internals_keep_native_locks_and_uninstall_restores(hooked):
    from latprof.capture.writer import CaptureWriter

    native = type(locks._native_lock())
    assert type(threading.Event()._cond._lock) is not locks._TimedLock  # Event's own lock
    writer = CaptureWriter("/dev/null", source="run")
    assert type(writer._start_lock) is native
    locks.uninstall()
    assert type(threading.Lock()) is native and threading.Semaphore.acquire.__name__ == "acquire"
    assert not hasattr(threading.Semaphore.acquire, "__latprof_original__")
    locks.install()


def test_a_global_lock_in_a_threaded_server_gives_the_lock_verdict(tmp_path):
    """gunicorn gthread, 8 threads, Flask: every request holds one global lock for 25 ms; bursts queue on it."""
    server = GunicornServer("tests.collectors.hooks.apps.wsgi_app:app", "", "", tmp_path, worker_class="gthread", threads=8).start()
    try:
        sent = 0
        stop = time.monotonic() + 8.0
        with ThreadPoolExecutor(8) as pool:
            tick = 0
            while time.monotonic() < stop:
                n = 8 if tick % 6 == 0 else 1  # a burst of 8 every 0.6 s, else one request per 0.1 s
                futures = [pool.submit(get, server.port, "/locked?ms=25") for _ in range(n)]
                sent += n
                tick += 1
                time.sleep(0.1)
                if n > 1:
                    assert [f.result().status for f in futures] == [200] * n
        server.stop()
    finally:
        server.kill()
    out = subprocess.run(
        [sys.executable, "-m", "latprof", "analyze", "--format", "json", str(server.capture_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    verdict = report["verdict"]
    print(f"{sent} sent; verdict {verdict}; latency {report['latency_ms']}")
    assert verdict["layer"] == "lock" and verdict["rule"] == "lock-contention", verdict
    (finding,) = [f for f in report["findings"] if f["rule"] == "lock-contention"]
    top = finding["evidence"]["locks"][0]
    assert top["kind"] == "threading.Lock" and top["site"].startswith("apps/wsgi_app.py:")
