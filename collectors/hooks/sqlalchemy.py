"""SQLAlchemy hook: pool checkout waits, connection holds, statements and pool gauges of every engine.

SQLAlchemy has no "waiting for a connection" event: the wait lives in the pool's `_do_get`,
so that method is wrapped on every class of `sqlalchemy.pool.impl` that defines it (which
ones do differs between releases; `QueuePool._do_get` calls itself, so only the outermost
call of a thread or task is timed). Holds use SQLAlchemy's public pool events, attached to
the `Pool` class so that every pool is covered. Statements are timed around the dialect's
public execution methods (`do_execute`, `do_execute_no_params`, `do_executemany`, wrapped on
`DefaultDialect` and on every dialect class that overrides them), exactly where SQLAlchemy
fires its `before_cursor_execute`/`after_cursor_execute` events, but without listening to
them: a listener on `Engine` makes SQLAlchemy build an event dispatcher for every
`Connection` and consult it at each step of every execution, which costs a service far more
than the hook itself (13 us per connect-and-statement on SQLite on a test machine, half as much
again as SQLite's own 27 us). Sync and asyncio engines alike: an async engine runs these sync
methods in a greenlet that shares the task's context, so the current request and the wall
clock work unchanged. (A statement that a `DialectEvents.do_execute` listener runs itself,
returning True, bypasses these methods and is not timed.)

- a `db.pool` segment "sqlalchemy checkout" for each checkout, from entering `_do_get` to
  leaving it, or to the end of reopening the connection it returned when that one was
  invalidated or recycled (`_ConnectionRecord.checkout`, after `_do_get`), with `error.type`
  when the checkout failed (a pre-ping, later still, is not part of it). When the pool opened a new connection inside the checkout (overflow allowed,
  `NullPool`), that time stays in the segment, as in OpenTelemetry's
  `db.client.connection.wait_time`, and the attribute `latprof.db.connect_ms` says how much of
  it was opening the connection (so a rule can tell a slow connect from an exhausted pool);
- a layer-less `db.connection.hold` segment from the pool's `checkout` event to its `checkin`;
- a `db.query` segment per cursor execution, named by a summary of the statement (operation
  and first table, e.g. "SELECT conversations"): never the statement text or its parameters.
  Statements run inside a checkout (the dialect's first-connect initialisation) belong to it;
- the pool gauges (size, max, in use, overflow, waiters) of each `QueuePool`, read on checkout
  and return at most every 100 ms per pool, and always when a checkout had to wait;
- the checkout time as the OpenTelemetry histogram `db.client.connection.wait_time`, through
  `opentelemetry-api` only (a no-op unless the service configured an SDK).

Installed late (into a process already serving), the engines made before install were not
tagged by `Engine.__init__`: a pool first seen without a name is named from the engine found on
the stack of its first checkout (`Engine.raw_connection` holds it), once per pool, so pools
keep their `postgresql://host:port/db` name and `db.system.name` whenever they were made.

Segments are recorded only inside a request. Nothing happens until SQLAlchemy is imported,
and every wrapper and callback counts its own errors instead of raising into the service.
The hot paths are kept cheap: the cheapest test first, one clock reading per event reused
for the gauge limiter, the attribute dicts of a pool and of a statement text built once and
handed to `runtime.record` uncopied (never mutated).
"""

from __future__ import annotations

import contextvars
import functools
import re
import sys
import time
import types
from typing import Any, Callable

from latprof import semconv
from latprof.collectors.hooks import _pools, _scaffold, runtime
from latprof.collectors.hooks._pools import ROOT as _ROOT
from latprof.collectors.hooks._pools import now_ns as _now
from latprof.collectors.hooks._pools import parent_get as _current_parent
from latprof.collectors.hooks._pools import record as _record
from latprof.collectors.hooks._pools import request_get as _current_request
from latprof.layers import DB_POOL, DB_QUERY
from latprof.semconv import DB_POOL_NAME, SEGMENT_CONNECTION_HOLD

HOOK = "sqlalchemy"

#: Name of the `db.pool` segment of a checkout.
SEGMENT_CHECKOUT = "sqlalchemy checkout"

