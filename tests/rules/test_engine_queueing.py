"""Rule engine-queueing: a self-hosted engine's queue (its own metrics) owns the provider tail."""

from __future__ import annotations

from typing import Any

import pytest
from timelines import analysed, gauge, req, seg

from latprof.analysis.engine import engine_views
from latprof.analysis.timeline import RequestTimeline
from latprof.layers import APP, HTTP_POOL, MODEL, PROVIDER
from latprof.rules.engine_queueing import EngineQueueing, Thresholds
from latprof.semconv import ENGINE_KIND, GEN_AI_REQUEST_MODEL, LLM_CALL_ID, SERVER_ADDRESS, SERVER_PORT, TTFT_KNOWN

MODEL_NAME = "llama-3-8b"
BURST = (10_000, 13_000)  # ms: the requests arriving then wait in the engine's queue


def in_burst(t_ms: float) -> bool:
    return BURST[0] <= t_ms < BURST[1]


def requests(n: int = 250, *, queue_ms: float = 1800.0, prefill_extra_ms: float = 0.0, pool_ms: float = 0.0) -> list[RequestTimeline]:
    """Every 80 ms a request: 20 ms app, TTFT 200 ms (+ `queue_ms` in the engine's queue, or
    + `prefill_extra_ms`, or a client pool wait before it, for arrivals in the burst), 300 ms decode."""
    out = []
    for i in range(n):
        t0 = i * 80.0
        burst = in_burst(t0)
        wait = pool_ms if burst else 0.0
        ttft = 200.0 + (i % 7) + ((queue_ms + prefill_extra_ms) if burst and not pool_ms else 0.0)
        call = {LLM_CALL_ID: f"c{i}", GEN_AI_REQUEST_MODEL: MODEL_NAME, SERVER_ADDRESS: "127.0.0.1"}
        start = t0 + 20 + wait
        segments = [seg(APP, t0, t0 + 20)]
        if wait:
            segments.append(seg(HTTP_POOL, t0 + 20, start))
        segments += [seg(PROVIDER, start, start + ttft, **call, **{TTFT_KNOWN: True}),
                     seg(MODEL, start + ttft, start + ttft + 300, **call)]  # fmt: skip
        out.append(req(t0, start + ttft + 300, *segments))
    return out


def engine(*, waiting: Any = 12, running: Any = 8, kv: float = 0.6, queue_ms: float = 1800.0, prefill_ms: float = 150.0,
           preemptions: float = 0, model: str = MODEL_NAME, seconds: int = 25, burst_prefill_ms: float | None = None) -> list:  # fmt: skip
    """The scraper's gauges, once a second: while the burst's requests wait, `waiting` requests wait;
    the scrapes after they finish (12.3-15.3 s) report `queue_ms` in the queue; otherwise nothing waits."""
    attrs = {ENGINE_KIND: "vllm", SERVER_ADDRESS: "127.0.0.1", SERVER_PORT: 8000, GEN_AI_REQUEST_MODEL: model}
    out = []
    for s in range(seconds + 1):
        at = s * 1000.0
        busy = BURST[0] <= at <= BURST[1] + 2000
        finishing = BURST[0] + 3000 <= at <= BURST[1] + 3000
        run = running(s) if callable(running) else running
        waits = waiting(s) if callable(waiting) else waiting
        out += [
            gauge("engine.requests.waiting", waits if busy else 0, at, **attrs),
            gauge("engine.requests.running", run, at, **attrs),
            gauge("engine.kv_cache.usage", kv, at, **attrs),
            gauge("engine.preemptions", preemptions if busy else 0, at, **attrs),
            gauge("engine.queue_ms.sum", 12 * (queue_ms if finishing else 3.0), at, **attrs),
            gauge("engine.queue_ms.count", 12, at, **attrs),
            gauge("engine.prefill_ms.sum", 12 * (burst_prefill_ms if finishing and burst_prefill_ms else prefill_ms), at, **attrs),
            gauge("engine.prefill_ms.count", 12, at, **attrs),
            gauge("engine.decode_ms.sum", 12 * 300.0, at, **attrs),
            gauge("engine.decode_ms.count", 12, at, **attrs),
        ]
    return out


