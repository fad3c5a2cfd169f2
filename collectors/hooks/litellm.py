"""The LiteLLM hook: each `litellm.completion` / `acompletion` call of a request as one LLM call, `provider` then `model`.

A call is timed from the public entry the service called to the end of its answer, and split
as every LLM call is (`_llm`): streamed, `provider` until the first chunk LiteLLM's stream
yields with any non-empty delta (`_llm.DELTA_FIELDS`: content, tool calls, refusal,
reasoning), then `model` until the stream ends, both with `latprof.ttft_known: true`; not
streamed, one `provider` segment with `latprof.ttft_known: false` (the analysis splits it).
Each segment names the operation (`chat`), the provider as LiteLLM resolved it
(`custom_llm_provider`, from the answer, the stream or the error; `gen_ai.provider.name` in
the GenAI conventions' spelling where it has one, `PROVIDER_NAMES`, else LiteLLM's own, such
as `hosted_vllm`), the requested model without LiteLLM's provider prefix, the answering
model, the API base's host, the token counts of the usage the caller received (never asked
for on its behalf) and, streamed, the output chunks.

Counted once: while LiteLLM runs a recorded call `_llm.in_sdk_call` is set, so the openai
hook (LiteLLM sends OpenAI-compatible calls through the openai client's `post`) and the HTTP
hooks do not record the call again; the HTTP hooks keep only the pool wait, and the call's
network timings when they take them (`_llm.timed_call`). Calls LiteLLM makes inside a call
(its `num_retries` attempts, `acompletion` running `completion` in a thread) are the same
call. Retries: what runs inside a call nests under its `provider` segment, so the openai
client's backoff (`openai retry`) and tenacity's sleeps of LiteLLM's `num_retries` with
exponential backoff (the `sleeps` hook) are `retry` segments inside it; LiteLLM's default
`constant_retry` resends at once, with no backoff to record: its failed attempts are
`provider` time of the one call.

Patch points (`uninstall()` restores them):

- `completion` and `acompletion` of `litellm.chat_completions.dispatch`: the public entries
  (`litellm.completion` is one), where LiteLLM chooses between its Python implementation
  (`litellm.main`) and its native one; and the same two names wherever a module imported
  before the hook bound them (`litellm`'s own namespace, `from litellm import completion`).
  A `completion(..., acompletion=True)` is recorded when its coroutine runs.
- `CustomStreamWrapper.__next__` / `__anext__` (`litellm.litellm_core_utils.streaming_handler`),
  for the streams of recorded calls only (looked up by the stream's id, the rest pass
  through); `close` / `aclose` end a stream left early at the last chunk read, else its
  collection does.

Tested on LiteLLM 1.110. Outside a request nothing is recorded, and every error of the hook is
counted, never raised.
"""

from __future__ import annotations

import importlib
import time
import urllib.parse
import weakref
from typing import Any, Callable

from latprof import semconv
from latprof.collectors.hooks import _llm, _scaffold, runtime
from latprof.semconv import (
    GEN_AI_OPERATION_NAME,
    GEN_AI_PROVIDER_NAME,
    GEN_AI_REQUEST_MODEL,
    HTTP_STATUS_CODE,
    LLM_CALL_ID,
    SERVER_ADDRESS,
    TTFT_KNOWN,
)

HOOK = "litellm"
OPERATION = "chat"

#: LiteLLM's provider names (`custom_llm_provider`) whose GenAI-conventions name differs; the
#: others are recorded as LiteLLM names them.
PROVIDER_NAMES = {
    "text-completion-openai": "openai", "azure": "azure.ai.openai", "azure_text": "azure.ai.openai",
    "azure_ai": "azure.ai.inference", "bedrock": "aws.bedrock", "vertex_ai": "gcp.vertex_ai",
    "vertex_ai_beta": "gcp.vertex_ai", "gemini": "gcp.gemini", "cohere_chat": "cohere", "mistral": "mistral_ai",
    "xai": "x_ai", "watsonx": "ibm.watsonx.ai",
}  # fmt: skip

