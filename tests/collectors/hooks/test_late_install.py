"""Every hook installed late, into a service that is already serving (what `latprof attach --inject` does), and removed again.

The services (gunicorn sync and gthread workers serving Flask, uvicorn on asyncio and uvloop
serving Starlette, each with a real PostgreSQL pool made before the hooks) start without
latprof; on a file the test writes, a thread of the service's own starts recording and installs
every hook (`apps/late.py`), then removes them. What is checked: requests that start after the
install are recorded from their arrival at the socket, requests already in flight are left
out (no root, no stray segment), pools made before are seen and named, and after `uninstall()`
every patched attribute is the very same object as before, latprof's task factory and loop
probe are gone, and the process has the threads it had. In this process: the pieces that make
that so (the loop monitors' close, names bound before install, pools named from their engine,
each hook's `late_coverage()`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvloop
from recording import recording
from services import PG_DSN, require_pg

from apps.harness import ROOT, Capture, Pending, free_port, get, wait_healthy
from latprof.capture.reader import read_captures
from latprof.capture.writer import THREAD_NAME as WRITER_THREAD
from latprof.collectors.hooks import _scaffold, asyncio_loop, bootstrap, locks, runtime, sleeps
from latprof.collectors.hooks import sqlalchemy as sqlalchemy_hook
from latprof.collectors.hooks.wsgi import BACKLOG_WAIT, THREADPOOL_WAIT
from latprof.events import QualityRecord, Segment
from latprof.layers import DB_POOL, DB_QUERY, EVENT_LOOP, QUEUE
from latprof.semconv import DB_POOL_NAME, DB_SYSTEM_NAME, NOTE_ERROR

ALL_HOOKS = sorted(bootstrap.HOOKS)
#: How close a request's recorded start must be to when the client sent it (its arrival).
ARRIVAL_TOLERANCE_MS = 100  # the queued requests wait about 1 s: recorded from the handler, they would miss by that
CONTROL_TIMEOUT_S = 30.0


# --- a service started without latprof, and its control files --------------------------------------


@dataclass
class LateService:
    """A server command (with `{port}`) run without latprof, with `$LATE_CONTROL_DIR` for `apps/late.py`."""

    command: list[str]
    workdir: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    answers: dict[str, Any] = field(default_factory=dict)
    pending: list[Pending] = field(default_factory=list)

    @property
    def control(self) -> Path:
        return self.workdir / "control"

    @property
    def capture_path(self) -> Path:
        return self.workdir / "capture.jsonl"

    def start(self) -> LateService:
        self.control.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.log = open(self.workdir / "server.log", "wb")
        env = {**os.environ, "LATE_CONTROL_DIR": str(self.control), "LATE_PG": PG_DSN}
        self.proc = subprocess.Popen([a.format(port=self.port) for a in self.command], cwd=ROOT, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip
        if not wait_healthy(self.proc, self.port, self.output):
            raise AssertionError(f"the service did not start: {self.output()}")
        return self

    def ask(self, name: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write the control file `name`; the service's answer (`name.json`)."""
        partial = self.control / f"{name}.tmp"
        partial.write_text(json.dumps(body or {}))
        partial.rename(self.control / name)
        answer, failed = self.control / f"{name}.json", self.control / "failed.json"
        deadline = time.monotonic() + CONTROL_TIMEOUT_S
        while not answer.exists():
            if failed.exists():
                raise AssertionError(f"the service's control thread failed: {failed.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no answer to {name}: {self.output()}")
            time.sleep(0.01)
        self.answers[name] = json.loads(answer.read_text())
        return self.answers[name]

    def install(self) -> dict[str, Any]:
        return self.ask("install", {"hooks": ALL_HOOKS, "capture": str(self.capture_path)})

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        finally:
            self.log.close()

    def send(self, path: str) -> Pending:
        """A request on a connection of its own, closed at the end of the session whatever happens."""
        pending = Pending(self.port, path)
        self.pending.append(pending)
        return pending

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        for pending in self.pending:
            pending.sock.close()
        if not self.log.closed:
            self.log.close()

    def output(self) -> str:
        try:
            return (self.workdir / "server.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def capture(self) -> Capture:
        return Capture(read_captures([self.capture_path]))


def answered(path: str, port: int) -> None:
    assert get(port, path).status in (200, 202), path


def stray_segments(cap: Capture) -> list[Segment]:
    """Segments of no recorded request: what a request that was half recorded would leave."""
    roots = {r.request_id for r in cap.requests}
    return [s for rid, found in cap.data.segments_by_request.items() if rid not in roots for s in found]


def pool_segments(cap: Capture, route: str, name: str) -> list[Segment]:
    return [s for r in cap.routes(route) for s in cap.segments(r, DB_POOL) if s.name == name]


def check_removed_cleanly(service: LateService) -> None:
    """After every hook's uninstall: the very same objects everywhere, and the threads the service had."""
    installed, removed = service.answers["install"], service.answers["uninstall"]
    assert installed["installed"] == ALL_HOOKS
    assert len(installed["patched"]) >= 25 and installed["scaffold_patched"] >= 25
    assert removed["not_restored"] == [], removed["not_restored"][:20]
    assert removed["restored"] == len(installed["patched"])
    assert removed["threads_after"] == removed["threads_before"]
    assert WRITER_THREAD not in removed["threads_after"]["names"]
    assert removed["errors"] == {}
    for name, sentence in installed["coverage"].items():
        assert sentence.endswith(".") and "\n" not in sentence and len(sentence) > 40, (name, sentence)


# --- gunicorn: sync and gthread workers ------------------------------------------------------------

WSGI_APP = "tests.collectors.hooks.apps.late_wsgi:app"
CHAT = "GET /chat/<int:chat_id>"


class WsgiSession:
    """One gunicorn worker: in-flight requests while the hooks come, requests queued behind them, the pools, the removal."""

    def __init__(self, service: LateService, worker_class: str, threads: int) -> None:
        self.service = service
        self.worker_class = worker_class
        self.threads = threads

    def run(self) -> None:
        port = self.service.port
        for path in ("/db?ms=1", "/orm?ms=1", "/cache", "/chat/1?ms=1"):
            answered(path, port)
        warm = [self.service.send("/chat/2?ms=200") for _ in range(self.threads)]  # every worker thread exists before
        assert [p.response().status for p in warm] == [200] * self.threads

        # Every worker thread busy with a request that began before the hooks.
        self.in_flight = [self.service.send("/inflight?ms=1200") for _ in range(self.threads)]
        time.sleep(0.2)
        self.installed = self.service.install()
        self.queued = []
        for i in range(3):  # they wait for a free worker (thread) until the in-flight requests end
            self.queued.append(self.service.send(f"/chat/{10 + i}?ms=1"))
            time.sleep(0.05)
        # Read at once, each on a thread of its own: gthread's graceful close lingers until the client closes.
        with ThreadPoolExecutor(len(self.in_flight) + len(self.queued)) as readers:
            done = list(readers.map(Pending.response, [*self.in_flight, *self.queued]))
        self.in_flight_done = done[: len(self.in_flight)]
        assert [r.status for r in done] == [200] * (self.threads + 3)
        for path in ("/db?ms=20", "/orm?ms=20", "/cache") * 2:
            answered(path, port)
        self.service.ask("uninstall")
        for _ in range(2):
            answered("/after", port)
        self.service.stop()
        self.capture = self.service.capture()


@pytest.fixture(scope="module", params=[("sync", 1), ("gthread", 2)], ids=["sync", "gthread"])
def wsgi_session(request: Any, tmp_path_factory: Any) -> Any:
    require_pg()
    worker_class, threads = request.param
    command = [sys.executable, "-m", "gunicorn", WSGI_APP, "--bind", "127.0.0.1:{port}", "--workers", "1",
               "--worker-class", worker_class, "--threads", str(threads), "--no-control-socket", "--log-level", "warning",
               "--graceful-timeout", "10"]  # fmt: skip
    service = LateService(command, tmp_path_factory.mktemp(f"late-{worker_class}")).start()
    try:
        session = WsgiSession(service, worker_class, threads)
        session.run()
        yield session
    finally:
        service.kill()


@pytest.mark.slow
def test_wsgi_requests_in_flight_at_install_are_left_out_and_later_ones_recorded_from_arrival(wsgi_session: WsgiSession) -> None:
    cap, installed = wsgi_session.capture, wsgi_session.installed
    assert "Found 1 running gunicorn worker" in installed["coverage"]["wsgi"]
    # The in-flight requests ended after the install, and were not recorded: no root, no stray segment.
    assert all(r.done_ns > installed["installed_ns"] for r in wsgi_session.in_flight_done)
    routes = sorted({r.route for r in cap.requests})
    assert routes == sorted({CHAT, "GET /db", "GET /orm", "GET /cache"}), routes
    assert stray_segments(cap) == []
    assert len(cap.routes(CHAT)) == 3 and len(cap.requests) == 9
    # Queued behind the in-flight requests, each starts when its bytes arrived, with the wait before the worker.
    waits = BACKLOG_WAIT if wsgi_session.worker_class == "sync" else THREADPOOL_WAIT
    for pending in wsgi_session.queued:
        root = cap.matching(CHAT, pending.sent_ns, tolerance_ms=ARRIVAL_TOLERANCE_MS)
        queued = cap.segments(root, QUEUE)
        assert waits in {s.name for s in queued}, [(s.name, s.layer) for s in cap.segments(root)]
        assert min(s.start_ns for s in queued) == root.start_ns
        # ... until a worker (thread) was free: when the in-flight requests ended
        assert max(s.end_ns for s in queued) >= min(r.done_ns for r in wsgi_session.in_flight_done) - 100e6


@pytest.mark.slow
def test_wsgi_pools_made_before_the_install_are_seen_and_named(wsgi_session: WsgiSession) -> None:
    cap = wsgi_session.capture
    checkouts = pool_segments(cap, "GET /db", "psycopg_pool checkout")
    assert len(checkouts) == 2 and {s.attrs[DB_POOL_NAME] for s in checkouts} == {"late-pool"}
    orm = pool_segments(cap, "GET /orm", "sqlalchemy checkout")
    assert len(orm) == 2 and {s.attrs[DB_POOL_NAME] for s in orm} == {"postgresql://127.0.0.1:5432/test"}
    assert {s.attrs[DB_SYSTEM_NAME] for s in orm} == {"postgresql"}
    for route in ("GET /db", "GET /orm"):
        for root in cap.routes(route):
            assert [s.name for s in cap.segments(root, DB_QUERY)] == ["SELECT"], route
    for root in cap.routes("GET /cache"):
        assert sorted(s.name for s in cap.segments(root, DB_QUERY)) == ["GET", "SET"]


@pytest.mark.slow
def test_wsgi_uninstall_puts_the_workers_application_and_every_attribute_back(wsgi_session: WsgiSession) -> None:
    service = wsgi_session.service
    installed, removed = service.answers["install"], service.answers["uninstall"]
    (before,) = installed["probe"]["workers"]
    (after,) = removed["probe"]["workers"]
    assert after["wsgi"] == before["wsgi"]
    expected = {"gunicorn.workers.base.Worker.load_wsgi", "flask.ctx.RequestContext.match_request", "threading.Lock",
                "threading.RLock", "time.sleep", "psycopg_pool.pool.ConnectionPool.getconn", "redis.retry.sleep",
                "psycopg_pool.pool.sleep", "werkzeug.routing.map.Lock", "sqlalchemy.pool.impl.QueuePool._do_get"}  # fmt: skip
    if wsgi_session.worker_class == "gthread":
        expected.add("gunicorn.workers.gthread.ThreadWorker.enqueue_req")
    assert expected <= set(installed["patched"]), sorted(expected - set(installed["patched"]))
    check_removed_cleanly(service)


@pytest.mark.slow
def test_wsgi_the_running_workers_application_was_wrapped_while_recording(tmp_path: Path) -> None:
    """The probe while the hooks record: the worker's application is latprof's wrapper of the very application it had."""
    require_pg()
    command = [sys.executable, "-m", "gunicorn", WSGI_APP, "--bind", "127.0.0.1:{port}", "--workers", "1",
               "--no-control-socket", "--log-level", "warning"]  # fmt: skip
    service = LateService(command, tmp_path).start()
    try:
        before = service.install()["probe"]["workers"]
        during = service.ask("probe")["workers"]
        after = service.ask("uninstall")["probe"]["workers"]
        answered("/after", service.port)
        service.stop()
    finally:
        service.kill()
    assert len(before) == len(during) == len(after) == 1
    assert during[0]["wsgi"] != before[0]["wsgi"] and during[0]["wraps"] == before[0]["wsgi"]
    assert after[0]["wsgi"] == before[0]["wsgi"]
    # No request between the install and the uninstall (the writer wrote no file), /after not recorded.
    assert not service.capture_path.exists() or service.capture().requests == []


# --- uvicorn: asyncio and uvloop ---------------------------------------------------------------

ASGI_APP = "tests.collectors.hooks.apps.late_asgi:app"
BLOCK_MS = 900


class AsgiSession:
    """One uvicorn: a request in flight and the loop blocked while the hooks come, requests queued behind the block, the removal."""

    def __init__(self, service: LateService, loop: str) -> None:
        self.service = service
        self.loop = loop

    def run(self) -> None:
        port = self.service.port
        for path in ("/db?ms=1", "/chat/1?ms=1", "/spawn?ms=1"):
            answered(path, port)
        self.in_flight = self.service.send("/inflight?ms=1500")
        time.sleep(0.1)
        self.blocker = self.service.send(f"/block?ms={BLOCK_MS}")
        time.sleep(0.15)  # the loop is blocked now, by a request that began before the hooks
        self.installed = self.service.install()
        self.arriving = []
        for i in range(3):  # they wait in the socket until the loop is free again
            self.arriving.append(self.service.send(f"/chat/{10 + i}?ms=1"))
            time.sleep(0.03)
        self.blocker_done = self.blocker.response()
        assert self.blocker_done.status == 202
        if self.arriving[-1].sent_ns > self.blocker_done.done_ns - 100e6:
            pytest.fail("the requests meant to arrive while the loop was blocked came after the block: a slow install?"
                        f" (block sent at 0, install answered at {(self.installed['installed_ns'] - self.blocker.sent_ns) / 1e6:.0f} ms,"
                        f" the last request sent at {(self.arriving[-1].sent_ns - self.blocker.sent_ns) / 1e6:.0f} ms,"
                        f" the block's answer at {(self.blocker_done.done_ns - self.blocker.sent_ns) / 1e6:.0f} ms)")
        assert [p.response().status for p in self.arriving] == [200] * 3
        assert self.in_flight.response().status == 200
        for path in ("/db?ms=20", "/spawn?ms=10", "/chat/3?ms=5") * 2:
            answered(path, port)
        self.during = self.service.ask("probe")
        self.removed = self.service.ask("uninstall")
        for _ in range(2):
            answered("/after", port)
        self.service.stop()
        self.capture = self.service.capture()


@pytest.fixture(scope="module", params=[("asyncio", "h11"), ("uvloop", "httptools")], ids=["asyncio", "uvloop"])
def asgi_session(request: Any, tmp_path_factory: Any) -> Any:
    require_pg()
    loop, http = request.param
    command = [sys.executable, "-m", "uvicorn", ASGI_APP, "--host", "127.0.0.1", "--port", "{port}", "--loop", loop,
               "--http", http, "--log-level", "warning", "--no-access-log"]  # fmt: skip
    service = LateService(command, tmp_path_factory.mktemp(f"late-{loop}")).start()
    try:
        session = AsgiSession(service, loop)
        session.run()
        yield session
    finally:
        service.kill()


ASGI_CHAT = "GET /chat/{chat_id:int}"


@pytest.mark.slow
def test_asgi_requests_in_flight_at_install_are_left_out_and_later_ones_recorded_from_arrival(asgi_session: AsgiSession) -> None:
    cap, installed = asgi_session.capture, asgi_session.installed
    assert "(0 watched now)" in installed["coverage"]["asyncio_loop"]
    assert "protocol is loaded" in installed["coverage"]["asgi"]
    routes = sorted({r.route for r in cap.requests})
    assert routes == sorted({ASGI_CHAT, "GET /db", "GET /spawn"}), routes  # not /inflight, /block, /after
    assert stray_segments(cap) == []
    # The first requests after the install queued in the socket behind a block that began before
    # it: recorded from their arrival, the wait for the loop an `event_loop` segment.
    for pending in asgi_session.arriving:
        root = cap.matching(ASGI_CHAT, pending.sent_ns, tolerance_ms=ARRIVAL_TOLERANCE_MS)
        waited = cap.pre_handler(root)
        assert waited.layer == EVENT_LOOP and waited.start_ns == root.start_ns
        assert waited.end_ns >= asgi_session.blocker_done.done_ns - 150e6 or waited.end_ns - waited.start_ns >= 200e6


@pytest.mark.slow
def test_asgi_pools_and_tasks_of_the_running_service_are_seen(asgi_session: AsgiSession) -> None:
    cap = asgi_session.capture
    checkouts = pool_segments(cap, "GET /db", "psycopg_pool checkout")
    assert len(checkouts) == 2 and {s.attrs[DB_POOL_NAME] for s in checkouts} == {"late-pool"}
    for root in cap.routes("GET /db"):
        assert [s.name for s in cap.segments(root, DB_QUERY)] == ["SELECT"]
    # The tasks /spawn creates are timed for it through latprof's task factory, set on the running loop.
    for root in cap.routes("GET /spawn"):
        assert root.cpu_ns is not None and root.cpu_ns >= 5e6, root.cpu_ns
    during = asgi_session.during
    assert during["task_factory"] == "_install_task_factory.<locals>.latprof_task_factory" and during["monitors"] == 1
    assert WRITER_THREAD in during["threads"]["names"]  # (gone after the uninstall: see below)
    if asgi_session.loop == "asyncio":
        assert during["pending_ticks"] == 1


@pytest.mark.slow
def test_asgi_uninstall_stops_the_probe_restores_the_task_factory_and_every_attribute(asgi_session: AsgiSession) -> None:
    service = asgi_session.service
    before, after = service.answers["install"]["probe"], asgi_session.removed["probe"]
    assert before["task_factory"] is None and after["task_factory"] is None
    assert after["pending_ticks"] == 0 and after["watched"] == 0
    assert after["monitors"] == [{"closed": True, "running": False, "ticked": False}]
    protocol = "h11_impl" if asgi_session.loop == "asyncio" else "httptools_impl"
    expected = {f"uvicorn.protocols.http.{protocol}.RequestResponseCycle.run_asgi", "anyio.to_thread.run_sync",
                "asyncio.locks.Lock.acquire", "asyncio.tasks.sleep", "asyncio.sleep", "psycopg.waiting.sleep",
                "psycopg_pool.pool_async.AsyncConnectionPool.getconn", "threading.Thread.start"}  # fmt: skip
    assert expected <= set(service.answers["install"]["patched"]), sorted(expected - set(service.answers["install"]["patched"]))
    check_removed_cleanly(service)


# --- in this process: the pieces ------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_HOOKS)
def test_every_hook_says_in_one_sentence_what_it_misses_when_installed_late(name: str) -> None:
    sentence = bootstrap.HOOKS[name].late_coverage()
    assert isinstance(sentence, str) and sentence.endswith(".") and "\n" not in sentence and len(sentence) > 40
    assert sentence[0].isupper()


def test_late_coverage_never_raises() -> None:
    hook = _scaffold.Hook("late_test", [])
    with recording() as events:
        sentence = hook.late_coverage(lambda: str(1 / 0))
        runtime.report_errors(force=True)
    assert sentence == "What the late_test hook misses when installed late could not be told (ZeroDivisionError)."
    (error,) = [e for e in events if isinstance(e, QualityRecord) and e.kind == NOTE_ERROR]
    assert error.attrs["collector"] == "late_test"


class LoopThread:
    """A real event loop running forever on a thread of its own, as a server's is."""

    def __init__(self, new_loop: Any) -> None:
        self.loop = new_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, fn: Any) -> Any:
        """`fn()` on the loop's thread, inside a coroutine; its result."""

        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def pending_ticks(loop: Any) -> int:
    # scheduled, or due and moved to the ready queue in the very iteration that runs the probe (a busy machine)
    handles = [*getattr(loop, "_scheduled", ()), *getattr(loop, "_ready", ())]
    return sum(1 for h in handles if not h.cancelled() and isinstance(getattr(h._callback, "__self__", None), asyncio_loop.LoopMonitor))


