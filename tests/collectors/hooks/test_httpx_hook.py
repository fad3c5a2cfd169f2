"""The httpx / httpx2 hook against real local servers: pool waits, tool calls, raw LLM calls, the openai client on top."""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from apps.httpx_services import ANTHROPIC_INPUT_TOKENS, ANTHROPIC_MODEL, ToolService
from recording import ListWriter, recording

import httpx

from latprof.collectors.hooks import httpx as hook
from latprof.collectors.hooks import openai as openai_hook
from latprof.collectors.hooks import _scaffold, runtime
from latprof.demo.provider import Provider
from latprof.events import Gauge, QualityRecord, Request, Segment
from latprof.layers import HTTP_POOL, MODEL, PROVIDER, TOOL
from latprof.semconv import LAST_ERROR

FAMILIES = ["httpx", "httpx2"]  # httpx2 (openai 3.x's HTTP client) may be absent: those tests skip
HOLD_MS = 250  # how long the tool service takes to answer /slow
TTFT_MS = 300
TPOT_MS = 10
TOKENS = 20
# Loose upper bounds: a loaded 2-core machine may be slow, never fast.
SLACK_MS = 1500
SECRET = "s3cr3t-query-value"
CHAT = [{"role": "user", "content": "Which layer owns the p99?"}]


def family(name: str) -> Any:
    return pytest.importorskip(name)


@pytest.fixture(scope="module")
def tools():
    with ToolService() as service:
        yield service


@pytest.fixture(scope="module")
def provider():
    with Provider(ttft_ms=TTFT_MS, tpot_ms=TPOT_MS, output_tokens=TOKENS, seed=7) as running:
        yield running


@pytest.fixture
def recorded():
    hook.install()
    openai_hook.install()
    try:
        with recording() as events:
            yield events
    finally:
        hook.uninstall()
        openai_hook.uninstall()


def in_request(fn: Callable[[], Any], route: str = "GET /agent") -> Any:
    token = runtime.begin_request(route, runtime.now_ns())
    try:
        return fn()
    finally:
        runtime.end_request(token)


def concurrently(*fns: Callable[[], Any]) -> list[Any]:
    """Run each fn in its own thread, in a copy of this context (as anyio/asyncio would); their results."""
    results: list[Any] = [None] * len(fns)
    errors: list[BaseException] = []

    def run(i: int, fn: Callable[[], Any]) -> None:
        try:
            results[i] = fn()
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = []
    for i, fn in enumerate(fns):
        threads.append(threading.Thread(target=contextvars.copy_context().run, args=(run, i, fn)))
        threads[-1].start()
        time.sleep(0.05)  # in order: the first takes the only connection
    for thread in threads:
        thread.join(30)
    if errors:
        raise errors[0]
    return results


def segments(events: list[Any], layer: str | None = None) -> list[Segment]:
    return [e for e in events if isinstance(e, Segment) and (layer is None or e.layer == layer)]


def gauges(events: list[Any], name: str) -> list[float]:
    return [e.value for e in events if isinstance(e, Gauge) and e.name == name]


def ms(segment: Segment) -> float:
    return (segment.end_ns - segment.start_ns) / 1e6


def errors_of(events: list[Any]) -> list[QualityRecord]:
    runtime.report_errors(force=True)
    return [q for q in events if isinstance(q, QualityRecord) and q.kind == "error" and q.attrs.get("collector") == "httpx"]


def assert_one_pool_wait(events: list[Any], lib: str) -> Segment:
    """Two calls on a pool of one: the second waited about one hold for the slot, nested in its own tool segment."""
    (wait,) = segments(events, HTTP_POOL)
    calls = segments(events, TOOL)
    assert len(calls) == 2
    assert HOLD_MS - 50 - 60 <= ms(wait) <= HOLD_MS + SLACK_MS  # the second started ~50 ms after the first
    assert wait.name == f"{lib} pool wait"
    assert wait.attrs["latprof.http.pool.max_connections"] == 1
    assert wait.attrs["latprof.http.pool.max_keepalive_connections"] == 1
    assert wait.attrs["latprof.http.pool.name"].startswith(f"{lib} pool ")
    assert wait.attrs["server.address"] == "127.0.0.1"
    waiting_call = max(calls, key=lambda s: s.start_ns)
    assert wait.parent_id == waiting_call.segment_id
    assert waiting_call.start_ns <= wait.start_ns and wait.end_ns <= waiting_call.end_ns
    assert ms(waiting_call) >= ms(wait) + HOLD_MS * 0.8  # its own call came after the wait
    assert max(gauges(events, hook.GAUGE_HTTP_POOL_WAITERS)) == 1
    assert max(gauges(events, hook.GAUGE_HTTP_POOL_IN_USE)) == 1
    assert set(gauges(events, hook.GAUGE_HTTP_POOL_MAX)) == {1}
    (root,) = [e for e in events if isinstance(e, Request)]
    assert {s.request_id for s in segments(events)} == {root.request_id}
    assert not errors_of(events)
    return wait


