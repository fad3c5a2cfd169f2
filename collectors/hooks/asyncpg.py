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
import types
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import parse_qs, unquote

from latprof import semconv
from latprof.collectors.hooks import _pools, _scaffold, runtime
from latprof.collectors.hooks import sqlalchemy as _sqlalchemy_hook
from latprof.collectors.hooks._pools import ROOT as _ROOT
from latprof.collectors.hooks._pools import now_ns as _now
from latprof.collectors.hooks._pools import parent_get as _parent_get
from latprof.collectors.hooks._pools import record as _record
from latprof.collectors.hooks._pools import request_get as _request_get
from latprof.layers import DB_POOL, DB_QUERY
from latprof.semconv import SEGMENT_CONNECTION_HOLD

HOOK = "asyncpg"
SYSTEM = "postgresql"

#: Name of the `db.pool` segment of an acquire.
SEGMENT_ACQUIRE = "asyncpg acquire"

CONNECT_MS = semconv.CONNECT_MS
ERROR_TYPE = semconv.ERROR_TYPE
OTEL_WAIT_TIME = semconv.METRIC_DB_CONNECTION_WAIT_TIME  # its attribute is DB_POOL_NAME, OpenTelemetry's name

#: At most one reading of a pool's gauges per this interval, unless an acquire is about to wait.
GAUGE_INTERVAL_NS = _pools.GAUGE_INTERVAL_NS
#: Longest pool name kept.
MAX_NAME_CHARS = 200
#: Statement summaries whose segment attributes are kept ready, at most; emptied when full.
STATEMENT_ATTRS_CACHE_SIZE = 1024

#: A statement's summary and operation: the SQLAlchemy hook's, which needs no SQLAlchemy.
summarize = _sqlalchemy_hook.summarize

_STATE_ATTR = "_latprof_pool"  # on a pool's queue (`Pool` has __slots__; its queue lives as long as it)
# (the hot paths read it as a plain attribute, `queue._latprof_pool`: cheaper than `__dict__`)


class _PoolState(_pools.PoolState):
    """What the hook keeps per pool (see `_pools.PoolState`), with its in-flight acquires and open holds."""

    __slots__ = ("acquiring", "holds")

    def __init__(self, name: str) -> None:
        super().__init__(name, SYSTEM)
        self.acquiring = 0  # this hook's in-flight acquires (the waiter count if the queue hides its own)
        #: holder -> (start_ns, request, parent segment or runtime.ROOT) of a connection checked
        #: out in a request; at most one per holder, so at most `max_size` (holders live as long
        #: as the pool, and are hashed by identity).
        self.holds: dict[Any, tuple[int, runtime.RequestState, Any]] = {}


class _Checkout:
    """One outermost `Pool._acquire` in progress.

    Made by _begin_checkout with `object.__new__` and its slots set there (no `__init__` call
    per acquire): `state` (the pool's _PoolState), `request` (None outside a request),
    `start_ns`, `connect_started_ns` (when a connection opened inside began, else None) and
    `token` (of `_checkout`).
    """

    __slots__ = ("state", "request", "start_ns", "token", "connect_started_ns")
    state: _PoolState
    request: runtime.RequestState | None
    start_ns: int
    token: contextvars.Token[_Checkout | None]
    connect_started_ns: int | None


# The acquire in progress in this task: the re-entry guard of `_acquire`, where
# `_get_new_connection` notes that a new connection is being opened for it, and what keeps the
# pool's own statements inside it (`setup`, `init`) from being recorded.
_checkout: contextvars.ContextVar[_Checkout | None] = contextvars.ContextVar("latprof_asyncpg_checkout", default=None)
# Set while this task runs a timed statement (re-entry guard), or a holder's release (whose
# reset query is the pool's business): statements started meanwhile are not recorded.
_busy: contextvars.ContextVar[bool] = contextvars.ContextVar("latprof_asyncpg_busy", default=False)
# A statement segment's attributes by its (summary, operation), shared by the segments of
# statements without an error (recorded with copy_attrs=False, never changed once here).
_statement_attrs: dict[tuple[str, str], dict[str, Any]] = {}