GAUGE_POOL_OVERFLOW = semconv.GAUGE_POOL_OVERFLOW
CONNECT_MS = semconv.CONNECT_MS
ERROR_TYPE = semconv.ERROR_TYPE
OTEL_WAIT_TIME = semconv.METRIC_DB_CONNECTION_WAIT_TIME  # its attribute is DB_POOL_NAME, OpenTelemetry's name

#: At most one reading of a pool's gauges per this interval, unless a checkout waited.
GAUGE_INTERVAL_NS = _pools.GAUGE_INTERVAL_NS
#: A checkout slower than this (beyond opening a connection) waited for one.
WAITED_NS = _pools.WAITED_NS
#: Statements summarised once and remembered, at most; the cache is emptied when full.
SUMMARY_CACHE_SIZE = 2048
#: Only the head of a statement is read to summarise it.
SUMMARY_SCAN_CHARS = 4096
#: Statement texts (up to SUMMARY_SCAN_CHARS long) whose segment name and attributes a dialect
#: remembers, at most; its cache is emptied when full.
STATEMENT_CACHE_SIZE = 1024

_HOLD_KEY = "latprof.hold"  # in ConnectionPoolEntry.info: (start_ns, request, parent, attrs) of an open hold
_STATE_ATTR = "_latprof_pool"  # on a Pool instance: its _PoolState
_STATEMENTS_ATTR = "_latprof_statements"  # on a dialect: statement text -> (segment name, attributes)
_EXECUTE_METHODS = ("do_execute", "do_execute_no_params", "do_executemany")  # of a dialect

# OpenTelemetry's db.system.name for SQLAlchemy dialect names that differ from it.
_SYSTEM_NAMES = {"mssql": "microsoft.sql_server", "oracle": "oracle.db"}


class _PoolState(_pools.PoolState):
    """What the hook keeps per pool (see `_pools.PoolState`), with its `db.system.name` (None
    while no engine of ours was seen on it) and its waiters."""

    __slots__ = ("system", "waiting")

    def __init__(self, name: str, system: str | None) -> None:
        super().__init__(name, system)
        self.system = system
        # This hook's own in-flight outermost _do_get calls, one entry each: list.append and
        # list.pop are atomic, so no lock is taken on the hot path.
        self.waiting: list[None] = []

    @property
    def waiters(self) -> int:
        """This hook's own in-flight outermost `_do_get` calls on the pool."""
        return len(self.waiting)


# The hold of a connection checked out of a pool the hook cannot see (never mutated).
_UNKNOWN_POOL_ATTRS = {DB_POOL_NAME: "sqlalchemy"}

# The checkout in progress in this thread or task: the re-entry guard of `_do_get`, and where
# the `connect` event notes that a new connection is being opened for it (a one-item list:
# when opening it began, time.time() seconds, or None). A greenlet of an async engine runs in
# its task's context, so this is per thread and per task.
_checkout: contextvars.ContextVar[list[float | None] | None] = contextvars.ContextVar(
    "latprof_sqlalchemy_checkout", default=None
)
# True while a statement of this thread or task is timed: each statement is counted once.
_statement: contextvars.ContextVar[bool | None] = contextvars.ContextVar("latprof_sqlalchemy_statement", default=None)


def busy() -> bool:
    """True while this hook times a checkout or a statement in the calling thread or task: the
    hooks of the driver or pool underneath (asyncpg, psycopg_pool) leave that time to this one."""
    return _checkout.get() is not None or _statement.get() is not None

_wait_histogram: Any = None

# The hot paths call these (and _pools' shortcuts) without a call layer of their own.
_checkout_get = _checkout.get
_checkout_set = _checkout.set
_checkout_reset = _checkout.reset
_statement_get = _statement.get
_statement_set = _statement.set
_statement_reset = _statement.reset


# --- install ---------------------------------------------------------------------------------


