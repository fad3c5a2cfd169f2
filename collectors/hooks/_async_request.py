"""One inbound request of an asyncio server, from its arrival to its root's emission: the model
the ASGI (uvicorn) and aiohttp.web hooks share.

A server hook builds a `Request` when the server has parsed a request (its arrival from
TCP_INFO, an `X-Request-Start` earlier still) and hands the server a `RequestCoroutine` in
place of the request's coroutine: its first step opens the request in the request task's own
context (`begin`), each step is timed for the event-loop attribution (`asyncio_loop`), and
when the response is out `finish` emits what the request waited for before its handler ran
(`event_loop`, `queue` behind a proxy), the parts of its life in which other work held the
loop, and the root. The server hook says when the response is out (`Request.done`), and its
status and route.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from latprof.collectors.hooks import _inbound, asyncio_loop, runtime
from latprof.layers import EVENT_LOOP, QUEUE
from latprof.semconv import QUEUE_SOURCE, SAMPLE_WEIGHT

#: Segment names. The layer-less HELD_THE_LOOP marks where the request's own code held the
#: event loop (a step of 20 ms or more) and made every other request in flight wait.
PRE_HANDLER = "waiting for the event loop"
BLOCKED_BY_OTHERS = "event loop blocked by other work"
HELD_THE_LOOP = "held the event loop"
BEHIND_THE_PROXY = "queue before the server (X-Request-Start)"
#: A shorter time from arrival to handler gets no segment: it is below TCP_INFO's resolution
#: (the kernel's tick, 1-10 ms), and one event less per request halves what a healthy request costs.
MIN_PRE_HANDLER_NS = 1_000_000
#: At most this many `event_loop` waits are nested under a request's segments (one per segment
#: that was open during a block); the rest of its waits hang off the root.
MAX_NESTED_WAITS = 64
#: The route of a request until it is known (the root is written at the end, with the real one).
PENDING_ROUTE = "<pending>"

_time_ns = time.time_ns

# Bound on first use (`load()`): importing asyncio costs every process that loads the hooks,
# and most never serve HTTP.
get_running_loop: Callable[[], Any] = lambda: None


def loop_monitor() -> asyncio_loop.LoopMonitor | None:
    """The monitor of the running event loop (None: no loop, or one the hooks do not watch)."""
    return asyncio_loop.monitor(get_running_loop())


def load() -> None:
    """Bind `get_running_loop` and the TCP_INFO constants; idempotent."""
    global get_running_loop
    import asyncio

    get_running_loop = asyncio.get_running_loop
    _inbound.load()


class Request(asyncio_loop.Owner):
    """One HTTP request from its arrival to its root's emission."""

    __slots__ = (
        "hook",
        "route_of",
        "scope",
        "monitor",
        "read_ns",
        "arrival_ns",
        "header_ns",
        "handler_ns",
        "token",
        "state",
        "status",
        "response_end_ns",
        "finished",
        "weight",
        "route",
    )

    def __init__(
        self,
        hook: str,
        route_of: Callable[[Any], str],
        scope: Any,
        monitor: asyncio_loop.LoopMonitor,
        read_ns: int,
        arrival_ns: int | None,
        header_ns: int | None,
        weight: int = 1,
    ) -> None:
        super().__init__()
        self.hook = hook  # whose errors these are (runtime.count_error)
        self.route_of = route_of  # the route from `scope`, after the application ran, when `route` was not set
        self.scope = scope
        self.monitor = monitor
        self.read_ns = read_ns  # when uvicorn handed the parsed request over
        self.arrival_ns = arrival_ns  # when its bytes reached the socket (TCP_INFO), if known
        self.header_ns = header_ns  # X-Request-Start, if present and believable
        self.handler_ns = 0  # first step of the request's coroutine
        self.token: Any = None
        self.state: runtime.RequestState | None = None
        self.status: int | None = None
        self.response_end_ns = 0
        self.finished = False  # the root was emitted (or given up on)
        self.weight = weight  # the requests this one stands for (runtime.Sampler)
        self.route: str | None = None  # set by a server hook that knows it (aiohttp); else from the scope


class RequestCoroutine(asyncio_loop.TimedCoroutine):
    """The request's own coroutine (uvicorn's `run_asgi`, aiohttp's `_handle_request`): opens the request, times, closes it."""

    __slots__ = ()
    _owner: Request  # the slot of TimedCoroutine, always a Request here

    def send(self, value: Any) -> Any:
        return self._step(self._coro.send, value)

    def throw(self, *args: Any) -> Any:
        return self._step(self._coro.throw, *args)

    def _step(self, method: Callable[..., Any], *args: Any) -> Any:
        request: Request = self._owner
        if request.finished:
            return method(*args)
        if request.token is None:
            begin(request)
        if request.done:  # the response is out; only its end (streamed from a child task) is left
            try:
                return method(*args)
            except BaseException:
                finish(request)
                raise
        wall0 = _time_ns()
        try:
            result = method(*args)
        except BaseException:  # StopIteration included: the coroutine is over
            self._account(request, wall0)
            finish(request)
            raise
        self._account(request, wall0)
        if request.done:  # the response's last body message went out during this step
            finish(request)
        return result


