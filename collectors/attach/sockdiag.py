"""A census of a running service's TCP sockets from outside, once a second, for `latprof attach`.

Not a hook. An asyncio service's suspended tasks leave no stack to sample, but each request
they serve and each call they wait on holds a socket, and the kernel knows when each socket
last sent and last received data. `tcp_sockets` asks it the way `ss -ti` does: netlink
sock_diag (`SOCK_DIAG_BY_FAMILY` with `struct inet_diag_req_v2`, AF_INET and AF_INET6,
every TCP state, with `INET_DIAG_INFO` so that each answer carries `struct tcp_info`), in the
target's own network namespace (a containerised service seen from the host is read as it
sees itself: the netlink socket is opened by a short-lived thread that enters the namespace
with `setns`). `census` counts the target's sockets at that moment:

- **Inbound**, per listening port: the accepted connections (ESTABLISHED, a descriptor of
  the target's); of those, the ones *in flight*, whose last data received is more recent than
  their last data sent (a request read and not answered yet), or that received data and never
  sent any; and the *backlog*, connections the kernel completed that nobody `accept()`ed yet
  (ESTABLISHED, inode 0).
- **Outbound**, per remote endpoint: ESTABLISHED connections of the target from a port it
  does not listen on; of those, *pending* (the last data sent is more recent than the last
  data received, or it sent data and never received any: a request waits for the first byte
  of its answer), *receiving* (not pending, data received within the last `receiving_ms`: an
  answer or a stream is arriving) and *idle* (the rest); and of the pending and receiving ones,
  *unread*: bytes sit in the receive queue the process has not read (the answer waits for the
  process, not for the endpoint).

`Exchanges` follows each outbound connection from one census to the next: when it sent a
request and when data of the answer arrived, so that each exchange splits into the wait for
the first byte of its answer's stream (an LLM's time to first token) and the stream (decoding).

What the wire cannot tell:

- A pool keeps all its connections established, busy or not: `established` equal to a pool's
  size says the pool is full of open connections, not that they are all in use.
- A connection held across an LLM call (a transaction open while the request awaits the
  provider) sends and receives nothing meanwhile: it looks idle on the wire.
- A streamed response that has begun sending counts as answered: "in flight" ends with the
  first byte sent, not the last.
- A keep-alive connection between two requests is not in flight (it has answered the last one);
  a request received within the same clock tick (1-10 ms) as the last answer was sent looks
  answered too. Times are kernel ticks of 1-10 ms.
- Connections that open and close between two censuses are not seen; one whose client gave up
  (CLOSE_WAIT) is no longer counted, even while the service still works on its request.

Errors are `SockDiagError`s with one line a person can act on (netlink refused, the
namespace not enterable without privileges, no such process).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import socket
import struct
import threading
from dataclasses import dataclass

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
INET_DIAG_INFO = 2
CLONE_NEWNET = 0x40000000
#: How long the kernel may take to answer one dump before it is given up.
DUMP_TIMEOUT_S = 5.0

_NLM_F_REQUEST = 0x1
_NLM_F_DUMP = 0x300  # NLM_F_ROOT | NLM_F_MATCH
_NLMSG_ERROR = 2
_NLMSG_DONE = 3

_NLMSG_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
# inet_diag_req_v2: family, protocol, ext, pad, states; inet_diag_sockid: sport, dport (big-endian),
# src[16], dst[16], if, cookie[2]
_REQ = struct.Struct("=BBBBI2s2s16s16sI8s")
# inet_diag_msg: family, state, timer, retrans; sockid: sport, dport (big-endian), src[16], dst[16],
# if, cookie[2]; then expires, rqueue, wqueue, uid, inode
_MSG = struct.Struct("=BBxx2s2s16s16s16xII4xI")
_RTA = struct.Struct("=HH")  # rta_len, rta_type

# struct tcp_info (linux/tcp.h): eight u8 (state, ca_state, retransmits, probes, backoff,
# options, the wscale nibbles, the app_limited bits), then u32 rto at 8 ... last_data_sent at 44,
# last_ack_sent 48, last_data_recv 52, last_ack_recv 56, ... total_retrans 100, then u64
# pacing_rate 104, max_pacing_rate 112, bytes_acked 120, bytes_received 128, ... bytes_sent 200.
_TCPI_FIELDS = (  # (offset, layout) of last_data_sent, last_data_recv, bytes_received, bytes_acked, bytes_sent
    (44, struct.Struct("=I")),
    (52, struct.Struct("=I")),
    (128, struct.Struct("=Q")),
    (120, struct.Struct("=Q")),
    (200, struct.Struct("=Q")),
)
# All five at once, from a tcp_info of Linux 4.19 or later (the common case: one call per socket).
_TCPI = struct.Struct("=44xI4xI64xQQ64xQ")

#: Kernel TCP states (include/net/tcp_states.h) by the names psutil uses.
STATES = {
    1: "ESTABLISHED",
    2: "SYN_SENT",
    3: "SYN_RECV",
    4: "FIN_WAIT1",
    5: "FIN_WAIT2",
    6: "TIME_WAIT",
    7: "CLOSE",
    8: "CLOSE_WAIT",
    9: "LAST_ACK",
    10: "LISTEN",
    11: "CLOSING",
    12: "SYN_RECV",  # TCP_NEW_SYN_RECV: a request socket, what /proc/net/tcp and psutil call SYN_RECV
    13: "BOUND_INACTIVE",
}
_ALL_STATES = 0xFFFFFFFF


class SockDiagError(Exception):
    """Netlink sock_diag is unavailable or refused; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class TcpSocket:
    """One TCP socket as sock_diag reports it; the tcp_info fields are None when the kernel
    sent none (TIME_WAIT and SYN_RECV rows) or a shorter struct than they need."""

    state: str  # "ESTABLISHED", "LISTEN", "CLOSE_WAIT", ... (psutil's names)
    local: tuple[str, int]  # (address text, port)
    remote: tuple[str, int]
    inode: int  # 0: still in an accept backlog (no file descriptor yet), or no longer owned
    rx_queue: int  # idiag_rqueue: unread bytes; of a LISTEN socket, its accept-queue length
    tx_queue: int  # idiag_wqueue: unacknowledged bytes; of a LISTEN socket, its backlog limit
    last_data_sent_ms: int | None  # ms since data was last sent (since the handshake if never)
    last_data_recv_ms: int | None  # ms since data was last received (since the handshake if never)
    bytes_received: int | None
    bytes_acked: int | None  # data the peer acknowledged; on the connecting side 1 more (its SYN counts)
    bytes_sent: int | None = None  # Linux 4.19 on


