"""asyncpg hook: pool acquire waits, connection holds, statements and pool gauges of every `asyncpg.Pool`.

asyncpg has no events of its own for any of this (its query loggers report after the fact,
through `call_soon`, and only for some calls), so a few methods are wrapped on the classes,
which covers every pool and connection, made before or after install:

- a `db.pool` segment "asyncpg acquire" for each `Pool._acquire` (what `pool.acquire()`,
  `async with pool.acquire()` and the pool's own `execute`/`fetch*` shortcuts all await): it
  waits in the pool's queue for a free connection holder, then opens a connection when the
  holder has none and runs the pool's `setup`. Opening a connection (`Pool._get_new_connection`,
  which also runs `init`) stays in the segment, as in OpenTelemetry's
  `db.client.connection.wait_time`, and `latprof.db.connect_ms` says how much of it that was;
- a layer-less `db.connection.hold` segment from the end of the acquire to
  `PoolConnectionHolder._release`, the one place a holder goes back to the pool's queue
  (`pool.release()` after the connection's reset, or a connection closed while checked out);
- a `db.query` segment per round trip the application starts: `Connection.execute`,
  `executemany`, `fetch`, `fetchrow`, `fetchval`, `fetchmany` (through `_execute` and
  `_executemany`), the `copy_*` methods, prepared statements' `fetch*` and `executemany`,
  cursors' bind and fetches. Named by a summary of the statement (the SQLAlchemy hook's
  `summarize`: operation and first table, e.g. "SELECT conversations"), never its text or
  parameters; an explicit `prepare()` is a round trip of its own, "PREPARE SELECT
  conversations", so that a statement's count is how often it ran. Only the outermost call
  of a task is timed (`execute` calls `_execute`; type introspection runs inside the
  statement that needed it). Plain `asyncpg.connect()` connections count as well: a
  statement is database time wherever its connection came from. Not recorded: what the pool
  runs itself inside an acquire (`setup`, `init`) or a release (the reset query), and
  statements while the SQLAlchemy hook times a statement or a checkout in the same task
  (SQLAlchemy's asyncio engine on asyncpg: that time is SQLAlchemy's `db.query` or `db.pool`
  already). Transaction control SQLAlchemy runs outside its cursor executions (COMMIT,
  ROLLBACK, its pre-ping) is recorded here, once: no other hook sees it;
- the pool gauges (size, max, in use = size - idle, waiters = the tasks waiting in the pool's
  queue), read on acquire and release at most every 100 ms per pool, and always when an
  acquire is about to wait;
- the acquire time as the OpenTelemetry histogram `db.client.connection.wait_time`, through
  `opentelemetry-api` only (a no-op unless the service configured an SDK).

A pool is named `host:port/database` from its connection arguments (no user, password or
options). Segments are recorded only inside a request. Nothing happens until asyncpg is
imported; every wrapper counts its own errors instead of raising into the service, and what
it keeps lives on the pool (bounded by its `max_size`).
"""

from __future__ import annotations

import contextvars
import functools
import os
import threading
import time
import types
from typing import Any, Callable, Mapping
from urllib.parse import parse_qs, unquote

from latprof import semconv
from latprof.collectors import runtime
from latprof.collectors import sqlalchemy as _sqlalchemy_hook
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

HOOK = "asyncpg"
SYSTEM = "postgresql"

#: Name of the `db.pool` segment of an acquire.
SEGMENT_ACQUIRE = "asyncpg acquire"

CONNECT_MS = semconv.CONNECT_MS
ERROR_TYPE = semconv.ERROR_TYPE
OTEL_WAIT_TIME = semconv.METRIC_DB_CONNECTION_WAIT_TIME  # its attribute is DB_POOL_NAME, OpenTelemetry's name

#: At most one reading of a pool's gauges per this interval, unless an acquire is about to wait.
GAUGE_INTERVAL_NS = 100_000_000
#: Longest pool name kept.
MAX_NAME_CHARS = 200

#: A statement's summary and operation: the SQLAlchemy hook's, which needs no SQLAlchemy.
summarize = _sqlalchemy_hook.summarize