# Hot-path shortcuts (besides _pools'): no call layer per statement.
_checkout_get = _checkout.get
_checkout_set = _checkout.set
_checkout_reset = _checkout.reset
_busy_get = _busy.get
_busy_set = _busy.set
_busy_reset = _busy.reset
_active = runtime.active
_new = object.__new__  # a slotted object without an __init__ call

_wait_histogram: Any = None
# Whether it is opentelemetry-api's proxy instrument, which records nothing until the service
# configures an SDK (then its `_real_instrument` is set): a histogram not worth a call until then.
_wait_histogram_proxy = False


# --- install ---------------------------------------------------------------------------------


def _apply(asyncpg_module: types.ModuleType) -> None:
    """Wrap the pool, connection, prepared statement and cursor methods (all or nothing: see `_scaffold`)."""
    global _wait_histogram, _wait_histogram_proxy
    from asyncpg import connection, cursor, pool, prepared_stmt  # type: ignore[import-untyped]

    replace = scaffold.replace
    Pool, Holder, Connection = pool.Pool, pool.PoolConnectionHolder, connection.Connection
    replace(Pool, "_acquire", _wrap_acquire(Pool.__dict__["_acquire"]))
    replace(Pool, "_get_new_connection", _wrap_get_new_connection(Pool.__dict__["_get_new_connection"]))
    replace(Holder, "release", _wrap_holder_release(Holder.__dict__["release"]))
    replace(Holder, "_release", _wrap_holder_returned(Holder.__dict__["_release"]))

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
            replace(cls, name, _wrap_statement(original, query_of))
    _wait_histogram = runtime.connection_wait_histogram(HOOK)
    _wait_histogram_proxy = hasattr(_wait_histogram, "_real_instrument")


def _reset() -> None:
    global _wait_histogram, _wait_histogram_proxy
    _wait_histogram, _wait_histogram_proxy = None, False


_T = _scaffold.Target
#: What the hook patches, in the asyncpg lines it is tested on (the README's and nox's).
scaffold = _scaffold.Hook(HOOK, [
    _scaffold.Library("asyncpg", [
        _T("asyncpg.pool", "Pool", "_acquire", True),
        _T("asyncpg.pool", "Pool", "_get_new_connection", True),
        _T("asyncpg.pool", "PoolConnectionHolder", "release", True),
        _T("asyncpg.pool", "PoolConnectionHolder", "_release"),
        _T("asyncpg.connection", "Connection", "execute", True),
        _T("asyncpg.connection", "Connection", "_execute", True),
        _T("asyncpg.prepared_stmt", "PreparedStatement", "fetch"),
    ], _apply, [_scaffold.Tested("asyncpg", "0.29", "0.32")]),
], _reset)  # fmt: skip
#: Hook asyncpg when it is imported (now, if it already is). Idempotent.
install = scaffold.install
#: Undo every patch (tests); pools keep their harmless bookkeeping.
uninstall = scaffold.uninstall


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""
    return scaffold.late_coverage(
        lambda: f"{scaffold.loaded('asyncpg')}: pools and connections made before the injection are seen from their next"
        " acquire or statement, but connections acquired before it have no hold"
    )


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
        params: Mapping[str, Sequence[str | None]] = parse_qs(query)
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
        if _checkout_get() is not None:  # a subclass's _acquire calling this one
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


@runtime.stretch
def _begin_checkout(pool: Any) -> _Checkout | None:
    try:
        try:
            queue = pool._queue
        except AttributeError:
            queue = None
        if queue is None:
            return None  # not initialised yet
        try:
            state: _PoolState = queue._latprof_pool  # _STATE_ATTR, read as an attribute
        except AttributeError:  # first sight
            first_seen = _pool_state(pool)
            if first_seen is None:
                return None
            state = first_seen
        start = _now()
        checkout = _new(_Checkout)
        checkout.state = state
        checkout.request = _request_get()
        checkout.start_ns = start
        checkout.connect_started_ns = None
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None
    try:
        # before counting itself; a caller that finds the queue empty waits: say so now
        try:
            will_wait = not queue._queue  # what asyncio.Queue.empty() returns, without its call
        except AttributeError:
            will_wait = queue.empty()
        if will_wait:
            _read_gauges(pool, state, start, force=True, also_waiting=1)
        elif start >= state.gauge_due_ns or start < state.gauged_at_ns:  # gauges due
            _read_gauges(pool, state, start)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    state.acquiring += 1
    checkout.token = _checkout_set(checkout)
    return checkout


