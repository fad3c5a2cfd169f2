"""The httpx / httpx2 hook: outbound HTTP pool waits as `http.pool`, calls as `tool`, raw LLM API calls as `provider`/`model`.

Both module families are hooked, each when (or if already) imported: `httpx` on `httpcore`,
and `httpx2` on `httpcore2` (what the openai 3.x client runs on). Inside a request:

- `http.pool`, "httpx pool wait" ("httpx2 pool wait"): a request that found no free connection
  slot in its client's pool and waited 1 ms or more for one (`MIN_WAIT_NS`). httpcore has no
  event for this wait (its trace extension starts after it): it is the time spent in
  `PoolRequest.wait_for_connection` when the pool had not assigned a connection before the
  call. A request served at once never enters the wait and gets no segment; a shorter wait
  (a connection handed over just as it began waiting) is left out too. Attributes: the pool's
  limits (`latprof.http.pool.max_connections`, `latprof.http.pool.max_keepalive_connections`,
  absent when unlimited), its name ("httpx pool 1", numbered per process in the order pools
  are first seen), `server.address` / `server.port` of the waiting request, `error.type` when
  the wait ended in an error (a `PoolTimeout`, a cancellation). The pool gauges `http.pool.in_use`
  (connections busy), `http.pool.max` (`max_connections`, when limited) and `http.pool.waiters`
  (requests queued for a connection) are read when a request enters the pool, at most every
  100 ms per pool and only when they changed, and at once when a request starts to wait with
  more waiters than the last reading said (so the peak is seen).
- `tool`, "HTTP GET host": every outbound request that is not an LLM API call, from `send`
  until its response is closed (for a streamed response, when the caller has read or closed
  it). Attributes: `http.request.method`, `server.address`, `server.port`,
  `http.response.status_code`, and `error.type` (the exception's class, or the status code
  for a 4xx/5xx answer). Never the URL's path or query string: paths carry ids and
  sometimes secrets, and the hook has no route template to reduce them to; the host names
  the service, which is what a tool segment needs.
- `provider` then `model`: a request whose path ends with an LLM API path (`LLM_PATHS`:
  OpenAI-style `/chat/completions`, `/completions`, `/responses`, `/embeddings`, also under
  Azure's `/openai/deployments/{name}/...`, and Anthropic-style `/v1/messages`; the
  environment variable `LATPROF_LLM_PATHS` replaces the list, or with a leading `+` adds to
  it) made without an LLM SDK. A server-sent-events answer is `provider` until the first
  event with a non-empty delta (a chat chunk's `choices[].delta` content, tool calls,
  refusal or reasoning; a legacy completion's `text`; a Responses `*.delta` event; an
  Anthropic `content_block_delta`) or the end of the stream, then `model` until the stream
  ends, with `latprof.ttft_known: true`, `latprof.llm_call_id` and `latprof.output_chunks`;
  any other answer is one `provider` segment with `latprof.ttft_known: false`. Model and
  token counts come from what the caller read: the events, or a JSON body of at most
  `MAX_BODY_BYTES` read to its end; a body the caller did not read is never read.
- inside an openai SDK call (the openai hook's `create`, during which the SDK sends its HTTP
  request, streamed or not): only the `http.pool` wait, nested under the SDK's `provider`
  segment. The SDK hook has the call's time; counting its HTTP request again would count it
  twice (docs/design.md, "Counted once").

Patch points, each wrapped once and only on the class that defines it (`uninstall()` restores):

- `Client.send` / `AsyncClient.send` (public; `get`, `post`, `request`, `stream` all go through
  it): times the call. For a response not yet read (`stream=True`, and LLM calls, which are
  sent with `stream=True` and then read exactly as `send(stream=False)` would) the
  response's `stream` is replaced by a pass-through subclass of the library's
  `SyncByteStream` / `AsyncByteStream` that sees each raw chunk as the caller reads it and
  ends the segments when the response is closed; every other attribute (httpx2's
  `elapsed`) is forwarded. Nothing is sent, read or changed on the service's behalf.
- `ConnectionPool.handle_request` / `AsyncConnectionPool.handle_async_request` (httpcore's
  `_sync` / `_async` `connection_pool`): inside a request, notes which pool the request is in
  (an attribute on httpcore's request object, which its `PoolRequest` holds), for the wait, and
  reads the gauges when due.
- `PoolRequest.wait_for_connection` / `AsyncPoolRequest.wait_for_connection`: the wait itself
  (a request that already has its connection costs an attribute read).

Outside a request nothing is recorded (not even gauges) and each patched call costs a
context-variable read. Every error of the hook is counted, never raised into the service.
The call model (tool or LLM call, the bytes read, first token, usage) is `_outbound.py` and
`_llm.py`, shared with the aiohttp_client and openai hooks; this module patches httpx.
"""