def _apply(sqlalchemy_module: types.ModuleType) -> None:
    """Patch the pool, engine and dialect classes and attach the listeners (all or nothing: see `_scaffold`)."""
    global _wait_histogram
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from sqlalchemy.engine.default import DefaultDialect
    from sqlalchemy.pool import Pool, impl
    from sqlalchemy.pool import base as pool_base

    replace = scaffold.replace
    for cls in [getattr(impl, name) for name in dir(impl)]:
        if isinstance(cls, type) and issubclass(cls, Pool) and "_do_get" in cls.__dict__:
            replace(cls, "_do_get", _wrap_do_get(cls.__dict__["_do_get"]))
    # (reopening an invalidated or recycled connection happens after _do_get)
    record = getattr(pool_base, "_ConnectionRecord", None)
    if record is not None and isinstance(record.__dict__.get("checkout"), classmethod):
        replace(record, "checkout", _wrap_record_checkout(record.__dict__["checkout"]))
    if "_return_conn" in Pool.__dict__:
        replace(Pool, "_return_conn", _wrap_return_conn(Pool.__dict__["_return_conn"]))
    replace(Engine, "__init__", _wrap_engine_init(Engine.__dict__["__init__"]))
    replace(Engine, "dispose", _wrap_dispose(Engine.__dict__["dispose"]))
    # Every dialect class loaded so far (engines made before install included); those loaded
    # later are patched when an engine is made with one (`Engine.__init__`).
    seen: set[type] = set()
    todo: list[type] = [DefaultDialect]
    while todo:
        cls = todo.pop()
        if cls not in seen:
            seen.add(cls)
            _patch_dialect_class(cls)
            todo.extend(cls.__subclasses__())
    for target, name, fn in (
        (Pool, "connect", _on_connect),
        (Pool, "checkout", _on_checkout),
        (Pool, "checkin", _on_checkin),
    ):
        event.listen(target, name, fn)
        scaffold.on_uninstall(functools.partial(event.remove, target, name, fn))
    _wait_histogram = runtime.connection_wait_histogram(HOOK)


def _patch_dialect_class(cls: type) -> None:
    """Wrap the execution methods a dialect class defines itself (its bases are patched on their own)."""
    for name in _EXECUTE_METHODS:
        if name in cls.__dict__:
            scaffold.replace(cls, name, _wrap_execute(cls.__dict__[name]))


def _reset() -> None:
    global _wait_histogram
    _wait_histogram = None


_T = _scaffold.Target
#: What the hook patches, in the SQLAlchemy lines it is tested on (the README's and nox's).
scaffold = _scaffold.Hook(HOOK, [
    _scaffold.Library("sqlalchemy", [
        _T("sqlalchemy.pool.impl", "QueuePool", "_do_get"),
        _T("sqlalchemy.engine.base", "Engine", "__init__"),
        _T("sqlalchemy.engine.base", "Engine", "dispose"),
        _T("sqlalchemy.engine.default", "DefaultDialect", "do_execute"),
    ], _apply, [_scaffold.Tested("sqlalchemy", "2.0", "2.1")]),
], _reset)  # fmt: skip
#: Hook SQLAlchemy when it is imported (now, if it already is). Idempotent.
install = scaffold.install
#: Undo every patch and listener (tests); pools keep their harmless bookkeeping.
uninstall = scaffold.uninstall


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""
    return scaffold.late_coverage(
        lambda: ("SQLAlchemy is loaded" if scaffold.imported() else "SQLAlchemy is not imported in this process")
        + ": engines and pools made before the injection are seen from their next checkout, named after their engine;"
        " checkouts, statements and connections already checked out when it came are not"
    )


# --- pools: names and state -------------------------------------------------------------------


def pool_name(url: Any) -> str:
    """The pool's name from its engine URL: backend, host, port, database; no credentials or query."""
    bare = type(url).create(url.get_backend_name(), host=url.host, port=url.port, database=url.database)
    return str(bare.render_as_string(hide_password=True))


def system_name(dialect: Any) -> str:
    """OpenTelemetry's `db.system.name` for a SQLAlchemy dialect."""
    name = str(dialect.name)
    if name == "mysql" and getattr(dialect, "is_mariadb", False):
        return "mariadb"
    return _SYSTEM_NAMES.get(name, name)


def _tag_pool(engine: Any) -> None:
    pool = engine.pool
    state = pool.__dict__.get(_STATE_ATTR)
    if state is None or state.system is None:
        pool.__dict__[_STATE_ATTR] = _PoolState(pool_name(engine.url), system_name(engine.dialect))


