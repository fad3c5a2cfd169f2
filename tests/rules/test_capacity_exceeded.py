"""capacity-exceeded: a load that steps above capacity grows the queue; the tail that arrives in it is that step's."""

from __future__ import annotations

import heapq
from typing import Callable

from timelines import ORIGIN_NS, analysed, req, seg

from latprof.analysis.timeline import RequestTimeline
from latprof.layers import DB_QUERY, PROVIDER, QUEUE
from latprof.rules.capacity_exceeded import CapacityExceeded, Thresholds
from latprof.rules.request_queueing import RequestQueueing
from latprof.semconv import SAMPLE_WEIGHT

T0 = ORIGIN_NS / 1e9
WORKERS = 4  # each request: 50 ms of app code, then a 200 ms LLM call (+ up to 6 ms): ~15.6/s capacity


def step(t_s: float) -> float:
    """8 requests/s, 24/s from 30 s to 40 s."""
    return 24.0 if 30 <= t_s < 40 else 8.0


def serve(
    rate: Callable[[float], float] = step,
    *,
    duration_s: float = 58.0,
    queue_at: str = QUEUE,
    slow_db_every: int = 0,
) -> list[RequestTimeline]:
    """Open-loop arrivals at `rate(t)` (evenly spaced) into `WORKERS` FIFO slots.

    `queue_at=QUEUE`: the service has `WORKERS` workers and requests wait for one before any
    handler starts. `queue_at=PROVIDER`: workers are plenty but the provider serves `WORKERS`
    calls at a time, so the wait is inside the LLM call, before its first token. With
    `slow_db_every`, every such request also runs a 2 s query (outside the FIFO slots).
    """
    free = [0.0] * WORKERS
    out = []
    t, i = 0.0, 0
    while t < duration_s * 1000:
        work = 250.0 + i % 7
        db = 2000.0 if slow_db_every and i % slow_db_every == slow_db_every - 1 else 0.0
        slot = heapq.heappop(free)
        if queue_at == QUEUE:
            begin = max(t, slot)
            heapq.heappush(free, begin + work)
            segs = [seg(QUEUE, t, begin), seg("app", begin, begin + 50)]
            if db:
                segs.append(seg(DB_QUERY, begin + 50, begin + 50 + db))
            call = begin + 50 + db
            segs.append(seg(PROVIDER, call, call + work - 50, name="chat gpt-4o-mini"))
            end = call + work - 50
        else:
            call = t + 50 + db
            begin = max(call, slot)  # the provider starts on it
            heapq.heappush(free, begin + work - 50)
            segs = [seg("app", t, t + 50)]
            if db:
                segs.append(seg(DB_QUERY, t + 50, call))
            segs.append(seg(PROVIDER, call, begin + work - 50, name="chat gpt-4o-mini"))
            end = begin + work - 50
        out.append(req(t, end, *segs, id=f"r{i}"))
        t += 1000.0 / rate(t / 1000)
        i += 1
    return out