_STATE_ATTR = "_latprof_pool"  # on a pool's queue (`Pool` has __slots__; its queue lives as long as it)



class _PoolState:
    """What the hook keeps per pool: its name, attributes ready to use, open holds, gauge limiter."""

    __slots__ = ("name", "attrs", "pool_attrs", "acquiring", "holds", "gauged_at_ns", "gauged")

    def __init__(self, name: str) -> None:
        self.name = name
        self.attrs: dict[str, Any] = {DB_POOL_NAME: name, DB_SYSTEM_NAME: SYSTEM}
        self.pool_attrs = {DB_POOL_NAME: name}  # for gauges, holds and the OpenTelemetry histogram
        self.acquiring = 0  # this hook's in-flight acquires (the waiter count if the queue hides its own)
        #: id(holder) -> (start_ns, request, parent segment) of a connection checked out in a
        #: request; at most one per holder, so at most `max_size` (holders live as long as the pool).
        self.holds: dict[int, tuple[int, runtime.RequestState, str | None]] = {}
        self.gauged_at_ns = -GAUGE_INTERVAL_NS  # monotonic time of the last reading
        self.gauged: tuple[float, ...] | None = None  # the last values emitted


class _Checkout:
    """One outermost `Pool._acquire` in progress."""

    __slots__ = ("state", "request", "start_ns", "token", "connect_started_ns")

    def __init__(self, state: _PoolState, request: runtime.RequestState | None, start_ns: int) -> None:
        self.state = state
        self.request = request
        self.start_ns = start_ns
        self.token: contextvars.Token[_Checkout | None] | None = None
        self.connect_started_ns: int | None = None  # when a connection opened inside began


# The acquire in progress in this task: the re-entry guard of `_acquire`, where
# `_get_new_connection` notes that a new connection is being opened for it, and what keeps the
# pool's own statements inside it (`setup`, `init`) from being recorded.
_checkout: contextvars.ContextVar[_Checkout | None] = contextvars.ContextVar("latprof_asyncpg_checkout", default=None)
# Set while this task runs a timed statement (re-entry guard), or a holder's release (whose
# reset query is the pool's business): statements started meanwhile are not recorded.
_busy: contextvars.ContextVar[bool] = contextvars.ContextVar("latprof_asyncpg_busy", default=False)

_lock = threading.RLock()
_installed = False
_patched: list[tuple[type, str, Any]] = []  # (class, attribute, original) to restore
_wait_histogram: Any = None


# --- install ---------------------------------------------------------------------------------


def install() -> bool:
    """Hook asyncpg when it is imported (now, if it already is). Idempotent."""
    global _installed
    with _lock:
        if _installed:
            return True
        _installed = True
    runtime.when_imported("asyncpg", _patch)
    return True


def uninstall() -> None:
    """Undo every patch (tests); pools keep their harmless bookkeeping."""
    global _installed
    with _lock:
        _installed = False
        _unpatch()


def _patch(asyncpg_module: types.ModuleType) -> None:
    """Wrap the pool, connection, prepared statement and cursor methods; all or nothing, errors counted."""
    with _lock:
        if not _installed or _patched:
            return
        try:
            _apply()
        except Exception as exc:
            _unpatch()
            runtime.count_error(HOOK, exc)


