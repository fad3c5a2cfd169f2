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
"""

from __future__ import annotations

import importlib
import itertools
import os
import sys
import time
import zlib
from typing import Any, Callable, Iterator

from latprof.collectors.hooks import _tools, runtime
from latprof.collectors.hooks.openai import _RESPONSE_SNAPSHOTS, _loads, _usage_counts
from latprof.collectors.hooks.openai import _in_call as _in_sdk_call

from latprof.layers import HTTP_POOL, MODEL, PROVIDER, TOOL
from latprof.semconv import (
    ERROR_TYPE,
    GAUGE_HTTP_POOL_IN_USE,
    GAUGE_HTTP_POOL_MAX,
    GAUGE_HTTP_POOL_WAITERS,
    GEN_AI_INPUT_TOKENS,
    GEN_AI_OPERATION_NAME,
    GEN_AI_OUTPUT_TOKENS,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_RESPONSE_MODEL,
    HTTP_POOL_MAX_CONNECTIONS,
    HTTP_POOL_MAX_KEEPALIVE,
    HTTP_POOL_NAME,
    HTTP_REQUEST_METHOD,
    HTTP_STATUS_CODE,
    LLM_CALL_ID,
    OUTPUT_CHUNKS,
    SERVER_ADDRESS,
    SERVER_PORT,
    TOOL_DEPENDS_ON,
    TTFT_KNOWN,
)

HOOK = "httpx"

#: A request that waited at least this long for a connection slot gets an `http.pool` segment.
MIN_WAIT_NS = 1_000_000
#: At most one reading of a pool's gauges per this interval, unless a wait saw more waiters.
GAUGE_INTERVAL_NS = 100_000_000
#: A JSON answer of an LLM call longer than this is not kept to read its usage.
MAX_BODY_BYTES = 1 << 20
#: A server-sent event longer than this is skipped (its bytes are not kept).
MAX_EVENT_BYTES = 1 << 20

ENV_LLM_PATHS = "LATPROF_LLM_PATHS"
#: Path suffixes of LLM API calls, with their GenAI operation name; first match wins.
DEFAULT_LLM_PATHS: tuple[str, ...] = ("/chat/completions", "/completions", "/responses", "/embeddings", "/v1/messages")
_OPERATIONS = {
    "/chat/completions": "chat",
    "/completions": "text_completion",
    "/responses": "chat",
    "/embeddings": "embeddings",
    "/v1/messages": "chat",
}
#: The suffixes in use (`configure_llm_paths`, `$LATPROF_LLM_PATHS`).
LLM_PATHS: tuple[str, ...] = DEFAULT_LLM_PATHS

#: Delta fields of a chat chunk that carry output (vLLM and DeepSeek stream reasoning in the last two).
_DELTA_FIELDS = ("content", "tool_calls", "refusal", "function_call", "reasoning_content", "reasoning")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}

_now = time.time_ns
_monotonic = time.monotonic_ns
_MARK = "__latprof_httpx__"
_STATE_ATTR = "_latprof_http_pool"  # on a pool instance: its _PoolState

_installed = False
_patches = runtime.Patches(_MARK)  # what install() replaced, for uninstall()
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
    global _installed
    if _installed:
        return True
    _installed = True
    try:
        configure_llm_paths(llm_paths_from(os.environ.get(ENV_LLM_PATHS)))
    except Exception as exc:
        runtime.count_error(HOOK, exc)
    for family in FAMILIES:
        for module_name, patch in ((family.core, _core_patcher(family)), (family.client, _client_patcher(family))):
            try:
                runtime.when_imported(module_name, patch)
            except Exception as exc:
                runtime.count_error(HOOK, exc)
    return True


def uninstall() -> None:
    """Put every patched attribute back (tests); requests and streams in flight still finish."""
    global _installed
    _installed = False
    _patches.restore()


def llm_paths_from(value: str | None) -> tuple[str, ...]:
    """The LLM path suffixes `$LATPROF_LLM_PATHS` asks for: comma-separated, replacing the
    defaults, or adding to them when the value starts with `+`; the defaults when unset."""
    if value is None or not value.strip():
        return DEFAULT_LLM_PATHS
    value = value.strip()
    add = value.startswith("+")
    paths = []
    for item in value.lstrip("+").split(","):
        item = item.strip().rstrip("/")
        if item:
            paths.append(item if item.startswith("/") else "/" + item)
    return tuple(dict.fromkeys((*DEFAULT_LLM_PATHS, *paths) if add else paths))


def configure_llm_paths(paths: tuple[str, ...]) -> None:
    """Treat requests whose path ends with one of `paths` as LLM calls."""
    global LLM_PATHS
    LLM_PATHS = tuple(paths)


def llm_path(path: str) -> str | None:
    """The LLM path suffix `path` ends with, or None (not an LLM API call)."""
    path = path.rstrip("/")
    if not path.endswith(LLM_PATHS):
        return None
    for suffix in LLM_PATHS:
        if path.endswith(suffix):
            return suffix
    return None



def _core_patcher(family: _Family) -> Callable[[Any], None]:
    def patch_core(module: Any) -> None:  # a closure, not a partial: runtime names errors by __module__
        if not _installed:
            return
        sync = importlib.import_module(f"{family.core}._sync.connection_pool")
        asynchronous = importlib.import_module(f"{family.core}._async.connection_pool")
        _patches.wrap(sync.ConnectionPool, "handle_request", lambda original: _sync_handle_request(original, family))
        _patches.wrap(sync.PoolRequest, "wait_for_connection", lambda original: _sync_wait_for_connection(original, family))
        _patches.wrap(asynchronous.AsyncConnectionPool, "handle_async_request", lambda original: _async_handle_request(original, family))
        _patches.wrap(asynchronous.AsyncPoolRequest, "wait_for_connection", lambda original: _async_wait_for_connection(original, family))

    return patch_core


def _client_patcher(family: _Family) -> Callable[[Any], None]:
    def patch_client(module: Any) -> None:
        if not _installed:
            return
        if family.sync_watch is None:
            family.sync_watch, family.async_watch = _stream_classes(module.SyncByteStream, module.AsyncByteStream)
        _patches.wrap(module.Client, "send", lambda original: _sync_send(original, family))
        _patches.wrap(module.AsyncClient, "send", lambda original: _async_send(original, family))

    return patch_client


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
    """A request entered `pool` inside a request: note the pool on it (for its wait), maybe read the gauges."""
    try:
        request._latprof_pool = pool  # _POOL_ATTR: the same object the pool's PoolRequest waits with
        state: _PoolState | None = pool.__dict__.get(_STATE_ATTR)
        if state is None:
            state = _pool_state(pool, family)
        if _monotonic() - state.gauged_at_ns >= GAUGE_INTERVAL_NS:
            _read_gauges(pool, state, waiting=False)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


def _sync_handle_request(original: Callable[..., Any], family: _Family) -> Callable[..., Any]:
    def handle_request(self: Any, request: Any) -> Any:
        if _request_var.get() is not None and runtime._writer is not None:
            try:  # _entered, inlined
                request._latprof_pool = self
                state = self.__dict__.get(_STATE_ATTR)
                if state is None or _monotonic() - state.gauged_at_ns >= GAUGE_INTERVAL_NS:
                    _read_gauges(self, state or _pool_state(self, family), waiting=False)
            except Exception as exc:
                runtime.count_error(HOOK, exc)
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
        return _Wait(pool_request, pool, family)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None


def _end_wait(wait: _Wait, error: BaseException | None) -> None:
    try:
        wait.end(error)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


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


# --- one outbound call -------------------------------------------------------------------------


def _target(request: Any) -> tuple[str, str, int | None, str]:
    """The method, host, port and path of an httpx/httpx2 request."""
    url = request.url
    method = request.method
    if type(method) is not str:
        method = str(method)
    parts = getattr(url, "_uri_reference", None)  # httpx's and httpx2's parsed URL: its properties do work
    if parts is None:
        return method, str(url.host), url.port or _DEFAULT_PORTS.get(url.scheme), url.path
    host = parts.host
    if "xn--" in host:  # an IDNA host: the library decodes it (each its own way)
        host = url.host
    path = parts.path or "/"
    if "%" in path:  # percent-encoded: the library unquotes it
        path = url.path
    return method, host, parts.port or _DEFAULT_PORTS.get(parts.scheme), path


def _record_call(
    state: runtime.RequestState, segment_id: str, parent: str | None, start: int, end: int,
    target: tuple[str, str, int | None, str], status: int | None, error: BaseException | None, depends: str | None,
) -> None:
    """The `tool` segment of a call that is over (`_Exchange._record_tool` without an exchange)."""
    method, host, port, _ = target
    if error is None and port is not None and status is not None and status < 400:  # the usual answer
        attrs = {HTTP_REQUEST_METHOD: method, SERVER_ADDRESS: host, SERVER_PORT: port, HTTP_STATUS_CODE: status}
    else:
        attrs = {HTTP_REQUEST_METHOD: method, SERVER_ADDRESS: host}
        if port is not None:
            attrs[SERVER_PORT] = port
        if status is not None:
            attrs[HTTP_STATUS_CODE] = status
        if error is not None:
            attrs[ERROR_TYPE] = type(error).__qualname__
        elif status is not None and status >= 400:
            attrs[ERROR_TYPE] = str(status)
    if depends is not None:
        attrs[TOOL_DEPENDS_ON] = depends
    runtime.record(f"HTTP {method} {host}", TOOL, start, end, attrs,
                   parent_id=parent if parent is not None else runtime.ROOT,
                   segment_id=segment_id, state=state, copy_attrs=False)


def _answer_of(state: runtime.RequestState, segment_id: str, response: Any) -> None:
    """Keep the start of a whole answer that has a digit, for the calls after it (`_answered`)."""
    content = getattr(response, "_content", None)  # read whole by send(stream=False)
    if isinstance(content, bytes):
        _tools.keep(state, segment_id, content)


class _Exchange:
    """One `send` inside a request, until its response is closed and `finish` records it (once)."""

    __slots__ = (
        "state", "parent_id", "segment_id", "start_ns", "last_ns", "method", "host", "port", "llm", "status",
        "error", "ended", "done", "decoder", "sse", "pending", "skipping", "data", "data_size", "event",
        "body", "body_size", "first_ns", "chunks", "input_tokens", "output_tokens", "response_model", "provider_name",
        "depends", "answer", "answer_size",
    )

    def __init__(self, state: runtime.RequestState, request: Any) -> None:
        self.start_ns = self.last_ns = _now()
        self.state = state
        self.parent_id: str | None = _parent_var.get()
        self.segment_id = runtime.new_id()
        self.method, self.host, self.port, path = _target(request)
        self.llm = llm_path(path) if path.rstrip("/").endswith(LLM_PATHS) else None
        self.status: int | None = None
        self.error: BaseException | None = None
        self.ended = False  # the body was read to its end
        self.done = False
        self.sse = False
        self.body: list[bytes] | None = None
        # A tool call: does it send a value an earlier call of the request answered? And keep
        # the start of its own answer for the calls after it (collectors/hooks/_tools.py).
        self.depends: str | None = None
        self.answer: list[bytes] | None = None
        self.answer_size = 0
        if self.llm is None:
            if state.scratch is not None:  # an earlier call of the request may have answered something
                self.depends = _depends_on(state, request.url, request)
            self.answer = []
        else:  # what only an LLM call needs
            self.provider_name = _provider_name(self.llm, path)
            self.decoder: Any = None
            self.pending = b""
            self.skipping = False
            self.data: list[bytes] = []
            self.data_size = 0
            self.event: str | None = None
            self.body_size = 0
            self.first_ns: int | None = None
            self.chunks = 0
            self.input_tokens: Any = None
            self.output_tokens: Any = None
            self.response_model: str | None = None

    # -- the response ---------------------------------------------------------------------------

    def responded(self, response: Any, watch: Any) -> None:
        """`send` returned `response`: finish now if it is closed, else watch its stream until it is."""
        try:
            self.last_ns = now = _now()
            self.status = response.status_code
            if response.is_closed:
                self.ended = True
                if self.llm is None and not self.done:  # `finish`, for the usual call, without its layers
                    self.done = True
                    content = getattr(response, "_content", None)  # read whole by send(stream=False)
                    if isinstance(content, bytes):
                        self.answer = [content]  # _answered keeps at most MAX_SCAN_BYTES of it
                    self._record_tool(now, None)
                else:
                    self.finish(end_ns=now)
                return
            if self.llm is not None:
                self._prepare(response.headers)
            response.stream = watch(response.stream, self)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
            self.finish()

    def _prepare(self, headers: Any) -> None:
        """How to read what the caller reads: SSE events or a JSON body, through which decoder."""
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            self.decoder = zlib.decompressobj(zlib.MAX_WBITS | 32)  # zlib or gzip header
        elif encoding not in ("", "identity"):
            return  # br, zstd, ...: no decoder here; the call is timed, not read
        if headers.get("content-type", "").lower().startswith("text/event-stream"):
            self.sse = True
        else:
            self.body = []

    def seen(self, chunk: bytes) -> None:
        """The caller read `chunk` (raw bytes) of the body."""
        now = _now()
        self.last_ns = now
        answer = self.answer
        if answer is not None and self.answer_size < _tools.MAX_SCAN_BYTES:
            answer.append(chunk)
            self.answer_size += len(chunk)
        if not (self.sse or self.body is not None):
            return
        try:
            if self.decoder is not None:
                chunk = self.decoder.decompress(chunk)
            if self.sse:
                self._feed(chunk, now)
            elif self.body is not None:
                self.body_size += len(chunk)
                if self.body_size > MAX_BODY_BYTES:
                    self.body = None
                else:
                    self.body.append(chunk)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
            self.sse = False
            self.decoder = self.body = None

    def failed(self, error: BaseException) -> None:
        self.last_ns = _now()
        if self.error is None:
            self.error = error

    def finish(
        self, error: BaseException | None = None, *, abandoned: bool = False, collected: bool = False, end_ns: int = 0
    ) -> None:
        """Record the call's segments: at now (or `end_ns`), or at the last chunk read when `abandoned`.

        `collected`: called by the garbage collector, which may run while this thread holds
        the runtime's error lock: an error is then dropped, not counted.
        """
        if self.done:
            return
        self.done = True
        try:
            end = self.last_ns if abandoned else (end_ns or _now())
            error = error or self.error
            self.error = None  # a response may outlive its call: keep no traceback alive
            if self.llm is None:
                self._record_tool(end, error)
            else:
                self._record_llm(end, error, abandoned)
        except Exception as exc:
            if not collected:
                runtime.count_error(HOOK, exc)

    def _http_attrs(self, error: BaseException | None) -> dict[str, Any]:
        attrs: dict[str, Any] = {HTTP_REQUEST_METHOD: self.method, SERVER_ADDRESS: self.host}
        if self.port is not None:
            attrs[SERVER_PORT] = self.port
        if self.status is not None:
            attrs[HTTP_STATUS_CODE] = self.status
        if error is not None:
            attrs[ERROR_TYPE] = type(error).__qualname__
        elif self.status is not None and self.status >= 400:
            attrs[ERROR_TYPE] = str(self.status)  # OpenTelemetry's error.type of an HTTP client error
        return attrs

    def _parent(self) -> Any:
        return self.parent_id if self.parent_id is not None else runtime.ROOT

    def _record_tool(self, end: int, error: BaseException | None) -> None:
        _record_call(self.state, self.segment_id, self.parent_id, self.start_ns, end,
                     (self.method, self.host, self.port, ""), self.status, error, self.depends)
        answer, self.answer = self.answer, None
        if answer and error is None:
            _tools.keep(self.state, self.segment_id, answer[0] if len(answer) == 1 else b"".join(answer))

    def _record_llm(self, end: int, error: BaseException | None, abandoned: bool) -> None:
        suffix = self.llm or ""
        if self.body is not None and self.ended and error is None:
            self._read_body(b"".join(self.body))
        self.body = None
        streamed = self.sse
        first = self.first_ns if streamed else None
        ttft_known = streamed and (first is not None or (self.ended and error is None and not abandoned))
        operation = _OPERATIONS.get(suffix, "chat")
        attrs = self._http_attrs(error)
        attrs.update({GEN_AI_OPERATION_NAME: operation, LLM_CALL_ID: runtime.new_id(), TTFT_KNOWN: ttft_known})
        if self.provider_name:
            attrs[GEN_AI_PROVIDER_NAME] = self.provider_name
        if self.response_model:
            attrs[GEN_AI_RESPONSE_MODEL] = self.response_model
        if self.input_tokens is not None:
            attrs[GEN_AI_INPUT_TOKENS] = self.input_tokens
        if self.output_tokens is not None:
            attrs[GEN_AI_OUTPUT_TOKENS] = self.output_tokens
        if streamed:
            attrs[OUTPUT_CHUNKS] = self.chunks
        name = f"{operation} {self.response_model}" if self.response_model else operation
        parent = self._parent()
        runtime.record(name, PROVIDER, self.start_ns, first if first is not None else end, attrs, parent_id=parent,
                       segment_id=self.segment_id, state=self.state)
        if first is not None:
            runtime.record(name, MODEL, first, max(first, end), attrs, parent_id=parent, state=self.state)

    # -- what the caller read -------------------------------------------------------------------

    def _read_body(self, body: bytes) -> None:
        if self.decoder is not None:
            body += self.decoder.flush()
        found = _loads(body) if body else None
        if isinstance(found, dict):
            self._note(found.get("model"), found.get("usage"))

    def _note(self, model: Any, usage: Any) -> None:
        if isinstance(model, str) and model:
            self.response_model = model
        if isinstance(usage, dict):
            input_tokens, output_tokens = _usage_counts(usage)
            if input_tokens is not None:
                self.input_tokens = input_tokens
            if output_tokens is not None:
                self.output_tokens = output_tokens

    def _feed(self, data: bytes, now: int) -> None:
        """Split server-sent events out of the bytes read so far; keep only an unfinished line."""
        if self.pending:
            data = self.pending + data
            self.pending = b""
        start = 0
        while True:
            newline = data.find(b"\n", start)
            if newline < 0:
                break
            line = data[start:newline]
            start = newline + 1
            if self.skipping:  # the rest of a line too long to keep
                self.skipping = False
                continue
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:  # the end of an event
                lines, self.data, self.data_size = self.data, [], 0
                if lines:
                    payload = b"\n".join(lines) if len(lines) > 1 else lines[0]
                    if payload != b"[DONE]":
                        self._event(payload, now)
                self.event = None
            elif line.startswith(b"data:"):
                value = line[6:] if line.startswith(b"data: ") else line[5:]
                self.data_size += len(value)
                if self.data_size <= MAX_EVENT_BYTES:
                    self.data.append(value)
                else:  # too long to keep: the event is dropped
                    self.data = []
            elif line.startswith(b"event:"):
                self.event = line[6:].strip().decode("utf-8", "replace")
        rest = data[start:]
        if len(rest) + self.data_size > MAX_EVENT_BYTES:
            self.skipping = True
            self.data = []
            self.data_size = MAX_EVENT_BYTES + 1  # the event is dropped at its blank line
        elif not self.skipping:
            self.pending = rest

    def _event(self, payload: bytes, now: int) -> None:
        event = _loads(payload)
        if not isinstance(event, dict):
            return
        kind = event.get("type") or self.event
        token = False
        if isinstance(kind, str):
            if kind.endswith(".delta"):  # Responses API; response.created and friends come before any token
                token = True
            elif kind == "content_block_delta":  # Anthropic Messages
                delta = event.get("delta")
                token = isinstance(delta, dict) and any(v for k, v in delta.items() if k != "type")
            elif kind in _RESPONSE_SNAPSHOTS:
                response = event.get("response")
                if isinstance(response, dict):
                    self._note(response.get("model"), response.get("usage"))
            elif kind == "message_start":
                message = event.get("message")
                if isinstance(message, dict):
                    self._note(message.get("model"), message.get("usage"))
            elif kind == "message_delta":
                self._note(None, event.get("usage"))
        choices = event.get("choices")
        if isinstance(choices, list):  # Chat Completions (and legacy Completions) chunks
            for choice in choices:
                if not isinstance(choice, dict):
                    continue
                delta = choice.get("delta")
                if (isinstance(delta, dict) and any(delta.get(f) for f in _DELTA_FIELDS)) or choice.get("text"):
                    token = True
                    break
            self._note(event.get("model") if self.response_model is None else None, event.get("usage"))
        if token:
            self.chunks += 1
            if self.first_ns is None:
                self.first_ns = now


def _provider_name(suffix: str, path: str) -> str | None:
    """The API family the path belongs to (GenAI `gen_ai.provider.name`), for the default paths."""
    if "/openai/deployments/" in path:
        return "azure.ai.openai"
    if suffix == "/v1/messages":
        return "anthropic"
    if suffix in _OPERATIONS:
        return "openai"
    return None


# --- which calls depend on an earlier one (collectors/hooks/_tools.py) --------------------------------


def _answered(state: runtime.RequestState, segment_id: str, body: bytes) -> None:
    """The call `segment_id` answered `body` (what the caller read of it): keep it for later calls."""
    _tools.keep(state, segment_id, body)


def _depends_on(state: runtime.RequestState, url: Any, request: Any) -> str | None:
    """`_tools.depends_on` for this call (its path and query, and its body when given as bytes)."""
    target = getattr(url, "raw_path", b"")
    if not isinstance(target, bytes):
        target = str(target).encode("utf-8", "replace")
    body = getattr(request, "_content", None)
    return _tools.depends_on(state, target, body if isinstance(body, (bytes, bytearray)) else None)


# --- send --------------------------------------------------------------------------------------


def _begin(request: Any) -> _Exchange | None:
    """A call to record, or None outside a request, inside an SDK call, or when the hook fails."""
    state = _request_var.get()
    if state is None or runtime._writer is None or _in_sdk_call.get():
        return None
    try:
        return _Exchange(state, request)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None


def _nest(exchange: _Exchange) -> Any:
    """Make the pool wait of this call a child of its segment (until `_unnest`): a token."""
    try:
        return _parent_var.set(exchange.segment_id)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None


def _unnest(token: Any) -> None:
    if token is not None:
        try:
            _parent_var.reset(token)
        except ValueError:  # left from another context
            pass
        except Exception as exc:
            runtime.count_error(HOOK, exc)


def _plain_call(state: runtime.RequestState, request: Any, kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """For the usual call (not to an LLM path, not streamed: `send` reads the answer whole), what
    recording it needs: (target, depends on, parent, segment id); None for any other call."""
    if kwargs.get("stream"):
        return None
    target = _target(request)
    path = target[3]
    if path.rstrip("/").endswith(LLM_PATHS):
        return None
    depends = _depends_on(state, request.url, request) if state.scratch is not None else None
    return target, depends, _parent_var.get(), runtime.new_id()


def _plain_done(
    state: runtime.RequestState, plain: tuple[Any, ...], start: int, request: Any, response: Any,
    error: BaseException | None, watch: Any,
) -> None:
    """The usual call returned `response` (or raised `error`): record it."""
    target, depends, parent, segment_id = plain
    try:
        if error is None and not response.is_closed:  # not read after all: watch it like a stream
            exchange = _Exchange(state, request)
            exchange.segment_id, exchange.parent_id, exchange.start_ns, exchange.depends = segment_id, parent, start, depends
            exchange.responded(response, watch)
            return
        _record_call(state, segment_id, parent, start, _now(), target,
                     None if response is None else response.status_code, error, depends)
        if error is None:
            _answer_of(state, segment_id, response)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


def _sync_send(original: Callable[..., Any], family: _Family) -> Callable[..., Any]:
    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        state = _request_var.get()  # _begin, inlined
        if state is None or runtime._writer is None or _in_sdk_call.get():
            return original(self, request, *args, **kwargs)
        try:
            plain = _plain_call(state, request, kwargs)
            exchange = _Exchange(state, request) if plain is None else None
        except Exception as exc:
            runtime.count_error(HOOK, exc)
            return original(self, request, *args, **kwargs)
        if plain is not None:  # the usual call, without an _Exchange
            start = _now()
            token = _parent_var.set(plain[3])  # the pool wait of this call is its child
            try:
                response = original(self, request, *args, **kwargs)
            except BaseException as exc:
                _plain_done(state, plain, start, request, None, exc, None)
                raise
            finally:
                try:
                    _parent_var.reset(token)
                except ValueError:  # left from another context
                    pass
            _plain_done(state, plain, start, request, response, None, family.sync_watch)
            return response
        assert exchange is not None
        read_here = exchange.llm is not None and not kwargs.get("stream", False)
        token = _parent_var.set(exchange.segment_id)  # _nest: the pool wait of this call is its child
        try:
            response = original(self, request, *args, **({**kwargs, "stream": True} if read_here else kwargs))
        except BaseException as exc:
            exchange.finish(exc)
            raise
        finally:
            try:  # _unnest
                _parent_var.reset(token)
            except ValueError:  # left from another context
                pass
        exchange.responded(response, family.sync_watch)
        if read_here:  # what send(stream=False) does, now that the stream is watched
            try:
                response.read()
            except BaseException as exc:
                response.close()
                exchange.finish(exc)
                raise
        return response

    return send


def _async_send(original: Callable[..., Any], family: _Family) -> Callable[..., Any]:
    async def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        state = _request_var.get()  # _begin, inlined
        if state is None or runtime._writer is None or _in_sdk_call.get():
            return await original(self, request, *args, **kwargs)
        try:
            plain = _plain_call(state, request, kwargs)
            exchange = _Exchange(state, request) if plain is None else None
        except Exception as exc:
            runtime.count_error(HOOK, exc)
            return await original(self, request, *args, **kwargs)
        if plain is not None:  # the usual call, without an _Exchange
            start = _now()
            token = _parent_var.set(plain[3])
            try:
                response = await original(self, request, *args, **kwargs)
            except BaseException as exc:
                _plain_done(state, plain, start, request, None, exc, None)
                raise
            finally:
                try:
                    _parent_var.reset(token)
                except ValueError:  # left from another context
                    pass
            _plain_done(state, plain, start, request, response, None, family.async_watch)
            return response
        assert exchange is not None
        read_here = exchange.llm is not None and not kwargs.get("stream", False)
        token = _parent_var.set(exchange.segment_id)  # _nest: the pool wait of this call is its child
        try:
            response = await original(self, request, *args, **({**kwargs, "stream": True} if read_here else kwargs))
        except BaseException as exc:
            exchange.finish(exc)
            raise
        finally:
            try:  # _unnest
                _parent_var.reset(token)
            except ValueError:  # left from another context
                pass
        exchange.responded(response, family.async_watch)
        if read_here:
            try:
                await response.aread()
            except BaseException as exc:
                await response.aclose()
                exchange.finish(exc)
                raise
        return response

    return send


# --- response streams --------------------------------------------------------------------------


def _stream_classes(sync_base: type, async_base: type) -> tuple[type, type]:
    """Pass-through response streams, subclasses of the library's own (httpx checks `isinstance`)."""

    class WatchedStream(sync_base):  # type: ignore[misc]
        """Yields what the response's stream yields and tells the call; ends it when closed."""

        def __init__(self, inner: Any, exchange: _Exchange) -> None:
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

        def __init__(self, inner: Any, exchange: _Exchange) -> None:
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
