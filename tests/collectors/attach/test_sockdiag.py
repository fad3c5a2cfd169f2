"""The socket census from netlink sock_diag, on real TCP connections on 127.0.0.1 whose every byte the test sends."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Iterator

import pytest

from latprof.collectors.attach import procfs, sockdiag
from latprof.collectors.attach.sockdiag import InboundCount, OutboundCount, TcpSocket

LOCAL = "127.0.0.1"
#: Longer than a kernel tick (1-10 ms), so that two events this far apart are told apart.
GAP_S = 0.05


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    """Every socket a test opens goes in here and is closed after it."""
    opened: list[socket.socket] = []
    yield opened
    for s in opened:
        s.close()


def listener(opened: list[socket.socket], backlog: int = 8, family: int = socket.AF_INET) -> tuple[socket.socket, int]:
    s = socket.socket(family, socket.SOCK_STREAM)
    opened.append(s)
    s.bind((LOCAL if family == socket.AF_INET else "::1", 0))
    s.listen(backlog)
    return s, s.getsockname()[1]


def connected(opened: list[socket.socket], server: socket.socket) -> tuple[socket.socket, socket.socket]:
    """A client connected to `server` and the server's accepted end of it."""
    client = socket.create_connection(server.getsockname()[:2])
    opened.append(client)
    accepted, _ = server.accept()
    opened.append(accepted)
    return client, accepted


def inode(s: socket.socket) -> int:
    return os.fstat(s.fileno()).st_ino


def row(found: list[TcpSocket], s: socket.socket) -> TcpSocket:
    (match,) = [r for r in found if r.inode == inode(s)]
    return match


def ours(ports: set[int], **kwargs: int) -> sockdiag.Census:
    """The census of this process, its listening `ports` given."""
    return sockdiag.census(os.getpid(), procfs.socket_inodes([os.getpid()]), ports, **kwargs)


def test_tcp_sockets_lists_our_listener_and_both_ends_of_a_connection(sockets):
    server, port = listener(sockets)
    client, accepted = connected(sockets, server)
    found = sockdiag.tcp_sockets()
    listening = row(found, server)
    assert (listening.state, listening.local, listening.remote) == ("LISTEN", (LOCAL, port), ("0.0.0.0", 0))
    assert listening.tx_queue == 8  # of a LISTEN socket: the backlog's limit
    client_row = row(found, client)
    assert client_row.state == "ESTABLISHED"
    assert client_row.local == client.getsockname() and client_row.remote == (LOCAL, port)
    server_row = row(found, accepted)
    assert server_row.local == (LOCAL, port) and server_row.remote == client.getsockname()
    assert sockdiag.tcp_sockets(os.getpid()) != []  # our own namespace, by PID


def test_tcp_sockets_reads_ipv6_addresses(sockets):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        server, port = listener(sockets, family=socket.AF_INET6)
    except OSError:
        pytest.skip("no ::1 on this machine")
    client, _ = connected(sockets, server)
    found = sockdiag.tcp_sockets()
    assert row(found, server).local == ("::1", port)
    assert row(found, client).remote == ("::1", port) and row(found, client).local == client.getsockname()[:2]


def test_queues_and_tcp_info_fields_agree_with_ss(sockets):
    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) is not installed")
    server, port = listener(sockets)
    client, accepted = connected(sockets, server)
    client.sendall(b"q" * 1000)
    time.sleep(0.3)
    accepted.recv(4096)
    accepted.sendall(b"a" * 77_000)  # left unread: the client's receive queue
    time.sleep(0.1)
    mine = row(sockdiag.tcp_sockets(), client)
    theirs = ss_info(client.getsockname()[1])
    assert mine.rx_queue == 77_000 and mine.tx_queue == 0
    assert (mine.bytes_sent, mine.bytes_received) == (1000, 77_000)
    assert mine.bytes_acked == theirs["bytes_acked"] == 1001  # the SYN counts
    assert mine.bytes_received == theirs["bytes_received"]
    assert mine.bytes_sent == theirs["bytes_sent"]
    assert mine.last_data_sent_ms is not None and mine.last_data_recv_ms is not None
    assert 390 <= mine.last_data_sent_ms < 3000 and 90 <= mine.last_data_recv_ms < 2000  # sleeps may overshoot
    assert mine.last_data_sent_ms - mine.last_data_recv_ms >= 290
    # ss asked a moment later: its times are the same or a little larger
    assert 0 <= theirs["lastsnd"] - mine.last_data_sent_ms < 1000
    assert 0 <= theirs["lastrcv"] - mine.last_data_recv_ms < 1000


