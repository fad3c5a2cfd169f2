"""The ASGI hook on a real uvicorn + FastAPI (and a mounted Starlette app) under `latprof run`, h11/asyncio and httptools/uvloop."""

from __future__ import annotations

import signal
import time

import pytest

from apps.harness import serve_session, CONFIGS, Capture, Pending, Server, get

from latprof.collectors.hooks import asgi
from latprof.collectors.hooks._async_request import BEHIND_THE_PROXY, BLOCKED_BY_OTHERS, HELD_THE_LOOP, PRE_HANDLER
from latprof.collectors.hooks.asgi import THREADPOOL_WAIT
from latprof.layers import EVENT_LOOP, QUEUE
from latprof.semconv import QUEUE_SOURCE

pytestmark = pytest.mark.slow  # real servers in subprocesses, timing-sensitive

APP = "tests.collectors.hooks.apps.app:app"
SYNC_REQUESTS = 8  # to a `def` endpoint sleeping 200 ms, with 2 worker threads (the app's lifespan sets it)

#: (method, path, expected status, expected route), sent one after the other.
ROUTED = [
    ("GET", "/chat/7?ms=1", 200, "GET /chat/{chat_id}"),
    ("POST", "/chat/7", 201, "POST /chat/{chat_id}"),
    ("GET", "/items/abc", 200, "GET /items/{item_id}"),
    ("GET", "/items/missing", 404, "GET /items/{item_id}"),
    ("GET", "/boom", 500, "GET /boom"),
    ("GET", "/plain/hello/bob", 200, "GET /plain/hello/{name}"),
    ("GET", "/no/such/path/42", 404, "GET <unmatched>"),
    ("GET", "/stream", 200, "GET /stream"),
    ("GET", "/block?ms=100", 200, "GET /block"),  # blocks the loop from a child task (the HTTP middleware's)
]


class Session:
    """One server's traffic and its capture, shared by the tests of one configuration."""

    def __init__(self, server: Server):
        self.server = server
        self.sent: dict[str, int] = {}  # route -> how many requests the client sent
        self.header_sent_s = 0.0
        self.sync_responses: list = []
        self.exit_code = 0
        self.capture: Capture

    def count(self, route: str) -> None:
        self.sent[route] = self.sent.get(route, 0) + 1

    def run(self) -> None:
        port = self.server.port
        for method, path, status, route in ROUTED:
            response = Pending(port, path, method=method).response()
            assert response.status == status, (path, response.status, response.body[:200])
            self.count(route)

        self.header_sent_s = time.time() - 0.3
        assert get(port, "/chat/8?ms=1", headers=[("X-Request-Start", f"t={self.header_sent_s:.3f}")]).status == 200
        self.count("GET /chat/{chat_id}")
        for path, route in (("/cpu?ms=100", "GET /cpu"), ("/cpu-sync?ms=100", "GET /cpu-sync")):
            assert get(port, path).status == 200
            self.count(route)

        pending = [Pending(port, "/sync?ms=200") for _ in range(SYNC_REQUESTS)]
        self.sync_responses = [p.response() for p in pending]
        assert [r.status for r in self.sync_responses] == [200] * SYNC_REQUESTS
        self.sent["GET /sync"] = SYNC_REQUESTS

        # Stopped while a request is in flight: uvicorn finishes it, then re-raises SIGTERM.
        in_flight = Pending(port, "/sleep?ms=700")
        time.sleep(0.2)
        self.exit_code = self.server.stop()
        assert in_flight.response().status == 200
        self.count("GET /sleep")
        self.capture = self.server.capture()


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: "+".join(c))
def session(request, tmp_path_factory):
    yield from serve_session(request, tmp_path_factory, APP, "asgi", Session)


def test_routes_are_templates_and_carry_status_codes(session):
    cap = session.capture
    for method, path, status, route in ROUTED:
        assert status in {r.status_code for r in cap.routes(route)}, (route, [(r.route, r.status_code) for r in cap.requests])
    assert not [r for r in cap.requests if "bob" in r.route or "/42" in r.route or "missing" in r.route]  # never the raw path
    assert {r.status_code for r in cap.routes("GET /sync")} == {200}


def test_every_request_has_one_root_with_a_unique_id_also_when_stopped_mid_request(session):
    cap = session.capture
    assert session.exit_code == 128 + signal.SIGTERM
    got: dict[str, int] = {}
    for r in cap.requests:
        got[r.route] = got.get(r.route, 0) + 1
    assert got.pop("GET /health") >= 1  # the harness's readiness probe
    assert got == session.sent
    ids = [r.request_id for r in cap.requests]
    assert len(ids) == len(set(ids))
    (sleeper,) = cap.routes("GET /sleep")
    assert sleeper.status_code == 200 and sleeper.duration_ns >= 650e6
    assert not cap.data.warnings and not [q for q in cap.data.quality if q.kind == "error"]


