"""The anthropic hook against the demo provider's Messages API: TTFT and decode of real client calls, retries, errors, streams left early."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import pytest
from recording import recording

anthropic = pytest.importorskip("anthropic")

from latprof.capture.reader import read_captures
from latprof.collectors.hooks import _llm, _sdk, runtime
from latprof.collectors.hooks import anthropic as hook
from latprof.demo.provider import Provider
from latprof.events import QualityRecord, Request, Segment

TTFT_MS = 300
TPOT_MS = 10
TOKENS = 20
MODEL = "claude-demo"
MESSAGES = [{"role": "user", "content": "Which layer owns the p99?"}]
TOOLS = [{"name": "lookup", "description": "look it up", "input_schema": {"type": "object", "properties": {}}}]
# Loose upper bounds: a loaded 2-core machine may be slow, never fast.
SLACK_MS = 1500


@pytest.fixture(scope="module")
def provider():
    with Provider(ttft_ms=TTFT_MS, tpot_ms=TPOT_MS, output_tokens=TOKENS, seed=7) as running:
        yield running


def base_url(provider) -> str:
    return f"http://127.0.0.1:{provider.port}"  # the client adds /v1/messages


@pytest.fixture(scope="module")
def client(provider):
    with anthropic.Anthropic(base_url=base_url(provider), api_key="unused", max_retries=2) as sync_client:
        yield sync_client


@pytest.fixture
def recorded():
    hook.install()
    with recording() as events:
        yield events


def in_request(fn):
    """Run `fn()` inside one request; return its result."""
    token = runtime.begin_request("POST /chat", runtime.now_ns())
    try:
        return fn()
    finally:
        runtime.end_request(token)


def segments(events, layer=None):
    return [e for e in events if isinstance(e, Segment) and (layer is None or e.layer == layer)]


def ms(segment: Segment) -> float:
    return (segment.end_ns - segment.start_ns) / 1e6


def one_call(events):
    """The provider segment and model segment (or None) of the only LLM call recorded."""
    (provider,) = segments(events, "provider")
    models = segments(events, "model")
    assert len(models) <= 1
    return provider, (models[0] if models else None)


def errors_of_the_hook(events) -> int:
    runtime.report_errors(force=True)
    return sum(e.occurrences for e in events if isinstance(e, QualityRecord) and e.kind == "error" and e.attrs.get("collector") == "anthropic")


def create(client, **kwargs):
    return client.messages.create(model=MODEL, max_tokens=1024, messages=MESSAGES, **kwargs)


def stream_events(client, **kwargs) -> list:
    return list(create(client, stream=True, **kwargs))


def text_of(events) -> str:
    return "".join(e.delta.text for e in events if e.type == "content_block_delta")


def assert_streamed_call(recorded, input_tokens=None):
    provider, model = one_call(recorded)
    # message_start and content_block_start come right after the headers; TTFT waits for the first delta.
    assert TTFT_MS - 50 <= ms(provider) <= TTFT_MS + SLACK_MS
    assert model is not None and TOKENS * TPOT_MS * 0.75 <= ms(model) <= TOKENS * TPOT_MS + SLACK_MS
    assert provider.end_ns == model.start_ns
    for segment in (provider, model):
        assert segment.name == f"chat {MODEL}"
        assert segment.attrs["latprof.llm_call_id"] == provider.attrs["latprof.llm_call_id"]
        assert segment.attrs["latprof.ttft_known"] is True
        assert segment.attrs["gen_ai.operation.name"] == "chat" and segment.attrs["gen_ai.provider.name"] == "anthropic"
        assert segment.attrs["gen_ai.request.model"] == MODEL and segment.attrs["gen_ai.response.model"] == MODEL
        assert segment.attrs["latprof.output_chunks"] == TOKENS
        assert segment.attrs["gen_ai.usage.output_tokens"] == TOKENS  # message_delta's, not message_start's placeholder
        if input_tokens is not None:
            assert segment.attrs["gen_ai.usage.input_tokens"] == input_tokens
    return provider, model


# --- streamed ------------------------------------------------------------------------------------


def test_a_streamed_create_is_provider_until_the_first_delta_then_model(recorded, client):
    hook.uninstall()
    unhooked = text_of(stream_events(client))
    hook.install()

    events = in_request(lambda: stream_events(client))

    assert text_of(events) == unhooked and len(unhooked.split()) == TOKENS
    assert [e.type for e in events[:2]] == ["message_start", "content_block_start"] and events[-1].type == "message_stop"
    provider, model = assert_streamed_call(recorded, input_tokens=events[0].message.usage.input_tokens)
    (root,) = [e for e in recorded if isinstance(e, Request)]
    assert provider.request_id == model.request_id == root.request_id and provider.parent_id is None


def test_the_messages_stream_helper_is_recorded_when_its_manager_is_entered(recorded, client):
    def call():
        manager = client.messages.stream(model=MODEL, max_tokens=1024, messages=MESSAGES)
        with manager as stream:
            text = "".join(stream.text_stream)
            return text, stream.get_final_message()

    text, message = in_request(call)

    assert len(text.split()) == TOKENS and message.content[0].text == text and message.usage.output_tokens == TOKENS
    assert_streamed_call(recorded, input_tokens=message.usage.input_tokens)


def test_a_tool_use_stream_ends_ttft_at_the_first_input_json_delta(recorded, client):
    events = in_request(lambda: stream_events(client, tools=TOOLS))

    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert len(deltas) == TOKENS and {d.type for d in deltas} == {"input_json_delta"}
    assert events[1].content_block.type == "tool_use"
    assert_streamed_call(recorded)


def test_async_client_create_and_stream_helper(recorded, provider):
    async def main():
        async with anthropic.AsyncAnthropic(base_url=base_url(provider), api_key="unused") as aclient:
            token = runtime.begin_request("POST /chat", runtime.now_ns())
            stream = await aclient.messages.create(model=MODEL, max_tokens=1024, messages=MESSAGES, stream=True)
            async with stream:
                created = text_of([event async for event in stream])
            async with aclient.messages.stream(model=MODEL, max_tokens=1024, messages=MESSAGES) as helper:
                helped = "".join([text async for text in helper.text_stream])
            message = await aclient.messages.create(model=MODEL, max_tokens=1024, messages=MESSAGES)
            runtime.end_request(token)
            return created, helped, message

    created, helped, message = asyncio.run(main())

    assert created == helped == message.content[0].text and len(created.split()) == TOKENS
    providers, models = segments(recorded, "provider"), segments(recorded, "model")
    assert len(providers) == 3 and len(models) == 2
    for provider_segment, model in zip(providers, models):
        assert TTFT_MS - 50 <= ms(provider_segment) <= TTFT_MS + SLACK_MS
        assert TOKENS * TPOT_MS * 0.75 <= ms(model) <= TOKENS * TPOT_MS + SLACK_MS
        assert model.attrs["latprof.llm_call_id"] == provider_segment.attrs["latprof.llm_call_id"]
    assert providers[2].attrs["latprof.ttft_known"] is False
    assert TTFT_MS + TOKENS * TPOT_MS - 50 <= ms(providers[2]) <= TTFT_MS + TOKENS * TPOT_MS + SLACK_MS


# --- not streamed --------------------------------------------------------------------------------


#: `parse` (structured output) came with newer clients: 1.0 has none.
NON_STREAMED = ["create", *(["parse"] if hasattr(anthropic.resources.messages.Messages, "parse") else [])]


@pytest.mark.parametrize("method", NON_STREAMED)
def test_a_non_streamed_call_is_one_provider_segment_without_ttft(recorded, client, method):
    message = in_request(lambda: getattr(client.messages, method)(model=MODEL, max_tokens=1024, messages=MESSAGES))

    provider, model = one_call(recorded)
    assert model is None and message.stop_reason == "end_turn"
    assert provider.attrs["latprof.ttft_known"] is False
    assert provider.attrs["gen_ai.usage.output_tokens"] == message.usage.output_tokens == TOKENS
    assert provider.attrs["gen_ai.usage.input_tokens"] == message.usage.input_tokens
    assert provider.attrs["gen_ai.response.model"] == message.model == MODEL
    assert "latprof.output_chunks" not in provider.attrs
    assert TTFT_MS + TOKENS * TPOT_MS - 50 <= ms(provider) <= TTFT_MS + TOKENS * TPOT_MS + SLACK_MS


def test_a_raw_response_call_reads_the_usage_off_the_body(recorded, client):
    raw = in_request(lambda: client.messages.with_raw_response.create(model=MODEL, max_tokens=1024, messages=MESSAGES))

    message = raw.parse()
    provider, model = one_call(recorded)
    assert model is None and provider.attrs["gen_ai.usage.output_tokens"] == message.usage.output_tokens == TOKENS


# --- retries and errors --------------------------------------------------------------------------


def test_the_clients_retry_sleeps_are_retry_segments_inside_the_call(recorded, client):
    fault = {"fail_first": 2, "retry_after_ms": 200, "ttft_ms": 20}
    message = in_request(lambda: create(client, extra_body={"latprof": fault}))

    assert message.usage.output_tokens == TOKENS
    provider, _ = one_call(recorded)
    retries = segments(recorded, "retry")
    assert len(retries) == 2
    for n, retry in enumerate(retries, start=1):
        assert 150 <= ms(retry) <= 200 + SLACK_MS  # the client honours retry-after-ms
        assert retry.name == "anthropic retry" and retry.parent_id == provider.segment_id
        assert provider.start_ns <= retry.start_ns <= retry.end_ns <= provider.end_ns
        assert retry.attrs == {"http.response.status_code": 429, "http.request.resend_count": n}
    assert "error.type" not in provider.attrs


def test_a_call_that_fails_raises_as_before_and_is_recorded_with_its_error(recorded, client):
    no_retries = client.with_options(max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as unhooked:
        create(no_retries, extra_body={"latprof": {"fail_first": 1}})

    with pytest.raises(anthropic.RateLimitError) as failed:
        in_request(lambda: create(no_retries, extra_body={"latprof": {"fail_first": 1}}))
    with pytest.raises(anthropic.BadRequestError):
        in_request(lambda: create(client, stream=True, extra_body={"latprof": {"no_such_setting": 1}}))

    assert failed.value.body == unhooked.value.body == {
        "type": "error", "error": {"type": "rate_limit_error", "message": "Rate limit reached (latprof demo provider)"}}
    rate_limited, bad_request = segments(recorded, "provider")
    assert not segments(recorded, "model") and not segments(recorded, "retry")
    assert rate_limited.attrs["error.type"] == "RateLimitError" and rate_limited.attrs["http.response.status_code"] == 429
    assert bad_request.attrs["error.type"] == "BadRequestError" and bad_request.attrs["http.response.status_code"] == 400
    assert bad_request.attrs["latprof.ttft_known"] is False  # a stream that never started
    assert errors_of_the_hook(recorded) == 0


# --- streams left early, and the hook's own safety -----------------------------------------------


def test_a_stream_left_early_and_closed_ends_its_segments_once(recorded, client):
    def call():
        with create(client, stream=True) as stream:
            assert isinstance(stream, anthropic.Stream) and stream.response.status_code == 200
            for event in stream:
                if event.type == "content_block_delta":
                    break
        stream.close()  # a second close changes nothing
        return stream

    stream = in_request(call)

    provider, model = one_call(recorded)
    assert TTFT_MS - 50 <= ms(provider) <= TTFT_MS + SLACK_MS
    assert model is not None and ms(model) < TOKENS * TPOT_MS  # ended at the last event read
    assert model.attrs["latprof.output_chunks"] == 1
    assert "gen_ai.usage.output_tokens" not in model.attrs  # message_delta was never read
    # The abandoned stream is not kept alive by the hook, and the client still works.
    ref = weakref.ref(stream)
    del stream
    gc.collect()
    assert ref() is None
    assert len(segments(recorded)) == 2
    assert len(text_of(stream_events(client)).split()) == TOKENS


def test_a_stream_helper_left_early_ends_its_segments_at_exit(recorded, client):
    def call():
        with client.messages.stream(model=MODEL, max_tokens=1024, messages=MESSAGES) as stream:
            return next(iter(stream.text_stream))

    first = in_request(call)

    assert first
    provider, model = one_call(recorded)
    assert model is not None and ms(model) < TOKENS * TPOT_MS and model.attrs["latprof.output_chunks"] == 1


def test_a_stream_dropped_without_close_ends_its_segments_when_collected(recorded, client):
    def call():
        stream = create(client, stream=True)
        next(iter(stream))  # message_start only: no token yet

    in_request(call)
    gc.collect()

    provider, model = one_call(recorded)
    assert model is None
    assert provider.attrs["latprof.ttft_known"] is False  # left before the first token: TTFT unmeasured
    assert ms(provider) < TTFT_MS


def test_nothing_is_recorded_outside_a_request(recorded, client):
    events = stream_events(client)
    create(client, extra_body={"latprof": {"ttft_ms": 0, "tpot_ms": 0}})
    with client.messages.stream(model=MODEL, max_tokens=1024, messages=MESSAGES, extra_body={"latprof": {"fail_first": 1}}) as stream:
        text = "".join(stream.text_stream)

    assert text_of(events) and text and recorded == []


def test_install_is_idempotent(recorded, client):
    assert hook.install() and hook.install()
    create_method = anthropic.resources.messages.messages.Messages.create
    assert create_method.__latprof_original__ is create_method.__wrapped__
    assert not hasattr(create_method.__wrapped__, "__latprof_original__")

    in_request(lambda: stream_events(client))

    assert len(segments(recorded, "provider")) == 1 and len(segments(recorded, "model")) == 1


def test_a_failing_hook_is_counted_and_the_call_still_works(recorded, client, monkeypatch):
    def broken(*args):
        raise RuntimeError("hook bug")

    monkeypatch.setattr(_llm, "usage_counts", broken)  # read at message_start and message_delta

    events = in_request(lambda: stream_events(client))

    assert len(text_of(events).split()) == TOKENS
    provider, model = one_call(recorded)  # the call is still split at its first token
    assert model is not None and ms(provider) >= TTFT_MS - 50 and "gen_ai.usage.output_tokens" not in model.attrs
    assert errors_of_the_hook(recorded) == 2


def test_each_call_is_one_opentelemetry_span_when_an_sdk_records(recorded, provider, monkeypatch):
    """The client's own span where it writes one (`anthropic._tracing`: 1.17, 2.x), and none of the hook's; else the hook's (1.0)."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry import context, trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracer_provider = sdk.TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    # The hook's tracer, without touching the process-wide provider other tests share.
    monkeypatch.setattr(_sdk, "_otel", (trace, context, tracer_provider.get_tracer("latprof")))
    client_spans = importlib.util.find_spec("anthropic._tracing") is not None
    options = {"open_telemetry": {"tracer_provider": tracer_provider}} if client_spans else {}
    with anthropic.Anthropic(base_url=base_url(provider), api_key="unused", **options) as traced:
        in_request(lambda: stream_events(traced))

    (span,) = exporter.get_finished_spans()
    assert span.name == ("anthropic.messages.create" if client_spans else f"chat {MODEL}") and span.kind == trace.SpanKind.CLIENT
    provider_segment, model = one_call(recorded)
    # The same call: the hook's segments wrap the client's span by the client's own code around it.
    assert abs(span.start_time - provider_segment.start_ns) < 50e6 and abs(span.end_time - model.end_ns) < 50e6
    attrs = span.attributes
    assert attrs["gen_ai.provider.name"] == "anthropic" and attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.stream"] is True
    assert attrs["gen_ai.usage.output_tokens"] == TOKENS and attrs["gen_ai.usage.input_tokens"] == provider_segment.attrs["gen_ai.usage.input_tokens"]
    assert attrs["gen_ai.response.time_to_first_chunk"] == pytest.approx(ms(provider_segment) / 1000, abs=0.05)
    assert MESSAGES[0]["content"] not in repr(dict(attrs))


