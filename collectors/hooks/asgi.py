"""Inbound HTTP requests of ASGI services under uvicorn (h11 or httptools, asyncio or uvloop), Starlette, FastAPI.

One request root per HTTP request, backdated to when its bytes reached the server's socket:

- **Where it hooks.** `RequestResponseCycle.run_asgi` of uvicorn's protocol implementations.
  uvicorn builds one cycle per request the moment it has parsed the request head, on the
  loop, and calls `run_asgi` right there to create the request's task; the cycle holds the
  transport (so the socket) and the scope. For a recorded request, `run_asgi` returns the
  request's coroutine inside a proxy (`asyncio_loop.TimedCoroutine`) that opens the request
  on its first step and closes it, and wraps that cycle's `send` (an instance attribute, gone
  again after the last body), which sees the status and the end of the response. Nothing is
  added to the scope, the headers or the messages the application sees. `anyio.to_thread.run_sync`
  (Starlette's and FastAPI's thread pool) is wrapped to time the wait for a worker thread.
- **Which requests.** Every request, up to about `latprof run --max-rate` a second per
  process (`runtime.Sampler`); above that a random 1 in k, whose root carries
  `latprof.sample_weight` = k. A request not in the sample runs untouched: `run_asgi`
  returns its coroutine as it is (the cost is the sampler's decision), and the other hooks
  see no current request in its context.
- **Start.** On Linux `getsockopt(TCP_INFO)` on the connection gives `tcpi_last_data_recv`
  (u32 at byte 52: milliseconds since data last arrived, counted in kernel ticks of 1-10 ms),
  read when uvicorn hands the request over. The start is backdated by that, less one tick
  (the least the request can have waited), so a request read at once never looks queued.
  The system call is made only while the loop is late by a tick or more (now, or in the last
  2 s, per `LoopMonitor.lagging`): a loop that answers within a tick cannot have left the
  request in the socket for a tick, and TCP_INFO would not show less. An
  `X-Request-Start` header (`t=` then seconds, milliseconds or microseconds since the epoch,
  told apart by magnitude) moves the start earlier still: the time between the proxy and the
  socket is a `queue` segment with `latprof.queue.source = "header"`. On unix sockets (no
  TCP_INFO) the start is when the server read the request, and a warning record says so once
  per process.
- **Before the handler.** From arrival to the first step of the request's coroutine the
  request sat in the socket and the loop's ready queue: an asyncio server's only queue is its
  loop, so that is an `event_loop` segment (from 1 ms on: shorter is below TCP_INFO's
  resolution, and a healthy request then costs one event, its root).
- **While it runs.** When it ends, the parts of its lifetime in which the loop was blocked by
  work that was not its own are `event_loop` segments (see `asyncio_loop`); where its own code
  held the loop, a segment without a layer (`held the event loop`, owning no time) names the
  culprit. Waits of a millisecond or more for a worker thread of anyio's thread pool (sync
  endpoints and dependencies) are `queue` segments with `latprof.queue.source = "threadpool"`.
- **cpu_ns** is the CPU time of every step of the request's coroutine and of the tasks it
  spawned on the loop (as `asyncio_loop` measures it: a step under 1 ms counts its wall-clock
  time, a longer one reads the thread's CPU clock), plus the thread CPU time of its functions
  run in anyio's thread pool, until the end of the step in which the application sent the
  response's last body message. Not counted: uvicorn's own parsing and writing outside those
  steps, threads the service starts itself, background tasks after the response.
- **Route** is the method and Starlette's matched route template (`POST /chat/{id}`, mount
  prefixes included), read after routing; never the raw path. `<unmatched>` when Starlette's
  router matched nothing, `<no route>` for applications without Starlette's router.
- **End** is when the application sent its last body message (uvicorn writes it to the
  transport right away; when the transport's buffer is full, after it drained).
- **Installed late** (into a uvicorn that is already serving): uvicorn looks `run_asgi` up on
  each request's cycle, so every request parsed after the injection is seen, backdated to its
  arrival (see `asyncio_loop`: a new monitor counts as lagging until its probe ticked), and
  the requests already running are left out (their cycle's `send` is not wrapped). Uninstall
  also closes the loop monitors (`asyncio_loop.stop_monitors`).
"""