def _pool_state(pool: Any) -> _PoolState:
    state: _PoolState | None = pool.__dict__.get(_STATE_ATTR)
    if state is None:  # a pool no engine of ours was built on (made before install, or standalone)
        engine = _engine_on_stack(pool)
        if engine is not None:
            found = _PoolState(pool_name(engine.url), system_name(engine.dialect))
        else:
            found = _PoolState(f"sqlalchemy {type(pool).__name__} {id(pool):x}", None)
        state = pool.__dict__.setdefault(_STATE_ATTR, found)
    return state


#: How many frames up `_engine_on_stack` looks (Engine.connect -> ... -> Pool._do_get is about 10).
ENGINE_SEARCH_DEPTH = 24


def _engine_on_stack(pool: Any) -> Any:
    """The engine whose pool is `pool`, from a frame of the calling thread (`Engine.raw_connection`'s
    `self`, under a checkout); None when none is there. Called once per pool first seen unnamed."""
    from sqlalchemy.engine import Engine

    frame: Any = sys._getframe(1)
    for _ in range(ENGINE_SEARCH_DEPTH):
        if frame is None:
            break
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == "self" and str(frame.f_globals.get("__name__", "")).startswith("sqlalchemy."):
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, Engine) and candidate.pool is pool:
                return candidate
        frame = frame.f_back
    return None


def _wrap_engine_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            _tag_pool(self)
            with scaffold.lock:
                if scaffold.installed and scaffold.patched:  # a dialect class loaded since install: patch it before it runs
                    for cls in type(self.dialect).__mro__:
                        _patch_dialect_class(cls)
        except Exception as exc:
            runtime.count_error(HOOK, exc)

    return __init__


