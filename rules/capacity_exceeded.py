"""Rule capacity-exceeded: arrivals outran completions for a stretch of windows, and the tail arrived in it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable

from latprof.analysis.capacity import (
    GrowthCriteria,
    GrowthStretch,
    WindowLoad,
    arrived_between,
    layer_means_ms,
    arrivals_between,
    steady_growth_stretches,
    tail_start,
    window_loads,
)
from latprof.analysis.requests import TAIL_RATIO, Analysis
from latprof.engine import Finding, Rule, fmt_ms
from latprof.layers import QUEUE

#: Where a stretch's requests spent their extra time, in the user's words.
_LAYER_PHRASES = {
    "queue": "waiting for a worker",
    "event_loop": "waiting for the event loop",
    "db.pool": "waiting for a database connection",
    "db.query": "in database statements",
    "http.pool": "waiting for an outbound HTTP connection",
    "provider": "waiting for the provider's first token",
    "model": "generating",
    "tool": "in tool calls",
    "retry": "in retry backoff",
    "lock": "waiting on a lock",
    "app": "in the service's own code",
    "unattributed": "in time no span covers",
}

_FIX = (
    "capacity: scale out before the queue grows (autoscale on in-flight/queue depth, not CPU; warm spare"
    " capacity for cold starts), or shed/limit load at the edge"
)


@dataclass(frozen=True, slots=True)
class Thresholds:
    #: The tail worth explaining: the slowest 1% at least this much slower than the median (and report-v1's 2x p99/p50).
    min_tail_excess_ms: float = 50.0
    #: At least this share of the tail cohort arrived from the stretch's start until its pile drained ...
    min_share_of_tail_in_stretch: float = 0.5
    #: ... and tail requests are at least this many times as frequent among those arrivals as among
    #: the capture's other arrivals (slow requests spread evenly through the capture are not the stretch's).
    min_tail_concentration_ratio: float = 2.0
    #: ... and the part of the tail the stretch explains (`impact_ms`: its layer's tail excess times that
    #: share) is at least this share of the whole tail excess: slow requests that merely also queued in
    #: a short stretch are not the stretch's.
    min_share_of_tail_excess: float = 0.3
    #: Growth stretch (`latprof.analysis.capacity.GrowthCriteria`): in flight rises by at least this many requests ...
    min_in_flight_rise_requests: int = 5
    #: ... to at least this many times its level at the stretch's start ...
    min_in_flight_rise_ratio: float = 2.0
    #: ... arrivals/s at least this many times completions/s across the stretch ...
    min_arrival_over_completion_ratio: float = 1.2
    #: ... over at least this many windows of `p99_over_time` ...
    min_stretch_windows: int = 3
    #: ... in at least this share of which more arrived than completed.
    min_growing_window_share: float = 0.6
    #: ... and no one window of which made more than this share of the rise (a burst is not steady growth).
    max_window_share_of_rise: float = 0.7
    #: ... and in flight took at least this share of the stretch to rise from 20% to 80% of its rise.
    min_rise_spread: float = 0.25

    def criteria(self) -> GrowthCriteria:
        return GrowthCriteria(
            min_rise_requests=self.min_in_flight_rise_requests,
            min_rise_ratio=self.min_in_flight_rise_ratio,
            min_arrival_over_completion=self.min_arrival_over_completion_ratio,
            min_windows=self.min_stretch_windows,
            min_growing_window_share=self.min_growing_window_share,
            max_window_share_of_rise=self.max_window_share_of_rise,
            min_rise_spread=self.min_rise_spread,
        )


@dataclass(frozen=True, slots=True)
class _Judged:
    stretch: GrowthStretch
    tail_in: list[int]
    share: float
    concentration: float


class CapacityExceeded(Rule):
    """Arrivals outran completions for a stretch of time: the queue grew, and the tail arrived in it.

    What it detects:
        A growth stretch: consecutive windows of `p99_over_time` through which requests
        arrived faster than they completed, so the number in flight (arrived, not yet
        answered) grew steadily - by at least `min_in_flight_rise_requests` and to at least
        `min_in_flight_rise_ratio` times its level before, arrivals/s at least
        `min_arrival_over_completion_ratio` times completions/s across it, over at least
        `min_stretch_windows` windows, most of which (`min_growing_window_share`) grew and
        none of which made more than `max_window_share_of_rise` of the rise, in flight
        taking at least `min_rise_spread` of the stretch to climb from 20% to 80% of its
        rise (a burst of requests sent at once is not a queue growing steadily). It is a
        finding when the tail arrived in it: at least `min_share_of_tail_in_stretch` of the
        slowest 1% arrived from the stretch's start until in flight fell back below halfway,
        tail requests are `min_tail_concentration_ratio` times as frequent there as in the
        rest of the capture, and the part of the tail it explains (`impact_ms`) is at least
        `min_share_of_tail_excess` of the tail excess. A steady overload (in flight high but
        flat, arrivals equal to completions) is not a growth stretch, nor is the climb from
        0 while a capture fills up (no stretch starts before the first arrival plus the p50
        latency); slow requests spread evenly through the capture are not explained by one.
        Computed from the requests' arrival and end times alone. The finding's layer is
        where the stretch's requests spent their extra time (the layer whose mean for them
        exceeds the median cohort's the most): `queue` for a service out of workers,
        `provider` for a provider or engine that queues.

    Why it matters for p99:
        When load steps above what the service can serve, every second of it adds to a
        pile that later arrivals wait behind: the wait grows for as long as the step lasts,
        then drains. Averages and CPU hardly move - a worker waiting on an LLM uses none -
        so CPU-based autoscaling reacts late or never, and a cold start (new replicas still
        loading) makes it worse. The tail is then not a slow code path but a moment in time.

    Evidence:
        the stretch's start and end (unix seconds and seconds into the capture), when the
        pile drained, arrivals/s and completions/s in it, in flight at its start and peak,
        each window's arrivals, completions, in flight and p99 (from the window before the
        stretch until it drained), the window size, the first window of the tail (p99 at
        2x the capture's p50, or the first tail arrival) in the capture and the first such
        window around the stretch (`p99_climbed_unix_s`), the share of tail requests that
        arrived in it and their concentration there (null when none arrived elsewhere), the stretch's requests' mean latency
        and their excess in the finding's layer over the median request, example request
        ids; `computed_from` says it is computed from request arrival and end times.
        `impact_ms` is the finding layer's tail excess times the share of the tail that
        arrived in the stretch: the part of the tail, in that layer, the stretch explains.

    How to fix:
        Capacity, not code: scale out before the queue grows - autoscale on requests in
        flight or queue depth rather than CPU, keep warm spare capacity (minimum replicas,
        pre-warmed workers) for cold starts and known peaks - or shed and limit load at the
        edge (rate limits, a 429 before the pile grows). For `provider`, the provider's
        side queues: raise its rate limits or provisioned throughput, or spread load across
        deployments. Optimising the code does not help a pile that grows faster than it drains.

    Example:
        A chat service serves 8 requests/s with 4 workers. At 12:00:05 a campaign sends
        14/s for 15 s; completions stay at 8/s, requests in flight grow from 6 to 96, and
        requests that arrive at the end wait 10 s for a worker. Every one of the slowest 1%
        arrived in those 15 s: p99 is a moment of under-capacity, not a slow endpoint.
    """

    id = "capacity-exceeded"
    layer = QUEUE
    Thresholds = Thresholds

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        if not analysis.has_tail or analysis.tail_excess_ms < t.min_tail_excess_ms:
            return
        loads = window_loads(analysis)
        stretches = steady_growth_stretches(analysis, t.criteria())
        if not stretches:
            return
        judged = [_judge(analysis, s) for s in stretches]
        best = max(judged, key=lambda j: (j.share, -j.stretch.first))
        if best.share < t.min_share_of_tail_in_stretch or best.concentration < t.min_tail_concentration_ratio:
            return
        stretch = best.stretch
        arrived = arrived_between(analysis, range(len(analysis.requests)), stretch.start_unix_s, stretch.end_unix_s)
        means = layer_means_ms(analysis, arrived)
        excess = {layer: mean - analysis.layers[layer].median_mean_ms for layer, mean in means.items()}
        ranked = sorted((item for item in excess.items() if item[1] > 0), key=lambda kv: (-kv[1], kv[0]))
        if not ranked:
            return
        layer, layer_excess = ranked[0]
        if analysis.layers[layer].tail_excess_ms * best.share < t.min_share_of_tail_excess * analysis.tail_excess_ms:
            return
        yield self._finding(analysis, loads, best, arrived, layer, layer_excess, len(stretches))

    def _finding(
        self,
        analysis: Analysis,
        loads: list[WindowLoad],
        judged: _Judged,
        arrived: list[int],
        layer: str,
        layer_excess: float,
        stretch_count: int,
    ) -> Finding:
        s = judged.stretch
        origin_s = (analysis.window_ns or (0, 0))[0] / 1e9
        start_off, end_off = max(0.0, s.start_unix_s - origin_s), max(0.0, s.end_unix_s - origin_s)
        began = tail_start(analysis)
        shown = loads[max(0, s.first - 1) : _window_index(loads, s.drain_end_unix_s) + 1]
        p50 = analysis.latency.p50_ms if analysis.latency else 0.0
        # the first window around the stretch whose p99 reached 2x the capture's p50
        climbed = next((w for w in shown if w.p99_ms is not None and w.p99_ms >= TAIL_RATIO * p50), None)
        examples = sorted(dict.fromkeys(judged.tail_in), key=lambda i: -analysis.latencies_ms[i])[:3]
        impact = analysis.layers[layer].tail_excess_ms * judged.share
        stretch_requests, stretch_mean_ms = arrivals_between(analysis, s.start_unix_s, s.end_unix_s)
        evidence: dict[str, object] = {
            "computed_from": "request arrival and end times",
            "stretch_start_unix_s": s.start_unix_s,
            "stretch_end_unix_s": s.end_unix_s,
            "stretch_start_offset_s": round(start_off, 3),
            "stretch_end_offset_s": round(end_off, 3),
            "drained_by_unix_s": s.drain_end_unix_s,
            "stretch_windows": s.windows,
            "window_s": loads[0].duration_s,
            "arrivals_per_s": round(s.arrival_rate_per_s, 3),
            "completions_per_s": round(s.completion_rate_per_s, 3),
            "in_flight_at_start": s.in_flight_start,
            "in_flight_peak": s.in_flight_peak,
            "windows": [
                {
                    "start_unix_s": w.start_unix_s,
                    "arrivals": w.arrivals,
                    "completions": w.completions,
                    "in_flight": w.in_flight_end,
                    "p99_ms": None if w.p99_ms is None else round(w.p99_ms, 3),
                }
                for w in shown
            ],
            "tail_began_window": began.window,
            "tail_began_unix_s": None if began.window is None else loads[began.window].start_unix_s,
            "p99_climbed_unix_s": None if climbed is None else climbed.start_unix_s,
            "share_of_tail_in_stretch": round(judged.share, 4),
            "tail_concentration_ratio": None if math.isinf(judged.concentration) else round(judged.concentration, 3),
            "stretch_requests": stretch_requests,
            "stretch_mean_latency_ms": round(stretch_mean_ms, 3),
            "median_latency_ms": round(analysis.median_latency_ms, 3),
            "stretch_layer_excess_ms": round(layer_excess, 3),
            "growth_stretches": stretch_count,
            "example_request_ids": [analysis.requests[i].request.request_id for i in examples],
        }
        summary = (
            f"Load outran capacity: from {_clock(s.start_unix_s)} to {_clock(s.end_unix_s)} UTC"
            f" (seconds {start_off:.0f}-{end_off:.0f} of the capture) arrivals ran at {s.arrival_rate_per_s:.3g}/s"
            f" while completions stayed at {s.completion_rate_per_s:.3g}/s; requests in flight grew from"
            f" {s.in_flight_start} to {s.in_flight_peak}"
            + (f" and p99 climbed from the window at {_clock(climbed.start_unix_s)}" if climbed is not None else "")
            + f". {judged.share:.0%} of the slowest 1% arrived in it or right after,"
            f" {_LAYER_PHRASES.get(layer, f'in `{layer}`')}"
            f" ({fmt_ms(layer_excess)} more than the median request, on average)."
        )
        growing = s.growing_windows / s.windows
        return self.finding(
            severity="critical" if judged.share >= 0.75 else "warning",
            confidence=round(judged.share * (0.5 + 0.5 * growing), 4),
            impact_ms=impact,
            summary=summary,
            evidence=evidence,
            fix=_FIX,
            subject=layer,
            layer=layer,
        )


def _judge(analysis: Analysis, stretch: GrowthStretch) -> _Judged:
    """The share of the tail cohort (weighted) that arrived from the stretch's start until it drained,
    and how much more frequent tail requests are there than among the capture's other arrivals."""
    tail = list(analysis.groups.tail)
    tail_in = arrived_between(analysis, tail, stretch.start_unix_s, stretch.drain_end_unix_s)
    share = len(tail_in) / len(tail) if tail else 0.0
    inside, _ = arrivals_between(analysis, stretch.start_unix_s, stretch.drain_end_unix_s)
    outside = analysis.represented - inside
    tail_out = len(tail) - len(tail_in)
    if not inside or not tail_in:
        concentration = 0.0
    elif tail_out == 0 or outside <= 0:
        concentration = math.inf
    else:
        concentration = (len(tail_in) / inside) / (tail_out / outside)
    return _Judged(stretch, tail_in, share, concentration)


def _window_index(loads: list[WindowLoad], end_unix_s: float) -> int:
    """The index of the window that ends at `end_unix_s` (the last window when none does)."""
    return next((w.index for w in loads if w.end_unix_s >= end_unix_s), len(loads) - 1)


def _clock(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, tz=timezone.utc).strftime("%H:%M:%S")
