"""redis-py hook: pool waits, connection holds, commands, pipelines and pool gauges of every redis client, sync and asyncio.

redis-py checks a connection out of its pool for every command (and once per pipeline,
transaction or pubsub) and returns it right after, so the hook sits on the pool and on the
client's command entry points. Patch points, each wrapped once and only on the class that
defines it (`uninstall()` restores them), the same in redis-py 5.x to 8.x:

- `get_connection` of every `ConnectionPool` subclass of `redis.connection` and
  `redis.asyncio.connection` that defines it (`ConnectionPool`, `BlockingConnectionPool`):
  a `db.pool` segment "redis checkout" from entering it to leaving it. Only a
  `BlockingConnectionPool` waits for a free connection (`self.pool.get(block=True, ...)`,
  asyncio: `self._condition.wait_for(...)`); a plain `ConnectionPool` hands one over at once
  or opens a new one (the asyncio one of redis-py 5.x does that under its pool lock, which
  others then wait for). Either way the checkout's time is what the caller waited to get an
  open connection, as in OpenTelemetry's `db.client.connection.wait_time` (which redis-py's
  own metric also measures this way), and when a connection was opened inside it the
  attribute `latprof.db.connect_ms` says how much of it that took (from the pool's
  `make_connection`, or `AbstractConnection.connect` of a connection without a socket, both
  wrapped to note the moment, to the end of the checkout), so a rule can tell a slow connect
  from an exhausted pool. A checkout that took under 100 us, opened nothing and did
  not fail is not a segment of its own: it is one per command, and its time stays in the
  command's segment;
- `release` of the same classes: the end of a layer-less `db.connection.hold` segment that
  began when `get_connection` returned the connection (per command that is about the command;
  a pipeline, a WATCH ... EXEC transaction or a pubsub holds it longer);
- `Redis._execute_command` (`execute_command` where there is none) and the asyncio
  `Redis.execute_command`, and `Pipeline.immediate_execute_command` (commands of a WATCHing
  pipeline): a `db.query` segment per command, named by the command ("GET", "BLPOP",
  "CLIENT SETNAME"), from the end of its checkout (or its start) to its reply;
- `Pipeline.execute` (sync and asyncio): one `db.query` segment for the whole pipeline,
  "PIPELINE", or "MULTI" for a transaction (the names redis-py's own metrics use), with
  `db.operation.batch.size`;
- the pool gauges (connections created, most allowed, checked out, callers inside
  `get_connection`) read on checkout and return at most every 100 ms per pool, and always
  when a checkout had to wait;
- the checkout time as the OpenTelemetry histogram `db.client.connection.wait_time` through
  `opentelemetry-api` (a no-op unless the service configured an SDK), except where redis-py
  records that histogram itself: a pool class whose `get_connection` calls redis-py's
  `record_connection_wait_time` (`BlockingConnectionPool` in redis-py 7.x/8.x) while the
  service has initialised redis-py's observability with the `CONNECTION_ADVANCED` metric group.

A pool is named `host:port/db` (`unix:PATH?db=N` for a unix socket): never credentials.
Commands are named by the command word only (and the subcommand of container commands like
CLIENT or CONFIG): never a key, value or argument. Segments are recorded only inside a
request; pubsub commands, `RedisCluster` and `Monitor` record no `db.query` segments (their
checkouts and holds are recorded). Nothing happens until redis is imported, and every
wrapper counts its own errors instead of raising into the service.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import os
import re
import sys
import types
import weakref
from typing import Any, Callable

from latprof import semconv
from latprof.collectors.hooks import _pools, _scaffold, runtime
from latprof.collectors.hooks._pools import ROOT as _ROOT
from latprof.collectors.hooks._pools import now_ns as _now
from latprof.collectors.hooks._pools import parent_get as _parent_get
from latprof.collectors.hooks._pools import record as _record
from latprof.collectors.hooks._pools import request_get as _request_get
from latprof.layers import DB_POOL, DB_QUERY
from latprof.semconv import DB_OPERATION_NAME, DB_QUERY_SUMMARY, DB_SYSTEM_NAME, SEGMENT_CONNECTION_HOLD

HOOK = "redis"

#: Name of the `db.pool` segment of a checkout.
SEGMENT_CHECKOUT = "redis checkout"
#: OpenTelemetry's `db.system.name` of redis.
SYSTEM = "redis"
#: The `db.query` segment of a pipeline and of a transaction (MULTI ... EXEC).
PIPELINE = "PIPELINE"
TRANSACTION = "MULTI"
#: What a command that cannot be named safely is called.
OTHER = "OTHER"

CONNECT_MS = semconv.CONNECT_MS
ERROR_TYPE = semconv.ERROR_TYPE
OTEL_WAIT_TIME = semconv.METRIC_DB_CONNECTION_WAIT_TIME  # its attribute is DB_POOL_NAME, OpenTelemetry's name
#: OpenTelemetry's count of the operations of a batch (a pipeline's commands).
DB_OPERATION_BATCH_SIZE = semconv.DB_OPERATION_BATCH_SIZE

#: At most one reading of a pool's gauges per this interval, unless a checkout waited.
GAUGE_INTERVAL_NS = _pools.GAUGE_INTERVAL_NS
#: A checkout slower than this (beyond opening a connection) waited for one.
WAITED_NS = _pools.WAITED_NS
#: A checkout shorter than this, that opened no connection and did not fail, is no segment.
MIN_CHECKOUT_NS = 100_000
#: redis-py 5.x/6.x's default `max_connections` (2**31): no limit, no `db.pool.max` gauge.
UNBOUNDED = 2**31
#: Command names remembered, at most; the cache is emptied when full.
COMMAND_NAME_CACHE_SIZE = 1024

_STATE_ATTR = "_latprof_redis_pool"  # on a pool instance: its _PoolState
_HOLD_ATTR = "_latprof_redis_hold"  # on a connection: its open hold (as in _holds) or None
# (the hot paths read and set both as plain attributes, `pool._latprof_redis_pool` and
# `connection._latprof_redis_hold`: cheaper than going through `__dict__`)
_WAIT_TIME_RECORDER = "record_connection_wait_time"  # redis-py's own recorder of the histogram

# Commands whose first argument is a subcommand ("CLIENT SETNAME", "CONFIG GET").
_CONTAINERS = frozenset(
    {"ACL", "CLIENT", "CLUSTER", "COMMAND", "CONFIG", "DEBUG", "FUNCTION", "HIMPORT", "LATENCY", "MEMORY"}
    | {"MODULE", "OBJECT", "PUBSUB", "SCRIPT", "SLOWLOG", "XGROUP", "XINFO"}
)
_COMMAND_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_.|-]{0,39}\Z")  # GET, FT.SEARCH, JSON.SET
_SUBCOMMAND_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}\Z")


class _PoolState(_pools.PoolState):
    """What the hook keeps per pool (see `_pools.PoolState`), with the process it belongs to and the callers inside."""

    __slots__ = ("pid", "inside")

    def __init__(self, name: str) -> None:
        super().__init__(name, SYSTEM)
        self.pid = _pid  # a forked child starts over (redis-py resets the pool too)
        # One item per caller inside this hook's outermost get_connection: its length is the
        # waiter count. deque.append and deque.pop are atomic (no lock is taken per checkout)
        # and, unlike a list's, allocate nothing while it stays short.
        self.inside: collections.deque[None] = collections.deque()


class _Checkout:
    """One outermost `get_connection` in progress.

    Made by _begin_checkout with `object.__new__` and its slots set there (no `__init__` call
    per checkout): `state` (the pool's _PoolState), `start_ns`, `request` (None outside a
    request), `redis_records_wait` (this class's get_connection records the OpenTelemetry
    histogram itself), `connect_started_ns` (when it began making or connecting a connection,
    else None), `token` (of `_checkout`), and inside a request only, `segment_id` (the id its
    segment will have), `parent_token` (segments recorded meanwhile are its children) and
    `spans_before` (how many segments the request had when it began); `command`: the cell of
    the command it is part of (see `_command`; then `token` is not set), else None.
    """

    __slots__ = (
        "state",
        "start_ns",
        "request",
        "redis_records_wait",
        "connect_started_ns",
        "token",
        "segment_id",
        "parent_token",
        "spans_before",
        "command",
    )
    state: _PoolState
    start_ns: int
    request: runtime.RequestState | None
    redis_records_wait: bool
    connect_started_ns: int | None
    token: contextvars.Token[_Checkout | None]
    segment_id: str | None
    parent_token: contextvars.Token[str | None] | None
    spans_before: int
    command: list[Any] | None


# The checkout in progress in this thread or task outside a command (inside one, its cell
# holds it): the re-entry guard of `get_connection`, and where `connect` notes the time spent
# opening a connection for it.
_checkout: contextvars.ContextVar[_Checkout | None] = contextvars.ContextVar("latprof_redis_checkout", default=None)
# The command in progress in this thread or task (inside a request), as a cell [start_ns,
# request, checkout]: one segment per outermost command (a pipeline's SCRIPT EXISTS is part
# of the pipeline); a recorded checkout inside it moves `start_ns`, where the command's own
# time starts, to its end; `checkout` is the checkout in progress inside it, else None.
_command: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("latprof_redis_command", default=None)
# Open holds of connections without a `__dict__` (others keep theirs in it, see _HOLD_ATTR):
# (start_ns, request, parent segment or runtime.ROOT, attributes). Weak keys: a connection dropped without
# being released takes its entry with it.
_holds: weakref.WeakKeyDictionary[Any, tuple[int, runtime.RequestState, Any, dict[str, Any]]] = (
    weakref.WeakKeyDictionary()
)
_names: dict[str, str] = {}
# A plain command's segment attributes by its name, shared by all its segments (recorded with
# copy_attrs=False, never changed once here); bounded like `_names`.
_query_attrs: dict[str, dict[str, Any]] = {}

# Hot-path shortcuts (besides _pools'). runtime's own context variable of the innermost open
# segment is set directly: what nested_under() does, without a generator context manager per command.
_parent_set = runtime._parent.set
_parent_reset = runtime._parent.reset
_checkout_get = _checkout.get
_checkout_set = _checkout.set
_checkout_reset = _checkout.reset
_command_get = _command.get
_command_set = _command.set
_command_reset = _command.reset
_new_id = runtime.new_id
_active = runtime.active
_new = object.__new__  # a slotted object without an __init__ call

_pid = os.getpid()  # this process's: a pool's state made in the parent is made anew in a child


def _after_fork() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork)

_wait_histogram: Any = None
# Whether it is opentelemetry-api's proxy instrument, which records nothing until the service
# configures an SDK (then its `_real_instrument` is set): a histogram not worth a call until then.
_wait_histogram_proxy = False


# --- install ---------------------------------------------------------------------------------


def _applier(targets: Callable[[], list[tuple[type, str, Callable[..., Any]]]]) -> Callable[[types.ModuleType], None]:
    """Patch one client family (sync or asyncio); each is a part of its own, all or nothing (see `_scaffold`)."""

    def apply(redis_module: types.ModuleType) -> None:
        global _wait_histogram, _wait_histogram_proxy
        for cls, name, wrapper in targets():
            scaffold.replace(cls, name, wrapper)
        if _wait_histogram is None:
            _wait_histogram = runtime.connection_wait_histogram(HOOK)
            _wait_histogram_proxy = hasattr(_wait_histogram, "_real_instrument")

    return apply


def _reset() -> None:
    global _wait_histogram, _wait_histogram_proxy
    _wait_histogram, _wait_histogram_proxy = None, False


_T = _scaffold.Target
_TESTED = [_scaffold.Tested("redis", "5", "8")]  # the README's and nox's lines
#: What the hook patches: the sync and the asyncio client, each patched or off on its own.
scaffold = _scaffold.Hook(HOOK, [
    _scaffold.Library("redis", [
        _T("redis.connection", "ConnectionPool", "get_connection"),
        _T("redis.connection", "AbstractConnection", "connect"),
        _T("redis.client", "Pipeline", "execute"),
        _T("redis.client", "Pipeline", "immediate_execute_command"),
    ], _applier(lambda: _sync_targets()), _TESTED),
    _scaffold.Library("redis", [
        _T("redis.asyncio.connection", "ConnectionPool", "get_connection"),
        _T("redis.asyncio.connection", "AbstractConnection", "connect"),
        _T("redis.asyncio.client", "Redis", "execute_command"),
        _T("redis.asyncio.client", "Pipeline", "execute"),
        _T("redis.asyncio.client", "Pipeline", "immediate_execute_command"),
    ], _applier(lambda: _async_targets()), _TESTED),
], _reset)  # fmt: skip
#: Hook redis-py when it is imported (now, if it already is). Idempotent.
install = scaffold.install
#: Undo every patch (tests); pools keep their harmless bookkeeping.
uninstall = scaffold.uninstall


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""
    return scaffold.late_coverage(
        lambda: f"{scaffold.loaded('redis-py')}: clients and pools made before the injection are seen from their next"
        " command, but a pipeline, transaction or pubsub that held its connection since before has no hold"
    )


def _sync_targets() -> list[tuple[type, str, Callable[..., Any]]]:
    import redis.client as client
    import redis.connection as connection

    out: list[tuple[type, str, Callable[..., Any]]] = []
    for cls in _pool_classes(connection):
        if "get_connection" in cls.__dict__:
            original = cls.__dict__["get_connection"]
            out.append((cls, "get_connection", _wrap_get_connection(original, _calls(original, _WAIT_TIME_RECORDER))))
        if "release" in cls.__dict__:
            out.append((cls, "release", _wrap_release(cls.__dict__["release"])))
        if "make_connection" in cls.__dict__:
            out.append((cls, "make_connection", _wrap_make_connection(cls.__dict__["make_connection"])))
    conn_cls = connection.AbstractConnection
    out.append((conn_cls, "connect", _wrap_connect(conn_cls.__dict__["connect"])))
    command = "_execute_command" if "_execute_command" in client.Redis.__dict__ else "execute_command"
    out.append((client.Redis, command, _wrap_command(client.Redis.__dict__[command])))
    pipeline = client.Pipeline
    out.append((pipeline, "immediate_execute_command", _wrap_command(pipeline.__dict__["immediate_execute_command"])))
    out.append((pipeline, "execute", _wrap_pipeline_execute(pipeline.__dict__["execute"])))
    return out


def _async_targets() -> list[tuple[type, str, Callable[..., Any]]]:
    import redis.asyncio.client as client
    import redis.asyncio.connection as connection

    out: list[tuple[type, str, Callable[..., Any]]] = []
    for cls in _pool_classes(connection):
        if "get_connection" in cls.__dict__:
            original = cls.__dict__["get_connection"]
            out.append(
                (cls, "get_connection", _wrap_async_get_connection(original, _calls(original, _WAIT_TIME_RECORDER)))
            )
        if "release" in cls.__dict__:
            out.append((cls, "release", _wrap_async_release(cls.__dict__["release"])))
        if "make_connection" in cls.__dict__:  # a plain function in both families
            out.append((cls, "make_connection", _wrap_make_connection(cls.__dict__["make_connection"])))
    conn_cls = connection.AbstractConnection
    out.append((conn_cls, "connect", _wrap_async_connect(conn_cls.__dict__["connect"])))
    out.append((client.Redis, "execute_command", _wrap_async_command(client.Redis.__dict__["execute_command"])))
    pipeline = client.Pipeline
    immediate = pipeline.__dict__["immediate_execute_command"]
    out.append((pipeline, "immediate_execute_command", _wrap_async_command(immediate)))
    out.append((pipeline, "execute", _wrap_async_pipeline_execute(pipeline.__dict__["execute"])))
    return out


def _pool_classes(module: types.ModuleType) -> list[type]:
    base = module.ConnectionPool
    return [cls for cls in vars(module).values() if isinstance(cls, type) and issubclass(cls, base)]


def _calls(fn: Any, name: str) -> bool:
    """Whether `fn` (or a function it decorates) refers to the global `name`."""
    for _ in range(4):
        code = getattr(fn, "__code__", None)
        if code is not None and name in code.co_names:
            return True
        fn = getattr(fn, "__wrapped__", None)
        if fn is None:
            break
    return False



def redis_records_wait_time() -> bool:
    """Whether redis-py's own observability is on and records `db.client.connection.wait_time`.

    True once the service called `get_observability_instance().init(OTelConfig(...))` with
    metrics enabled and the `CONNECTION_ADVANCED` metric group (redis-py 7.x/8.x); always
    False for redis-py without `redis.observability`.
    """
    providers = sys.modules.get("redis.observability.providers")
    if providers is None:
        return False
    try:
        manager = providers.get_observability_instance().get_provider_manager()
        if manager is None or not manager.config.enabled_telemetry:
            return False
        from redis.observability.config import MetricGroup

        return MetricGroup.CONNECTION_ADVANCED in manager.config.metric_groups
    except Exception:  # another layout of redis.observability: assume it does not
        return False


# --- names ------------------------------------------------------------------------------------


def pool_name(pool: Any) -> str:
    """The pool's name: `host:port/db`, `unix:PATH?db=N` or `sentinel:SERVICE/db`; never credentials."""
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    db = kwargs.get("db", 0)
    path = kwargs.get("path")
    if path:
        return f"unix:{path}?db={db}"
    service = getattr(pool, "service_name", None)
    if isinstance(service, str):
        return f"sentinel:{service}/{db}"
    host = str(kwargs.get("host", "localhost"))
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{kwargs.get('port', 6379)}/{db}"


