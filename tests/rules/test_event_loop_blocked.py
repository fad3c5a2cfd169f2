"""event-loop-blocked: fires on event_loop segments owning the tail or on loop lag; numbers checked by hand."""

from __future__ import annotations

from typing import Callable

from timelines import assert_min_tail_excess_is_the_boundary, analysed, gauge, ms, req, seg

from latprof.events import Frame, Gauge, StackSample
from latprof.layers import EVENT_LOOP, PROVIDER
from latprof.rules.event_loop_blocked import EventLoopBlocked, Thresholds
from latprof.semconv import GAUGE_LOOP_LAG_MS
from latprof.analysis.timeline import RequestTimeline

N = 200  # requests, 100 ms apart; every 20th (i = 19, 39, ..., 199) is slow: k = 0..9


def service(
    *,
    loop_segments: bool = True,
    slow_loop_ms: Callable[[int], float] = lambda k: 300 + 50 * k,
    slow_provider_ms: Callable[[int], float] = lambda k: 200.0,
) -> list[RequestTimeline]:
    """An asyncio service: waiting for the loop (1 ms typically), 40 ms of app code, a 200 ms LLM call."""
    out = []
    for i in range(N):
        slow, k = i % 20 == 19, i // 20
        t0 = cursor = i * 100.0
        segs = []
        if loop_segments:
            wait = slow_loop_ms(k) if slow else 1.0
            segs.append(seg(EVENT_LOOP, cursor, cursor + wait, name="event loop delay"))
            cursor += wait
        segs.append(seg("app", cursor, cursor + 40))
        cursor += 40
        provider_ms = slow_provider_ms(k) if slow else 200.0
        segs.append(seg(PROVIDER, cursor, cursor + provider_ms, name="chat gpt-4o-mini"))
        cursor += provider_ms
        out.append(req(t0, cursor, *segs, id=f"r{i}"))
    return out


def lag_gauges(spikes: dict[int, float]) -> list[Gauge]:
    """100 loop-lag readings 200 ms apart from 10 ms on (inside the traffic), 2 ms unless spiked,
    and one 5 s reading half a second before the first request (start-up: not traffic)."""
    readings = [gauge(GAUGE_LOOP_LAG_MS, spikes.get(j, 2.0), at_ms=10 + 200 * j) for j in range(100)]
    return readings + [gauge(GAUGE_LOOP_LAG_MS, 5000.0, at_ms=-500)]


#: Five stalls: p99 of the 100 readings is 600 + 1% of (750 - 600) = 601.5 ms.
STALLS = {10: 150.0, 30: 300.0, 50: 450.0, 70: 600.0, 90: 750.0}

_LOOP = (
    Frame("_run", "/usr/lib/python3.12/asyncio/events.py", 88),
    Frame("_run_once", "/usr/lib/python3.12/asyncio/base_events.py", 1987),
    Frame("run_forever", "/usr/lib/python3.12/asyncio/base_events.py", 641),
)


def sample(
    tid: int, frames: tuple[Frame, ...], *, active: bool = True, count: int = 1, at_ms: float = 5000
) -> StackSample:
    return StackSample(ms(at_ms), 1, tid, "MainThread" if tid == 1 else "asyncio_0", frames, active, weight=count)


def loop_samples(*, with_loop_frames: bool = True) -> list[StackSample]:
    loop = _LOOP if with_loop_frames else ()
    tokenize = (
        Frame("encode", "/venv/lib/python3.12/site-packages/tiktoken/core.py"),
        Frame("count_tokens", "/srv/app/tokens.py"),
    )
    to_thread = (
        Frame("compress", "/usr/lib/python3.12/gzip.py"),
        Frame("run", "/usr/lib/python3.12/concurrent/futures/thread.py"),
    )
    return [
        sample(1, tokenize + loop, count=10),
        sample(1, (Frame("loads", "/usr/lib/python3.12/json/__init__.py"),) + loop, count=5),
        sample(1, (Frame("render", "/srv/app/export.py"),) + loop, count=3),
        sample(1, (Frame("sha256_crypt", "/srv/app/auth.py"),) + loop, count=2),
        # The loop idle in select: not active, so not a hot frame (but it marks tid 1 as the loop).
        sample(1, (Frame("select", "/usr/lib/python3.12/selectors.py"),) + loop, active=False, count=100),
        # A to_thread worker busy compressing: off the loop, so not what blocks it.
        sample(2, to_thread, count=50),
        # Before traffic started (start-up imports): left out.
        sample(1, (Frame("_find_and_load", "<frozen importlib._bootstrap>"),) + loop, count=1000, at_ms=-400),
    ]


