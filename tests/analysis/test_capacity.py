"""Capacity over time: per-window arrivals, completions and in flight, and growth stretches; numbers by hand."""

from __future__ import annotations

from timelines import ORIGIN_NS, analysed, req, seg

from latprof.analysis.capacity import (
    GrowthCriteria,
    WindowLoad,
    fill_end_unix_s,
    growth_stretches,
    rise_spread,
    steady_growth_stretches,
    tail_start,
    window_loads,
)
from latprof.analysis.timeline import RequestTimeline
from latprof.layers import PROVIDER, QUEUE
from latprof.semconv import SAMPLE_WEIGHT

T0 = ORIGIN_NS / 1e9  # a whole second: 1 s windows start on it


def weighted(rt: RequestTimeline, weight: int) -> RequestTimeline:
    return RequestTimeline(rt.request._replace(attrs={SAMPLE_WEIGHT: weight}), rt.segments)


def five() -> list[RequestTimeline]:
    return [
        req(100, 300, id="a"),
        req(500, 2000, id="b"),  # ends exactly as window 2 starts: in flight at 2.0 s, completes in window 2
        req(900, 2500, id="c"),
        req(1200, 1400, id="d"),
        req(2100, 3200, id="e"),  # ends after the last window
    ]


def test_window_loads_count_arrivals_completions_and_in_flight_by_hand() -> None:
    analysis = analysed(five())
    assert [w.start_unix_s - T0 for w in analysis.windows] == [0.0, 1.0, 2.0]

    loads = window_loads(analysis)

    # window 0 [0, 1): a, b, c arrive; a ends; b and c are in flight at 1.0 s
    # window 1 [1, 2): d arrives and ends; b (ending at 2.0 s) and c are in flight at 2.0 s
    # window 2 [2, 3): e arrives; b and c end; e is in flight at 3.0 s
    assert [(w.arrivals, w.completions, w.in_flight_start, w.in_flight_end) for w in loads] == [
        (3, 1, 0, 2),
        (1, 1, 2, 2),
        (1, 2, 2, 1),
    ]
    for w in loads:
        assert w.in_flight_end - w.in_flight_start == w.arrivals - w.completions
        assert w.arrivals == analysis.windows[w.index].requests
    assert loads[0].arrival_rate_per_s == 3.0 and loads[0].completion_rate_per_s == 1.0
    assert [w.grows for w in loads] == [True, False, False]


def test_sampled_requests_count_as_the_requests_they_stand_for() -> None:
    requests = five()
    requests[2] = weighted(requests[2], 4)  # c stands for 4
    requests[4] = weighted(requests[4], 3)  # e stands for 3

    loads = window_loads(analysed(requests))

    assert [(w.arrivals, w.completions, w.in_flight_start, w.in_flight_end) for w in loads] == [
        (6, 1, 0, 5),
        (1, 1, 5, 5),
        (3, 5, 5, 3),
    ]


def loads_of(levels: list[int], arrivals: list[int] | None = None) -> list[WindowLoad]:
    """1 s windows whose in flight goes through `levels` (levels[0] at the first window's start);
    arrivals as given (default: 10 a window, or 8 more than the rise), completions what makes the levels add up."""
    out = []
    for k in range(len(levels) - 1):
        a = max(10, levels[k + 1] - levels[k] + 8) if arrivals is None else arrivals[k]
        done = a - (levels[k + 1] - levels[k])
        assert done >= 0
        out.append(WindowLoad(k, T0 + k, T0 + k + 1, a, done, levels[k], levels[k + 1], None))
    return out


def test_a_step_above_capacity_is_a_growth_stretch_at_its_windows() -> None:
    # level 2, then +8 a window through windows 3..7 (arrivals 16/s, completions 8/s), then draining
    levels = [2, 2, 2, 2, 10, 18, 26, 34, 42, 34, 26, 18, 10, 2, 2]
    arrivals = [10, 10, 10, 16, 16, 16, 16, 16, 8, 8, 8, 8, 8, 10]

    [stretch] = growth_stretches(loads_of(levels, arrivals))

    assert (stretch.first, stretch.last) == (3, 7)
    assert (stretch.start_unix_s - T0, stretch.end_unix_s - T0) == (3.0, 8.0)
    assert (stretch.in_flight_start, stretch.in_flight_peak, stretch.rise) == (2, 42, 40)
    assert (stretch.arrivals, stretch.completions) == (80, 40)
    assert stretch.arrival_rate_per_s == 16.0 and stretch.completion_rate_per_s == 8.0
    assert stretch.growing_windows == 5
    # below halfway (22) first at the end of window 10 (18 in flight at 11 s)
    assert stretch.drain_end_unix_s - T0 == 11.0


def test_a_steady_overload_is_not_a_growth_stretch() -> None:
    # 40 in flight, wobbling by 3 either way; arrivals = completions on average
    levels = [40, 43, 40, 37, 40, 43, 41, 38, 40, 42, 40, 39, 42, 40]
    assert growth_stretches(loads_of(levels)) == []


def test_a_healthy_capture_is_not_a_growth_stretch() -> None:
    levels = [2, 3, 2, 1, 3, 4, 2, 3, 2, 2, 4, 3, 1, 2]
    assert growth_stretches(loads_of(levels)) == []