def _wrap_dispose(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def dispose(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            _tag_pool(self)  # dispose() replaced the engine's pool with a new one
        except Exception as exc:
            runtime.count_error(HOOK, exc)
        return result

    return dispose


# --- checkout wait ----------------------------------------------------------------------------


def _wrap_record_checkout(original: Any) -> Any:
    """`_ConnectionRecord.checkout(pool)`, a classmethod: `_do_get`, then reopening the record's
    connection when it was invalidated (after an error: the database went away) or recycled,
    outside `_do_get`. The checkout segment covers both, their time and their errors (a
    database that is still away fails in the reopening); `_do_get` inside only passes through."""
    func = original.__func__
    timed = _wrap_do_get(lambda pool, cls: func(cls, pool))

    @functools.wraps(func)
    def checkout(cls: Any, pool: Any, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:  # a signature of another release: untimed
            return func(cls, pool, *args, **kwargs)
        return timed(pool, cls)

    return classmethod(checkout)


def _wrap_do_get(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _do_get(self: Any, *args: Any) -> Any:
        if _checkout_get() is not None:  # QueuePool._do_get calling itself, or a subclass its base
            return original(self, *args)
        begun = _begin_checkout(self)
        if begun is None:
            return original(self, *args)
        request = _current_request()
        error: BaseException | None = None
        try:
            return original(self, *args)
        except BaseException as exc:
            error = exc
            raise
        finally:  # this runs on every checkout of the service
            _end_checkout(self, begun, _now(), request, error)

    return _do_get


_Checkout = tuple[_PoolState, int, list[float | None], contextvars.Token[list[float | None] | None]]


@runtime.stretch
def _begin_checkout(pool: Any) -> _Checkout | None:
    """A checkout of `pool` begins: its state, start, the cell its connect time goes in and the
    re-entry guard's token; None when the hook failed (counted), and the checkout goes on untracked."""
    try:
        state = pool.__dict__.get(_STATE_ATTR) or _pool_state(pool)
        start = _now()
        if start >= state.gauge_due_ns or start < state.gauged_at_ns:  # gauges due
            _read_gauges(pool, state, start)  # before counting itself: a caller served at once never waited
        connecting: list[float | None] = [None]
        token = _checkout_set(connecting)
        state.waiting.append(None)
        return state, start, connecting, token
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None


@runtime.stretch
def _end_checkout(pool: Any, begun: _Checkout, end: int, request: runtime.RequestState | None, error: BaseException | None) -> None:
    """The checkout `_begin_checkout` began ended at `end`: the guard and waiter count put back, the
    wait recorded (with its connect time, or the error), the gauges read when due or it waited."""
    state, start, connecting, token = begun
    try:  # the re-entry guard and the waiter count first: they must never stay set
        try:
            _checkout_reset(token)
        except ValueError:  # not the context it was set in
            _checkout_set(None)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    finally:
        waiting = state.waiting
        waiters = len(waiting)
        waiting.pop()
    try:
        elapsed = end - start
        connect_started_s = connecting[0]
        connect_ns = 0
        if connect_started_s is not None:
            connect_ns = min(elapsed, max(0, end - int(connect_started_s * 1e9)))
        if elapsed - connect_ns >= WAITED_NS:
            _read_gauges(pool, state, end, force=True, waiters=waiters)  # how the pool looked while it waited
        elif end >= state.gauge_due_ns or end < state.gauged_at_ns:  # gauges due
            _read_gauges(pool, state, end)
        _pools.checkout_recorded(SEGMENT_CHECKOUT, _wait_histogram, state, request, start, end,
                                 None if connect_started_s is None else connect_ns, error)  # fmt: skip
    except Exception as exc:
        runtime.count_error(HOOK, exc)


def _on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    try:
        connecting = _checkout_get()
        if connecting is not None and connecting[0] is None:
            # the record notes when it began opening the connection; the checkout ends when it is open
            connecting[0] = float(getattr(connection_record, "starttime", 0) or time.time())
    except Exception as exc:
        runtime.count_error(HOOK, exc)


# --- holds ------------------------------------------------------------------------------------


@runtime.stretch
def _on_checkout(dbapi_connection: Any, connection_record: Any, connection_proxy: Any) -> None:
    try:
        request = _current_request()
        if request is None or runtime._writer is None:
            connection_record.info.pop(_HOLD_KEY, None)  # a hold left by a connection detached without checkin
            return
        pool = getattr(connection_proxy, "_pool", None)
        if pool is None:
            attrs = _UNKNOWN_POOL_ATTRS
        else:
            attrs = (pool.__dict__.get(_STATE_ATTR) or _pool_state(pool)).pool_attrs
        # a hold nests where the checkout happened
        connection_record.info[_HOLD_KEY] = (_now(), request, _current_parent(), attrs)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


@runtime.stretch
def _on_checkin(dbapi_connection: Any, connection_record: Any) -> None:
    try:
        held = connection_record.info.pop(_HOLD_KEY, None)
        if held is None:
            return
        end = _now()
        start, request, parent, attrs = held
        # Not under whatever segment the checkin happens to run in.
        _record(
            SEGMENT_CONNECTION_HOLD,
            None,
            start,
            end,
            attrs,
            parent_id=_ROOT if parent is None else parent,
            state=request,
            copy_attrs=False,
        )
    except Exception as exc:
        runtime.count_error(HOOK, exc)


# --- gauges -----------------------------------------------------------------------------------


def _wrap_return_conn(original: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    @functools.wraps(original)
    def _return_conn(self: Any, record: Any) -> None:
        original(self, record)
        if runtime._writer is not None:
            try:
                state = self.__dict__.get(_STATE_ATTR)
                if state is not None:
                    now = _now()
                    if now >= state.gauge_due_ns or now < state.gauged_at_ns:  # gauges due
                        _read_gauges(self, state, now)
            except Exception as exc:
                runtime.count_error(HOOK, exc)

    return _return_conn


def _read_gauges(pool: Any, state: _PoolState, now: int, force: bool = False, waiters: int | None = None) -> None:
    """Emit the pool's gauges (due at `now`, see `_pools.PoolState`) if they changed, or always if `force`."""
    try:
        if runtime._writer is None:
            return
        checkedout = getattr(pool, "checkedout", None)
        if checkedout is None:  # NullPool, StaticPool, ...: nothing to count
            return
        state.read_at(now)
        in_use = checkedout()
        open_connections = pool.checkedin() + in_use
        pool_size = pool.size()
        max_overflow = getattr(pool, "_max_overflow", -1)
        most = pool_size + max_overflow if max_overflow >= 0 else -1.0  # -1: unbounded, not emitted
        values = (
            float(open_connections),
            float(most),
            float(in_use),
            float(max(0, open_connections - pool_size)),
            float(state.waiters if waiters is None else waiters),
        )
        _pools.emit_gauges(state, values, force)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


# --- statements -------------------------------------------------------------------------------


def _wrap_execute(original: Callable[..., Any]) -> Callable[..., Any]:
    """Time a dialect's `do_execute`/`do_execute_no_params`/`do_executemany`: one cursor execution."""

    @functools.wraps(original)
    def execute(self: Any, cursor: Any, statement: str, *args: Any, **kwargs: Any) -> Any:
        request = _current_request()
        if (
            request is None
            or runtime._writer is None
            or _statement_get() is not None  # a dialect method calling its base: one statement
            or _checkout_get() is not None  # the dialect's first-connect statements: part of the checkout
        ):
            return original(self, cursor, statement, *args, **kwargs)
        start = _now()
        token = _statement_set(True)
        try:
            result = original(self, cursor, statement, *args, **kwargs)
        except BaseException as exc:
            _end_statement(self, statement, request, start, token, exc)
            raise
        _end_statement(self, statement, request, start, token, None)
        return result

    return execute


@runtime.stretch
def _end_statement(
    dialect: Any,
    statement: str,
    request: runtime.RequestState,
    start: int,
    token: contextvars.Token[bool | None],
    error: BaseException | None,
) -> None:
    end = _now()
    try:
        try:
            _statement_reset(token)
        except ValueError:  # not the context it was set in
            _statement_set(None)
        try:
            known_by_dialect = dialect.__dict__
        except AttributeError:  # a dialect without a __dict__: nothing remembered
            known_by_dialect = {}
        known = known_by_dialect.get(_STATEMENTS_ATTR)
        if known is None:
            known = known_by_dialect.setdefault(_STATEMENTS_ATTR, {})
        segment = known.get(statement)
        if segment is None:  # (shared by its later segments, never mutated)
            summary, operation = summarize(statement)
            segment = summary, _pools.statement_attrs(system_name(dialect), summary, operation)
            if len(statement) <= SUMMARY_SCAN_CHARS:
                if len(known) >= STATEMENT_CACHE_SIZE:
                    known.clear()
                known[statement] = segment
        name, attrs = segment
        if error is not None:
            attrs = dict(attrs)
            attrs[ERROR_TYPE] = type(error).__qualname__
        _record(name, DB_QUERY, start, end, attrs, state=request, copy_attrs=False)
        runtime.saw(HOOK)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


# A statement's tokens, in the order the alternatives are tried: what is skipped (space,
# comments), literals (never read), quoted identifiers, words, numbers, single characters.
# PostgreSQL's E'...' strings end at a quote that no backslash escapes: read as a plain string,
# E'\' FROM secret' would end early and let the literal's words be taken for a table.
_TOKENS = re.compile(
    r"""
    (?P<skip>\s+|--[^\n]*|/\*.*?(?:\*/|\Z))
    |(?P<literal>[Ee]'(?:[^'\\]|\\.|'')*'?|'(?:[^']|'')*'?|\$(?P<tag>[A-Za-z_]\w*|)\$.*?(?:\$(?P=tag)\$|\Z))
    |(?P<quoted>"(?:[^"]|"")*"?|`[^`]*`?|\[[^\]]*\]?)
    |(?P<word>[A-Za-z_][\w$]*)
    |(?P<number>\d[\w.]*)
    |(?P<char>.)
    """,
    re.DOTALL | re.VERBOSE,
)
# Where the statement's target follows, after the operation: the word before it.
_TARGET_AFTER = {"SELECT": "FROM", "DELETE": "FROM", "INSERT": "INTO", "REPLACE": "INTO", "MERGE": "INTO"}
_TARGET_NEXT = frozenset({"UPDATE", "CALL", "TRUNCATE", "COPY", "LOCK", "VACUUM", "ANALYZE"})
_DDL = frozenset({"CREATE", "DROP", "ALTER"})
_DDL_MODIFIERS = frozenset(
    {"OR", "REPLACE", "TEMP", "TEMPORARY", "UNLOGGED", "UNIQUE", "GLOBAL", "LOCAL", "MATERIALIZED"}
    | {"IF", "NOT", "EXISTS", "CONCURRENTLY", "ONLY"}
)
_MAIN_OPERATIONS = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE", "MERGE"})
_NOT_A_TARGET = frozenset({"ONLY", "TABLE", "LATERAL", "IGNORE"})
_summaries: dict[str, tuple[str, str]] = {}


def summarize(statement: str) -> tuple[str, str]:
    """A statement's summary ("SELECT conversations") and operation ("SELECT"); no literals, ever.

    The summary is the operation and the first table it reads or writes (the object for DDL),
    from identifiers only: string literals, numbers and parameters are never part of it.
    Remembered per statement text, since an application runs the same few statements.
    """
    head = statement[:SUMMARY_SCAN_CHARS]
    known = _summaries.get(head)
    if known is None:
        known = _summarize(head)
        if len(_summaries) >= SUMMARY_CACHE_SIZE:
            _summaries.clear()
        _summaries[head] = known
    return known


def _summarize(statement: str) -> tuple[str, str]:
    tokens: list[tuple[str, str, int]] = []  # (kind, text, paren depth)
    depth = 0
    for match in _TOKENS.finditer(statement):
        kind = match.lastgroup or "char"
        if kind == "tag":
            kind = "literal"
        if kind == "skip":
            continue
        text = match.group()
        if text == "(":
            depth += 1
        elif text == ")":
            depth = max(0, depth - 1)
        tokens.append((kind, text, depth))
    words = [(i, text.upper(), d) for i, (kind, text, d) in enumerate(tokens) if kind == "word"]
    if not words:
        return "OTHER", ""
    start, operation, op_depth = words[0]
    if operation == "WITH":  # the statement proper follows the common table expressions
        main = next(((i, w, d) for i, w, d in words[1:] if d == op_depth and w in _MAIN_OPERATIONS), None)
        if main is None:
            return "WITH", "WITH"
        start, operation, op_depth = main
    target: str | None = None
    if operation in _TARGET_AFTER:
        keyword = _TARGET_AFTER[operation]
        # the operation's own FROM first ("SELECT extract(year FROM ts) FROM t" reads t), then any
        for same_depth in (True, False):
            target = next(
                (
                    found
                    for i, w, d in words
                    if i > start and w == keyword and (d == op_depth or not same_depth)
                    for found in (_identifier(tokens, i + 1),)
                    if found is not None
                ),
                None,
            )
            if target is not None:
                break
    elif operation in _TARGET_NEXT:
        target = _identifier(tokens, start + 1)
    elif operation in _DDL:
        i = start + 1
        while i < len(tokens) and tokens[i][0] == "word" and tokens[i][1].upper() in _DDL_MODIFIERS:
            i += 1
        if i < len(tokens) and tokens[i][0] == "word":
            kind_word = tokens[i][1].upper()
            i += 1
            while i < len(tokens) and tokens[i][0] == "word" and tokens[i][1].upper() in _DDL_MODIFIERS:
                i += 1
            name = _identifier(tokens, i)
            return (f"{operation} {kind_word} {name}" if name else f"{operation} {kind_word}"), operation
    return (f"{operation} {target}" if target else operation), operation


def _identifier(tokens: list[tuple[str, str, int]], i: int) -> str | None:
    """The (possibly schema-qualified) identifier starting at token `i`, unquoted; else None."""
    while i < len(tokens) and tokens[i][0] == "word" and tokens[i][1].upper() in _NOT_A_TARGET:
        i += 1
    parts: list[str] = []
    while i < len(tokens) and tokens[i][0] in ("word", "quoted"):
        kind, text, _ = tokens[i]
        parts.append(text if kind == "word" else text[1:-1] if len(text) > 1 else text)
        if i + 1 < len(tokens) and tokens[i + 1][1] == ".":
            i += 2
            continue
        break
    if not parts:
        return None
    return ".".join(parts)[:128]
