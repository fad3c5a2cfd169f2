"""Each GenAI instrumentation's names (latprof.collectors.traces.genai_spans) on hand-built spans shaped as they emit them.

The spans' names, attributes and events are those seen from the real instrumentations (docs/genai.md);
the end-to-end modules beside this one check them against the real packages.
"""

from __future__ import annotations

import itertools
from typing import Any

from latprof.collectors.traces import genai_spans, receive
from latprof.collectors.traces.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, Span, SpanEvent
from latprof.collectors.traces.tracemap import classify, map_spans
from latprof.events import Segment
from latprof.layers import MODEL, PROVIDER, TOOL

T0 = 1_790_000_000_000_000_000
_ids = itertools.count(1)
PROMPT = "CANARY prompt"


def ms(t: float) -> int:
    return T0 + int(t * 1_000_000)


def span(name: str, start: float, end: float, *, parent: Span | None = None, kind: int = KIND_INTERNAL, scope: str = "",
         events: tuple[SpanEvent, ...] = (), **attrs: Any) -> Span:  # fmt: skip
    return Span("a" * 32, f"{next(_ids):016x}", parent.span_id if parent else None, name, kind, ms(start), ms(end), "api", scope, attrs,
                events=events)  # fmt: skip


def llm_segments(*spans: Span) -> list[Segment]:
    root = span("POST /chat", 0, 2000, kind=KIND_SERVER, **{"http.route": "/chat"})
    spans = tuple(s._replace(parent_id=root.span_id) if s.parent_id is None else s for s in spans)
    events = map_spans([root, *spans])
    return [s for s in events.segments_by_request[root.trace_id] if s.layer in (PROVIDER, MODEL)]


def test_openinference_llm_span_is_split_at_its_first_token_event_and_its_names_read():
    llm = span("ChatCompletion", 10, 400, scope="openinference.instrumentation.openai",
               events=(SpanEvent("First Token Stream Event", ms(160)),),
               **{"openinference.span.kind": "LLM", "llm.model_name": "m1", "llm.token_count.prompt": 21,
                  "llm.token_count.completion": 6, "input.value": PROMPT, "llm.input_messages.0.message.content": PROMPT,
                  "output.value": "answer", "llm.output_messages.0.message.content": "answer"})  # fmt: skip
    provider, model = llm_segments(llm)
    assert (provider.layer, provider.start_ns, provider.end_ns, model.start_ns, model.end_ns) == (PROVIDER, ms(10), ms(160), ms(160), ms(400))
    assert model.attrs["gen_ai.request.model"] == "m1"
    assert (model.attrs["gen_ai.usage.input_tokens"], model.attrs["gen_ai.usage.output_tokens"]) == (21, 6)
    assert not any(genai_spans.is_content(k) for k in model.attrs) and PROMPT not in repr(model.attrs)


def test_openinference_kinds_tool_and_chain():
    assert classify(span("search", 0, 1, **{"openinference.span.kind": "TOOL"})) == TOOL
    assert classify(span("agent", 0, 1, **{"openinference.span.kind": "CHAIN"})) is None


def test_openllmetry_first_chunk_event_and_older_names():
    llm = span("openai.chat", 0, 300, kind=KIND_CLIENT, scope="opentelemetry.instrumentation.openai.v1",
               events=tuple(SpanEvent("llm.content.completion.chunk", ms(t)) for t in (250, 120, 260)),
               **{"llm.request.type": "chat", "gen_ai.request.model": "m1", "gen_ai.usage.prompt_tokens": 9,
                  "gen_ai.usage.completion_tokens": 3, "gen_ai.prompt.0.content": PROMPT, "gen_ai.completion.0.content": "x"})  # fmt: skip
    provider, model = llm_segments(llm)
    assert provider.end_ns == model.start_ns == ms(120)
    assert (model.attrs["gen_ai.usage.input_tokens"], model.attrs["gen_ai.usage.output_tokens"]) == (9, 3)
    assert PROMPT not in repr(model.attrs)


