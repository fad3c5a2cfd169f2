"""The WSGI hook on a real gunicorn (sync and gthread workers) serving Flask, under `latprof run`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from services import PG_DSN, require_pg
from apps.harness import ROOT, Capture, GunicornServer, Pending, get
from latprof.collectors.hooks.wsgi import BACKLOG_WAIT, BEHIND_THE_PROXY, THREADPOOL_WAIT

from latprof.layers import QUEUE
from latprof.semconv import NOTE_HOOKS_LOADED, QUEUE_SOURCE

pytestmark = pytest.mark.slow  # real servers in subprocesses

APP = "tests.collectors.hooks.apps.wsgi_app:app"
CHAT = "GET /chat/<int:chat_id>"

#: (method, path, expected status, expected route), one after the other.
ROUTED = [
    ("GET", "/chat/7?ms=1", 200, CHAT),
    ("POST", "/chat/7", 201, "POST /chat/<int:chat_id>"),
    ("GET", "/boom", 500, "GET /boom"),
    ("GET", "/no/such/path/42", 404, "GET <unmatched>"),
    ("GET", "/file", 200, "GET /file"),
]


def start(tmp_path, **kw) -> GunicornServer:
    return GunicornServer(APP, "", "", tmp_path, **kw).start()


def queue_waits(cap: Capture, request, name: str) -> list:
    return [s for s in cap.segments(request, QUEUE) if s.name == name]


class SyncSession:
    """One sync worker: routes, a backlog behind a slow request, CPU, streaming, SIGTERM mid-request."""

    def __init__(self, server: GunicornServer):
        self.server = server
        self.sent: dict[str, int] = {}
        self.queued_sent_ns: list[int] = []
        self.header_s = 0.0

    def count(self, route: str, n: int = 1) -> None:
        self.sent[route] = self.sent.get(route, 0) + n

    def run(self) -> None:
        port = self.server.port
        for method, path, status, route in ROUTED:
            assert Pending(port, path, method=method).response().status == status, path
            self.count(route)
        assert get(port, "/cpu?ms=100").status == 200
        self.count("GET /cpu")
        stream = get(port, "/stream")
        assert stream.status == 200 and b"chunk 2" in stream.body
        self.count("GET /stream")
        self.header_s = time.time() - 0.3
        assert get(port, "/chat/8?ms=1", headers=[("X-Request-Start", f"t={self.header_s:.3f}")]).status == 200
        self.count(CHAT)

        # The only worker is busy for 400 ms: three requests sent meanwhile wait in the backlog.
        slow = Pending(port, "/chat/1?ms=400")
        time.sleep(0.1)
        queued = [Pending(port, f"/chat/{i}?ms=1") for i in range(2, 5)]
        assert [p.response().status for p in [slow, *queued]] == [200] * 4
        self.queued_sent_ns = [p.sent_ns for p in queued]
        self.count(CHAT, 4)

        in_flight = Pending(port, "/chat/9?ms=700")
        time.sleep(0.2)
        self.exit_code = self.server.stop()
        assert in_flight.response().status == 200
        self.count(CHAT)
        self.capture = self.server.capture()


@pytest.fixture(scope="module")
def sync_session(tmp_path_factory):
    server = start(tmp_path_factory.mktemp("wsgi-sync"))
    try:
        session = SyncSession(server)
        session.run()
        yield session
    finally:
        server.kill()


def test_every_request_has_one_root_with_its_route_template_and_status(sync_session):
    cap = sync_session.capture
    got: dict[str, int] = {}
    for r in cap.requests:
        got[r.route] = got.get(r.route, 0) + 1
    assert got.pop("GET /health") >= 1  # the harness's readiness probe
    assert got == sync_session.sent
    for method, path, status, route in ROUTED:
        assert status in {r.status_code for r in cap.routes(route)}, route
    assert not [r for r in cap.requests if "/42" in r.route or "/7" in r.route]  # never the raw path
    assert sync_session.exit_code == 0  # gunicorn's master exits 0 after a graceful stop on SIGTERM
    # The request in flight when SIGTERM reached latprof was answered, and recorded.
    (last,) = [r for r in cap.routes(CHAT) if r.duration_ns >= 650e6]
    assert last.status_code == 200
    assert not cap.data.warnings and not [q for q in cap.data.quality if q.kind == "error"]


def test_requests_that_waited_for_the_busy_worker_start_at_arrival_with_a_backlog_wait(sync_session):
    cap = sync_session.capture
    for sent_ns in sync_session.queued_sent_ns:
        r = cap.matching(CHAT, sent_ns, tolerance_ms=30)  # backdated to the arrival, not the handler call
        (wait,) = queue_waits(cap, r, BACKLOG_WAIT)
        assert wait.attrs[QUEUE_SOURCE] == "backlog" and wait.start_ns == r.start_ns
        # Sent 100 ms into a 400 ms request: about 300 ms in the backlog (the later ones a little more).
        assert 220e6 <= wait.end_ns - wait.start_ns <= 500e6, (wait.end_ns - wait.start_ns) / 1e6
    unqueued = [r for r in cap.routes("GET /cpu") + cap.routes("GET /stream")]
    assert unqueued and not [s for r in unqueued for s in cap.segments(r, QUEUE)]


def test_cpu_time_streaming_end_and_x_request_start(sync_session):
    cap = sync_session.capture
    (cpu,) = cap.routes("GET /cpu")
    assert 90e6 <= cpu.cpu_ns <= 200e6, cpu.cpu_ns / 1e6
    (stream,) = cap.routes("GET /stream")
    assert stream.duration_ns >= 150e6 and stream.cpu_ns < 50e6  # ends after the last chunk; sleeping is not CPU
    header = min(cap.routes(CHAT), key=lambda r: r.start_ns if r.start_ns >= sync_session.header_s * 1e9 - 5e6 else 1e30)
    (proxy,) = [s for s in cap.segments(header) if s.name == BEHIND_THE_PROXY]
    assert abs(proxy.start_ns - sync_session.header_s * 1e9) <= 2e6 and proxy.attrs[QUEUE_SOURCE] == "header"


def test_a_gthread_worker_records_the_wait_for_a_worker_thread(tmp_path):
    server = start(tmp_path, worker_class="gthread", threads=2)
    try:
        with ThreadPoolExecutor(6) as pool:
            statuses = list(pool.map(lambda i: get(server.port, f"/chat/{i}?ms=300").status, range(6)))
        assert statuses == [200] * 6
        server.stop()
        cap = server.capture()
    finally:
        server.kill()
    chats = cap.routes(CHAT)
    assert len(chats) == 6
    waits = sorted(
        sum(s.end_ns - s.start_ns for s in queue_waits(cap, r, THREADPOOL_WAIT)) / 1e6 for r in chats
    )
    # Two threads, six 300 ms requests at once: two start at once, two wait ~300 ms, two ~600 ms.
    assert waits[0] < 50 and waits[1] < 50, waits
    assert 200 <= waits[2] <= 450 and 200 <= waits[3] <= 450, waits
    assert 500 <= waits[4] <= 800 and 500 <= waits[5] <= 800, waits
    for r in chats:
        for s in queue_waits(cap, r, THREADPOOL_WAIT):
            assert s.attrs[QUEUE_SOURCE] == "threadpool"


@pytest.mark.parametrize("preload", [False, True], ids=["fork", "preload"])
def test_several_workers_all_record_into_one_capture_complete_after_sigterm(tmp_path, preload):
    server = start(tmp_path, workers=2, preload=preload)
    try:
        pids: set[str] = set()
        with ThreadPoolExecutor(4) as pool:  # concurrent requests reach both workers
            for _ in range(5):
                responses = list(pool.map(lambda i: get(server.port, "/pid?ms=0"), range(4)))
                pids |= {r.body.decode() for r in responses}
                if len(pids) == 2:
                    break
                time.sleep(0.05)
            slow = [pool.submit(get, server.port, "/chat/1?ms=50") for _ in range(8)]
            assert [f.result().status for f in slow] == [200] * 8
        assert len(pids) == 2, pids
        assert server.stop() == 0
        cap = server.capture()
    finally:
        server.kill()
    assert {str(r.pid) for r in cap.routes("GET /pid")} == pids
    assert len(cap.routes(CHAT)) == 8
    loaded = {q.pid for q in cap.data.quality if q.kind == NOTE_HOOKS_LOADED}
    assert {int(p) for p in pids} <= loaded
    assert not cap.data.warnings


def _drive_bursts(port: int, seconds: float) -> int:
    """Open-loop load: 8 requests a second of 40 ms each, and every second a burst of 10 at once."""
    stop = time.monotonic() + seconds
    sent = 0
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []

    def one(path: str) -> None:
        try:
            assert get(port, path).status == 200
        except BaseException as exc:
            errors.append(exc)

    tick = 0
    while time.monotonic() < stop:
        paths = [f"/chat/{tick}?ms=40"] * (11 if tick % 8 == 0 else 1)
        for path in paths:
            t = threading.Thread(target=one, args=(path,))
            t.start()
            threads.append(t)
            sent += 1
        tick += 1
        time.sleep(0.125)
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors[:3]
    return sent


def test_sync_workers_saturated_by_bursts_give_the_queue_verdict(tmp_path):
    server = start(tmp_path, workers=2)
    try:
        sent = _drive_bursts(server.port, 9.0)
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
    assert verdict["layer"] == "queue" and verdict["rule"] == "request-queueing", verdict
    assert verdict["share_of_tail_excess"] >= 0.8
    (finding,) = [f for f in report["findings"] if f["rule"] == "request-queueing"]
    assert list(finding["evidence"]["queue_sources"])[0] == "backlog"


def test_gunicorn_threads_on_a_small_psycopg_pool_give_the_db_pool_verdict(tmp_path):
    """gthread, 6 threads, a psycopg_pool of 2 connections held 80 ms per request; bursts wait for them."""
    require_pg()
    server = GunicornServer(
        APP, "", "", tmp_path, worker_class="gthread", threads=6, env={"WSGI_APP_PG": PG_DSN, "WSGI_APP_POOL_MAX": "2"}
    ).start()
    try:
        assert get(server.port, "/db?ms=1").status == 200  # opens the pool
        sent = 0
        with ThreadPoolExecutor(6) as pool:
            for tick in range(60):
                n = 6 if tick % 6 == 0 else 1  # a burst of 6 every 0.6 s, else one request per 0.1 s
                futures = [pool.submit(get, server.port, "/db?ms=80") for _ in range(n)]
                sent += n
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
    assert verdict["layer"] == "db.pool" and verdict["rule"] == "db-pool-exhaustion", verdict
    (finding,) = [f for f in report["findings"] if f["rule"] == "db-pool-exhaustion"]
    assert finding["evidence"]["pool_max"] == 2 and finding["evidence"]["pools"] == ["wsgi-app"]


def test_gunicorn_sync_workers_fanning_out_on_a_small_psycopg_pool_give_the_db_pool_verdict(tmp_path):
    """2 sync workers, each with a psycopg_pool of 2 connections; every request runs its lookups in
    parallel on a thread pool (the `threads` hook keeps them in the request): most requests make 2
    lookups, every fifth makes 8, and 6 of those wait for a connection."""
    require_pg()
    server = GunicornServer(
        APP, "", "", tmp_path, workers=2, env={"WSGI_APP_PG": PG_DSN, "WSGI_APP_POOL_MAX": "2"}
    ).start()
    try:
        for _ in range(4):
            assert get(server.port, "/fanout?n=2&ms=1").status == 200  # opens both workers' pools
        time.sleep(2.1)  # what follows is past the analysis' warm-up
        with ThreadPoolExecutor(2) as clients:  # two at a time: the two workers, no backlog
            paths = [f"/fanout?n={8 if i % 5 == 0 else 2}&ms=25" for i in range(200)]
            assert [r.status for r in clients.map(lambda p: get(server.port, p), paths)] == [200] * len(paths)
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
    print(f"verdict {verdict}; latency {report['latency_ms']}")
    assert verdict["layer"] == "db.pool" and verdict["rule"] == "db-pool-exhaustion", verdict
    (finding,) = [f for f in report["findings"] if f["rule"] == "db-pool-exhaustion"]
    assert finding["evidence"]["pool_max"] == 2 and finding["evidence"]["pools"] == ["wsgi-app"]
    assert report["collection"]["coverage"] > 0.8, report["collection"]
