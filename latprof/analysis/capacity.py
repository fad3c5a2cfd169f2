"""Capacity over time: arrivals vs completions per window, requests in flight, and growth stretches.

A service keeps up while requests complete as fast as they arrive: the number in flight
(arrived and not yet answered) then stays level, high or low. When the arrival rate steps
above what the service can serve (a spike the autoscaler has not caught, a cold start, a
replica lost), the difference piles up: in flight grows window after window, and every
request that arrives meanwhile waits behind the pile. That growth is a *growth stretch*.
A steady overload, where in flight is high but flat (arrivals = completions, a full queue
that neither grows nor drains), is not one.

Everything here is computed from the analysed requests' arrival and end times only (no
segments, no gauges), over the same windows as `Analysis.windows` (report-v1
`p99_over_time`). Requests left out as warm-up are not counted. A sampled request counts
as the requests it stands for (`Analysis.weight`). Pure functions: they read an `Analysis`
and return new values.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

from latprof.analysis.requests import TAIL_RATIO, Analysis, Window


class _Rates:
    """Arrivals and completions per second of a stretch of time (`start_unix_s`..`end_unix_s`)."""

    __slots__ = ()
    start_unix_s: float
    end_unix_s: float
    arrivals: int
    completions: int

    @property
    def duration_s(self) -> float:
        return self.end_unix_s - self.start_unix_s

    @property
    def arrival_rate_per_s(self) -> float:
        return self.arrivals / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def completion_rate_per_s(self) -> float:
        return self.completions / self.duration_s if self.duration_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class WindowLoad(_Rates):
    """One window of `Analysis.windows`: what arrived, what completed, and what was left in flight.

    `arrivals`: analysed requests that arrived in [start, end); `completions`: those that
    ended in [start, end) (whenever they arrived); `in_flight_start`/`in_flight_end`: those
    that had arrived before the window's start / end and not ended before it. Windows are
    half-open, [start, end), as `Analysis.windows` counts arrivals. All weighted, so `in_flight_end -
    in_flight_start == arrivals - completions`. Rates are per second of the window.
    """

    index: int
    start_unix_s: float
    end_unix_s: float
    arrivals: int
    completions: int
    in_flight_start: int
    in_flight_end: int
    p99_ms: float | None


    @property
    def grows(self) -> bool:
        """More arrived than completed: in flight is higher at the end than at the start."""
        return self.in_flight_end > self.in_flight_start


@dataclass(frozen=True, slots=True)
class GrowthCriteria:
    """What makes a run of windows a growth stretch (see `growth_stretches`)."""

    #: In flight must rise by at least this many requests from the stretch's start to its peak ...
    min_rise_requests: int = 5
    #: ... to at least this many times its level at the start (a start level under 1 counts as 1):
    #: a full queue that wobbles by a few requests is not growing.
    min_rise_ratio: float = 2.0
    #: Across the stretch, arrivals per second at least this many times completions per second.
    min_arrival_over_completion: float = 1.2
    #: The stretch lasts at least this many windows (of `Analysis.windows`) ...
    min_windows: int = 2
    #: ... and in at least this share of them more requests arrived than completed ("steadily").
    min_growing_window_share: float = 0.6
    #: No one window makes more than this share of the rise: a burst that lands in one window (or
    #: straddles two) is not a queue growing steadily.
    max_window_share_of_rise: float = 0.7
    #: In flight takes at least this share of the stretch to rise from 20% to 80% of its rise
    #: (`rise_spread`; `steady_growth_stretches` only, which reads the requests themselves).
    min_rise_spread: float = 0.25
    #: Windows in a row that may fail to set a new peak (while not falling back by more than
    #: `max_dip_share` of the rise so far) before the stretch is over.
    max_stalled_windows: int = 1
    max_dip_share: float = 0.1


@dataclass(frozen=True, slots=True)
class GrowthStretch(_Rates):
    """Consecutive windows `first`..`last` (indices into the loads) through which in flight grew.

    The stretch starts at `first`'s start (in flight `in_flight_start`) and ends at `last`'s
    end, where in flight peaked (`in_flight_peak`). `drain_end_unix_s` is when the pile had
    fallen back below halfway between the start level and the peak (at a window's end; at
    least one window after the stretch, or the last window's end): requests arriving until
    then still queued behind it.
    """

    first: int
    last: int
    start_unix_s: float
    end_unix_s: float
    drain_end_unix_s: float
    arrivals: int
    completions: int
    in_flight_start: int
    in_flight_peak: int
    growing_windows: int
    #: The most in flight grew in any one window of the stretch.
    largest_window_rise: int

    @property
    def windows(self) -> int:
        return self.last - self.first + 1


    @property
    def rise(self) -> int:
        return self.in_flight_peak - self.in_flight_start


def _ns(unix_s: float) -> int:
    """Integer ns of a window boundary (to the microsecond: float seconds of today's clock hold no more)."""
    return int(round(unix_s * 1_000_000)) * 1_000


def window_loads(analysis: Analysis, windows: Sequence[Window] | None = None) -> list[WindowLoad]:
    """Arrivals, completions and requests in flight of each window of `analysis.windows` (or `windows`).

    Contract: one `WindowLoad` per window, in order; counts are of the analysed requests
    (`Analysis.arrivals`: all of them, exactly, also in a cohort-first analysis), each as the
    requests its sample weight stands for; a request that ends after the last window's end is in
    flight at its end and completes in no window.
    """
    wins = analysis.windows if windows is None else windows
    if not wins:
        return []
    start_cum: Sequence[int]
    end_cum: Sequence[int]
    times = analysis.arrivals  # every analysed request, also those a cohort-first analysis did not read
    if all(w == 1 for *_, w in times):  # every request counts once: plain sorted times (a million in well under a second)
        start_keys = sorted([t[0] for t in times])
        end_keys = sorted([t[1] for t in times])
        start_cum = end_cum = range(len(start_keys) + 1)
    else:
        starts = sorted((t[0], t[3]) for t in times)
        ends = sorted((t[1], t[3]) for t in times)
        start_keys = [s for s, _ in starts]
        end_keys = [e for e, _ in ends]
        start_cum = _cumulative([w for _, w in starts])
        end_cum = _cumulative([w for _, w in ends])

    def arrived_before(t: int) -> int:
        return start_cum[bisect.bisect_left(start_keys, t)]

    def ended_before(t: int) -> int:
        return end_cum[bisect.bisect_left(end_keys, t)]

    out: list[WindowLoad] = []
    for k, w in enumerate(wins):
        begin, end = _ns(w.start_unix_s), _ns(w.end_unix_s)
        out.append(
            WindowLoad(
                index=k,
                start_unix_s=w.start_unix_s,
                end_unix_s=w.end_unix_s,
                arrivals=arrived_before(end) - arrived_before(begin),
                completions=ended_before(end) - ended_before(begin),
                in_flight_start=arrived_before(begin) - ended_before(begin),
                in_flight_end=arrived_before(end) - ended_before(end),
                p99_ms=w.p99_ms,
            )
        )
    return out


def _cumulative(values: Sequence[int]) -> Sequence[int]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return out


def fill_end_unix_s(analysis: Analysis) -> float | None:
    """When the capture's count of requests in flight can first be believed: the first analysed
    arrival plus the median latency (p50). Requests that arrived before the capture (or were left
    out as warm-up) are not counted, so in flight climbs from 0 at first even when nothing grows:
    a service in steady overload looks like a growing queue for as long as its requests take.
    None without requests."""
    span = analysis.window_ns
    if span is None or analysis.latency is None:
        return None
    return span[0] / 1e9 + analysis.latency.p50_ms / 1000


#: A growth stretch starts at the first window that added at least this share of its rise.
LEAD_SHARE_OF_RISE = 0.1


def growth_stretches(
    loads: Sequence[WindowLoad], criteria: GrowthCriteria = GrowthCriteria(), *, not_before_unix_s: float | None = None
) -> list[GrowthStretch]:
    """The growth stretches of a capture's windows, in time order, not overlapping.

    Contract: no stretch starts in a window that starts before `not_before_unix_s` (pass
    `fill_end_unix_s(analysis)`: the capture filling up is not growth). A scan from each
    window in which in flight grew; the stretch extends while
    each next window sets a new peak of in flight, or stalls (no new peak, without falling
    back by more than `max_dip_share` of the rise so far, at least 1 request) for at most
    `max_stalled_windows` windows in a row; it ends at its peak, the window where in flight
    stopped growing. It is kept when it lasts `min_windows`, in flight rose by
    `min_rise_requests` and to `min_rise_ratio` x its start level, arrivals/s were at least
    `min_arrival_over_completion` x completions/s across it (no completion at all counts as
    above), at least `min_growing_window_share` of its windows grew, and no one window made
    more than `max_window_share_of_rise` of the rise (a burst is not steady growth). Leading windows
    that added less than `LEAD_SHARE_OF_RISE` of the rise (at least 1 request) are not its start.
    The next scan starts after the stretch's peak. A level in flight, however high, never makes one.
    """
    c = criteria
    out: list[GrowthStretch] = []
    n = len(loads)
    k = 0
    while k < n:
        if not loads[k].grows or (not_before_unix_s is not None and loads[k].start_unix_s < not_before_unix_s):
            k += 1
            continue
        first = peak = k
        base = loads[k].in_flight_start
        stalls = 0
        j = k + 1
        while j < n:
            level, top = loads[j].in_flight_end, loads[peak].in_flight_end
            if level > top:
                peak, stalls = j, 0
            elif stalls < c.max_stalled_windows and top - level <= max(1.0, c.max_dip_share * (top - base)):
                stalls += 1
            else:
                break
            j += 1
        # windows that only trickled up before the climb (a request or two more in flight) do not start it
        rise = loads[peak].in_flight_end - base
        while first < peak and loads[first].in_flight_end - loads[first].in_flight_start < max(1.0, LEAD_SHARE_OF_RISE * rise):
            first += 1
        stretch = _stretch(loads, first, peak)
        if _qualifies(stretch, c):
            out.append(stretch)
        k = peak + 1
    return out


def _stretch(loads: Sequence[WindowLoad], first: int, last: int) -> GrowthStretch:
    part = loads[first : last + 1]
    base, peak = loads[first].in_flight_start, loads[last].in_flight_end
    halfway = base + (peak - base) / 2
    drain = last + 1
    while drain < len(loads) - 1 and loads[drain].in_flight_end >= halfway:
        drain += 1
    drain_end = loads[min(drain, len(loads) - 1)].end_unix_s
    return GrowthStretch(
        first=first,
        last=last,
        start_unix_s=loads[first].start_unix_s,
        end_unix_s=loads[last].end_unix_s,
        drain_end_unix_s=drain_end,
        arrivals=sum(w.arrivals for w in part),
        completions=sum(w.completions for w in part),
        in_flight_start=base,
        in_flight_peak=peak,
        growing_windows=sum(1 for w in part if w.grows),
        largest_window_rise=max(w.in_flight_end - w.in_flight_start for w in part),
    )


def _qualifies(s: GrowthStretch, c: GrowthCriteria) -> bool:
    if s.windows < c.min_windows or s.growing_windows < c.min_growing_window_share * s.windows:
        return False
    if s.rise < c.min_rise_requests or s.in_flight_peak < c.min_rise_ratio * max(1, s.in_flight_start):
        return False
    if s.largest_window_rise > c.max_window_share_of_rise * s.rise:
        return False
    return s.completions == 0 or s.arrivals >= c.min_arrival_over_completion * s.completions


def rise_spread(analysis: Analysis, stretch: GrowthStretch) -> float:
    """How spread over the stretch its rise was: the time in flight took from 20% to 80% of the
    rise (first reaching each, from the requests' own arrival and end times, weighted) over the
    stretch's duration. Growth at a steady rate gives about 0.6; a burst of requests sent at
    once, however the windows cut it, about 0. 0 when there was no rise or no duration."""
    if stretch.rise <= 0 or stretch.duration_s <= 0:
        return 0.0
    begin, end = _ns(stretch.start_unix_s), _ns(stretch.end_unix_s)
    events: list[tuple[int, int]] = []
    for start_ns, end_ns, _, w in analysis.arrivals:
        if begin <= start_ns < end:
            events.append((start_ns, w))
        if begin <= end_ns < end:
            events.append((end_ns, -w))
    events.sort()
    low, high = stretch.in_flight_start + 0.2 * stretch.rise, stretch.in_flight_start + 0.8 * stretch.rise
    level = stretch.in_flight_start
    t_low: int | None = None
    for ts, delta in events:
        level += delta
        if t_low is None and level >= low:
            t_low = ts
        if t_low is not None and level >= high:
            return (ts - t_low) / ((end - begin) or 1)
    return 0.0


def steady_growth_stretches(analysis: Analysis, criteria: GrowthCriteria = GrowthCriteria()) -> list[GrowthStretch]:
    """The growth stretches of `analysis` (`window_loads`, `growth_stretches` after the capture
    filled up, `fill_end_unix_s`) whose rise was spread over them (`rise_spread` at least
    `criteria.min_rise_spread`): what a queue growing through the capture looks like."""
    loads = window_loads(analysis)
    found = growth_stretches(loads, criteria, not_before_unix_s=fill_end_unix_s(analysis))
    return [s for s in found if rise_spread(analysis, s) >= criteria.min_rise_spread]


@dataclass(frozen=True, slots=True)
class TailStart:
    """Where the tail began in `p99_over_time`.

    `first_slow_window`: the first window whose p99 is at least `TAIL_RATIO` x the capture's
    p50; `first_tail_arrival_window`: the first window in which a request of the tail cohort
    (the slowest 1%) arrived; `window`: the earlier of the two (None when neither exists).
    """

    window: int | None
    first_slow_window: int | None
    first_tail_arrival_window: int | None


def tail_start(analysis: Analysis, windows: Sequence[Window] | None = None, ratio: float = TAIL_RATIO) -> TailStart:
    """The window where the tail began (see `TailStart`); all None without requests."""
    wins = analysis.windows if windows is None else windows
    lat = analysis.latency
    slow: int | None = None
    if lat is not None:
        slow = next((k for k, w in enumerate(wins) if w.p99_ms is not None and w.p99_ms >= ratio * lat.p50_ms), None)
    arrivals = [analysis.requests[i].request.start_ns for i in analysis.distinct("tail")]
    first_tail = window_of(wins, min(arrivals)) if arrivals else None
    found = [k for k in (slow, first_tail) if k is not None]
    return TailStart(min(found) if found else None, slow, first_tail)


def window_of(windows: Sequence[Window], ts_ns: int) -> int | None:
    """The index of the window holding instant `ts_ns` (None when outside every window)."""
    for k, w in enumerate(windows):
        if _ns(w.start_unix_s) <= ts_ns < _ns(w.end_unix_s):
            return k
    return None


def arrived_between(analysis: Analysis, indices: Sequence[int], start_unix_s: float, end_unix_s: float) -> list[int]:
    """Those of `indices` (into `analysis.requests`, repeats kept) that arrived in [start, end)."""
    begin, end = _ns(start_unix_s), _ns(end_unix_s)
    return [i for i in indices if begin <= analysis.requests[i].request.start_ns < end]


def arrivals_between(analysis: Analysis, start_unix_s: float, end_unix_s: float) -> tuple[int, float]:
    """How many analysed requests (`Analysis.arrivals`: all, each as the requests its sample
    weight stands for) arrived in [start, end), and their mean latency in ms (0 when none)."""
    begin, end = _ns(start_unix_s), _ns(end_unix_s)
    count = 0
    total_ms = 0.0
    for start_ns, end_ns, _, w in analysis.arrivals:
        if begin <= start_ns < end:
            count += w
            total_ms += w * (end_ns - start_ns) / 1e6
    return count, (total_ms / count if count else 0.0)


def mean_latency_ms(analysis: Analysis, indices: Sequence[int]) -> float:
    """The weighted mean latency of requests `indices` (each distinct index once, weighted by `weight`)."""
    distinct = list(dict.fromkeys(indices))
    total = sum(analysis.weight(i) for i in distinct)
    return sum(analysis.latencies_ms[i] * analysis.weight(i) for i in distinct) / total if total else 0.0


def layer_means_ms(analysis: Analysis, indices: Sequence[int]) -> dict[str, float]:
    """Each layer's weighted mean time (ms) over requests `indices` (each distinct index once);
    a layer a request lacks counts as 0 ms."""
    distinct = list(dict.fromkeys(indices))
    total = sum(analysis.weight(i) for i in distinct)
    sums: dict[str, float] = {}
    for i in distinct:
        for layer, value in analysis.breakdowns[i].items():
            sums[layer] = sums.get(layer, 0.0) + value * analysis.weight(i)
    return {layer: value / total for layer, value in sums.items()} if total else {}


__all__ = [
    "GrowthCriteria",
    "GrowthStretch",
    "TailStart",
    "WindowLoad",
    "arrived_between",
    "arrivals_between",
    "fill_end_unix_s",
    "growth_stretches",
    "layer_means_ms",
    "mean_latency_ms",
    "rise_spread",
    "steady_growth_stretches",
    "tail_start",
    "window_loads",
    "window_of",
]
