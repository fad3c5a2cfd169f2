"""What /proc and psutil tell about a running service from outside, for `latprof attach`.

Not a hook. Read in the target's own network namespace (`/proc/PID/net/tcp`, `tcp6`), so a
containerised service seen from the host is read as it sees itself:

- **Accept backlog.** The target's LISTEN sockets (found by the socket inodes among its file
  descriptors; a gunicorn master owns the socket its workers share) and, per listening port,
  the current accept-queue length: the `rx_queue` of the LISTEN row (connections the kernel
  completed that the service has not `accept()`ed yet). `tx_queue` of a LISTEN row is 0, not
  the backlog's limit.
- **Accepted connections.** Established connections to a listening port, each counted once
  when first seen (by remote address and port): the accept rate the backlog's Little's-law
  wait needs. Connections still in the backlog (inode 0: no descriptor yet) are not
  accepted; connections that open and close between two readings are not seen.
- **Outbound connections** per remote endpoint and state (psutil): ESTABLISHED connections
  to PostgreSQL's port equal to a pool's size say the pool's connections are all open — busy
  or not, the wire does not say.
- **CPU and context switches** per process and per thread (psutil, `/proc/PID/task/TID/status`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable

_LISTEN = "0A"
_ESTABLISHED = "01"


@dataclass(frozen=True, slots=True)
class TcpRow:
    """One row of /proc/PID/net/tcp or tcp6."""

    local_port: int
    remote: str  # "address:port", hex as the kernel prints it
    state: str  # hex, "0A" LISTEN, "01" ESTABLISHED
    tx_queue: int
    rx_queue: int
    inode: int


def tcp_rows(pid: int) -> list[TcpRow]:
    """Every TCP socket of the target's network namespace (IPv4 and IPv6)."""
    rows = []
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            try:
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                tx, rx = (int(x, 16) for x in fields[4].split(":"))
                rows.append(TcpRow(local_port, fields[2], fields[3], tx, rx, int(fields[9])))
            except (ValueError, IndexError):
                continue
    return rows


def socket_inodes(pids: Iterable[int]) -> set[int]:
    """The socket inodes among the file descriptors of `pids` (those we may read)."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def listening_ports(pid: int, owners: Iterable[int] = ()) -> set[int]:
    """The ports the target (or `owners`: its master, its workers) listens on."""
    inodes = socket_inodes({pid, *owners})
    return {r.local_port for r in tcp_rows(pid) if r.state == _LISTEN and r.inode in inodes}


def rows_of(sockets: Iterable[Any]) -> list[TcpRow]:
    """Sockets as `sockdiag.tcp_sockets` reports them, as the rows of /proc/PID/net/tcp.

    Reading /proc/PID/net/tcp walks the kernel's whole socket hash table whatever few sockets
    it holds (several ms on a machine with much memory); sock_diag asked for some states is
    far cheaper, so the pollers read it and fall back to /proc."""
    states = {"LISTEN": _LISTEN, "ESTABLISHED": _ESTABLISHED}
    return [
        TcpRow(s.local[1], f"{s.remote[0]}:{s.remote[1]}", states.get(s.state, ""), s.tx_queue, s.rx_queue, s.inode)
        for s in sockets
    ]


def accept_queues(pid: int, ports: set[int], rows: list[TcpRow] | None = None) -> dict[int, int]:
    """The accept-queue length of each listening port (the LISTEN row's rx_queue); `rows`: the
    target's sockets already at hand (else /proc is read)."""
    depth: dict[int, int] = {}
    for r in tcp_rows(pid) if rows is None else rows:
        if r.state == _LISTEN and r.local_port in ports:
            depth[r.local_port] = depth.get(r.local_port, 0) + r.rx_queue
    return depth


class AcceptCounter:
    """Counts the connections established to the listening ports, each once when first seen."""

    def __init__(self, pid: int, ports: set[int], keep: int = 100_000) -> None:
        self.pid = pid
        self.ports = ports
        self._seen: dict[tuple[int, str], None] = {}  # insertion-ordered: the oldest go first
        self._keep = keep

    def poll(self, rows: list[TcpRow] | None = None) -> int:
        """New connections since the last poll; `rows`: the target's sockets already at hand (else /proc is read)."""
        new = 0
        current = set()
        for r in tcp_rows(self.pid) if rows is None else rows:
            if r.state == _ESTABLISHED and r.local_port in self.ports and r.inode != 0:  # inode 0: still in the backlog
                key = (r.local_port, r.remote)
                current.add(key)
                if key not in self._seen:
                    self._seen[key] = None
                    new += 1
        for key in [k for k in self._seen if k not in current]:  # closed: a later one may reuse the address
            del self._seen[key]
        while len(self._seen) > self._keep:
            del self._seen[next(iter(self._seen))]
        return new


def remote_endpoints(
    pids: Iterable[int], inbound_ports: Iterable[int] = (), sockets: Iterable[Any] | None = None
) -> dict[tuple[str, int, str], int]:
    """Outbound connections of `pids` by (remote address, remote port, status): listening
    sockets and connections accepted on `inbound_ports` left out. `sockets`: a
    `sockdiag.tcp_sockets` answer of their namespace already at hand, matched to their
    descriptors (else psutil reads /proc/PID/net/tcp per process, which walks the kernel's
    whole socket table each time)."""
    inbound = set(inbound_ports)
    found: dict[tuple[str, int, str], int] = {}
    if sockets is not None:
        inodes = socket_inodes(pids)
        for s in sockets:
            if s.inode in inodes and s.remote[1] and s.local[1] not in inbound:
                key = (s.remote[0], s.remote[1], s.state)
                found[key] = found.get(key, 0) + 1
        return found
    import psutil

    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        for c in conns:
            if not c.raddr or (c.laddr and c.laddr.port in inbound):
                continue
            key = (str(c.raddr.ip), int(c.raddr.port), str(c.status))
            found[key] = found.get(key, 0) + 1
    return found