from __future__ import annotations

import functools
import time
import types
from typing import Any, Callable

from latprof.collectors.hooks import _async_request, _inbound, _scaffold, asyncio_loop, runtime
from latprof.collectors.hooks._async_request import Request, RequestCoroutine
from latprof.layers import QUEUE
from latprof.semconv import NOTE_WARNING, QUEUE_SOURCE

HOOK = "asgi"

#: uvicorn modules whose `RequestResponseCycle` is patched.
UVICORN_PROTOCOLS = (
    "uvicorn.protocols.http.h11_impl",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.http.zttp_impl",  # same cycle shape; not tested here (needs the zttp package)
    "uvicorn.protocols.http.zttp_h2_impl",
)
#: Thread-pool waits shorter than this are the hand-off itself, not queueing: no segment.
THREADPOOL_MIN_WAIT_NS = 1_000_000
THREADPOOL_WAIT = "threadpool wait"
_HEADER = b"x-request-start"
_CYCLE_ATTR = "_latprof_request"
_SOCKET_ATTR = "_latprof_socket"
_UNSET: Any = object()

_time_ns = time.time_ns
_thread_time_ns = time.thread_time_ns


# --- install -----------------------------------------------------------------------------------


def _patch_uvicorn(module: Any) -> None:
    cls = module.RequestResponseCycle
    _async_request.load()
    original_run_asgi = cls.__dict__["run_asgi"]
    original_send = cls.__dict__["send"]

    def run_asgi(self: Any, app: Any) -> Any:
        # A request outside the sample runs untouched.
        return _async_request.track_if_sampled(HOOK, original_run_asgi(self, app), _track_cycle, self, send)

    def send(self: Any, message: Any) -> Any:
        request = self.__dict__.get(_CYCLE_ATTR)
        if request is None or request.done:
            return original_send(self, message)
        flow = getattr(self, "flow", None)
        if flow is not None and flow.write_paused:
            return _send_when_writable(original_send, self, message, request)
        # uvicorn writes to the transport as soon as the coroutine runs (awaited at once):
        # noting the message now, without a coroutine of our own, costs the service less.
        try:
            _sent(request, message)
            if request.done:  # the response is out: unwrap, and so break the cycle -> method -> cycle loop
                self.__dict__.pop("send", None)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
        return original_send(self, message)

    functools.update_wrapper(run_asgi, original_run_asgi)
    functools.update_wrapper(send, original_send)
    import inspect  # loaded by uvicorn already; not worth its import time in every other process

    if hasattr(inspect, "markcoroutinefunction"):  # 3.12+: introspection still sees an async send
        inspect.markcoroutinefunction(send)
    scaffold.replace(cls, "run_asgi", run_asgi)


async def _send_when_writable(original_send: Callable[..., Any], cycle: Any, message: Any, request: Request) -> None:
    """The transport's buffer is full: the message goes out once it drained, then note it."""
    await original_send(cycle, message)
    if not request.done:
        try:
            _sent(request, message)
            if request.done:
                cycle.__dict__.pop("send", None)
        except Exception as exc:
            runtime.count_error(HOOK, exc)


