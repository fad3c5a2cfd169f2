"""What the inbound hooks (ASGI, WSGI) share: when a request's bytes reached the socket, X-Request-Start, notes.

Not a hook itself (the leading underscore keeps it out of `latprof run --list`).

- **TCP_INFO.** On Linux `getsockopt(TCP_INFO)` on a connection gives `tcpi_last_data_recv`
  (u32 at byte 52: milliseconds since data last arrived, counted in kernel ticks of 1-10 ms).
  The kernel counts in ticks: N ticks since the data arrived means between N-1 and N+1 ticks
  of real time; the lower bound is taken, so that a request read at once never looks queued.
- **X-Request-Start.** `t=` then seconds, milliseconds, microseconds or nanoseconds since the
  epoch, told apart by magnitude (nginx sends `t=1732912345.123`, Heroku integer
  milliseconds, New Relic agents accept microseconds). Believed only when not after the
  socket arrival and within the last `MAX_QUEUE_NS`.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from latprof.collectors.hooks import runtime
from latprof.events import QualityRecord
from latprof.semconv import NOTE_CLOCK, NOTE_WARNING

#: An arrival time further back than this (from TCP_INFO or X-Request-Start) is not believed.
MAX_QUEUE_NS = 600 * 1_000_000_000

_TCP_INFO_LEN = 104
_LAST_DATA_RECV_OFFSET = 52  # struct tcp_info: 8 bytes of u8 fields, then u32 rto, ato, ...
_CLOCK_MONOTONIC_COARSE = 6  # Linux; its resolution is the tick. Not exposed by the time module.

# Bound on first use (`load()`): importing socket costs every process that loads the hooks,
# and most never serve HTTP.
TCP_INFO: int | None = None
IPPROTO_TCP = 6
TCP_FAMILIES: tuple[int, ...] = ()
#: The kernel's tick (1/HZ); 10 ms (HZ=100) until measured.
TICK_NS = 10_000_000
_loaded = False

_noted: set[str] = set()  # quality notes this process wrote already
os.register_at_fork(after_in_child=_noted.clear)  # a forked worker writes its own


def load() -> None:
    """Bind the socket constants and measure the tick; idempotent."""
    global TCP_INFO, IPPROTO_TCP, TCP_FAMILIES, TICK_NS, _loaded
    if _loaded:
        return
    import socket

    TCP_INFO = getattr(socket, "TCP_INFO", None)  # Linux only
    IPPROTO_TCP = socket.IPPROTO_TCP
    TCP_FAMILIES = (socket.AF_INET, socket.AF_INET6)
    if TCP_INFO is not None:
        try:
            TICK_NS = min(max(int(time.clock_getres(_CLOCK_MONOTONIC_COARSE) * 1e9), 1_000_000), 10_000_000)
        except (OSError, AttributeError):
            pass
    _loaded = True


def has_tcp_info(sock: Any) -> bool:
    """Whether `sock` is a TCP socket whose TCP_INFO can be read (Linux)."""
    return sock is not None and TCP_INFO is not None and getattr(sock, "family", None) in TCP_FAMILIES


def last_data_arrival(sock: Any, now_ns: int) -> int | None:
    """When `sock` last received data (wall-clock ns), from TCP_INFO; None if unknown.

    `now_ns` (wall clock) is returned when the data arrived within a tick: that is "now" as
    far as TCP_INFO can tell.
    """
    try:
        raw = sock.getsockopt(IPPROTO_TCP, TCP_INFO, _TCP_INFO_LEN)
    except (OSError, TypeError, AttributeError):
        return None
    if len(raw) < _LAST_DATA_RECV_OFFSET + 4:
        return None
    ago_ms = int.from_bytes(raw[_LAST_DATA_RECV_OFFSET : _LAST_DATA_RECV_OFFSET + 4], sys.byteorder)
    ago_ns = ago_ms * 1_000_000 - TICK_NS
    if ago_ns <= 0:
        return now_ns
    if ago_ns > MAX_QUEUE_NS:
        return None
    return now_ns - ago_ns


def parse_request_start(value: bytes | str) -> int | None:
    """Parse an X-Request-Start value into wall-clock ns: `t=` optional, then s, ms, µs or ns by magnitude."""
    text = value.decode("latin-1") if isinstance(value, (bytes, bytearray)) else str(value)
    text = text.strip()
    if text[:2] in ("t=", "T="):
        text = text[2:].strip()
    try:
        number = float(text)
    except ValueError:
        return None
    if not number > 0 or number == float("inf"):
        return None
    if number < 1e11:
        scale = 1e9
    elif number < 1e14:
        scale = 1e6
    elif number < 1e17:
        scale = 1e3
    else:
        scale = 1.0
    return int(number * scale)


def header_start(value: bytes | str | None, arrival_ns: int, hook: str) -> int | None:
    """The X-Request-Start time (wall-clock ns) when present, believable and not after the socket arrival."""
    if value is None:
        return None
    started = parse_request_start(value)
    if started is None or started < arrival_ns - MAX_QUEUE_NS:
        note_once(hook, NOTE_WARNING, f"{hook}: ignored X-Request-Start values that are not a time in the last 10 minutes")
        return None
    if started > arrival_ns:
        note_once(
            hook,
            NOTE_CLOCK,
            f"{hook}: ignored X-Request-Start values later than the request's arrival at the socket"
            " (the proxy's clock is ahead of this host's)",
        )
        return None
    return started


def note_once(hook: str, kind: str, message: str) -> None:
    """Write a quality record once per process and message."""
    if message in _noted:
        return
    _noted.add(message)
    runtime.emit(QualityRecord(kind, runtime.now_ns(), runtime.pid(), message, 1, {"collector": hook}))
