"""Drive the official openai client through a GenAI instrumentation and read what latprof makes of its spans.

Each test module of this directory installs one instrumentation the normal way, then calls
`record_calls(tmp_path, tracer)`: it starts latprof's demo provider (a subprocess on
127.0.0.1) and an `OtlpReceiver` writing what the Collector's `file` exporter writes, and
makes, each under a root span of its own (a request, as a traced service's server span would
be), with the official openai client:

- streamed calls (sync and async) of `STREAMED_MODEL`, asking for usage, whose provider
  answers after `TTFT_MS` with `STREAMED_TOKENS` tokens `TPOT_MS` apart;
- non-streamed calls (sync and async) of `BATCH_MODEL`, whose output tokens vary from call to
  call (`BATCH_TOKENS`): a model with no streamed calls, so its decode can only be fitted.

Every prompt holds a canary (`Recording.canary`), and the answers' texts are kept
(`Recording.answers`), so that a test can check that no report carries them.

The caller's exporter setup is `export(endpoint)`: it makes the stock OpenTelemetry SDK export
to `endpoint` (OTLP/HTTP) and returns a flush function.

Not a test module: `from genai_calls import record_calls` (pytest puts this directory on sys.path).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import openai
import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from latprof.analysis.genai import fit_decode_ms_per_token, split_unstreamed_calls
from latprof.analysis.timeline import RequestTimeline, build_timeline
from latprof.capture.reader import read_captures
from latprof.demo.provider import Provider
from latprof.events import Segment
from otlp_receiver import OtlpReceiver

TTFT_MS = 150.0
TPOT_MS = 5.0
STREAMED_MODEL = "latprof-chat"
STREAMED_TOKENS = 6
BATCH_MODEL = "latprof-batch"
#: Output tokens of the non-streamed calls: spread enough for the fit (max/min >= 2, at least 8 calls).
BATCH_TOKENS = (5, 40, 10, 60, 20, 80, 15, 50, 30, 70)
STREAMED_CALLS = 4  # of each of sync and async
OTLP_FILE = "traces.otlp.jsonl"


@dataclass
class Recording:
    """What `record_calls` made: the OTLP file, the canary in every prompt, the answers' texts."""

    path: Path
    canary: str
    answers: list[str] = field(default_factory=list)

    def requests(self) -> list[RequestTimeline]:
        """The file's requests as latprof maps them (no warm-up skipped)."""
        return list(build_timeline(read_captures([self.path])).requests)

    def report_json(self) -> str:
        """`latprof analyze FILE --format json` (a subprocess), all requests kept."""
        done = subprocess.run([sys.executable, "-m", "latprof", "analyze", str(self.path), "--format", "json", "--skip-warmup", "0"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        json.loads(done.stdout)
        return done.stdout


def llm_segments(requests: list[RequestTimeline], model: str) -> Iterator[tuple[Segment, ...]]:
    """Per request, its `provider`/`model` segments of `model` (by `gen_ai.request.model`)."""
    for rt in requests:
        found = tuple(s for s in rt.segments if s.layer in ("provider", "model") and s.attrs.get("gen_ai.request.model") == model)
        if found:
            yield found


def _messages(canary: str, i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{canary} question {i}: where does the tail come from?"}]


def sdk_export(service: str, instrumentor: Any) -> Callable[[str], Callable[[], None]]:
    """`record_calls`' `export` for an instrumentation of openai: the stock SDK as the global tracer provider
    (service `service`) exporting OTLP/HTTP to the endpoint it is given, `instrumentor` instrumenting openai
    with it; what it returns flushes the spans (a test failure when they are not flushed)."""

    def export(endpoint: str) -> Callable[[], None]:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        trace.set_tracer_provider(provider)
        instrumentor.instrument(tracer_provider=provider)
        return lambda: None if provider.force_flush() else pytest.fail("spans not flushed")

    return export


def record_calls(tmp_path: Path, export: Callable[[str], Callable[[], None]], *, role_chunk_first: bool = True) -> Recording:
    """Run the calls described in the module docstring and return the recording (see there).

    `role_chunk_first` is the provider's: True sends a role-only chunk right after the headers,
    long before the first token; False sends the role with the first token, as OpenAI does.
    """
    recording = Recording(tmp_path / OTLP_FILE, f"CANARY-{uuid.uuid4().hex}")
    with OtlpReceiver(recording.path) as receiver, Provider(ttft_ms=TTFT_MS, tpot_ms=TPOT_MS, output_tokens=STREAMED_TOKENS,
                                                            role_chunk_first=role_chunk_first, subprocess=True) as provider:  # fmt: skip
        flush = export(receiver.endpoint)
        tracer = trace.get_tracer("latprof.tests.genai")
        client = openai.OpenAI(base_url=provider.url, api_key="unused", max_retries=0)

        def request(name: str) -> Any:
            return tracer.start_as_current_span(name, kind=SpanKind.SERVER, attributes={"http.request.method": "POST", "http.route": name})

        # one call first, outside any request: the instrumentation's lazy set-up (imports, encoders) is not a call's TTFT
        for chunk in client.chat.completions.create(model="warm-up", messages=_messages(recording.canary, -1), stream=True):  # type: ignore[arg-type]
            pass
        for i in range(STREAMED_CALLS):
            with request("/chat"):
                stream = client.chat.completions.create(model=STREAMED_MODEL, messages=_messages(recording.canary, i),  # type: ignore[arg-type]
                                                        stream=True, stream_options={"include_usage": True})  # fmt: skip
                recording.answers.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        for i, tokens in enumerate(BATCH_TOKENS[::2]):
            with request("/batch"):
                answer = client.chat.completions.create(model=BATCH_MODEL, messages=_messages(recording.canary, i),  # type: ignore[arg-type]
                                                        extra_body={"latprof": {"output_tokens": tokens}})  # fmt: skip
                recording.answers.append(answer.choices[0].message.content or "")

        async def run_async() -> None:
            aclient = openai.AsyncOpenAI(base_url=provider.url, api_key="unused", max_retries=0)

            async def streamed(i: int) -> None:
                with request("/chat"):
                    stream = await aclient.chat.completions.create(model=STREAMED_MODEL, messages=_messages(recording.canary, i),  # type: ignore[arg-type]
                                                                   stream=True, stream_options={"include_usage": True})  # fmt: skip
                    recording.answers.append("".join([c.choices[0].delta.content or "" async for c in stream if c.choices]))

            async def batch(i: int, tokens: int) -> None:
                with request("/batch"):
                    answer = await aclient.chat.completions.create(model=BATCH_MODEL, messages=_messages(recording.canary, i),  # type: ignore[arg-type]
                                                                   extra_body={"latprof": {"output_tokens": tokens}})  # fmt: skip
                    recording.answers.append(answer.choices[0].message.content or "")

            # a few at a time: each call's own timing stays what the provider was told
            await asyncio.gather(*(streamed(i) for i in range(STREAMED_CALLS)))
            await asyncio.gather(*(batch(i, tokens) for i, tokens in enumerate(BATCH_TOKENS[1::2])))
            await aclient.close()

        asyncio.run(run_async())
        client.close()
        flush()
        receiver.wait_idle(0.3, timeout=10)
    assert recording.path.exists(), "no span was exported"
    return recording


def assert_no_content(recording: Recording, report: str) -> None:
    """Neither the prompts' canary nor any answer's text is in `report`."""
    assert recording.canary not in report
    for answer in recording.answers:
        assert len(answer.split()) >= 3 and answer not in report, answer


def assert_streamed_calls_split_at_the_first_token(requests: list[RequestTimeline], tolerance_ms: float = 100.0) -> None:
    """Every streamed call is `provider` up to its first token (the provider's TTFT, within
    `tolerance_ms` above it) and `model` after, with the model and token counts read."""
    calls = list(llm_segments(requests, STREAMED_MODEL))
    assert len(calls) == 2 * STREAMED_CALLS, calls
    for segments in calls:
        layers = {s.layer: s for s in segments}
        assert set(layers) == {"provider", "model"}, segments
        provider, model = layers["provider"], layers["model"]
        ttft_ms = (provider.end_ns - provider.start_ns) / 1e6
        assert TTFT_MS - 5 <= ttft_ms <= TTFT_MS + tolerance_ms, ttft_ms
        assert provider.end_ns == model.start_ns and provider.attrs.get("latprof.ttft_known") is not False
        assert float(model.attrs["gen_ai.usage.output_tokens"]) == STREAMED_TOKENS
        assert float(model.attrs["gen_ai.usage.input_tokens"]) > 0


def assert_streamed_calls_have_no_ttft(requests: list[RequestTimeline]) -> None:
    """Every streamed call is `provider` time only: one segment marked `latprof.ttft_known: false`
    with the model and token counts read (and, for Logfire, the request span before the stream)."""
    calls = list(llm_segments(requests, STREAMED_MODEL))
    assert len(calls) == 2 * STREAMED_CALLS, calls
    for segments in calls:
        assert {s.layer for s in segments} == {"provider"}, segments
        (call,) = [s for s in segments if s.attrs.get("latprof.ttft_known") is False]
        assert float(call.attrs["gen_ai.usage.output_tokens"]) == STREAMED_TOKENS, call
        assert float(call.attrs["gen_ai.usage.input_tokens"]) > 0, call


def assert_unstreamed_calls_are_split_by_the_fit(requests: list[RequestTimeline]) -> None:
    """The non-streamed calls are `latprof.ttft_known: false` with their tokens read, and the
    genai step splits them by a time per token fitted from their durations (the provider's `TPOT_MS`, roughly)."""
    calls = [segments[0] for segments in llm_segments(requests, BATCH_MODEL)]
    assert len(calls) == len(BATCH_TOKENS), calls
    assert all(s.layer == "provider" and s.attrs.get("latprof.ttft_known") is False for s in calls), calls
    assert sorted(float(s.attrs["gen_ai.usage.output_tokens"]) for s in calls) == sorted(BATCH_TOKENS)
    assert all(float(s.attrs["gen_ai.usage.input_tokens"]) > 0 for s in calls)
    fits = fit_decode_ms_per_token(calls)
    assert fits[BATCH_MODEL].calls == len(BATCH_TOKENS)
    assert fits[BATCH_MODEL].ms_per_token == pytest.approx(TPOT_MS, rel=0.3)
    split, warnings = split_unstreamed_calls(requests)
    fitted = [rt for rt in split if any(s.layer == "model" and s.attrs.get("latprof.estimated") for s in rt.segments)
              and rt.request.route.endswith("/batch")]  # fmt: skip
    assert len(fitted) == len(BATCH_TOKENS)
    assert any("fitted" in w and BATCH_MODEL in w for w in warnings), warnings
