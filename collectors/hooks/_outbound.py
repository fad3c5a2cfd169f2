"""An outbound HTTP call inside a request, a tool call or a raw LLM API call: what the httpx and aiohttp_client hooks share.

Not a hook itself. Each HTTP hook patches its own library and hands every call it sees to
an `Exchange` (or, for httpx's usual call, `plain_call`/`plain_done`): a `tool` segment
"HTTP GET host", or, for a path in `LLM_PATHS`, an LLM call (`_llm`) read from the bytes the
caller reads: server-sent events or a JSON body. The model is described in
`collectors/hooks/httpx.py`; errors are counted for the hook that saw the call.

What this code costs the service is timed as stretches of hook code (`runtime.cost_begin`),
which must not nest: `Exchange.seen` (per chunk) and `Exchange.finish` are stretches of their
own, called by the hooks where none is open; everything else here (`begin`, `nest`, `unnest`,
`plain_call`, `plain_done`, `Exchange(...)`, `Exchange.responded`) is timed by the hook that
calls it, inside the stretches of its wrapper, and calls `_finish` (`finish`, untimed).
"""

from __future__ import annotations

import time
import zlib
from typing import Any

from latprof.collectors.hooks import _llm, _tools, runtime
from latprof.collectors.hooks._llm import DELTA_FIELDS as _DELTA_FIELDS
from latprof.collectors.hooks._llm import RESPONSE_SNAPSHOTS as _RESPONSE_SNAPSHOTS
from latprof.collectors.hooks._llm import loads as _loads
from latprof.layers import TOOL
from latprof.semconv import (
    ERROR_TYPE,
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    HTTP_REQUEST_METHOD,
    HTTP_STATUS_CODE,
    LLM_CALL_ID,
    SERVER_ADDRESS,
    SERVER_PORT,
    TOOL_DEPENDS_ON,
    TTFT_KNOWN,
)

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

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}

_now = time.time_ns
_request_var = runtime._request  # runtime.current_request() without the call
_parent_var = runtime._parent  # runtime.current_parent(), and nesting without a context manager
#: Set while the openai hook records a call: its HTTP request is not recorded again.
_in_sdk_call = _llm.in_sdk_call


# --- which calls are LLM calls -----------------------------------------------------------------


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


def record_call(
    state: runtime.RequestState, segment_id: str, parent: str | None, start: int, end: int,
    target: tuple[str, str, int | None, str], status: int | None, error: BaseException | None, depends: str | None,
) -> None:
    """The `tool` segment of a call that is over (`Exchange._record_tool` without an exchange)."""
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