@dataclass(frozen=True, slots=True)
class InboundCount:
    """Connections to one listening port of the target at one moment."""

    connections: int  # accepted connections (ESTABLISHED, inode != 0) on that port
    in_flight: int  # of those, a request received and not yet answered
    backlog: int  # in the accept backlog (ESTABLISHED, inode 0): not yet accepted


@dataclass(frozen=True, slots=True)
class OutboundCount:
    """The target's established connections to one remote endpoint at one moment."""

    established: int
    pending: int  # request sent, answer not begun
    receiving: int  # not pending, data received within the last `receiving_ms`: an answer in progress
    idle: int  # the rest: nothing in flight on the wire (pooled, or held by a request doing something else)
    #: of the pending and receiving ones, those with bytes in the receive queue the process has
    #: not read yet: an answer that waits for the process (a held event loop), not the endpoint
    unread: int = 0


@dataclass(frozen=True, slots=True)
class Census:
    """The target's TCP connections at one moment."""

    inbound: dict[int, InboundCount]  # per listening port of the target (every one, zeros included)
    outbound: dict[tuple[str, int], OutboundCount]  # per remote endpoint (address, port)


def tcp_sockets(pid: int | None = None, *, states: frozenset[str] | None = None) -> list[TcpSocket]:
    """Every TCP socket of the network namespace of `pid` (None: ours); with `states`, only
    those in these states (asked of the kernel, which then sends no others)."""
    reader = SocketReader(pid)
    try:
        return reader.sockets(states)
    finally:
        reader.close()


