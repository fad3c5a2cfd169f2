"""Inferring pool waits from trace gaps (latprof.analysis.inference) on simulated pools with known answers."""

from __future__ import annotations

import heapq
import random

import pytest

from timelines import req, seg, timeline

from latprof.analysis.requests import analyze
from latprof.engine import run_rules
from latprof.analysis.inference import (
    INFERRED,
    INFERRED_CEILING,
    INFERRED_CONCURRENCY,
    gap_before_first_db,
    holders_during,
    infer_pool_waits,
    infer_queueing,
)
from latprof.layers import DB_POOL, DB_QUERY, PROVIDER, QUEUE, TOOL
from latprof.pipeline import default_rules
from latprof.report.model import build_report
from latprof.analysis.timeline import RequestTimeline


def pooled(n: int = 400, pool: int = 3, *, seed: int = 1, burst_every: int = 40) -> list[RequestTimeline]:
    """Requests through a FIFO pool of `pool` connections, each held for query + LLM + query;
    arrivals mostly spaced out, with a burst now and then that makes the tail wait."""
    rng = random.Random(seed)
    free = [0.0] * pool  # when each connection comes back (a heap)
    heapq.heapify(free)
    out, t = [], 0.0
    for i in range(n):
        t += 0.5 if i % burst_every else 0.0
        t += rng.uniform(110, 150) if i % burst_every not in range(1, 8) else 0.5  # 8 requests nearly at once
        got = max(t, heapq.heappop(free))
        llm = rng.uniform(150, 170)
        first = seg(DB_QUERY, got, got + 3, name="SELECT")
        call = seg(PROVIDER, got + 3, got + 3 + llm, name="POST")
        last = seg(DB_QUERY, got + 3 + llm, got + 6 + llm, name="INSERT")
        heapq.heappush(free, got + 6 + llm)
        out.append(req(t, got + 8 + llm, first, call, last))
    return out


def test_the_gap_before_the_first_statement_starts_where_earlier_work_ended():
    rt = req(0, 100, seg(PROVIDER, 5, 20), seg(DB_QUERY, 50, 60), seg(DB_QUERY, 70, 80))
    gap = gap_before_first_db(rt)
    assert gap is not None and (gap.gap_ns, gap.hold_end_ns - gap.end_ns) == (30_000_000, 30_000_000)
    assert gap_before_first_db(req(0, 10, seg(DB_POOL, 0, 5), seg(DB_QUERY, 5, 9))) is None  # measured: nothing to infer
    assert gap_before_first_db(req(0, 10, seg(PROVIDER, 0, 5))) is None


def test_holders_ceiling_and_the_share_of_waiting_at_it():
    holds = [(0, 100), (0, 100), (50, 150)]  # two, then three at once from 50 to 100
    assert holders_during([(60, 90)], holds) == (3, 1.0)
    assert holders_during([(10, 40), (60, 90)], holds) == (3, 0.5)
    assert holders_during([], []) == (0, 0.0)


def test_a_pool_at_its_ceiling_gives_inferred_db_pool_and_the_verdict_says_so():
    tl = timeline(pooled(), source_kind="otlp")
    inferred = infer_pool_waits(tl)
    waits = [s for rt in inferred.requests for s in rt.segments if s.layer == DB_POOL]
    assert waits and all(s.attrs[INFERRED] is True for s in waits)
    assert waits[0].attrs[INFERRED_CEILING] == 3  # the pool's size, seen in the holders
    analysis = analyze(inferred, warmup_s=0)
    findings = run_rules(analysis, default_rules())
    report = build_report(analysis, findings)
    assert (report.verdict.layer, report.verdict.rule) == (DB_POOL, "db-pool-exhaustion"), report.verdict
    [finding] = [f for f in findings if f.rule == "db-pool-exhaustion"]
    assert finding.evidence["inferred"] is True and finding.evidence["connection_ceiling"] == 3
    assert finding.evidence["held_across_llm_share"] == 1.0  # from first to last statement, around the LLM call
    assert finding.summary.startswith("Inferred") and finding.confidence <= 0.6
    assert report.verdict.confidence <= finding.confidence and "inferred from" in report.verdict.summary