from __future__ import annotations

import importlib
import itertools
import os
import sys
import time
from typing import Any, Callable, Iterator

from latprof.collectors.hooks import _net, _scaffold, runtime
from latprof.collectors.hooks._llm import in_sdk_call as _in_sdk_call
from latprof.collectors.hooks._llm import timed_call as _timed_call
from latprof.collectors.hooks._outbound import (  # the call model, shared with the aiohttp_client hook
    DEFAULT_LLM_PATHS,
    ENV_LLM_PATHS,
    MAX_BODY_BYTES,
    MAX_EVENT_BYTES,
    Exchange,
    configure_llm_paths,
    llm_path,
    llm_paths_from,
)
from latprof.collectors.hooks._outbound import plain_call as _plain_call
from latprof.collectors.hooks._outbound import plain_done as _plain_done
from latprof.layers import HTTP_POOL
from latprof.semconv import (
    ERROR_TYPE,
    GAUGE_HTTP_POOL_IN_USE,
    GAUGE_HTTP_POOL_MAX,
    GAUGE_HTTP_POOL_WAITERS,
    HTTP_POOL_MAX_CONNECTIONS,
    HTTP_POOL_MAX_KEEPALIVE,
    HTTP_POOL_NAME,
    SERVER_ADDRESS,
    SERVER_PORT,
)

__all__ = [
    "DEFAULT_LLM_PATHS", "ENV_LLM_PATHS", "FAMILIES", "HOOK", "MAX_BODY_BYTES", "MAX_EVENT_BYTES", "MIN_WAIT_NS",
    "configure_llm_paths", "install", "llm_path", "llm_paths_from", "scaffold", "uninstall",
]  # fmt: skip

HOOK = "httpx"

#: A request that waited at least this long for a connection slot gets an `http.pool` segment.
MIN_WAIT_NS = 1_000_000
#: At most one reading of a pool's gauges per this interval, unless a wait saw more waiters.
GAUGE_INTERVAL_NS = 100_000_000

_now = time.time_ns
_monotonic = time.monotonic_ns
_STATE_ATTR = "_latprof_http_pool"  # on a pool instance: its _PoolState

_pool_numbers = itertools.count(1)
#: On an httpcore `Request` sent inside a request: the pool its `handle_request` is sending it
#: through (the `PoolRequest` that waits holds the same request object).
_POOL_ATTR = "_latprof_pool"
_request_var = runtime._request  # runtime.current_request() without the call
_parent_var = runtime._parent  # runtime.current_parent(), and nesting without a context manager


class _Family:
    """One module family: `httpx` on `httpcore`, or `httpx2` on `httpcore2`."""

    __slots__ = ("client", "core", "sync_watch", "async_watch")

    def __init__(self, client: str, core: str) -> None:
        self.client = client
        self.core = core
        self.sync_watch: Any = None  # stream classes, made from the library's bases when it is imported
        self.async_watch: Any = None