def command_name(args: tuple[Any, ...]) -> str:
    """The command of a call's arguments ("GET", "CLIENT SETNAME"); never a key, value or argument.

    redis-py passes the command word first ("GET"; "CLIENT SETNAME" as one string or as two
    arguments). Only a word that looks like a command is kept (else "OTHER"), upper-cased,
    and a second word only after a container command (CLIENT, CONFIG, SCRIPT, ...), where it
    is the subcommand.
    """
    if not args:
        return OTHER
    first = args[0]
    if type(first) is str:
        known = _names.get(first)
        if known is not None:
            return known
    words = _words(first)
    if not words or not _COMMAND_WORD.match(words[0]):
        return OTHER
    name = words[0].upper()
    if name in _CONTAINERS:
        sub: str | None = None
        if len(words) > 1:
            sub = words[1]
        elif len(args) > 1:
            rest = _words(args[1])
            sub = rest[0] if len(rest) == 1 else None
        if sub is not None and _SUBCOMMAND_WORD.match(sub):
            return f"{name} {sub.upper()}"
        return name
    if len(words) == 1 and type(first) is str:  # only a plain command word is remembered
        if len(_names) >= COMMAND_NAME_CACHE_SIZE:
            _names.clear()
        _names[first] = name
    return name


def _words(value: Any) -> list[str]:
    """The first (up to three) whitespace-separated words of a str or bytes argument."""
    if isinstance(value, str):
        text = value[:80]
    elif isinstance(value, (bytes, bytearray, memoryview)):
        text = bytes(value[:80]).decode("latin-1")
    else:
        return []
    return text.split(None, 2)


