"""request-queueing: fires when time before a worker starts owns the tail; numbers checked by hand."""

from __future__ import annotations

from typing import Callable

from timelines import assert_min_tail_excess_is_the_boundary, analysed, gauge, req, seg

from latprof.layers import PROVIDER, QUEUE
from latprof.rules.request_queueing import RequestQueueing, Thresholds
from latprof.semconv import GAUGE_ACCEPT_QUEUE, QUEUE_SOURCE
from latprof.analysis.timeline import RequestTimeline

N = 200  # requests, 100 ms apart; every 20th (i = 19, 39, ..., 199) is slow: k = 0..9


def service(
    *,
    slow_queue_ms: Callable[[int], float] = lambda k: 400 + 50 * k,
    typical_queue_ms: float | None = 2.0,
    slow_provider_ms: Callable[[int], float] = lambda k: 200.0,
    source: Callable[[int, bool], str | None] = lambda k, slow: "backlog" if slow and k % 2 else "threadpool",
) -> list[RequestTimeline]:
    """A sync service: queue (when any), 50 ms of app code, a 200 ms LLM call.

    Slow request k queues `slow_queue_ms(k)`; `typical_queue_ms=None` records no queue segments at all.
    """
    out = []
    for i in range(N):
        slow, k = i % 20 == 19, i // 20
        t0 = i * 100.0
        segs = []
        queue_ms = None if typical_queue_ms is None else slow_queue_ms(k) if slow else typical_queue_ms
        cursor = t0
        if queue_ms is not None:
            where = source(k, slow)
            attrs = {QUEUE_SOURCE: where} if where else {}
            segs.append(seg(QUEUE, cursor, cursor + queue_ms, name="wait for worker", **attrs))
            cursor += queue_ms
        segs.append(seg("app", cursor, cursor + 50))
        cursor += 50
        provider_ms = slow_provider_ms(k) if slow else 200.0
        segs.append(seg(PROVIDER, cursor, cursor + provider_ms, name="chat gpt-4o-mini"))
        cursor += provider_ms
        out.append(req(t0, cursor, *segs, id=f"r{i}"))
    return out


ACCEPT_QUEUE = [gauge(GAUGE_ACCEPT_QUEUE, v, at_ms=1000 * j) for j, v in enumerate([0, 3, 12, 5])]


def test_fires_when_queue_owns_the_tail_with_hand_computed_evidence() -> None:
    analysis = analysed(service(), gauges=ACCEPT_QUEUE)

    [finding] = RequestQueueing().check(analysis)

    assert finding.rule == "request-queueing"
    assert finding.layer == QUEUE
    # Tail = the 3 slowest (k = 9, 8, 7: 850, 800, 750 ms queued), mean 800; median cohort 2 ms.
    assert finding.impact_ms == 798.0
    assert finding.severity == "critical"
    assert finding.confidence == 1.0
    ev = finding.evidence
    assert ev["queue_p50_ms"] == 2.0
    # 190 x 2 ms then 400..850: p99 sits between the 198th (750) and 199th (800) value, at 1%.
    assert ev["queue_p99_ms"] == 750.5
    assert ev["tail_excess_ms"] == 798.0
    assert ev["share_of_tail_excess"] == 1.0  # app and provider are the same in every request
    # 195 requests queued for a thread; the 5 slow ones with odd k sat in the accept backlog.
    assert ev["queue_sources"] == {"threadpool": 195, "backlog": 5}
    assert list(ev["queue_sources"]) == ["threadpool", "backlog"]
    assert ev["peak_accept_queue"] == 12
    # Time-weighted: 0, 3 and 12 for a second each, then 5 from 3 s until the last response
    # at 21 s (r199: 19.9 s + 850 + 50 + 200 ms): (0 + 3 + 12 + 5 x 18) / 21.
    assert ev["mean_accept_queue"] == 5.0
    # Typical requests last 252 ms and arrive every 100 ms: 3 overlap; the slow one of k = 8
    # (17.9 s to 18.95 s) adds a 4th around 18.8-18.9 s.
    assert ev["peak_in_flight"] == 4
    assert ev["example_request_ids"] == ["r199", "r179", "r159"]
    assert "798 ms" in finding.summary and "worker thread pool" in finding.summary
    assert "accept queue up to 12" in finding.summary
    assert "thread" in finding.fix and "async" in finding.fix and "autoscale" in finding.fix