FAMILIES = (_Family("httpx", "httpcore"), _Family("httpx2", "httpcore2"))


# --- install -----------------------------------------------------------------------------------


def install() -> bool:
    """Patch httpx/httpcore and httpx2/httpcore2 when (or if already) imported; idempotent."""
    if not scaffold.installed:
        try:
            configure_llm_paths(llm_paths_from(os.environ.get(ENV_LLM_PATHS)))
        except Exception as exc:
            runtime.count_error(HOOK, exc)
    return scaffold.install()


def uninstall() -> None:
    """Put every patched attribute back (tests); requests and streams in flight still finish."""
    scaffold.uninstall()


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""
    return scaffold.late_coverage(
        lambda: f"{scaffold.loaded('httpx')}: clients and pools made before the injection are seen from their next request"
        " (pools numbered in the order they are first seen after it); requests and streams already under way are not"
    )


def _core_patcher(family: _Family) -> Callable[[Any], None]:
    def patch_core(module: Any) -> None:
        sync = importlib.import_module(f"{family.core}._sync.connection_pool")
        asynchronous = importlib.import_module(f"{family.core}._async.connection_pool")
        scaffold.wrap(sync.ConnectionPool, "handle_request", lambda original: _sync_handle_request(original, family))
        scaffold.wrap(sync.PoolRequest, "wait_for_connection", lambda original: _sync_wait_for_connection(original, family))
        scaffold.wrap(asynchronous.AsyncConnectionPool, "handle_async_request", lambda original: _async_handle_request(original, family))
        scaffold.wrap(asynchronous.AsyncPoolRequest, "wait_for_connection", lambda original: _async_wait_for_connection(original, family))

    return patch_core


def _client_patcher(family: _Family) -> Callable[[Any], None]:
    def patch_client(module: Any) -> None:
        if family.sync_watch is None:
            family.sync_watch, family.async_watch = _stream_classes(module.SyncByteStream, module.AsyncByteStream)
        scaffold.wrap(module.Client, "send", lambda original: _sync_send(original, family))
        scaffold.wrap(module.AsyncClient, "send", lambda original: _async_send(original, family))

    return patch_client


def _libraries() -> list[_scaffold.Library]:
    """Each family's core and client, patched (or off) each on its own, in the lines they are tested on."""
    T = _scaffold.Target
    out = []
    # (oldest, newest) tested line of each family's core and client
    for family, core_lines, client_lines in zip(FAMILIES, (("1.0", "1.0"), ("2.16", "2.16")), (("0.28", "0.29"), ("2.16", "2.16"))):
        sync, asynchronous = f"{family.core}._sync.connection_pool", f"{family.core}._async.connection_pool"
        out.append(_scaffold.Library(family.core, [
            T(sync, "ConnectionPool", "handle_request", False),
            T(sync, "PoolRequest", "wait_for_connection", False),
            T(asynchronous, "AsyncConnectionPool", "handle_async_request", True),
            T(asynchronous, "AsyncPoolRequest", "wait_for_connection", True),
        ], _core_patcher(family), [_scaffold.Tested(family.core, *core_lines)]))  # fmt: skip
        out.append(_scaffold.Library(family.client, [
            T(family.client, "Client", "send", False),
            T(family.client, "AsyncClient", "send", True),
        ], _client_patcher(family), [_scaffold.Tested(family.client, *client_lines)]))  # fmt: skip
    return out


#: What the hook patches.
scaffold = _scaffold.Hook(HOOK, _libraries())


# --- pools: waits and gauges -------------------------------------------------------------------