# --- pools: state and gauges ------------------------------------------------------------------


def _pool_state(pool: Any) -> _PoolState:
    state: _PoolState | None = pool.__dict__.get(_STATE_ATTR)
    if state is None or state.pid != _pid:
        state = _PoolState(pool_name(pool))
        pool.__dict__[_STATE_ATTR] = state
    return state


def _pool_numbers(pool: Any) -> tuple[float, float, float] | None:
    """(connections created, most allowed or -1, checked out) of a redis-py pool, None if unknown."""
    attrs = pool.__dict__
    most = getattr(pool, "max_connections", None)
    most = float(most) if isinstance(most, int) and 0 < most < UNBOUNDED else -1.0
    free_slots = attrs.get("pool")  # sync BlockingConnectionPool: a LifoQueue of free slots (None: not opened yet)
    created = attrs.get("_connections")
    if free_slots is not None and created is not None and hasattr(free_slots, "qsize"):
        return float(len(created)), most, float(pool.max_connections - free_slots.qsize())
    available, in_use = attrs.get("_available_connections"), attrs.get("_in_use_connections")
    if available is not None and in_use is not None:
        checked_out = len(in_use)
        return float(checked_out + len(available)), most, float(checked_out)
    return None


@runtime.guarded(HOOK)
def _read_gauges(pool: Any, state: _PoolState, now: int, force: bool = False, waiters: int | None = None) -> None:
    """Emit the pool's gauges if they changed, or if `force`; the caller found them due.

    They are due when the last reading is 100 ms old, or the wall clock went back since
    (see `_pools.PoolState`), which the callers test inline with their own `now_ns()`:
    one clock reading serves the segment and the limiter.
    """
    if not _active():
        return
    numbers = _pool_numbers(pool)
    if numbers is None:
        return
    state.read_at(now)
    values = (*numbers, float(len(state.inside) if waiters is None else waiters))
    _pools.emit_gauges(state, values, force)


