"""The openai hook against the demo provider: TTFT and decode of real client calls, retries, streams left early."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
import time
import weakref
from pathlib import Path

import pytest
from recording import recording

openai = pytest.importorskip("openai")

from latprof.capture.reader import read_captures
from latprof.collectors.hooks import openai as hook
from latprof.collectors.hooks import runtime
from latprof.demo.provider import Provider
from latprof.events import QualityRecord, Request, Segment

TTFT_MS = 300
TPOT_MS = 10
TOKENS = 20
MESSAGES = [{"role": "user", "content": "Which layer owns the p99?"}]
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
# Loose upper bounds: a loaded 2-core machine may be slow, never fast.
SLACK_MS = 1500


@pytest.fixture(scope="module")
def provider():
    with Provider(ttft_ms=TTFT_MS, tpot_ms=TPOT_MS, output_tokens=TOKENS, seed=7) as running:
        yield running


@pytest.fixture(scope="module")
def client(provider):
    with openai.OpenAI(base_url=provider.url, api_key="unused", max_retries=2) as sync_client:
        yield sync_client


@pytest.fixture
def recorded():
    hook.install()
    with recording() as events:
        yield events


def in_request(fn):
    """Run `fn()` inside one request; return its result and the request's segments."""
    token = runtime.begin_request("POST /chat", runtime.now_ns())
    try:
        result = fn()
    finally:
        runtime.end_request(token)
    return result


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


def stream_text(client, **kwargs) -> tuple[str, int]:
    stream = client.chat.completions.create(model="demo", messages=MESSAGES, stream=True, **kwargs)
    parts = [chunk.choices[0].delta.content or "" for chunk in stream]  # breaks on a choice-less chunk
    return "".join(parts), len(parts)


# --- streamed chat -------------------------------------------------------------------------------


def test_streamed_chat_is_provider_until_the_first_token_then_model(recorded, client):
    hook.uninstall()
    unhooked_text, unhooked_chunks = stream_text(client)
    hook.install()

    text, chunks = in_request(lambda: stream_text(client))

    assert (text, chunks) == (unhooked_text, unhooked_chunks) and len(text.split()) == TOKENS
    provider, model = one_call(recorded)
    # The role-only chunk comes right after the headers; TTFT waits for the first content.
    assert TTFT_MS - 50 <= ms(provider) <= TTFT_MS + SLACK_MS
    assert TOKENS * TPOT_MS * 0.75 <= ms(model) <= TOKENS * TPOT_MS + SLACK_MS
    assert provider.end_ns == model.start_ns
    assert provider.attrs["latprof.llm_call_id"] == model.attrs["latprof.llm_call_id"]
    for segment in (provider, model):
        assert segment.name == "chat demo"
        assert segment.attrs["latprof.ttft_known"] is True
        assert segment.attrs["gen_ai.operation.name"] == "chat"
        assert segment.attrs["gen_ai.request.model"] == "demo" and segment.attrs["gen_ai.response.model"] == "demo"
        assert segment.attrs["latprof.output_chunks"] == TOKENS
        assert "gen_ai.usage.output_tokens" not in segment.attrs  # not asked for, so not sent
    (root,) = [e for e in recorded if isinstance(e, Request)]
    assert provider.request_id == model.request_id == root.request_id


def test_usage_is_recorded_when_the_caller_asked_for_it(recorded, client):
    def call():
        stream = client.chat.completions.create(model="demo", messages=MESSAGES, stream=True, stream_options={"include_usage": True})
        return [chunk for chunk in stream]

    chunks = in_request(call)

    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == TOKENS
    provider, model = one_call(recorded)
    assert model.attrs["gen_ai.usage.output_tokens"] == TOKENS
    assert provider.attrs["gen_ai.usage.input_tokens"] == chunks[-1].usage.prompt_tokens
    assert model.attrs["latprof.output_chunks"] == TOKENS