# --- pool waits ---------------------------------------------------------------------------------


@pytest.mark.parametrize("lib", FAMILIES)
def test_sync_client_a_request_waiting_for_the_only_connection_gets_an_http_pool_segment(recorded, tools, lib):
    x = family(lib)
    with x.Client(limits=x.Limits(max_connections=1)) as client:
        url = f"{tools.url}/slow?ms={HOLD_MS}"
        responses = in_request(lambda: concurrently(lambda: client.get(url), lambda: client.get(url)))
    assert [r.status_code for r in responses] == [200, 200]
    assert_one_pool_wait(recorded, lib)


@pytest.mark.parametrize("lib", FAMILIES)
def test_async_client_a_task_waiting_for_the_only_connection_gets_an_http_pool_segment(recorded, tools, lib):
    x = family(lib)

    async def main() -> list[Any]:
        async with x.AsyncClient(limits=x.Limits(max_connections=1)) as client:
            url = f"{tools.url}/slow?ms={HOLD_MS}"

            async def second() -> Any:
                await asyncio.sleep(0.05)
                return await client.get(url)

            token = runtime.begin_request("GET /agent", runtime.now_ns())
            try:
                return list(await asyncio.gather(client.get(url), second()))
            finally:
                runtime.end_request(token)

    responses = asyncio.run(main())
    assert [r.status_code for r in responses] == [200, 200]
    assert_one_pool_wait(recorded, lib)


def test_a_free_connection_is_no_wait(recorded, tools):
    with httpx.Client(limits=httpx.Limits(max_connections=1)) as client:
        in_request(lambda: [client.get(f"{tools.url}/slow?ms=20") for _ in range(3)])
    assert len(segments(recorded, TOOL)) == 3
    assert segments(recorded, HTTP_POOL) == []
    assert max(gauges(recorded, hook.GAUGE_HTTP_POOL_WAITERS)) == 0


def test_a_pool_timeout_is_a_pool_wait_with_its_error(recorded, tools):
    with httpx.Client(limits=httpx.Limits(max_connections=1), timeout=httpx.Timeout(10, pool=0.1)) as client:
        def second() -> Any:
            with pytest.raises(httpx.PoolTimeout):
                client.get(f"{tools.url}/slow?ms=1")

        in_request(lambda: concurrently(lambda: client.get(f"{tools.url}/slow?ms={HOLD_MS}"), second))
    (wait,) = segments(recorded, HTTP_POOL)
    assert wait.attrs["error.type"] == "PoolTimeout" and 90 <= ms(wait) <= 100 + SLACK_MS
    failed = [s for s in segments(recorded, TOOL) if "error.type" in s.attrs]
    assert [s.attrs["error.type"] for s in failed] == ["PoolTimeout"] and "http.response.status_code" not in failed[0].attrs


# --- tool calls ---------------------------------------------------------------------------------


@pytest.mark.parametrize("lib", FAMILIES)
def test_a_plain_call_is_a_tool_segment_with_its_status_and_never_its_query(recorded, tools, lib):
    x = family(lib)
    with x.Client() as client:
        response = in_request(lambda: client.get(f"{tools.url}/slow", params={"ms": 120, "api_key": SECRET}))
    assert response.json() == {"ok": True}
    (call,) = segments(recorded)
    assert call.layer == TOOL and call.name == "HTTP GET 127.0.0.1"
    assert call.attrs == {
        "http.request.method": "GET",
        "server.address": "127.0.0.1",
        "server.port": tools.port,
        "http.response.status_code": 200,
    }
    assert call.parent_id is None
    assert 120 <= ms(call) <= 120 + SLACK_MS
    assert SECRET not in repr(recorded) and "/slow" not in repr(recorded)