def track_if_sampled(hook: str, coro: Any, track: Callable[..., Any], *args: Any) -> Any:
    """What an inbound hook does with the coroutine of each request its server starts: `coro`
    itself when not recording or the request is not in the sample, else `track(*args, coro,
    weight)`. Never raises; the hook's own time here is part of what it reports it cost."""
    if not runtime.active():
        return coro
    timing = runtime.cost_begin()
    try:
        weight = runtime.sampler()
        return track(*args, coro, weight) if weight else coro
    except Exception as exc:
        runtime.count_error(hook, exc)
        return coro
    finally:
        runtime.cost_end(timing)


def begin(request: Request) -> None:
    """First step, in the request task's own context: open the request there."""
    timing = runtime.cost_begin()
    try:
        handler_ns = _time_ns()
        request.handler_ns = handler_ns
        arrival_ns = request.arrival_ns if request.arrival_ns is not None else request.read_ns
        start_ns = request.header_ns if request.header_ns is not None else arrival_ns
        asyncio_loop.adopt(request)
        attrs = {SAMPLE_WEIGHT: request.weight} if request.weight > 1 else None
        request.token, request.state = runtime.open_request(PENDING_ROUTE, min(start_ns, handler_ns), attrs)
        runtime.saw(request.hook)
    except Exception as exc:
        request.finished = request.done = True
        request.monitor.request_finished()
        runtime.count_error(request.hook, exc)
    runtime.cost_end(timing)


def finish(request: Request) -> None:
    """Emit the request's segments and root (in the request task's context); never raises."""
    if request.finished:
        return
    timing = runtime.cost_begin()
    request.finished = request.done = True
    monitor = request.monitor
    monitor.request_finished()
    try:
        state = request.state
        if state is None:
            return
        end_ns = request.response_end_ns or _time_ns()
        state.route = request.route or request.route_of(request.scope)
        state.status_code = request.status
        state.cpu_ns = request.cpu_ns
        arrival_ns = request.arrival_ns if request.arrival_ns is not None else request.read_ns
        arrival_ns = min(arrival_ns, request.handler_ns)
        if request.header_ns is not None and request.header_ns < arrival_ns:
            segment(state, BEHIND_THE_PROXY, QUEUE, request.header_ns, arrival_ns, {QUEUE_SOURCE: "header"})
        if request.handler_ns - arrival_ns >= MIN_PRE_HANDLER_NS:
            segment(state, PRE_HANDLER, EVENT_LOOP, arrival_ns, request.handler_ns)
        others, own = monitor.blocked(request.key, request.handler_ns, end_ns)
        if others:
            waited_for_the_loop(state, others)
        for lo, hi in own:  # no layer, it owns no time: says which request held the loop, and how long
            segment(state, HELD_THE_LOOP, None, lo, hi)
        runtime.end_request(request.token, end_ns)
    except Exception as exc:
        runtime.count_error(request.hook, exc)
    finally:
        request.scope = request.state = request.token = None  # the cycle outlives the request on a keep-alive connection
        runtime.cost_end(timing)


def waited_for_the_loop(state: runtime.RequestState, blocks: list[tuple[int, int]]) -> None:
    """Record the request's time in `blocks` (the loop blocked by other work) as `event_loop`.

    Where a segment of the request that was awaited on the loop (its thread's) was open, the
    request was waiting on the loop there too, whatever it awaited (the provider, a query, a
    pool): the wait becomes a child of each such innermost segment, so that it owns that
    time (report-v1: the innermost segment owns the time). Where a segment of another thread
    was running (`asyncio.to_thread`, the thread pool), the request was not waiting for the
    loop. Where no segment was open, the wait hangs off the root.
    """
    spans = runtime.spans_of(state)
    loop_thread = threading.get_ident()
    parents = {parent for _, parent, _, _, _ in spans if parent is not None}
    nested = 0
    for lo, hi in blocks:
        covered: list[tuple[int, int]] = []
        for sid, _, start, end, thread in spans:
            if end <= lo or start >= hi:
                continue
            a, b = (start if start > lo else lo), (end if end < hi else hi)
            covered.append((a, b))
            if thread == loop_thread and sid not in parents and nested < MAX_NESTED_WAITS:
                runtime.record(BLOCKED_BY_OTHERS, EVENT_LOOP, a, b, parent_id=sid, state=state)
                nested += 1
        for a, b in uncovered(lo, hi, covered):
            segment(state, BLOCKED_BY_OTHERS, EVENT_LOOP, a, b)


def uncovered(lo: int, hi: int, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [lo, hi] outside every interval of `covered`."""
    if not covered:
        return [(lo, hi)]
    gaps = []
    cursor = lo
    for a, b in sorted(covered):
        if a > cursor:
            gaps.append((cursor, a))
        if b > cursor:
            cursor = b
    if cursor < hi:
        gaps.append((cursor, hi))
    return gaps


def segment(state: runtime.RequestState, name: str, layer: str | None, start_ns: int, end_ns: int, attrs: Any = None) -> None:
    """A segment hanging off the request root, whatever segment the calling task has open."""
    runtime.record(name, layer, start_ns, end_ns, attrs, parent_id=runtime.ROOT, state=state)