def _apply() -> None:
    global _wait_histogram
    from asyncpg import connection, cursor, pool, prepared_stmt

    Pool, Holder, Connection = pool.Pool, pool.PoolConnectionHolder, connection.Connection
    _replace(Pool, "_acquire", _wrap_acquire(Pool.__dict__["_acquire"]))
    _replace(Pool, "_get_new_connection", _wrap_get_new_connection(Pool.__dict__["_get_new_connection"]))
    _replace(Holder, "release", _wrap_holder_release(Holder.__dict__["release"]))
    _replace(Holder, "_release", _wrap_holder_returned(Holder.__dict__["_release"]))

    statements: list[tuple[type, str, Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]]] = [
        (Connection, "execute", _argument("query")),
        (Connection, "executemany", _argument("command")),
        (Connection, "_execute", _argument("query")),
        (Connection, "_executemany", _argument("query")),
        (Connection, "prepare", _prepared(_argument("query"))),
        (Connection, "copy_from_query", _copy_from_query),
        (Connection, "copy_from_table", _copy_table),
        (Connection, "copy_to_table", _copy_table),
        (Connection, "copy_records_to_table", _copy_table),
        (cursor.BaseCursor, "_bind_exec", _own_query),
        (cursor.BaseCursor, "_bind", _own_query),
        (cursor.BaseCursor, "_exec", _own_query),
        (cursor.Cursor, "_init", _own_query),
        (cursor.Cursor, "forward", _own_query),
    ]
    for name in ("fetch", "fetchval", "fetchrow", "fetchmany", "executemany"):  # fetchmany: asyncpg >= 0.30
        statements.append((prepared_stmt.PreparedStatement, name, _own_query))
    for cls, name, query_of in statements:
        original = cls.__dict__.get(name)
        if original is not None:
            _replace(cls, name, _wrap_statement(original, query_of))
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

        # The SQLAlchemy hook's instrument: same meter, name, unit and description, so an SDK
        # gives both hooks one histogram, told apart by the pool name.
        return metrics.get_meter("latprof").create_histogram(
            OTEL_WAIT_TIME, unit="s", description="The time it took to obtain an open connection from the pool"
        )
    except Exception as exc:  # opentelemetry-api missing or broken: the rest still works
        runtime.count_error(HOOK, exc)
        return None


# --- pools: names and state -------------------------------------------------------------------


def pool_name(dsn: Any = None, kwargs: Mapping[str, Any] | None = None, environ: Mapping[str, str] = os.environ) -> str:
    """`host:port/database` from a pool's connection arguments: no user, password or options.

    As asyncpg resolves them: keyword arguments, then the DSN (its query's `host`, `port`,
    `dbname` too), then `PGHOST`, `PGPORT`, `PGDATABASE`; `localhost` and 5432 by default.
    Several hosts stay as given (`a:5432,b:5433/app`); without a known database, `host:port`.
    """
    kwargs = kwargs or {}
    host = port = database = None
    if isinstance(dsn, str) and "://" in dsn:
        rest, _, query = dsn.split("://", 1)[1].partition("?")
        netloc, _, path = rest.partition("/")
        host = unquote(netloc.rpartition("@")[2]) or None  # credentials are before the last "@"
        database = unquote(path) or None
        params = parse_qs(query)
        host = (params.get("host") or [host])[0]
        port = (params.get("port") or [None])[0]
        database = (params.get("dbname") or params.get("database") or [database])[0]
    host = _joined(kwargs.get("host")) or host or environ.get("PGHOST") or "localhost"
    port = _joined(kwargs.get("port")) or port or environ.get("PGPORT") or "5432"
    database = _joined(kwargs.get("database")) or database or environ.get("PGDATABASE")
    if host.startswith("/") or ":" not in host.rpartition("]")[2]:  # a socket directory, or no port of its own
        host = f"{host}:{port}"
    name = f"{host}/{database}" if database else host
    return name[:MAX_NAME_CHARS]