@runtime.stretch
def _end_checkout(pool: Any, checkout: _Checkout, proxy: Any, error: BaseException | None) -> None:
    end = _now()
    state = checkout.state
    try:  # the re-entry guard and the count first: they must never stay set
        try:
            _checkout_reset(checkout.token)
        except ValueError:  # not the context it was set in
            _checkout_set(None)
    finally:
        state.acquiring -= 1
    if end >= state.gauge_due_ns or end < state.gauged_at_ns:  # gauges due
        try:
            _read_gauges(pool, state, end)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
    try:
        elapsed = end - checkout.start_ns
        histogram = _wait_histogram
        if histogram is not None and (not _wait_histogram_proxy or histogram._real_instrument is not None):
            histogram.record(elapsed / 1e9, state.pool_attrs)
        request = checkout.request
        if request is None:
            return
        connect_started = checkout.connect_started_ns
        if connect_started is None and error is None:
            attrs = state.attrs  # shared, never changed
        else:
            attrs = dict(state.attrs)
            if connect_started is not None:
                attrs[CONNECT_MS] = round(min(elapsed, max(0, end - connect_started)) / 1e6, 3)
            if error is not None:
                attrs[ERROR_TYPE] = type(error).__qualname__
        _record(SEGMENT_ACQUIRE, DB_POOL, checkout.start_ns, end, attrs, state=request, copy_attrs=False)
        if proxy is not None:
            try:
                holder = proxy._holder
            except AttributeError:
                holder = None
            if holder is not None and _active():
                # a hold nests where the acquire happened; it ends when the holder goes back
                parent = _parent_get()
                state.holds[holder] = (end, request, _ROOT if parent is None else parent)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


