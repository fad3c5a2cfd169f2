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

The wrappers run on every checkout, return and statement of the service, so they are kept
cheap: the cheapest test first (recording off, no request, a checkout already in progress),
one clock reading per event reused for the gauge limiter, the attribute dicts of a pool and
of a statement text built once and handed to `runtime.record` uncopied (never mutated), and
no per-operation object beyond the segment itself.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import types
from typing import Any, Callable

from latprof import semconv
from latprof.collectors.hooks import _pools, _scaffold, runtime
from latprof.collectors.hooks._pools import ROOT as _ROOT
from latprof.collectors.hooks._pools import cost_begin as _cost_begin
from latprof.collectors.hooks._pools import cost_end as _cost_end
from latprof.collectors.hooks._pools import now_ns as _now
from latprof.collectors.hooks._pools import parent_get as _current_parent
from latprof.collectors.hooks._pools import record as _record
from latprof.collectors.hooks._pools import request_get as _current_request
# The SQLAlchemy hook's statement summary, and whether it times a checkout or a statement in
# this thread or task (SQLAlchemy on top of a psycopg_pool pool: that time is left to it).
from latprof.collectors.hooks.sqlalchemy import busy as _sqlalchemy_busy
from latprof.collectors.hooks.sqlalchemy import summarize
from latprof.layers import DB_POOL, DB_QUERY
from latprof.semconv import SEGMENT_CONNECTION_HOLD

HOOK = "psycopg_pool"

#: Name of the `db.pool` segment of a checkout.
SEGMENT_CHECKOUT = "psycopg_pool checkout"
#: OpenTelemetry's `db.system.name` of every psycopg connection.
SYSTEM = "postgresql"

CONNECT_MS = semconv.CONNECT_MS
ERROR_TYPE = semconv.ERROR_TYPE
OTEL_WAIT_TIME = semconv.METRIC_DB_CONNECTION_WAIT_TIME  # its attribute is DB_POOL_NAME, OpenTelemetry's name

#: At most one reading of a pool's gauges per this interval, unless a checkout waited ...
GAUGE_INTERVAL_NS = _pools.GAUGE_INTERVAL_NS
#: ... and then at most one per this interval: an exhausted pool makes every checkout wait.
WAITED_GAUGE_INTERVAL_NS = 10_000_000
#: A checkout slower than this (beyond opening a connection) waited for one.
WAITED_NS = _pools.WAITED_NS
#: Only the head of a statement is read to summarise it.
STATEMENT_SCAN_CHARS = 4096
#: Statement texts (up to STATEMENT_SCAN_CHARS long) whose segment name and attributes are
#: remembered, at most; the cache is emptied when full.
STATEMENT_CACHE_SIZE = 1024

_STATE_ATTR = "_latprof_pool"  # on a pool: its _pools.PoolState
_HOLD_ATTR = "_latprof_hold"  # on a checked-out connection: (start_ns, request, parent, _pools.PoolState)
_CONNECTED_ATTR = "_latprof_connected"  # on a connection a pool opened: (start_ns, end_ns) of opening it


# What this thread or task is doing under a wrapper: None, _IN_CHECKOUT (an outermost
# `getconn` is timed: the re-entry guard of `getconn`, a pool subclass calling its base, and
# what keeps the statements of `check`/`configure` out) or _IN_STATEMENT (a statement is
# timed: each statement is counted once). A checkout inside a statement is still timed; no
# statement inside either is.
_IN_CHECKOUT = "checkout"
_IN_STATEMENT = "statement"
_busy: contextvars.ContextVar[str | None] = contextvars.ContextVar("latprof_psycopg_pool_busy", default=None)

_wait_histogram: Any = None
# Statement text -> (segment name, attributes); see STATEMENT_CACHE_SIZE.
_statements: dict[str, tuple[str, dict[str, Any]]] = {}

# The hot paths call these (and _pools' shortcuts) without a call layer of their own.
_busy_get = _busy.get
_busy_set = _busy.set
_busy_reset = _busy.reset


# --- install ---------------------------------------------------------------------------------


_CURSOR_CLASSES = (
    "Cursor", "ClientCursor", "RawCursor", "ServerCursor", "RawServerCursor",
    "AsyncCursor", "AsyncClientCursor", "AsyncRawCursor", "AsyncServerCursor", "AsyncRawServerCursor",
)  # fmt: skip