class Exchange(_llm.LlmCall):
    """One call inside a request, until its response is closed and `finish` records it (once).

    An LLM call's answer (first token, chunks, model, usage) is kept as `_llm.LlmCall` keeps it.
    """

    __slots__ = (
        "state", "parent_id", "segment_id", "start_ns", "last_ns", "method", "host", "port", "llm", "status",
        "error", "ended", "done", "decoder", "sse", "pending", "skipping", "data", "data_size", "event",
        "body", "body_size", "provider_name", "depends", "answer", "answer_size", "hook",
    )

    def __init__(self, state: runtime.RequestState, request: Any, hook: str) -> None:
        self.start_ns = self.last_ns = _now()
        self.hook = hook  # the hook that saw the call: its errors are counted for it
        runtime.saw(hook)
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
            _llm.LlmCall.__init__(self)

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
                    self._finish(end_ns=now)
                return
            if self.llm is not None:
                self.prepare(response.headers)
            response.stream = watch(response.stream, self)
        except Exception as exc:
            runtime.count_error(self.hook, exc)
            self._finish()

    def prepare(self, headers: Any) -> None:
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
        """The caller read `chunk` (raw bytes) of the body. A stretch of hook code of its own."""
        timing = runtime.cost_begin()
        try:
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
                runtime.count_error(self.hook, exc)
                self.sse = False
                self.decoder = self.body = None
        finally:
            runtime.cost_end(timing)

    def failed(self, error: BaseException) -> None:
        self.last_ns = _now()
        if self.error is None:
            self.error = error

    def finish(
        self, error: BaseException | None = None, *, abandoned: bool = False, collected: bool = False, end_ns: int = 0
    ) -> None:
        """Record the call's segments: at now (or `end_ns`), or at the last chunk read when `abandoned`.

        A stretch of hook code of its own (`_finish` inside one), except when `collected`: called
        by the garbage collector, which may run inside another stretch, and while this thread
        holds the runtime's error lock: an error is then dropped, not counted.
        """
        if self.done:
            return
        if collected:
            self._finish(error, abandoned=abandoned, collected=True, end_ns=end_ns)
            return
        timing = runtime.cost_begin()
        try:
            self._finish(error, abandoned=abandoned, end_ns=end_ns)
        finally:
            runtime.cost_end(timing)

    def _finish(
        self, error: BaseException | None = None, *, abandoned: bool = False, collected: bool = False, end_ns: int = 0
    ) -> None:
        """`finish`, untimed: inside a stretch of hook code (the caller's)."""
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
                runtime.count_error(self.hook, exc)

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
        record_call(self.state, self.segment_id, self.parent_id, self.start_ns, end,
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
        ttft_known = _llm.ttft_known(streamed, self.first_ns, self.ended and error is None and not abandoned)
        operation = _OPERATIONS.get(suffix, "chat")
        attrs = self._http_attrs(error)
        attrs.update({GEN_AI_OPERATION_NAME: operation, LLM_CALL_ID: runtime.new_id(), TTFT_KNOWN: ttft_known})
        if self.provider_name:
            attrs[GEN_AI_PROVIDER_NAME] = self.provider_name
        name = f"{operation} {self.response_model}" if self.response_model else operation
        self.record(self.state, self._parent(), name, attrs, self.start_ns, end, streamed=streamed, segment_id=self.segment_id)

    # -- what the caller read -------------------------------------------------------------------

    def _read_body(self, body: bytes) -> None:
        if self.decoder is not None:
            body += self.decoder.flush()
        found = _loads(body) if body else None
        if isinstance(found, dict):
            self._note(found.get("model"), found.get("usage"))

    def _note(self, model: Any, usage: Any) -> None:
        self.note(model, usage if isinstance(usage, dict) else None)

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
        if token:  # self.token(now), inlined
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


# --- one call, begun and ended ----------------------------------------------------------------


def begin(request: Any, hook: str) -> Exchange | None:
    """A call `hook` saw to record, or None outside a request, inside an SDK call, or when the hook fails.
    Untimed: the caller's stretch of hook code (as for `nest`, `unnest`, `plain_call`, `plain_done`)."""
    state = _request_var.get()
    if state is None or runtime._writer is None or _in_sdk_call.get():
        return None
    try:
        return Exchange(state, request, hook)
    except Exception as exc:
        runtime.count_error(hook, exc)
        return None


def nest(exchange: Exchange) -> Any:
    """Make the pool wait of this call a child of its segment, and time an LLM call's connection
    (`_llm.timed_call`), until `unnest`: a token."""
    try:
        return _parent_var.set(exchange.segment_id), _llm.timed_call.set(exchange if exchange.llm is not None else None)
    except Exception as exc:
        runtime.count_error(exchange.hook, exc)
        return None


def unnest(token: Any, hook: str) -> None:
    if token is not None:
        try:
            _parent_var.reset(token[0])
            _llm.timed_call.reset(token[1])
        except ValueError:  # left from another context
            pass
        except Exception as exc:
            runtime.count_error(hook, exc)


def plain_call(state: runtime.RequestState, request: Any, kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
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


def plain_done(
    state: runtime.RequestState, plain: tuple[Any, ...], start: int, request: Any, response: Any,
    error: BaseException | None, watch: Any, hook: str,
) -> None:
    """The usual call returned `response` (or raised `error`): record it."""
    target, depends, parent, segment_id = plain
    runtime.saw(hook)
    try:
        if error is None and not response.is_closed:  # not read after all: watch it like a stream
            exchange = Exchange(state, request, hook)
            exchange.segment_id, exchange.parent_id, exchange.start_ns, exchange.depends = segment_id, parent, start, depends
            exchange.responded(response, watch)
            return
        record_call(state, segment_id, parent, start, _now(), target,
                     None if response is None else response.status_code, error, depends)
        if error is None:
            _answer_of(state, segment_id, response)
    except Exception as exc:
        runtime.count_error(hook, exc)