def ss_info(local_port: int) -> dict[str, int]:
    """The numeric `key:value` fields `ss -tin` prints of the socket bound to `local_port` (absent ones 0)."""
    out = subprocess.run(["ss", "-tinH", f"sport = :{local_port}"], capture_output=True, text=True, check=True).stdout
    fields = {}
    for word in out.split():
        key, _, value = word.partition(":")
        if value.isdigit():
            fields[key] = int(value)
    return {k: fields.get(k, 0) for k in ("lastsnd", "lastrcv", "bytes_acked", "bytes_received", "bytes_sent")}


def test_a_shorter_tcp_info_leaves_the_fields_it_lacks_none(sockets):
    server, _ = listener(sockets)
    client, accepted = connected(sockets, server)
    client.sendall(b"x" * 10)
    accepted.recv(10)
    time.sleep(0.01)  # the client has the server's acknowledgement
    real = client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 512)  # the kernel's own struct tcp_info
    head = bytes([socket.AF_INET, 1, 0, 0]) + (80).to_bytes(2, "big") + (443).to_bytes(2, "big")
    head += socket.inet_aton(LOCAL) + bytes(12) + socket.inet_aton("10.0.0.1") + bytes(12)
    head += bytes(4 + 8) + (1234).to_bytes(4, sys.byteorder) * 5  # if, cookie; expires, rqueue, wqueue, uid, inode

    def parsed(info: bytes | None) -> TcpSocket:
        attribute = b"" if info is None else (4 + len(info)).to_bytes(2, sys.byteorder) + (2).to_bytes(2, sys.byteorder) + info
        result = sockdiag._parse(memoryview(head + attribute + bytes(-len(attribute) % 4)))
        assert result is not None
        return result

    full = parsed(real)
    assert (full.state, full.local, full.remote, full.inode) == ("ESTABLISHED", (LOCAL, 80), ("10.0.0.1", 443), 1234)
    assert (full.bytes_sent, full.bytes_acked) == (10, 11)
    assert full.last_data_sent_ms is not None and full.last_data_sent_ms < 1000
    older = parsed(real[:104])  # a kernel before 4.2: no byte counts
    assert (older.last_data_sent_ms, older.last_data_recv_ms) == (full.last_data_sent_ms, full.last_data_recv_ms)
    assert (older.bytes_acked, older.bytes_received, older.bytes_sent) == (None, None, None)
    for truncated in (parsed(real[:40]), parsed(None)):
        assert (truncated.last_data_sent_ms, truncated.last_data_recv_ms, truncated.bytes_received) == (None, None, None)
    assert sockdiag._parse(memoryview(head[:60])) is None


def test_a_request_read_and_not_answered_is_in_flight_and_its_client_pending(sockets):
    server, port = listener(sockets)
    client, accepted = connected(sockets, server)
    client.sendall(b"GET / HTTP/1.1\r\n\r\n")  # within the tick of the handshake: both clocks tie
    accepted.recv(4096)
    time.sleep(GAP_S)
    now = ours({port})
    assert now.inbound == {port: InboundCount(connections=1, in_flight=1, backlog=0)}
    assert now.outbound[(LOCAL, port)] == OutboundCount(established=1, pending=1, receiving=0, idle=0)


def test_the_age_of_a_request_in_flight_is_the_time_since_its_bytes_arrived(sockets):
    server, port = listener(sockets)
    waiting, accepted = connected(sockets, server)
    waiting.sendall(b"GET /slow HTTP/1.1\r\n\r\n")
    accepted.recv(4096)
    answered, accepted_2 = connected(sockets, server)
    answered.sendall(b"GET /fast HTTP/1.1\r\n\r\n")
    accepted_2.recv(4096)
    accepted_2.sendall(b"HTTP/1.1 200 OK\r\n\r\n")  # answered: not in flight, no age
    time.sleep(0.3)
    me = os.getpid()
    inodes = procfs.socket_inodes([me])
    (age,) = sockdiag.in_flight_ages_ms(sockdiag.tcp_sockets(me), inodes, {port})
    assert 280 <= age <= 1000
    assert sockdiag.in_flight_ages_ms(sockdiag.tcp_sockets(me), set(), {port}) == []  # not the target's sockets


def test_an_answered_request_leaves_a_keep_alive_connection_idle_until_the_next_request(sockets):
    server, port = listener(sockets)
    client, accepted = connected(sockets, server)
    client.sendall(b"request 1")
    accepted.recv(4096)
    time.sleep(GAP_S)
    accepted.sendall(b"answer 1")
    client.recv(4096)
    time.sleep(0.15)
    between = ours({port}, receiving_ms=100)
    assert between.inbound[port] == InboundCount(connections=1, in_flight=0, backlog=0)
    assert between.outbound[(LOCAL, port)] == OutboundCount(established=1, pending=0, receiving=0, idle=1)
    client.sendall(b"request 2")  # the next request on the same connection: received after the last answer
    accepted.recv(4096)
    time.sleep(GAP_S)
    during = ours({port}, receiving_ms=100)
    assert during.inbound[port] == InboundCount(connections=1, in_flight=1, backlog=0)
    assert during.outbound[(LOCAL, port)] == OutboundCount(established=1, pending=1, receiving=0, idle=0)


