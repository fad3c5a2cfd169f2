"""OpenLLMetry's openai instrumentation (traceloop's `opentelemetry-instrumentation-openai`): its spans read as latprof's LLM calls.

OpenLLMetry names a call by the GenAI conventions (`gen_ai.operation.name`, `gen_ai.request.model`,
`gen_ai.usage.input_tokens`/`output_tokens`; older releases `llm.request.type` and
`gen_ai.usage.prompt_tokens`/`completion_tokens`) and adds one `gen_ai.content.completion.chunk`
event per streamed chunk: the first is the first token. Its time to first token is otherwise a
metric. It records prompts and answers (`gen_ai.input.messages`, `gen_ai.output.messages`, or
`gen_ai.prompt.*`/`gen_ai.completion.*`) by default. Run by `nox -s genai_openllmetry`.
"""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.instrumentation.openai")
# its response wrappers use pydantic's class-based config, deprecated (a warning, an error under filterwarnings=error)
pytestmark = pytest.mark.filterwarnings("ignore:Support for class-based `config` is deprecated:DeprecationWarning")

from genai_calls import (  # noqa: E402
    Recording,
    assert_no_content,
    assert_streamed_calls_split_at_the_first_token,
    assert_unstreamed_calls_are_split_by_the_fit,
    record_calls,
    sdk_export,
)
from opentelemetry.instrumentation.openai import OpenAIInstrumentor  # noqa: E402


#: The stock SDK exporting OTLP/HTTP to `endpoint`, and OpenLLMetry instrumenting openai.
_export = sdk_export("genai-openllmetry", OpenAIInstrumentor())


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    # OpenAI sends the role with the first token; a role-only chunk sent at once would be OpenLLMetry's first chunk event
    return record_calls(tmp_path_factory.mktemp("openllmetry"), _export, role_chunk_first=False)


def test_streamed_calls_are_split_at_the_first_chunk_event(recording: Recording) -> None:
    assert_streamed_calls_split_at_the_first_token(recording.requests())


def test_non_streamed_calls_have_no_ttft_and_are_split_by_the_fit(recording: Recording) -> None:
    assert_unstreamed_calls_are_split_by_the_fit(recording.requests())


def test_the_report_carries_no_prompt_and_no_answer(recording: Recording) -> None:
    raw = recording.path.read_text()
    assert recording.canary in raw and recording.answers[0] in raw  # the instrumentation recorded them
    assert_no_content(recording, recording.report_json())