def test_error_answers_and_failed_connections_carry_error_type(recorded, tools):
    from apps.harness import free_port

    with httpx.Client() as client:
        def calls() -> None:
            assert client.get(f"{tools.url}/status/404").status_code == 404
            with pytest.raises(httpx.ConnectError):
                client.get(f"http://127.0.0.1:{free_port()}/nothing-listens")

        in_request(calls)
    answered, refused = segments(recorded, TOOL)
    assert answered.attrs["http.response.status_code"] == 404 and answered.attrs["error.type"] == "404"
    assert refused.attrs["error.type"] == "ConnectError" and "http.response.status_code" not in refused.attrs


@pytest.mark.parametrize("lib", FAMILIES)
def test_a_streamed_response_is_a_tool_call_until_it_is_closed(recorded, tools, lib):
    x = family(lib)

    def call() -> tuple[list[bytes], float]:
        with x.Client() as client:
            with client.stream("GET", f"{tools.url}/chunks?n=4&ms=60") as response:
                parts = list(response.iter_raw())
                elapsed = response.elapsed if lib == "httpx2" else None  # httpx2 reads it off the stream
            return parts, elapsed

    parts, elapsed = in_request(call)
    assert b"".join(parts) == b"chunk" * 4
    (segment,) = segments(recorded)
    assert segment.layer == TOOL and 240 <= ms(segment) <= 240 + SLACK_MS
    assert lib == "httpx" or elapsed.total_seconds() >= 0.2


def test_an_async_streamed_response_closed_early_ends_its_tool_call_at_close(recorded, tools):
    async def call() -> bytes:
        async with httpx.AsyncClient() as client:
            token = runtime.begin_request("GET /agent", runtime.now_ns())
            try:
                async with client.stream("GET", f"{tools.url}/chunks?n=20&ms=50") as response:
                    async for part in response.aiter_raw():
                        return part  # leaves after the first chunk: the response is closed
            finally:
                runtime.end_request(token)
        return b""

    assert asyncio.run(call()) == b"chunk"
    (segment,) = segments(recorded)
    assert segment.layer == TOOL and 50 <= ms(segment) <= 500 + SLACK_MS // 2  # not the whole second


# --- LLM calls without an SDK -------------------------------------------------------------------


def sse_chat(client: Any, url: str) -> tuple[str, float, float]:
    """Stream a chat completion the way a hand-written client does; (text, ms to first content, ms to end)."""
    start = time.perf_counter()
    first = None
    text = []
    with client.stream("POST", f"{url}/chat/completions", json={"model": "demo", "messages": CHAT, "stream": True}) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"]
            if delta.get("content"):
                first = first or (time.perf_counter() - start) * 1000
                text.append(delta["content"])
    return "".join(text), first or 0.0, (time.perf_counter() - start) * 1000


def one_llm_call(events: list[Any]) -> tuple[Segment, Segment | None]:
    assert segments(events, TOOL) == []
    (call,) = segments(events, PROVIDER)
    models = segments(events, MODEL)
    assert len(models) <= 1
    return call, (models[0] if models else None)


@pytest.mark.parametrize("lib", FAMILIES)
def test_a_streamed_chat_call_without_the_sdk_is_provider_until_the_first_delta_then_model(recorded, provider, lib):
    x = family(lib)
    with x.Client() as client:
        text, first_ms, total_ms = in_request(lambda: sse_chat(client, provider.url))
    assert len(text.split()) == TOKENS
    call, model = one_llm_call(recorded)
    assert model is not None
    # The role-only chunk (content "") comes right after the headers; TTFT waits for the first content.
    assert TTFT_MS - 20 <= ms(call) <= TTFT_MS + SLACK_MS
    assert abs(ms(call) - first_ms) <= 50  # the split is where the caller saw its first token
    assert TOKENS * TPOT_MS * 0.75 <= ms(model) <= TOKENS * TPOT_MS + SLACK_MS
    assert call.end_ns == model.start_ns and ms(call) + ms(model) <= total_ms + 5
    for segment in (call, model):
        assert segment.name == "chat demo"
        assert segment.attrs["latprof.ttft_known"] is True
        assert segment.attrs["latprof.llm_call_id"] == call.attrs["latprof.llm_call_id"]
        assert segment.attrs["latprof.output_chunks"] == TOKENS
        assert segment.attrs["gen_ai.operation.name"] == "chat" and segment.attrs["gen_ai.provider.name"] == "openai"
        assert segment.attrs["gen_ai.response.model"] == "demo"
        assert segment.attrs["http.response.status_code"] == 200 and segment.attrs["server.port"] == provider.port
        assert "gen_ai.usage.output_tokens" not in segment.attrs  # the caller did not ask for usage


