"""/proc signals of a real gunicorn from outside: the accept backlog behind a busy sync worker, accepts, connections."""

from __future__ import annotations

import os
import socket
import time

import pytest

from attach.procs import end, free_port, gunicorn, park, start_server
import services  # tests/services.py: the local services the tests use
from latprof.collectors.attach import procfs, sockdiag

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
        # the same from a sock_diag dump matched to the process's descriptors (what attach reads)
        from_dump = procfs.remote_endpoints([scenario.pid], sockets=sockdiag.tcp_sockets(scenario.pid))
    finally:
        end(scenario)
    pg = {k: n for k, n in endpoints.items() if k[1] == 5432 and k[2] == "ESTABLISHED"}
    assert sum(pg.values()) == 1, endpoints  # the pool's only connection, held by the holder thread
    assert from_dump == endpoints


def test_a_timed_futex_wait_beside_a_running_thread_is_marked_a_gil_wait_and_an_untimed_one_is_not():
    """Real threads of this process, read from /proc: one waits with a timeout (an Event, as a
    thread waits for the GIL: timed), one in `Lock.acquire()` (untimed). Only the timed one, and
    only while another thread runs, is a GIL wait."""
    import threading

    from latprof.collectors.attach import pyspy

    held, event = threading.Lock(), threading.Event()
    held.acquire()
    tids: dict[str, int] = {}

    def timed() -> None:
        tids["timed"] = threading.get_native_id()
        event.wait(60)

    def untimed() -> None:
        tids["untimed"] = threading.get_native_id()
        held.acquire()
        held.release()

    threads = [threading.Thread(target=timed, daemon=True), threading.Thread(target=untimed, daemon=True)]
    for t in threads:
        t.start()
    try:
        pid = os.getpid()
        deadline = time.monotonic() + 10
        while not (len(tids) == 2 and all((pyspy.wchan(pid, t) or "").startswith("futex") for t in tids.values())):
            assert time.monotonic() < deadline, {k: pyspy.wchan(pid, t) for k, t in tids.items()}
            time.sleep(0.01)
        assert pyspy.timed_futex(pid, tids["timed"]) and not pyspy.timed_futex(pid, tids["untimed"])
        waits = {tid: pyspy.wchan(pid, tid) or "" for tid in tids.values()}
        running = threading.get_native_id()  # this thread, said to be running
        marked = pyspy.mark_gil_waits(pid, {**waits, running: "0"})
        assert marked[tids["timed"]].endswith("+gil") and not marked[tids["untimed"]].endswith("+gil"), marked
        assert pyspy.mark_gil_waits(pid, waits) == waits  # nothing else running: no GIL to wait for
    finally:
        event.set()
        held.release()
        for t in threads:
            t.join(5)
