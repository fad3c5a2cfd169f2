"""An outbound HTTP connection limit inferred from stock client spans (latprof.analysis.http_limit_inference): calls
simulated through a real first-come-first-served pool, with known answers, and the shapes that must not read as one."""

from __future__ import annotations

import heapq
import random

import pytest

from timelines import req, seg, timeline

from latprof.analysis.http_limit_inference import (
    AMBIGUOUS_CONFIDENCE,
    INFERRED_WAITED_CALLS,
    call_host,
    implied_starts,
    infer_http_limits,
)
from latprof.analysis.inference import INFERRED, INFERRED_CEILING, INFERRED_FROM
from latprof.analysis.requests import analyze
from latprof.analysis.span_inference import infer_from_spans
from latprof.analysis.timeline import RequestTimeline, Timeline
from latprof.engine import Finding, run_rules
from latprof.events import Segment
from latprof.layers import HTTP_POOL, PROVIDER, TOOL
from latprof.pipeline import default_rules
from latprof.report.model import Report, build_report
from latprof.semconv import HTTP_REQUEST_METHOD, SERVER_ADDRESS, SERVER_PORT

LLM = {SERVER_ADDRESS: "llm.example", SERVER_PORT: 443, HTTP_REQUEST_METHOD: "POST"}


def call(start: float, end: float, layer: str = PROVIDER, **attrs: object) -> Segment:
    """An HTTP client span's segment, as the tracemap makes it (to the LLM host unless `attrs` say otherwise)."""
    return seg(layer, start, end, name="POST", **(attrs or LLM))


def pooled(n: int = 400, limit: int = 2, *, seed: int = 1, burst_every: int = 40, burst: int = 8,
           service: tuple[float, float] = (130, 170), release_lag_ms: float = 0.0,
           **attrs: object) -> list[RequestTimeline]:  # fmt: skip
    """Requests that each make one call through a FIFO pool of `limit` connections; arrivals spaced out
    (the pool has room), with a burst of `burst` nearly at once now and then: the burst waits, its
    span starting when the call is made, before the wait, as a stock httpx span does. A span ends
    `release_lag_ms` after its connection went back to the pool (an LLM call's end read at its caller's
    next step)."""
    rng = random.Random(seed)
    free = [float("-inf")] * limit  # when each connection comes back (a heap)
    out, t = [], 0.0
    for i in range(n):
        t += 0.5 if i % burst_every in range(1, burst) else rng.uniform(120, 260)
        got = max(t + 1, heapq.heappop(free))
        end = got + rng.uniform(*service)
        heapq.heappush(free, end)
        out.append(req(t, end + release_lag_ms + 2, call(t + 1, end + release_lag_ms, **attrs)))
    return out


def closed_loop(n: int = 400, clients: int = 2, *, seed: int = 2, spike_every: int = 30) -> list[RequestTimeline]:
    """`clients` clients, each sending its next request as its last one is answered: never more than
    `clients` calls in flight, none waits; 1 call in `spike_every` is 500 ms slower (a provider tail)."""
    rng = random.Random(seed)
    next_at = [rng.uniform(0, 50) for _ in range(clients)]
    out = []
    for i in range(n):
        c = min(range(clients), key=next_at.__getitem__)
        t = next_at[c]
        took = rng.uniform(130, 170) + (500 if i % spike_every == spike_every - 1 else 0)
        out.append(req(t, t + took + 3, call(t + 1, t + 1 + took)))
        next_at[c] = t + took + 3 + rng.uniform(0.5, 2)
    return out


