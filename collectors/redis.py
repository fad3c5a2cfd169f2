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

import contextvars
import functools
import re
import sys
import threading
import time
import types
import weakref
from typing import Any, Callable

from latprof import semconv
from latprof.collectors import runtime
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
GAUGE_INTERVAL_NS = 100_000_000
#: A checkout slower than this (beyond opening a connection) waited for one.
WAITED_NS = 1_000_000
#: A checkout shorter than this, that opened no connection and did not fail, is no segment.
MIN_CHECKOUT_NS = 100_000
#: redis-py 5.x/6.x's default `max_connections` (2**31): no limit, no `db.pool.max` gauge.
UNBOUNDED = 2**31
#: Command names remembered, at most; the cache is emptied when full.
COMMAND_NAME_CACHE_SIZE = 1024

_STATE_ATTR = "_latprof_redis_pool"  # on a pool instance: its _PoolState
_WAIT_TIME_RECORDER = "record_connection_wait_time"  # redis-py's own recorder of the histogram

# Commands whose first argument is a subcommand ("CLIENT SETNAME", "CONFIG GET").
_CONTAINERS = frozenset(
    {"ACL", "CLIENT", "CLUSTER", "COMMAND", "CONFIG", "DEBUG", "FUNCTION", "HIMPORT", "LATENCY", "MEMORY"}
    | {"MODULE", "OBJECT", "PUBSUB", "SCRIPT", "SLOWLOG", "XGROUP", "XINFO"}
)
_COMMAND_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_.|-]{0,39}\Z")  # GET, FT.SEARCH, JSON.SET
_SUBCOMMAND_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}\Z")


class _PoolState:
    """What the hook keeps per pool: its name, attributes ready to use, callers inside, gauge limiter."""

    __slots__ = ("name", "pid", "attrs", "pool_attrs", "lock", "waiters", "gauged_at_ns", "gauged")

    def __init__(self, name: str) -> None:
        self.name = name
        self.pid = runtime.pid()  # a forked child starts over (redis-py resets the pool too)
        self.attrs: dict[str, Any] = {DB_POOL_NAME: name, DB_SYSTEM_NAME: SYSTEM}
        self.pool_attrs = {DB_POOL_NAME: name}  # for gauges and the OpenTelemetry histogram
        self.lock = threading.Lock()
        self.waiters = 0  # this hook's own in-flight outermost get_connection calls
        self.gauged_at_ns = -GAUGE_INTERVAL_NS  # monotonic time of the last reading
        self.gauged: tuple[float, ...] | None = None  # the last values emitted


class _Checkout:
    """One outermost `get_connection` in progress."""

    __slots__ = ("state", "request", "start_ns", "token", "segment_id", "nesting", "connect_started_ns", "redis_records_wait")

    def __init__(self, state: _PoolState, request: runtime.RequestState | None, start_ns: int, redis_records_wait: bool) -> None:
        self.state = state
        self.request = request
        self.start_ns = start_ns
        self.token: contextvars.Token[_Checkout | None] | None = None
        self.segment_id: str | None = None  # inside a request: the id its segment will have
        self.nesting: Any = None  # what makes segments recorded during the checkout its children
        self.connect_started_ns: int | None = None  # when it began making or connecting a connection
        self.redis_records_wait = redis_records_wait  # this class's get_connection records the histogram itself


class _Command:
    """One command or pipeline of a request in progress."""

    __slots__ = ("head", "operation", "batch_size", "request", "start_ns", "query_start_ns", "token")

    def __init__(
        self,
        head: tuple[Any, ...],
        operation: str | None,
        batch_size: int | None,
        request: runtime.RequestState,
        start_ns: int,
    ) -> None:
        self.head = head  # the command word and the next argument, to name it at the end; never recorded
        self.operation = operation  # PIPELINE / MULTI, else named from `head`
        self.batch_size = batch_size
        self.request = request
        self.start_ns = start_ns
        self.query_start_ns: int | None = None  # where a recorded checkout inside it ended
        self.token: contextvars.Token[_Command | None] | None = None


# The checkout in progress in this thread or task: the re-entry guard of `get_connection`,
# and where `connect` notes the time spent opening a connection for it.
_checkout: contextvars.ContextVar[_Checkout | None] = contextvars.ContextVar("latprof_redis_checkout", default=None)
# The command in progress in this thread or task: one segment per outermost command (a
# pipeline's SCRIPT EXISTS is part of the pipeline), and where its checkout ended.
_command: contextvars.ContextVar[_Command | None] = contextvars.ContextVar("latprof_redis_command", default=None)
# Open holds by connection: (start_ns, request, parent segment, pool name). Weak keys: a
# connection dropped without being released takes its entry with it.
_holds: weakref.WeakKeyDictionary[Any, tuple[int, runtime.RequestState, str | None, str]] = weakref.WeakKeyDictionary()
_names: dict[str, str] = {}