def services_factory(loop: Any, coro: Any, **kwargs: Any) -> Any:
    return asyncio.Task(coro, loop=loop, **kwargs)


@pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_uninstall_stops_every_loops_probe_and_puts_back_its_own_task_factory(new_loop: Any) -> None:
    running = [LoopThread(new_loop), LoopThread(new_loop)]
    idle = new_loop()  # monitored, then no longer running when the hooks go
    try:
        running[0].run(lambda: running[0].loop.set_task_factory(services_factory))
        with recording():
            assert asyncio_loop.install() is True
            monitors = [lt.run(lambda lt=lt: asyncio_loop.monitor(asyncio.get_running_loop())) for lt in running]
            idle_monitor = idle.run_until_complete(_monitor_here())
            assert all(m is not None and m._running for m in [*monitors, idle_monitor])
            assert [lt.run(lt.loop.get_task_factory) for lt in running] == [monitors[0].task_factory, monitors[1].task_factory]
            assert sorted(map(id, asyncio_loop.monitors())) == sorted(map(id, [*monitors, idle_monitor]))
            asyncio_loop.uninstall()  # from this thread, not the loops'
            time.sleep(0.05)
            due = [m._due_ns for m in monitors]
            time.sleep(0.25)  # a probe still ticking reschedules itself every 100 ms
            assert [m._due_ns for m in monitors] == due
            assert all(m.closed and not m._running for m in [*monitors, idle_monitor])
            assert [lt.run(lt.loop.get_task_factory) for lt in running] == [services_factory, None]
            assert idle.get_task_factory() is None
            assert [lt.run(lambda lt=lt: pending_ticks(lt.loop)) for lt in running] == [0, 0]
            assert asyncio_loop.monitors() == []
            # A loop's next request starts a new monitor while recording goes on (an inbound hook still installed).
            again = running[1].run(lambda: asyncio_loop.monitor(asyncio.get_running_loop()))
            assert again is not None and again is not monitors[1] and again._running
        time.sleep(0.25)  # recording stopped: the new monitor closes itself at its next tick
        assert again.closed and running[1].run(running[1].loop.get_task_factory) is None
    finally:
        asyncio_loop.uninstall()
        for lt in running:
            lt.close()
        idle.close()


