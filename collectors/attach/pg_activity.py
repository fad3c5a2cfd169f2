"""What PostgreSQL's `pg_stat_activity` says about the target's own connections, for `latprof attach --db`.

Not a hook: one extra connection of latprof's own (psycopg 3, autocommit, `application_name`
`latprof-attach`) reads, once per `sample()`, the client backends whose `client_port` is one of
the local ports of the target's TCP connections to the server (procfs/psutil give those). Per
backend: its state (`active`, `idle`, `idle in transaction`, ...), how long it has been in that
state, in its transaction and in its latest statement, and what it waits on. The reason: an
asyncio service that holds a pooled connection across a slow LLM call leaves it `idle in
transaction` (or `idle`, checked out) on the server for seconds while other requests queue for
the pool; from the client's side the wire is just quiet.

Matching is by TCP port, so:

- the DSN must reach the server over TCP, as the target does: a unix-socket DSN (host a
  directory, or no host at all) is refused by `open()`; so are targets that connect through a
  unix socket or a pooler (pgbouncer) or NAT that changes the client port (nothing matches);
- a port says "this client"; with many client hosts the same ephemeral port can recur, and
  `sample(..., client_addrs=...)` narrows by the address the server sees too.

Privileges: reading `pg_stat_activity` needs none for the DSN user's own backends. Other
users' backends are shown with every detail NULL (state, times, waits, and client address and
port too, so they cannot even be matched) unless the DSN user has `pg_read_all_stats` (or is a
superuser). `PgActivity.restricted` says when that hid some of the target's connections.

Privacy: never the statement text (`query`): it may hold parameters. Nor user or database names.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    import psycopg

APPLICATION_NAME = "latprof-attach"
_DEFAULT_PORT = 5432

# Ages from `clock_timestamp()`, not `now()`: pg_stat_activity's snapshot is taken after the
# statement's start, so a backend that changed state in between would get a negative age.
_SAMPLE_SQL = """
SELECT pid, host(client_addr), client_port, state,
       (EXTRACT(EPOCH FROM clock_timestamp() - state_change) * 1000)::float8,
       (EXTRACT(EPOCH FROM clock_timestamp() - xact_start) * 1000)::float8,
       (EXTRACT(EPOCH FROM clock_timestamp() - query_start) * 1000)::float8,
       wait_event_type, wait_event
FROM pg_stat_activity
WHERE pid <> pg_backend_pid()
  AND ((backend_type = 'client backend' AND client_port = ANY(%s))
       OR (backend_type IS NULL AND datid IS NOT NULL))
"""
# The second branch: another user's backend hidden from a DSN user without pg_read_all_stats
# (everything but pid, datid and usesysid is NULL). Only counted, to set `restricted`.


class PgActivityError(Exception):
    """pg_stat_activity cannot be read; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class Backend:
    """One PostgreSQL client backend of the target at one moment (never its statement's text)."""

    pid: int  # the backend's PID on the server
    client_addr: str | None
    client_port: int | None
    state: str | None  # "active", "idle", "idle in transaction", "idle in transaction (aborted)", ...
    state_age_ms: float | None  # since the state last changed
    xact_age_ms: float | None  # since the transaction began; None outside one, and once it is aborted
    query_age_ms: float | None  # since the latest statement began (it may have ended)
    wait_event_type: str | None
    wait_event: str | None