_lock = threading.RLock()
_installed = False
_patched: list[tuple[type, str, Any]] = []  # (class, attribute, original) to restore
_wait_histogram: Any = None


# --- install ---------------------------------------------------------------------------------


def install() -> bool:
    """Hook redis-py when it is imported (now, if it already is). Idempotent."""
    global _installed
    with _lock:
        if _installed:
            return True
        _installed = True
    runtime.when_imported("redis", _patch)
    return True


def uninstall() -> None:
    """Undo every patch (tests); pools keep their harmless bookkeeping."""
    global _installed, _wait_histogram
    with _lock:
        _installed = False
        for cls, name, original in reversed(_patched):
            setattr(cls, name, original)
        _patched.clear()
        _wait_histogram = None


def _patch(redis_module: types.ModuleType) -> None:
    """Patch the sync and the asyncio client, each all or nothing; errors counted."""
    global _wait_histogram
    with _lock:
        if not _installed or _patched:
            return
        for targets in (_sync_targets, _async_targets):
            try:
                replacements = targets()
            except Exception as exc:  # this family lacks a hook point: the other one still works
                runtime.count_error(HOOK, exc)
                continue
            for cls, name, wrapper in replacements:
                original = cls.__dict__[name]
                if getattr(original, "__latprof_original__", None) is not None:
                    continue  # patched already (another copy of this module)
                wrapper.__latprof_original__ = original  # type: ignore[attr-defined]
                setattr(cls, name, wrapper)
                _patched.append((cls, name, original))
        _wait_histogram = _make_wait_histogram()


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
    out.append((conn_cls, "connect", _wrap_connect(conn_cls.__dict__["connect"], _sync_is_open)))
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
    out.append((conn_cls, "connect", _wrap_async_connect(conn_cls.__dict__["connect"], _async_is_open)))
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


def _make_wait_histogram() -> Any:
    try:
        from opentelemetry import metrics

        return metrics.get_meter("latprof").create_histogram(
            OTEL_WAIT_TIME, unit="s", description="The time it took to obtain an open connection from the pool"
        )
    except Exception as exc:  # opentelemetry-api missing or broken: the rest still works
        runtime.count_error(HOOK, exc)
        return None


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
    if state is None or state.pid != runtime.pid():
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


def _read_gauges(pool: Any, state: _PoolState, force: bool = False, waiters: int | None = None) -> None:
    """Emit the pool's gauges if they changed and the last reading is 100 ms old, or if `force`."""
    now = time.monotonic_ns()
    if not force and now - state.gauged_at_ns < GAUGE_INTERVAL_NS:
        return
    if not runtime.active():
        return
    numbers = _pool_numbers(pool)
    if numbers is None:
        return
    state.gauged_at_ns = now
    values = (*numbers, float(state.waiters if waiters is None else waiters))
    if not force and values == state.gauged:
        return
    state.gauged = values
    attrs = state.pool_attrs
    runtime.gauge(GAUGE_POOL_SIZE, values[0], attrs)
    if values[1] >= 0:
        runtime.gauge(GAUGE_POOL_MAX, values[1], attrs)
    runtime.gauge(GAUGE_POOL_IN_USE, values[2], attrs)
    runtime.gauge(GAUGE_POOL_WAITERS, values[3], attrs)


# --- checkouts --------------------------------------------------------------------------------


