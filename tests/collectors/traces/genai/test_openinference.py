"""OpenInference's openai instrumentation (Arize Phoenix): its spans read as latprof's LLM calls.

OpenInference marks an LLM span with `openinference.span.kind: LLM` (no `gen_ai.operation.name`),
names the model `llm.model_name` and the tokens `llm.token_count.prompt`/`completion`, and adds a
`First Token Stream Event` when a stream's first chunk arrives. It records prompts and answers
(`input.value`, `llm.input_messages.*`, ...) by default. Run by `nox -s genai_openinference`.
"""

from __future__ import annotations

import pytest

pytest.importorskip("openinference.instrumentation.openai")

from genai_calls import (  # noqa: E402
    Recording,
    assert_no_content,
    assert_streamed_calls_split_at_the_first_token,
    assert_unstreamed_calls_are_split_by_the_fit,
    record_calls,
    sdk_export,
)
from openinference.instrumentation.openai import OpenAIInstrumentor  # noqa: E402


#: The stock SDK exporting OTLP/HTTP to `endpoint`, and OpenInference instrumenting openai.
_export = sdk_export("genai-openinference", OpenAIInstrumentor())


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    # OpenAI sends the role with the first token; a role-only chunk sent at once would be OpenInference's "first token"
    return record_calls(tmp_path_factory.mktemp("openinference"), _export, role_chunk_first=False)


def test_streamed_calls_are_split_at_the_first_token_event(recording: Recording) -> None:
    assert_streamed_calls_split_at_the_first_token(recording.requests())


def test_non_streamed_calls_have_no_ttft_and_are_split_by_the_fit(recording: Recording) -> None:
    assert_unstreamed_calls_are_split_by_the_fit(recording.requests())


def test_the_report_carries_no_prompt_and_no_answer(recording: Recording) -> None:
    raw = recording.path.read_text()
    assert recording.canary in raw and recording.answers[0] in raw  # the instrumentation recorded them
    assert_no_content(recording, recording.report_json())