# --- checkouts --------------------------------------------------------------------------------


def _wrap_get_connection(original: Callable[..., Any], redis_records_wait: bool) -> Callable[..., Any]:
    @functools.wraps(original)
    def get_connection(self: Any, *args: Any, **kwargs: Any) -> Any:
        # (redis-py >= 5.3 passes no arguments: then none are repacked)
        command = _command_get()
        if (_checkout_get() if command is None else command[2]) is not None:  # a subclass calling its base
            return original(self, *args, **kwargs) if args or kwargs else original(self)
        checkout = _begin_checkout(self, redis_records_wait, command)
        if checkout is None:
            return original(self, *args, **kwargs) if args or kwargs else original(self)
        try:
            connection = original(self, *args, **kwargs) if args or kwargs else original(self)
        except BaseException as exc:
            _end_checkout(self, checkout, None, exc)
            raise
        _end_checkout(self, checkout, connection, None)
        return connection

    return get_connection


def _wrap_async_get_connection(original: Callable[..., Any], redis_records_wait: bool) -> Callable[..., Any]:
    @functools.wraps(original)
    async def get_connection(self: Any, *args: Any, **kwargs: Any) -> Any:
        command = _command_get()
        if (_checkout_get() if command is None else command[2]) is not None:
            return await (original(self, *args, **kwargs) if args or kwargs else original(self))
        checkout = _begin_checkout(self, redis_records_wait, command)
        if checkout is None:
            return await (original(self, *args, **kwargs) if args or kwargs else original(self))
        try:
            connection = await (original(self, *args, **kwargs) if args or kwargs else original(self))
        except BaseException as exc:  # a timeout, a refused connection, a cancelled task
            _end_checkout(self, checkout, None, exc)
            raise
        _end_checkout(self, checkout, connection, None)
        return connection

    return get_connection