def test_fingerprint_is_stable_across_runs_and_follows_where_requests_queued() -> None:
    [first] = RequestQueueing().check(analysed(service()))
    [again] = RequestQueueing().check(analysed(service()))
    [backlog] = RequestQueueing().check(analysed(service(source=lambda k, slow: "backlog")))

    assert first.fingerprint == again.fingerprint
    assert backlog.fingerprint != first.fingerprint
    assert backlog.evidence["queue_sources"] == {"backlog": 200}
    assert "accept backlog" in backlog.summary
    assert backlog.fix.startswith("Every worker was busy")


def test_fires_without_gauges_or_sources_and_leaves_their_evidence_out() -> None:
    analysis = analysed(service(source=lambda k, slow: None))

    [finding] = RequestQueueing().check(analysis)

    assert finding.impact_ms == 798.0
    assert "queue_sources" not in finding.evidence
    assert "peak_accept_queue" not in finding.evidence
    assert "mostly in" not in finding.summary
    assert finding.confidence == 1.0  # the share alone


def test_does_not_fire_when_there_is_no_queue_layer() -> None:
    analysis = analysed(service(typical_queue_ms=None, slow_provider_ms=lambda k: 900 + 50 * k))
    assert not analysis.layer(QUEUE).seen

    assert list(RequestQueueing().check(analysis)) == []


def test_does_not_fire_when_the_queue_is_not_in_the_tail() -> None:
    # Every request queues 2 ms; the slow ones are slow at the provider.
    analysis = analysed(service(slow_queue_ms=lambda k: 2.0, slow_provider_ms=lambda k: 900 + 50 * k))
    assert analysis.layer(QUEUE).seen and analysis.layer(QUEUE).tail_excess_ms == 0

    assert list(RequestQueueing().check(analysis)) == []


def test_does_not_fire_when_the_queue_excess_is_below_min_tail_excess() -> None:
    assert_min_tail_excess_is_the_boundary(RequestQueueing, Thresholds, analysed(service()))

def test_does_not_fire_when_the_queue_share_is_below_min_share() -> None:
    # Slow requests queue 102 ms (100 over the median) but spend 700 ms more at the provider.
    analysis = analysed(service(slow_queue_ms=lambda k: 102.0, slow_provider_ms=lambda k: 500 + 50 * k))
    assert analysis.layer(QUEUE).share_of_tail_excess == 0.125  # 100 / (100 + 700)

    assert list(RequestQueueing().check(analysis)) == []
    [finding] = RequestQueueing(Thresholds(min_share_of_tail_excess=0.1)).check(analysis)
    assert finding.severity == "warning"
    assert finding.evidence["share_of_tail_excess"] == 0.125


def test_does_not_fire_when_thresholds_are_raised_above_the_tail() -> None:
    analysis = analysed(service())

    assert list(RequestQueueing(Thresholds(min_tail_excess_ms=1000.0)).check(analysis)) == []
    assert list(RequestQueueing(Thresholds(min_share_of_tail_excess=1.01)).check(analysis)) == []


def test_fires_without_a_tail_when_every_request_queues_for_a_worker() -> None:
    from timelines import population

    requests = population(200, [(QUEUE, 300), ("app", 50), (PROVIDER, 100)], [(QUEUE, 320), ("app", 50), (PROVIDER, 100)])
    analysis = analysed(requests)
    assert not analysis.has_tail
    [finding] = RequestQueueing().check(analysis)
    ev = finding.evidence
    assert ev["dominates_median"] is True and ev["median_ms"] == 300.0
    assert 0.66 <= ev["share_of_median_latency"] <= 0.67 and finding.severity == "warning"
    assert finding.summary.startswith("Every request waits for a worker before its handler starts: 300 ms of the median")
    assert "the service runs at its concurrency limit" in finding.summary
    # raising the share above what it is silences it
    assert list(RequestQueueing(Thresholds(min_share_of_median_latency=0.7)).check(analysis)) == []