def test_a_tool_call_stream_ends_ttft_at_the_first_tool_calls_delta(recorded, client):
    def call():
        stream = client.chat.completions.create(model="demo", messages=MESSAGES, tools=TOOLS, stream=True)
        return [chunk.choices[0].delta for chunk in stream]

    deltas = in_request(call)

    assert not any(d.content for d in deltas) and sum(1 for d in deltas if d.tool_calls) == TOKENS
    provider, model = one_call(recorded)
    assert TTFT_MS - 50 <= ms(provider) <= TTFT_MS + SLACK_MS
    assert model is not None and TOKENS * TPOT_MS * 0.75 <= ms(model) <= TOKENS * TPOT_MS + SLACK_MS
    assert model.attrs["latprof.output_chunks"] == TOKENS


def test_a_responses_stream_ends_ttft_at_the_first_delta_event_not_at_response_created(recorded, client):
    def call():
        stream = client.responses.create(model="demo", input="Which layer owns the p99?", stream=True)
        return [event.type for event in stream]

    types = in_request(call)

    assert types[0] == "response.created" and types[-1] == "response.completed"
    provider, model = one_call(recorded)
    assert TTFT_MS - 50 <= ms(provider) <= TTFT_MS + SLACK_MS  # response.created came at once
    assert model is not None and model.attrs["latprof.output_chunks"] == TOKENS
    assert model.attrs["gen_ai.usage.output_tokens"] == TOKENS  # response.completed always carries usage
    assert provider.attrs["latprof.ttft_known"] is True


def test_a_non_streamed_call_is_one_provider_segment_without_ttft(recorded, client):
    completion = in_request(lambda: client.chat.completions.create(model="demo", messages=MESSAGES))

    provider, model = one_call(recorded)
    assert model is None
    assert provider.attrs["latprof.ttft_known"] is False
    assert provider.attrs["gen_ai.usage.output_tokens"] == completion.usage.completion_tokens == TOKENS
    assert provider.attrs["gen_ai.usage.input_tokens"] == completion.usage.prompt_tokens
    assert "latprof.output_chunks" not in provider.attrs
    assert TTFT_MS + TOKENS * TPOT_MS - 50 <= ms(provider) <= TTFT_MS + TOKENS * TPOT_MS + SLACK_MS


def test_async_client_streamed(recorded, provider):
    async def main():
        async with openai.AsyncOpenAI(base_url=provider.url, api_key="unused") as aclient:
            token = runtime.begin_request("POST /chat", runtime.now_ns())
            stream = await aclient.chat.completions.create(model="demo", messages=MESSAGES, stream=True)
            async with stream:
                text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
            runtime.end_request(token)
            return text

    text = asyncio.run(main())

    assert len(text.split()) == TOKENS
    provider_segment, model = one_call(recorded)
    assert TTFT_MS - 50 <= ms(provider_segment) <= TTFT_MS + SLACK_MS
    assert model is not None and TOKENS * TPOT_MS * 0.75 <= ms(model) <= TOKENS * TPOT_MS + SLACK_MS
    assert model.attrs["latprof.llm_call_id"] == provider_segment.attrs["latprof.llm_call_id"]


# --- retries -------------------------------------------------------------------------------------


def test_the_clients_retry_sleeps_are_retry_segments_inside_the_call(recorded, client):
    fault = {"fail_first": 2, "retry_after_ms": 200, "ttft_ms": 20}
    in_request(lambda: client.chat.completions.create(model="demo", messages=MESSAGES, extra_body={"latprof": fault}))

    provider, _ = one_call(recorded)
    retries = segments(recorded, "retry")
    assert len(retries) == 2
    for n, retry in enumerate(retries, start=1):
        assert 150 <= ms(retry) <= 200 + SLACK_MS
        assert retry.parent_id == provider.segment_id
        assert provider.start_ns <= retry.start_ns <= retry.end_ns <= provider.end_ns
        assert retry.attrs == {"http.response.status_code": 429, "http.request.resend_count": n}


# --- streams left early, and the hook's own safety -----------------------------------------------


