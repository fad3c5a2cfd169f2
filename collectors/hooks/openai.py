"""The openai client hook: each LLM call of a request as `provider` (to the first token) and `model` (decode) segments.

A streamed call is a `provider` segment from just before the request is built and sent until
the first chunk with any non-empty delta (content, tool calls, refusal, reasoning; for a
Responses stream the first `*.delta` event) or the end of the stream, then a `model` segment
until the stream ends. Both share `latprof.llm_call_id` and say `latprof.ttft_known: true`.
A non-streamed call is one `provider` segment with `latprof.ttft_known: false`; the analysis
splits it later (`latprof.analysis.genai`). The client's own backoff sleeps are `retry` segments inside
the `provider` segment, with the status code that caused them. Token counts come from the
usage the service asked for (never requested on its behalf: that changes what it receives);
streamed calls also count their output chunks. One OpenTelemetry CLIENT span per call goes
through opentelemetry-api, a no-op without an SDK.

Patch points, each wrapped once and only on the class that defines it (`uninstall()` restores):

- `create` and `parse` of `Completions` / `AsyncCompletions` (`openai.resources.chat.completions`)
  and of `Responses` / `AsyncResponses` (`openai.resources.responses`): the public entry of a
  call, where the model and `stream` are plain arguments. The `.stream()` helpers and
  `with_raw_response` / `with_streaming_response` go through `create`.
- the returned `Stream` / `AsyncStream` is the same object: only its private `_iterator` is
  replaced by a pass-through that looks at each chunk as the caller reads it, so iteration,
  `next()`, context managers, `.response` and early breaks behave as before.
- `Stream.close` / `AsyncStream.close`: a stream abandoned early ends its segments when it is
  closed (else when it is garbage-collected), at the last chunk the caller read.
- `Stream.__init__` / `AsyncStream.__init__`: only for `with_raw_response` streams, which
  `.parse()` builds after `create` returned.
- `SyncAPIClient._sleep_for_retry` / `AsyncAPIClient._sleep_for_retry` (`openai._base_client`).

The same classes and names exist in the openai 2.x line (on httpx) and the 3.x line (on httpx2).
Outside a request nothing is recorded, and every error of the hook is counted, never raised.

Installed late: a resource's `with_raw_response` / `with_streaming_response` object binds the
resource's `create` when first used and is cached on it, so the calls through one the service
used before the injection are not seen; and one made while the hook was installed keeps the
wrapper after `uninstall`, which then hands every call on untouched (`_begin` checks that the
hook is installed).
"""

from __future__ import annotations

import functools
import time
import weakref
from typing import Any, Callable

from latprof import semconv
from latprof.collectors.hooks import _llm, _scaffold, runtime
from latprof.layers import RETRY
from latprof.semconv import (
    GEN_AI_INPUT_TOKENS,
    GEN_AI_OPERATION_NAME,
    GEN_AI_OUTPUT_TOKENS,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_MODEL,
    HTTP_STATUS_CODE,
    LLM_CALL_ID,
    SERVER_ADDRESS,
    TTFT_KNOWN,
)

HOOK = "openai"

OUTPUT_CHUNKS = semconv.OUTPUT_CHUNKS
ERROR_TYPE = semconv.ERROR_TYPE
#: int on a `retry` segment: which resend the backoff precedes.
RESEND_COUNT = semconv.HTTP_RESEND_COUNT
# OpenTelemetry span only.
_REQUEST_STREAM = "gen_ai.request.stream"
_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"

OPERATION = "chat"  # Chat Completions and Responses are both `chat` in the GenAI conventions
RETRY_SEGMENT = "openai retry"

_now = time.time_ns  # what runtime.now_ns is, without the attribute lookup per chunk

_stream_classes: tuple[type, ...] = ()
#: with_raw_response streams: the httpx response -> its call, until `.parse()` builds the Stream.
_raw_pending: weakref.WeakKeyDictionary[Any, _Call] = weakref.WeakKeyDictionary()
_otel: Any = None  # (trace module, context module, tracer), imported at the first call
#: Set while a patched call runs: a patched method that calls another records one call, not two
#: (and the HTTP hooks leave the call's HTTP request to this one).
_in_call = _llm.in_sdk_call


def _patch_streaming(module: Any) -> None:
    global _stream_classes
    stream, async_stream = module.Stream, module.AsyncStream
    _stream_classes = (stream, async_stream)
    scaffold.wrap(stream, "close", _sync_close)
    scaffold.wrap(async_stream, "close", _async_close)
    scaffold.wrap(stream, "__init__", _stream_init)
    scaffold.wrap(async_stream, "__init__", _stream_init)