class _PoolState:
    """What the hook keeps per pool: its name, attributes ready to use, the gauge limiter."""

    __slots__ = ("name", "segment_name", "gauge_attrs", "wait_attrs", "max_connections", "gauged_at_ns", "gauged")

    def __init__(self, pool: Any, family: _Family) -> None:
        self.name = f"{family.client} pool {next(_pool_numbers)}"
        self.segment_name = f"{family.client} pool wait"
        self.gauge_attrs = {HTTP_POOL_NAME: self.name}
        self.wait_attrs: dict[str, Any] = {HTTP_POOL_NAME: self.name}
        most = getattr(pool, "_max_connections", None)
        keepalive = getattr(pool, "_max_keepalive_connections", None)
        self.max_connections = most if isinstance(most, int) and most < sys.maxsize else None
        if self.max_connections is not None:
            self.wait_attrs[HTTP_POOL_MAX_CONNECTIONS] = self.max_connections
        if isinstance(keepalive, int) and keepalive < sys.maxsize:
            self.wait_attrs[HTTP_POOL_MAX_KEEPALIVE] = keepalive
        self.gauged_at_ns = -GAUGE_INTERVAL_NS  # monotonic time of the last reading
        self.gauged: tuple[int, int] = (-1, -1)  # (in use, waiters) last emitted


def _pool_state(pool: Any, family: _Family) -> _PoolState:
    state: _PoolState | None = pool.__dict__.get(_STATE_ATTR)
    if state is None:
        state = pool.__dict__.setdefault(_STATE_ATTR, _PoolState(pool, family))
    return state


def _read_gauges(pool: Any, state: _PoolState, *, waiting: bool) -> None:
    """Emit the pool's gauges when they changed and the last reading is 100 ms old, or when a
    request starts to wait (`waiting`) with more waiters than the last reading said."""
    now = _monotonic()
    due = now - state.gauged_at_ns >= GAUGE_INTERVAL_NS
    if not (due or waiting):
        return
    waiters = sum(1 for r in list(pool._requests) if r.connection is None)
    if not (due or waiters > state.gauged[1]):
        return
    in_use = sum(1 for c in list(pool._connections) if not c.is_idle())
    state.gauged_at_ns = now  # a reading, emitted or not
    values = (in_use, waiters)
    if values == state.gauged:
        return
    state.gauged = values
    attrs = state.gauge_attrs
    if state.max_connections is not None:
        runtime.gauge(GAUGE_HTTP_POOL_MAX, state.max_connections, attrs)
    runtime.gauge(GAUGE_HTTP_POOL_IN_USE, in_use, attrs)
    runtime.gauge(GAUGE_HTTP_POOL_WAITERS, waiters, attrs)


def _entered(pool: Any, request: Any, family: _Family) -> None:
    """A request entered `pool` inside a request: note the pool on it (for its wait), maybe read the gauges.
    A stretch of hook code."""
    timing = runtime.cost_begin()
    try:
        request._latprof_pool = pool  # _POOL_ATTR: the same object the pool's PoolRequest waits with
        state: _PoolState | None = pool.__dict__.get(_STATE_ATTR)
        if state is None:
            state = _pool_state(pool, family)
        if _monotonic() - state.gauged_at_ns >= GAUGE_INTERVAL_NS:
            _read_gauges(pool, state, waiting=False)
        call = _timed_call.get()
        if call is not None:  # an LLM call's attempt: time its connection (async pools only come here)
            _net.trace_httpcore(request, call, True)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    finally:
        runtime.cost_end(timing)


def _sync_handle_request(original: Callable[..., Any], family: _Family) -> Callable[..., Any]:
    def handle_request(self: Any, request: Any) -> Any:
        if _request_var.get() is not None and runtime._writer is not None:
            timing = runtime.cost_begin()
            try:  # _entered, inlined
                request._latprof_pool = self
                state = self.__dict__.get(_STATE_ATTR)
                if state is None or _monotonic() - state.gauged_at_ns >= GAUGE_INTERVAL_NS:
                    _read_gauges(self, state or _pool_state(self, family), waiting=False)
                call = _timed_call.get()
                if call is not None:
                    _net.trace_httpcore(request, call, False)
            except Exception as exc:
                runtime.count_error(HOOK, exc)
            finally:
                runtime.cost_end(timing)
        return original(self, request)

    return handle_request