async def _monitor_here() -> Any:
    return asyncio_loop.monitor(asyncio.get_running_loop())


def test_a_new_monitor_counts_as_lagging_until_its_probe_measured_the_loop(recording_events: list[Any]) -> None:
    """Hooks installed into a loop that is already serving: its first requests may have queued, so TCP_INFO is read."""
    tick = 60_000_000

    async def main() -> list[bool]:
        monitor = asyncio_loop.monitor(asyncio.get_running_loop())
        seen = [monitor.lagging(tick)]  # no tick yet: cannot tell
        await asyncio.sleep(0.25)  # the idle probe (every 100 ms) ticked on a loop that answers at once
        seen.append(monitor.lagging(tick))
        return seen

    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(main()) == [True, False]
    finally:
        asyncio_loop.stop_monitors()
        loop.close()


@pytest.fixture
def recording_events() -> Any:
    with recording() as events:
        yield events


def test_names_modules_bound_before_install_point_at_the_wrappers_until_uninstall(recording_events: list[Any]) -> None:
    """`from time import sleep` / `from threading import Lock` in a module imported before the hooks."""
    module = types.ModuleType("late_install_bound_names")
    exec("from time import sleep\nfrom threading import Lock, RLock\nfrom asyncio import sleep as _sleep", module.__dict__)
    originals = dict(vars(module))
    sys.modules[module.__name__] = module
    try:
        for hook in (sleeps, locks):
            hook.uninstall()
            hook.install()
        assert getattr(module.sleep, _scaffold.MARK) is originals["sleep"]
        assert getattr(module._sleep, _scaffold.MARK) is originals["_sleep"]
        assert type(module.Lock()).__name__ == "_TimedLock" and type(module.RLock()).__name__ == "_TimedRLock"
        token = runtime.begin_request("GET /late", runtime.now_ns())
        module.sleep(0.01)
        runtime.end_request(token)
        assert [e.name for e in recording_events if isinstance(e, Segment)] == ["sleep"]
    finally:
        for hook in (sleeps, locks):
            hook.uninstall()
        del sys.modules[module.__name__]
    assert all(vars(module)[name] is originals[name] for name in ("sleep", "_sleep", "Lock", "RLock"))


def test_a_pool_of_an_engine_made_before_install_is_named_after_its_engine(tmp_path: Path, recording_events: list[Any]) -> None:
    from sqlalchemy import create_engine, text

    sqlalchemy_hook.uninstall()
    engine = create_engine(f"sqlite:///{tmp_path}/late.db")  # before the hook: Engine.__init__ did not tag its pool
    try:
        sqlalchemy_hook.install()
        token = runtime.begin_request("GET /late", runtime.now_ns())
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        runtime.end_request(token)
    finally:
        sqlalchemy_hook.uninstall()
        engine.dispose()
    (checkout,) = [e for e in recording_events if isinstance(e, Segment) and e.layer == DB_POOL]
    assert checkout.attrs[DB_POOL_NAME] == f"sqlite:///{tmp_path}/late.db" and checkout.attrs[DB_SYSTEM_NAME] == "sqlite"