_DISPATCH = "litellm.chat_completions.dispatch"
_STREAMING = "litellm.litellm_core_utils.streaming_handler"
_ENTRIES = ("completion", "acompletion")

_now = time.time_ns
#: id() of a stream of a recorded call -> the call, until the call is recorded.
_streams: dict[int, _Call] = {}
_stream_class: tuple[type, ...] = ()


def _patch(package: Any) -> None:
    global _stream_class
    dispatch = importlib.import_module(_DISPATCH)
    originals = {name: vars(dispatch)[name] for name in _ENTRIES}
    scaffold.wrap(dispatch, "completion", _sync_entry)
    scaffold.wrap(dispatch, "acompletion", _async_entry)
    # `litellm.completion` and any `from litellm import completion` made before the hook.
    scaffold.replace_aliases({name: (original, vars(dispatch)[name]) for name, original in originals.items()})
    stream = importlib.import_module(_STREAMING).CustomStreamWrapper
    _stream_class = (stream,)
    scaffold.wrap(stream, "__next__", _next)
    scaffold.wrap(stream, "__anext__", _anext)
    scaffold.wrap(stream, "close", _close)
    scaffold.wrap(stream, "aclose", _aclose)


def _reset() -> None:
    global _stream_class
    _stream_class = ()
    _streams.clear()  # (their calls still end when their stream is collected)


_T = _scaffold.Target
_TESTED = [_scaffold.Tested("litellm", "1.110", "1.110")]  # nox -s litellm
#: What the hook patches, once the `litellm` package is imported (its `__init__` imports them all).
scaffold = _scaffold.Hook(HOOK, [
    _scaffold.Library("litellm", [
        _T(_DISPATCH, "", "completion", False), _T(_DISPATCH, "", "acompletion", True),
        _T(_STREAMING, "CustomStreamWrapper", "__next__"), _T(_STREAMING, "CustomStreamWrapper", "__anext__", True),
        _T(_STREAMING, "CustomStreamWrapper", "close"), _T(_STREAMING, "CustomStreamWrapper", "aclose", True),
    ], _patch, _TESTED),
], _reset)  # fmt: skip
#: Patch LiteLLM when (or if already) imported; idempotent.
install = scaffold.install
#: Put every patched attribute back (tests); calls already in flight still finish.
uninstall = scaffold.uninstall


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""
    return scaffold.late_coverage(
        lambda: scaffold.loaded("LiteLLM")
        + ": calls started after the injection are seen, also through names bound before it (`from litellm import"
        " completion`), except names bound to them by other means (a dict of functions, functools.partial); streams"
        " already being read are not"
    )


# --- one LLM call ------------------------------------------------------------------------------