def _async_handle_request(original: Callable[..., Any], family: _Family) -> Callable[..., Any]:
    async def handle_async_request(self: Any, request: Any) -> Any:
        if _request_var.get() is not None and runtime._writer is not None:
            _entered(self, request, family)
        return await original(self, request)

    return handle_async_request


class _Wait:
    __slots__ = ("start_ns", "state", "request", "parent_id", "attrs")

    def __init__(self, pool_request: Any, pool: Any, family: _Family) -> None:
        self.start_ns = _now()
        self.request = runtime.current_request()
        self.parent_id = runtime.current_parent()  # the tool/provider segment of this call, or the SDK's
        self.state = _pool_state(pool, family)
        origin = pool_request.request.url.origin
        self.attrs = dict(self.state.wait_attrs)
        self.attrs[SERVER_ADDRESS] = origin.host.decode("ascii", "replace")
        self.attrs[SERVER_PORT] = origin.port
        try:
            _read_gauges(pool, self.state, waiting=True)  # it counts itself among the waiters
        except Exception as exc:
            runtime.count_error(HOOK, exc)

    def end(self, error: BaseException | None) -> None:
        end = _now()
        if self.request is None or (error is None and end - self.start_ns < MIN_WAIT_NS):
            return
        attrs = self.attrs
        if error is not None:
            attrs[ERROR_TYPE] = type(error).__qualname__
        runtime.record(self.state.segment_name, HTTP_POOL, self.start_ns, end, attrs, parent_id=self.parent_id or runtime.ROOT, state=self.request)


def _begin_wait(pool_request: Any, family: _Family) -> _Wait | None:
    """A request of a pool starting to wait for a connection (`pool_request.connection` is None)."""
    try:
        pool = getattr(pool_request.request, _POOL_ATTR, None)  # set by handle_request inside a request
        if pool is None or _request_var.get() is None:  # outside a request
            return None
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None
    timing = runtime.cost_begin()
    try:
        return _Wait(pool_request, pool, family)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    finally:
        runtime.cost_end(timing)
    return None


def _end_wait(wait: _Wait, error: BaseException | None) -> None:
    timing = runtime.cost_begin()
    try:
        wait.end(error)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    finally:
        runtime.cost_end(timing)