def test_does_not_infer_when_gaps_have_no_ceiling_behind_them():
    """The same tail gaps, but from the request's own code: holders never queue at a ceiling."""
    rng = random.Random(2)
    requests = []
    for i in range(400):
        t = i * 100.0
        pre = 400.0 if i % 40 == 39 else rng.uniform(0.0, 1.0)  # a slow computation in a few requests
        requests.append(req(t, t + pre + 170, seg(DB_QUERY, t + pre, t + pre + 3), seg(PROVIDER, t + pre + 3, t + pre + 165),
                            seg(DB_QUERY, t + pre + 165, t + pre + 168)))  # fmt: skip
    tl = timeline(requests, source_kind="otlp")
    assert infer_pool_waits(tl) is tl


def test_does_not_infer_when_the_median_request_waits_too():
    tl = timeline(pooled(burst_every=2), source_kind="otlp")  # always saturated: the median waits as long
    assert infer_pool_waits(tl) is tl


def gateway_to_backend(n: int = 300, workers: int = 1, *, burst_every: int = 30, accept_ms: float = 0.0) -> list[RequestTimeline]:
    """A gateway's requests, each calling a backend that serves `workers` at a time (FIFO)
    for 100 ms; arrivals 300 ms apart, with a burst of 6 now and then. A worker takes
    `accept_ms` from the end of one request to the start of the next one's span."""
    from latprof.collectors.traces.tracemap import SERVICE_NAME, SPAN_KIND

    free = [0.0] * workers
    heapq.heapify(free)
    out, t = [], 0.0
    for i in range(n):
        t += 0.3 if i % burst_every in range(1, 6) else 300.0
        freed = heapq.heappop(free)
        got = t + 1 if t + 1 >= freed else freed + accept_ms
        heapq.heappush(free, got + 100)
        call = seg(TOOL, t + 1, got + 101, name="GET", id=f"call{i}")
        served = seg(None, got, got + 100, name="GET /work", parent=f"call{i}", **{SPAN_KIND: "server", SERVICE_NAME: "backend"})
        rt = req(t, got + 103, call, served)
        out.append(RequestTimeline(rt.request, (rt.segments[0], rt.segments[1]._replace(pid=2))))
    return out


@pytest.mark.parametrize("accept_ms", [0.0, 1.3, 6.0, 40.0])
def test_a_downstream_service_at_a_fixed_concurrency_gives_inferred_queue(accept_ms: float):
    """`accept_ms`: a sync worker's hand-off from one request to the next: ~1.3 ms idle, more
    with the machine's cores busy; 40 ms is a stalled worker (allowed for calls that waited long)."""
    tl = timeline(gateway_to_backend(accept_ms=accept_ms), source_kind="otlp")
    inferred = infer_queueing(tl)
    queues = [s for rt in inferred.requests for s in rt.segments if s.layer == QUEUE]
    assert queues and all(s.attrs[INFERRED] is True and s.attrs[INFERRED_CONCURRENCY] == 1 for s in queues)
    assert all(s.parent_id.startswith("call") for s in queues)  # inside the caller's client span
    analysis = analyze(inferred, warmup_s=0)
    findings = run_rules(analysis, default_rules())
    report = build_report(analysis, findings)
    assert (report.verdict.layer, report.verdict.rule) == (QUEUE, "request-queueing"), report.verdict
    [finding] = [f for f in findings if f.rule == "request-queueing"]
    assert finding.evidence["inferred"] is True and finding.evidence["services_at_fixed_concurrency"] == ["backend (1 at a time)"]
    assert finding.summary.startswith("Inferred") and finding.confidence <= 0.6


def test_does_not_infer_a_queue_in_front_of_a_service_with_room():
    tl = timeline(gateway_to_backend(workers=8), source_kind="otlp")
    assert infer_queueing(tl) is tl


def test_root_spans_back_to_back_at_a_ceiling_are_a_warning_naming_both_causes():
    """One worker, requests back to back: queued in front of it, or a closed loop of one client."""
    requests, t = [], 0.0
    for i in range(50):
        requests.append(req(t, t + 100, seg(DB_QUERY, t + 10, t + 90)))
        t += 100.5  # the next starts half a millisecond after the last ended
    tl = timeline(requests, source_kind="otlp")
    [warning] = infer_queueing(tl).warnings
    assert "fixed concurrency of 1" in warning and "closed-loop" in warning and "latprof run" in warning