def test_an_async_responses_stream_ends_ttft_at_the_first_delta_event_not_at_response_created(recorded, provider):
    async def call() -> list[str]:
        async with httpx.AsyncClient() as client:
            token = runtime.begin_request("GET /agent", runtime.now_ns())
            try:
                body = {"model": "demo", "input": "Which layer owns the p99?", "stream": True}
                async with client.stream("POST", f"{provider.url}/responses", json=body) as response:
                    return [line async for line in response.aiter_lines() if line.startswith("event: ")]
            finally:
                runtime.end_request(token)

    kinds = asyncio.run(call())
    assert kinds[0] == "event: response.created" and kinds[-1] == "event: response.completed"
    call_segment, model = one_llm_call(recorded)
    assert TTFT_MS - 20 <= ms(call_segment) <= TTFT_MS + SLACK_MS
    assert model is not None and model.attrs["latprof.output_chunks"] == TOKENS
    assert model.attrs["gen_ai.usage.output_tokens"] == TOKENS  # from response.completed
    assert model.attrs["gen_ai.usage.input_tokens"] > 0


@pytest.mark.parametrize("gzip", [False, True], ids=["plain", "gzip"])
def test_an_anthropic_messages_stream_splits_at_the_first_content_block_delta(recorded, tools, gzip):
    def call() -> list[str]:
        with httpx.Client() as client:
            url = f"{tools.url}/v1/messages?ttft_ms=250&tpot_ms=20&tokens=5&gzip={int(gzip)}"
            with client.stream("POST", url, json={"model": "claude", "messages": CHAT, "stream": True}) as response:
                assert response.headers.get("content-encoding") == ("gzip" if gzip else None)
                return [line for line in response.iter_lines() if line.startswith("data: ")]

    lines = in_request(call)
    assert json.loads(lines[-1][6:])["type"] == "message_stop"
    call_segment, model = one_llm_call(recorded)
    assert 250 - 20 <= ms(call_segment) <= 250 + SLACK_MS  # not at the empty input_json_delta
    assert model is not None and 4 * 20 * 0.75 <= ms(model) <= 4 * 20 + SLACK_MS
    assert model.attrs["gen_ai.provider.name"] == "anthropic" and model.name == f"chat {ANTHROPIC_MODEL}"
    assert model.attrs["gen_ai.usage.input_tokens"] == ANTHROPIC_INPUT_TOKENS
    assert model.attrs["gen_ai.usage.output_tokens"] == 5 and model.attrs["latprof.output_chunks"] == 5


@pytest.mark.parametrize("lib", FAMILIES)
def test_a_non_streamed_llm_call_is_one_provider_segment_without_ttft(recorded, provider, lib):
    x = family(lib)
    with x.Client() as client:
        response = in_request(lambda: client.post(f"{provider.url}/chat/completions", json={"model": "demo", "messages": CHAT}))
    body = response.json()
    assert body["usage"]["completion_tokens"] == TOKENS
    call, model = one_llm_call(recorded)
    assert model is None
    assert TTFT_MS + TOKENS * TPOT_MS - 20 <= ms(call) <= TTFT_MS + TOKENS * TPOT_MS + SLACK_MS
    assert call.attrs["latprof.ttft_known"] is False and "latprof.output_chunks" not in call.attrs
    assert call.attrs["gen_ai.usage.output_tokens"] == TOKENS
    assert call.attrs["gen_ai.usage.input_tokens"] == body["usage"]["prompt_tokens"]
    assert call.name == "chat demo"


def test_a_body_the_caller_did_not_read_is_not_read(recorded, provider):
    def call() -> Any:
        with httpx.Client() as client:
            with client.stream("POST", f"{provider.url}/chat/completions", json={"model": "demo", "messages": CHAT}) as response:
                pass  # closed unread
            return response

    response = in_request(call)
    assert response.is_closed and not response.is_stream_consumed
    call_segment, _ = one_llm_call(recorded)
    assert call_segment.attrs["latprof.ttft_known"] is False
    assert "gen_ai.usage.output_tokens" not in call_segment.attrs and "gen_ai.response.model" not in call_segment.attrs