@runtime.stretch
def _begin_checkout(pool: Any, redis_records_wait: bool, command: list[Any] | None) -> _Checkout | None:
    try:
        try:
            state: _PoolState | None = pool._latprof_redis_pool  # _STATE_ATTR, read as an attribute
        except AttributeError:
            state = None
        if state is None or state.pid != _pid:
            state = _pool_state(pool)
        start = _now()
        request = _request_get()
        checkout = _new(_Checkout)
        checkout.state = state
        checkout.start_ns = start
        checkout.request = request
        checkout.redis_records_wait = redis_records_wait
        checkout.connect_started_ns = None
        checkout.command = command
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None
    if start >= state.gauge_due_ns or start < state.gauged_at_ns:  # gauges due
        _read_gauges(pool, state, start)  # before counting itself: a caller served at once never waited
    state.inside.append(None)
    if command is None:
        checkout.token = _checkout_set(checkout)
    else:  # inside a command, its cell is where the checkout in progress is found (a context variable less to set)
        command[2] = checkout
    if request is not None:
        try:  # a lock wait inside the checkout (the asyncio pool's lock while another task connects) is db.pool
            checkout.spans_before = len(request.spans or ())
            checkout.segment_id = segment_id = _new_id()
            checkout.parent_token = _parent_set(segment_id)
        except Exception as exc:
            checkout.segment_id = checkout.parent_token = None
            runtime.count_error(HOOK, exc)
    return checkout