def test_fires_at_the_window_of_the_step_with_queue_as_the_layer() -> None:
    analysis = analysed(serve())
    assert analysis.has_tail

    [finding] = CapacityExceeded().check(analysis)

    assert finding.rule == "capacity-exceeded" and finding.layer == QUEUE
    ev = finding.evidence
    assert ev["computed_from"] == "request arrival and end times"
    # 1 s windows; arrivals step to 24/s at 30 s; ~15.6/s get served, so in flight grows to 40 s
    assert ev["window_s"] == 1.0
    assert ev["stretch_start_offset_s"] == 30.0 and ev["stretch_end_offset_s"] == 40.0
    assert ev["stretch_start_unix_s"] == T0 + 30 and ev["stretch_end_unix_s"] == T0 + 40
    assert ev["arrivals_per_s"] == 24.0
    assert 15.0 <= ev["completions_per_s"] <= 16.0
    # 10 s x (24 - 15.8)/s on top of the 2 in flight before
    assert ev["in_flight_at_start"] == 2 and 80 <= ev["in_flight_peak"] <= 90
    assert ev["share_of_tail_in_stretch"] == 1.0
    assert ev["tail_concentration_ratio"] is None  # no tail request outside: infinitely concentrated
    # p99 of a window reaches 2x the capture's p50 within the first seconds of the step
    assert 30 <= ev["tail_began_window"] <= 32
    assert ev["tail_began_unix_s"] == T0 + ev["tail_began_window"] == ev["p99_climbed_unix_s"]
    windows = ev["windows"]
    assert windows[0]["start_unix_s"] == T0 + 29  # the window before the stretch ...
    assert windows[-1]["start_unix_s"] == ev["drained_by_unix_s"] - 1  # ... until it drained
    assert [w["in_flight"] for w in windows[1:11]] == sorted(w["in_flight"] for w in windows[1:11])
    assert windows[11]["in_flight"] < windows[10]["in_flight"] == ev["in_flight_peak"]
    assert all(w["arrivals"] == 24 for w in windows[1:11])
    # the queue pile is what the stretch's requests waited for; the slowest arrived at its end
    assert ev["stretch_layer_excess_ms"] > 1000
    # r240..r479 arrived in the stretch; the slowest arrived at its end or just after, behind the whole pile
    assert len(ev["example_request_ids"]) == 3 and all(470 <= int(r[1:]) <= 490 for r in ev["example_request_ids"])
    # impact: the queue's tail excess, all of it explained (every tail request arrived in the stretch)
    assert finding.impact_ms == round(analysis.layer(QUEUE).tail_excess_ms, 3)
    assert finding.severity == "critical" and finding.confidence == 1.0
    assert "from 00:00:30 to 00:00:40 UTC (seconds 30-40 of the capture)" in finding.summary.replace(
        _clock_prefix(), "00:00:"
    )
    assert "arrivals ran at 24/s while completions stayed at 15" in finding.summary
    assert f"grew from {ev['in_flight_at_start']} to {ev['in_flight_peak']}" in finding.summary
    assert "waiting for a worker" in finding.summary and "100% of the slowest 1% arrived in it" in finding.summary
    assert f"p99 climbed from the window at {_clock_prefix()}{ev['tail_began_window']:02d}" in finding.summary
    assert finding.fix.startswith("capacity: scale out before the queue grows")
    assert "in-flight" in finding.fix and "not CPU" in finding.fix and "optimis" not in finding.fix.lower()


def _clock_prefix() -> str:
    """HH:MM: of the test origin in UTC (the summary prints wall-clock times)."""
    import datetime

    return datetime.datetime.fromtimestamp(T0, tz=datetime.timezone.utc).strftime("%H:%M:")


def test_a_provider_that_queues_makes_provider_the_layer() -> None:
    analysis = analysed(serve(queue_at=PROVIDER))

    [finding] = CapacityExceeded().check(analysis)

    assert finding.layer == PROVIDER
    assert finding.evidence["stretch_start_offset_s"] == 30.0
    assert "waiting for the provider's first token" in finding.summary
    assert finding.impact_ms == round(analysis.layer(PROVIDER).tail_excess_ms, 3)
    # a different subject than the worker queue's: a different problem to track
    [queued] = CapacityExceeded().check(analysed(serve()))
    assert finding.fingerprint != queued.fingerprint


def test_does_not_fire_on_a_healthy_capture() -> None:
    analysis = analysed(serve(lambda t: 8.0))
    assert not analysis.has_tail

    assert list(CapacityExceeded().check(analysis)) == []


def test_does_not_fire_on_a_steady_overload_whose_queue_does_not_grow() -> None:
    # 16/s arrive and 16/s complete: every request waits about 2 s, every 20th 5 s; in flight is
    # high (~37) and level from the first seconds on. The queue owns the tail, the step does not.
    requests = []
    for i in range(16 * 55):
        t = i * 62.5
        wait = 5000.0 if i % 20 == 19 else 2000.0 + (i * 37) % 300
        requests.append(req(t, t + wait + 250, seg(QUEUE, t, t + wait), seg(PROVIDER, t + wait, t + wait + 250)))
    analysis = analysed(requests)
    assert analysis.has_tail
    assert len(list(RequestQueueing().check(analysis))) == 1

    assert list(CapacityExceeded().check(analysis)) == []