def test_llm_paths_are_suffixes_configurable_through_the_environment(recorded, tools):
    assert hook.llm_paths_from(None) == hook.DEFAULT_LLM_PATHS
    assert hook.llm_paths_from(" /v1/generate/ , infer") == ("/v1/generate", "/infer")
    assert hook.llm_paths_from("+/v1/generate") == (*hook.DEFAULT_LLM_PATHS, "/v1/generate")
    assert hook.llm_path("/openai/deployments/gpt-4o/chat/completions") == "/chat/completions"
    assert hook.llm_path("/v1/completions/") == "/completions"
    assert hook.llm_path("/api/mycompletions") is None and hook.llm_path("/v1/messages/count_tokens") is None
    hook.configure_llm_paths(hook.llm_paths_from("+/slow"))
    try:
        with httpx.Client() as client:
            in_request(lambda: client.get(f"{tools.url}/slow?ms=10"))
    finally:
        hook.configure_llm_paths(hook.DEFAULT_LLM_PATHS)
    (call,) = segments(recorded)
    assert call.layer == PROVIDER and call.attrs["latprof.ttft_known"] is False
    assert call.attrs["gen_ai.operation.name"] == "chat" and "gen_ai.provider.name" not in call.attrs


# --- under the openai client --------------------------------------------------------------------


def openai_http_library() -> Any:
    """The module family the installed openai client runs on: httpx2 (3.x) or httpx (2.x)."""
    base = importlib.import_module("openai._base_client")
    return getattr(base, "httpx2", None) or base.httpx


def test_an_openai_streamed_call_is_counted_once_in_the_sdk_hooks_segments(recorded, provider):
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=provider.url, api_key="unused", max_retries=0) as client:
        def call() -> str:
            stream = client.chat.completions.create(model="demo", messages=CHAT, stream=True)
            return "".join(chunk.choices[0].delta.content or "" for chunk in stream)

        text = in_request(call)
    assert len(text.split()) == TOKENS
    assert segments(recorded, TOOL) == []
    (call_segment,) = segments(recorded, PROVIDER)
    (model,) = segments(recorded, MODEL)
    # the openai hook's segments (it knows the requested model), not this hook's
    assert call_segment.attrs["gen_ai.request.model"] == "demo" and "http.request.method" not in call_segment.attrs
    assert model.attrs["latprof.llm_call_id"] == call_segment.attrs["latprof.llm_call_id"]
    assert len(segments(recorded)) == 2


def test_a_pool_wait_inside_an_openai_call_is_still_recorded_under_its_provider_segment(recorded, provider):
    openai = pytest.importorskip("openai")
    x = openai_http_library()
    with x.Client(limits=x.Limits(max_connections=1)) as http_client:
        client = openai.OpenAI(base_url=provider.url, api_key="unused", max_retries=0, http_client=http_client)

        def ask() -> str:
            stream = client.chat.completions.create(model="demo", messages=CHAT, stream=True)
            return "".join(chunk.choices[0].delta.content or "" for chunk in stream)

        texts = in_request(lambda: concurrently(ask, ask))
    assert all(len(t.split()) == TOKENS for t in texts)
    assert segments(recorded, TOOL) == []
    providers = segments(recorded, PROVIDER)
    assert len(providers) == 2 and len(segments(recorded, MODEL)) == 2
    (wait,) = segments(recorded, HTTP_POOL)
    assert wait.name == f"{x.__name__} pool wait"
    # the second call waited for the first one's whole stream: TTFT + decode
    assert TTFT_MS + TOKENS * TPOT_MS - 50 - 60 <= ms(wait) <= TTFT_MS + TOKENS * TPOT_MS + SLACK_MS
    waiting = max(providers, key=lambda s: s.start_ns)
    assert wait.parent_id == waiting.segment_id and waiting.start_ns <= wait.start_ns <= wait.end_ns <= waiting.end_ns


# --- what the hook must not do ------------------------------------------------------------------


def test_nothing_is_recorded_outside_a_request(recorded, tools, provider):
    with httpx.Client(limits=httpx.Limits(max_connections=1)) as client:
        url = f"{tools.url}/slow?ms=100"
        concurrently(lambda: client.get(url), lambda: client.get(url))
        sse_chat(client, provider.url)
    assert recorded == []