def test_a_streamed_answer_is_receiving_then_idle_and_answered_on_the_server(sockets):
    server, port = listener(sockets)
    client, accepted = connected(sockets, server)
    client.sendall(b"stream please")
    accepted.recv(4096)
    stop = threading.Event()

    def stream() -> None:
        while not stop.wait(GAP_S):
            accepted.sendall(b"token ")

    streamer = threading.Thread(target=stream)
    streamer.start()
    try:
        time.sleep(0.3)
        streaming = ours({port}, receiving_ms=100)
    finally:
        stop.set()
        streamer.join()
    # the client has read none of it: the answer waits for the client's process, not the server
    assert streaming.outbound[(LOCAL, port)] == OutboundCount(established=1, pending=0, receiving=1, idle=0, unread=1)
    assert streaming.inbound[port].in_flight == 0  # the answer has begun: counted as answered
    client.setblocking(False)
    while True:
        try:
            if not client.recv(65536):
                break
        except BlockingIOError:
            break
    drained = ours({port}, receiving_ms=1000)
    assert drained.outbound[(LOCAL, port)] == OutboundCount(established=1, pending=0, receiving=1, idle=0, unread=0)
    time.sleep(0.15)
    assert ours({port}, receiving_ms=100).outbound[(LOCAL, port)] == OutboundCount(established=1, pending=0, receiving=0, idle=1)


def test_connections_nobody_accepted_are_the_backlog(sockets):
    server, port = listener(sockets, backlog=8)
    clients = [socket.create_connection((LOCAL, port)) for _ in range(3)]
    sockets.extend(clients)
    time.sleep(GAP_S)
    found = sockdiag.tcp_sockets()
    assert row(found, server).rx_queue == 3  # of a LISTEN socket: the accept queue's length
    assert sorted(r.remote[1] for r in found if r.local == (LOCAL, port) and r.inode == 0) == sorted(
        c.getsockname()[1] for c in clients
    )
    queued = ours({port})
    assert queued.inbound == {port: InboundCount(connections=0, in_flight=0, backlog=3)}
    assert queued.outbound[(LOCAL, port)] == OutboundCount(established=3, pending=0, receiving=0, idle=3)  # sent nothing
    accepted, _ = server.accept()
    sockets.append(accepted)
    assert row(sockdiag.tcp_sockets(), accepted).local == (LOCAL, port)  # a descriptor now: an inode
    assert ours({port}).inbound[port] == InboundCount(connections=1, in_flight=0, backlog=2)


def test_census_counts_only_the_targets_sockets_and_every_listening_port(sockets):
    server, port = listener(sockets)
    _, other_port = listener(sockets)
    client, accepted = connected(sockets, server)
    client.sendall(b"request")
    accepted.recv(100)
    foreign = sockdiag.census(os.getpid(), set(), {port, other_port})  # none of these descriptors is the target's
    assert foreign.inbound == {port: InboundCount(0, 0, 0), other_port: InboundCount(0, 0, 0)}
    assert foreign.outbound == {}


def sock(
    local_port: int,
    sent_ms: int | None,
    recv_ms: int | None,
    *,
    inode: int = 7,
    sent: int | None = 10,
    received: int | None = 10,
    state: str = "ESTABLISHED",
    remote: tuple[str, int] = ("10.0.0.2", 5432),
) -> TcpSocket:
    acked = None if sent is None else sent + 1
    return TcpSocket(state, ("10.0.0.1", local_port), remote, inode, 0, 0, sent_ms, recv_ms, received, acked, sent)


def test_census_on_hand_built_sockets_breaks_ties_by_what_was_ever_sent():
    found = [
        sock(8000, 40, 40, sent=0),  # request within the handshake's tick, no answer: in flight
        sock(8000, 40, 40),  # request and answer in the same tick: answered
        sock(8000, 40, 10),  # received after the last answer: in flight
        sock(8000, 10, 40),  # answered
        sock(8000, None, None),  # no tcp_info: not known to be in flight
        sock(8000, 40, 40, received=0, sent=0),  # connected, nothing said yet
        sock(8000, 5, 5, inode=0, received=0, sent=0),  # in the backlog
        sock(8000, 5, 5, inode=99),  # another process's
        sock(8000, 5, 5, state="CLOSE_WAIT"),
        sock(40001, 40, 40, received=0),  # sent in the handshake's tick, nothing back: pending
        sock(40002, 10, 40),  # sent after the last data received: pending
        sock(40003, 500, 20),  # answer arriving
        sock(40004, 500, 300),  # answer ended a while ago: idle
        sock(40005, 500, 20, received=0, sent=0),  # nothing said: idle
        sock(40006, None, None, sent=None, received=None),  # no tcp_info: idle
        sock(40007, 10, 40, remote=("10.0.0.3", 443)),
        sock(40008, 10, 40, inode=99),  # another process's
    ]
    counted = sockdiag.census(1, {7}, {8000, 9000}, sockets=found)
    assert counted.inbound == {8000: InboundCount(connections=6, in_flight=2, backlog=1), 9000: InboundCount(0, 0, 0)}
    assert counted.outbound == {
        ("10.0.0.2", 5432): OutboundCount(established=6, pending=2, receiving=1, idle=3),
        ("10.0.0.3", 443): OutboundCount(established=1, pending=1, receiving=0, idle=0),
    }