def variable(n: int = 400, *, seed: int = 3, mean_gap_ms: float = 60) -> list[RequestTimeline]:
    """A healthy provider with variable latency (lognormal, median 200 ms) under open-loop Poisson arrivals."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(1 / mean_gap_ms)
        took = rng.lognormvariate(5.3, 0.6)
        out.append(req(t, t + took + 3, call(t + 1, t + 1 + took)))
    return out


def waits(tl: Timeline) -> list[Segment]:
    return [s for rt in tl.requests for s in rt.segments if s.layer == HTTP_POOL]


def report_of(tl: Timeline, warmup_s: float = 0.0) -> tuple[Report, list[Finding]]:
    analysis = analyze(tl, warmup_s=warmup_s)
    findings = run_rules(analysis, default_rules())
    return build_report(analysis, findings), findings


def test_the_replay_serves_each_call_when_the_nth_latest_earlier_call_ends():
    starts, ends = [0, 1, 2, 3, 50], [10, 20, 30, 40, 60]
    assert implied_starts(starts, ends, 2) == [0, 1, 10, 20, 50]  # 3rd waits for the 1st, 4th for the 2nd, 5th finds room
    assert implied_starts(starts, ends, 1) == [0, 10, 20, 30, 50]
    assert implied_starts(starts, ends, 5) == starts


def test_the_host_of_a_call_from_its_attributes_or_its_url():
    assert call_host(LLM) == ("llm.example", 443)
    old_conventions = {"http.method": "POST", "http.url": "http://127.0.0.1:8123/v1/chat/completions?x=1"}
    assert call_host(old_conventions) == ("127.0.0.1:8123", None)
    assert call_host({"http.method": "GET", "url.full": "https://user@search.test/q"}) == ("search.test", None)
    assert call_host({"rpc.system": "grpc", SERVER_ADDRESS: "x"}) is None  # not an HTTP call


@pytest.mark.parametrize("limit, burst", [(2, 8), (3, 10), (8, 20)])
def test_calls_through_a_small_pool_give_inferred_http_pool_waits_with_its_size(limit: int, burst: int):
    tl = timeline(pooled(limit=limit, burst=burst), source_kind="otlp")
    inferred = infer_http_limits(tl)
    found = waits(inferred)
    assert found and all(s.attrs[INFERRED] is True for s in found)
    attrs = found[0].attrs
    assert attrs[INFERRED_CEILING] == limit and attrs[SERVER_ADDRESS] == "llm.example:443"
    assert attrs[INFERRED_WAITED_CALLS] >= 40
    # each wait sits inside its call's span, from the span's start, and owns that time
    calls = {s.segment_id: s for rt in inferred.requests for s in rt.segments if s.layer == PROVIDER}
    for wait in found:
        parent = calls[wait.parent_id]
        assert wait.start_ns == parent.start_ns < wait.end_ns <= parent.end_ns


def test_a_pool_is_read_when_spans_end_a_little_after_their_connection_went_back():
    """The provider answers in 150 ms give or take a millisecond, and each span ends 1.5 ms after its connection
    was released (the caller's next step): a waiting call's remainder is that much short of the others', not
    a sign of too few slots (seen in a recording)."""
    inferred = infer_http_limits(timeline(pooled(service=(149, 151), release_lag_ms=1.5), source_kind="otlp"))
    found = waits(inferred)
    assert found and found[0].attrs[INFERRED_CEILING] == 2


def test_the_verdict_is_http_pool_inferred_below_half_naming_both_readings():
    report, findings = report_of(infer_from_spans(timeline(pooled(), source_kind="otlp")))
    assert (report.verdict.layer, report.verdict.rule) == (HTTP_POOL, "http-pool-exhaustion"), report.verdict
    assert "inferred" in report.verdict.summary and report.verdict.confidence <= AMBIGUOUS_CONFIDENCE
    [finding] = [f for f in findings if f.rule == "http-pool-exhaustion"]
    evidence = finding.evidence
    assert evidence["inferred"] is True and evidence["connection_ceiling"] == 2 and evidence["host"] == "llm.example:443"
    assert evidence["inferred_from"] == found_source(infer_http_limits(timeline(pooled(), source_kind="otlp")))
    assert 0 < finding.confidence <= AMBIGUOUS_CONFIDENCE
    summary = finding.summary
    assert "a client connection limit of 2" in summary and "a provider that serves 2 at a time" in summary
    assert "latprof run" in summary and "concurrency limit" in summary
    # what was left once the wait is taken off is the provider's usual time
    assert 0.8 <= evidence["waited_service_median_ms"] / evidence["unwaited_median_ms"] <= 1.25


def found_source(tl: Timeline) -> object:
    return waits(tl)[0].attrs[INFERRED_FROM]


def test_a_host_named_only_in_the_url_is_told_from_another_host_of_the_same_layer():
    """Old semantic conventions (httpx's default): `http.url`, no `server.address`. The limited host's
    calls are mixed with a search tool's on another port; only the limited one's calls waited."""
    limited = pooled(**{"http.method": "POST", "http.url": "http://127.0.0.1:8123/v1/chat/completions"})
    rng = random.Random(5)
    search = {"http.method": "GET", "http.url": "http://127.0.0.1:9200/q"}
    searches = []
    for rt in limited:  # a quick search call alongside each request
        t = (rt.request.start_ns - limited[0].request.start_ns) / 1e6 + 0.2
        searches.append(req(t, t + 40, call(t, t + rng.uniform(10, 35), TOOL, **search)))
    inferred = infer_http_limits(timeline(limited + searches, source_kind="otlp"))
    found = waits(inferred)
    assert found and {s.attrs[SERVER_ADDRESS] for s in found} == {"127.0.0.1:8123"}
    assert found[0].attrs[INFERRED_CEILING] == 2


@pytest.mark.parametrize("clients", [2, 4])
def test_does_not_fire_when_the_load_itself_never_has_more_calls_in_flight_than_the_limit(clients: int):
    """A closed loop of N clients keeps a limit of N always busy, yet no call waits: no pool to read."""
    tl = timeline(closed_loop(clients=clients), source_kind="otlp")
    assert infer_http_limits(tl) is tl
    report, findings = report_of(infer_from_spans(tl))
    assert all(f.rule != "http-pool-exhaustion" for f in findings)
    assert report.verdict.layer == PROVIDER, report.verdict  # the spikes are the provider's


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("mean_gap_ms", [25, 60, 150])
def test_does_not_fire_on_a_healthy_provider_with_variable_latency(seed: int, mean_gap_ms: float):
    tl = timeline(variable(seed=seed, mean_gap_ms=mean_gap_ms), source_kind="otlp")
    assert infer_http_limits(tl) is tl


def test_does_not_fire_when_every_call_waits():
    """A pool saturated all the time: no call shows what a call is without the wait, nothing to compare."""
    tl = timeline(pooled(burst_every=2), source_kind="otlp")
    assert infer_http_limits(tl) is tl


def test_leaves_calls_into_a_traced_service_to_the_queue_inference():
    """The called service's server span below each call says when it began serving: the time before is
    `infer_queueing`'s to read (a service at a fixed concurrency), not a client pool's."""
    from latprof.collectors.traces.tracemap import SERVICE_NAME, SPAN_KIND

    requests = []
    for rt in pooled():
        [c] = rt.segments
        server = c._replace(segment_id=f"{c.segment_id}.server", parent_id=c.segment_id, layer=None,
                            start_ns=c.end_ns - 100_000_000, attrs={SPAN_KIND: "server", SERVICE_NAME: "llm-gateway"})  # fmt: skip
        requests.append(RequestTimeline(rt.request, (c, server)))
    tl = timeline(requests, source_kind="otlp")
    assert infer_http_limits(tl) is tl


def test_the_pool_is_judged_after_the_warm_up_as_the_analysis_is():
    """The service's first calls open connections, one after another, and are the slowest of all: judged
    with them, the slowest calls are not the ones that waited; after the warm-up, the pool shows."""
    warm = [req(t, t + 1200, call(t + 1, t + 1190)) for t in (-15000.0 + 1250 * k for k in range(12))]
    tl = timeline(warm + pooled(), source_kind="otlp")
    assert infer_http_limits(tl, warmup_s=0) is tl
    inferred = infer_http_limits(tl, warmup_s=15.0)
    found = waits(inferred)
    assert found and all(s.start_ns >= tl.requests[12].request.start_ns for s in found)
    report, _ = report_of(inferred, warmup_s=15.0)
    assert (report.verdict.layer, report.verdict.rule) == (HTTP_POOL, "http-pool-exhaustion"), report.verdict