def test_a_queue_in_the_engine_behind_a_full_batch_owns_the_tail() -> None:
    analysis = analysed(requests(), gauges=engine())
    [finding] = EngineQueueing().check(analysis)
    provider = analysis.layer(PROVIDER)
    assert finding.layer == PROVIDER and provider.share_of_tail_excess > 0.8
    e = finding.evidence
    assert e["inferred"] is True and "lined up" in e["inferred_from"]
    assert e["engine"] == "vllm" and e["model"] == MODEL_NAME and e["matched_by"] == "model"
    # lined up by time: median calls that ended beside the queued ones share their seconds' mean
    assert e["tail"]["queue_ms"] == pytest.approx(1800, rel=0.05) and e["median"]["queue_ms"] < 0.3 * 1800
    assert e["tail"]["prefill_ms"] == pytest.approx(150)
    assert e["tail"]["waiting"] > 6 and e["median"]["waiting"] < 3
    assert e["running_at_cap"] is True
    # the tail's extra time inside the engine is all queue (prefill as the median's): the provider's whole excess
    assert e["queue_share_of_engine_excess"] == 1.0
    assert finding.impact_ms == pytest.approx(provider.tail_excess_ms, rel=1e-3)
    assert finding.confidence <= 0.6  # inferred
    assert "Inferred" in finding.summary and "scheduler queue" in finding.summary
    assert "add capacity" in finding.fix and "KV cache is full" not in finding.fix


def test_a_full_kv_cache_and_preemptions_are_named_with_their_fix() -> None:
    analysis = analysed(requests(), gauges=engine(kv=0.97, preemptions=3))
    [finding] = EngineQueueing().check(analysis)
    assert "KV cache up to 97%" in finding.summary and "preemptions" in finding.summary
    assert "KV cache is full" in finding.fix and finding.evidence["preemptions"] > 0


def test_a_healthy_engine_is_not_blamed_for_a_provider_tail() -> None:
    # the tail is in TTFT, but nothing waits in the engine and its queue times stay small
    analysis = analysed(requests(), gauges=engine(waiting=0, queue_ms=3.0))
    assert analysis.layer(PROVIDER).share_of_tail_excess > 0.8
    assert list(EngineQueueing().check(analysis)) == []


def test_a_queue_that_is_not_where_the_tail_spent_its_time_is_not_the_finding() -> None:
    # requests waited a little in the engine, but the tail's extra TTFT is prefill (long prompts)
    analysis = analysed(requests(queue_ms=0, prefill_extra_ms=1800), gauges=engine(waiting=2, queue_ms=40.0, burst_prefill_ms=1900))
    assert list(EngineQueueing().check(analysis)) == []


def test_requests_waiting_while_the_batch_has_room_are_not_the_engine_s_capacity() -> None:
    # waiting grows while the running batch is far below its peak: not a full engine
    analysis = analysed(requests(), gauges=engine(running=lambda s: 2 if 9 <= s <= 16 else 16))
    [view] = engine_views(analysis)
    assert view.tail.running_while_waiting == 2
    assert list(EngineQueueing().check(analysis)) == []


def test_a_batch_full_at_the_scrapes_that_saw_requests_waiting_is_at_its_cap() -> None:
    # the burst's queue shows at every other scrape, and there the batch is full; the scrapes between
    # catch it draining (3 of 8), so its mean over the tail's calls is below the cap. At a scrape a
    # second apart the batch while requests waited is what says the engine was full.
    waits = lambda s: 12 if s % 2 == 0 else 0  # noqa: E731
    analysis = analysed(requests(), gauges=engine(waiting=waits, running=lambda s: 8 if s % 2 == 0 or not 9 <= s <= 16 else 3))
    [view] = engine_views(analysis)
    assert view.tail.running is not None and view.tail.running < 0.8 * 8
    assert view.tail.running_while_waiting == 8
    [finding] = EngineQueueing().check(analysis)
    assert finding.evidence["running_at_cap"] is True and finding.evidence["tail"]["running_while_waiting"] == 8


def test_a_client_side_pool_in_front_of_a_healthy_engine_is_not_the_engine() -> None:
    analysis = analysed(requests(pool_ms=1800), gauges=engine(waiting=0, queue_ms=3.0))
    assert analysis.layer(HTTP_POOL).share_of_tail_excess > 0.8
    assert list(EngineQueueing().check(analysis)) == []


def test_calls_to_another_model_are_not_matched_to_the_engine() -> None:
    analysis = analysed(requests(), gauges=engine(model="another-model"))
    [view] = engine_views(analysis)
    assert view.tail.calls == 0 and view.median.calls == 0
    assert list(EngineQueueing().check(analysis)) == []


def test_thresholds_decide() -> None:
    analysis = analysed(requests(), gauges=engine(waiting=3))
    assert len(list(EngineQueueing().check(analysis))) == 1
    assert list(EngineQueueing(Thresholds(min_waiting_requests=100)).check(analysis)) == []
    assert list(EngineQueueing(Thresholds(min_queue_share=1.5)).check(analysis)) == []
