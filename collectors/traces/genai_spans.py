"""What each GenAI instrumentation calls an LLM call's parts: the tables `tracemap` reads model spans by.

Four instrumentations of the openai client name the same things differently (docs/genai.md
has the versions checked):

- OpenTelemetry's `opentelemetry-instrumentation-openai-v2` (GenAI semantic conventions):
  `gen_ai.operation.name`, `gen_ai.usage.*_tokens`, and `gen_ai.response.time_to_first_chunk`
  (seconds) once `opentelemetry-util-genai` records it on the span (1.3b0); before that the
  first chunk is a metric only;
- OpenLLMetry's `opentelemetry-instrumentation-openai` (traceloop): GenAI names too (older
  releases `llm.request.type` and `gen_ai.usage.prompt_tokens`/`completion_tokens`), and one
  `gen_ai.content.completion.chunk` span event per streamed chunk (older: `llm.content.completion.chunk`);
- OpenInference's `openinference-instrumentation-openai` (Arize Phoenix): `openinference.span.kind`
  LLM, `llm.model_name`, `llm.token_count.prompt`/`completion`, and a `First Token Stream Event`;
- the anthropic client's own spans (1.17 and 2.x, `anthropic.messages.create`) and OpenLLMetry's
  anthropic instrumentation (`anthropic.chat`) use the GenAI names too: the first, a stream's
  `gen_ai.response.time_to_first_chunk`; the second, no first chunk at all (`ttft_known: false`);
- LiteLLM's own `otel` callback (scope `litellm`): GenAI names on a `litellm_request` span, no
  first-token time (a metric only); its `raw_gen_ai_request` child holds the raw request and
  answer, and is dropped whole (`is_raw_payload`);
- Logfire's `logfire.instrument_openai()`: GenAI names on a request span that, for a streamed
  call, ends when the response object is returned; the stream itself is a log record (a
  zero-length span, `logfire.span_type` log) at the stream's end with its `duration` in seconds.

A first chunk that carries no content (a role-only chunk) counts as the first token for
OpenLLMetry and OpenInference: their events do not say what the chunk held.

Prompts and completions, which some of them record by default, are never copied onto a
segment (`CONTENT_KEYS`): a report must not carry them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from latprof.semconv import GEN_AI_INPUT_TOKENS, GEN_AI_OPERATION_NAME, GEN_AI_OUTPUT_TOKENS, GEN_AI_REQUEST_MODEL, GEN_AI_RESPONSE_MODEL
from latprof.collectors.traces.spans import Span

#: genai_kind(): a model call (provider, then model), a tool call, a wrapper that owns no time.
MODEL_CALL = "model-call"
TOOL_CALL = "tool-call"
WRAPPER = "wrapper"

#: str on a GenAI model segment: which instrumentation's names it was read by.
INSTRUMENTATION = "latprof.genai.instrumentation"
#: The attribute the GenAI semantic conventions record the first chunk's time under (seconds after the start).
GEN_AI_TTFT = "gen_ai.response.time_to_first_chunk"


@dataclass(frozen=True)
class GenAINames:
    """One instrumentation's names for an LLM call's model, token counts and first token."""

    #: Short name, written on the segment as `latprof.genai.instrumentation`.
    name: str
    #: Attributes naming the model, first found wins.
    model: tuple[str, ...]
    input_tokens: tuple[str, ...]
    output_tokens: tuple[str, ...]
    #: Attributes holding the time to first token in seconds after the span's start.
    ttft_s: tuple[str, ...] = ()
    #: Span events whose first occurrence marks the first token (or first chunk).
    first_token_events: tuple[str, ...] = ()


OTEL_GENAI = GenAINames(
    name="opentelemetry-genai",
    model=(GEN_AI_REQUEST_MODEL, GEN_AI_RESPONSE_MODEL),
    input_tokens=(GEN_AI_INPUT_TOKENS,),
    output_tokens=(GEN_AI_OUTPUT_TOKENS,),
    ttft_s=(GEN_AI_TTFT,),
)
OPENLLMETRY = GenAINames(
    name="openllmetry",
    model=(GEN_AI_REQUEST_MODEL, GEN_AI_RESPONSE_MODEL),
    input_tokens=(GEN_AI_INPUT_TOKENS, "gen_ai.usage.prompt_tokens", "llm.usage.prompt_tokens"),
    output_tokens=(GEN_AI_OUTPUT_TOKENS, "gen_ai.usage.completion_tokens", "llm.usage.completion_tokens"),
    ttft_s=(GEN_AI_TTFT,),
    first_token_events=("gen_ai.content.completion.chunk", "llm.content.completion.chunk"),
)
OPENINFERENCE = GenAINames(
    name="openinference",
    model=("llm.model_name", GEN_AI_REQUEST_MODEL),
    input_tokens=("llm.token_count.prompt",),
    output_tokens=("llm.token_count.completion",),
    first_token_events=("First Token Stream Event",),
)
#: LiteLLM's `otel` callback (scope `litellm`): GenAI names on its `litellm_request` span (also OpenLLMetry's
#: `llm.request.type`), no first-token time (a metric only).
LITELLM = GenAINames(
    name="litellm",
    model=(GEN_AI_REQUEST_MODEL, GEN_AI_RESPONSE_MODEL),
    input_tokens=(GEN_AI_INPUT_TOKENS,),
    output_tokens=(GEN_AI_OUTPUT_TOKENS,),
    ttft_s=(GEN_AI_TTFT,),
)
#: (scope, name) of LiteLLM's `raw_gen_ai_request` span: the raw request and answer as `llm.<provider>.<field>`
#: attributes (`llm.openai.messages`, `llm.openai.choices`), content only; dropped whole (`is_raw_payload`).
LITELLM_RAW_PAYLOAD = ("litellm", "raw_gen_ai_request")
LOGFIRE = GenAINames(
    name="logfire",
    model=(GEN_AI_REQUEST_MODEL, GEN_AI_RESPONSE_MODEL),
    input_tokens=(GEN_AI_INPUT_TOKENS,),
    output_tokens=(GEN_AI_OUTPUT_TOKENS,),
    ttft_s=(GEN_AI_TTFT,),
)

_MODEL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content", "embeddings"})
_TOOL_OPERATIONS = frozenset({"execute_tool", "retrieval"})
_WRAPPER_OPERATIONS = frozenset({"invoke_agent", "create_agent", "invoke_workflow"})
#: OpenLLMetry's `llm.request.type` (before it wrote `gen_ai.operation.name`).
_OPENLLMETRY_MODEL_TYPES = frozenset({"chat", "completion", "embedding", "rerank"})
#: OpenInference's `openinference.span.kind` values.
_OPENINFERENCE_KINDS: Mapping[str, str] = {
    "LLM": MODEL_CALL, "EMBEDDING": MODEL_CALL,
    "TOOL": TOOL_CALL, "RETRIEVER": TOOL_CALL, "RERANKER": TOOL_CALL,
    "AGENT": WRAPPER, "CHAIN": WRAPPER, "GUARDRAIL": WRAPPER, "EVALUATOR": WRAPPER,
}  # fmt: skip

#: Attribute names (and prefixes, ending in "." or "_") that hold prompts, completions, tool
#: definitions or request/response bodies: never copied onto a segment.
CONTENT_KEYS: tuple[str, ...] = (
    "gen_ai.prompt", "gen_ai.completion", "gen_ai.input.messages", "gen_ai.output.messages",
    "gen_ai.system_instructions", "gen_ai.tool.definitions", "gen_ai.tool.call.arguments", "gen_ai.tool.call.result",
    "input.value", "output.value", "llm.input_messages", "llm.output_messages", "llm.prompts", "llm.prompt_template",
    "llm.tools", "llm.invocation_parameters", "embedding.embeddings", "retrieval.documents", "message.",
    "traceloop.entity.input", "traceloop.entity.output", "request_data", "response_data", "events",
    "logfire.msg", "logfire.json_schema", "anthropic.tool_result.content",
)  # fmt: skip


def is_raw_payload(span: Span) -> bool:
    """True for a span that holds nothing but a raw request and answer (LiteLLM's `raw_gen_ai_request`)."""
    return span.name == LITELLM_RAW_PAYLOAD[1] and span.scope == LITELLM_RAW_PAYLOAD[0]


def is_content(key: str) -> bool:
    """True for an attribute that may hold a prompt, a completion or a request/response body."""
    return key.startswith(CONTENT_KEYS)


#: The attributes one of which every GenAI span of the four carries (`genai_kind` reads them).
MARKS = (GEN_AI_OPERATION_NAME, "openinference.span.kind", "llm.request.type")


def genai_kind(attrs: Mapping[str, Any]) -> str | None:
    """`MODEL_CALL`, `TOOL_CALL` or `WRAPPER` for a GenAI span of any of the four instrumentations, else None."""
    operation = attrs.get(GEN_AI_OPERATION_NAME)
    if operation is not None:
        if operation in _MODEL_OPERATIONS:
            return MODEL_CALL
        if operation in _TOOL_OPERATIONS:
            return TOOL_CALL
        if operation in _WRAPPER_OPERATIONS:
            return WRAPPER
    span_kind = attrs.get("openinference.span.kind")
    if isinstance(span_kind, str) and span_kind.upper() in _OPENINFERENCE_KINDS:
        return _OPENINFERENCE_KINDS[span_kind.upper()]
    if attrs.get("llm.request.type") in _OPENLLMETRY_MODEL_TYPES:
        return MODEL_CALL
    return None


#: Scopes of OpenLLMetry's instrumentations of the openai and anthropic clients (openai-v2's is `...openai_v2`).
_OPENLLMETRY_SCOPES = ("opentelemetry.instrumentation.openai.", "opentelemetry.instrumentation.anthropic")


def names_of(span: Span) -> GenAINames:
    """The table `span` is read by: by its instrumentation scope, else by the attributes it carries."""
    scope = span.scope
    attrs = span.attrs
    if scope.startswith("openinference.") or "openinference.span.kind" in attrs:
        return OPENINFERENCE
    if scope.startswith("logfire") or "logfire.span_type" in attrs:
        return LOGFIRE
    if scope == LITELLM_RAW_PAYLOAD[0]:  # before OpenLLMetry: LiteLLM writes its `llm.request.type` too
        return LITELLM
    if scope.startswith(_OPENLLMETRY_SCOPES) or "llm.request.type" in attrs or "gen_ai.is_streaming" in attrs:
        return OPENLLMETRY  # its scope is `opentelemetry.instrumentation.openai.v1`; openai-v2's is util.genai's or `...openai_v2`
    return OTEL_GENAI


@dataclass(frozen=True)
class LLMCall:
    """An LLM call read off a GenAI model span, in latprof's names."""

    start_ns: int
    end_ns: int
    #: When the first token (or chunk) arrived; None when the span does not say.
    first_token_ns: int | None
    #: The span's attributes without content, plus `gen_ai.request.model` and `gen_ai.usage.*_tokens` in latprof's names.
    attrs: Mapping[str, Any]
    #: True for a request span that ends when a stream's response object is returned (Logfire):
    #: time before the stream, not a whole call; the stream is a span of its own.
    stream_request: bool = False
    #: True when the span's first-token events recur (a chunk event per chunk) and the tracer dropped
    #: events: it keeps the latest, so the earliest left is not the first, and the first token is unknown.
    first_token_lost: bool = False


def _first(attrs: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        value = attrs.get(name)
        if value is not None and value != "":
            return value
    return None


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def read_llm_call(span: Span) -> LLMCall:
    """`span` (a `MODEL_CALL` span) as an `LLMCall`, read by its instrumentation's table (`names_of`).

    The first token is the instrumentation's TTFT attribute when it lies within the span, else
    its first first-token event within the span - unless the tracer dropped events (over its
    limit: OpenLLMetry records one per chunk, 128 are kept, the latest) and that event recurs,
    when the earliest left is not the first (`LLMCall.first_token_lost`). A Logfire stream log (zero-length, at the
    stream's end, with `duration`) becomes the stream's time: from `duration` before it to it.
    """
    names = names_of(span)
    attrs = span.attrs
    start, end = span.start_ns, span.end_ns
    stream_request = False
    if names is LOGFIRE:
        duration_s = _seconds(attrs.get("duration"))
        if attrs.get("logfire.span_type") == "log" and duration_s is not None and duration_s >= 0:
            start = end - int(duration_s * 1e9)
        elif attrs.get("logfire.span_type") == "span" and _first(attrs, names.output_tokens) is None and "gen_ai.response.id" not in attrs:
            stream_request = True  # its stream is the log record that follows
    first: int | None = None
    lost = False
    ttft_s = _seconds(_first(attrs, names.ttft_s))
    if ttft_s is not None and 0 <= ttft_s * 1e9 <= end - start:
        first = start + int(ttft_s * 1e9)
    elif names.first_token_events:
        marks = [e.ts_ns for e in span.events if e.name in names.first_token_events and start <= e.ts_ns <= end]
        if span.dropped_events and len(marks) > 1:
            lost = True
        else:
            first = min(marks) if marks else None
    out = {key: value for key, value in attrs.items() if not is_content(key)}
    model = _first(attrs, names.model)
    if model is not None:
        out.setdefault(GEN_AI_REQUEST_MODEL, model)
    for target, sources in ((GEN_AI_INPUT_TOKENS, names.input_tokens), (GEN_AI_OUTPUT_TOKENS, names.output_tokens)):
        value = _first(attrs, sources)
        if value is not None:
            out[target] = value
    out[INSTRUMENTATION] = names.name
    return LLMCall(start, end, first, out, stream_request, lost)