def _apply(psycopg_pool_module: types.ModuleType) -> None:
    """Patch the pool and cursor classes (all or nothing: see `_scaffold`)."""
    global _wait_histogram
    import psycopg

    replace = scaffold.replace
    pools = [
        getattr(psycopg_pool_module, name, None)
        for name in ("ConnectionPool", "AsyncConnectionPool", "NullConnectionPool", "AsyncNullConnectionPool")
    ]
    wrappers = {"getconn": _wrap_getconn, "putconn": _wrap_putconn, "_connect": _wrap_connect}
    for cls in pools:
        if isinstance(cls, type):
            for name, wrap in wrappers.items():
                if name in cls.__dict__:
                    replace(cls, name, wrap(cls.__dict__[name]))
    server_cursors = tuple(c for c in (getattr(psycopg, "ServerCursor", None), getattr(psycopg, "AsyncServerCursor", None)) if c)
    for name in _CURSOR_CLASSES:
        cls = getattr(psycopg, name, None)
        if not isinstance(cls, type):
            continue
        if "execute" in cls.__dict__:
            replace(cls, "execute", _wrap_execute(cls.__dict__["execute"]))
        # A server cursor's executemany only raises NotSupportedError: no statement to time.
        if "executemany" in cls.__dict__ and not issubclass(cls, server_cursors):
            replace(cls, "executemany", _wrap_execute(cls.__dict__["executemany"]))
    _wait_histogram = runtime.connection_wait_histogram(HOOK)


def _reset() -> None:
    global _wait_histogram
    _wait_histogram = None


_T = _scaffold.Target
#: What the hook patches, in the psycopg_pool lines it is tested on (the README's and nox's).
scaffold = _scaffold.Hook(HOOK, [
    _scaffold.Library("psycopg_pool", [
        _T("psycopg_pool", "ConnectionPool", "getconn"),
        _T("psycopg_pool", "ConnectionPool", "putconn"),
        _T("psycopg_pool", "AsyncConnectionPool", "getconn", True),
        _T("psycopg_pool", "AsyncConnectionPool", "putconn", True),
        _T("psycopg", "Cursor", "execute"),
        _T("psycopg", "AsyncCursor", "execute", True),
    ], _apply, [_scaffold.Tested("psycopg_pool", "3.2", "3.3"), _scaffold.Tested("psycopg", "3.3", "3.3")]),
], _reset)  # fmt: skip
#: Hook psycopg_pool when it is imported (now, if it already is). Idempotent.
install = scaffold.install
#: Undo every patch (tests); pools and connections keep their harmless bookkeeping.
uninstall = scaffold.uninstall


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""
    return scaffold.late_coverage(
        lambda: f"{scaffold.loaded('psycopg_pool')}: pools made before the injection are seen from their next checkout"
        " (gauges included), but connections checked out before it have no hold and those opened before it no connect time"
    )


# --- pools: names and state -------------------------------------------------------------------


def _pool_state(pool: Any) -> _pools.PoolState:
    """The pool's state (see `_pools.PoolState`), made on first sight."""
    state: _pools.PoolState | None = pool.__dict__.get(_STATE_ATTR)
    if state is None:
        name = getattr(pool, "name", None) or f"psycopg_pool {type(pool).__name__} {id(pool):x}"
        state = pool.__dict__.setdefault(_STATE_ATTR, _pools.PoolState(str(name), SYSTEM))
    return state


# --- checkout wait ----------------------------------------------------------------------------


def _wrap_getconn(original: Callable[..., Any]) -> Callable[..., Any]:
    # The beginning of a checkout is inline in both wrappers: it runs on every checkout of the service.
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def agetconn(self: Any, *args: Any, **kwargs: Any) -> Any:
            if runtime._writer is None or _busy_get() is _IN_CHECKOUT:
                return await original(self, *args, **kwargs)  # not recording, or a checkout within one
            timing = _cost_begin()  # the hook's own code before the checkout: a stretch of hook code
            try:
                state = self.__dict__.get(_STATE_ATTR) or _pool_state(self)
                start = _now()
                if start >= state.gauge_due_ns or start < state.gauged_at_ns:  # gauges due
                    _read_gauges(self, state, start, False)  # before it queues: a caller served at once never waited
                token = _busy_set(_IN_CHECKOUT)
            except Exception as exc:
                runtime.count_error(HOOK, exc)
                _cost_end(timing)
                return await original(self, *args, **kwargs)
            request = _current_request()
            _cost_end(timing)
            try:
                conn = await original(self, *args, **kwargs)
            except BaseException as exc:
                _end_checkout(self, state, request, start, token, None, exc)
                raise
            _end_checkout(self, state, request, start, token, conn, None)
            return conn

        return agetconn

    @functools.wraps(original)
    def getconn(self: Any, *args: Any, **kwargs: Any) -> Any:
        if runtime._writer is None or _busy_get() is _IN_CHECKOUT:
            return original(self, *args, **kwargs)  # not recording, or a checkout within one
        timing = _cost_begin()  # the hook's own code before the checkout: a stretch of hook code
        try:
            state = self.__dict__.get(_STATE_ATTR) or _pool_state(self)
            start = _now()
            if start >= state.gauge_due_ns or start < state.gauged_at_ns:  # gauges due
                _read_gauges(self, state, start, False)  # before it queues: a caller served at once never waited
            token = _busy_set(_IN_CHECKOUT)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
            _cost_end(timing)
            return original(self, *args, **kwargs)
        request = _current_request()
        _cost_end(timing)
        try:
            conn = original(self, *args, **kwargs)
        except BaseException as exc:
            _end_checkout(self, state, request, start, token, None, exc)
            raise
        _end_checkout(self, state, request, start, token, conn, None)
        return conn

    return getconn