@runtime.stretch
def _end_checkout(pool: Any, checkout: _Checkout, connection: Any, error: BaseException | None) -> None:
    end = _now()
    state = checkout.state
    request = checkout.request
    try:  # the nesting, the re-entry guard and the waiter count first: they must never stay set
        if request is not None and checkout.parent_token is not None:
            try:
                _parent_reset(checkout.parent_token)
            except ValueError:  # left from another context
                pass
        if checkout.command is not None:
            checkout.command[2] = None
        else:
            try:
                _checkout_reset(checkout.token)
            except ValueError:  # not the context it was set in
                _checkout_set(None)
    finally:
        state.inside.pop()
    elapsed = end - checkout.start_ns
    connect_started = checkout.connect_started_ns
    if connect_started is not None or elapsed >= WAITED_NS or end >= state.gauge_due_ns or end < state.gauged_at_ns:
        _checkout_gauges(pool, state, end, elapsed, connect_started)
    try:
        histogram = _wait_histogram
        if (
            histogram is not None
            and (not _wait_histogram_proxy or histogram._real_instrument is not None)
            and not (checkout.redis_records_wait and redis_records_wait_time())
        ):
            histogram.record(elapsed / 1e9, state.pool_attrs)
        if request is None or not _active():
            if connection is not None:  # a hold left by a connection never released
                try:
                    connection._latprof_redis_hold = None  # _HOLD_ATTR
                except AttributeError:  # a connection class without a __dict__
                    _holds.pop(connection, None)
            return
        if (
            elapsed >= MIN_CHECKOUT_NS
            or connect_started is not None
            or error is not None
            or (
                checkout.segment_id is not None
                and len(request.spans or ()) > checkout.spans_before
                and _has_children(request, checkout)
            )
        ):
            _record_checkout(checkout, request, end, error)
        if connection is not None:
            # the hold nests where the checkout happened, whatever is open when it is released
            parent = _parent_get()
            hold = (end, request, _ROOT if parent is None else parent, state.pool_attrs)
            try:
                connection._latprof_redis_hold = hold  # _HOLD_ATTR
            except AttributeError:  # a connection class without a __dict__
                _holds[connection] = hold
    except Exception as exc:
        runtime.count_error(HOOK, exc)


def _connect_ns(end: int, elapsed: int, connect_started: int | None) -> int:
    """How much of a checkout that ended at `end` went into opening a connection."""
    return 0 if connect_started is None else min(elapsed, max(0, end - connect_started))


