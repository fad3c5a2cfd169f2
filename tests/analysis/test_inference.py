"""Inferences from trace shapes (latprof.analysis.inference, span_inference) on simulated requests with known answers: pool waits, queues, retries, and an LLM tail whose decode is invisible."""

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


def test_the_pool_shape_is_judged_after_the_warm_up_as_the_analysis_is():
    """The service's first requests are slow for their own reasons (a connection opened, a client
    built) and would be the slowest 1% if counted; the analysis leaves them out, so must the inference."""
    requests = pooled()
    warm = [req(-2000.0 + 10 * k, -2000.0 + 10 * k + 1200, seg(DB_QUERY, -2000.0 + 10 * k, -2000.0 + 10 * k + 1100, name="SELECT"),
                seg(PROVIDER, -2000.0 + 10 * k + 1100, -2000.0 + 10 * k + 1190, name="POST")) for k in range(4)]  # fmt: skip
    tl = timeline(warm + requests, source_kind="otlp")
    assert infer_pool_waits(tl, warmup_s=0) is tl  # judged with them, the tail is theirs: no gap before a statement
    inferred = infer_pool_waits(tl, warmup_s=1.0)
    assert any(s.layer == DB_POOL for rt in inferred.requests for s in rt.segments)
    analysis = analyze(inferred, warmup_s=1.0)
    report = build_report(analysis, run_rules(analysis, default_rules()))
    assert (report.verdict.layer, report.verdict.rule) == (DB_POOL, "db-pool-exhaustion"), report.verdict


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


# --- retries inferred from a failed client span and the next one to the same target ----------------

from latprof.analysis.span_inference import MIN_BACKOFF_NS, infer_from_spans, infer_retries, retries_in  # noqa: E402
from latprof.layers import RETRY  # noqa: E402
from latprof.semconv import HTTP_STATUS_CODE, RETRY_AFTER_STATUS, SERVER_ADDRESS, SPAN_STATUS_ERROR  # noqa: E402

LLM = {SERVER_ADDRESS: "127.0.0.1"}