def _patch_base_client(module: Any) -> None:
    scaffold.wrap(module.SyncAPIClient, "_sleep_for_retry", _sync_retry_sleep)
    scaffold.wrap(module.AsyncAPIClient, "_sleep_for_retry", _async_retry_sleep)


def _patch_chat(module: Any) -> None:
    for name in ("create", "parse"):
        scaffold.wrap(module.Completions, name, functools.partial(_sync_call, observe=_observe_chat_chunk))
        scaffold.wrap(module.AsyncCompletions, name, functools.partial(_async_call, observe=_observe_chat_chunk))


def _patch_responses(module: Any) -> None:
    for name in ("create", "parse"):
        scaffold.wrap(module.Responses, name, functools.partial(_sync_call, observe=_observe_response_event))
        scaffold.wrap(module.AsyncResponses, name, functools.partial(_async_call, observe=_observe_response_event))


def _reset() -> None:
    global _stream_classes
    _stream_classes = ()
    _raw_pending.clear()  # (their calls still end when their response is collected)


_T = _scaffold.Target
_TESTED = [_scaffold.Tested("openai", "2", "3")]  # the README's and nox's lines
#: What the hook patches, each part when (if ever) its module is imported.
scaffold = _scaffold.Hook(HOOK, [
    _scaffold.Library("openai._streaming", [
        _T("openai._streaming", "Stream", "__init__"), _T("openai._streaming", "AsyncStream", "__init__"),
        _T("openai._streaming", "Stream", "close"), _T("openai._streaming", "AsyncStream", "close"),
    ], _patch_streaming, _TESTED),
    _scaffold.Library("openai._base_client", [
        _T("openai._base_client", "SyncAPIClient", "_sleep_for_retry"),
        _T("openai._base_client", "AsyncAPIClient", "_sleep_for_retry"),
    ], _patch_base_client, _TESTED),
    _scaffold.Library("openai.resources.chat.completions", [
        _T("openai.resources.chat.completions", "Completions", "create"),
        _T("openai.resources.chat.completions", "AsyncCompletions", "create"),
    ], _patch_chat, _TESTED),
    _scaffold.Library("openai.resources.responses", [
        _T("openai.resources.responses", "Responses", "create"),
        _T("openai.resources.responses", "AsyncResponses", "create"),
    ], _patch_responses, _TESTED),
], _reset)  # fmt: skip
#: Patch the openai client when (or if already) imported; idempotent.
install = scaffold.install
#: Put every patched attribute back (tests); calls already in flight still finish.
uninstall = scaffold.uninstall


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""
    return scaffold.late_coverage(
        lambda: ("the openai client is loaded" if scaffold.imported() else "the openai client is not imported in this process")
        + ": calls that clients made before the injection start after it are seen, except through a"
        " with_raw_response or with_streaming_response object the service had already used (it keeps the unpatched"
        " method), and streams already being read are not"
    )


# --- one LLM call ------------------------------------------------------------------------------


