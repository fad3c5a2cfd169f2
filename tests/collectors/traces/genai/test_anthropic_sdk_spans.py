"""The anthropic client's own OpenTelemetry spans (`anthropic.messages.create`, 1.17 and 2.x) read as latprof's LLM calls.

The client writes one CLIENT span per call with the GenAI names (`gen_ai.provider.name`
anthropic, `gen_ai.operation.name` chat, `gen_ai.usage.*_tokens`, and a stream's
`gen_ai.response.time_to_first_chunk`), and with `content_mode: content` the messages too.
Real spans of the official client against the demo provider's Messages API go through the
OTLP protobuf encoding an exporter sends, latprof's OTLP reader and `tracemap`: a stream is
`provider` to its first token, then `model`; a call without a stream is `provider` with
`latprof.ttft_known: false`; no prompt or answer is copied onto a segment.
"""

from __future__ import annotations

import pytest

anthropic = pytest.importorskip("anthropic")
pytest.importorskip("anthropic._tracing", reason="only newer clients write spans of their own")
pytest.importorskip("opentelemetry.sdk.trace")
pytest.importorskip("opentelemetry.exporter.otlp.proto.common")

from opentelemetry.exporter.otlp.proto.common._internal.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind  # noqa: E402

from latprof.collectors.traces import otlp_proto  # noqa: E402
from latprof.collectors.traces.tracemap import map_spans  # noqa: E402
from latprof.demo.provider import Provider  # noqa: E402
from latprof.layers import MODEL, PROVIDER  # noqa: E402

TTFT_MS = 150
TPOT_MS = 10
TOKENS = 12
CANARY = "CANARY-anthropic-prompt-7f3a"
SLACK_MS = 1500


@pytest.fixture(scope="module")
def mapped():
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tracer_provider.get_tracer("service")
    options = {"tracer_provider": tracer_provider, "traces": {"content_mode": "content"}}
    messages = [{"role": "user", "content": f"Which layer owns the p99? {CANARY}"}]
    with Provider(ttft_ms=TTFT_MS, tpot_ms=TPOT_MS, output_tokens=TOKENS) as provider, anthropic.Anthropic(
        base_url=f"http://127.0.0.1:{provider.port}", api_key="unused", open_telemetry=options
    ) as client:
        with tracer.start_as_current_span("POST /chat", kind=SpanKind.SERVER, attributes={"http.route": "/chat"}):
            streamed = "".join(e.delta.text for e in client.messages.create(
                model="claude-demo", max_tokens=256, messages=messages, stream=True) if e.type == "content_block_delta")  # fmt: skip
        with tracer.start_as_current_span("POST /chat", kind=SpanKind.SERVER, attributes={"http.route": "/chat"}):
            whole = client.messages.create(model="claude-demo", max_tokens=256, messages=messages)
    spans = exporter.get_finished_spans()
    counters = otlp_proto.Counters()
    read = otlp_proto.spans_from_request(otlp_proto.parse_request(encode_spans(spans).SerializeToString()), counters)
    return spans, map_spans(read), streamed, whole


def calls(events):
    """The provider and model segments of each request, in start order."""
    out = []
    for request in sorted(events.requests, key=lambda r: r.start_ns):
        segments = events.segments_by_request[request.request_id]
        out.append(([s for s in segments if s.layer == PROVIDER], [s for s in segments if s.layer == MODEL]))
    return out


def ms(segment) -> float:
    return (segment.end_ns - segment.start_ns) / 1e6


def test_the_client_writes_one_genai_span_per_call(mapped):
    spans, _, _, _ = mapped
    llm = [s for s in spans if s.name == "anthropic.messages.create"]
    assert len(llm) == 2 and {s.attributes["gen_ai.provider.name"] for s in llm} == {"anthropic"}
    assert "gen_ai.response.time_to_first_chunk" in llm[0].attributes


def test_a_streamed_call_is_provider_until_its_first_chunk_then_model(mapped):
    _, events, streamed, _ = mapped
    (providers, models), _ = calls(events)
    (provider,), (model,) = providers, models
    assert TTFT_MS - 50 <= ms(provider) <= TTFT_MS + SLACK_MS
    assert TOKENS * TPOT_MS * 0.75 <= ms(model) <= TOKENS * TPOT_MS + SLACK_MS
    assert provider.end_ns == model.start_ns and provider.attrs["latprof.ttft_known"] is True
    assert model.attrs["gen_ai.usage.output_tokens"] == TOKENS and model.attrs["gen_ai.usage.input_tokens"] > 0
    assert model.attrs["gen_ai.request.model"] == "claude-demo" and len(streamed.split()) == TOKENS


def test_a_call_without_a_stream_is_provider_with_ttft_unknown(mapped):
    _, events, _, whole = mapped
    _, (providers, models) = calls(events)
    (provider,) = providers
    assert not models and provider.attrs["latprof.ttft_known"] is False
    assert provider.attrs["gen_ai.usage.output_tokens"] == whole.usage.output_tokens == TOKENS
    assert TTFT_MS + TOKENS * TPOT_MS - 50 <= ms(provider) <= TTFT_MS + TOKENS * TPOT_MS + SLACK_MS


def test_no_prompt_or_answer_is_copied_onto_a_segment(mapped):
    spans, events, streamed, whole = mapped
    raw = repr([dict(s.attributes) for s in spans])
    assert CANARY in raw and whole.content[0].text in raw  # the client recorded them (content mode)
    kept = repr([dict(s.attrs) for segments in events.segments_by_request.values() for s in segments])
    assert CANARY not in kept and whole.content[0].text not in kept and streamed not in kept