# --- the demo provider's Messages API -------------------------------------------------------------


def test_the_provider_speaks_the_messages_wire_format(provider, client):
    import json
    import urllib.request

    body = {"model": MODEL, "max_tokens": 5, "stream": True, "messages": MESSAGES}
    request = urllib.request.Request(f"{base_url(provider)}/v1/messages", json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        sse = response.read().decode()
    names = [line.split(": ", 1)[1] for line in sse.splitlines() if line.startswith("event: ")]
    assert names == ["message_start", "content_block_start", "ping", *["content_block_delta"] * 5, "content_block_stop",
                     "message_delta", "message_stop"]  # fmt: skip
    final = json.loads([line for line in sse.splitlines() if line.startswith("data: ")][-2][6:])
    assert final == {"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None}, "usage": {"output_tokens": 5}}
    # A tool result turn is answered with text; `tool_choice: none` leaves the tools out.
    result = [*MESSAGES, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}]}]  # fmt: skip
    answered = client.messages.create(model=MODEL, max_tokens=64, messages=result, tools=TOOLS)
    unused = create(client, tools=TOOLS, tool_choice={"type": "none"})
    called = create(client, tools=TOOLS)
    assert [m.content[0].type for m in (answered, unused, called)] == ["text", "text", "tool_use"]
    assert called.stop_reason == "tool_use" and set(called.content[0].input) == {"query"}