def test_fires_when_event_loop_owns_the_tail_with_hand_computed_evidence() -> None:
    analysis = analysed(service(), gauges=lag_gauges(STALLS), samples=loop_samples())

    [finding] = EventLoopBlocked().check(analysis)

    assert finding.rule == "event-loop-blocked"
    assert finding.layer == EVENT_LOOP
    # Tail = k = 9, 8, 7 (750, 700, 650 ms waiting for the loop), mean 700; median cohort 1 ms.
    assert finding.impact_ms == 699.0
    assert finding.severity == "critical"
    assert finding.confidence == 1.0
    ev = finding.evidence
    assert ev["event_loop_p50_ms"] == 1.0
    assert ev["event_loop_p99_ms"] == 650.5  # between the 198th (650) and 199th (700) value, at 1%
    assert ev["tail_excess_ms"] == 699.0
    assert ev["share_of_tail_excess"] == 1.0
    assert ev["lag_p99_ms"] == 601.5
    assert ev["lag_max_ms"] == 750.0  # the 5 s start-up reading is before traffic
    assert ev["lag_readings"] == 100
    assert ev["lag_readings_over_threshold"] == 5
    assert ev["lag_threshold_ms"] == 100.0
    # 20 active samples on the loop thread (10 + 5 + 3 + 2); the worker thread's 50 are off the loop.
    assert [{k: f[k] for k in ("frame", "share")} for f in ev["hot_frames"]] == [
        {"frame": "encode (tiktoken/core.py)", "share": 0.5},
        {"frame": "loads (json/__init__.py)", "share": 0.25},
        {"frame": "render (app/export.py)", "share": 0.15},
    ]
    location = ev["hot_frames"][0]["location"]  # where `latprof check` annotates it
    assert location == {"path": "/srv/app/tokens.py", "line": None, "function": "count_tokens"}  # the app's caller of encode
    assert ev["hot_frames_scope"] == "event-loop thread"
    assert ev["example_request_ids"] == ["r199", "r179", "r159"]
    assert "699 ms" in finding.summary and "encode (tiktoken/core.py)" in finding.summary
    assert finding.fix.startswith("Move encode (tiktoken/core.py) off the event loop")
    assert "asyncio.to_thread" in finding.fix and "httpx.AsyncClient" in finding.fix


def test_fires_as_a_warning_from_loop_lag_alone_when_no_segments_were_recorded() -> None:
    requests = service(loop_segments=False, slow_provider_ms=lambda k: 900 + 50 * k)
    analysis = analysed(requests, gauges=lag_gauges(STALLS))

    [finding] = EventLoopBlocked().check(analysis)

    assert finding.severity == "warning"
    assert finding.impact_ms == 0.0
    assert finding.confidence == 0.5
    ev = finding.evidence
    assert "event_loop_p99_ms" not in ev and "example_request_ids" not in ev and "hot_frames" not in ev
    lag = (ev["lag_p99_ms"], ev["lag_max_ms"], ev["lag_readings"], ev["lag_readings_over_threshold"])
    assert lag == (601.5, 750.0, 100, 5)
    assert "602 ms" in finding.summary and "5 of 100 readings" in finding.summary


def test_lag_alone_is_info_when_segments_show_the_stalls_miss_the_tail() -> None:
    # event_loop segments were recorded (1 ms each) and the slow requests are slow at the provider.
    requests = service(slow_loop_ms=lambda k: 1.0, slow_provider_ms=lambda k: 900 + 50 * k)
    analysis = analysed(requests, gauges=lag_gauges(STALLS))

    [finding] = EventLoopBlocked().check(analysis)

    assert finding.severity == "info"
    assert finding.impact_ms == 0.0
    assert finding.evidence["tail_excess_ms"] == 0.0
    assert finding.evidence["example_request_ids"] == ["r199", "r179", "r159"]


