"""The anthropic client hook: each Messages call of a request as `provider` (to the first token) and `model` (decode) segments.

What a call is, and how it is recorded, is the openai hook's (`_sdk`, `_llm`), with
`gen_ai.provider.name` "anthropic" and operation `chat`. A streamed call is a `provider`
segment from just before the request is built and sent until the first `content_block_delta`
event (text, a tool use's `input_json_delta`, thinking) or the end of the stream, then a
`model` segment until the stream ends; `message_start` carries the model and the input tokens,
`message_delta` the output tokens. A non-streamed call is one `provider` segment with
`latprof.ttft_known: false`, its model and usage read off the returned `Message`. The
client's own backoff sleeps are `retry` segments ("anthropic retry") inside the `provider`
segment, with the status code that caused them.

Patch points, each wrapped once and only on the class that defines it (`uninstall()` restores):

- `create` of `Messages` / `AsyncMessages` (`anthropic.resources.messages.messages`): the
  public entry of a call, where the model and `stream` are plain arguments;
  `with_raw_response` / `with_streaming_response` go through it; and `parse` (structured
  output, never streamed) where the client has it.
- `stream` of the same classes: the `messages.stream()` helper sends its request only when its
  manager is entered; the manager's request is replaced by one that records the call there.
- the returned `Stream` / `AsyncStream` (`anthropic._streaming`) is the same object: only its
  private `_iterator` is replaced by a pass-through that looks at each event as the caller
  (or the `MessageStream` helper) reads it; `close` ends a stream left early at the last event
  read (else the garbage collector does); `__init__` only for `with_raw_response` streams.
- `SyncAPIClient._sleep_for_retry` / `AsyncAPIClient._sleep_for_retry` (`anthropic._base_client`).

No OpenTelemetry span of the hook's own when the client writes one per call itself
(`anthropic._tracing`: 1.17 and 2.x have it, 1.0 has not; `anthropic.messages.create`, which `tracemap` reads);
older clients get the openai hook's CLIENT span. The beta resources (`client.beta.messages`)
are not patched: the httpx hook records their calls as raw LLM calls (split at the first delta
too, without the client's retries). Outside a request nothing is recorded, and every error of
the hook is counted, never raised.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

from latprof.collectors.hooks import _llm, _scaffold, _sdk, runtime

HOOK = "anthropic"

SDK = _sdk.Sdk(HOOK, "anthropic")
RETRY_SEGMENT = SDK.retry_segment
_now = _sdk._now


def _observe_event(call: _sdk.SdkCall, event: Any) -> None:
    """One event of a Messages stream: a content delta is a token; message_start and message_delta carry the usage."""
    now = _now()
    call.last_ns = now
    kind = event.type
    if kind == "content_block_delta":
        call.chunks += 1  # call.token(now), inlined
        if call.first_ns is None:
            call.first_ns = now
    elif kind == "message_start":  # its output_tokens is a placeholder: the count comes with message_delta
        message = event.message
        call.note(message.model, None)
        input_tokens, _ = _llm.usage_counts(message.usage)
        if input_tokens is not None:
            call.input_tokens = input_tokens
    elif kind == "message_delta":
        call.note(None, event.usage)


def _patch_base_client(module: Any) -> None:
    SDK.spans = "anthropic._tracing" not in sys.modules  # the client's own span per call (imported by _base_client)
    SDK.patch_base_client(module)


def _patch_messages(module: Any) -> None:
    SDK.patch_calls(module.Messages, module.AsyncMessages, ("create", "parse"), _observe_event)  # parse: newer clients
    SDK.scaffold.wrap(module.Messages, "stream", _sync_stream_helper)
    SDK.scaffold.wrap(module.AsyncMessages, "stream", _async_stream_helper)


def _stream_helper(original: Callable[..., Any], recorded: Callable[..., Any]) -> Callable[..., Any]:
    """`stream()` whose manager sends its request through `recorded(resource, kwargs, request)`."""

    def stream(self: Any, *args: Any, **kwargs: Any) -> Any:
        manager = original(self, *args, **kwargs)
        try:  # name-mangled: (Async)MessageStreamManager.__api_request
            (attribute,) = [name for name in vars(manager) if name.endswith("MessageStreamManager__api_request")]
            setattr(manager, attribute, recorded(self, kwargs, getattr(manager, attribute)))
        except Exception as exc:
            runtime.count_error(HOOK, exc)
        return manager

    return stream


def _sync_stream_helper(original: Callable[..., Any]) -> Callable[..., Any]:
    # The sync manager holds a function it calls when entered.
    return _stream_helper(original, lambda resource, kwargs, request: functools.partial(
        _sdk.run_sync, SDK, resource, kwargs, _observe_event, request, stream=True))  # fmt: skip


def _async_stream_helper(original: Callable[..., Any]) -> Callable[..., Any]:
    # The async manager holds the request's coroutine, awaited when entered.
    return _stream_helper(original, lambda resource, kwargs, request: _sdk.run_async(
        SDK, resource, kwargs, _observe_event, lambda: request, stream=True))  # fmt: skip


_T = _scaffold.Target
_TESTED = [_scaffold.Tested("anthropic", "1", "2")]  # the README's and nox's lines
#: What the hook patches, each part when (if ever) its module is imported.
scaffold = _scaffold.Hook(HOOK, [
    _scaffold.Library("anthropic._streaming", [
        _T("anthropic._streaming", "Stream", "__init__"), _T("anthropic._streaming", "AsyncStream", "__init__"),
        _T("anthropic._streaming", "Stream", "close"), _T("anthropic._streaming", "AsyncStream", "close"),
    ], SDK.patch_streaming, _TESTED),
    _scaffold.Library("anthropic._base_client", [
        _T("anthropic._base_client", "SyncAPIClient", "_sleep_for_retry"),
        _T("anthropic._base_client", "AsyncAPIClient", "_sleep_for_retry"),
    ], _patch_base_client, _TESTED),
    _scaffold.Library("anthropic.resources.messages.messages", [
        _T("anthropic.resources.messages.messages", "Messages", "create"),
        _T("anthropic.resources.messages.messages", "AsyncMessages", "create"),
        _T("anthropic.resources.messages.messages", "Messages", "stream"),
        _T("anthropic.resources.messages.messages", "AsyncMessages", "stream"),
    ], _patch_messages, _TESTED),
], SDK.reset)  # fmt: skip
SDK.scaffold = scaffold
#: Patch the anthropic client when (or if already) imported; idempotent.
install = scaffold.install
#: Put every patched attribute back (tests); calls already in flight still finish.
uninstall = scaffold.uninstall


def late_coverage() -> str:
    """What the hook sees, and misses, when installed into a process that is already serving."""
    return _sdk.late_coverage(SDK, "anthropic")
