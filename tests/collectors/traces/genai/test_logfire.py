"""Logfire's openai instrumentation (`logfire.instrument_openai()`), exporting to a local OTLP endpoint: its spans read as latprof's LLM calls.

`logfire.configure(send_to_logfire=False)` with `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set exports
through the stock OTLP/HTTP exporter to that endpoint only. Logfire names a call by the GenAI
conventions (`gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.usage.input_tokens`/
`output_tokens`). A non-streamed call is one span. A streamed call is two: the request span,
which ends when openai returns the stream (the response headers), and a log record (a
zero-length span, `logfire.span_type: log`) at the stream's end whose `duration` is the stream's
time and which carries the usage. Logfire records no first-token time: every call is
`latprof.ttft_known: false`. It records prompts and answers (`gen_ai.input.messages`,
`gen_ai.output.messages`) by default. Run by `nox -s genai_logfire`.
"""

from __future__ import annotations

from typing import Callable

import pytest

logfire = pytest.importorskip("logfire")

from genai_calls import (  # noqa: E402
    STREAMED_MODEL,
    Recording,
    assert_no_content,
    assert_streamed_calls_have_no_ttft,
    assert_unstreamed_calls_are_split_by_the_fit,
    llm_segments,
    record_calls,
)


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    with pytest.MonkeyPatch.context() as env:

        def export(endpoint: str) -> Callable[[], None]:
            """Logfire, sending nothing to its cloud, exporting to `endpoint` with the stock OTLP exporter; openai instrumented."""
            env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
            logfire.configure(send_to_logfire=False, console=False, service_name="genai-logfire", metrics=False)
            logfire.instrument_openai()
            return lambda: None if logfire.force_flush() else pytest.fail("spans not flushed")

        return record_calls(tmp_path_factory.mktemp("logfire"), export)


def test_streamed_calls_are_the_stream_log_with_tokens_and_no_ttft(recording: Recording) -> None:
    requests = recording.requests()
    assert_streamed_calls_have_no_ttft(requests)
    for segments in llm_segments(requests, STREAMED_MODEL):  # request span (to the headers) + stream: the whole call
        assert 150 <= sum(s.end_ns - s.start_ns for s in segments) / 1e6 < 400


def test_non_streamed_calls_have_no_ttft_and_are_split_by_the_fit(recording: Recording) -> None:
    assert_unstreamed_calls_are_split_by_the_fit(recording.requests())


def test_the_report_carries_no_prompt_and_no_answer(recording: Recording) -> None:
    raw = recording.path.read_text()
    assert recording.canary in raw and recording.answers[0] in raw  # the instrumentation recorded them
    assert_no_content(recording, recording.report_json())