class SocketReader:
    """A sock_diag socket in the network namespace of `pid` (None: ours), kept open for dump
    after dump: a poller asking ten times a second opens it once (in another namespace that
    takes a thread that enters it). One thread uses it at a time."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid
        self._sock: socket.socket | None = None
        self._seq = 0

    def sockets(self, states: frozenset[str] | None = None) -> list[TcpSocket]:
        """Every TCP socket in `states` (None: all), as `tcp_sockets`. After a failure the
        socket is closed and the next call opens another."""
        mask = _ALL_STATES if states is None else _state_mask(states)
        if self._sock is None:
            self._sock = _open(self.pid)
        sock = self._sock
        self._seq = (self._seq + 2) & 0x7FFFFFFE  # each dump its own: an answer left from a failed one is skipped
        try:
            found = _dump(sock, socket.AF_INET, mask, self._seq)
            try:
                found += _dump(sock, socket.AF_INET6, mask, self._seq + 1)
            except SockDiagError as exc:
                if not isinstance(exc.__cause__, OSError) or exc.__cause__.errno not in _NO_IPV6:
                    raise
        except BaseException:
            self.close()
            raise
        return found

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


_NO_IPV6 = {errno.ENOENT, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT, errno.EINVAL}


def census(
    pid: int,
    inodes: set[int],
    listening_ports: set[int],
    *,
    receiving_ms: int = 250,
    sockets: list[TcpSocket] | None = None,
) -> Census:
    """The target's sockets (those whose inode is in `inodes`, the socket inodes among its
    processes' descriptors; plus backlog rows, inode 0, whose local port is a listening port)
    counted per listening port and per remote endpoint (see the module's docstring for what
    each count means). `sockets`: an answer of `tcp_sockets` already at hand (else one is
    asked for, ESTABLISHED sockets only, in `pid`'s namespace)."""
    if sockets is None:
        sockets = tcp_sockets(pid, states=frozenset({"ESTABLISHED"}))
    accepted = dict.fromkeys(listening_ports, 0)
    in_flight = dict.fromkeys(listening_ports, 0)
    backlog = dict.fromkeys(listening_ports, 0)
    outbound: dict[tuple[str, int], list[int]] = {}
    for s in sockets:
        if s.state != "ESTABLISHED":
            continue
        port = s.local[1]
        if port in listening_ports:
            if s.inode == 0:
                backlog[port] += 1
            elif s.inode in inodes:
                accepted[port] += 1
                in_flight[port] += _awaits_answer(s)
        elif s.inode in inodes:
            counts = outbound.setdefault(s.remote, [0, 0, 0, 0, 0])
            counts[0] += 1
            if _awaits_reply(s):
                counts[1] += 1
            elif s.bytes_received != 0 and s.last_data_recv_ms is not None and s.last_data_recv_ms < receiving_ms:
                counts[2] += 1
            else:
                counts[3] += 1
                continue
            counts[4] += s.rx_queue > 0
    return Census(
        inbound={p: InboundCount(accepted[p], in_flight[p], backlog[p]) for p in sorted(listening_ports)},
        outbound={k: OutboundCount(*v) for k, v in outbound.items()},
    )


def in_flight_ages_ms(sockets: list[TcpSocket], inodes: set[int], listening_ports: set[int]) -> list[int]:
    """How long each request in flight (as `census` counts them) has waited so far: the time
    since its bytes last arrived, in ms."""
    return [
        s.last_data_recv_ms for s in sockets
        if s.state == "ESTABLISHED" and s.local[1] in listening_ports and s.inode != 0 and s.inode in inodes
        and s.last_data_recv_ms is not None and _awaits_answer(s)
    ]  # fmt: skip


def _awaits_answer(s: TcpSocket) -> bool:
    """An inbound connection has read a request it has not begun to answer."""
    if s.last_data_recv_ms is None or s.last_data_sent_ms is None or s.bytes_received == 0:
        return False
    if s.last_data_recv_ms < s.last_data_sent_ms:
        return True
    # Both clocks start at the handshake: a request that came within its tick ties them.
    return s.last_data_recv_ms == s.last_data_sent_ms and s.bytes_sent == 0


def _awaits_reply(s: TcpSocket) -> bool:
    """An outbound connection has sent a request and received nothing of the answer yet."""
    if s.last_data_recv_ms is None or s.last_data_sent_ms is None or s.bytes_sent == 0:
        return False
    if s.last_data_sent_ms < s.last_data_recv_ms:
        return True
    return s.last_data_sent_ms == s.last_data_recv_ms and s.bytes_received == 0 and bool(s.bytes_sent)


#: Data arriving at most this far apart is one stream (a model decoding token after token); a
#: longer silence before the stream is waiting for its first token. The census reads every
#: 100 ms, so a first token sooner than this after the response headers counts as decoding.
STREAM_GAP_MS = 400
#: Data that arrives this soon after the request is the response's head (status and headers,
#: which a streaming server may send at once), not a token: no model answers that fast.
HEAD_MS = 20
#: At most this many outbound connections are followed at once (memory stays bounded).
MAX_EXCHANGES = 4096


@dataclass(slots=True)
class _Exchange:
    """One outbound connection's current request and answer, in ns of the reader's clock."""

    sent: int  # bytes sent so far (a new request sends more)
    received: int  # bytes received so far
    since_ns: int | None = None  # when its current request was sent; None: none seen yet
    run_ns: int | None = None  # when the last stream of its answer began (data no further apart than STREAM_GAP_MS)
    last_ns: int | None = None  # when data of its answer last arrived
    arrivals: int = 0  # readings in which data of its answer arrived


@dataclass(frozen=True, slots=True)
class ExchangeTimes:
    """Requests and answers on one remote endpoint's connections, ended since the last `take`:
    seconds waiting for the first byte of a stream (the last stream of each answer: with
    response headers sent at once, the silence after them is waited too), seconds of the stream
    itself, how many exchanges ended and how many of them streamed (data in 3 readings or more)."""

    first_byte_s: float = 0.0
    stream_s: float = 0.0
    exchanges: int = 0
    streamed: int = 0


class Exchanges:
    """Follows each outbound connection of the target from census to census: when it sends a
    request, when data of the answer arrives and how far apart; each exchange ends when the
    connection sends its next request, goes away, or `close` is called, and is then split into
    the wait for the first byte of its last stream (an LLM's time to first token) and that
    stream (its decoding). Times come from the kernel's last-sent and last-received clocks (1-10
    ms ticks) read every census; a stream's silences shorter than `STREAM_GAP_MS` are not seen."""

    def __init__(self) -> None:
        self._open: dict[int, tuple[tuple[str, int], _Exchange]] = {}
        self._ended: dict[tuple[str, int], list[float]] = {}
        self._last_reading_ns: int | None = None

    def update(self, sockets: list[TcpSocket], inodes: set[int], listening_ports: set[int], now_ns: int) -> None:
        """One census reading: the target's outbound ESTABLISHED sockets (`inodes`) at `now_ns`."""
        seen = set()
        for s in sockets:
            if (s.state != "ESTABLISHED" or s.inode == 0 or s.inode not in inodes or s.local[1] in listening_ports
                    or s.bytes_sent is None or s.bytes_received is None or s.last_data_sent_ms is None
                    or s.last_data_recv_ms is None):  # fmt: skip
                continue
            seen.add(s.inode)
            known = self._open.get(s.inode)
            if known is None:  # first seen: nothing sent or received yet, as far as it knows
                if len(self._open) >= MAX_EXCHANGES:
                    continue
                known = self._open[s.inode] = (s.remote, _Exchange(0, -1))
            remote, x = known
            if s.bytes_sent > x.sent:  # a request (the first seen, or the next: the last exchange ended), sent when it last sent
                self._end(remote, x, x.last_ns)
                x.since_ns, x.run_ns, x.last_ns, x.arrivals = now_ns - s.last_data_sent_ms * 1_000_000, None, None, 0
                x.sent = s.bytes_sent
                x.received = s.bytes_received if s.last_data_recv_ms >= s.last_data_sent_ms else x.received
            if s.bytes_received > x.received:
                self._arrived(x, now_ns - s.last_data_recv_ms * 1_000_000)
                x.received = s.bytes_received
        self._last_reading_ns = now_ns
        for inode in [i for i in self._open if i not in seen]:  # closed: its exchange ended
            remote, x = self._open.pop(inode)
            self._end(remote, x, x.last_ns)

    def _arrived(self, x: _Exchange, at: int) -> None:
        """Data of `x`'s answer arrived since the last reading, the latest of it at `at`."""
        if x.since_ns is None or at < x.since_ns:
            return
        if x.last_ns is None and at - x.since_ns < HEAD_MS * 1_000_000:
            return  # the response's head, sent at once: no token yet
        if x.last_ns is None or at - x.last_ns > STREAM_GAP_MS * 1_000_000:
            # a stream begins: its first bytes came after the last reading (or the request, or
            # the data before) and by `at`, the latest of them; halfway, on average
            after = max(x.since_ns, self._last_reading_ns or x.since_ns, x.last_ns or x.since_ns)
            x.run_ns = (min(after, at) + at) // 2
        x.last_ns = at
        x.arrivals += 1

    def close(self, now_ns: int) -> None:
        """End every exchange (the capture ends): one still waiting for its first byte waited until now."""
        for remote, x in self._open.values():
            self._end(remote, x, x.last_ns if x.last_ns is not None else now_ns)
        self._open.clear()

    def take(self) -> dict[tuple[str, int], ExchangeTimes]:
        """The exchanges ended since the last call, per remote endpoint."""
        ended, self._ended = self._ended, {}
        return {k: ExchangeTimes(v[0], v[1], int(v[2]), int(v[3])) for k, v in ended.items()}

    def _end(self, remote: tuple[str, int], x: _Exchange, end_ns: int | None) -> None:
        if x.since_ns is None or end_ns is None:
            return
        # the answer's last stream began halfway since the reading before its first bytes came: a
        # stream no longer than a census interval and an answer sent whole look alike on the wire
        start = end_ns if x.run_ns is None else x.run_ns
        times = self._ended.setdefault(remote, [0.0, 0.0, 0.0, 0.0])
        times[0] += max(0, start - x.since_ns) / 1e9
        times[1] += max(0, end_ns - start) / 1e9
        times[2] += 1
        times[3] += x.arrivals >= 3


def _state_mask(states: frozenset[str]) -> int:
    unknown = states - set(STATES.values())
    if unknown:
        raise ValueError(f"not a TCP state: {', '.join(sorted(unknown))}")
    return sum(1 << n for n, name in STATES.items() if name in states)


def _netlink_socket() -> socket.socket:
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
    except OSError as exc:
        raise SockDiagError(f"netlink sock_diag is unavailable here ({exc.strerror or exc})") from exc
    sock.settimeout(DUMP_TIMEOUT_S)
    return sock


def _open(pid: int | None) -> socket.socket:
    """A sock_diag socket in the network namespace of `pid` (None: ours)."""
    if pid is None:
        return _netlink_socket()
    try:
        ns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SockDiagError(f"no process with PID {pid}") from None
    except OSError as exc:
        raise SockDiagError(
            f"cannot read the network namespace of PID {pid} (/proc/{pid}/ns/net: {exc.strerror}):"
            " run latprof as its user or as root"
        ) from None
    try:
        theirs, ours = os.fstat(ns), os.stat("/proc/self/ns/net")
        if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
            return _netlink_socket()
        return _netlink_socket_in(ns, pid)
    finally:
        os.close(ns)


def _netlink_socket_in(ns: int, pid: int) -> socket.socket:
    """A sock_diag socket in the network namespace open as `ns`, made by a thread that enters it
    (a socket stays in the namespace it was made in; only that thread switches, and it ends)."""
    made: list[socket.socket] = []
    failed: list[Exception] = []

    def enter_and_open() -> None:
        try:
            if _libc().setns(ns, CLONE_NEWNET) != 0:
                raise SockDiagError(
                    f"cannot enter the network namespace of PID {pid}: {os.strerror(ctypes.get_errno())}"
                    " (needs CAP_SYS_ADMIN: run latprof as root)"
                )
            made.append(_netlink_socket())
        except Exception as exc:  # handed to the caller's thread
            failed.append(exc)

    helper = threading.Thread(target=enter_and_open, name="latprof-setns", daemon=True)
    helper.start()
    helper.join()
    if failed:
        if isinstance(failed[0], SockDiagError):
            raise failed[0]
        raise SockDiagError(f"cannot open netlink in the network namespace of PID {pid}: {failed[0]}") from failed[0]
    return made[0]


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


_BUFFER_BYTES = 1 << 16  # the kernel fills a dump's messages up to a page or 32 KiB at a time


def _dump(sock: socket.socket, family: int, states: int, seq: int) -> list[TcpSocket]:
    """Every TCP socket of `family` in `states`, one dump (multipart answers until NLMSG_DONE)."""
    req = _REQ.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0, states, b"", b"", b"", b"", 0, b"\xff" * 8)
    header = _NLMSG_HDR.pack(_NLMSG_HDR.size + len(req), SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, seq, 0)
    try:
        sock.sendto(header + req, (0, 0))
    except OSError as exc:
        raise SockDiagError(f"netlink sock_diag refused the request ({exc.strerror or exc})") from exc
    found: list[TcpSocket] = []
    buffer = bytearray(_BUFFER_BYTES)
    while True:
        try:
            size = sock.recv_into(buffer)
        except socket.timeout:
            raise SockDiagError(f"netlink sock_diag did not answer within {DUMP_TIMEOUT_S:g} s") from None
        except OSError as exc:
            raise SockDiagError(f"netlink sock_diag failed ({exc.strerror or exc})") from exc
        if size == 0:
            raise SockDiagError("netlink sock_diag closed the dump before its end")
        data = memoryview(buffer)[:size]
        at = 0
        while at + _NLMSG_HDR.size <= size:
            length, kind, _, msg_seq, _ = _NLMSG_HDR.unpack_from(data, at)
            if length < _NLMSG_HDR.size or at + length > size:
                raise SockDiagError("netlink sock_diag sent a malformed message")
            body = data[at + _NLMSG_HDR.size : at + length]
            at += (length + 3) & ~3
            if msg_seq != seq:
                continue  # the answer to an earlier request that was given up
            if kind == _NLMSG_DONE or kind == _NLMSG_ERROR:
                code = -struct.unpack_from("=i", body)[0] if len(body) >= 4 else 0
                if code:
                    cause = OSError(code, os.strerror(code))
                    raise SockDiagError(f"netlink sock_diag refused the dump ({cause.strerror})") from cause
                if kind == _NLMSG_DONE:
                    return found
                continue  # an acknowledgement
            if kind == SOCK_DIAG_BY_FAMILY:
                row = _parse(body)
                if row is not None:
                    found.append(row)


