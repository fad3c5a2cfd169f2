"""Network timings of LLM calls: connect, TLS, upload and the server's first byte, from httpcore's trace extension and aiohttp's TraceConfig.

Against the demo provider over TLS (a certificate made by trustme), which holds every new
connection for `DELAY_MS` before its handshake, as a far endpoint's set-up costs.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any, Callable

import pytest
from recording import recording

openai = pytest.importorskip("openai")
pytest.importorskip("trustme")
aiohttp = pytest.importorskip("aiohttp")
httpx = pytest.importorskip("httpx")

from latprof.collectors.hooks import aiohttp_client, runtime
from latprof.collectors.hooks import httpx as httpx_hook
from latprof.collectors.hooks import openai as openai_hook
from latprof.demo.provider import LocalCertificate, Provider
from latprof.events import Segment
from latprof.semconv import NET_CONNECT_MS, NET_NEW_CONNECTION, NET_SERVER_MS, NET_TLS_MS, NET_UPLOAD_MS

DELAY_MS = 200
TTFT_MS = 150
SLACK_MS = 1500  # a loaded 2-core machine is slow, never fast
MESSAGES = [{"role": "user", "content": "Which layer owns the p99?"}]


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path, Path]:
    certificate = LocalCertificate.make(tmp_path_factory.mktemp("tls"))
    return certificate.client_context(), Path(certificate.chain_file), Path(certificate.key_file)


@pytest.fixture(scope="module")
def provider(tls: tuple[ssl.SSLContext, Path, Path]) -> Any:
    _, chain, key = tls
    with Provider(ttft_ms=TTFT_MS, tpot_ms=2, output_tokens=4, connect_delay_ms=DELAY_MS, tls_cert_file=str(chain),
                  tls_key_file=str(key)) as running:  # fmt: skip
        yield running


@pytest.fixture
def events() -> Any:
    hooks = (openai_hook, httpx_hook, aiohttp_client)
    for hook in hooks:
        hook.install()
    try:
        with recording() as recorded:
            yield recorded
    finally:  # later tests install what they test, alone
        for hook in hooks:
            hook.uninstall()


def in_request(fn: Callable[[], Any]) -> Any:
    token = runtime.begin_request("POST /chat", runtime.now_ns())
    try:
        return fn()
    finally:
        runtime.end_request(token)


async def in_async_request(fn: Callable[[], Any]) -> Any:
    token = runtime.begin_request("POST /chat", runtime.now_ns())
    try:
        return await fn()
    finally:
        runtime.end_request(token)


def providers(events: list[Any]) -> list[Segment]:
    return [e for e in events if isinstance(e, Segment) and e.layer == "provider"]


def assert_new_connection(segment: Segment, *, tls: bool = True) -> None:
    attrs = segment.attrs
    assert attrs[NET_NEW_CONNECTION] is True, attrs
    if tls:  # the provider's delay falls inside the handshake; the TCP connect itself is local
        assert DELAY_MS * 0.95 <= attrs[NET_TLS_MS] <= DELAY_MS + SLACK_MS, attrs
        assert 0 <= attrs[NET_CONNECT_MS] < DELAY_MS / 2, attrs
    else:  # aiohttp: TCP and TLS together
        assert DELAY_MS * 0.95 <= attrs[NET_CONNECT_MS] <= DELAY_MS + SLACK_MS, attrs
        assert NET_TLS_MS not in attrs
    assert 0 <= attrs[NET_UPLOAD_MS] < SLACK_MS, attrs


def assert_reused(segment: Segment) -> None:
    attrs = segment.attrs
    assert attrs[NET_NEW_CONNECTION] is False, attrs
    assert NET_CONNECT_MS not in attrs and NET_TLS_MS not in attrs, attrs


def test_sdk_calls_time_their_handshake_and_a_reused_connection_has_none(events, provider, tls) -> None:
    context, _, _ = tls
    with openai.OpenAI(base_url=provider.url, api_key="unused", max_retries=0,
                       http_client=openai.DefaultHttpxClient(verify=context)) as client:  # fmt: skip
        for _ in range(2):  # not streamed: the second call finds the first one's connection
            answer = in_request(lambda: client.chat.completions.create(model="demo", messages=MESSAGES))
            assert answer.choices[0].message.content
        stream_text = in_request(lambda: "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="demo", messages=MESSAGES, stream=True) if c.choices))  # fmt: skip
        assert stream_text
    first, second, streamed = providers(events)
    assert_new_connection(first)
    assert_reused(second)
    # Not streamed, the headers come with the whole answer: the server's part is TTFT and decode.
    assert TTFT_MS * 0.95 <= second.attrs[NET_SERVER_MS] <= TTFT_MS + SLACK_MS, second.attrs
    # The provider segment holds them: set-up, upload and the server's part fit inside it.
    for segment in (first, second):
        parts = sum(segment.attrs.get(k, 0.0) for k in (NET_CONNECT_MS, NET_TLS_MS, NET_UPLOAD_MS, NET_SERVER_MS))
        assert parts <= (segment.end_ns - segment.start_ns) / 1e6 + 1, segment.attrs
    assert NET_SERVER_MS in streamed.attrs and isinstance(streamed.attrs[NET_NEW_CONNECTION], bool)
    models = [e for e in events if isinstance(e, Segment) and e.layer == "model"]
    assert models and all(NET_NEW_CONNECTION not in m.attrs for m in models)  # on the provider segment only


def test_async_sdk_calls_and_a_provider_that_closes_every_connection(events, provider, tls) -> None:
    context, _, _ = tls

    async def main() -> None:
        async with openai.AsyncOpenAI(base_url=provider.url, api_key="unused", max_retries=0,
                                      http_client=openai.DefaultAsyncHttpxClient(verify=context)) as client:  # fmt: skip
            for _ in range(2):
                await in_async_request(lambda: client.chat.completions.create(
                    model="demo", messages=MESSAGES, extra_headers={"x-latprof-close-connection": "true"}))  # fmt: skip

    asyncio.run(main())
    calls = providers(events)
    assert len(calls) == 2
    for segment in calls:  # no keep-alive: each call pays the handshake again
        assert_new_connection(segment)


def test_raw_httpx_llm_calls_are_timed_and_the_services_own_trace_extension_still_runs(events, provider, tls) -> None:
    context, _, _ = tls
    seen: list[str] = []
    with httpx.Client(verify=context) as client:
        response = in_request(lambda: client.post(f"{provider.url}/chat/completions", json={"model": "demo", "messages": MESSAGES},
                                                  extensions={"trace": lambda name, info: seen.append(name)}))  # fmt: skip
        assert response.status_code == 200 and response.json()["choices"]
        tool = in_request(lambda: client.get(f"{provider.url}/models"))  # not an LLM call: not timed
        assert tool.status_code == 200
    (call,) = providers(events)
    assert_new_connection(call)
    assert "connection.start_tls.complete" in seen and "http11.receive_response_headers.complete" in seen
    tools = [e for e in events if isinstance(e, Segment) and e.layer == "tool"]
    assert tools and all(NET_NEW_CONNECTION not in t.attrs for t in tools)


def test_raw_aiohttp_llm_calls_are_timed(events, provider, tls) -> None:
    context, _, _ = tls

    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                async def call() -> Any:
                    async with session.post(f"{provider.url}/chat/completions", json={"model": "demo", "messages": MESSAGES},
                                            ssl=context) as response:  # fmt: skip
                        return await response.json()

                body = await in_async_request(call)
                assert body["choices"]

    asyncio.run(main())
    first, second = providers(events)
    assert_new_connection(first, tls=False)
    assert_reused(second)
    assert TTFT_MS * 0.95 <= second.attrs[NET_SERVER_MS] <= TTFT_MS + SLACK_MS, second.attrs


def test_nothing_is_timed_outside_a_request(events, provider, tls) -> None:
    context, _, _ = tls
    seen: list[str] = []
    with httpx.Client(verify=context) as client:
        client.post(f"{provider.url}/chat/completions", json={"model": "demo", "messages": MESSAGES},
                    extensions={"trace": lambda name, info: seen.append(name)})  # fmt: skip
    assert providers(events) == []
    assert "connection.start_tls.complete" in seen  # the service's own extension, untouched