def _end_checkout(
    pool: Any,
    state: _pools.PoolState,
    request: runtime.RequestState | None,
    start: int,
    token: contextvars.Token[str | None],
    conn: Any,
    error: BaseException | None,
) -> None:
    """The checkout ended (with `conn`, or `error`): record it, maybe read the gauges; begin the hold.
    A stretch of hook code."""
    end = _now()
    timing = _cost_begin()
    try:
        try:  # the re-entry guard first: it must never stay set
            try:
                _busy_reset(token)
            except ValueError:  # not the context it was set in
                _busy_set(None)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
        elapsed = end - start
        connect_ns: int | None = None
        try:
            waited = False
            if conn is not None:
                opened = getattr(conn, _CONNECTED_ATTR, None)
                if opened is not None and opened[1] > start:  # opened while this caller waited
                    connect_ns = max(0, min(end, opened[1]) - max(start, opened[0]))
                    waited = elapsed - connect_ns >= WAITED_NS
                else:
                    waited = elapsed >= WAITED_NS
            # waited: how the pool looked while it waited, at most every 10 ms
            if (
                end >= (state.gauged_at_ns + WAITED_GAUGE_INTERVAL_NS if waited else state.gauge_due_ns)
                or end < state.gauged_at_ns
            ):
                _read_gauges(pool, state, end, waited)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
        try:
            _pools.checkout_recorded(SEGMENT_CHECKOUT, _wait_histogram, state, request, start, end, connect_ns, error)
            if conn is not None:  # the hold begins
                if request is None or _sqlalchemy_busy():
                    # Outside a request nothing is held; under SQLAlchemy's checkout its hook marks the hold.
                    if getattr(conn, _HOLD_ATTR, None) is not None:
                        conn._latprof_hold = None  # left by a connection returned while not recording
                else:
                    conn._latprof_hold = (end, request, _current_parent(), state)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
    finally:
        _cost_end(timing)


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