def _wrap_get_new_connection(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _get_new_connection(self: Any) -> Any:
        checkout = _checkout_get()
        if checkout is not None and checkout.connect_started_ns is None:
            checkout.connect_started_ns = _now()
        return await original(self)

    return _get_new_connection


# --- holds ------------------------------------------------------------------------------------


def _wrap_holder_release(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def release(self: Any, timeout: Any) -> Any:
        if _request_get() is None:  # no statement is recorded outside a request: nothing to keep out
            return await original(self, timeout)
        token = _busy_set(True)  # the reset query is the pool's, not the request's
        try:
            return await original(self, timeout)
        finally:
            try:
                _busy_reset(token)
            except ValueError:
                pass

    return release


def _wrap_holder_returned(original: Callable[[Any], None]) -> Callable[[Any], None]:
    @functools.wraps(original)
    def _release(self: Any) -> None:
        state, held = _hold_of(self)
        end = _now()
        original(self)
        if state is not None:
            _hold_ended(self, state, held, end)

    return _release


@runtime.stretch
def _hold_of(holder: Any) -> tuple[_PoolState | None, Any]:
    """The pool state of the connection `holder` returns and its hold (None when this hook did not see it acquired)."""
    state: _PoolState | None = None
    held = None
    try:
        try:
            state = holder._pool._queue._latprof_pool  # _STATE_ATTR
        except AttributeError:  # no queue yet (None), or no acquire seen yet
            state = _pool_state(holder._pool)
        if state is not None and state.holds:
            held = state.holds.pop(holder, None)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    return state, held


@runtime.stretch
def _hold_ended(holder: Any, state: _PoolState, held: Any, end: int) -> None:
    """The connection went back at `end`: record its hold, read the pool's gauges when due."""
    try:
        if held is not None:
            start, request, parent = held
            _record(
                SEGMENT_CONNECTION_HOLD,
                None,
                start,
                end,
                state.pool_attrs,  # shared, never changed
                parent_id=parent,  # where the acquire happened, not under whatever runs the release
                state=request,
                copy_attrs=False,
            )
        if end >= state.gauge_due_ns or end < state.gauged_at_ns:  # gauges due
            _read_gauges(holder._pool, state, end)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


# --- gauges -----------------------------------------------------------------------------------


def _waiters(pool: Any, state: _PoolState) -> int:
    getters = getattr(pool._queue, "_getters", None)  # asyncio.Queue's waiting get() calls
    return len(getters) if getters is not None else max(0, state.acquiring)


def _read_gauges(pool: Any, state: _PoolState, now: int, force: bool = False, also_waiting: int = 0) -> None:
    """Emit the pool's gauges if they changed, or if `force`; the caller found them due.

    They are due when the last reading is 100 ms old, or the wall clock went back since
    (see `_pools.PoolState`), which the callers test inline with their own `now_ns()`:
    one clock reading serves the segment and the limiter. (asyncpg's `max_size` is always
    positive: the limit is always emitted.)
    """
    if not _active():
        return
    state.read_at(now)
    size = pool.get_size()
    values = (
        float(size),
        float(pool.get_max_size()),
        float(max(0, size - pool.get_idle_size())),
        float(_waiters(pool, state) + also_waiting),
    )
    _pools.emit_gauges(state, values, force)


# --- statements -------------------------------------------------------------------------------


def _argument(name: str) -> Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]:
    """The statement is the method's first argument, `name` when passed by keyword."""

    def query_of(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return args[0] if args else kwargs.get(name)

    query_of.first_argument = name  # type: ignore[attr-defined]  # _end_statement takes it without the call
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


def _wrap_statement(
    original: Callable[..., Any], query_of: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]
) -> Callable[..., Any]:
    first: str | None = getattr(query_of, "first_argument", None)  # the statement is the first argument
    @functools.wraps(original)
    async def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        request = _request_get()
        # outside a request, inside a timed statement, an acquire or a release, or when
        # recording is off: nothing to do
        # (no keyword arguments, the usual case: none are repacked)
        if request is None or _busy_get() or _checkout_get() is not None or not _active():
            return await (original(self, *args, **kwargs) if kwargs else original(self, *args))
        try:
            if _sqlalchemy_hook.busy():  # the SQLAlchemy hook times a statement or a checkout: that time is its
                return await (original(self, *args, **kwargs) if kwargs else original(self, *args))
            start = _now()
            token = _busy_set(True)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
            return await (original(self, *args, **kwargs) if kwargs else original(self, *args))
        try:
            result = await (original(self, *args, **kwargs) if kwargs else original(self, *args))
        except BaseException as exc:
            _end_statement(start, request, token, self, query_of, first, args, kwargs, exc)
            raise
        _end_statement(start, request, token, self, query_of, first, args, kwargs, None)
        return result

    return timed


@runtime.stretch
def _end_statement(
    start: int,
    request: runtime.RequestState,
    token: contextvars.Token[bool],
    obj: Any,
    query_of: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any],
    first: str | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    error: BaseException | None,
) -> None:
    end = _now()
    try:
        _busy_reset(token)
    except ValueError:  # not the context it was set in
        _busy_set(False)
    try:
        if first is not None:  # what query_of returns, without its call
            query = args[0] if args else kwargs.get(first)
        else:
            query = query_of(obj, args, kwargs)
        if isinstance(query, _Prepare):
            known = ("PREPARE " + summarize(query.query if isinstance(query.query, str) else "")[0], "PREPARE")
        else:
            known = summarize(query if isinstance(query, str) else "")
        if error is None:
            attrs = _statement_attrs.get(known)
            if attrs is None:
                attrs = _shared_statement_attrs(known)
        else:
            attrs = _pools.statement_attrs(SYSTEM, *known)
            attrs[ERROR_TYPE] = type(error).__qualname__
        _record(known[0], DB_QUERY, start, end, attrs, state=request, copy_attrs=False)
        runtime.saw(HOOK)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


def _shared_statement_attrs(known: tuple[str, str]) -> dict[str, Any]:
    """The attributes of the statements summarised as `known`, from now on shared by their segments."""
    attrs = _pools.statement_attrs(SYSTEM, *known)
    if len(_statement_attrs) >= STATEMENT_ATTRS_CACHE_SIZE:
        _statement_attrs.clear()
    _statement_attrs[known] = attrs
    return attrs