def test_no_such_process_is_a_sock_diag_error():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with pytest.raises(sockdiag.SockDiagError, match=f"no process with PID {dead.pid}"):
        sockdiag.tcp_sockets(dead.pid)


# --- another network namespace (`ip netns`, as root) ---------------------------------------------------------------

LISTEN_AND_WAIT = """
import os, socket, sys
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(4)
print(os.getpid(), s.getsockname()[1], os.fstat(s.fileno()).st_ino, flush=True)
sys.stdin.read()
s.close()
"""

#: `setpriv` options that leave a root process without capabilities (so without CAP_SYS_ADMIN).
NO_CAPABILITIES = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]


@contextlib.contextmanager
def network_namespace() -> Iterator[str]:
    """A new network namespace with its loopback up, deleted after."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a network namespace needs root and ip (iproute2)")
    name = f"latprof-test-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"ip netns add failed: {made.stderr.strip()}")
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True)


@contextlib.contextmanager
def listening_in(namespace: str, *prefix: str) -> Iterator[tuple[int, int, int]]:
    """A Python process listening on 127.0.0.1 inside `namespace`: its PID, port and socket inode."""
    proc = subprocess.Popen(["ip", "netns", "exec", namespace, *prefix, sys.executable, "-c", LISTEN_AND_WAIT],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    try:
        pid, port, socket_inode = (int(x) for x in proc.stdout.readline().split())
        yield pid, port, socket_inode
    finally:
        proc.stdin.close()
        proc.wait(10)
        proc.stdout.close()


@pytest.mark.slow
def test_tcp_sockets_of_a_process_in_another_network_namespace_are_read_in_it():
    with network_namespace() as namespace, listening_in(namespace) as (pid, port, socket_inode):
        theirs = sockdiag.tcp_sockets(pid)
        (listening,) = [r for r in theirs if r.inode == socket_inode]
        assert (listening.state, listening.local) == ("LISTEN", (LOCAL, port))
        assert socket_inode not in {r.inode for r in sockdiag.tcp_sockets()}  # not in ours
        assert sockdiag.census(pid, procfs.socket_inodes([pid]), {port}).inbound == {port: InboundCount(0, 0, 0)}


def without_capabilities(code: str) -> str:
    """The last line a Python without capabilities prints running `code` (root's uid, no CAP_SYS_ADMIN)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("dropping capabilities needs root and setpriv (util-linux)")
    done = subprocess.run([*NO_CAPABILITIES, sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    return (done.stdout + done.stderr).strip().splitlines()[-1]


def test_a_namespace_we_may_not_read_is_a_sock_diag_error():
    # This process has capabilities the other lacks: it may not look into this one's namespace.
    last = without_capabilities(f"from latprof.collectors.attach import sockdiag; sockdiag.tcp_sockets({os.getpid()})")
    assert last == (
        f"latprof.collectors.attach.sockdiag.SockDiagError: cannot read the network namespace of PID {os.getpid()}"
        f" (/proc/{os.getpid()}/ns/net: Permission denied): run latprof as its user or as root"
    )
    # its own namespace it reads without any (sock_diag asks for no privilege)
    assert without_capabilities("from latprof.collectors.attach import sockdiag; print(type(sockdiag.tcp_sockets()).__name__)") == "list"


@pytest.mark.slow
def test_a_namespace_we_may_not_enter_is_a_sock_diag_error():
    # Both without capabilities: we may open the target's namespace file (same user), not enter it.
    with network_namespace() as namespace, listening_in(namespace, *NO_CAPABILITIES) as (pid, _, _):
        last = without_capabilities(f"from latprof.collectors.attach import sockdiag; sockdiag.tcp_sockets({pid})")
    assert last == (
        f"latprof.collectors.attach.sockdiag.SockDiagError: cannot enter the network namespace of PID {pid}:"
        " Operation not permitted (needs CAP_SYS_ADMIN: run latprof as root)"
    )
