"""The aiohttp client hook against real local servers: tool calls, connection-limit waits, raw LLM streams."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from recording import recording

from apps.httpx_services import ToolService

from latprof.collectors.hooks import aiohttp_client as hook
from latprof.collectors.hooks import runtime
from latprof.demo.provider import Provider
from latprof.events import Segment
from latprof.layers import HTTP_POOL, MODEL, PROVIDER, TOOL
from latprof.semconv import HTTP_STATUS_CODE, SERVER_ADDRESS, TTFT_KNOWN

SECRET = "latprof-secret-query-4711"


@pytest.fixture
def recorded():
    with recording() as events:
        hook.install()
        try:
            yield events
        finally:
            hook.uninstall()


@pytest.fixture(scope="module")
def tools():
    with ToolService() as service:
        yield service


def segments(events, layer=None) -> list[Segment]:
    return [e for e in events if isinstance(e, Segment) and (layer is None or e.layer == layer)]


def run_in_request(coro_fn):
    async def main():
        token = runtime.begin_request("GET /x", runtime.now_ns())
        try:
            return await coro_fn()
        finally:
            runtime.end_request(token)

    return asyncio.run(main())


def test_a_call_is_a_tool_segment_until_its_body_ended_without_the_query(recorded, tools):
    async def call():
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{tools.url}/slow?ms=150&token={SECRET}") as response:
                assert response.status == 200
                assert (await response.json()) == {"ok": True}
            async with session.get(f"{tools.url}/status/503") as response:
                assert response.status == 503

    run_in_request(call)
    slow, failed = segments(recorded, TOOL)
    assert slow.name == "HTTP GET 127.0.0.1" and slow.attrs[HTTP_STATUS_CODE] == 200
    assert slow.attrs[SERVER_ADDRESS] == "127.0.0.1"
    assert 140e6 <= slow.end_ns - slow.start_ns <= 400e6
    assert failed.attrs[HTTP_STATUS_CODE] == 503
    assert SECRET not in repr(recorded)


def test_a_call_waiting_for_the_connection_limit_has_an_http_pool_wait(recorded, tools):
    async def calls():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:

            async def one(ms: int) -> None:
                async with session.get(f"{tools.url}/slow?ms={ms}") as response:
                    await response.read()

            first = asyncio.create_task(one(300))
            await asyncio.sleep(0.05)
            await one(10)
            await first

    run_in_request(calls)
    (wait,) = segments(recorded, HTTP_POOL)
    assert 200e6 <= wait.end_ns - wait.start_ns <= 500e6
    assert wait.attrs["latprof.http.pool.max_connections"] == 1
    second = [s for s in segments(recorded, TOOL) if s.start_ns <= wait.start_ns and s.end_ns >= wait.end_ns]
    assert second and wait.parent_id == second[0].segment_id  # nested under the call that waited


def test_a_raw_streamed_llm_call_is_provider_then_model(recorded):
    with Provider(ttft_ms=250, tpot_ms=5, output_tokens=12) as provider:

        async def call():
            async with aiohttp.ClientSession() as session:
                body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
                async with session.post(f"{provider.url}/chat/completions", json=body) as response:
                    async for _ in response.content:
                        pass

        run_in_request(call)
    (first,) = segments(recorded, PROVIDER)
    (decode,) = segments(recorded, MODEL)
    assert first.attrs[TTFT_KNOWN] is True and not segments(recorded, TOOL)
    assert 230e6 <= first.end_ns - first.start_ns <= 500e6
    assert first.end_ns == decode.start_ns and decode.end_ns - decode.start_ns >= 40e6


def test_nothing_outside_a_request(recorded, tools):
    async def call():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
            async with session.get(f"{tools.url}/slow?ms=10") as response:
                await response.read()

    asyncio.run(call())
    assert segments(recorded) == []