def test_hot_frames_fall_back_to_all_threads_when_the_loop_thread_is_not_recognisable() -> None:
    analysis = analysed(service(), samples=loop_samples(with_loop_frames=False))

    [finding] = EventLoopBlocked().check(analysis)

    # 70 active samples: the worker's 50 compress, then 10 encode, 5 loads.
    assert [{k: f[k] for k in ("frame", "share")} for f in finding.evidence["hot_frames"]] == [
        {"frame": "compress (gzip.py)", "share": round(50 / 70, 4)},
        {"frame": "encode (tiktoken/core.py)", "share": round(10 / 70, 4)},
        {"frame": "loads (json/__init__.py)", "share": round(5 / 70, 4)},
    ]
    assert finding.evidence["hot_frames_scope"] == "all threads"
    assert "hottest active frame" in finding.summary


def test_fingerprint_is_stable_across_runs_with_or_without_samples() -> None:
    [first] = EventLoopBlocked().check(analysed(service(), samples=loop_samples()))
    [again] = EventLoopBlocked().check(analysed(service(), samples=loop_samples()))
    [no_samples] = EventLoopBlocked().check(analysed(service()))

    assert first.fingerprint == again.fingerprint == no_samples.fingerprint


def test_does_not_fire_when_there_are_no_event_loop_segments_and_no_lag_gauge() -> None:
    analysis = analysed(service(loop_segments=False, slow_provider_ms=lambda k: 900 + 50 * k), samples=loop_samples())

    assert list(EventLoopBlocked().check(analysis)) == []


def test_does_not_fire_when_the_event_loop_is_not_in_the_tail_and_lag_is_low() -> None:
    analysis = analysed(
        service(slow_loop_ms=lambda k: 1.0, slow_provider_ms=lambda k: 900 + 50 * k), gauges=lag_gauges({})
    )
    assert analysis.layer(EVENT_LOOP).seen and analysis.layer(EVENT_LOOP).tail_excess_ms == 0

    assert list(EventLoopBlocked().check(analysis)) == []


def test_does_not_fire_when_lag_p99_is_below_min_lag() -> None:
    # One 150 ms stall in 100 readings: p99 = 2 + 1% of (150 - 2) = 3.48 ms.
    analysis = analysed(service(loop_segments=False), gauges=lag_gauges({50: 150.0}))

    assert list(EventLoopBlocked().check(analysis)) == []
    [finding] = EventLoopBlocked(Thresholds(min_lag_p99_ms=3.0)).check(analysis)
    assert finding.evidence["lag_p99_ms"] == 3.48
    assert finding.evidence["lag_readings_over_threshold"] == 1  # only the stall reaches 3 ms


def test_does_not_fire_when_lag_spikes_only_before_traffic() -> None:
    analysis = analysed(service(loop_segments=False), gauges=lag_gauges({}))  # only the start-up reading is high

    assert list(EventLoopBlocked().check(analysis)) == []


def test_does_not_fire_when_the_loop_excess_is_below_min_tail_excess() -> None:
    assert_min_tail_excess_is_the_boundary(EventLoopBlocked, Thresholds, analysed(service()))

def test_does_not_fire_when_thresholds_are_raised_above_the_tail_and_the_lag() -> None:
    analysis = analysed(service(), gauges=lag_gauges(STALLS))

    assert list(EventLoopBlocked(Thresholds(min_tail_excess_ms=1000.0, min_lag_p99_ms=1000.0)).check(analysis)) == []


def test_fires_without_a_tail_when_every_request_waits_for_the_loop() -> None:
    from timelines import population

    requests = population(200, [(EVENT_LOOP, 120), (PROVIDER, 60)], [(EVENT_LOOP, 130), (PROVIDER, 60)])
    analysis = analysed(requests)
    assert not analysis.has_tail
    [finding] = EventLoopBlocked().check(analysis)
    assert finding.evidence["dominates_median"] is True and finding.evidence["median_ms"] == 120.0
    assert finding.severity == "warning"  # 67% of the median request
    assert finding.summary.startswith("Every request waits for a blocked event loop: 120 ms of the median request's")