def test_openllmetry_chunk_events_the_tracer_dropped_leave_the_first_token_unknown():
    """OpenLLMetry records an event per chunk; over the SDK's limit (128) it keeps the latest, so the earliest
    left came mid-stream (a 240-token demo stream read a 1.2 s "TTFT" so): with dropped events, a recurring
    first-token event says nothing, and the call is split as a non-streamed one is. A single first-token event
    (OpenInference's) is still the first."""
    chunks = tuple(SpanEvent("gen_ai.content.completion.chunk", ms(t)) for t in range(150, 300, 10))
    attrs = {"llm.request.type": "chat", "gen_ai.request.model": "m1", "gen_ai.usage.completion_tokens": 240}
    llm = span("openai.chat", 0, 300, kind=KIND_CLIENT, scope="opentelemetry.instrumentation.openai.v1", events=chunks, **attrs)
    provider, model = llm_segments(llm)
    assert provider.end_ns == ms(150) and provider.attrs["latprof.ttft_known"] is True  # nothing dropped: the first
    lost = llm._replace(span_id=f"{next(_ids):016x}", dropped_events=113)
    [provider] = llm_segments(lost)
    assert (provider.start_ns, provider.end_ns, provider.attrs["latprof.ttft_known"]) == (ms(0), ms(300), False)
    root = span("POST /chat", 0, 2000, kind=KIND_SERVER)
    events = map_spans([root, lost._replace(parent_id=root.span_id)])
    assert any("1 LLM call span(s) lost their first chunk events" in w and "OTEL_SPAN_EVENT_COUNT_LIMIT" in w for w in events.warnings)
    single = span("ChatCompletion", 10, 400, scope="openinference.instrumentation.openai", events=(SpanEvent("First Token Stream Event", ms(160)),),
                  **{"openinference.span.kind": "LLM", "llm.model_name": "m1"})._replace(dropped_events=5)  # fmt: skip
    provider, _ = llm_segments(single)
    assert provider.end_ns == ms(160)


def test_gen_ai_time_to_first_chunk_attribute_splits_a_semconv_span():
    llm = span("chat m1", 0, 300, kind=KIND_CLIENT, scope="opentelemetry.util.genai.handler",
               **{"gen_ai.operation.name": "chat", "gen_ai.request.model": "m1", "gen_ai.response.time_to_first_chunk": 0.2,
                  "gen_ai.usage.output_tokens": 5, "gen_ai.input.messages": PROMPT})  # fmt: skip
    provider, model = llm_segments(llm)
    assert provider.end_ns == model.start_ns == ms(200) and model.attrs[genai_spans.INSTRUMENTATION] == "opentelemetry-genai"
    assert "gen_ai.input.messages" not in model.attrs


def test_a_call_without_a_first_token_is_provider_with_ttft_unknown():
    llm = span("chat m1", 0, 300, kind=KIND_CLIENT, **{"gen_ai.operation.name": "chat", "gen_ai.request.model": "m1", "gen_ai.usage.output_tokens": 5})
    [provider] = llm_segments(llm)
    assert provider.layer == PROVIDER and provider.attrs["latprof.ttft_known"] is False


def test_logfire_stream_is_its_request_span_then_the_stream_log():
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m1", "logfire.tags": ["LLM"], "request_data": '{"model":"m1"}',
             "gen_ai.input.messages": PROMPT}  # fmt: skip
    request = span("Chat Completion with {request_data[model]!r}", 0, 10, kind=KIND_CLIENT, scope="logfire.openai",
                   **{**attrs, "logfire.span_type": "span", "gen_ai.response.model": "m1"})  # fmt: skip
    log = span("streaming response from {request_data[model]!r} took {duration:.2f}s", 312, 312, scope="logfire.openai",
               **{**attrs, "logfire.span_type": "log", "duration": 0.3, "gen_ai.response.id": "c1", "gen_ai.usage.input_tokens": 20,
                  "gen_ai.usage.output_tokens": 6, "gen_ai.output.messages": "answer"})  # fmt: skip
    before, stream = sorted(llm_segments(request, log), key=lambda s: s.start_ns)
    assert (before.start_ns, before.end_ns) == (ms(0), ms(10)) and "latprof.ttft_known" not in before.attrs
    assert (stream.start_ns, stream.end_ns) == (ms(12), ms(312)) and stream.attrs["latprof.ttft_known"] is False
    assert stream.attrs["gen_ai.usage.output_tokens"] == 6
    assert not any(genai_spans.is_content(k) for s in (before, stream) for k in s.attrs)


def test_http_client_span_under_an_llm_span_without_operation_name_stays_transport():
    llm = span("ChatCompletion", 0, 300, **{"openinference.span.kind": "LLM", "llm.model_name": "m1"})
    http = span("POST", 5, 290, parent=llm, kind=KIND_CLIENT, **{"http.request.method": "POST", "url.full": "http://h/v1/chat/completions"})
    root = span("POST /chat", 0, 400, kind=KIND_SERVER, **{"http.route": "/chat"})
    llm = llm._replace(parent_id=root.span_id)
    segments = map_spans([root, llm, http]).segments_by_request[root.trace_id]
    assert [s.layer for s in segments if s.segment_id == http.span_id] == [None]
    assert [s.layer for s in segments if s.segment_id == llm.span_id] == [PROVIDER]


