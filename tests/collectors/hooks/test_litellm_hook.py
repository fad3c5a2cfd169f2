"""The LiteLLM hook against the demo provider: real `litellm.completion` / `acompletion` calls, counted once.

LiteLLM is the `test-litellm` extra, tested in an environment of its own (`nox -s litellm`):
skipped where it is not installed. LiteLLM fetches its model cost map from the internet when
imported unless `LITELLM_LOCAL_MODEL_COST_MAP` is set: it is, and an audit hook checks that the
process connects to nothing but 127.0.0.1 while the tests run.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from recording import recording

if importlib.util.find_spec("litellm") is None:
    pytest.skip("LiteLLM is the test-litellm extra (nox -s litellm)", allow_module_level=True)

CONNECTS: list[str] = []  # every address this process connected to or looked up, from LiteLLM's import on


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.connect":
        CONNECTS.append(str(args[1][0] if isinstance(args[1], tuple) else args[1]))
    elif event == "socket.getaddrinfo":
        CONNECTS.append(str(args[0]))


sys.addaudithook(_audit)
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
from litellm import completion  # noqa: E402  # bound before the hook is installed: the hook finds it

from latprof.capture.reader import read_captures  # noqa: E402
from latprof.collectors.hooks import aiohttp_client, httpx, openai, runtime  # noqa: E402
from latprof.collectors.hooks import litellm as hook  # noqa: E402
from latprof.demo.provider import Provider  # noqa: E402
from latprof.events import QualityRecord, Request, Segment  # noqa: E402

pytestmark = [
    # LiteLLM caches its async HTTP clients per event loop and leaves them open when the loop ends
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    # pydantic on what LiteLLM does: TypedDicts it imports at the first call, a usage chunk it builds
    pytest.mark.filterwarnings("ignore:Item.* using the `ReadOnly` qualifier:UserWarning"),
    pytest.mark.filterwarnings("ignore:Accessing the 'model_(computed_)?fields' attribute on the instance:DeprecationWarning"),
]

TTFT_MS = 300
TPOT_MS = 10
TOKENS = 20
MODEL = "openai/latprof-demo-1"
MESSAGES = [{"role": "user", "content": "Which layer owns the p99?"}]
# Loose upper bounds: a loaded 2-core machine may be slow, never fast (LiteLLM adds its own milliseconds).
SLACK_MS = 1500
#: The hooks that would see LiteLLM's HTTP request again, were the call not counted once.
OTHERS = (openai, httpx, aiohttp_client)


@pytest.fixture(scope="module")
def provider():
    with Provider(ttft_ms=TTFT_MS, tpot_ms=TPOT_MS, output_tokens=TOKENS, seed=7) as running:
        # LiteLLM's first call loads what it loads lazily: paid here, outside any test's timing
        litellm.completion(model=MODEL, api_base=running.url, api_key="unused", messages=MESSAGES,
                           extra_body={"latprof": {"ttft_ms": 0, "tpot_ms": 0}})  # fmt: skip
        yield running


@pytest.fixture(scope="module", autouse=True)
def hooks():
    for other in OTHERS:
        other.install()
    yield
    hook.uninstall()
    for other in OTHERS:
        other.uninstall()


@pytest.fixture
def recorded():
    hook.install()
    with recording() as events:
        yield events


def kwargs(provider: Provider, **more: Any) -> dict[str, Any]:
    return {"model": MODEL, "api_base": provider.url, "api_key": "unused", "messages": MESSAGES, **more}


def in_request(fn):
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
    """The provider and model (or None) segments of the only LLM call recorded: counted once, by this hook."""
    (provider,) = segments(events, "provider")
    models = segments(events, "model")
    assert len(models) <= 1
    assert segments(events, "tool") == []  # the HTTP hooks left LiteLLM's request to it ...
    assert "http.request.method" not in provider.attrs  # ... and the one provider segment is this hook's
    return provider, (models[0] if models else None)


def text_of(stream) -> tuple[str, int]:
    parts = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    return "".join(parts), len(parts)


# --- completion ----------------------------------------------------------------------------------


def test_a_name_bound_before_install_is_patched_and_restored():
    hook.uninstall()
    original = completion
    assert litellm.completion is original
    hook.install()
    try:
        assert completion is litellm.completion is litellm.chat_completions.dispatch.completion
        assert completion.__latprof_original__ is original
    finally:
        hook.uninstall()
    assert completion is litellm.completion is original
    hook.install()


def test_a_streamed_completion_is_provider_until_the_first_token_then_model(recorded, provider):
    hook.uninstall()
    unhooked = text_of(completion(**kwargs(provider), stream=True))  # outside a request: the httpx hook records nothing
    hook.install()

    text, chunks = in_request(lambda: text_of(completion(**kwargs(provider), stream=True)))

    assert (text, chunks) == unhooked and len(text.split()) == TOKENS
    provider_segment, model = one_call(recorded)
    # The role-only chunk comes right after the headers; TTFT waits for the first content.
    assert TTFT_MS - 50 <= ms(provider_segment) <= TTFT_MS + SLACK_MS
    assert model is not None and TOKENS * TPOT_MS * 0.75 <= ms(model) <= TOKENS * TPOT_MS + SLACK_MS
    assert provider_segment.end_ns == model.start_ns
    for segment in (provider_segment, model):
        assert segment.name == "chat latprof-demo-1"
        assert segment.attrs["latprof.llm_call_id"] == provider_segment.attrs["latprof.llm_call_id"]
        assert segment.attrs["latprof.ttft_known"] is True
        assert segment.attrs["gen_ai.operation.name"] == "chat" and segment.attrs["gen_ai.provider.name"] == "openai"
        assert segment.attrs["gen_ai.request.model"] == "latprof-demo-1" == segment.attrs["gen_ai.response.model"]
        assert segment.attrs["server.address"] == "127.0.0.1"
        assert segment.attrs["latprof.output_chunks"] == TOKENS
        assert "gen_ai.usage.output_tokens" not in segment.attrs  # not asked for, so not sent
    (root,) = [e for e in recorded if isinstance(e, Request)]
    assert provider_segment.request_id == model.request_id == root.request_id


def test_usage_is_recorded_when_the_caller_asked_for_it(recorded, provider):
    chunks = in_request(lambda: list(completion(**kwargs(provider), stream=True, stream_options={"include_usage": True})))

    usage = chunks[-1].usage
    assert usage.completion_tokens == TOKENS
    provider_segment, model = one_call(recorded)
    assert model is not None and model.attrs["gen_ai.usage.output_tokens"] == TOKENS
    assert provider_segment.attrs["gen_ai.usage.input_tokens"] == usage.prompt_tokens > 0


def test_a_non_streamed_completion_is_one_provider_segment_without_ttft(recorded, provider):
    answer = in_request(lambda: completion(**kwargs(provider)))

    provider_segment, model = one_call(recorded)
    assert model is None
    assert provider_segment.attrs["latprof.ttft_known"] is False
    assert provider_segment.attrs["gen_ai.usage.output_tokens"] == answer.usage.completion_tokens == TOKENS
    assert provider_segment.attrs["gen_ai.usage.input_tokens"] == answer.usage.prompt_tokens
    assert provider_segment.attrs["gen_ai.provider.name"] == "openai"
    assert "latprof.output_chunks" not in provider_segment.attrs
    assert TTFT_MS + TOKENS * TPOT_MS - 50 <= ms(provider_segment) <= TTFT_MS + TOKENS * TPOT_MS + SLACK_MS


def test_the_provider_is_the_one_litellm_resolved_and_the_model_loses_its_prefix(recorded, provider):
    in_request(lambda: completion(**{**kwargs(provider), "model": "hosted_vllm/latprof-demo-1"},
                                  extra_body={"latprof": {"ttft_ms": 0, "tpot_ms": 0}}))  # fmt: skip

    provider_segment, _ = one_call(recorded)
    assert provider_segment.attrs["gen_ai.provider.name"] == "hosted_vllm"
    assert provider_segment.attrs["gen_ai.request.model"] == "latprof-demo-1"


# --- acompletion ---------------------------------------------------------------------------------


def test_acompletion_streamed_and_not(recorded, provider):
    async def main():
        token = runtime.begin_request("POST /chat", runtime.now_ns())
        stream = await litellm.acompletion(**kwargs(provider), stream=True)
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
        runtime.end_request(token)
        token = runtime.begin_request("POST /chat", runtime.now_ns())
        answer = await litellm.acompletion(**kwargs(provider))
        runtime.end_request(token)
        token = runtime.begin_request("POST /chat", runtime.now_ns())
        legacy = await completion(**kwargs(provider), acompletion=True)  # the coroutine is the call
        runtime.end_request(token)
        return text, answer, legacy

    text, answer, legacy = asyncio.run(main())

    assert len(text.split()) == TOKENS and answer.usage.completion_tokens == legacy.usage.completion_tokens == TOKENS
    streamed, whole, coroutine = [[s for s in segments(recorded) if s.request_id == r.request_id]
                                  for r in recorded if isinstance(r, Request)]  # fmt: skip
    provider_segment, model = one_call(streamed)
    assert TTFT_MS - 50 <= ms(provider_segment) <= TTFT_MS + SLACK_MS
    assert model is not None and TOKENS * TPOT_MS * 0.75 <= ms(model) <= TOKENS * TPOT_MS + SLACK_MS
    assert model.attrs["latprof.ttft_known"] is True and model.attrs["latprof.output_chunks"] == TOKENS
    for calls in (whole, coroutine):
        provider_segment, model = one_call(calls)
        assert model is None and provider_segment.attrs["latprof.ttft_known"] is False
        assert provider_segment.attrs["gen_ai.usage.output_tokens"] == TOKENS
        assert TTFT_MS + TOKENS * TPOT_MS - 50 <= ms(provider_segment) <= TTFT_MS + TOKENS * TPOT_MS + SLACK_MS


# --- retries and errors --------------------------------------------------------------------------


def test_num_retries_backoff_is_retry_inside_the_one_call(recorded, provider):
    # For an OpenAI-compatible model LiteLLM hands num_retries to the openai client, whose backoff the openai hook times.
    fault = {"fail_first": 2, "retry_after_ms": 200, "ttft_ms": 20}
    answer = in_request(lambda: completion(**kwargs(provider), num_retries=2, extra_body={"latprof": fault}))

    assert answer.usage.completion_tokens == TOKENS
    provider_segment, _ = one_call(recorded)
    retries = segments(recorded, "retry")
    assert len(retries) == 2
    for n, retry in enumerate(retries, start=1):
        assert 150 <= ms(retry) <= 200 + SLACK_MS
        assert retry.parent_id == provider_segment.segment_id
        assert provider_segment.start_ns <= retry.start_ns <= retry.end_ns <= provider_segment.end_ns
        assert retry.attrs == {"http.response.status_code": 429, "http.request.resend_count": n}
    assert ms(provider_segment) >= 2 * 150 + 20


def test_an_error_is_raised_unchanged_and_recorded_with_its_status(recorded, provider):
    def fail():
        with pytest.raises(litellm.RateLimitError) as raised:
            completion(**kwargs(provider), max_retries=0, extra_body={"latprof": {"fail_first": 1}})
        return raised.value

    hook.uninstall()
    unhooked = fail()
    hook.install()
    error = in_request(fail)

    assert type(error) is type(unhooked) and error.status_code == unhooked.status_code == 429
    provider_segment, model = one_call(recorded)
    assert model is None
    assert provider_segment.attrs["error.type"] == "RateLimitError"
    assert provider_segment.attrs["http.response.status_code"] == 429
    assert provider_segment.attrs["gen_ai.provider.name"] == "openai"


# --- streams left early, outside requests, the hook's own safety ---------------------------------


def test_a_stream_closed_early_ends_its_segments_once_at_the_last_chunk_read(recorded, provider):
    def call():
        stream = completion(**kwargs(provider), stream=True)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        stream.close()
        stream.close()  # a second close changes nothing
        return stream

    stream = in_request(call)

    provider_segment, model = one_call(recorded)
    assert TTFT_MS - 50 <= ms(provider_segment) <= TTFT_MS + SLACK_MS
    assert model is not None and ms(model) < TOKENS * TPOT_MS  # ended at the last chunk read
    assert model.attrs["latprof.output_chunks"] == 1
    del stream
    gc.collect()
    assert len(segments(recorded)) == 2 and hook._streams == {}


def test_a_stream_dropped_unread_is_recorded_when_collected(recorded, provider):
    def call():
        stream = completion(**kwargs(provider), stream=True)
        next(stream)  # the role chunk: no token yet

    in_request(call)
    # LiteLLM's logging thread holds the stream until it has logged the chunk read
    deadline = time.monotonic() + 10
    while not segments(recorded) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.02)

    provider_segment, model = one_call(recorded)
    assert model is None and provider_segment.attrs["latprof.ttft_known"] is False
    assert ms(provider_segment) < TTFT_MS
    assert hook._streams == {}


def test_nothing_is_recorded_outside_a_request(recorded, provider):
    watched = len(hook._streams)
    text, _ = text_of(completion(**kwargs(provider), stream=True))
    completion(**kwargs(provider), extra_body={"latprof": {"ttft_ms": 0, "tpot_ms": 0}})

    assert text and recorded == [] and len(hook._streams) == watched


def test_a_failing_hook_is_counted_and_the_call_still_works(recorded, provider, monkeypatch):
    def broken(*args):
        raise RuntimeError("hook bug")

    monkeypatch.setattr(hook, "_without_prefix", broken)  # called when a call is recorded
    watched = len(hook._streams)

    text, _ = in_request(lambda: text_of(completion(**kwargs(provider), stream=True)))

    assert len(text.split()) == TOKENS
    assert segments(recorded) == [] and len(hook._streams) == watched
    runtime.report_errors(force=True)
    notes = [e for e in recorded if isinstance(e, QualityRecord) and e.kind == "error" and e.attrs.get("collector") == "litellm"]
    assert sum(n.occurrences for n in notes) == 1 and notes[-1].attrs["latprof.last_error"].startswith("RuntimeError at ")


def test_no_prompt_and_no_answer_is_recorded(recorded, provider):
    canary = f"CANARY_litellm_{uuid.uuid4().hex}"
    messages = [{"role": "system", "content": f"{canary} system"}, {"role": "user", "content": f"{canary} prompt"}]
    answer = in_request(lambda: completion(**{**kwargs(provider), "messages": messages}, user=f"{canary}_user"))
    text, _ = in_request(lambda: text_of(completion(**{**kwargs(provider), "messages": messages}, stream=True)))

    written = repr(recorded)
    assert len(segments(recorded, "provider")) == 2
    assert canary not in written and answer.choices[0].message.content not in written and text not in written
    assert "unused" not in written  # the API key


def test_the_process_connected_to_nothing_but_loopback(provider):
    in_request(lambda: text_of(completion(**kwargs(provider), stream=True)))
    assert CONNECTS and set(CONNECTS) <= {"127.0.0.1"}, sorted(set(CONNECTS))


# --- under `latprof run` -------------------------------------------------------------------------

APP = Path(__file__).parent / "apps" / "litellm_app.py"


def test_latprof_run_records_each_call_once_and_nothing_it_should_not(tmp_path: Path):
    canary = f"CANARY_litellm_{uuid.uuid4().hex}"
    connects = tmp_path / "connects.txt"
    with Provider(ttft_ms=100, tpot_ms=5, output_tokens=10) as fast:
        result = subprocess.run(
            [sys.executable, "-m", "latprof", "run", "--out", str(tmp_path / "capture.jsonl"), "--format", "json",
             "--skip-warmup", "0", "--", sys.executable, str(APP), fast.url, canary, str(connects)],
            capture_output=True, text=True, timeout=180, cwd=tmp_path, check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = read_captures([tmp_path / "capture.jsonl"])
    (loaded,) = [q for q in data.quality if q.kind == "hooks_loaded"]
    assert "litellm" in loaded.attrs["collectors"]
    assert not [q for q in data.quality if q.kind in ("error", "hook_off", "untested_version")], data.quality
    layers = {r.route: sorted(s.layer for s in data.segments_by_request[r.request_id] if s.layer in ("provider", "model", "tool"))
              for r in data.requests}  # fmt: skip
    streamed, whole = ["model", "provider"], ["provider"]
    assert layers == {"POST /stream": streamed, "POST /whole": whole, "POST /astream": streamed, "POST /awhole": whole}
    for request in data.requests:
        provider = next(s for s in data.segments_by_request[request.request_id] if s.layer == "provider")
        assert provider.attrs["gen_ai.provider.name"] == "openai" and ms(provider) >= 80
    # No prompt, answer or key in what latprof wrote, and no connection but to the provider.
    assert canary not in (tmp_path / "capture.jsonl").read_text() + result.stdout + result.stderr
    assert set(connects.read_text().split()) == {"127.0.0.1"}
