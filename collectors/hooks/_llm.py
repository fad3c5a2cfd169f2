"""One LLM call, as the openai, anthropic, httpx and aiohttp_client hooks record it: first token, provider/model split, usage.

Not a hook itself. The openai and anthropic hooks see a call through the SDK's objects (`_sdk`), the HTTP hooks
through its raw bytes (`_outbound`); what a call is, and how it is recorded, is the same:

- **First token.** A streamed call's first token is its first chunk with any non-empty delta
  (a chat chunk's `choices[].delta` content, tool calls, refusal or reasoning — `DELTA_FIELDS`;
  a legacy completion's `text`; a Responses `*.delta` event; an Anthropic
  `content_block_delta`), counted by `LlmCall.token`. Snapshots (`RESPONSE_SNAPSHOTS`,
  Anthropic's `message_start`) carry the model and usage, never a token.
- **Provider/model split** (`LlmCall.record`): a streamed call that saw a token is `provider`
  up to it, then `model` to the end, both with the same attributes; any other call is one
  `provider` segment. `latprof.ttft_known` (`ttft_known`) is true when a token came, or when
  the stream ran to its end without one; the analysis splits the rest later.
- **Usage** (`LlmCall.note`): the model that answered, and the token counts of a Chat
  (`prompt_tokens`/`completion_tokens`) or Responses/Anthropic (`input_tokens`/`output_tokens`)
  usage, object or dict, from what the caller read; never requested on its behalf.
- **Retries** of the SDK's own backoff are the openai and anthropic hooks' `retry` segments, inside the
  call's `provider` segment; a raw HTTP call's retries are the service's own calls and sleeps.
- **Network** (`net`, filled by `_net` while `timed_call` holds the call): the last HTTP
  attempt's DNS, connect, TLS, upload and server time, on the `provider` segment only.
- **Counted once** (`in_sdk_call`): while an SDK hook records a call, the HTTP hooks
  record only its pool wait, not the HTTP request the SDK sends for it.
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any

from latprof.collectors.hooks import runtime
from latprof.layers import MODEL, PROVIDER
from latprof.semconv import GEN_AI_INPUT_TOKENS, GEN_AI_OUTPUT_TOKENS, GEN_AI_RESPONSE_MODEL, OUTPUT_CHUNKS

#: Set while the openai hook records a call: a patched method that calls another records one
#: call, not two, and the HTTP hooks leave the call's HTTP request to it.
in_sdk_call: contextvars.ContextVar[bool] = contextvars.ContextVar("latprof_openai_in_call", default=False)

#: Set while a hook records an LLM call whose HTTP attempts the HTTP hooks can time (`_net`): the
#: call, whose `net` the client's connection events fill.
timed_call: contextvars.ContextVar[LlmCall | None] = contextvars.ContextVar("latprof_llm_timed_call", default=None)

#: Delta fields of a chat chunk that carry output (vLLM and DeepSeek stream reasoning in the last two).
DELTA_FIELDS = ("content", "tool_calls", "refusal", "function_call", "reasoning_content", "reasoning")
#: Responses stream events that carry the whole response so far (its model and usage), no token.
RESPONSE_SNAPSHOTS = frozenset(
    {"response.created", "response.in_progress", "response.completed", "response.incomplete", "response.failed"}
)


class LlmCall:
    """What a hook knows of one LLM call's answer: its first token, output chunks, model and usage.

    Each hook's own call class extends it (with its start, parent, and what it reads from).
    The per-chunk hot paths do what `token` does inline.
    """

    __slots__ = ("first_ns", "chunks", "input_tokens", "output_tokens", "response_model", "net")

    def __init__(self) -> None:
        self.net: dict[str, Any] | None = None  # the last HTTP attempt's network timings (`_net`), for the provider segment
        self.first_ns: int | None = None
        self.chunks = 0
        self.input_tokens: Any = None
        self.output_tokens: Any = None
        self.response_model: str | None = None

    def token(self, now: int) -> None:
        """A chunk with output arrived at `now`; the first ends the `provider` segment."""
        self.chunks += 1
        if self.first_ns is None:
            self.first_ns = now

    def note(self, model: Any, usage: Any) -> None:
        """The answer says which model answered and (when asked for) its usage; either may be None."""
        if isinstance(model, str) and model:
            self.response_model = model
        if usage is not None:
            input_tokens, output_tokens = usage_counts(usage)
            if input_tokens is not None:
                self.input_tokens = input_tokens
            if output_tokens is not None:
                self.output_tokens = output_tokens

    def record(
        self, state: runtime.RequestState, parent: Any, name: str, attrs: dict[str, Any], start_ns: int, end_ns: int,
        *, streamed: bool, segment_id: str | None = None,
    ) -> None:  # fmt: skip
        """Record the call's `provider` segment (`segment_id`), and its `model` segment after a first token.

        `attrs` (the hook's own: operation, provider, call id, `ttft_known`, HTTP, error) get the
        model, the token counts and, for a stream, the output chunks; both segments share them.
        """
        if self.response_model:
            attrs[GEN_AI_RESPONSE_MODEL] = self.response_model
        if self.input_tokens is not None:
            attrs[GEN_AI_INPUT_TOKENS] = self.input_tokens
        if self.output_tokens is not None:
            attrs[GEN_AI_OUTPUT_TOKENS] = self.output_tokens
        if streamed:
            attrs[OUTPUT_CHUNKS] = self.chunks
        first = self.first_ns if streamed else None
        runtime.record(name, PROVIDER, start_ns, first if first is not None else end_ns, {**attrs, **self.net} if self.net else attrs,
                       parent_id=parent, segment_id=segment_id, state=state)  # fmt: skip
        if first is not None:
            runtime.record(name, MODEL, first, max(first, end_ns), attrs, parent_id=parent, state=state)


def ttft_known(streamed: bool, first_ns: int | None, ran_to_its_end: bool) -> bool:
    """Whether the call's time to first token is measured: a token came, or the stream ended without one."""
    return streamed and (first_ns is not None or ran_to_its_end)


def usage_counts(usage: Any) -> tuple[int | None, int | None]:
    """(input, output) tokens of a Chat (`prompt_tokens`) or Responses (`input_tokens`) usage, object or dict; None when not a count."""
    get = usage.get if isinstance(usage, dict) else functools.partial(getattr, usage)
    input_tokens = get("prompt_tokens", None)
    if input_tokens is None:
        input_tokens = get("input_tokens", None)
    output_tokens = get("completion_tokens", None)
    if output_tokens is None:
        output_tokens = get("output_tokens", None)
    return _count(input_tokens), _count(output_tokens)


def _count(value: Any) -> int | None:
    """A token count as a whole number >= 0, else None: the answer's usage is written to the
    capture, and an answer may carry anything there (a string would be written as it came)."""
    if type(value) is int:
        return value if value >= 0 else None
    if type(value) is float and value.is_integer() and value >= 0:
        return int(value)
    return None


def loads(content: bytes) -> Any:
    """The JSON value of `content`, or None when it is not JSON (or orjson is missing)."""
    try:
        import orjson

        return orjson.loads(content)
    except Exception:
        return None
