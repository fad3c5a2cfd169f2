"""/proc signals of a real gunicorn from outside: the accept backlog behind a busy sync worker, accepts, connections."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hooks.apps import services  # tests/hooks/apps: the local services the tests use
from latprof.collectors import procfs

pytestmark = pytest.mark.slow  # real servers in subprocesses

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def gunicorn():
    port = free_port()
    master = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "tests.hooks.apps.wsgi_app:app", "-b", f"127.0.0.1:{port}", "-w", "1",
         "--no-control-socket", "--log-level", "warning", "--backlog", "64"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            break
        except OSError:
            assert time.monotonic() < deadline and master.poll() is None, "gunicorn did not start"
            time.sleep(0.1)
    try:
        yield master, port
    finally:
        master.terminate()
        master.wait(20)


def send(port: int, path: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    return s


def test_connections_behind_a_busy_sync_worker_are_the_masters_accept_queue(gunicorn):
    master, port = gunicorn
    assert procfs.listening_ports(master.pid) == {port}
    counter = procfs.AcceptCounter(master.pid, {port})
    counter.poll()
    assert procfs.accept_queues(master.pid, {port}) == {port: 0}
    busy = send(port, "/chat/1?ms=1500")  # the only worker takes it
    time.sleep(0.3)
    assert counter.poll() == 1  # accepted by the worker
    queued = [send(port, "/chat/2?ms=1") for _ in range(5)]
    time.sleep(0.3)
    assert procfs.accept_queues(master.pid, {port}) == {port: 5}
    assert counter.poll() == 0  # waiting in the backlog: not accepted yet
    for s in [busy, *queued]:
        s.settimeout(10)
        assert s.recv(100).startswith(b"HTTP/1.1 200")
        s.close()
    time.sleep(0.2)
    assert procfs.accept_queues(master.pid, {port}) == {port: 0}


def test_outbound_connections_by_remote_endpoint():
    reason = services.pg_unreachable()
    if reason is not None:
        services.missing(reason, "PostgreSQL is")
    scenario = subprocess.Popen([sys.executable, str(Path(__file__).with_name("scenarios.py")), "psycopg_pool_wait"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert scenario.stdout is not None and scenario.stdout.readline().startswith("READY")
        endpoints = procfs.remote_endpoints([scenario.pid])
    finally:
        scenario.kill()
        scenario.communicate()
    pg = {k: n for k, n in endpoints.items() if k[1] == 5432 and k[2] == "ESTABLISHED"}
    assert sum(pg.values()) == 1, endpoints  # the pool's only connection, held by the holder thread