def _wrap_get_connection(original: Callable[..., Any], redis_records_wait: bool) -> Callable[..., Any]:
    @functools.wraps(original)
    def get_connection(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _checkout.get() is not None:  # a subclass calling its base
            return original(self, *args, **kwargs)
        checkout = _begin_checkout(self, redis_records_wait)
        if checkout is None:
            return original(self, *args, **kwargs)
        try:
            connection = original(self, *args, **kwargs)
        except BaseException as exc:
            _end_checkout(self, checkout, None, exc)
            raise
        _end_checkout(self, checkout, connection, None)
        return connection

    return get_connection


def _wrap_async_get_connection(original: Callable[..., Any], redis_records_wait: bool) -> Callable[..., Any]:
    @functools.wraps(original)
    async def get_connection(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _checkout.get() is not None:
            return await original(self, *args, **kwargs)
        checkout = _begin_checkout(self, redis_records_wait)
        if checkout is None:
            return await original(self, *args, **kwargs)
        try:
            connection = await original(self, *args, **kwargs)
        except BaseException as exc:  # a timeout, a refused connection, a cancelled task
            _end_checkout(self, checkout, None, exc)
            raise
        _end_checkout(self, checkout, connection, None)
        return connection

    return get_connection


def _begin_checkout(pool: Any, redis_records_wait: bool) -> _Checkout | None:
    try:
        state = _pool_state(pool)
        checkout = _Checkout(state, runtime.current_request(), runtime.now_ns(), redis_records_wait)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None
    try:
        _read_gauges(pool, state)  # before counting itself: a caller served at once never waited
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    with state.lock:
        state.waiters += 1
    checkout.token = _checkout.set(checkout)
    if checkout.request is not None:
        try:  # a lock wait inside the checkout (the asyncio pool's lock while another task connects) is db.pool
            checkout.segment_id = runtime.new_id()
            checkout.nesting = runtime.nested_under(checkout.segment_id)
            checkout.nesting.__enter__()
        except Exception as exc:
            checkout.nesting = None
            runtime.count_error(HOOK, exc)
    return checkout


def _end_checkout(pool: Any, checkout: _Checkout, connection: Any, error: BaseException | None) -> None:
    end = runtime.now_ns()
    state = checkout.state
    try:  # the nesting, the re-entry guard and the waiter count first: they must never stay set
        if checkout.nesting is not None:
            checkout.nesting.__exit__(None, None, None)
        if checkout.token is not None:
            try:
                _checkout.reset(checkout.token)
            except ValueError:  # not the context it was set in
                _checkout.set(None)
    finally:
        with state.lock:
            waiting = state.waiters
            state.waiters -= 1
    elapsed = end - checkout.start_ns
    connected = checkout.connect_started_ns is not None
    connect_ns = min(elapsed, max(0, end - checkout.connect_started_ns)) if checkout.connect_started_ns is not None else 0
    try:
        if elapsed - connect_ns >= WAITED_NS:
            _read_gauges(pool, state, force=True, waiters=waiting)  # how the pool looked while it waited
        else:
            _read_gauges(pool, state)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    try:
        histogram = _wait_histogram
        if histogram is not None and not (checkout.redis_records_wait and redis_records_wait_time()):
            histogram.record(elapsed / 1e9, state.pool_attrs)
        request = checkout.request
        if request is None or not runtime.active():
            if connection is not None:
                _holds.pop(connection, None)  # a hold left by a connection never released
            return
        if elapsed >= MIN_CHECKOUT_NS or connected or error is not None or _has_children(request, checkout.segment_id):
            attrs = dict(state.attrs)
            if connected:
                attrs[CONNECT_MS] = round(connect_ns / 1e6, 3)
            if error is not None:
                attrs[ERROR_TYPE] = type(error).__qualname__
            runtime.record(
                SEGMENT_CHECKOUT, DB_POOL, checkout.start_ns, end, attrs, segment_id=checkout.segment_id, state=request
            )
            command = _command.get()
            if command is not None and command.request is request:
                command.query_start_ns = end  # the command's own time starts when it has its connection
        if connection is not None:
            # the hold nests where the checkout happened, whatever is open when it is released
            _holds[connection] = (end, request, runtime.current_parent(), state.name)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


def _has_children(request: runtime.RequestState, segment_id: str | None) -> bool:
    """Whether a segment was recorded under `segment_id` (then it must be recorded too)."""
    spans = request.spans
    return segment_id is not None and spans is not None and any(span[1] == segment_id for span in spans[-8:])


def _sync_is_open(connection: Any) -> bool:
    return getattr(connection, "_sock", None) is not None


def _async_is_open(connection: Any) -> bool:
    return bool(getattr(connection, "is_connected", False))


def _note_connect(connection: Any, is_open: Callable[[Any], bool] | None) -> None:
    """Note that the checkout of this thread or task begins opening a connection (if it is one)."""
    try:
        checkout = _checkout.get()
        if checkout is not None and checkout.connect_started_ns is None:
            if is_open is None or not is_open(connection):
                checkout.connect_started_ns = runtime.now_ns()
    except Exception as exc:
        runtime.count_error(HOOK, exc)


def _wrap_make_connection(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def make_connection(self: Any, *args: Any, **kwargs: Any) -> Any:
        _note_connect(None, None)
        return original(self, *args, **kwargs)

    return make_connection


def _wrap_connect(original: Callable[..., Any], is_open: Callable[[Any], bool]) -> Callable[..., Any]:
    @functools.wraps(original)
    def connect(self: Any, *args: Any, **kwargs: Any) -> Any:
        _note_connect(self, is_open)  # a reused connection that lost its socket is reopened here
        return original(self, *args, **kwargs)

    return connect


def _wrap_async_connect(original: Callable[..., Any], is_open: Callable[[Any], bool]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def connect(self: Any, *args: Any, **kwargs: Any) -> Any:
        _note_connect(self, is_open)
        return await original(self, *args, **kwargs)

    return connect


# --- holds ------------------------------------------------------------------------------------


def _wrap_release(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def release(self: Any, connection: Any, *args: Any, **kwargs: Any) -> Any:
        _end_hold(connection)
        result = original(self, connection, *args, **kwargs)
        _after_release(self)
        return result

    return release


def _wrap_async_release(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def release(self: Any, connection: Any, *args: Any, **kwargs: Any) -> Any:
        _end_hold(connection)  # the asyncio BlockingConnectionPool's calls its base's: ends once
        result = await original(self, connection, *args, **kwargs)
        _after_release(self)
        return result

    return release


@runtime.guarded(HOOK)
def _end_hold(connection: Any) -> None:
    held = _holds.pop(connection, None)
    if held is None:
        return
    start, request, parent, name = held
    runtime.record(
        SEGMENT_CONNECTION_HOLD,
        None,
        start,
        runtime.now_ns(),
        {DB_POOL_NAME: name},
        parent_id=runtime.ROOT if parent is None else parent,  # not under whatever runs the release
        state=request,
    )


@runtime.guarded(HOOK)
def _after_release(pool: Any) -> None:
    state = pool.__dict__.get(_STATE_ATTR)
    if state is not None:
        _read_gauges(pool, state)


# --- commands and pipelines -------------------------------------------------------------------


def _wrap_command(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def execute_command(self: Any, *args: Any, **options: Any) -> Any:
        command = _begin_command(args, None, None)
        if command is None:
            return original(self, *args, **options)
        try:
            result = original(self, *args, **options)
        except BaseException as exc:
            _end_command(command, exc)
            raise
        _end_command(command, None)
        return result

    return execute_command


def _wrap_async_command(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def execute_command(self: Any, *args: Any, **options: Any) -> Any:
        command = _begin_command(args, None, None)
        if command is None:
            return await original(self, *args, **options)
        try:
            result = await original(self, *args, **options)
        except BaseException as exc:
            _end_command(command, exc)
            raise
        _end_command(command, None)
        return result

    return execute_command


def _wrap_pipeline_execute(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        command = _begin_pipeline(self)
        if command is None:
            return original(self, *args, **kwargs)
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            _end_command(command, exc)
            raise
        _end_command(command, None)
        return result

    return execute


def _wrap_async_pipeline_execute(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        command = _begin_pipeline(self)
        if command is None:
            return await original(self, *args, **kwargs)
        try:
            result = await original(self, *args, **kwargs)
        except BaseException as exc:
            _end_command(command, exc)
            raise
        _end_command(command, None)
        return result

    return execute


def _begin_pipeline(pipeline: Any) -> _Command | None:
    try:
        stack = pipeline.command_stack
        if not stack and not pipeline.watching:
            return None  # execute() returns [] at once
        transaction = getattr(pipeline, "is_transaction", None)  # asyncio
        if transaction is None:
            transaction = getattr(pipeline, "transaction", False)
        operation = TRANSACTION if transaction or pipeline.explicit_transaction else PIPELINE
        return _begin_command((), operation, len(stack))
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None


def _begin_command(args: tuple[Any, ...], operation: str | None, batch_size: int | None) -> _Command | None:
    try:
        if _command.get() is not None:  # inside another command (a pipeline's SCRIPT EXISTS): part of it
            return None
        request = runtime.current_request()
        if request is None or not runtime.active():
            return None
        command = _Command(args[:2], operation, batch_size, request, runtime.now_ns())
        command.token = _command.set(command)
        return command
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None


def _end_command(command: _Command, error: BaseException | None) -> None:
    end = runtime.now_ns()
    try:
        try:
            if command.token is not None:
                _command.reset(command.token)
        except ValueError:  # not the context it was set in
            _command.set(None)
        name = command.operation or command_name(command.head)
        attrs: dict[str, Any] = {DB_SYSTEM_NAME: SYSTEM, DB_OPERATION_NAME: name, DB_QUERY_SUMMARY: name}
        if command.batch_size is not None:
            attrs[DB_OPERATION_BATCH_SIZE] = command.batch_size
        if error is not None:
            attrs[ERROR_TYPE] = type(error).__qualname__
        start = command.query_start_ns if command.query_start_ns is not None else command.start_ns
        runtime.record(name, DB_QUERY, start, end, attrs, state=command.request)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    finally:
        command.head = ()