def rate_limited(n: int = 300, *, every: int = 20, backoff_ms: float = 400.0, seed: int = 3) -> list[RequestTimeline]:
    """Requests each calling the LLM once; every `every`-th gets a 429 first, sleeps `backoff_ms`
    (a hand-written loop: no span for the sleep) and calls again."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = i * 1000.0
        llm = rng.uniform(150, 170)
        if i % every == every - 1:
            failed = seg(PROVIDER, t + 2, t + 12, name="POST", parent="root", **{**LLM, HTTP_STATUS_CODE: 429, SPAN_STATUS_ERROR: True})
            retried = seg(PROVIDER, t + 12 + backoff_ms, t + 12 + backoff_ms + llm, name="POST", parent="root", **{**LLM, HTTP_STATUS_CODE: 200})
            out.append(req(t, t + 13 + backoff_ms + llm, failed, retried))
        else:
            out.append(req(t, t + 3 + llm, seg(PROVIDER, t + 2, t + 2 + llm, name="POST", parent="root", **{**LLM, HTTP_STATUS_CODE: 200})))
    return out


def test_the_gap_after_a_failed_call_before_the_same_call_is_an_inferred_retry():
    rt = rate_limited(20)[19]
    [backoff] = retries_in(rt)
    assert backoff.layer == RETRY and backoff.attrs[INFERRED] is True and backoff.attrs[RETRY_AFTER_STATUS] == 429
    assert backoff.end_ns - backoff.start_ns == 400_000_000


def test_inferred_retries_give_the_retry_verdict_inferred_and_no_surer_than_inferred():
    tl = infer_from_spans(timeline(rate_limited(), source_kind="otlp"))
    analysis = analyze(tl, warmup_s=0)
    findings = run_rules(analysis, default_rules())
    report = build_report(analysis, findings)
    assert (report.verdict.layer, report.verdict.rule) == (RETRY, "retry-backoff"), report.verdict
    [finding] = [f for f in findings if f.rule == "retry-backoff"]
    assert finding.evidence["inferred"] is True and finding.confidence <= 0.6
    assert report.verdict.confidence <= finding.confidence and "nferred" in report.verdict.summary


def test_does_not_infer_a_retry_when_an_llm_call_sits_between_two_calls_of_a_tool():
    """An agent loop: the tool fails, the LLM is asked again, then the tool is called again."""
    tool = {SERVER_ADDRESS: "tools.internal"}
    failed = seg(TOOL, 0, 10, name="GET /search", parent="root", **{**tool, HTTP_STATUS_CODE: 503})
    llm = seg(PROVIDER, 10, 300, name="POST", parent="root", **LLM)
    again = seg(TOOL, 300, 320, name="GET /search", parent="root", **{**tool, HTTP_STATUS_CODE: 200})
    assert retries_in(req(0, 330, failed, llm, again)) == []


def test_does_not_infer_a_retry_after_a_call_that_succeeded_or_without_a_gap():
    ok = seg(TOOL, 0, 10, name="GET /a", parent="root", **{SERVER_ADDRESS: "h", HTTP_STATUS_CODE: 200})
    assert retries_in(req(0, 300, ok, seg(TOOL, 200, 210, name="GET /a", parent="root", **{SERVER_ADDRESS: "h"}))) == []
    failed = seg(TOOL, 0, 10, name="GET /a", parent="root", **{SERVER_ADDRESS: "h", HTTP_STATUS_CODE: 500})
    soon = seg(TOOL, 10 + MIN_BACKOFF_NS / 2e6, 20, name="GET /a", parent="root", **{SERVER_ADDRESS: "h"})
    assert retries_in(req(0, 30, failed, soon)) == []
    tl = timeline(rate_limited(every=10**6), source_kind="otlp")
    assert infer_retries(tl) is tl


# --- a provider tail from LLM HTTP spans, where first token and decode are one block ------------

from latprof.semconv import SPLIT_UNKNOWN  # noqa: E402


def llm_tail(n: int = 300, **attrs: object) -> list[RequestTimeline]:
    """Requests that are one LLM call each, 1 in 25 three times as long."""
    out = []
    for i in range(n):
        t, llm = i * 1000.0, (600.0 if i % 25 == 24 else 200.0) + (i % 7)
        out.append(req(t, t + llm + 2, seg(PROVIDER, t + 1, t + 1 + llm, name="POST", **attrs)))
    return out


def test_a_provider_tail_in_llm_http_spans_is_named_below_half_confidence_saying_what_would_tell():
    analysis = analyze(timeline(llm_tail(**{SPLIT_UNKNOWN: True}), source_kind="otlp"), warmup_s=0)
    report = build_report(analysis, run_rules(analysis, default_rules()))
    assert report.verdict.layer in (PROVIDER, "unattributed") and report.verdict.confidence < 0.5, report.verdict
    assert "cannot be told apart" in report.verdict.summary and "GenAI instrumentation" in report.verdict.summary


def test_does_not_lower_a_provider_verdict_whose_first_token_was_measured():
    analysis = analyze(timeline(llm_tail(), source_kind="otlp"), warmup_s=0)
    report = build_report(analysis, run_rules(analysis, default_rules()))
    assert report.verdict.layer == PROVIDER and report.verdict.confidence >= 0.5, report.verdict
    assert "cannot be told apart" not in report.verdict.summary


# --- a connection taken at the top of a handler: the wait is before its first step ------------------

from latprof.analysis.inference import SOURCE_GAP_BEFORE_FIRST_STEP, gap_before_first_step  # noqa: E402
from latprof.analysis.inference import INFERRED_FROM  # noqa: E402


def llm_first(requests: list[RequestTimeline]) -> list[RequestTimeline]:
    """The same requests with their first statement dropped: the LLM call comes first, then a statement."""
    return [RequestTimeline(rt.request, tuple(s for s in rt.segments if s.name != "SELECT")) for rt in requests]


def test_a_pool_taken_before_the_llm_call_gives_inferred_db_pool_from_the_gap_before_the_first_step():
    tl = timeline(llm_first(pooled()), source_kind="otlp")
    inferred = infer_pool_waits(tl)
    waits = [s for rt in inferred.requests for s in rt.segments if s.layer == DB_POOL]
    assert waits and all(s.attrs[INFERRED_FROM] == SOURCE_GAP_BEFORE_FIRST_STEP for s in waits)
    assert waits[0].attrs[INFERRED_CEILING] == 3
    assert gap_before_first_step(req(0, 10, seg(DB_QUERY, 1, 2), seg(PROVIDER, 2, 9))) is None  # a statement first


def test_does_not_infer_a_pool_from_own_work_before_the_first_step():
    rng = random.Random(2)
    requests = []
    for i in range(400):
        t = i * 100.0
        pre = 400.0 if i % 40 == 39 else rng.uniform(0.0, 1.0)
        requests.append(req(t, t + pre + 170, seg(PROVIDER, t + pre, t + pre + 165), seg(DB_QUERY, t + pre + 165, t + pre + 168)))
    tl = timeline(requests, source_kind="otlp")
    assert infer_pool_waits(tl) is tl