def test_segments_lie_within_their_request_and_a_late_handler_start_is_event_loop(session):
    cap = session.capture
    for r in cap.requests:
        for s in cap.segments(r):
            assert r.start_ns <= s.start_ns < s.end_ns <= r.end_ns, (r, s)
        # Waiting for the loop before the handler is recorded from 1 ms on (TCP_INFO's resolution),
        # from the arrival: the request's start, or the end of its time behind the proxy.
        arrival = max([r.start_ns] + [q.end_ns for q in cap.segments(r, QUEUE) if q.name == BEHIND_THE_PROXY])
        by_id = {s.segment_id: s for s in cap.segments(r)}
        for s in cap.segments(r, EVENT_LOOP):
            assert s.name in (PRE_HANDLER, BLOCKED_BY_OTHERS), s  # others: a starved server
            if s.name == PRE_HANDLER:
                assert s.parent_id is None and s.start_ns == arrival and s.end_ns - s.start_ns >= 1e6
            elif s.parent_id is not None:  # the loop blocked while the request awaited something: inside that step
                parent = by_id[s.parent_id]
                assert parent.start_ns <= s.start_ns < s.end_ns <= parent.end_ns, (parent, s)


def test_sync_endpoints_queue_for_a_threadpool_token(session):
    cap = session.capture
    sync = cap.routes("GET /sync")
    waits = sorted(sum(s.end_ns - s.start_ns for s in cap.segments(r, QUEUE)) / 1e6 for r in sync)
    for r in sync:
        assert {(s.name, s.attrs.get(QUEUE_SOURCE)) for s in cap.segments(r, QUEUE)} <= {(THREADPOOL_WAIT, "threadpool")}
    # 8 requests, 2 threads, 200 ms each: the 2 first do not wait, then about 200, 200, 400, 400, 600, 600.
    assert sum(1 for w in waits if w >= 120) >= 5, waits
    assert waits[-1] >= 450, waits
    assert waits[0] < 100, waits
    for r in sync:  # the wait is inside the request, after its arrival
        for s in cap.segments(r, QUEUE):
            assert r.start_ns <= s.start_ns < s.end_ns <= r.end_ns


def test_x_request_start_moves_the_start_to_the_proxy_and_is_queue(session):
    cap = session.capture
    (r,) = [r for r in cap.routes("GET /chat/{chat_id}") if cap.segments(r, QUEUE)]
    (queue,) = cap.segments(r, QUEUE)
    assert queue.name == BEHIND_THE_PROXY and queue.attrs[QUEUE_SOURCE] == "header"
    assert abs(r.start_ns / 1e9 - session.header_sent_s) < 0.002  # the header's own millisecond resolution
    assert queue.start_ns == r.start_ns
    assert 250 <= (queue.end_ns - queue.start_ns) / 1e6 <= 1000
    assert (r.end_ns - r.start_ns) / 1e6 >= 300


def test_cpu_time_is_the_requests_own(session):
    cap = session.capture
    (cpu,) = cap.routes("GET /cpu")
    (cpu_sync,) = cap.routes("GET /cpu-sync")
    for r in (cpu, cpu_sync):  # 100 ms of CPU burnt on the loop, and in a worker thread
        assert r.cpu_ns is not None and 50e6 <= r.cpu_ns <= r.duration_ns * 1.05, (r.route, r.cpu_ns, r.duration_ns)
    for r in cap.routes("GET /sync"):  # sleeping in a thread is no CPU
        assert r.cpu_ns is not None and r.cpu_ns < 50e6
    (block,) = cap.routes("GET /block")  # nor is a blocking sleep on the loop (one 100 ms step)
    assert block.cpu_ns is not None and block.cpu_ns < 30e6 and block.end_ns - block.start_ns >= 100e6


def test_on_a_unix_socket_requests_start_when_read_and_a_warning_says_so_once(tmp_path):
    server = Server("tests.collectors.hooks.apps.plain:app", "asyncio", "h11", tmp_path, uds=True).start()
    try:
        for name in ("ann", "bob", "cy"):
            assert get(server.address, f"/hello/{name}").status == 200
        server.stop()
    finally:
        server.kill()
    cap = server.capture()
    assert [r.route for r in cap.requests if r.route != "GET /health"] == ["GET /hello/{name}"] * 3
    assert {r.status_code for r in cap.requests} == {200}
    warnings = [q for q in cap.data.quality if q.kind == "warning"]
    assert len(warnings) == 1 and "TCP_INFO" in warnings[0].message, cap.data.quality


def test_a_request_that_blocks_the_loop_from_a_child_task_is_named_not_charged(session):
    cap = session.capture
    (blocker,) = cap.routes("GET /block")
    assert cap.layer_ms(blocker, EVENT_LOOP) < 20, cap.segments(blocker)
    held = [s for s in cap.segments(blocker) if s.name == HELD_THE_LOOP]
    assert len(held) == 1 and held[0].layer is None and (held[0].end_ns - held[0].start_ns) >= 95e6


def test_the_route_template_is_found_by_endpoint_where_starlette_does_not_name_the_route():
    from starlette.routing import Mount, Route, Router

    async def hello(request):  # pragma: no cover - never called
        pass

    router = Router([Mount("/api/{version}", routes=[Route("/hello/{name}", hello)])])
    # What Starlette's router leaves in the scope when it does not set scope["route"].
    scope = {"method": "GET", "router": router, "endpoint": hello, "root_path": "/api/v2", "app_root_path": ""}
    assert asgi._route(scope) == "GET /api/{version}/hello/{name}"
    assert asgi._route({"method": "POST", "router": router}) == "POST <unmatched>"
    assert asgi._route({"method": "GET"}) == "GET <no route>"