def _parse(body: memoryview) -> TcpSocket | None:
    """One `inet_diag_msg` and its attributes; None when too short to be one."""
    if len(body) < _MSG.size:
        return None
    family, state, sport, dport, src, dst, rqueue, wqueue, inode = _MSG.unpack_from(body)
    if family == socket.AF_INET:
        local, remote = socket.inet_ntop(family, src[:4]), socket.inet_ntop(family, dst[:4])
    else:
        local, remote = socket.inet_ntop(socket.AF_INET6, src), socket.inet_ntop(socket.AF_INET6, dst)
    fields = _tcp_info(_attribute(body, INET_DIAG_INFO))
    return TcpSocket(
        STATES.get(state) or f"STATE_{state}",
        (local, int.from_bytes(sport, "big")),
        (remote, int.from_bytes(dport, "big")),
        inode,
        rqueue,
        wqueue,
        *fields,
    )


def _attribute(body: memoryview, kind: int) -> memoryview | None:
    """The payload of the first rtattr of `kind` after the inet_diag_msg."""
    at = _MSG.size
    end = len(body)
    while at + 4 <= end:
        length, rta_type = _RTA.unpack_from(body, at)
        if length < 4:
            return None
        if rta_type == kind:
            return body[at + 4 : at + length]
        at += (length + 3) & ~3
    return None


_NO_TCP_INFO = (None, None, None, None, None)


def _tcp_info(info: memoryview | None) -> tuple[int | None, ...]:
    """last_data_sent, last_data_recv, bytes_received, bytes_acked, bytes_sent of a tcp_info;
    None for each field the kernel's struct ends before (or all, without one)."""
    if info is None:
        return _NO_TCP_INFO
    if len(info) >= _TCPI.size:
        sent_ms, recv_ms, acked, received, sent = _TCPI.unpack_from(info)
        return sent_ms, recv_ms, received, acked, sent
    return tuple(
        layout.unpack_from(info, offset)[0] if len(info) >= offset + layout.size else None for offset, layout in _TCPI_FIELDS
    )