def test_install_is_idempotent_and_uninstall_restores_the_libraries(recorded):
    import httpcore

    patched = httpx.Client.__dict__["send"]
    assert getattr(patched, _scaffold.MARK) and getattr(httpcore.ConnectionPool.__dict__["handle_request"], _scaffold.MARK)
    assert hook.install() is True and httpx.Client.__dict__["send"] is patched
    hook.uninstall()
    for owner, name in ((httpx.Client, "send"), (httpx.AsyncClient, "send"), (httpcore.ConnectionPool, "handle_request"),
                        (httpcore.AsyncConnectionPool, "handle_async_request")):
        assert not hasattr(owner.__dict__[name], _scaffold.MARK), (owner, name)
    assert httpx.Client.send is patched.__wrapped__
    hook.install()
    assert getattr(httpx.Client.__dict__["send"], _scaffold.MARK)


class SegmentsFail(ListWriter):
    """A capture writer that fails on every segment: the hook's own recording raises."""

    def emit(self, event: Any) -> None:
        if isinstance(event, Segment):
            raise OSError("capture disk full")
        super().emit(event)


def test_a_failing_hook_is_counted_and_the_call_still_succeeds(tools, provider):
    hook.install()
    writer = SegmentsFail()
    runtime.start(writer)
    try:
        with httpx.Client(limits=httpx.Limits(max_connections=1)) as client:
            url = f"{tools.url}/slow?ms=100"
            results = in_request(lambda: concurrently(lambda: client.get(url).json(), lambda: client.get(url).json()))
            text, _, _ = in_request(lambda: sse_chat(client, provider.url))
        runtime.report_errors(force=True)
    finally:
        runtime.stop()
        hook.uninstall()
    assert results == [{"ok": True}, {"ok": True}] and len(text.split()) == TOKENS
    errors = [q for q in writer.events if isinstance(q, QualityRecord) and q.kind == "error" and q.attrs.get("collector") == "httpx"]
    assert sum(q.occurrences for q in errors) == 4  # two calls, one pool wait, one LLM call (its first segment)
    assert errors[-1].attrs[LAST_ERROR].startswith("OSError at ") and "disk full" not in errors[-1].attrs[LAST_ERROR]


