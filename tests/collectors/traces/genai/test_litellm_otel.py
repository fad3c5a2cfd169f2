"""LiteLLM's own OpenTelemetry spans (`litellm.callbacks = ["otel"]`), exported for real to an OTLP file: what latprof reads of them.

LiteLLM 1.110 writes, per call, from a logging thread after the call: a `litellm_request`
span (scope `litellm`, INTERNAL; `gen_ai.operation.name` chat, `gen_ai.request.model` without
its routing prefix, `gen_ai.system`, `gen_ai.usage.*_tokens`, `llm.is_streaming`, and the
prompt and answer as `gen_ai.input.messages`/`gen_ai.output.messages`) with a
`raw_gen_ai_request` child holding the raw request and answer (`llm.openai.messages`,
`llm.openai.choices`). It records the time to first token as a metric only. Inside a span of
the caller it writes its attributes onto that span instead, unless
`USE_OTEL_LITELLM_REQUEST_SPAN=true`, which the tests set: then a non-streamed call is a
`litellm_request` child of the caller's span, read as one `provider` segment with
`ttft_known: false`. A streamed call's span is logged without the caller's context: it is a
trace of its own, which latprof reads as a request of its own. Run by `nox -s litellm`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no model cost map fetched from the internet
litellm = pytest.importorskip("litellm")
pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry import trace  # noqa: E402
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: E402
from otlp_receiver import OtlpReceiver  # noqa: E402

from latprof.analysis.timeline import RequestTimeline, build_timeline  # noqa: E402
from latprof.capture.reader import read_captures  # noqa: E402
from latprof.collectors.traces import receive  # noqa: E402
from latprof.collectors.traces.otlp_json import read_otlp_json  # noqa: E402
from latprof.demo.provider import Provider  # noqa: E402

pytestmark = [
    # LiteLLM's logging thread sets attributes on spans it has ended; pydantic warns on its types
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore:Item.* using the `ReadOnly` qualifier:UserWarning"),
    pytest.mark.filterwarnings("ignore:Accessing the 'model_(computed_)?fields' attribute on the instance:DeprecationWarning"),
]

TTFT_MS = 150.0
TPOT_MS = 5.0
TOKENS = 6
CALLS = 3
MODEL = "openai/latprof-demo-1"


@dataclass
class Recording:
    path: Path
    canary: str
    answer: str

    def requests(self) -> list[RequestTimeline]:
        return list(build_timeline(read_captures([self.path])).requests)


def _litellm_spans(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(line.count('"name":"litellm_request"') + line.count('"name": "litellm_request"') for line in path.read_text().splitlines())


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    path = tmp_path_factory.mktemp("litellm-otel") / "traces.otlp.jsonl"
    canary = f"CANARY_litellm_otel_{uuid.uuid4().hex}"
    messages = [{"role": "user", "content": f"{canary}: where does the tail come from?"}]
    saved = {k: os.environ.get(k) for k in ("OTEL_EXPORTER", "OTEL_ENDPOINT", "USE_OTEL_LITELLM_REQUEST_SPAN")}
    with OtlpReceiver(path) as receiver, Provider(ttft_ms=TTFT_MS, tpot_ms=TPOT_MS, output_tokens=TOKENS, subprocess=True) as provider:
        os.environ.update({"OTEL_EXPORTER": "otlp_http", "OTEL_ENDPOINT": receiver.endpoint, "USE_OTEL_LITELLM_REQUEST_SPAN": "true"})
        tracer_provider = TracerProvider(resource=Resource.create({"service.name": "litellm-otel"}))
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=receiver.endpoint)))
        trace.set_tracer_provider(tracer_provider)  # the service's, which LiteLLM's callback uses too
        tracer = trace.get_tracer("latprof.tests.litellm")
        litellm.callbacks = ["otel"]
        try:
            answer = ""
            for _ in range(CALLS):
                with tracer.start_as_current_span("POST /whole", kind=trace.SpanKind.SERVER):
                    answer = litellm.completion(model=MODEL, api_base=provider.url, api_key="unused", messages=messages)
                    time.sleep(0.05)  # the service's own work after the call
            with tracer.start_as_current_span("POST /stream", kind=trace.SpanKind.SERVER):
                stream = litellm.completion(model=MODEL, api_base=provider.url, api_key="unused", messages=messages, stream=True)
                text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            deadline = time.monotonic() + 20  # LiteLLM exports from its logging thread, after the call
            while _litellm_spans(path) < CALLS + 1 and time.monotonic() < deadline:
                tracer_provider.force_flush()
                time.sleep(0.1)
            receiver.wait_idle(0.5)
        finally:
            litellm.callbacks = []
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    assert text and _litellm_spans(path) == CALLS + 1
    return Recording(path, canary, answer.choices[0].message.content)


def test_a_non_streamed_call_is_one_provider_segment_of_the_callers_request(recording: Recording) -> None:
    whole = [rt for rt in recording.requests() if rt.request.route == "POST /whole"]
    assert len(whole) == CALLS
    for rt in whole:
        (call,) = [s for s in rt.segments if s.layer in ("provider", "model")]
        assert call.layer == "provider" and call.name == "litellm_request"
        assert call.attrs["latprof.genai.instrumentation"] == "litellm"
        assert call.attrs["latprof.ttft_known"] is False  # LiteLLM's first-token time is a metric only
        assert call.attrs["gen_ai.request.model"] == "latprof-demo-1" and call.attrs["gen_ai.system"] == "openai"
        assert call.attrs["gen_ai.usage.output_tokens"] == TOKENS
        assert (call.end_ns - call.start_ns) / 1e6 >= TTFT_MS + TOKENS * TPOT_MS - 20
        assert [s.name for s in rt.segments] == ["litellm_request"]  # its raw_gen_ai_request child is dropped


def test_a_streamed_call_is_a_trace_of_its_own(recording: Recording) -> None:
    requests = recording.requests()
    (stream,) = [rt for rt in requests if rt.request.route == "POST /stream"]
    assert [s for s in stream.segments if s.layer in ("provider", "model")] == []
    (own,) = [rt for rt in requests if rt.request.route == "litellm_request"]  # LiteLLM's span, without a parent
    assert own.request.start_ns >= stream.request.start_ns


def test_no_prompt_and_no_answer_is_kept(recording: Recording, tmp_path: Path) -> None:
    raw = recording.path.read_text()
    assert recording.canary in raw and recording.answer in raw and "llm.openai.messages" in raw  # LiteLLM recorded them
    kept = json.dumps([dict(s.attrs) for rt in recording.requests() for s in rt.segments], default=str)
    assert recording.canary not in kept and recording.answer not in kept
    # what `latprof receive` writes of these spans
    written = receive.encode_request(read_otlp_json(recording.path).spans).decode()
    assert "raw_gen_ai_request" in written and "llm.openai." not in written
    assert recording.canary not in written and recording.answer not in written
    report = subprocess.run([sys.executable, "-m", "latprof", "analyze", str(recording.path), "--format", "json", "--skip-warmup", "0"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert recording.canary not in report.stdout and recording.answer not in report.stdout
