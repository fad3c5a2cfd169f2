"""psycopg_pool hook: checkout waits, connection holds, statements and gauges of every psycopg 3 pool.

psycopg_pool has no events, so its public entry points are wrapped on the classes that define
them (`ConnectionPool` and `AsyncConnectionPool`; the null pools inherit them):

- `getconn` is the whole checkout: the queue (`WaitingClient.wait`), the `check` callback and,
  for a null pool, opening the connection (`connection()` calls `self.getconn`). Each outermost
  call is a `db.pool` segment "psycopg_pool checkout" named by the pool's `name`. When the
  connection it returned was opened during the wait (a null pool opens it in the caller, a
  growing pool in a worker while the caller queues), `latprof.db.connect_ms` says how much of
  the wait overlapped opening it: `_connect` is wrapped to note, on the connection itself, when
  it was opened;
- a layer-less `db.connection.hold` segment from `getconn` returning to `putconn` being called
  (`connection()` calls `self.putconn`; psycopg 3.3's `close_returns` too);
- a `db.query` segment per `execute`/`executemany` of a psycopg cursor (`Connection.execute`
  goes through one) whose connection is checked out of a pool (psycopg_pool sets
  `conn._pool` while a connection is out), named by a summary of the statement (operation and
  first table, the SQLAlchemy hook's `summarize`): never its text or its parameters. Statements
  run inside a checkout (the pool's `check` and `configure` callbacks) belong to the checkout.
  A statement the SQLAlchemy hook is timing (SQLAlchemy on top of a psycopg_pool pool) is left
  to it; connections SQLAlchemy opens itself are not from a pool and are never seen here;
- the gauges size, max, in use (size - available) and waiters from `get_stats()`, read on
  checkout and return at most every 100 ms per pool, and when a checkout had to wait (then at
  most every 10 ms);
- the checkout time as the OpenTelemetry histogram `db.client.connection.wait_time`, through
  `opentelemetry-api` only (a no-op unless the service configured an SDK).

Segments are recorded only inside a request. Nothing happens until psycopg_pool is imported,
and every wrapper counts its own errors instead of raising into the service. What is kept per
pool or connection lives on that object (a few attributes), so it goes away with it.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys
import threading
import time
import types
from typing import Any, Callable

from latprof import semconv
from latprof.collectors import runtime
from latprof.collectors.sqlalchemy import summarize
from latprof.layers import DB_POOL, DB_QUERY
from latprof.semconv import (
    DB_OPERATION_NAME,
    DB_POOL_NAME,
    DB_QUERY_SUMMARY,
    DB_SYSTEM_NAME,
    GAUGE_POOL_IN_USE,
    GAUGE_POOL_MAX,
    GAUGE_POOL_SIZE,
    GAUGE_POOL_WAITERS,
    SEGMENT_CONNECTION_HOLD,
)

HOOK = "psycopg_pool"

#: Name of the `db.pool` segment of a checkout.
SEGMENT_CHECKOUT = "psycopg_pool checkout"
#: OpenTelemetry's `db.system.name` of every psycopg connection.
SYSTEM = "postgresql"

CONNECT_MS = semconv.CONNECT_MS
ERROR_TYPE = semconv.ERROR_TYPE
OTEL_WAIT_TIME = semconv.METRIC_DB_CONNECTION_WAIT_TIME  # its attribute is DB_POOL_NAME, OpenTelemetry's name

#: At most one reading of a pool's gauges per this interval, unless a checkout waited ...
GAUGE_INTERVAL_NS = 100_000_000
#: ... and then at most one per this interval: an exhausted pool makes every checkout wait.
WAITED_GAUGE_INTERVAL_NS = 10_000_000
#: A checkout slower than this (beyond opening a connection) waited for one.
WAITED_NS = 1_000_000
#: Only the head of a statement is read to summarise it.
STATEMENT_SCAN_CHARS = 4096

_STATE_ATTR = "_latprof_pool"  # on a pool: its _PoolState
_HOLD_ATTR = "_latprof_hold"  # on a checked-out connection: (start_ns, request, parent, pool name)
_CONNECTED_ATTR = "_latprof_connected"  # on a connection a pool opened: (start_ns, end_ns) of opening it

# Where the SQLAlchemy hook keeps the checkout and the statement it is timing.
_SQLALCHEMY_HOOK = "latprof.collectors.sqlalchemy"


class _PoolState:
    """What the hook keeps per pool: its name, attributes ready to use, the gauge limiter."""

    __slots__ = ("name", "attrs", "pool_attrs", "gauged_at_ns", "gauged")

    def __init__(self, name: str) -> None:
        self.name = name
        self.attrs: dict[str, Any] = {DB_POOL_NAME: name, DB_SYSTEM_NAME: SYSTEM}
        self.pool_attrs = {DB_POOL_NAME: name}  # for gauges, holds and the OpenTelemetry histogram
        self.gauged_at_ns = -GAUGE_INTERVAL_NS  # monotonic time of the last reading
        self.gauged: tuple[float, ...] | None = None  # the last values emitted


class _Checkout:
    """One outermost `getconn` in progress."""

    __slots__ = ("state", "request", "start_ns", "token")

    def __init__(self, state: _PoolState, request: runtime.RequestState | None, start_ns: int) -> None:
        self.state = state
        self.request = request
        self.start_ns = start_ns
        self.token: contextvars.Token[_Checkout | None] | None = None


# The checkout in progress in this thread or task: the re-entry guard of `getconn` (a pool
# subclass calling its base), and what keeps the statements of `check`/`configure` out.
_checkout: contextvars.ContextVar[_Checkout | None] = contextvars.ContextVar("latprof_psycopg_pool_checkout", default=None)
# True while a statement of this thread or task is timed: each statement is counted once.
_executing: contextvars.ContextVar[bool] = contextvars.ContextVar("latprof_psycopg_pool_executing", default=False)

_lock = threading.RLock()
_installed = False
_patched: list[tuple[type, str, Any]] = []  # (class, attribute, original) to restore
_wait_histogram: Any = None


# --- install ---------------------------------------------------------------------------------


def install() -> bool:
    """Hook psycopg_pool when it is imported (now, if it already is). Idempotent."""
    global _installed
    with _lock:
        if _installed:
            return True
        _installed = True
    runtime.when_imported("psycopg_pool", _patch)
    return True


def uninstall() -> None:
    """Undo every patch (tests); pools and connections keep their harmless bookkeeping."""
    global _installed
    with _lock:
        _installed = False
        _unpatch()


def _patch(psycopg_pool_module: types.ModuleType) -> None:
    """Patch the pool and cursor classes; all or nothing, errors counted."""
    with _lock:
        if not _installed or _patched:
            return
        try:
            _apply(psycopg_pool_module)
        except Exception as exc:
            _unpatch()
            runtime.count_error(HOOK, exc)


_CURSOR_CLASSES = (
    "Cursor", "ClientCursor", "RawCursor", "ServerCursor", "RawServerCursor",
    "AsyncCursor", "AsyncClientCursor", "AsyncRawCursor", "AsyncServerCursor", "AsyncRawServerCursor",
)  # fmt: skip


def _apply(psycopg_pool_module: types.ModuleType) -> None:
    global _wait_histogram
    import psycopg

    pools = [
        getattr(psycopg_pool_module, name, None)
        for name in ("ConnectionPool", "AsyncConnectionPool", "NullConnectionPool", "AsyncNullConnectionPool")
    ]
    wrappers = {"getconn": _wrap_getconn, "putconn": _wrap_putconn, "_connect": _wrap_connect}
    for cls in pools:
        if isinstance(cls, type):
            for name, wrap in wrappers.items():
                if name in cls.__dict__:
                    _replace(cls, name, wrap(cls.__dict__[name]))
    server_cursors = tuple(c for c in (getattr(psycopg, "ServerCursor", None), getattr(psycopg, "AsyncServerCursor", None)) if c)
    for name in _CURSOR_CLASSES:
        cls = getattr(psycopg, name, None)
        if not isinstance(cls, type):
            continue
        if "execute" in cls.__dict__:
            _replace(cls, "execute", _wrap_execute(cls.__dict__["execute"]))
        # A server cursor's executemany only raises NotSupportedError: no statement to time.
        if "executemany" in cls.__dict__ and not issubclass(cls, server_cursors):
            _replace(cls, "executemany", _wrap_execute(cls.__dict__["executemany"]))
    _wait_histogram = _make_wait_histogram()


def _replace(cls: type, name: str, wrapper: Callable[..., Any]) -> None:
    original = cls.__dict__[name]
    if getattr(original, "__latprof_original__", None) is not None:
        return  # patched already (another copy of this module)
    wrapper.__latprof_original__ = original  # type: ignore[attr-defined]
    setattr(cls, name, wrapper)
    _patched.append((cls, name, original))


def _unpatch() -> None:
    global _wait_histogram
    for cls, name, original in reversed(_patched):
        setattr(cls, name, original)
    _patched.clear()
    _wait_histogram = None


def _make_wait_histogram() -> Any:
    try:
        from opentelemetry import metrics

        return metrics.get_meter("latprof").create_histogram(
            OTEL_WAIT_TIME, unit="s", description="The time it took to obtain an open connection from the pool"
        )
    except Exception as exc:  # opentelemetry-api missing or broken: the rest still works
        runtime.count_error(HOOK, exc)
        return None


def _sqlalchemy_busy() -> bool:
    """True while the SQLAlchemy hook times a checkout or a statement in this thread or task."""
    module = sys.modules.get(_SQLALCHEMY_HOOK)
    return module is not None and bool(module.busy())


# --- pools: names and state -------------------------------------------------------------------


def _pool_state(pool: Any) -> _PoolState:
    state: _PoolState | None = pool.__dict__.get(_STATE_ATTR)
    if state is None:
        name = getattr(pool, "name", None) or f"psycopg_pool {type(pool).__name__} {id(pool):x}"
        state = pool.__dict__.setdefault(_STATE_ATTR, _PoolState(str(name)))
    return state


# --- checkout wait ----------------------------------------------------------------------------


def _wrap_getconn(original: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def agetconn(self: Any, *args: Any, **kwargs: Any) -> Any:
            checkout = _begin_checkout(self)
            if checkout is None:
                return await original(self, *args, **kwargs)
            try:
                conn = await original(self, *args, **kwargs)
            except BaseException as exc:
                _end_checkout(self, checkout, None, exc)
                raise
            _end_checkout(self, checkout, conn, None)
            return conn

        return agetconn

    @functools.wraps(original)
    def getconn(self: Any, *args: Any, **kwargs: Any) -> Any:
        checkout = _begin_checkout(self)
        if checkout is None:
            return original(self, *args, **kwargs)
        try:
            conn = original(self, *args, **kwargs)
        except BaseException as exc:
            _end_checkout(self, checkout, None, exc)
            raise
        _end_checkout(self, checkout, conn, None)
        return conn

    return getconn


def _begin_checkout(pool: Any) -> _Checkout | None:
    """Start timing an outermost checkout; None when there is nothing to time (or the hook failed)."""
    try:
        if not runtime.active() or _checkout.get() is not None:
            return None
        state = _pool_state(pool)
        checkout = _Checkout(state, runtime.current_request(), runtime.now_ns())
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None
    try:
        _read_gauges(pool, state)  # before it queues: a caller served at once never waited
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    checkout.token = _checkout.set(checkout)
    return checkout


def _end_checkout(pool: Any, checkout: _Checkout, conn: Any, error: BaseException | None) -> None:
    end = runtime.now_ns()
    try:  # the re-entry guard first: it must never stay set
        try:
            _checkout.reset(checkout.token)  # type: ignore[arg-type]
        except ValueError:  # not the context it was set in
            _checkout.set(None)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    state = checkout.state
    elapsed = end - checkout.start_ns
    connect_ns: int | None = None
    try:
        opened = getattr(conn, _CONNECTED_ATTR, None) if conn is not None else None
        if opened is not None and opened[1] > checkout.start_ns:  # opened while this caller waited
            connect_ns = max(0, min(end, opened[1]) - max(checkout.start_ns, opened[0]))
        if conn is not None and elapsed - (connect_ns or 0) >= WAITED_NS:
            _read_gauges(pool, state, waited=True)  # how the pool looked while it waited
        else:
            _read_gauges(pool, state)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    try:
        histogram = _wait_histogram
        if histogram is not None:
            histogram.record(elapsed / 1e9, state.pool_attrs)
        request = checkout.request
        if request is not None:
            attrs = dict(state.attrs)
            if connect_ns is not None:
                attrs[CONNECT_MS] = round(connect_ns / 1e6, 3)
            if error is not None:
                attrs[ERROR_TYPE] = type(error).__qualname__
            runtime.record(SEGMENT_CHECKOUT, DB_POOL, checkout.start_ns, end, attrs, state=request)
        if conn is not None:
            _begin_hold(conn, request, state, end)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


def _wrap_connect(original: Callable[..., Any]) -> Callable[..., Any]:
    """`_connect` opens every connection of a pool: note on it when that happened."""
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def aconnect(self: Any, *args: Any, **kwargs: Any) -> Any:
            start = runtime.now_ns()
            conn = await original(self, *args, **kwargs)
            _note_connected(conn, start)
            return conn

        return aconnect

    @functools.wraps(original)
    def connect(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = runtime.now_ns()
        conn = original(self, *args, **kwargs)
        _note_connected(conn, start)
        return conn

    return connect


def _note_connected(conn: Any, start: int) -> None:
    try:
        setattr(conn, _CONNECTED_ATTR, (start, runtime.now_ns()))
    except Exception as exc:  # a connection class without a __dict__: no connect time, nothing else lost
        runtime.count_error(HOOK, exc)


# --- holds ------------------------------------------------------------------------------------


def _begin_hold(conn: Any, request: runtime.RequestState | None, state: _PoolState, start: int) -> None:
    if request is None or _sqlalchemy_busy():
        # Outside a request nothing is held; under SQLAlchemy's checkout its hook marks the hold.
        if getattr(conn, _HOLD_ATTR, None) is not None:
            setattr(conn, _HOLD_ATTR, None)  # left by a connection returned while not recording
        return
    setattr(conn, _HOLD_ATTR, (start, request, runtime.current_parent(), state.name))


def _wrap_putconn(original: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def aputconn(self: Any, conn: Any, *args: Any, **kwargs: Any) -> Any:
            _returning(self, conn)
            return await original(self, conn, *args, **kwargs)

        return aputconn

    @functools.wraps(original)
    def putconn(self: Any, conn: Any, *args: Any, **kwargs: Any) -> Any:
        _returning(self, conn)
        return original(self, conn, *args, **kwargs)

    return putconn


def _returning(pool: Any, conn: Any) -> None:
    """A connection is being returned: end its hold, read the gauges (while others still wait for it)."""
    try:
        if not runtime.active() or getattr(conn, "_pool", None) is not pool:
            return  # not recording, or not this pool's: the library raises, nothing was held
        end = runtime.now_ns()
        held = getattr(conn, _HOLD_ATTR, None)
        if held is not None:
            setattr(conn, _HOLD_ATTR, None)
            start, request, parent, name = held
            runtime.record(
                SEGMENT_CONNECTION_HOLD,
                None,
                start,
                end,
                {DB_POOL_NAME: name},
                parent_id=runtime.ROOT if parent is None else parent,  # where the checkout was, not the return
                state=request,
            )
        state = pool.__dict__.get(_STATE_ATTR)
        if state is not None:
            _read_gauges(pool, state)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


# --- gauges -----------------------------------------------------------------------------------


def _read_gauges(pool: Any, state: _PoolState, waited: bool = False) -> None:
    """Emit the pool's gauges if they changed and the last reading is 100 ms old, or 10 ms if a checkout `waited`.

    At the end of a checkout that waited, the caller has just left the queue: it is counted
    back among the waiters, so the reading says how the pool looked while it waited.
    """
    now = time.monotonic_ns()
    if now - state.gauged_at_ns < (WAITED_GAUGE_INTERVAL_NS if waited else GAUGE_INTERVAL_NS):
        return
    if not runtime.active():
        return
    state.gauged_at_ns = now
    stats = pool.get_stats()
    size = float(stats.get("pool_size", 0))
    values = (
        size,
        float(stats.get("pool_max", -1)),
        max(0.0, size - float(stats.get("pool_available", 0))),
        float(stats.get("requests_waiting", 0) + (1 if waited else 0)),
    )
    if not waited and values == state.gauged:
        return
    state.gauged = values
    attrs = state.pool_attrs
    runtime.gauge(GAUGE_POOL_SIZE, values[0], attrs)
    if values[1] >= 0:
        runtime.gauge(GAUGE_POOL_MAX, values[1], attrs)
    runtime.gauge(GAUGE_POOL_IN_USE, values[2], attrs)
    runtime.gauge(GAUGE_POOL_WAITERS, values[3], attrs)


# --- statements -------------------------------------------------------------------------------


def _wrap_execute(original: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def aexecute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            pending = _begin_statement(self)
            if pending is None:
                return await original(self, query, *args, **kwargs)
            try:
                result = await original(self, query, *args, **kwargs)
            except BaseException as exc:
                _end_statement(self, query, pending, exc)
                raise
            _end_statement(self, query, pending, None)
            return result

        return aexecute

    @functools.wraps(original)
    def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        pending = _begin_statement(self)
        if pending is None:
            return original(self, query, *args, **kwargs)
        try:
            result = original(self, query, *args, **kwargs)
        except BaseException as exc:
            _end_statement(self, query, pending, exc)
            raise
        _end_statement(self, query, pending, None)
        return result

    return execute


_Pending = tuple[int, runtime.RequestState, "contextvars.Token[bool]"]


def _begin_statement(cursor: Any) -> _Pending | None:
    """Start timing a statement of a pooled connection inside a request; None to leave it alone."""
    request = runtime.current_request()
    if request is None:
        return None
    try:
        if _executing.get() or _checkout.get() is not None or not runtime.active():
            return None
        if getattr(cursor.connection, "_pool", None) is None or _sqlalchemy_busy():
            return None  # not a pool's connection, or SQLAlchemy's hook times it
        return runtime.now_ns(), request, _executing.set(True)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None


def _end_statement(cursor: Any, query: Any, pending: _Pending, error: BaseException | None) -> None:
    end = runtime.now_ns()
    start, request, token = pending
    try:
        try:
            _executing.reset(token)
        except ValueError:  # not the context it was set in
            _executing.set(False)
        summary, operation = summarize(_statement_text(query, cursor))
        attrs: dict[str, Any] = {DB_SYSTEM_NAME: SYSTEM, DB_QUERY_SUMMARY: summary}
        if operation:
            attrs[DB_OPERATION_NAME] = operation
        if error is not None:
            attrs[ERROR_TYPE] = type(error).__qualname__
        runtime.record(summary, DB_QUERY, start, end, attrs, state=request)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


def _statement_text(query: Any, cursor: Any) -> str:
    """The head of the statement's text, to summarise: str, bytes, `psycopg.sql` or a t-string."""
    if isinstance(query, str):
        return query
    if isinstance(query, (bytes, bytearray, memoryview)):
        return bytes(query[:STATEMENT_SCAN_CHARS]).decode("utf-8", "replace")
    as_string = getattr(query, "as_string", None)
    if as_string is not None:  # psycopg.sql.Composable: identifiers quoted, literals skipped by the summary
        try:
            return str(as_string(cursor.connection))
        except Exception:  # a closed connection cannot quote: still a statement, summarised as OTHER
            return ""
    strings = getattr(query, "strings", None)  # string.templatelib.Template: the text between values
    if isinstance(strings, tuple):
        return " ? ".join(s for s in strings if isinstance(s, str))
    return ""