def test_openllmetry_anthropic_spans_are_model_calls_read_by_its_names_without_a_first_token():
    """As `opentelemetry-instrumentation-anthropic` 0.62.4 writes a streamed Messages call (and, older, with `gen_ai.system`,
    `llm.request.type` and prompt/completion token names): no first-chunk time or event, so TTFT is unknown."""
    current = span("anthropic.chat", 0, 400, kind=KIND_CLIENT, scope="opentelemetry.instrumentation.anthropic",
                   **{"gen_ai.provider.name": "anthropic", "gen_ai.operation.name": "chat", "gen_ai.request.model": "claude-x",
                      "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 30, "gen_ai.usage.total_tokens": 42,
                      "gen_ai.input.messages": PROMPT, "gen_ai.output.messages": "answer", "gen_ai.system_instructions": PROMPT})  # fmt: skip
    older = span("anthropic.chat", 0, 400, kind=KIND_CLIENT, scope="opentelemetry.instrumentation.anthropic",
                 **{"gen_ai.system": "Anthropic", "llm.request.type": "chat", "gen_ai.request.model": "claude-x",
                    "gen_ai.usage.prompt_tokens": 12, "gen_ai.usage.completion_tokens": 30, "gen_ai.prompt.0.content": PROMPT,
                    "gen_ai.completion.0.content": "answer"})  # fmt: skip
    for llm in (current, older):
        (provider,) = llm_segments(llm)
        assert (provider.layer, provider.start_ns, provider.end_ns) == (PROVIDER, ms(0), ms(400))
        assert provider.attrs["latprof.ttft_known"] is False and provider.attrs[genai_spans.INSTRUMENTATION] == "openllmetry"
        assert (provider.attrs["gen_ai.usage.input_tokens"], provider.attrs["gen_ai.usage.output_tokens"]) == (12, 30)
        assert PROMPT not in repr(provider.attrs) and "answer" not in repr(provider.attrs)


def test_litellm_request_span_is_a_model_call_and_its_raw_payload_span_is_dropped():
    """As LiteLLM 1.110's `otel` callback writes a call (test_litellm_otel.py drives it for real): a `litellm_request`
    span with GenAI names and OpenLLMetry's `llm.request.type`, no first-token time, and a `raw_gen_ai_request`
    child of the same length holding the raw request and answer as `llm.<provider>.<field>`."""
    llm = span("litellm_request", 10, 400, scope="litellm",
               **{"gen_ai.operation.name": "chat", "llm.request.type": "completion", "gen_ai.system": "openai",
                  "gen_ai.request.model": "m1", "llm.is_streaming": "False", "gen_ai.usage.input_tokens": 3,
                  "gen_ai.usage.output_tokens": 6, "gen_ai.input.messages": PROMPT, "gen_ai.output.messages": "answer"})  # fmt: skip
    raw = span("raw_gen_ai_request", 10, 400, parent=llm, scope="litellm",
               **{"llm.openai.messages": PROMPT, "llm.openai.choices": "answer", "llm.openai.model": "m1"})  # fmt: skip
    root = span("POST /chat", 0, 500, kind=KIND_SERVER, **{"http.route": "/chat"})
    llm = llm._replace(parent_id=root.span_id)
    raw = raw._replace(parent_id=llm.span_id)
    (provider,) = map_spans([root, llm, raw]).segments_by_request[root.trace_id]
    assert (provider.layer, provider.start_ns, provider.end_ns) == (PROVIDER, ms(10), ms(400))
    assert provider.attrs["latprof.ttft_known"] is False and provider.attrs[genai_spans.INSTRUMENTATION] == "litellm"
    assert (provider.attrs["gen_ai.usage.input_tokens"], provider.attrs["gen_ai.usage.output_tokens"]) == (3, 6)
    assert PROMPT not in repr(provider.attrs) and "answer" not in repr(provider.attrs)
    assert genai_spans.is_raw_payload(raw) and not genai_spans.is_raw_payload(raw._replace(scope="other"))
    written = receive.encode_request([root, llm, raw]).decode()  # what `latprof receive` writes of them
    assert "raw_gen_ai_request" in written and "llm.openai." not in written and PROMPT not in written
