"""OpenTelemetry's official openai instrumentation (`opentelemetry-instrumentation-openai-v2`): its spans read as latprof's LLM calls.

It follows the GenAI semantic conventions: `gen_ai.operation.name` chat, `gen_ai.request.model`,
`gen_ai.usage.input_tokens`/`output_tokens` (a stream's only when it asked for usage). With
`opentelemetry-util-genai` 1.1b0 (the newest that 2.4b0 imports) a stream's time to first chunk
is the metric `gen_ai.client.operation.time_to_first_chunk` only, not on the span: every call is
then `latprof.ttft_known: false`. (util-genai 1.3b0 records `gen_ai.response.time_to_first_chunk`
on the span, which latprof reads; openai-v2 2.4b0 does not run on it.) Prompts are not recorded
unless asked for. Run by `nox -s genai_otel_v2`.
"""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.instrumentation.openai_v2")

from genai_calls import (  # noqa: E402
    Recording,
    assert_no_content,
    assert_streamed_calls_have_no_ttft,
    assert_unstreamed_calls_are_split_by_the_fit,
    record_calls,
    sdk_export,
)
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor  # noqa: E402


#: The stock SDK exporting OTLP/HTTP to `endpoint`, and openai-v2 instrumenting openai (message content captured, to test privacy).
_export = sdk_export("genai-otel-openai-v2", OpenAIInstrumentor())


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
        env.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
        return record_calls(tmp_path_factory.mktemp("otel-openai-v2"), _export)


def test_streamed_calls_have_their_tokens_read_but_no_ttft(recording: Recording) -> None:
    assert_streamed_calls_have_no_ttft(recording.requests())


def test_non_streamed_calls_have_no_ttft_and_are_split_by_the_fit(recording: Recording) -> None:
    assert_unstreamed_calls_are_split_by_the_fit(recording.requests())


def test_the_report_carries_no_prompt_and_no_answer(recording: Recording) -> None:
    raw = recording.path.read_text()
    assert recording.canary in raw and recording.answers[0] in raw  # the instrumentation recorded them
    assert_no_content(recording, recording.report_json())