@pytest.mark.slow
def test_a_service_that_never_imports_httpx_does_not_load_it():
    code = (
        "import sys; from latprof.collectors.hooks import httpx as hook; assert hook.install();"
        " assert not {'httpx', 'httpcore', 'httpx2', 'httpcore2'} & set(sys.modules), 'imported'; import json; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


# --- end to end: uvicorn under `latprof run`, then `latprof analyze` ----------------------------

E2E_APP = "tests.collectors.hooks.apps.httpx_pool_app:app"
E2E_TOOL_MS = 120  # each request's tool call, through one shared AsyncClient with 2 connections
E2E_PAIRS = 30  # two requests at a time: both get a connection at once
E2E_BURSTS = 4  # eight at a time: six wait for a connection, up to three tool calls long
E2E_BURST_SIZE = 8


@pytest.mark.slow
def test_latprof_run_on_a_service_with_a_shared_client_pool_too_small_is_an_http_pool_verdict(tmp_path: Path, tools):
    from apps.harness import Pending, Server

    from latprof.capture.reader import read_captures

    server = Server(E2E_APP, "asyncio", "h11", tmp_path, env={"APP_TOOL_URL": tools.url, "APP_SECRET": SECRET}).start()
    started = time.monotonic()
    try:
        sent = 0
        for i in range(E2E_PAIRS + E2E_BURSTS):
            size = E2E_BURST_SIZE if i % 8 == 4 else 2  # bursts at 4, 12, 20, 28: spread over the run
            pending = [Pending(server.port, f"/work?ms={E2E_TOOL_MS}") for _ in range(size)]
            responses = [p.response() for p in pending]
            assert [r.status for r in responses] == [200] * size, [r.body[:200] for r in responses]
            sent += size
        server.stop()  # SIGTERM: uvicorn finishes, the capture is flushed
    finally:
        server.kill()
    driven_s = time.monotonic() - started

    data = read_captures([server.capture_path])
    assert "httpx" in data.quality[0].attrs["collectors"]
    assert not [q for q in data.quality if q.kind == "error" and q.attrs.get("collector") == "httpx"], data.quality
    work = [r for r in data.requests if r.route == "GET /work"]
    assert len(work) == sent == E2E_PAIRS * 2 + E2E_BURSTS * E2E_BURST_SIZE
    waited = 0
    for request in work:
        mine = data.segments_by_request.get(request.request_id, [])
        (call,) = [s for s in mine if s.layer == TOOL]
        assert call.attrs["http.response.status_code"] == 200 and call.attrs["server.port"] == tools.port
        waits = [s for s in mine if s.layer == HTTP_POOL]
        waited += bool(waits) and ms(waits[0]) >= E2E_TOOL_MS * 0.7
    assert waited >= E2E_BURSTS * (E2E_BURST_SIZE - 2) * 0.75, waited  # six of each burst queued
    assert SECRET not in server.capture_path.read_text()

    result = subprocess.run(
        [sys.executable, "-m", "latprof", "analyze", "--format", "json", "--skip-warmup", "0", str(server.capture_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    verdict, latency = report["verdict"], report["latency_ms"]
    print(
        f"httpx e2e: driven in {driven_s:.1f} s; verdict {verdict['layer']} rule {verdict['rule']}"
        f" share {verdict['share_of_tail_excess']} confidence {verdict['confidence']};"
        f" p50 {latency['p50']:.0f} ms p99 {latency['p99']:.0f} ms; {report['window']['requests']} requests"
    )
    assert report["window"]["requests"] >= 50
    assert latency["p99"] >= 2.25 * latency["p50"], latency
    assert verdict["layer"] == HTTP_POOL and verdict["status"] == "layer", verdict
    assert verdict["rule"] == "http-pool-exhaustion", verdict
    assert verdict["share_of_tail_excess"] >= 0.8, verdict
    (finding,) = [f for f in report["findings"] if f["rule"] == "http-pool-exhaustion"]
    evidence = finding["evidence"]
    assert evidence["hosts"] == ["127.0.0.1"]
    assert evidence["max_connections"] == [2] and evidence["peak_in_use"] == 2 and evidence["peak_waiters"] >= 4, evidence


def test_answers_are_tokenised_only_when_a_later_call_sends_a_value_and_depends_on_is_unchanged(recorded):
    """An answer is kept (its first MAX_SCAN_BYTES, at most MAX_CALLS of them) until a later call
    sends something id-like; `latprof.tool.depends_on` names what `_tools` would have named."""
    from latprof.collectors.hooks import _tools
    from latprof.semconv import TOOL_DEPENDS_ON

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/customer":
            return httpx.Response(200, content=b'{"id": "cust_48213"}')
        if request.url.path.startswith("/ids/"):
            return httpx.Response(200, content=b'{"n": "id_%s_0001"}' % request.url.path[5:].encode())
        return httpx.Response(200, content=b'{"ok": true}')  # no digit: nothing to keep

    def calls() -> dict[str, Any]:
        state = runtime.current_request()
        with httpx.Client(transport=httpx.MockTransport(answer)) as client:
            client.get("http://tools.test/customer")
            for _ in range(_tools.MAX_CALLS + 4):  # answers without a value evict nothing
                client.get("http://tools.test/plain")
            pending_before = list(state.scratch[_tools._PENDING])
            client.get("http://tools.test/tickets", params={"of": "cust_48213"})
            client.post("http://tools.test/search", content=b'{"customer": "cust_48213"}')
            for i in range(_tools.MAX_CALLS * 2):  # memory stays bounded
                client.get(f"http://tools.test/ids/{i}")
            return {"pending_before": pending_before, "pending": len(state.scratch[_tools._PENDING]),
                    "tools": len(state.scratch.get(_tools._KEY, []))}

    found = in_request(calls)
    tool = segments(recorded, TOOL)
    customer = tool[0]
    assert found["pending_before"] == [(customer.segment_id, b'{"id": "cust_48213"}')]
    by_name = [s for s in tool if TOOL_DEPENDS_ON in s.attrs]
    assert [s.attrs[TOOL_DEPENDS_ON] for s in by_name] == [customer.segment_id, customer.segment_id]
    assert by_name[0].attrs["http.request.method"] == "GET" and by_name[1].attrs["http.request.method"] == "POST"
    assert found["pending"] <= _tools.MAX_CALLS and found["tools"] <= _tools.MAX_CALLS
    assert not [s for s in tool[1 : _tools.MAX_CALLS + 5] if TOOL_DEPENDS_ON in s.attrs]
    assert all(s.attrs["server.port"] == 80 and s.attrs["http.response.status_code"] == 200 for s in tool)