def _joined(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or None
    return str(value)


def _pool_state(pool: Any) -> _PoolState | None:
    """The pool's state, made on first sight; None before the pool is initialised (no queue yet)."""
    queue = getattr(pool, "_queue", None)
    if queue is None:
        return None
    found: _PoolState | None = queue.__dict__.get(_STATE_ATTR)
    if found is None:
        args = getattr(pool, "_connect_args", None) or (None,)
        name = pool_name(args[0], getattr(pool, "_connect_kwargs", None))
        found = queue.__dict__.setdefault(_STATE_ATTR, _PoolState(name))
    return found


# --- acquire wait -----------------------------------------------------------------------------


def _wrap_acquire(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _acquire(self: Any, timeout: Any) -> Any:
        if _checkout.get() is not None:  # a subclass's _acquire calling this one
            return await original(self, timeout)
        checkout = _begin_checkout(self)
        if checkout is None:
            return await original(self, timeout)
        try:
            proxy = await original(self, timeout)
        except BaseException as exc:
            _end_checkout(self, checkout, None, exc)
            raise
        _end_checkout(self, checkout, proxy, None)
        return proxy

    return _acquire


def _begin_checkout(pool: Any) -> _Checkout | None:
    try:
        state = _pool_state(pool)
        if state is None:
            return None
        checkout = _Checkout(state, runtime.current_request(), runtime.now_ns())
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None
    try:
        # before counting itself; a caller that finds the queue empty waits: say so now
        will_wait = pool._queue.empty()
        _read_gauges(pool, state, force=will_wait, also_waiting=int(will_wait))
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    state.acquiring += 1
    checkout.token = _checkout.set(checkout)
    return checkout


def _end_checkout(pool: Any, checkout: _Checkout, proxy: Any, error: BaseException | None) -> None:
    end = runtime.now_ns()
    state = checkout.state
    try:  # the re-entry guard and the count first: they must never stay set
        if checkout.token is not None:
            try:
                _checkout.reset(checkout.token)
            except ValueError:  # not the context it was set in
                _checkout.set(None)
    finally:
        state.acquiring -= 1
    try:
        _read_gauges(pool, state)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    try:
        elapsed = end - checkout.start_ns
        histogram = _wait_histogram
        if histogram is not None:
            histogram.record(elapsed / 1e9, state.pool_attrs)
        request = checkout.request
        if request is None:
            return
        attrs = dict(state.attrs)
        if checkout.connect_started_ns is not None:
            attrs[CONNECT_MS] = round(min(elapsed, max(0, end - checkout.connect_started_ns)) / 1e6, 3)
        if error is not None:
            attrs[ERROR_TYPE] = type(error).__qualname__
        runtime.record(SEGMENT_ACQUIRE, DB_POOL, checkout.start_ns, end, attrs, state=request)
        holder = getattr(proxy, "_holder", None) if proxy is not None else None
        if holder is not None and runtime.active():
            # a hold nests where the acquire happened; it ends when the holder goes back
            state.holds[id(holder)] = (end, request, runtime.current_parent())
    except Exception as exc:
        runtime.count_error(HOOK, exc)


def _wrap_get_new_connection(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _get_new_connection(self: Any) -> Any:
        checkout = _checkout.get()
        if checkout is not None and checkout.connect_started_ns is None:
            checkout.connect_started_ns = runtime.now_ns()
        return await original(self)

    return _get_new_connection


# --- holds ------------------------------------------------------------------------------------


def _wrap_holder_release(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def release(self: Any, timeout: Any) -> Any:
        token = _busy.set(True)  # the reset query is the pool's, not the request's
        try:
            return await original(self, timeout)
        finally:
            try:
                _busy.reset(token)
            except ValueError:
                pass

    return release


def _wrap_holder_returned(original: Callable[[Any], None]) -> Callable[[Any], None]:
    @functools.wraps(original)
    def _release(self: Any) -> None:
        state: _PoolState | None = None
        held = None
        try:
            state = _pool_state(self._pool)
            if state is not None and state.holds:
                held = state.holds.pop(id(self), None)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
        end = runtime.now_ns()
        original(self)
        if state is None:
            return
        try:
            if held is not None:
                start, request, parent = held
                # Not under whatever segment the release happens to run in.
                runtime.record(
                    SEGMENT_CONNECTION_HOLD,
                    None,
                    start,
                    end,
                    state.pool_attrs,
                    parent_id=runtime.ROOT if parent is None else parent,
                    state=request,
                )
            _read_gauges(self._pool, state)
        except Exception as exc:
            runtime.count_error(HOOK, exc)

    return _release


# --- gauges -----------------------------------------------------------------------------------


def _waiters(pool: Any, state: _PoolState) -> int:
    getters = getattr(pool._queue, "_getters", None)  # asyncio.Queue's waiting get() calls
    return len(getters) if getters is not None else max(0, state.acquiring)


def _read_gauges(pool: Any, state: _PoolState, force: bool = False, also_waiting: int = 0) -> None:
    """Emit the pool's gauges if they changed and the last reading is 100 ms old, or if `force`."""
    now = time.monotonic_ns()
    if not force and now - state.gauged_at_ns < GAUGE_INTERVAL_NS:
        return
    if not runtime.active():
        return
    state.gauged_at_ns = now
    size = pool.get_size()
    values = (
        float(size),
        float(pool.get_max_size()),
        float(max(0, size - pool.get_idle_size())),
        float(_waiters(pool, state) + also_waiting),
    )
    if not force and values == state.gauged:
        return
    state.gauged = values
    attrs = state.pool_attrs
    runtime.gauge(GAUGE_POOL_SIZE, values[0], attrs)
    runtime.gauge(GAUGE_POOL_MAX, values[1], attrs)
    runtime.gauge(GAUGE_POOL_IN_USE, values[2], attrs)
    runtime.gauge(GAUGE_POOL_WAITERS, values[3], attrs)


# --- statements -------------------------------------------------------------------------------


def _argument(name: str) -> Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]:
    """The statement is the method's first argument, `name` when passed by keyword."""

    def query_of(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return args[0] if args else kwargs.get(name)

    return query_of


def _prepared(query_of: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]) -> Callable[..., Any]:
    """Preparing a statement is a round trip of its own, told apart from running it."""

    def prepare_of(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Prepare:
        return _Prepare(query_of(obj, args, kwargs))

    return prepare_of


class _Prepare:
    """The statement of a `prepare()`: summarised as "PREPARE " and the statement's summary."""

    __slots__ = ("query",)

    def __init__(self, query: Any) -> None:
        self.query = query


def _own_query(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A prepared statement's or a cursor's query."""
    return getattr(obj, "_query", None)


def _copy_table(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    table = args[0] if args else kwargs.get("table_name")
    schema = kwargs.get("schema_name")
    return f"COPY {_quoted(schema)}.{_quoted(table)}" if schema else f"COPY {_quoted(table)}"


def _copy_from_query(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return "COPY"  # out of a query: no table of its own to name


def _quoted(identifier: Any) -> str:
    return '"' + str(identifier).replace('"', '""') + '"'


def _sqlalchemy_busy() -> bool:
    """True while the SQLAlchemy hook times a statement or a checkout in this task: that time is its."""
    return _sqlalchemy_hook.busy()


def _wrap_statement(
    original: Callable[..., Any], query_of: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]
) -> Callable[..., Any]:
    @functools.wraps(original)
    async def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        pending = _begin_statement()
        if pending is None:
            return await original(self, *args, **kwargs)
        try:
            result = await original(self, *args, **kwargs)
        except BaseException as exc:
            _end_statement(pending, self, query_of, args, kwargs, exc)
            raise
        _end_statement(pending, self, query_of, args, kwargs, None)
        return result

    return timed


def _begin_statement() -> tuple[int, runtime.RequestState, contextvars.Token[bool]] | None:
    if _busy.get() or _checkout.get() is not None:
        return None  # inside a timed statement, an acquire or a release
    request = runtime.current_request()
    if request is None or not runtime.active():
        return None
    try:
        if _sqlalchemy_busy():
            return None
        return runtime.now_ns(), request, _busy.set(True)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None


def _end_statement(
    pending: tuple[int, runtime.RequestState, contextvars.Token[bool]],
    obj: Any,
    query_of: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    error: BaseException | None,
) -> None:
    end = runtime.now_ns()
    start, request, token = pending
    try:
        _busy.reset(token)
    except ValueError:  # not the context it was set in
        _busy.set(False)
    try:
        query = query_of(obj, args, kwargs)
        if isinstance(query, _Prepare):
            summary = "PREPARE " + summarize(query.query if isinstance(query.query, str) else "")[0]
            operation = "PREPARE"
        else:
            summary, operation = summarize(query if isinstance(query, str) else "")
        attrs: dict[str, Any] = {DB_SYSTEM_NAME: SYSTEM, DB_QUERY_SUMMARY: summary}
        if operation:
            attrs[DB_OPERATION_NAME] = operation
        if error is not None:
            attrs[ERROR_TYPE] = type(error).__qualname__
        runtime.record(summary, DB_QUERY, start, end, attrs, state=request)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