class _Call(_llm.LlmCall):
    """What the hook knows about one call (besides its answer: `_llm.LlmCall`), until `finish` records it (once)."""

    __slots__ = (
        "state", "parent_id", "provider_id", "call_id", "request_model", "server", "stream", "observe",
        "start_ns", "last_ns", "done", "span", "__weakref__",
    )

    def __init__(self, state: runtime.RequestState, kwargs: dict[str, Any], resource: Any,
                 observe: Callable[[_Call, Any], None]) -> None:
        self.start_ns = _now()
        self.state = state
        self.parent_id: str | None = runtime.current_parent()
        self.provider_id = runtime.new_id()
        self.call_id = runtime.new_id()
        model = kwargs.get("model")
        self.request_model = model if isinstance(model, str) else None
        self.stream = bool(kwargs.get("stream", False))
        self.observe = observe
        self.server = _server_of(resource)
        _llm.LlmCall.__init__(self)
        self.last_ns = self.start_ns
        self.done = False
        self.span: Any = _start_span(self)

    def finish(self, error: BaseException | None = None, *, abandoned: bool = False, collected: bool = False) -> None:
        """Record the call's segments: at now, or at the last chunk read when `abandoned`.

        `collected`: called by the garbage collector, which may run while this thread holds
        the runtime's error lock: an error is then dropped, not counted. Nor is it timed as a
        stretch of the hook's code: the collector may run inside another stretch.
        """
        if self.done:
            return
        self.done = True
        timing = 0 if collected else runtime.cost_begin()
        try:
            end = self.last_ns if abandoned else _now()
            # TTFT is measured when a token came, or when the stream ran to its end without one.
            ttft_known = _llm.ttft_known(self.stream, self.first_ns, error is None and not abandoned)
            attrs: dict[str, Any] = {GEN_AI_OPERATION_NAME: OPERATION, GEN_AI_PROVIDER_NAME: "openai", LLM_CALL_ID: self.call_id,
                                     TTFT_KNOWN: ttft_known}
            model = self.request_model or self.response_model
            if self.request_model:
                attrs[GEN_AI_REQUEST_MODEL] = self.request_model
            if self.server:
                attrs[SERVER_ADDRESS] = self.server
            if error is not None:
                attrs[ERROR_TYPE] = type(error).__qualname__
                status = getattr(error, "status_code", None)  # openai.APIStatusError: 429, 5xx, ...
                if isinstance(status, int):
                    attrs[HTTP_STATUS_CODE] = status
            name = f"{OPERATION} {model}" if model else OPERATION
            parent = self.parent_id if self.parent_id is not None else runtime.ROOT  # not the reading code's parent
            self.record(self.state, parent, name, attrs, self.start_ns, end, streamed=self.stream, segment_id=self.provider_id)
            runtime.saw(HOOK)
            if self.span is not None:
                _end_span(self, attrs, end, error)
        except Exception as exc:
            if not collected:
                runtime.count_error(HOOK, exc)
        finally:
            runtime.cost_end(timing)

    def returned(self, result: Any) -> Any:
        """`create` returned `result` (given back unchanged): watch the stream, or finish now."""
        finish = False
        timing = runtime.cost_begin()  # its own part; `finish` is a stretch of its own, after it
        try:
            self.last_ns = _now()
            if not self.stream:
                self._read_result(result)
                finish = True
            elif isinstance(result, _stream_classes):
                _watch(result, self)
            else:
                response = getattr(result, "http_response", None)  # with_raw_response / with_streaming_response
                if response is None:
                    finish = True
                else:
                    _raw_pending[response] = self
                    weakref.finalize(response, self.finish, abandoned=True, collected=True)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
            finish = True
        finally:
            runtime.cost_end(timing)
        if finish:
            self.finish()
        return result

    def _read_result(self, result: Any) -> None:
        model = getattr(result, "model", None)
        usage = getattr(result, "usage", None)
        response = getattr(result, "http_response", None)
        if model is None and usage is None and response is not None:  # raw: the body, if it was read
            try:
                content = response.content
            except Exception:
                content = None
            if content:
                body = _llm.loads(content)
                if isinstance(body, dict):
                    model, usage = body.get("model"), body.get("usage")
        self.note(model, usage)


def _server_of(resource: Any) -> str | None:
    try:
        host = resource._client.base_url.host
        return host if isinstance(host, str) and host else None
    except Exception:
        return None


def _begin(resource: Any, kwargs: dict[str, Any], observe: Callable[[_Call, Any], None]) -> _Call | None:
    """A call to record, or None outside a request (or when the hook fails)."""
    state = runtime.current_request()
    if state is None or not runtime.active() or _in_call.get() or not scaffold.installed:
        return None
    timing = runtime.cost_begin()
    try:
        return _Call(state, kwargs, resource, observe)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None
    finally:
        runtime.cost_end(timing)


def _enter(call: _Call) -> tuple[Any, Any, Any]:
    """Nest what happens inside the call (retries, HTTP) under its provider segment and span."""
    timing = runtime.cost_begin()
    try:
        parent = runtime.nested_under(call.provider_id)
        parent.__enter__()
        in_call = _in_call.set(True)
        otel = None
        if call.span is not None:
            try:
                trace, context, _ = _otel
                otel = context.attach(trace.set_span_in_context(call.span))
            except Exception as exc:
                runtime.count_error(HOOK, exc)
        return parent, in_call, otel
    finally:
        runtime.cost_end(timing)


def _leave(tokens: tuple[Any, Any, Any]) -> None:
    timing = runtime.cost_begin()
    parent, in_call, otel = tokens
    try:
        try:
            parent.__exit__(None, None, None)
            _in_call.reset(in_call)
        except Exception:  # reset from another context: leave it
            pass
        if otel is not None:
            try:
                _otel[1].detach(otel)
            except Exception as exc:
                runtime.count_error(HOOK, exc)
    finally:
        runtime.cost_end(timing)