def test_each_criterion_is_a_boundary() -> None:
    step = [2, 2, 10, 18, 18, 18]  # +16 over windows 1-2 at arrivals 16, completions 8
    arrivals = [10, 16, 16, 10, 10]
    assert len(growth_stretches(loads_of(step, arrivals))) == 1
    assert growth_stretches(loads_of(step, arrivals), GrowthCriteria(min_windows=3)) == []
    assert growth_stretches(loads_of(step, arrivals), GrowthCriteria(min_rise_requests=17)) == []
    assert growth_stretches(loads_of(step, arrivals), GrowthCriteria(min_rise_ratio=9.5)) == []
    assert growth_stretches(loads_of(step, arrivals), GrowthCriteria(min_arrival_over_completion=2.01)) == []
    assert growth_stretches(loads_of(step, arrivals), GrowthCriteria(max_window_share_of_rise=0.49)) == []
    # one window's jump, then flat: not steady growth
    assert growth_stretches(loads_of([2, 2, 30, 30, 30, 30])) == []
    # a slow creep: +5 a window for 10 windows, but 50 arrived for every 45 completed (1.11 < 1.2)
    creep = [2 + 5 * k for k in range(11)]
    assert growth_stretches(loads_of(creep, [50] * 10)) == []
    [found] = growth_stretches(loads_of(creep, [50] * 10), GrowthCriteria(min_arrival_over_completion=1.1))
    assert (found.first, found.last, found.in_flight_peak) == (0, 9, 52)


def test_one_stalled_window_does_not_end_a_stretch_but_two_do() -> None:
    [one] = growth_stretches(loads_of([2, 10, 18, 18, 26, 34, 34, 34]))
    assert (one.first, one.last, one.growing_windows) == (0, 4, 4)

    first, second = growth_stretches(loads_of([2, 10, 18, 18, 18, 26, 34, 50, 50]))
    assert (first.first, first.last) == (0, 1)
    assert (second.first, second.last) == (4, 6)  # 18 -> 50: rise 32, 2.8x


def test_the_capture_filling_up_is_not_growth() -> None:
    # Steady overload from the first request on: 16/s, each waits 2 s in the queue; in flight
    # climbs from 0 over the first 2.25 s only because earlier arrivals are not in the capture.
    requests = []
    for i in range(16 * 30):
        t = i * 62.5
        requests.append(req(t, t + 2250 + i % 7, seg(QUEUE, t, t + 2000), seg(PROVIDER, t + 2000, t + 2250 + i % 7)))
    analysis = analysed(requests)
    loads = window_loads(analysis)
    assert [w.in_flight_end for w in loads[:4]] == [16, 32, 36, 36]
    assert len(growth_stretches(loads)) == 1  # the fill-up, without the guard

    fill = fill_end_unix_s(analysis)
    assert fill is not None and round(fill - T0, 3) == 2.253  # the first arrival + p50
    assert growth_stretches(loads, not_before_unix_s=fill) == []


def test_tail_start_is_the_first_slow_window_or_tail_arrival() -> None:
    # 100 requests 200 ms apart (20 s), 100 ms each; from 12 s on every 4th takes 1 s.
    requests = [req(200 * i, 200 * i + (1000 if i >= 60 and i % 4 == 0 else 100 + i % 5)) for i in range(100)]
    analysis = analysed(requests)

    began = tail_start(analysis)

    assert began.first_slow_window == 12
    assert began.first_tail_arrival_window is not None and began.first_tail_arrival_window >= 12
    assert began.window == 12


def test_a_burst_that_straddles_two_windows_is_not_steady_growth() -> None:
    # 16 requests sent at once just before a window's end: +3, then +12 (80% of the rise in one window)
    burst = [1, 1, 4, 16, 16, 2, 2]
    assert growth_stretches(loads_of(burst)) == []
    [found] = growth_stretches(loads_of(burst), GrowthCriteria(max_window_share_of_rise=0.85))
    assert (found.first, found.last, found.rise, found.largest_window_rise) == (1, 2, 15, 12)


def background(until_ms: float = 20_000) -> list[RequestTimeline]:
    """8 requests a second, 250 ms each (+ up to 6 ms)."""
    return [req(125 * i, 125 * i + 250 + i % 7, seg(PROVIDER, 125 * i, 125 * i + 250 + i % 7)) for i in range(int(until_ms // 125))]


def test_a_burst_cut_in_two_by_a_window_boundary_is_not_steady_growth() -> None:
    # 16 requests sent within 10 ms around 10.0 s, 3 s each: 8 land in window 9, 8 in window 10
    burst = [req(9995 + k * 0.625, 13_000 + k, seg(QUEUE, 9995 + k * 0.625, 12_750), seg(PROVIDER, 12_750, 13_000 + k)) for k in range(16)]
    analysis = analysed(background() + burst)
    loads = window_loads(analysis)
    [cut] = growth_stretches(loads)  # the windows alone cannot tell it from growth
    assert (cut.first, cut.last, cut.largest_window_rise, cut.rise) == (9, 10, 8, 16)

    assert rise_spread(analysis, cut) < 0.01
    assert steady_growth_stretches(analysis) == []


def test_a_step_is_steady_growth_spread_over_its_stretch() -> None:
    # 16/s more than served from 10 s to 14 s: each extra request waits for the end of the capture
    extra = [req(10_000 + 62.5 * k, 25_000, seg(QUEUE, 10_000 + 62.5 * k, 25_000)) for k in range(64)]
    analysis = analysed(background() + extra)

    [stretch] = steady_growth_stretches(analysis)

    assert (stretch.first, stretch.last, stretch.rise) == (10, 13, 64)
    # from 20% (12.8 requests) to 80% (51.2) of the rise: about 39 of the extra requests' 62.5 ms
    # gaps of 4 s (0.61), give or take one as background requests in flight go from 2 to 1 or 3
    assert 38 * 62.5 / 4000 <= rise_spread(analysis, stretch) <= 40 * 62.5 / 4000