class _Call(_llm.LlmCall):
    """One call through LiteLLM (its answer: `_llm.LlmCall`); `with call:` around the entry, then `returned`."""

    __slots__ = (
        "state", "parent_id", "provider_id", "call_id", "model", "provider", "api_base", "stream", "start_ns",
        "last_ns", "done", "stream_id", "tokens",
    )  # fmt: skip

    def __init__(self, state: runtime.RequestState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.start_ns = _now()
        _llm.LlmCall.__init__(self)
        self.state = state
        self.parent_id: str | None = runtime.current_parent()
        self.provider_id = runtime.new_id()
        self.call_id = runtime.new_id()
        self.model = _text(kwargs["model"] if "model" in kwargs else args[0] if args else None)
        self.provider = _text(kwargs.get("custom_llm_provider"))
        self.api_base = _text(kwargs.get("api_base") or kwargs.get("base_url"))
        self.stream = bool(kwargs.get("stream"))  # until the answer says (`returned`)
        self.last_ns = self.start_ns
        self.done = False
        self.stream_id = 0
        self.tokens: tuple[Any, Any, Any] | None = None

    def __enter__(self) -> _Call:
        """What runs inside the call nests under its `provider` segment and is not recorded as a call again."""
        timing = runtime.cost_begin()
        try:
            nest = runtime.nested_under(self.provider_id)
            nest.__enter__()
            self.tokens = (nest, _llm.in_sdk_call.set(True), _llm.timed_call.set(self))
        finally:
            runtime.cost_end(timing)
        return self

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        timing = runtime.cost_begin()
        try:
            if self.tokens is not None:
                nest, in_call, timed = self.tokens
                nest.__exit__(None, None, None)
                _llm.in_sdk_call.reset(in_call)
                _llm.timed_call.reset(timed)
        except Exception:  # left from another context: nothing to undo there
            pass
        finally:
            runtime.cost_end(timing)
        if error is not None:
            self.finish(error)

    def returned(self, result: Any) -> Any:
        """The entry returned `result` (given back unchanged): watch its stream, or record the call now."""
        watched = False
        timing = runtime.cost_begin()
        try:
            self.last_ns = _now()
            self.stream = isinstance(result, _stream_class)
            if self.stream:
                self._resolved(getattr(result, "custom_llm_provider", None))
                self.stream_id = id(result)
                _streams[self.stream_id] = self
                weakref.finalize(result, self.finish, abandoned=True, collected=True)
                watched = True
            else:  # a whole answer (also a stream LiteLLM read for the caller: `complete_response`)
                hidden = getattr(result, "_hidden_params", None)
                self._resolved(hidden.get("custom_llm_provider") if isinstance(hidden, dict) else None)
                self.note(getattr(result, "model", None), getattr(result, "usage", None))
        except Exception as exc:
            runtime.count_error(HOOK, exc)
            self.stream = watched  # a stream not watched is recorded as a call whose first token is unknown
        finally:
            runtime.cost_end(timing)
        if not watched:
            self.finish()
        return result

    def chunk(self, chunk: Any) -> None:
        """The caller received `chunk` of the call's stream."""
        timing = runtime.cost_begin()
        try:
            now = self.last_ns = _now()
            for choice in chunk.choices or ():
                delta = getattr(choice, "delta", None)
                if delta is not None and any(getattr(delta, field, None) for field in _llm.DELTA_FIELDS):
                    self.token(now)
                    break
            usage = getattr(chunk, "usage", None)  # only in the chunk the caller asked for (include_usage)
            if usage is not None or self.response_model is None:
                self.note(getattr(chunk, "model", None), usage)
        except Exception as exc:
            runtime.count_error(HOOK, exc)
        finally:
            runtime.cost_end(timing)

    def _resolved(self, provider: Any) -> None:
        if isinstance(provider, str) and provider:
            self.provider = provider

    def finish(self, error: BaseException | None = None, *, abandoned: bool = False, collected: bool = False) -> None:
        """Record the call (once): ending now, or at the last chunk read when `abandoned`.

        `collected`: called by the garbage collector, maybe while this thread holds the
        runtime's error lock: an error is then dropped, not counted, nor is the time timed.
        """
        if self.done:
            return
        self.done = True
        _streams.pop(self.stream_id, None)
        timing = 0 if collected else runtime.cost_begin()
        try:
            end = self.last_ns if abandoned else _now()
            if error is not None:
                self._resolved(getattr(error, "llm_provider", None))  # LiteLLM's exceptions say whose error it is
            model = _without_prefix(self.model, self.provider)
            attrs: dict[str, Any] = {
                GEN_AI_OPERATION_NAME: OPERATION, LLM_CALL_ID: self.call_id,
                TTFT_KNOWN: _llm.ttft_known(self.stream, self.first_ns, error is None and not abandoned),
            }  # fmt: skip
            if self.provider:
                attrs[GEN_AI_PROVIDER_NAME] = PROVIDER_NAMES.get(self.provider, self.provider)
            if model:
                attrs[GEN_AI_REQUEST_MODEL] = model
            host = _host(self.api_base)
            if host:
                attrs[SERVER_ADDRESS] = host
            if error is not None:
                attrs.update(_failure(error))
            parent = runtime.ROOT if self.parent_id is None else self.parent_id  # not the reading code's parent
            name = f"{OPERATION} {model or self.response_model or ''}".rstrip()
            self.record(self.state, parent, name, attrs, self.start_ns, end, streamed=self.stream, segment_id=self.provider_id)
            runtime.saw(HOOK)
        except Exception as exc:
            if not collected:
                runtime.count_error(HOOK, exc)
        finally:
            runtime.cost_end(timing)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _without_prefix(model: str | None, provider: str | None) -> str | None:
    """"openai/gpt-4o" -> "gpt-4o": the model the provider is asked for, without LiteLLM's routing prefix."""
    if model and provider and model.startswith(provider + "/"):
        return model[len(provider) + 1 :]
    return model


def _host(api_base: str | None) -> str | None:
    if not api_base:
        return None
    try:
        return urllib.parse.urlsplit(api_base).hostname or None
    except ValueError:
        return None


def _failure(error: BaseException) -> dict[str, Any]:
    """The error's type and, for an HTTP status error (LiteLLM's mirror the openai client's), its status."""
    status = getattr(error, "status_code", None)
    out: dict[str, Any] = {semconv.ERROR_TYPE: type(error).__qualname__}
    if isinstance(status, int) and not isinstance(status, bool):
        out[HTTP_STATUS_CODE] = status
    return out


def _begin(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call | None:
    """A call to record, or None: outside a request, inside another recorded call, or when the hook fails."""
    state = runtime.current_request()
    if state is None or not runtime.active() or _llm.in_sdk_call.get() or not scaffold.installed:
        return None
    timing = runtime.cost_begin()
    try:
        return _Call(state, args, kwargs)
    except Exception as exc:
        runtime.count_error(HOOK, exc)
        return None
    finally:
        runtime.cost_end(timing)


def _sync_entry(original: Callable[..., Any]) -> Callable[..., Any]:
    def completion(*args: Any, **kwargs: Any) -> Any:
        # completion(..., acompletion=True) hands back acompletion's coroutine: recorded when it runs
        call = None if kwargs.get("acompletion") else _begin(args, kwargs)
        if call is None:
            return original(*args, **kwargs)
        with call:
            result = original(*args, **kwargs)
        return call.returned(result)

    return completion


def _async_entry(original: Callable[..., Any]) -> Callable[..., Any]:
    async def acompletion(*args: Any, **kwargs: Any) -> Any:
        call = _begin(args, kwargs)
        if call is None:
            return await original(*args, **kwargs)
        with call:
            result = await original(*args, **kwargs)
        return call.returned(result)

    return acompletion


# --- streams -----------------------------------------------------------------------------------


def _next(original: Callable[..., Any]) -> Callable[..., Any]:
    def __next__(self: Any) -> Any:
        call = _streams.get(id(self)) if _streams else None
        if call is None:
            return original(self)
        try:
            chunk = original(self)
        except StopIteration:
            call.finish()
            raise
        except BaseException as exc:
            call.finish(exc)
            raise
        call.chunk(chunk)
        return chunk

    return __next__


def _anext(original: Callable[..., Any]) -> Callable[..., Any]:
    async def __anext__(self: Any) -> Any:
        call = _streams.get(id(self)) if _streams else None
        if call is None:
            return await original(self)
        try:
            chunk = await original(self)
        except StopAsyncIteration:
            call.finish()
            raise
        except BaseException as exc:
            call.finish(exc)
            raise
        call.chunk(chunk)
        return chunk

    return __anext__


def _left(stream: Any) -> None:
    """`stream` was closed: a call still reading it ends at its last chunk."""
    call = _streams.get(id(stream)) if _streams else None
    if call is not None:
        call.finish(abandoned=True)


def _close(original: Callable[..., Any]) -> Callable[..., Any]:
    def close(self: Any) -> Any:
        try:
            return original(self)
        finally:
            _left(self)

    return close


def _aclose(original: Callable[..., Any]) -> Callable[..., Any]:
    async def aclose(self: Any) -> Any:
        try:
            return await original(self)
        finally:
            _left(self)

    return aclose