def _sync_call(original: Callable[..., Any], observe: Callable[[_Call, Any], None]) -> Callable[..., Any]:
    def call_with_segments(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = _begin(self, kwargs, observe)
        if call is None:
            return original(self, *args, **kwargs)
        tokens = _enter(call)
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            _leave(tokens)
            call.finish(exc)
            raise
        _leave(tokens)
        return call.returned(result)

    return call_with_segments


def _async_call(original: Callable[..., Any], observe: Callable[[_Call, Any], None]) -> Callable[..., Any]:
    async def call_with_segments(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = _begin(self, kwargs, observe)
        if call is None:
            return await original(self, *args, **kwargs)
        tokens = _enter(call)
        try:
            result = await original(self, *args, **kwargs)
        except BaseException as exc:
            _leave(tokens)
            call.finish(exc)
            raise
        _leave(tokens)
        return call.returned(result)

    return call_with_segments


# --- what each chunk says ----------------------------------------------------------------------


def _observe_chat_chunk(call: _Call, chunk: Any) -> None:
    now = _now()
    call.last_ns = now
    for choice in chunk.choices or ():
        delta = choice.delta
        if delta is not None and (  # _llm.DELTA_FIELDS, on the SDK's objects
            delta.content
            or delta.tool_calls
            or getattr(delta, "refusal", None)
            or getattr(delta, "function_call", None)
            or _reasoning(delta)
        ):
            call.chunks += 1  # call.token(now), inlined
            if call.first_ns is None:
                call.first_ns = now
            break
    usage = chunk.usage  # only in the chunk(s) the caller asked for with stream_options
    if usage is not None:
        call.note(None, usage)
    if call.response_model is None:
        call.response_model = chunk.model


def _reasoning(delta: Any) -> bool:
    """OpenAI-compatible servers (vLLM, DeepSeek) stream reasoning in fields the client does not declare."""
    extra = getattr(delta, "__pydantic_extra__", None)
    if not extra:
        return False
    return bool(extra.get("reasoning_content") or extra.get("reasoning"))


def _observe_response_event(call: _Call, event: Any) -> None:
    now = _now()
    call.last_ns = now
    kind = event.type
    if kind.endswith(".delta"):  # response.created and friends come before any token
        call.chunks += 1  # call.token(now), inlined
        if call.first_ns is None:
            call.first_ns = now
    elif kind in _llm.RESPONSE_SNAPSHOTS:
        response = event.response
        call.note(response.model, response.usage)


# --- streams -----------------------------------------------------------------------------------


def _watch(stream: Any, call: _Call) -> None:
    """Let `call` see each chunk `stream` yields, without changing what it yields."""
    inner = stream._iterator
    if hasattr(inner, "__anext__"):
        stream._iterator = _AsyncChunks(inner, call)
    else:
        stream._iterator = _Chunks(inner, call)


class _ChunkWatcher:
    """What the sync and async stand-ins share: tell the call each item; end it when dropped."""

    __slots__ = ("_inner", "_call")

    def __init__(self, inner: Any, call: _Call) -> None:
        self._inner = inner
        self._call = call

    def _seen(self, item: Any) -> Any:
        timing = runtime.cost_begin()  # per chunk: the call's stretch of hook code, after the inner generator's
        try:
            self._call.observe(self._call, item)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
        finally:
            runtime.cost_end(timing)
        return item

    def __getattr__(self, name: str) -> Any:  # send/asend, throw/athrow, gi_frame, ... of the generator
        if name in _ChunkWatcher.__slots__:
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __del__(self) -> None:  # the stream was dropped without reading to the end or closing
        try:
            self._call.finish(abandoned=True, collected=True)
        except Exception:
            pass


class _Chunks(_ChunkWatcher):
    """Stands in for a Stream's generator: yields what it yields, and tells the call."""

    __slots__ = ()

    def __iter__(self) -> _Chunks:
        return self

    def __next__(self) -> Any:
        try:
            item = self._inner.__next__()
        except StopIteration:
            self._call.finish()
            raise
        except BaseException as exc:
            self._call.finish(exc)
            raise
        return self._seen(item)

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._call.finish(abandoned=True)


class _AsyncChunks(_ChunkWatcher):
    """`_Chunks` for an AsyncStream's async generator."""

    __slots__ = ()

    def __aiter__(self) -> _AsyncChunks:
        return self

    async def __anext__(self) -> Any:
        try:
            item = await self._inner.__anext__()
        except StopAsyncIteration:
            self._call.finish()
            raise
        except BaseException as exc:
            self._call.finish(exc)
            raise
        return self._seen(item)

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._call.finish(abandoned=True)


def _finish_closed(stream: Any) -> None:
    try:
        chunks = stream.__dict__.get("_iterator")
        if isinstance(chunks, _ChunkWatcher):
            chunks._call.finish(abandoned=True)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


def _sync_close(original: Callable[..., Any]) -> Callable[..., Any]:
    def close(self: Any) -> Any:
        try:
            return original(self)
        finally:
            _finish_closed(self)

    return close


def _async_close(original: Callable[..., Any]) -> Callable[..., Any]:
    async def close(self: Any) -> Any:
        try:
            return await original(self)
        finally:
            _finish_closed(self)

    return close


def _stream_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if _raw_pending:  # a with_raw_response call is waiting for its stream
            try:
                call = _raw_pending.pop(self.response, None)
                if call is not None and not call.done:
                    _watch(self, call)
            except Exception as exc:
                runtime.count_error(HOOK, exc)

    return __init__


# --- the client's backoff ----------------------------------------------------------------------


def _record_retry(start: int, kwargs: dict[str, Any]) -> None:
    try:
        attrs: dict[str, Any] = {}
        response = kwargs.get("response")
        status = getattr(response, "status_code", None)
        if isinstance(status, int):
            attrs[HTTP_STATUS_CODE] = status
        retries_taken = kwargs.get("retries_taken")
        if isinstance(retries_taken, int):
            attrs[RESEND_COUNT] = retries_taken + 1
        runtime.record(RETRY_SEGMENT, RETRY, start, _now(), attrs)
        runtime.saw(HOOK)
    except Exception as exc:
        runtime.count_error(HOOK, exc)


def _sync_retry_sleep(original: Callable[..., Any]) -> Callable[..., Any]:
    def _sleep_for_retry(self: Any, *args: Any, **kwargs: Any) -> Any:
        if runtime.current_request() is None:
            return original(self, *args, **kwargs)
        start = _now()
        try:
            return original(self, *args, **kwargs)
        finally:
            _record_retry(start, kwargs)

    return _sleep_for_retry


def _async_retry_sleep(original: Callable[..., Any]) -> Callable[..., Any]:
    async def _sleep_for_retry(self: Any, *args: Any, **kwargs: Any) -> Any:
        if runtime.current_request() is None:
            return await original(self, *args, **kwargs)
        start = _now()
        try:
            return await original(self, *args, **kwargs)
        finally:
            _record_retry(start, kwargs)

    return _sleep_for_retry


# --- OpenTelemetry -----------------------------------------------------------------------------


def _start_span(call: _Call) -> Any:
    """A CLIENT span for the call when an SDK records spans, else None (and nothing more to pay)."""
    global _otel
    try:
        if _otel is None:
            from opentelemetry import context, trace

            _otel = (trace, context, trace.get_tracer("latprof"))
        trace, _, tracer = _otel
        model = call.request_model
        span = tracer.start_span(f"{OPERATION} {model}" if model else OPERATION, kind=trace.SpanKind.CLIENT, start_time=call.start_ns)
        if not span.is_recording():
            return None
        span.set_attributes({GEN_AI_OPERATION_NAME: OPERATION, GEN_AI_PROVIDER_NAME: "openai", _REQUEST_STREAM: call.stream})
        if model:
            span.set_attribute(GEN_AI_REQUEST_MODEL, model)
        if call.server:
            span.set_attribute(SERVER_ADDRESS, call.server)
        return span
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None


def _end_span(call: _Call, attrs: dict[str, Any], end: int, error: BaseException | None) -> None:
    span = call.span
    for key in (GEN_AI_RESPONSE_MODEL, GEN_AI_INPUT_TOKENS, GEN_AI_OUTPUT_TOKENS):
        if key in attrs:
            span.set_attribute(key, attrs[key])
    if call.stream and call.first_ns is not None:
        span.set_attribute(_TIME_TO_FIRST_CHUNK, (call.first_ns - call.start_ns) / 1e9)
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute(ERROR_TYPE, type(error).__qualname__)
        span.set_status(Status(StatusCode.ERROR))
    span.end(end_time=end)