def test_does_not_fire_when_slow_queries_spread_through_the_capture_make_the_tail() -> None:
    # A short step (20/s for 3 s) grows the queue to 16, but the tail is a 2 s query every 50th
    # request, all through the capture: only 2 of the 5 slowest arrived in the stretch.
    analysis = analysed(serve(lambda t: 20.0 if 30 <= t < 33 else 8.0, slow_db_every=50))
    assert analysis.has_tail

    assert list(CapacityExceeded().check(analysis)) == []
    # the stretch is there; the share of the tail in it stops the finding (and the little it explains)
    assert list(CapacityExceeded(Thresholds(min_share_of_tail_excess=0.0)).check(analysis)) == []
    [finding] = CapacityExceeded(Thresholds(min_share_of_tail_in_stretch=0.4, min_share_of_tail_excess=0.0)).check(analysis)
    assert finding.evidence["stretch_start_offset_s"] == 30.0 and finding.evidence["in_flight_peak"] == 16
    assert finding.evidence["share_of_tail_in_stretch"] == 0.4


def test_does_not_fire_when_slow_queries_that_also_queued_in_the_stretch_make_the_tail() -> None:
    # A 2 s query every 10th request: the 5 slowest are those that also queued in the short step,
    # but the queue explains a fifth of their excess and the queries the rest.
    analysis = analysed(serve(lambda t: 20.0 if 30 <= t < 33 else 8.0, slow_db_every=10))
    assert round(analysis.layer(DB_QUERY).share_of_tail_excess, 1) == 0.8

    assert list(CapacityExceeded().check(analysis)) == []
    [finding] = CapacityExceeded(Thresholds(min_share_of_tail_excess=0.15)).check(analysis)
    assert finding.evidence["share_of_tail_in_stretch"] == 1.0 and finding.layer == QUEUE
    assert 0.15 <= finding.impact_ms / analysis.tail_excess_ms < 0.3
    # with a long step the queue owns most of the tail, queries or not: it fires
    [stepped] = CapacityExceeded().check(analysed(serve(slow_db_every=10)))
    assert stepped.layer == QUEUE and stepped.evidence["stretch_start_offset_s"] == 30.0


def test_a_stretch_that_holds_the_tail_but_not_more_often_than_elsewhere_does_not_fire() -> None:
    analysis = analysed(serve())
    [finding] = CapacityExceeded().check(analysis)
    assert finding.evidence["share_of_tail_in_stretch"] == 1.0

    assert list(CapacityExceeded(Thresholds(min_share_of_tail_in_stretch=1.01)).check(analysis)) == []
    assert list(CapacityExceeded(Thresholds(min_tail_excess_ms=finding.impact_ms * 10)).check(analysis)) == []
    assert list(CapacityExceeded(Thresholds(min_in_flight_rise_ratio=100.0)).check(analysis)) == []
    assert list(CapacityExceeded(Thresholds(min_arrival_over_completion_ratio=2.0)).check(analysis)) == []
    assert list(CapacityExceeded(Thresholds(min_stretch_windows=11)).check(analysis)) == []


def test_sampled_requests_give_the_finding_of_the_requests_they_stand_for() -> None:
    # every other request recorded with weight 2 against both recorded: the same stretch and layer
    full = analysed(serve())
    requests = serve()
    sampled = [RequestTimeline(rt.request._replace(attrs={SAMPLE_WEIGHT: 2}), rt.segments) for rt in requests[::2]]
    analysis = analysed(sampled)

    [a] = CapacityExceeded().check(full)
    [b] = CapacityExceeded().check(analysis)

    assert b.layer == a.layer == QUEUE
    assert b.evidence["stretch_start_offset_s"] == a.evidence["stretch_start_offset_s"]
    assert b.evidence["arrivals_per_s"] == a.evidence["arrivals_per_s"] == 24.0
    assert abs(b.evidence["in_flight_peak"] - a.evidence["in_flight_peak"]) <= 2
