"""A blocked event loop on a real uvicorn + Starlette under `latprof run`: who waited for it, who caused it, the verdict."""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import sys
import threading
import time

import httpx
import pytest
from recording import recording
import uvloop

from apps.harness import serve_session, CONFIGS, ROOT, Capture, Pending, Server

from latprof.collectors.hooks import asyncio_loop
from latprof.collectors.hooks._async_request import BLOCKED_BY_OTHERS, HELD_THE_LOOP
from latprof.collectors.hooks.asyncio_loop import BLOCK_THRESHOLD_NS
from latprof.events import Gauge
from latprof.layers import EVENT_LOOP
from latprof.semconv import GAUGE_LOOP_LAG_MS

pytestmark = pytest.mark.slow  # real servers in subprocesses, timing-sensitive

APP = "tests.collectors.hooks.apps.plain:app"
CHAT = "GET /chat/{chat_id:int}"
BLOCK = "GET /block"
BLOCK_MS = 500  # the blocking request: time.sleep(0.5) inside `async def`
LOAD_S = 2.6  # closed-loop load with a 400 ms block every 0.7 s, for the verdict
LOAD_CLIENTS = 6


class Session:
    def __init__(self, server: Server):
        self.server = server
        self.blocker_sent_ns = 0
        self.arrived_during_block: list[int] = []  # client send times
        self.in_flight_at_block: list[int] = []
        self.load_requests = 0

    def run(self) -> None:
        port = self.server.port
        for i in range(3):
            assert Pending(port, f"/chat/{i}?ms=1").response().status == 200
        time.sleep(0.1)  # apart from the warm-up, so that start times tell the requests apart

        # Requests already waiting (on asyncio.sleep) when the loop blocks, the blocker, and
        # requests arriving while it blocks.
        in_flight = [Pending(port, f"/chat/{i}?ms=300") for i in range(3)]
        time.sleep(0.03)
        blocker = Pending(port, f"/block?ms={BLOCK_MS}")
        time.sleep(0.15)
        arriving = [Pending(port, f"/chat/{i}?ms=1") for i in range(4)]
        responses = [p.response() for p in in_flight + [blocker] + arriving]
        assert [r.status for r in responses] == [200] * 3 + [202] + [200] * 4
        self.blocker_sent_ns = blocker.sent_ns
        self.in_flight_at_block = [p.sent_ns for p in in_flight]
        self.arrived_during_block = [p.sent_ns for p in arriving]

        self.load(port)
        self.server.stop()
        self.capture = self.server.capture()

    def load(self, port: int) -> None:
        """Closed-loop chat clients on keep-alive connections; every 0.7 s someone blocks the loop for 400 ms."""
        stop = time.monotonic() + LOAD_S
        counts = [0] * LOAD_CLIENTS
        errors: list[BaseException] = []

        def chat(k: int) -> None:
            try:
                with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=20) as client:
                    while time.monotonic() < stop:
                        assert client.get(f"/chat/{k}", params={"ms": 20}).status_code == 200
                        counts[k] += 1
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        def block() -> None:
            try:
                with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=20) as client:
                    time.sleep(0.2)
                    while time.monotonic() < stop - 0.5:
                        assert client.get("/block", params={"ms": 400}).status_code == 202
                        time.sleep(0.3)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=chat, args=(k,)) for k in range(LOAD_CLIENTS)] + [threading.Thread(target=block)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not errors, errors
        assert not any(t.is_alive() for t in threads)
        self.load_requests = sum(counts)


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: "+".join(c))
def session(request, tmp_path_factory):
    yield from serve_session(request, tmp_path_factory, APP, "loop", Session)


def test_requests_arriving_during_a_block_start_at_arrival_and_wait_for_the_loop(session):
    cap: Capture = session.capture
    blocker = cap.matching(BLOCK, session.blocker_sent_ns)
    for sent_ns in session.arrived_during_block:
        r = cap.matching(CHAT, sent_ns, tolerance_ms=30)  # backdated to the arrival, not the handler start
        pre = cap.pre_handler(r)
        assert pre.layer == EVENT_LOOP and pre.start_ns == r.start_ns
        # Sent 150 ms into a 500 ms block: about 350 ms waiting for the loop, before its handler.
        assert 250 <= (pre.end_ns - pre.start_ns) / 1e6 <= BLOCK_MS + 100, (pre.end_ns - pre.start_ns) / 1e6
        assert pre.end_ns >= blocker.end_ns - 50e6  # its handler could only start once the block was over
        assert cap.layer_ms(r, EVENT_LOOP) <= BLOCK_MS + 100


def test_requests_in_flight_during_a_block_wait_for_it(session):
    cap: Capture = session.capture
    for sent_ns in session.in_flight_at_block:
        r = cap.matching(CHAT, sent_ns, tolerance_ms=30)
        assert r.duration_ns >= BLOCK_MS * 1e6, r  # sleeping 300 ms from 30 ms before the block, then stuck behind it
        blocked = [s for s in cap.segments(r, EVENT_LOOP) if s.name == BLOCKED_BY_OTHERS]
        assert blocked, cap.segments(r)
        assert 0.8 * BLOCK_MS <= cap.layer_ms(r, EVENT_LOOP) <= BLOCK_MS + 100


