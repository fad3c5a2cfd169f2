"""Inbound HTTP requests of `aiohttp.web` servers: request roots with their route, backdated to arrival.

The same request model as the ASGI hook (`collectors/hooks/_async_request.py`, which both use):

- **Where it hooks.** `aiohttp.web_protocol.RequestHandler._handle_request`, the coroutine
  that runs one request on the connection's handler task: it calls the application's handler
  (middlewares included) and writes the response (`finish_response`, up to `write_eof`).
  Its coroutine runs inside the shared request proxy (`RequestCoroutine`), which opens the request on its
  first step, times each step for the event-loop attribution (`asyncio_loop`), and closes it
  when the coroutine returns, that is once the response is written. Tasks the handler spawns
  are timed through the loop's task factory, as under uvicorn.
- **Which requests.** Up to `latprof run --max-rate` a second per process, then a weighted
  random sample (`runtime.Sampler`); a request outside it runs untouched.
- **Start.** As the ASGI hook: TCP_INFO on the connection's socket (`tcpi_last_data_recv`),
  read only while the loop is late by a kernel tick or more; `X-Request-Start` earlier
  still (`queue`, source `header`). From arrival to the handler's first step the request
  waited for the loop (or behind earlier requests pipelined on its connection):
  `event_loop`, from 1 ms on.
- **Route** is the method and the matched resource's canonical path (`GET /chat/{id}`), never
  the raw path; `<unmatched>` when the router matched nothing (404, 405).
- **Status** is that of the response `_handle_request` returns (500 for a handler that raised).
- **Installed late**: aiohttp looks `_handle_request` up for each request, so every request
  that starts after the injection is seen, backdated to its arrival; those already running
  are left out. Uninstall also closes the loop monitors (`asyncio_loop.stop_monitors`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from latprof.collectors.hooks import _async_request, _inbound, _scaffold, asyncio_loop, runtime
from latprof.collectors.hooks._async_request import Request, RequestCoroutine
from latprof.semconv import NOTE_WARNING

HOOK = "aiohttp_web"

def _patch(module: Any) -> None:
    cls = module.RequestHandler
    original = cls.__dict__["_handle_request"]
    _async_request.load()  # binds get_running_loop and the TCP_INFO constants

    def _handle_request(self: Any, request: Any, start_time: Any, request_handler: Any) -> Any:
        coro = original(self, request, start_time, request_handler)
        return _async_request.track_if_sampled(HOOK, coro, _track, self, request)

    functools.update_wrapper(_handle_request, original)
    scaffold.replace(cls, "_handle_request", _handle_request)


#: What the hook patches, in the aiohttp line the README's command installs.
scaffold = _scaffold.Hook(HOOK, [
    _scaffold.Library("aiohttp.web_protocol",
                      [_scaffold.Target("aiohttp.web_protocol", "RequestHandler", "_handle_request", True)],
                      _patch, [_scaffold.Tested("aiohttp", "3.14", "3.14")]),
], asyncio_loop.stop_monitors)  # fmt: skip
#: Patch aiohttp's request handler when (if ever) the service imports it; idempotent.
install = scaffold.install
#: Restore the original method and close the loop monitors.
uninstall = scaffold.uninstall


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""
    return scaffold.late_coverage(
        lambda: ("aiohttp.web is loaded" if scaffold.imported() else "aiohttp.web is not imported in this process")
        + ": every request its handlers start after the injection is recorded from its arrival at the socket,"
        " requests already running are left out"
    )


def _track(handler: Any, web_request: Any, coro: Any, weight: int) -> Any:
    if (monitor := _async_request.loop_monitor()) is None:
        return coro
    read_ns = runtime.now_ns()
    arrival_ns = _arrival(getattr(handler, "transport", None), read_ns, monitor)
    reference_ns = arrival_ns if arrival_ns is not None else read_ns
    header_ns = _inbound.header_start(web_request.headers.get("X-Request-Start"), reference_ns, HOOK)
    request = Request(HOOK, _no_route, None, monitor, read_ns, arrival_ns, header_ns, weight)
    monitor.request_started()
    return _HandlerCoroutine(coro, request, monitor, web_request)


def _arrival(transport: Any, now_ns: int, monitor: asyncio_loop.LoopMonitor) -> int | None:
    """When the connection last received data, from TCP_INFO, while the loop is late (as the ASGI hook)."""
    if transport is None or not monitor.lagging(_inbound.TICK_NS):
        return None
    sock = transport.get_extra_info("socket")
    if not _inbound.has_tcp_info(sock):
        _inbound.note_once(
            HOOK,
            NOTE_WARNING,
            "aiohttp_web: no TCP_INFO on the server's socket (unix socket or not Linux): requests start when the"
            " server read them, time their bytes waited in the socket before that is not seen",
        )
        return None
    return _inbound.last_data_arrival(sock, now_ns)


class _HandlerCoroutine(RequestCoroutine):
    """`_handle_request`'s coroutine: notes the route and the status when it returns, then ends the request."""

    __slots__ = ("_web_request",)

    def __init__(self, coro: Any, request: Request, monitor: asyncio_loop.LoopMonitor, web_request: Any) -> None:
        super().__init__(coro, request, monitor)
        self._web_request = web_request

    def send(self, value: Any) -> Any:
        return self._step(self._observed(self._coro.send), value)

    def throw(self, *args: Any) -> Any:
        return self._step(self._observed(self._coro.throw), *args)

    def _observed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any) -> Any:
            try:
                return method(*args)
            except StopIteration as done:
                self._returned(done.value)
                raise
            except BaseException:
                self._returned(None)
                raise

        return step

    def _returned(self, value: Any) -> None:
        """The request's coroutine is over: its status and route, for `_async_request.finish`."""
        request: Request = self._owner
        try:
            response = value[0] if isinstance(value, tuple) and value else None
            status = getattr(response, "status", None)
            request.status = status if isinstance(status, int) else (request.status or 500)
            request.route = route_of(self._web_request)
            request.response_end_ns = runtime.now_ns()
            request.done = True
        except Exception as exc:
            runtime.count_error(HOOK, exc)
        finally:
            self._web_request = None


def _no_route(_scope: Any) -> str:
    """The route of a request `_returned` could not name (it sets the real one)."""
    return "<no route>"


def route_of(web_request: Any) -> str:
    """`METHOD /canonical/{path}` of the resource the router matched; `<unmatched>` when none did."""
    method = getattr(web_request, "method", None) or "GET"
    match_info = getattr(web_request, "_match_info", None)
    if match_info is None or getattr(match_info, "http_exception", None) is not None:
        return f"{method} <unmatched>"
    resource = getattr(getattr(match_info, "route", None), "resource", None)
    canonical = getattr(resource, "canonical", None)
    return f"{method} {canonical}" if isinstance(canonical, str) and canonical else f"{method} <no route>"