# --- under `latprof run` -------------------------------------------------------------------------

SERVICE = textwrap.dedent(
    """
    import sys
    import anthropic
    from latprof.collectors.hooks import runtime

    client = anthropic.Anthropic(base_url=sys.argv[1], api_key="unused")
    for i in range(3):
        token = runtime.begin_request("POST /chat", runtime.now_ns())
        with client.messages.stream(model="claude-demo", max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as stream:
            text = "".join(stream.text_stream)
        runtime.end_request(token)
        assert text
    """
)


def test_latprof_run_captures_provider_and_model_segments(tmp_path: Path):
    (tmp_path / "service.py").write_text(SERVICE)
    with Provider(ttft_ms=100, tpot_ms=5, output_tokens=10) as fast:
        result = subprocess.run(
            [sys.executable, "-m", "latprof", "run", "--out", str(tmp_path / "capture.jsonl"), "--no-report", "--",
             sys.executable, str(tmp_path / "service.py"), base_url(fast)],
            capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = read_captures([tmp_path / "capture.jsonl"])
    loaded = [q for q in data.quality if q.kind == "hooks_loaded"]
    assert loaded and "anthropic" in loaded[0].attrs["collectors"]
    assert len(data.requests) == 3
    for request in data.requests:
        recorded = data.segments_by_request[request.request_id]
        assert sorted(s.layer for s in recorded) == ["model", "provider"]
        provider = next(s for s in recorded if s.layer == "provider")
        assert (provider.end_ns - provider.start_ns) / 1e6 >= 80 and provider.attrs["gen_ai.provider.name"] == "anthropic"
    assert not [q for q in data.quality if q.kind == "error"]