def test_a_stream_left_early_and_closed_ends_its_segments_once(recorded, client):
    def call():
        with client.chat.completions.create(model="demo", messages=MESSAGES, stream=True) as stream:
            assert isinstance(stream, openai.Stream) and stream.response.status_code == 200
            for chunk in stream:
                if chunk.choices[0].delta.content:
                    break
        stream.close()  # a second close changes nothing
        return stream

    stream = in_request(call)

    provider, model = one_call(recorded)
    assert TTFT_MS - 50 <= ms(provider) <= TTFT_MS + SLACK_MS
    assert model is not None and ms(model) < TOKENS * TPOT_MS  # ended at the last chunk read
    assert model.attrs["latprof.output_chunks"] == 1
    # The abandoned stream is not kept alive by the hook, and the client still works.
    ref = weakref.ref(stream)
    del stream
    gc.collect()
    assert ref() is None
    assert len(segments(recorded)) == 2
    assert len(stream_text(client)[0].split()) == TOKENS


def test_a_stream_dropped_without_close_ends_its_segments_when_collected(recorded, client):
    def call():
        stream = client.chat.completions.create(model="demo", messages=MESSAGES, stream=True)
        next(stream)  # only the role chunk: no token yet

    in_request(call)
    gc.collect()

    provider, model = one_call(recorded)
    assert model is None
    assert provider.attrs["latprof.ttft_known"] is False  # left before the first token: TTFT unmeasured
    assert ms(provider) < TTFT_MS


def test_nothing_is_recorded_outside_a_request(recorded, client):
    text, _ = stream_text(client)
    client.chat.completions.create(model="demo", messages=MESSAGES, extra_body={"latprof": {"ttft_ms": 0, "tpot_ms": 0}})

    assert text and recorded == []


def test_install_is_idempotent(recorded, client):
    assert hook.install() and hook.install()
    create = openai.resources.chat.completions.Completions.create
    assert create.__latprof_original__ is create.__wrapped__
    assert not hasattr(create.__wrapped__, "__latprof_original__")

    in_request(lambda: stream_text(client))

    assert len(segments(recorded, "provider")) == 1 and len(segments(recorded, "model")) == 1


def test_a_failing_hook_is_counted_and_the_call_still_works(recorded, client, monkeypatch):
    def broken(*args):
        raise RuntimeError("hook bug")

    monkeypatch.setattr(hook, "_reasoning", broken)  # called for each chunk without content
    monkeypatch.setattr(hook._sdk, "start_span", broken)  # called when a call starts

    text, _ = in_request(lambda: stream_text(client))

    assert len(text.split()) == TOKENS
    assert segments(recorded) == []  # a call the hook could not start is not recorded
    runtime.report_errors(force=True)
    notes = [e for e in recorded if isinstance(e, QualityRecord) and e.kind == "error" and e.attrs.get("collector") == "openai"]
    assert sum(n.occurrences for n in notes) == 1 and notes[-1].attrs["latprof.last_error"].startswith("RuntimeError at ")

    monkeypatch.undo()
    monkeypatch.setattr(hook, "_reasoning", broken)
    text, _ = in_request(lambda: stream_text(client))  # observing chunks without content fails
    assert len(text.split()) == TOKENS
    provider, model = one_call(recorded)
    assert model is not None and ms(provider) >= TTFT_MS - 50
    runtime.report_errors(force=True)
    notes = [e for e in recorded if isinstance(e, QualityRecord) and e.kind == "error" and e.attrs.get("collector") == "openai"]
    assert sum(n.occurrences for n in notes) == 1 + 2  # the role chunk and the finish chunk