def test_the_blocking_request_is_not_charged_for_its_own_block(session):
    cap: Capture = session.capture
    blockers = cap.routes(BLOCK)
    assert len(blockers) >= 3
    first = cap.matching(BLOCK, session.blocker_sent_ns)
    assert first.duration_ns >= BLOCK_MS * 1e6
    assert cap.layer_ms(first, EVENT_LOOP) < 50, cap.segments(first)
    (held,) = [s for s in cap.segments(first) if s.name == HELD_THE_LOOP]  # named as the culprit, owning no time
    assert held.layer is None and (held.end_ns - held.start_ns) >= 0.95 * BLOCK_MS * 1e6
    for r in blockers:  # also under load: at most what it waited for another block
        assert cap.layer_ms(r, EVENT_LOOP) < (r.duration_ns / 1e6) - 350, cap.segments(r)


def test_loop_lag_gauge_records_the_blocks(session):
    lags = [g.value for g in session.capture.data.gauges if g.name == GAUGE_LOOP_LAG_MS]
    assert lags and max(lags) >= BLOCK_THRESHOLD_NS / 1e6
    assert max(lags) >= 0.6 * BLOCK_MS
    assert sum(1 for v in lags if v >= 300) >= 3  # the first block and some of the load's 400 ms ones


def test_analyze_names_the_event_loop(session):
    assert session.load_requests >= 60
    result = subprocess.run(
        [sys.executable, "-m", "latprof", "analyze", str(session.server.capture_path), "--skip-warmup", "0", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["verdict"]["layer"] == EVENT_LOOP, report["verdict"]
    assert report["verdict"]["rule"] == "event-loop-blocked"


# --- the loop monitor in this process, on a real loop -------------------------------------------


@pytest.fixture
def recorded():
    with recording() as events:
        yield events


@pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_a_request_finishing_right_after_a_block_sees_it_before_the_probe_tick_does(recorded, new_loop):
    async def main() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        monitor = asyncio_loop.monitor(asyncio.get_running_loop())
        monitor.request_started()  # a request in flight: the probe ticks every 10 ms
        await asyncio.sleep(0.05)
        started = time.time_ns()
        time.sleep(0.2)  # held by no request's step: an unknown owner
        seen = monitor.blocked(asyncio_loop.Owner().key, started, time.time_ns())  # before the loop ran the tick
        await asyncio.sleep(0.05)  # the overdue tick runs now and must not count the block again
        return seen

    loop = new_loop()
    try:
        others, own = loop.run_until_complete(main())
    finally:
        loop.close()
    assert own == [] and len(others) == 1
    assert 170 <= (others[0][1] - others[0][0]) / 1e6 <= 260
    lags = [e.value for e in recorded if isinstance(e, Gauge) and e.value >= BLOCK_THRESHOLD_NS / 1e6]
    assert len(lags) == 1 and 170 <= lags[0] <= 260


@pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_the_loop_is_lagging_while_it_is_blocked_and_for_a_while_after(recorded, new_loop):
    """What decides whether the ASGI hook reads TCP_INFO: the loop's lateness, now or lately."""
    tick = 60_000_000  # (a kernel tick is 1-10 ms; larger here so that a loaded machine's ticks stay under it)

    async def main() -> list[bool]:
        monitor = asyncio_loop.monitor(asyncio.get_running_loop())
        monitor.request_started()
        await asyncio.sleep(0.05)
        seen = [monitor.lagging(tick)]  # answering within a tick: no
        time.sleep(0.12)  # blocked: the pending tick is overdue right now
        seen.append(monitor.lagging(tick))
        monitor.catch_up()  # a request noticed the block first (the tick is not due any more)...
        seen.append(monitor.lagging(tick))  # ... and the loop still counts as lagging
        await asyncio.sleep(0.05)
        seen.append(monitor.lagging(tick))  # for a while after
        return seen

    loop = new_loop()
    try:
        seen = loop.run_until_complete(main())
    finally:
        loop.close()
    assert seen == [False, True, True, True]


def test_tasks_spawned_by_a_request_are_timed_for_it_through_the_services_own_task_factory(recorded):
    made: list = []

    def services_factory(loop, coro, **kwargs):
        made.append(coro)
        return asyncio.Task(coro, loop=loop, **kwargs)

    async def child() -> str:
        end = time.thread_time() + 0.03
        while time.thread_time() < end:
            pass
        await asyncio.sleep(0)
        return inspect.getcoroutinestate(made[-1])  # the proxy answers for the coroutine

    async def main() -> tuple:
        loop = asyncio.get_running_loop()
        loop.set_task_factory(services_factory)
        monitor = asyncio_loop.monitor(loop)
        owner = asyncio_loop.Owner()
        asyncio_loop.adopt(owner)
        state = await asyncio.create_task(child())
        owner.done = True
        after = asyncio.create_task(asyncio.sleep(0))  # the request is over: not timed
        await after
        return owner, monitor, state

    owner, monitor, state = asyncio.run(main())
    assert [type(c).__name__ for c in made[:2]] == ["TimedCoroutine", "coroutine"]  # then asyncio.run's own
    assert state == inspect.CORO_RUNNING
    assert owner.cpu_ns >= 25e6
    assert [b.owner for b in monitor.blocks] == [owner.key]  # its 30 ms step blocked the loop, and is its own
