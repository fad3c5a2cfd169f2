"""What the connection-pool hooks (sqlalchemy, psycopg_pool, asyncpg, redis) share: pool state, gauges.

Not a hook itself. Each pool hook keeps its wrappers and its hot paths in its own module
(inline, one clock reading per event), and patches through `_scaffold` as every hook does;
what is the same for the pool hooks lives here:

- `PoolState`: what a hook keeps per pool (its name, the attribute dicts its segments share,
  the 100 ms gauge limiter and the last reading), which each hook extends with its own slots;
- `emit_gauges`: one reading of a pool's gauges, emitted when it changed;
- `statement_attrs`: the attributes of a `db.query` segment;
- the hot paths' shortcuts into `runtime` (its context variables' `get`, the clock, `record`,
  and `cost_begin` / `cost_end`, which mark a hook's own code around the service's calls as
  stretches of hook code: `runtime`, "what the hooks cost"; psycopg_pool's so far). The
  helpers here are never stretches of their own: a hook calls them inside its.
"""

from __future__ import annotations

from typing import Any

from latprof.collectors.hooks import runtime
from latprof.layers import DB_POOL
from latprof.semconv import (
    CONNECT_MS,
    DB_OPERATION_NAME,
    DB_POOL_NAME,
    DB_QUERY_SUMMARY,
    DB_SYSTEM_NAME,
    ERROR_TYPE,
    GAUGE_POOL_IN_USE,
    GAUGE_POOL_MAX,
    GAUGE_POOL_OVERFLOW,
    GAUGE_POOL_SIZE,
    GAUGE_POOL_WAITERS,
)

#: At most one reading of a pool's gauges per this interval, unless a checkout waited.
GAUGE_INTERVAL_NS = 100_000_000
#: A checkout slower than this (beyond opening a connection) waited for one.
WAITED_NS = 1_000_000

# The hot paths call these without the frame of runtime's own one-line functions
# (`current_request`, `current_parent`, `record`'s module lookup): same context variables,
# same clock. Each hook binds them to module globals of its own.
request_get = runtime._request.get
parent_get = runtime._parent.get
now_ns = runtime.now_ns
record = runtime.record
cost_begin = runtime.cost_begin
cost_end = runtime.cost_end
ROOT = runtime.ROOT


class PoolState:
    """What a pool hook keeps per pool: its name, attributes ready to use, the gauge limiter.

    `attrs` (a checkout's: the pool's name and, when known, its `db.system.name`) and
    `pool_attrs` (gauges, holds and the OpenTelemetry histogram: the name only) are handed to
    every segment as they are (`copy_attrs=False`): never mutated once built.

    The limiter: a reading is due when `now >= gauge_due_ns or now < gauged_at_ns` (the wall
    clock went back), which the hot paths test inline with the `now_ns()` they read anyway
    (compares, no arithmetic); `read_at(now)` notes a reading, `emit_gauges` emits it.
    """

    __slots__ = ("name", "attrs", "pool_attrs", "gauged_at_ns", "gauge_due_ns", "gauged")

    def __init__(self, name: str, system: str | None) -> None:
        self.name = name
        self.attrs: dict[str, Any] = {DB_POOL_NAME: name}
        if system:
            self.attrs[DB_SYSTEM_NAME] = system
        self.pool_attrs = {DB_POOL_NAME: name}
        self.gauged_at_ns = 0  # `now_ns()` of the last reading
        self.gauge_due_ns = 0  # when the next one is due
        self.gauged: tuple[float, ...] | None = None  # the last values emitted

    def read_at(self, now: int) -> None:
        """A reading of the gauges is taken at `now`: the next one is due GAUGE_INTERVAL_NS later."""
        self.gauged_at_ns = now
        self.gauge_due_ns = now + GAUGE_INTERVAL_NS


def emit_gauges(state: PoolState, values: tuple[float, ...], force: bool) -> None:
    """Emit a reading of the pool's gauges if it differs from the last one, or always if `force`.

    `values` is (size, most allowed or -1 for no limit, in use, waiters), or (size, most, in
    use, overflow, waiters) for a pool that tells its overflow; a limit of -1 is not emitted.
    """
    if not force and values == state.gauged:
        return
    state.gauged = values
    attrs = state.pool_attrs
    gauge = runtime.gauge
    gauge(GAUGE_POOL_SIZE, values[0], attrs)
    if values[1] >= 0:
        gauge(GAUGE_POOL_MAX, values[1], attrs)
    gauge(GAUGE_POOL_IN_USE, values[2], attrs)
    if len(values) > 4:
        gauge(GAUGE_POOL_OVERFLOW, values[3], attrs)
    gauge(GAUGE_POOL_WAITERS, values[-1], attrs)


def statement_attrs(system: str, summary: str, operation: str) -> dict[str, Any]:
    """The attributes of a `db.query` segment: the system, the statement's summary and its operation if known."""
    attrs: dict[str, Any] = {DB_SYSTEM_NAME: system, DB_QUERY_SUMMARY: summary}
    if operation:
        attrs[DB_OPERATION_NAME] = operation
    return attrs


def checkout_recorded(name: str, histogram: Any, state: PoolState, request: runtime.RequestState | None, start: int, end: int,
                      connect_ns: int | None, error: BaseException | None) -> None:  # fmt: skip
    """What both pool hooks record at the end of a checkout: its wait into OpenTelemetry's wait-time
    `histogram` (when one is set and an SDK is behind it: a proxy with no SDK records nothing, so
    its call is skipped), and in a request the `db.pool` segment `name` from `start` to `end`, with
    the connect time the wait included (`connect_ns`) and the error it ended with."""
    if histogram is not None and getattr(histogram, "_real_instrument", True) is not None:
        histogram.record((end - start) / 1e9, state.pool_attrs)
    if request is not None:
        attrs = state.attrs
        if connect_ns is not None or error is not None:
            attrs = dict(attrs)
            if connect_ns is not None:
                attrs[CONNECT_MS] = round(connect_ns / 1e6, 3)
            if error is not None:
                attrs[ERROR_TYPE] = type(error).__qualname__
        record(name, DB_POOL, start, end, attrs, state=request, copy_attrs=False)