def _wrap_putconn(original: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def aputconn(self: Any, conn: Any, *args: Any, **kwargs: Any) -> Any:
            if runtime._writer is not None:
                _returning(self, conn)
            return await original(self, conn, *args, **kwargs)

        return aputconn

    @functools.wraps(original)
    def putconn(self: Any, conn: Any, *args: Any, **kwargs: Any) -> Any:
        if runtime._writer is not None:  # _returning(self, conn), inline: this runs on every return
            timing = _cost_begin()
            try:
                if getattr(conn, "_pool", None) is self:  # else not this pool's: the library raises
                    end = _now()
                    held = getattr(conn, _HOLD_ATTR, None)
                    if held is not None:
                        conn._latprof_hold = None
                        start, request, parent, state = held
                        _record(
                            SEGMENT_CONNECTION_HOLD,
                            None,
                            start,
                            end,
                            state.pool_attrs,
                            parent_id=_ROOT if parent is None else parent,
                            state=request,
                            copy_attrs=False,
                        )
                    state = self.__dict__.get(_STATE_ATTR)
                    if state is not None and (end >= state.gauge_due_ns or end < state.gauged_at_ns):  # gauges due
                        _read_gauges(self, state, end, False)
            except Exception as exc:
                runtime.count_error(HOOK, exc)
            finally:
                _cost_end(timing)
        return original(self, conn, *args, **kwargs)

    return putconn


def _returning(pool: Any, conn: Any) -> None:
    """A connection is being returned: end its hold, read the gauges (while others still wait for it).
    A stretch of hook code."""
    timing = _cost_begin()
    try:
        if getattr(conn, "_pool", None) is not pool:
            return  # not this pool's: the library raises, nothing was held
        end = _now()
        held = getattr(conn, _HOLD_ATTR, None)
        if held is not None:
            conn._latprof_hold = None
            start, request, parent, state = held
            _record(
                SEGMENT_CONNECTION_HOLD,
                None,
                start,
                end,
                state.pool_attrs,
                parent_id=_ROOT if parent is None else parent,  # where the checkout was, not the return
                state=request,
                copy_attrs=False,
            )
        state = pool.__dict__.get(_STATE_ATTR)
        if state is not None and (end >= state.gauge_due_ns or end < state.gauged_at_ns):  # gauges due
            _read_gauges(pool, state, end, False)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    finally:
        _cost_end(timing)


# --- gauges -----------------------------------------------------------------------------------

# The callers test whether a reading is due, inline (see `_pools.PoolState`), with the wall
# clock they read anyway: one reading per 100 ms at most, or per 10 ms when the checkout
# `waited`; a clock stepped backwards makes a reading due (and resets the limiter).


def _read_gauges(pool: Any, state: _pools.PoolState, now: int, waited: bool) -> None:
    """Emit the pool's gauges (due at `now`) if they changed, or always if a checkout `waited`.

    At the end of a checkout that waited, the caller has just left the queue: it is counted
    back among the waiters, so the reading says how the pool looked while it waited.
    """
    try:
        if runtime._writer is None:
            return
        state.read_at(now)
        stats = pool.get_stats()
        size = float(stats.get("pool_size", 0))
        values = (
            size,
            float(stats.get("pool_max", -1)),
            max(0.0, size - float(stats.get("pool_available", 0))),
            float(stats.get("requests_waiting", 0) + (1 if waited else 0)),
        )
        _pools.emit_gauges(state, values, waited)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


# --- statements -------------------------------------------------------------------------------


def _wrap_execute(original: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def aexecute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            request = _current_request()
            if request is None or runtime._writer is None or _busy_get() is not None:
                return await original(self, query, *args, **kwargs)
            timing = _cost_begin()  # the hook's own code before the statement: a stretch of hook code
            if not _pooled(self):
                _cost_end(timing)
                return await original(self, query, *args, **kwargs)
            start = _now()
            token = _busy_set(_IN_STATEMENT)
            _cost_end(timing)
            try:
                result = await original(self, query, *args, **kwargs)
            except BaseException as exc:
                _end_statement(self, query, request, start, token, exc)
                raise
            _end_statement(self, query, request, start, token, None)
            return result

        return aexecute

    @functools.wraps(original)
    def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        request = _current_request()
        if request is None or runtime._writer is None or _busy_get() is not None:
            return original(self, query, *args, **kwargs)
        timing = _cost_begin()  # the hook's own code before the statement: a stretch of hook code
        if not _pooled(self):
            _cost_end(timing)
            return original(self, query, *args, **kwargs)
        start = _now()
        token = _busy_set(_IN_STATEMENT)
        _cost_end(timing)
        try:
            result = original(self, query, *args, **kwargs)
        except BaseException as exc:
            _end_statement(self, query, request, start, token, exc)
            raise
        _end_statement(self, query, request, start, token, None)
        return result

    return execute


def _pooled(cursor: Any) -> bool:
    """True for a cursor of a pool's connection whose statement is this hook's (not SQLAlchemy's)."""
    try:
        try:
            conn = cursor._conn  # what the `connection` property returns, without its frame
        except AttributeError:
            conn = cursor.connection
        if getattr(conn, "_pool", None) is None:
            return False  # not a pool's connection
        return not _sqlalchemy_busy()  # else SQLAlchemy's hook times it
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return False


def _end_statement(
    cursor: Any, query: Any, request: runtime.RequestState, start: int, token: contextvars.Token[str | None], error: BaseException | None
) -> None:
    end = _now()
    timing = _cost_begin()  # a stretch of hook code
    try:
        try:
            _busy_reset(token)
        except ValueError:  # not the context it was set in
            _busy_set(None)
        if type(query) is str and len(query) <= STATEMENT_SCAN_CHARS:
            known = _statements.get(query)
            if known is None:  # (shared by its later segments, never mutated)
                summary, operation = summarize(query)
                known = summary, _pools.statement_attrs(SYSTEM, summary, operation)
                if len(_statements) >= STATEMENT_CACHE_SIZE:
                    _statements.clear()
                _statements[query] = known
        else:
            summary, operation = summarize(_statement_text(query, cursor))
            known = summary, _pools.statement_attrs(SYSTEM, summary, operation)
        name, attrs = known
        if error is not None:
            attrs = dict(attrs)
            attrs[ERROR_TYPE] = type(error).__qualname__
        _record(name, DB_QUERY, start, end, attrs, state=request, copy_attrs=False)
        runtime.saw(HOOK)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    finally:
        _cost_end(timing)


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