def _checkout_gauges(pool: Any, state: _PoolState, end: int, elapsed: int, connect_started: int | None) -> None:
    """The gauges at the end of a checkout: at once if it waited (how the pool looked while it
    did, counting itself among the waiters), else if they are due."""
    if elapsed - _connect_ns(end, elapsed, connect_started) >= WAITED_NS:
        _read_gauges(pool, state, end, force=True, waiters=len(state.inside) + 1)
    elif end >= state.gauge_due_ns or end < state.gauged_at_ns:  # gauges due
        _read_gauges(pool, state, end)


def _has_children(request: runtime.RequestState, checkout: _Checkout) -> bool:
    """Whether a segment recorded since the checkout began is its child (then it must be recorded too)."""
    segment_id = checkout.segment_id
    for span in (request.spans or ())[checkout.spans_before :]:
        if span[1] == segment_id:
            return True
    return False


def _record_checkout(checkout: _Checkout, request: runtime.RequestState, end: int, error: BaseException | None) -> None:
    """The checkout's `db.pool` segment; the command it is part of starts its own time at its end."""
    attrs = dict(checkout.state.attrs)
    connect_started = checkout.connect_started_ns
    if connect_started is not None:
        attrs[CONNECT_MS] = round(_connect_ns(end, end - checkout.start_ns, connect_started) / 1e6, 3)
    if error is not None:
        attrs[ERROR_TYPE] = type(error).__qualname__
    _record(
        SEGMENT_CHECKOUT,
        DB_POOL,
        checkout.start_ns,
        end,
        attrs,
        segment_id=checkout.segment_id,
        state=request,
        copy_attrs=False,
    )
    command = checkout.command
    if command is not None:
        command[0] = end  # the command's own time starts when it has its connection


def _note_connect() -> None:
    """Note that the checkout of this thread or task begins opening a connection."""
    try:
        command = _command_get()
        checkout = _checkout_get() if command is None or command[2] is None else command[2]
        if checkout is not None and checkout.connect_started_ns is None:
            checkout.connect_started_ns = _now()
    except Exception as exc:
        runtime.count_error(HOOK, exc)


