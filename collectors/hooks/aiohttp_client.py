"""The aiohttp client hook: waits for a connection slot as `http.pool`, calls as `tool`, raw LLM API calls as `provider`/`model`.

The same model as the httpx hook (`collectors/hooks/httpx.py`): the per-call bookkeeping both
share (`_outbound.Exchange`: tool or LLM by path, SSE first-delta detection, usage, attributes)
is `collectors/hooks/_outbound.py`:

- **Where.** `ClientSession._request` (what `get`, `post`, `request` and `async with
  session.get(...)` all await) times the call from its start; it returns when the response
  headers arrived. The response's body bytes are seen as they arrive
  (`StreamReader.feed_data` of the response's content, watched only while the call is open:
  a dictionary check for every other reader), and the call ends when the body ended
  (`ClientResponse._response_eof`) or the response was released or closed before that.
- **`http.pool`.** `BaseConnector._wait_for_available_connection` is what aiohttp awaits only
  when the connector's `limit` (or `limit_per_host`) is reached: a wait of 1 ms or more is an
  `http.pool` segment, nested under the call's segment, with the limits
  (`latprof.http.pool.max_connections`, `latprof.http.pool.max_per_host`, absent when
  unlimited) and the host.
- **Network.** An LLM call's connection (DNS, TCP and TLS together, request sent, the server's
  first byte) is timed by a `TraceConfig` added to its session at the session's first LLM call
  (`collectors/hooks/_net.py`); its handlers return at once for any other call.
- **Not twice.** Inside an openai SDK call nothing but the pool wait is recorded (the SDK hook
  has the call), as in the httpx hook. Outside a request nothing is recorded.
"""

from __future__ import annotations

import functools
from typing import Any

from latprof.collectors.hooks import _net, _outbound, _scaffold, runtime
from latprof.collectors.hooks._llm import timed_call as _timed_call

from latprof import semconv
from latprof.layers import HTTP_POOL
from latprof.semconv import ERROR_TYPE, SERVER_ADDRESS

HOOK = "aiohttp_client"

#: A wait for a connection slot of at least this long is an `http.pool` segment.
MIN_WAIT_NS = 1_000_000
POOL_WAIT = "aiohttp pool wait"
HTTP_POOL_MAX_CONNECTIONS = semconv.HTTP_POOL_MAX_CONNECTIONS
HTTP_POOL_MAX_PER_HOST = semconv.HTTP_POOL_MAX_PER_HOST
_EXCHANGE_ATTR = "_latprof_exchange"  # on a ClientResponse: its call, until it ends

#: id(StreamReader) -> its call, while the response it feeds is open (bounded by open calls).
_watched: dict[int, Any] = {}


def _patch(cls: type, name: str, replacement: Any) -> None:
    functools.update_wrapper(replacement, cls.__dict__[name])
    scaffold.replace(cls, name, replacement)


# --- the call ------------------------------------------------------------------------------------


class _Url:
    """What `_outbound.Exchange` reads of a URL, from yarl's: host, port, scheme, path, and path with query."""

    __slots__ = ("host", "port", "scheme", "path", "raw_path")

    def __init__(self, url: Any) -> None:
        self.host = url.host
        self.port = url.port
        self.scheme = url.scheme
        self.path = url.path
        self.raw_path = url.raw_path_qs


class _Request:
    """What `_outbound.Exchange` reads of a request: its method, URL and (when given as bytes) body."""

    __slots__ = ("method", "url", "_content")

    def __init__(self, method: str, url: Any, content: Any) -> None:
        self.method = method
        self.url = _Url(url)
        self._content = content if isinstance(content, (bytes, bytearray)) else None


def _patch_client(module: Any) -> None:
    from yarl import URL  # aiohttp's own URL type, imported with it

    session, response = module.ClientSession, module.ClientResponse
    original_request = session._request

    async def _request(self: Any, method: str, str_or_url: Any, **kwargs: Any) -> Any:
        exchange = None
        timing = 0  # the hook's own code before the call and after it: stretches of hook code (runtime.cost_begin)
        if runtime.current_request() is not None:
            timing = runtime.cost_begin()
            try:
                url = self._build_url(str_or_url) if hasattr(self, "_build_url") else URL(str_or_url)
                exchange = _outbound.begin(_Request(str(method).upper(), url, kwargs.get("data")), HOOK)
            except Exception as exc:
                runtime.count_error(HOOK, exc)
            try:
                if (exchange.llm is not None) if exchange is not None else _timed_call.get() is not None:
                    _net.trace_aiohttp(self)  # an LLM call, raw or the SDK's: time its connection
            except Exception as exc:
                runtime.count_error(HOOK, exc)
        if exchange is None:
            runtime.cost_end(timing)
            return await original_request(self, method, str_or_url, **kwargs)
        nesting = _outbound.nest(exchange)
        runtime.cost_end(timing)
        try:
            resp = await original_request(self, method, str_or_url, **kwargs)
        except BaseException as exc:
            try:
                exchange.finish(exc)  # a stretch of its own (the unnest after it, on this path only, is not timed)
            finally:
                _outbound.unnest(nesting, HOOK)
            raise
        timing = runtime.cost_begin()
        try:
            _outbound.unnest(nesting, HOOK)
            _responded(exchange, resp)
        finally:
            runtime.cost_end(timing)
        return resp

    _patch(session, "_request", _request)

    for name in ("_response_eof", "release", "close"):
        original = response.__dict__.get(name)
        if original is not None:
            _patch(response, name, _ending(original, abandoned=name != "_response_eof"))