class PgActivity:
    """Samples pg_stat_activity for the backends of a set of client ports, over one connection."""

    def __init__(self, dsn: str, *, connect_timeout_s: float = 5.0) -> None:
        """Remember the DSN (a libpq key=value string or URI); nothing connects until `open()`."""
        self._dsn = dsn
        self.connect_timeout_s = connect_timeout_s
        self._conn: psycopg.Connection[Any] | None = None
        self._where = ""  # "address:port" of the open connection, for error messages
        #: True once a sample found some of the asked-for ports missing while the server hid other
        #: users' backends from the DSN user: it lacks pg_read_all_stats, and the target's
        #: connections may be among those hidden.
        self.restricted = False

    def open(self) -> None:
        """Connect; idempotent while the connection lives, reconnects after it was lost.

        Raises `PgActivityError` for psycopg missing, a bad DSN, a unix-socket DSN, a server
        that cannot be reached or refuses the login, or a user not permitted to read
        pg_stat_activity.
        """
        if self._conn is not None and not self._conn.closed:
            return
        self.close()  # a lost connection still holds libpq's state
        psycopg = _psycopg()
        host, port = self._dsn_server()
        if _is_unix_socket(host):
            raise _unix_socket_error(host)
        timeout_s = max(1, math.ceil(self.connect_timeout_s))
        try:
            conn = psycopg.connect(
                self._dsn,
                autocommit=True,
                application_name=APPLICATION_NAME,
                connect_timeout=timeout_s,
                # A server that vanished without a FIN fails the next sample instead of hanging it.
                tcp_user_timeout=timeout_s * 1000,
            )
        except psycopg.Error as exc:
            raise PgActivityError(f"cannot connect to PostgreSQL at {host}:{port}: {_reason(exc)}") from exc
        try:
            if not conn.info.hostaddr:  # PGHOST or a default made it a unix socket after all
                raise _unix_socket_error(conn.info.host)
            conn.execute("SELECT set_config('statement_timeout', %s, false)", (f"{timeout_s}s",))
            conn.execute("SELECT 1 FROM pg_stat_activity LIMIT 1")
        except psycopg.errors.InsufficientPrivilege as exc:
            conn.close()
            raise PgActivityError(
                f"PostgreSQL at {host}:{port}: the DSN user is not permitted to read pg_stat_activity ({_reason(exc)})"
            ) from exc
        except psycopg.Error as exc:
            conn.close()
            raise PgActivityError(f"PostgreSQL at {host}:{port}: {_reason(exc)}") from exc
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._where = "%s:%s" % self.server()

    def server(self) -> tuple[str, int]:
        """The (address, port) the target's sockets show as remote address for this server.

        Once open, the address this connection actually reached (libpq's `hostaddr`: 'localhost'
        is whichever of ::1 and 127.0.0.1 answered, as it would for the target). Before, the
        DSN's host (or `PGHOST`; the first of a list) resolved to its first address. A
        unix-socket DSN gives its socket directory ("" for libpq's default) and port: it cannot
        be matched to TCP client ports, and `open()` refuses it. Raises `PgActivityError` for a
        bad DSN or host name.
        """
        if self._conn is not None and not self._conn.closed:
            return _normal_ip(self._conn.info.hostaddr), int(self._conn.info.port)
        host, port = self._dsn_server()
        if _is_unix_socket(host):
            return host, port
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise PgActivityError(f"cannot resolve PostgreSQL host {host}: {exc}") from exc
        return _normal_ip(str(infos[0][4][0])), port

    def sample(self, client_ports: set[int], *, client_addrs: Iterable[str] | None = None) -> list[Backend]:
        """The client backends whose client port is in `client_ports` (one query), this
        sampler's own connection excluded; with `client_addrs`, only those whose client address
        (as the server sees it) is one of them too. IPv4-mapped IPv6 addresses match their IPv4
        form. Sets `restricted` (see there).

        Raises only `PgActivityError`: not open, or the connection lost (then `open()` again).
        """
        conn = self._conn
        if conn is None or conn.closed:
            raise PgActivityError("pg_stat_activity sampler is not connected")
        if not client_ports:
            return []
        psycopg = _psycopg()
        try:
            rows = conn.execute(_SAMPLE_SQL, (sorted(client_ports),)).fetchall()
        except psycopg.Error as exc:
            if conn.closed:
                raise PgActivityError(f"lost the connection to PostgreSQL at {self._where}: {_reason(exc)}") from exc
            raise PgActivityError(f"reading pg_stat_activity at {self._where} failed: {_reason(exc)}") from exc
        addrs = None if client_addrs is None else {_normal_ip(a) for a in client_addrs}
        found: list[Backend] = []
        hidden = 0
        for pid, addr, port, state, state_age, xact_age, query_age, wait_type, wait in rows:
            if port is None:
                hidden += 1
                continue
            addr = None if addr is None else _normal_ip(addr)
            if addrs is not None and addr not in addrs:
                continue
            found.append(Backend(pid, addr, port, state, state_age, xact_age, query_age, wait_type, wait))
        if hidden and len({b.client_port for b in found}) < len(client_ports):
            self.restricted = True
        return found

    def close(self) -> None:
        """Close the connection (idempotent)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def __enter__(self) -> PgActivity:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _dsn_server(self) -> tuple[str, int]:
        """The DSN's first host (or hostaddr) and port, with libpq's environment defaults; a
        host of "" means libpq's default unix socket."""
        psycopg = _psycopg()
        from psycopg.conninfo import conninfo_to_dict

        try:
            params = conninfo_to_dict(self._dsn)
        except psycopg.Error as exc:
            raise PgActivityError(f"--db is not a valid PostgreSQL DSN: {_masked(_reason(exc))}") from None
        host = str(params.get("hostaddr") or os.environ.get("PGHOSTADDR") or params.get("host") or os.environ.get("PGHOST") or "")
        port_text = str(params.get("port") or os.environ.get("PGPORT") or _DEFAULT_PORT)
        host, port_text = host.split(",")[0], port_text.split(",")[0]
        try:
            port = int(port_text) if port_text else _DEFAULT_PORT
        except ValueError:
            raise PgActivityError(f"--db is not a valid PostgreSQL DSN: port {port_text!r} is not a number") from None
        return host, port


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise PgActivityError("--db needs psycopg: pip install 'psycopg[binary]'") from None
    return psycopg


def _is_unix_socket(host: str) -> bool:
    return os.name != "nt" and (not host or host.startswith(("/", "@")))


def _unix_socket_error(host: str) -> PgActivityError:
    where = host or "libpq's default socket"
    return PgActivityError(
        f"--db points at a unix socket ({where}): latprof matches the target's connections by TCP port, "
        "so give the server's TCP address (host=127.0.0.1 or the address the service uses)"
    )


def _normal_ip(addr: str) -> str:
    """An IP address as the kernel and psutil print it; IPv4-mapped IPv6 as plain IPv4."""
    try:
        ip = ipaddress.ip_address(addr.split("%")[0])
    except ValueError:
        return addr
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def _reason(exc: BaseException) -> str:
    """The driver's reason in one line: 'Connection refused', 'FATAL: role "x" does not exist'."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    line = lines[0]
    if "Multiple connection attempts failed" in line and len(lines) > 1:
        line = lines[-1].lstrip("- ")  # the last address tried
    if " failed: " in line:
        line = line.rsplit(" failed: ", 1)[1]
    return re.sub(r"\s+", " ", line.removeprefix("connection failed: "))


def _masked(reason: str) -> str:
    """libpq quotes the piece of a DSN it cannot parse, which may be a password: hide it (an
    unknown option's name is only a name)."""
    if reason.startswith("invalid connection option"):
        return reason
    return re.sub(r'"([^"]*)"', lambda m: m.group(0) if len(m.group(1)) < 2 else '"…"', reason)
