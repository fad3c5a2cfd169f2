"""Prompt size against TTFT through the openai hook: the real client, the demo provider's prefill cost, the fit; conversation digests."""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

import openai
import pytest
from recording import recording
from timelines import analysed

from latprof.analysis.timeline import RequestTimeline
from latprof.collectors.hooks import openai as hook
from latprof.collectors.hooks import runtime
from latprof.demo.provider import Provider
from latprof.digests import conversation_digest
from latprof.events import Request, Segment
from latprof.layers import PROVIDER
from latprof.rules.provider_floor import ProviderFloor, Thresholds
from latprof.semconv import CONVERSATION_DIGEST, GEN_AI_INPUT_TOKENS

#: The provider's prefill cost, and its TTFT of a tiny prompt.
MS_PER_1K = 100.0
TTFT_MS = 40.0


def requests_of(events: list[Any]) -> list[RequestTimeline]:
    """The recorded requests with their segments."""
    by_request: dict[str, list[Segment]] = {}
    for event in events:
        if isinstance(event, Segment):
            by_request.setdefault(event.request_id, []).append(event)
    return [RequestTimeline(e, tuple(by_request.get(e.request_id, ()))) for e in events if isinstance(e, Request)]


def test_the_floor_fit_recovers_the_providers_prefill_slope_through_the_hook() -> None:
    """80 streamed calls with prompts of 200 to 6,000 tokens, 16 at a time, each in its own
    request: the Theil-Sen line of the hook's TTFT against the usage's input tokens has the
    provider's configured 100 ms per 1k input tokens, within 10%."""
    rng = random.Random(11)
    sizes = [rng.randint(200, 6000) for _ in range(80)]

    async def calls(url: str) -> None:
        limit = asyncio.Semaphore(16)
        async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as client:

            async def one(tokens: int) -> None:
                async with limit:
                    token = runtime.begin_request("POST /summarise", runtime.now_ns())
                    try:
                        stream = await client.chat.completions.create(
                            model="demo", messages=[{"role": "user", "content": "x" * (4 * tokens)}], stream=True,
                            stream_options={"include_usage": True},
                        )
                        async for _ in stream:
                            pass
                    finally:
                        runtime.end_request(token)

            await asyncio.gather(*(one(n) for n in sizes))

    hook.install()
    try:
        with recording() as events:
            with Provider(ttft_ms=TTFT_MS, ttft_ms_per_1k_input_tokens=MS_PER_1K, output_tokens=2, tpot_ms=1) as provider:
                asyncio.run(calls(provider.url))
    finally:
        hook.uninstall()
    requests = requests_of(events)
    assert len(requests) == 80
    recorded_tokens = sorted(s.attrs[GEN_AI_INPUT_TOKENS] for rt in requests for s in rt.segments if s.layer == PROVIDER)
    assert recorded_tokens == sorted(sizes)  # the provider's count (characters / 4), read from the usage
    [finding] = ProviderFloor(Thresholds(min_floor_ms=0.0)).check(analysed(requests))
    e = finding.evidence
    assert e["fitted_calls"] == 80
    assert e["ms_per_1k_input_tokens"] == pytest.approx(MS_PER_1K, rel=0.10)
    assert TTFT_MS - 5 <= e["floor_ms"] <= TTFT_MS + 150  # a loaded machine is slow, never fast
    assert e["robust_r_squared"] > 0.9


def test_a_responses_conversation_is_recorded_as_its_digest_only() -> None:
    conversation = f"conv_CANARY_{uuid.uuid4().hex}"
    hook.install()
    try:
        with recording() as events:
            with Provider(ttft_ms=20, output_tokens=2, tpot_ms=1) as provider:
                with openai.OpenAI(base_url=provider.url, api_key="unused", max_retries=0) as client:
                    for form in (conversation, {"id": conversation}):
                        token = runtime.begin_request("POST /agent", runtime.now_ns())
                        try:
                            stream = client.responses.create(model="demo", input="hi", conversation=form, stream=True)
                            for _ in stream:
                                pass
                            client.responses.create(model="demo", input="hi")  # no conversation
                        finally:
                            runtime.end_request(token)
    finally:
        hook.uninstall()
    calls = [e for e in events if isinstance(e, Segment) and e.layer == PROVIDER]
    assert len(calls) == 4
    digests = [s.attrs.get(CONVERSATION_DIGEST) for s in calls]
    assert digests == [conversation_digest(conversation), None] * 2
    assert len(digests[0] or "") == 16 and conversation not in repr(events)