def _patch_to_thread(module: Any) -> None:
    original = module.run_sync

    async def run_sync(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        request = asyncio_loop.current_owner()
        if not isinstance(request, Request) or request.done:
            return await original(func, *args, **kwargs)
        call = _ThreadCall(func)
        called_ns = _time_ns()
        try:
            return await original(call, *args, **kwargs)
        finally:
            _thread_call_done(request, called_ns, call)

    functools.update_wrapper(run_sync, original)
    scaffold.replace(module, "run_sync", run_sync)


_T = _scaffold.Target
#: What the hook patches: each uvicorn protocol when (if ever) it is imported, and anyio's
#: `to_thread.run_sync`, in the lines the README's command installs.
scaffold = _scaffold.Hook(HOOK, [
    *(
        _scaffold.Library(name, [_T(name, "RequestResponseCycle", "run_asgi")], _patch_uvicorn,
                          [_scaffold.Tested("uvicorn", "0.54", "0.55")])
        for name in UVICORN_PROTOCOLS
    ),
    _scaffold.Library("anyio.to_thread", [_T("anyio.to_thread", "", "run_sync", True)], _patch_to_thread,
                      [_scaffold.Tested("anyio", "4.16", "4.16")]),
], asyncio_loop.stop_monitors)  # fmt: skip
#: Patch uvicorn and anyio when (if ever) the service imports them; idempotent.
install = scaffold.install
#: Restore the originals and close the loop monitors; requests in flight still finish.
uninstall = scaffold.uninstall


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""

    def describe() -> str:
        protocols = [name.rpartition(".")[2] for name in scaffold.imported() if name.startswith("uvicorn.")]
        serving = f"uvicorn's {', '.join(protocols)} protocol is loaded" if protocols else "uvicorn is not imported in this process"
        return (f"{serving}: every request uvicorn parses after the injection is recorded from its arrival at the socket,"
                " requests already running are left out, and anyio thread-pool waits are seen for calls made after it")

    return scaffold.late_coverage(describe)


# --- one request -------------------------------------------------------------------------------


def _track_cycle(cycle: Any, send: Callable[..., Any], coro: Any, weight: int) -> Any:
    tracked = _track(cycle, coro, weight)
    if tracked is not coro:
        # Only this cycle's `send` is wrapped (the coroutine looks it up when it runs):
        # requests outside the sample do not pay for a wrapper.
        cycle.__dict__["send"] = types.MethodType(send, cycle)
    return tracked


def _track(cycle: Any, coro: Any, weight: int = 1) -> Any:
    """Wrap the coroutine of the request uvicorn just parsed (called on the loop, in data_received)."""
    if (monitor := _async_request.loop_monitor()) is None:
        return coro
    read_ns = _time_ns()
    arrival_ns = _socket_arrival(cycle, read_ns, monitor)
    reference_ns = arrival_ns if arrival_ns is not None else read_ns
    scope = cycle.scope
    header_ns = _header_start(scope.get("headers"), reference_ns)
    request = Request(HOOK, _route, scope, monitor, read_ns, arrival_ns, header_ns, weight)
    cycle.__dict__[_CYCLE_ATTR] = request
    monitor.request_started()
    return RequestCoroutine(coro, request, monitor)


def _sent(request: Request, message: Any) -> None:
    """uvicorn sent `message` for the request: note the status and the end of the response."""
    kind = message.get("type")
    if kind == "http.response.start":
        request.status = message.get("status")
    elif kind == "http.response.body" and not message.get("more_body", False) and not request.done:
        # The request's own task closes it, in its own context, when its current step (or,
        # for a response streamed from a task it spawned, its next one) ends.
        request.response_end_ns = _time_ns()
        request.done = True


# --- thread pool -------------------------------------------------------------------------------


class _ThreadCall:
    """A function sent to a worker thread: notes when it started there and the CPU it used."""

    __slots__ = ("func", "started_ns", "cpu_ns")

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        self.started_ns = 0
        self.cpu_ns = 0

    def __call__(self, *args: Any) -> Any:
        self.started_ns = _time_ns()
        cpu0 = _thread_time_ns()
        try:
            return self.func(*args)
        finally:
            self.cpu_ns = _thread_time_ns() - cpu0


def _thread_call_done(request: Request, called_ns: int, call: _ThreadCall) -> None:
    try:
        if request.done:
            return
        request.cpu_ns += call.cpu_ns
        started = call.started_ns
        if started and started - called_ns >= THREADPOOL_MIN_WAIT_NS and request.state is not None:
            runtime.record(THREADPOOL_WAIT, QUEUE, called_ns, started, {QUEUE_SOURCE: "threadpool"}, state=request.state)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


# --- arrival -----------------------------------------------------------------------------------


def _connection_socket(cycle: Any, store: dict[str, Any] | None) -> Any:
    """The TCP socket of the cycle's connection, or None (unix socket, not Linux), kept in `store`.

    `store` is the `__dict__` of the connection's flow control object, which uvicorn makes
    once per connection: uvloop builds a new socket object on every `get_extra_info("socket")`.
    """
    transport = cycle.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if not _inbound.has_tcp_info(sock):
        sock = None
        _inbound.note_once(
            HOOK,
            NOTE_WARNING,
            "asgi: no TCP_INFO on the server's socket (unix socket or not Linux): requests start when the"
            " server read them, time their bytes waited in the socket before that is not seen",
        )
    if store is not None:
        store[_SOCKET_ATTR] = sock
    return sock


def _socket_arrival(cycle: Any, now_ns: int, monitor: asyncio_loop.LoopMonitor) -> int | None:
    """When the connection last received data (wall-clock ns), from TCP_INFO; None if unknown or now.

    TCP_INFO counts in kernel ticks, and a wait under one tick is not seen: while the loop
    answers ready callbacks within a tick, the socket cannot have held the request longer,
    and the system call (about 10 us on a busy server, a fifth of what the hooks cost) is
    skipped.
    """
    store = getattr(getattr(cycle, "flow", None), "__dict__", None)
    sock = store.get(_SOCKET_ATTR, _UNSET) if store is not None else _UNSET
    if sock is _UNSET:  # the connection's first request
        sock = _connection_socket(cycle, store)
    if sock is None or not monitor.lagging(_inbound.TICK_NS):
        return None
    return _inbound.last_data_arrival(sock, now_ns)


def _header_start(headers: Any, arrival_ns: int) -> int | None:
    """The X-Request-Start time (wall-clock ns) when present and not after the socket arrival."""
    if not headers:
        return None
    for name, value in headers:
        if name == _HEADER:
            return _inbound.header_start(value, arrival_ns, HOOK)
    return None


# --- route templates ---------------------------------------------------------------------------

_templates: dict[int, tuple[Any, str | None]] = {}  # id(route or endpoint) -> (it, its full template)
_MAX_TEMPLATES = 4096


def _route(scope: Any) -> str:
    """`METHOD /template` from the route Starlette matched, after routing; never the raw path.

    Starlette's router puts the matched route in `scope["route"]` (FastAPI's routes always
    did); with Starlette versions whose router does not, the route is found by the endpoint
    it put in the scope. Inside a Mount the route's own path lacks the mount's: the full
    template is found by walking the router's tree, once per route.
    """
    method = scope.get("method") or "GET"
    route = scope.get("route")
    path = getattr(route, "path", None) if route is not None else None
    if not isinstance(path, str):
        endpoint = scope.get("endpoint")
        found = _template(scope.get("router"), endpoint, "endpoint") if endpoint is not None else None
        if found is None:
            return f"{method} <unmatched>" if "router" in scope else f"{method} <no route>"
        return f"{method} {found or '/'}"
    root_path = scope.get("root_path", "")
    if root_path != scope.get("app_root_path", root_path):  # matched inside a Mount
        path = _template(scope.get("router"), route, None) or path
    return f"{method} {path or '/'}"


def _template(router: Any, target: Any, attribute: str | None) -> str | None:
    """The full template of the route that is `target` (or whose `attribute` is `target`), cached."""
    cached = _templates.get(id(target))
    if cached is not None and cached[0] is target:
        return cached[1]
    found = _find_route(getattr(router, "routes", None) or (), target, attribute, "", 0)
    if len(_templates) >= _MAX_TEMPLATES:
        _templates.clear()
    _templates[id(target)] = (target, found)
    return found


def _find_route(routes: Any, target: Any, attribute: str | None, prefix: str, depth: int) -> str | None:
    for route in routes:
        if (route if attribute is None else getattr(route, attribute, None)) is target:
            path = getattr(route, "path", None)
            return prefix + path if isinstance(path, str) else None
        children = getattr(route, "routes", None)
        if children and depth < 8:
            mount_path = getattr(route, "path", "")
            prefixed = prefix + (mount_path if isinstance(mount_path, str) else "")
            found = _find_route(children, target, attribute, prefixed, depth + 1)
            if found is not None:
                return found
    return None