def _wrap_make_connection(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def make_connection(self: Any, *args: Any, **kwargs: Any) -> Any:
        _note_connect()
        return original(self, *args, **kwargs)

    return make_connection


def _wrap_connect(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def connect(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            opened = self._sock is not None
        except AttributeError:
            opened = False
        if not opened:  # a reused connection that lost its socket is reopened here
            _note_connect()
        return original(self, *args, **kwargs) if args or kwargs else original(self)

    return connect


def _wrap_async_connect(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def connect(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            is_open = bool(getattr(self, "is_connected", False))
        except Exception as exc:
            runtime.count_error(HOOK, exc)
            is_open = True
        if not is_open:
            _note_connect()
        return await (original(self, *args, **kwargs) if args or kwargs else original(self))

    return connect


# --- holds ------------------------------------------------------------------------------------


def _wrap_release(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def release(self: Any, connection: Any, *args: Any, **kwargs: Any) -> Any:
        now = _now()
        _end_hold(connection, now)
        result = original(self, connection, *args, **kwargs) if args or kwargs else original(self, connection)
        _released(self, now)
        return result

    return release


def _wrap_async_release(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def release(self: Any, connection: Any, *args: Any, **kwargs: Any) -> Any:
        now = _now()
        _end_hold(connection, now)  # the asyncio BlockingConnectionPool's calls its base's: the hold ends once
        result = await (original(self, connection, *args, **kwargs) if args or kwargs else original(self, connection))
        _released(self, now)
        return result

    return release


@runtime.stretch
def _end_hold(connection: Any, now: int) -> None:
    """`connection` goes back to its pool at `now`: record its hold, if this hook saw it checked out."""
    try:
        try:
            held = connection._latprof_redis_hold  # _HOLD_ATTR
            if held is not None:
                connection._latprof_redis_hold = None
        except AttributeError:  # never checked out by this hook, or a connection class without a __dict__
            held = _holds.pop(connection, None)
        if held is not None:
            start, request, parent, attrs = held
            _record(
                SEGMENT_CONNECTION_HOLD,
                None,
                start,
                now,
                attrs,
                parent_id=parent,  # where the checkout happened, not under whatever runs the release
                state=request,
                copy_attrs=False,
            )
    except Exception as exc:
        runtime.count_error(HOOK, exc)


@runtime.stretch
def _released(pool: Any, now: int) -> None:
    """A connection went back to `pool`: read its gauges when due."""
    try:
        state = pool._latprof_redis_pool  # _STATE_ATTR
    except AttributeError:  # no checkout seen yet
        state = None
    if state is not None and (now >= state.gauge_due_ns or now < state.gauged_at_ns):  # gauges due
        _read_gauges(pool, state, now)  # (guarded)


# --- commands and pipelines -------------------------------------------------------------------


def _wrap_command(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def execute_command(self: Any, *args: Any, **options: Any) -> Any:
        request = _request_get()
        # outside a request, inside another command (a pipeline's SCRIPT EXISTS: part of it), or
        # when recording is off: nothing to do
        if request is None or _command_get() is not None or not _active():
            return original(self, *args, **options)
        try:
            command = [_now(), request, None]
            token = _command_set(command)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
            return original(self, *args, **options)
        try:
            result = original(self, *args, **options)
        except BaseException as exc:
            _end_command(command, token, args, None, None, exc)
            raise
        _end_command(command, token, args, None, None, None)
        return result

    return execute_command


def _wrap_async_command(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def execute_command(self: Any, *args: Any, **options: Any) -> Any:
        request = _request_get()
        if request is None or _command_get() is not None or not _active():
            return await original(self, *args, **options)
        try:
            command = [_now(), request, None]
            token = _command_set(command)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
            return await original(self, *args, **options)
        try:
            result = await original(self, *args, **options)
        except BaseException as exc:
            _end_command(command, token, args, None, None, exc)
            raise
        _end_command(command, token, args, None, None, None)
        return result

    return execute_command


def _wrap_pipeline_execute(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        begun = _begin_pipeline(self)
        if begun is None:
            return original(self, *args, **kwargs)
        command, token, operation, batch_size = begun
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            _end_command(command, token, (), operation, batch_size, exc)
            raise
        _end_command(command, token, (), operation, batch_size, None)
        return result

    return execute


def _wrap_async_pipeline_execute(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        begun = _begin_pipeline(self)
        if begun is None:
            return await original(self, *args, **kwargs)
        command, token, operation, batch_size = begun
        try:
            result = await original(self, *args, **kwargs)
        except BaseException as exc:
            _end_command(command, token, (), operation, batch_size, exc)
            raise
        _end_command(command, token, (), operation, batch_size, None)
        return result

    return execute


@runtime.stretch
def _begin_pipeline(pipeline: Any) -> tuple[list[Any], contextvars.Token[list[Any] | None], str, int] | None:
    """(command cell, its token, PIPELINE or MULTI, batch size) of a pipeline about to run, or None."""
    request = _request_get()
    if request is None or _command_get() is not None or not _active():
        return None
    try:
        stack = pipeline.command_stack
        if not stack and not pipeline.watching:
            return None  # execute() returns [] at once
        transaction = getattr(pipeline, "is_transaction", None)  # asyncio
        if transaction is None:
            transaction = getattr(pipeline, "transaction", False)
        operation = TRANSACTION if transaction or pipeline.explicit_transaction else PIPELINE
        command = [_now(), request, None]
        return command, _command_set(command), operation, len(stack)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None


@runtime.stretch
def _end_command(
    command: list[Any],
    token: contextvars.Token[list[Any] | None],
    args: tuple[Any, ...],
    operation: str | None,
    batch_size: int | None,
    error: BaseException | None,
) -> None:
    """Record the `db.query` segment of a command (named from its `args`) or of a pipeline (`operation`)."""
    end = _now()
    try:
        try:
            _command_reset(token)
        except ValueError:  # not the context it was set in
            _command_set(None)
        name = operation or command_name(args)
        attrs = _query_attrs.get(name) if batch_size is None and error is None else None
        if attrs is None:
            attrs = {DB_SYSTEM_NAME: SYSTEM, DB_OPERATION_NAME: name, DB_QUERY_SUMMARY: name}
            if batch_size is not None:
                attrs[DB_OPERATION_BATCH_SIZE] = batch_size
            if error is not None:
                attrs[ERROR_TYPE] = type(error).__qualname__
            elif batch_size is None:  # the plain command's: shared by its later segments, never changed
                if len(_query_attrs) >= COMMAND_NAME_CACHE_SIZE:
                    _query_attrs.clear()
                _query_attrs[name] = attrs
        _record(name, DB_QUERY, command[0], end, attrs, state=command[1], copy_attrs=False)
        runtime.saw(HOOK)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
