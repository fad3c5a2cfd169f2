"""/proc signals of a real gunicorn from outside: the accept backlog behind a busy sync worker, accepts, connections."""

from __future__ import annotations

import socket
import time

import pytest

from attach.procs import end, free_port, gunicorn, park, start_server
import services  # tests/services.py: the local services the tests use
from latprof.collectors.attach import procfs

pytestmark = pytest.mark.slow  # real servers in subprocesses


@pytest.fixture
def one_sync_worker():
    port = free_port()
    master = start_server(gunicorn(port, "-w", "1", "--backlog", "64"), port)
    try:
        yield master, port
    finally:
        master.terminate()
        master.wait(20)


def send(port: int, path: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    return s


def test_connections_behind_a_busy_sync_worker_are_the_masters_accept_queue(one_sync_worker):
    master, port = one_sync_worker
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
    scenario, _ = park("psycopg_pool_wait")
    try:
        endpoints = procfs.remote_endpoints([scenario.pid])
    finally:
        end(scenario)
    pg = {k: n for k, n in endpoints.items() if k[1] == 5432 and k[2] == "ESTABLISHED"}
    assert sum(pg.values()) == 1, endpoints  # the pool's only connection, held by the holder thread