def _sync_wait_for_connection(original: Callable[..., Any], family: _Family) -> Callable[..., Any]:
    def wait_for_connection(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.connection is not None:  # served at once: no wait
            return original(self, *args, **kwargs)
        wait = _begin_wait(self, family)
        if wait is None:
            return original(self, *args, **kwargs)
        try:
            connection = original(self, *args, **kwargs)
        except BaseException as exc:
            _end_wait(wait, exc)
            raise
        _end_wait(wait, None)
        return connection

    return wait_for_connection


def _async_wait_for_connection(original: Callable[..., Any], family: _Family) -> Callable[..., Any]:
    async def wait_for_connection(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.connection is not None:
            return await original(self, *args, **kwargs)
        wait = _begin_wait(self, family)
        if wait is None:
            return await original(self, *args, **kwargs)
        try:
            connection = await original(self, *args, **kwargs)
        except BaseException as exc:
            _end_wait(wait, exc)
            raise
        _end_wait(wait, None)
        return connection

    return wait_for_connection


@runtime.stretch
def _plain_ended(state: Any, plain: Any, start: int, request: Any, token: Any, response: Any,
                 error: BaseException | None, watch: Any) -> None:  # fmt: skip
    """A call without an Exchange ended: the caller's parent put back, the call recorded (`_outbound.plain_done`)."""
    try:
        _parent_var.reset(token)
    except ValueError:  # left from another context
        pass
    _plain_done(state, plain, start, request, response, error, watch, HOOK)


def _sync_send(original: Callable[..., Any], family: _Family) -> Callable[..., Any]:
    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        state = _request_var.get()  # _outbound.begin, inlined
        if state is None or runtime._writer is None or _in_sdk_call.get():
            return original(self, request, *args, **kwargs)
        # The hook's own code before the call and after it: stretches of hook code (runtime.cost_begin).
        timing = runtime.cost_begin()
        try:
            plain = _plain_call(state, request, kwargs)
            exchange = Exchange(state, request, HOOK) if plain is None else None
        except Exception as exc:
            runtime.count_error(HOOK, exc)
            runtime.cost_end(timing)
            return original(self, request, *args, **kwargs)
        if plain is not None:  # the usual call, without an Exchange
            start = _now()
            token = _parent_var.set(plain[3])  # the pool wait of this call is its child
            runtime.cost_end(timing)
            try:
                response = original(self, request, *args, **kwargs)
            except BaseException as exc:
                _plain_ended(state, plain, start, request, token, None, exc, None)
                raise
            _plain_ended(state, plain, start, request, token, response, None, family.sync_watch)
            return response
        assert exchange is not None
        read_here = exchange.llm is not None and not kwargs.get("stream", False)
        sent_kwargs = {**kwargs, "stream": True} if read_here else kwargs
        token = _parent_var.set(exchange.segment_id)  # _outbound.nest: the pool wait of this call is its child
        timed = _timed_call.set(exchange if exchange.llm is not None else None)  # an LLM call's connection is timed
        runtime.cost_end(timing)
        try:
            response = original(self, request, *args, **sent_kwargs)
        except BaseException as exc:
            timing = runtime.cost_begin()
            try:
                exchange._finish(exc)
            finally:
                try:  # _outbound.unnest
                    _parent_var.reset(token)
                    _timed_call.reset(timed)
                except ValueError:  # left from another context
                    pass
                runtime.cost_end(timing)
            raise
        timing = runtime.cost_begin()
        try:
            try:  # _outbound.unnest
                _parent_var.reset(token)
                _timed_call.reset(timed)
            except ValueError:  # left from another context
                pass
            exchange.responded(response, family.sync_watch)
        finally:
            runtime.cost_end(timing)
        if read_here:  # what send(stream=False) does, now that the stream is watched
            try:
                response.read()
            except BaseException as exc:
                response.close()
                exchange.finish(exc)  # a stretch of its own
                raise
        return response

    return send


def _async_send(original: Callable[..., Any], family: _Family) -> Callable[..., Any]:
    async def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        state = _request_var.get()  # _outbound.begin, inlined
        if state is None or runtime._writer is None or _in_sdk_call.get():
            return await original(self, request, *args, **kwargs)
        # The hook's own code before the call and after it: stretches of hook code (runtime.cost_begin).
        timing = runtime.cost_begin()
        try:
            plain = _plain_call(state, request, kwargs)
            exchange = Exchange(state, request, HOOK) if plain is None else None
        except Exception as exc:
            runtime.count_error(HOOK, exc)
            runtime.cost_end(timing)
            return await original(self, request, *args, **kwargs)
        if plain is not None:  # the usual call, without an Exchange
            start = _now()
            token = _parent_var.set(plain[3])
            runtime.cost_end(timing)
            try:
                response = await original(self, request, *args, **kwargs)
            except BaseException as exc:
                _plain_ended(state, plain, start, request, token, None, exc, None)
                raise
            _plain_ended(state, plain, start, request, token, response, None, family.async_watch)
            return response
        assert exchange is not None
        read_here = exchange.llm is not None and not kwargs.get("stream", False)
        sent_kwargs = {**kwargs, "stream": True} if read_here else kwargs
        token = _parent_var.set(exchange.segment_id)  # _outbound.nest: the pool wait of this call is its child
        timed = _timed_call.set(exchange if exchange.llm is not None else None)  # an LLM call's connection is timed
        runtime.cost_end(timing)
        try:
            response = await original(self, request, *args, **sent_kwargs)
        except BaseException as exc:
            timing = runtime.cost_begin()
            try:
                exchange._finish(exc)
            finally:
                try:  # _outbound.unnest
                    _parent_var.reset(token)
                    _timed_call.reset(timed)
                except ValueError:  # left from another context
                    pass
                runtime.cost_end(timing)
            raise
        timing = runtime.cost_begin()
        try:
            try:  # _outbound.unnest
                _parent_var.reset(token)
                _timed_call.reset(timed)
            except ValueError:  # left from another context
                pass
            exchange.responded(response, family.async_watch)
        finally:
            runtime.cost_end(timing)
        if read_here:
            try:
                await response.aread()
            except BaseException as exc:
                await response.aclose()
                exchange.finish(exc)  # a stretch of its own
                raise
        return response

    return send


# --- response streams --------------------------------------------------------------------------


def _stream_classes(sync_base: type, async_base: type) -> tuple[type, type]:
    """Pass-through response streams, subclasses of the library's own (httpx checks `isinstance`)."""

    class WatchedStream(sync_base):  # type: ignore[misc]
        """Yields what the response's stream yields and tells the call; ends it when closed."""

        def __init__(self, inner: Any, exchange: Exchange) -> None:
            self._latprof_inner = inner
            self._latprof_exchange = exchange

        def __iter__(self) -> Iterator[bytes]:
            exchange = self._latprof_exchange
            chunks = iter(self._latprof_inner)
            try:
                while True:
                    try:
                        chunk = next(chunks)
                    except StopIteration:
                        exchange.ended = True
                        exchange.last_ns = _now()
                        return
                    except BaseException as exc:
                        exchange.failed(exc)
                        raise
                    exchange.seen(chunk)
                    yield chunk
            finally:
                close = getattr(chunks, "close", None)  # what `yield from` would do when closed early
                if close is not None:
                    close()

        def close(self) -> None:
            try:
                self._latprof_inner.close()
            except BaseException as exc:
                self._latprof_exchange.finish(exc)
                raise
            self._latprof_exchange.finish()

        def __getattr__(self, name: str) -> Any:  # httpx2's `elapsed`, and anything else of the original
            if name.startswith("_latprof_"):
                raise AttributeError(name)
            return getattr(self._latprof_inner, name)

        def __del__(self) -> None:  # dropped without being closed
            try:
                self._latprof_exchange.finish(abandoned=True, collected=True)
            except Exception:
                pass

    class AsyncWatchedStream(async_base):  # type: ignore[misc]
        """`WatchedStream` for an AsyncClient's response."""

        def __init__(self, inner: Any, exchange: Exchange) -> None:
            self._latprof_inner = inner
            self._latprof_exchange = exchange

        async def __aiter__(self) -> Any:
            exchange = self._latprof_exchange
            chunks = self._latprof_inner.__aiter__()
            try:
                while True:
                    try:
                        chunk = await chunks.__anext__()
                    except StopAsyncIteration:
                        exchange.ended = True
                        exchange.last_ns = _now()
                        return
                    except BaseException as exc:
                        exchange.failed(exc)
                        raise
                    exchange.seen(chunk)
                    yield chunk
            finally:
                aclose = getattr(chunks, "aclose", None)
                if aclose is not None:
                    await aclose()

        async def aclose(self) -> None:
            try:
                await self._latprof_inner.aclose()
            except BaseException as exc:
                self._latprof_exchange.finish(exc)
                raise
            self._latprof_exchange.finish()

        def __getattr__(self, name: str) -> Any:
            if name.startswith("_latprof_"):
                raise AttributeError(name)
            return getattr(self._latprof_inner, name)

        def __del__(self) -> None:
            try:
                self._latprof_exchange.finish(abandoned=True, collected=True)
            except Exception:
                pass

    return WatchedStream, AsyncWatchedStream