def _responded(exchange: Any, resp: Any) -> None:
    """Headers arrived: note the status, how to read the body, and watch the body's bytes.
    Untimed: inside the caller's stretch of hook code (so `_finish`, not `finish`)."""
    try:
        exchange.last_ns = runtime.now_ns()
        exchange.status = resp.status
        content = getattr(resp, "content", None)
        if getattr(content, "is_eof", lambda: True)() or getattr(resp, "closed", False):
            exchange.ended = True
            exchange._finish()
            return
        if exchange.llm is not None:
            exchange.prepare(resp.headers)
        resp.__dict__[_EXCHANGE_ATTR] = exchange
        _watched[id(content)] = exchange
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        exchange._finish()


def _ending(original: Any, *, abandoned: bool) -> Any:
    def ending(self: Any, *args: Any, **kwargs: Any) -> Any:
        exchange = self.__dict__.pop(_EXCHANGE_ATTR, None) if _watched else None
        if exchange is not None:
            try:
                _watched.pop(id(getattr(self, "content", None)), None)
                if not abandoned:
                    exchange.ended = True
                exchange.finish(abandoned=abandoned and not exchange.ended)
            except Exception as exc:
                runtime.count_error(HOOK, exc)
        return original(self, *args, **kwargs)

    return ending


def _patch_streams(module: Any) -> None:
    cls = module.StreamReader
    original = cls.feed_data

    def feed_data(self: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        if _watched:
            exchange = _watched.get(id(self))
            if exchange is not None:
                try:
                    exchange.seen(bytes(data))
                except Exception as exc:
                    runtime.count_error(HOOK, exc)
        return original(self, data, *args, **kwargs)

    _patch(cls, "feed_data", feed_data)


# --- the connection limit --------------------------------------------------------------------------


def _patch_connector(module: Any) -> None:
    cls = module.BaseConnector
    original = cls.__dict__["_wait_for_available_connection"]

    async def _wait_for_available_connection(self: Any, key: Any, *args: Any, **kwargs: Any) -> Any:
        if runtime.current_request() is None:
            return await original(self, key, *args, **kwargs)
        start = runtime.now_ns()
        error: BaseException | None = None
        try:
            return await original(self, key, *args, **kwargs)
        except BaseException as exc:
            error = exc
            raise
        finally:
            end = runtime.now_ns()
            if end - start >= MIN_WAIT_NS:
                try:
                    attrs: dict[str, Any] = {SERVER_ADDRESS: str(getattr(key, "host", "") or "")}
                    if getattr(self, "limit", 0):
                        attrs[HTTP_POOL_MAX_CONNECTIONS] = self.limit
                    if getattr(self, "limit_per_host", 0):
                        attrs[HTTP_POOL_MAX_PER_HOST] = self.limit_per_host
                    if error is not None:
                        attrs[ERROR_TYPE] = type(error).__qualname__
                    runtime.record(POOL_WAIT, HTTP_POOL, start, end, attrs, copy_attrs=False)
                except Exception as exc:
                    runtime.count_error(HOOK, exc)

    _patch(cls, "_wait_for_available_connection", _wait_for_available_connection)


# --- install -------------------------------------------------------------------------------------


_T = _scaffold.Target
_TESTED = [_scaffold.Tested("aiohttp", "3.14", "3.14")]  # the line the README's command installs


def _reset() -> None:
    _watched.clear()


#: What the hook patches: the calls, the body's bytes and the connection limit, each on its own.
scaffold = _scaffold.Hook(HOOK, [
    _scaffold.Library("aiohttp.client", [
        _T("aiohttp.client", "ClientSession", "_request", True),
        _T("aiohttp.client", "ClientResponse", "_response_eof"),
    ], _patch_client, _TESTED),
    _scaffold.Library("aiohttp.connector",
                      [_T("aiohttp.connector", "BaseConnector", "_wait_for_available_connection", True)],
                      _patch_connector, _TESTED),
    _scaffold.Library("aiohttp.streams", [_T("aiohttp.streams", "StreamReader", "feed_data")], _patch_streams, _TESTED),
], _reset)  # fmt: skip
#: Patch aiohttp's client when (if ever) the service imports it; idempotent.
install = scaffold.install
#: Restore the originals (tests).
uninstall = scaffold.uninstall


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""
    return scaffold.late_coverage(
        lambda: f"{scaffold.loaded('the aiohttp client')}: sessions and connectors made before the injection are seen from"
        " their next request; responses already being read when it came are not"
    )
