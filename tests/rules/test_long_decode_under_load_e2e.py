"""Decode under load end to end: the async openai client in bursts against a demo provider whose batch slows tokens.

The provider runs in its own process (so the client's work never delays its tokens), with
`tpot_ms_per_stream_in_flight` K: each token comes 10 ms + K x (other streams decoding) after
the last. The load is rounds of 1 to 4 streamed calls and one burst of 16; each call is a
request recorded by the openai hook into a real capture, which the whole pipeline reads.
Its negative: the same load with the setting at 0, and two calls slowed on their own.
About 8 s in all on a quiet machine.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from latprof.analysis.decode_load import tail_load
from latprof.capture.writer import CaptureWriter
from latprof.collectors.hooks import openai as hook
from latprof.collectors.hooks import runtime
from latprof.demo.provider import Provider
from latprof.layers import MODEL
from latprof.pipeline import Diagnosis, run_diagnosis
from latprof.rules.long_decode import CALLS_IN_FLIGHT

PER_STREAM_MS = 4.0
#: Calls in each round: 1 to 4, cycling, and one burst of 16 among them.
ROUNDS = [1 + r % 4 for r in range(20)]
ROUNDS.insert(10, 16)
MESSAGES = [{"role": "user", "content": "Which layer owns the p99?"}]
#: The time per token of a call slowed on its own, whatever the load (rounds 4 and 14: of 1 and 2 calls).
SLOW_TPOT_MS = 70.0


async def _call(client: Any, **settings: float) -> None:
    token = runtime.begin_request("POST /chat", runtime.now_ns())
    try:
        stream = await client.chat.completions.create(model="demo", messages=MESSAGES, stream=True,
                                                      stream_options={"include_usage": True},
                                                      extra_body={"latprof": settings} if settings else None)  # fmt: skip
        async with stream:
            async for _ in stream:
                pass
    finally:
        runtime.end_request(token)


async def _load(url: str, slow_rounds: frozenset[int]) -> None:
    async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as client:
        await _call(client)  # opens a connection before the first round is timed (warm-up is not skipped)
        for r, size in enumerate(ROUNDS):
            slow = {"tpot_ms": SLOW_TPOT_MS} if r in slow_rounds else {}
            await asyncio.gather(_call(client, **slow), *(_call(client) for _ in range(size - 1)))


def _diagnose(tmp_path: Path, per_stream_ms: float, slow_rounds: frozenset[int] = frozenset()) -> Diagnosis:
    path = tmp_path / f"load-{per_stream_ms:g}.jsonl"
    with Provider(subprocess=True, ttft_ms=10, tpot_ms=10, output_tokens=10, tpot_ms_per_stream_in_flight=per_stream_ms) as provider:
        writer = CaptureWriter(path, flush_interval_s=0.2)
        hook.install()
        runtime.start(writer)
        try:
            asyncio.run(_load(provider.url, slow_rounds))
        finally:
            runtime.stop()
            hook.uninstall()
            writer.close()
    return run_diagnosis([path], warmup_s=0.0)


@pytest.mark.slow
def test_a_crowded_batch_is_named_with_the_slope_it_was_given(tmp_path: Path) -> None:
    diagnosis = _diagnose(tmp_path, PER_STREAM_MS)
    assert diagnosis.analysis is not None
    load = tail_load(diagnosis.analysis)
    assert load is not None and load.fit.calls == 1 + sum(ROUNDS)
    print(f"crowded batch: {load.fit.ms_per_token_per_call_in_flight:.2f} ms per token per extra call (given {PER_STREAM_MS}),"
          f" calls in flight tail {load.tail.in_flight:.1f} median {load.median.in_flight:.1f}")  # fmt: skip
    # the provider adds 4 ms per token per other stream; network and the client's reading blur it a little
    assert load.fit.ms_per_token_per_call_in_flight == pytest.approx(PER_STREAM_MS, rel=0.25)
    assert load.tail.in_flight > 12 and load.median.in_flight < 3
    verdict = diagnosis.report.verdict
    assert (verdict.layer, verdict.rule) == (MODEL, "long-decode"), verdict
    [finding] = [f for f in diagnosis.findings if f.rule == "long-decode"]
    assert finding.evidence["slow_tokens_cause"] == CALLS_IN_FLIGHT, finding.evidence
    assert finding.evidence["output_tokens_tail"] == finding.evidence["output_tokens_median"] == 10
    assert "cap the calls in flight" in finding.fix and "inferred" in finding.summary


@pytest.mark.slow
def test_the_same_bursts_without_a_crowded_batch_are_not_load(tmp_path: Path) -> None:
    """The same rounds and burst with the setting at 0, and two calls of quiet rounds slowed on
    their own (70 ms per token asked per request): slow tokens own the tail, the load does not."""
    diagnosis = _diagnose(tmp_path, 0.0, frozenset({4, 14}))
    assert diagnosis.analysis is not None
    load = tail_load(diagnosis.analysis)
    assert load is not None and abs(load.fit.ms_per_token_per_call_in_flight) < 0.25 * PER_STREAM_MS
    # the tail cohort (its 3 slowest requests) holds both slowed calls; calls in flight do not explain them
    assert load.tail.tpot_ms > 3 * load.median.tpot_ms and load.fit.in_flight_high > 10 and load.load_share < 0.2
    verdict = diagnosis.report.verdict
    assert (verdict.layer, verdict.rule) == (MODEL, "long-decode"), verdict
    [finding] = [f for f in diagnosis.findings if f.rule == "long-decode"]
    assert finding.evidence["dominant_cause"] == "time_per_token", finding.evidence
    assert finding.evidence["slow_tokens_cause"] == "unknown" and "faster model" in finding.fix
    decode = [f for f in diagnosis.findings if f.rule == "long-decode"]
    assert not [f for f in decode if f.evidence.get("slow_tokens_cause") == CALLS_IN_FLIGHT or "cap the calls in flight" in f.fix]