def test_each_call_is_an_opentelemetry_client_span_when_an_sdk_records(recorded, client, monkeypatch):
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry import context, trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )

    exporter = InMemorySpanExporter()
    tracer_provider = sdk.TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    # The hook's tracer, without touching the process-wide provider other tests share.
    monkeypatch.setattr(hook._sdk, "_otel", (trace, context, tracer_provider.get_tracer("latprof")))

    def call():
        stream = client.chat.completions.create(model="demo", messages=MESSAGES, stream=True, stream_options={"include_usage": True})
        return [chunk for chunk in stream]

    in_request(call)

    (span,) = exporter.get_finished_spans()
    provider, model = one_call(recorded)
    assert span.name == "chat demo" and span.kind == trace.SpanKind.CLIENT
    assert (span.start_time, span.end_time) == (provider.start_ns, model.end_ns)
    attrs = dict(span.attributes)
    assert attrs.pop("gen_ai.response.time_to_first_chunk") == pytest.approx(ms(provider) / 1000)
    assert attrs == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.stream": True,
        "gen_ai.request.model": "demo", "gen_ai.response.model": "demo", "server.address": "127.0.0.1",
        "gen_ai.usage.input_tokens": provider.attrs["gen_ai.usage.input_tokens"], "gen_ai.usage.output_tokens": TOKENS,
    }  # and nothing of the prompt or the completion


# --- the demo provider's own knobs ----------------------------------------------------------------


def test_the_provider_s_prefill_cost_and_seeded_spikes_are_decisive():
    def ttft_ms(provider, content="hi", n=1):
        """Time from the headers (sent at once) to the first content chunk of `n` calls, unhooked."""
        out = []
        with openai.OpenAI(base_url=provider.url, api_key="unused", max_retries=0) as sync_client:
            for _ in range(n):
                stream = sync_client.chat.completions.create(model="demo", messages=[{"role": "user", "content": content}], stream=True)
                start = time.perf_counter()
                next(chunk for chunk in stream if chunk.choices and chunk.choices[0].delta.content)
                out.append((time.perf_counter() - start) * 1000)
                stream.close()
        return out

    with Provider(ttft_ms=20, ttft_ms_per_1k_input_tokens=100, output_tokens=1, tpot_ms=1) as provider:
        (long_prompt,) = ttft_ms(provider, "x" * 16_000)  # 4000 input tokens
        (short_prompt,) = ttft_ms(provider)
    assert 380 <= long_prompt <= 420 + SLACK_MS and short_prompt < 200

    def spiked(seed):
        with Provider(ttft_ms=20, spike_probability=0.3, spike_ms=300, seed=seed, output_tokens=1, tpot_ms=1) as provider:
            return [t > 200 for t in ttft_ms(provider, n=8)]

    first = spiked(seed=3)
    assert first == spiked(seed=3) and 0 < sum(first) < 8


# --- under `latprof run` -------------------------------------------------------------------------

SERVICE = textwrap.dedent(
    """
    import sys
    import openai
    from latprof.collectors.hooks import runtime

    client = openai.OpenAI(base_url=sys.argv[1], api_key="unused")
    for i in range(3):
        token = runtime.begin_request("POST /chat", runtime.now_ns())
        stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
        runtime.end_request(token)
        assert text
    """
)


def test_latprof_run_captures_provider_and_model_segments(tmp_path: Path):
    (tmp_path / "service.py").write_text(SERVICE)
    with Provider(ttft_ms=100, tpot_ms=5, output_tokens=10) as fast:
        result = subprocess.run(
            [sys.executable, "-m", "latprof", "run", "--out", str(tmp_path / "capture.jsonl"), "--no-report", "--",
             sys.executable, str(tmp_path / "service.py"), fast.url],
            capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
        )
    assert result.returncode == 0, result.stderr
    data = read_captures([tmp_path / "capture.jsonl"])
    loaded = [q for q in data.quality if q.kind == "hooks_loaded"]
    assert loaded and "openai" in loaded[0].attrs["collectors"]
    assert len(data.requests) == 3
    for request in data.requests:
        layers = sorted(s.layer for s in data.segments_by_request[request.request_id])
        assert layers == ["model", "provider"]
        provider = next(s for s in data.segments_by_request[request.request_id] if s.layer == "provider")
        assert (provider.end_ns - provider.start_ns) / 1e6 >= 80
    assert not [q for q in data.quality if q.kind == "error"]
