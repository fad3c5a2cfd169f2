"""Turn a timeline into numbers: critical-path layer times, warm-up, cohorts, tail excess, windows.

Each step is a small pure function with its contract in its docstring; `analyze` composes
them. Times inside a request are integer nanoseconds; everything reported is milliseconds.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import operator
from dataclasses import dataclass, field
from typing import Iterable, Mapping, NamedTuple, Sequence

from latprof.events import Request, Segment
from latprof.analysis.genai import unstreamed_splitter
from latprof.layers import APP, LAYERS, MODEL, PROVIDER, UNATTRIBUTED, effective_layer
from latprof.analysis.retries import classify_sleeps
from latprof.semconv import SAMPLE_WEIGHT, SLEEP_SEGMENT, TTFT_KNOWN
from latprof.analysis.timeline import RequestTimeline, Timeline, gauge_instances, time_weighted_mean

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000

#: Fewer requests than this (after warm-up) give no verdict (report-v1).
MIN_REQUESTS_FOR_VERDICT = 50
#: A tail is worth explaining when p99 is at least this many times p50 (report-v1).
TAIL_RATIO = 2.0
#: ... and when the slowest 1% take at least this much longer than the median request, on
#: average (`[tool.latprof] min_tail_excess_ms`): below it, a fast healthy service's verdict
#: would flip between runs on noise. The smallest excess a built-in rule acts on (lock-contention).
DEFAULT_MIN_TAIL_EXCESS_MS = 20.0
DEFAULT_WARMUP_S = 2.0
#: A sample weight above this is not believed (the request counts once).
MAX_SAMPLE_WEIGHT = 1_000_000

_ROOT = object()  # key of the request root among segment parents


# --- per request ------------------------------------------------------------------------------


#: A stretch of a critical path: (start_ns, end_ns, layer or None when uncovered, id of the owning segment or None).
Piece = tuple[int, int, str | None, str | None]


def critical_path(rt: RequestTimeline, pieces: list[Piece] | None = None) -> dict[str | None, int]:
    """Return nanoseconds per layer along the request's critical path; key None is uncovered time.

    With `pieces`, also append each stretch of the path to it, latest first (for pictures).

    The values sum to the request's latency. Contract (report-v1 "Layers"):
    - each instant belongs to one segment: where siblings overlap, the one that ends last;
      inside it, its own children in the same way (the innermost segment owns the time);
    - a generic wait nested in a more specific layer is absorbed by it (`layers.effective_layer`);
    - a segment with no layer owns nothing: its children count as its parent's;
    - children are clipped to their parent's interval; a segment with a missing parent hangs
      off the root; segments that end before they start are ignored.
    """
    request = rt.request
    start, end = request.start_ns, request.end_ns
    segments = rt.segments
    if not segments:
        if pieces is not None:
            pieces.append((start, end, None, None))
        return {None: end - start}
    for segment in segments:
        if segment[2] is not None:  # parent_id (by index: every segment)
            break
    else:
        return _walk_flat(start, end, segments, pieces)
    out: dict[str | None, int] = {None: 0}
    by_id: dict[str, Segment] = {s.segment_id: s for s in segments}
    kids: dict[object, list[Segment]] = {}
    for segment in segments:
        if segment.layer is None or segment.end_ns <= segment.start_ns:
            continue
        kids.setdefault(_owner_key(segment, by_id), []).append(segment)
    for siblings in kids.values():
        if len(siblings) > 1:
            siblings.sort(key=_LATEST_END_FIRST, reverse=True)
    _walk(_ROOT, start, end, None, kids, out, pieces)
    return out


def _walk_flat(start: int, end: int, segments: Sequence[Segment], pieces: list[Piece] | None = None) -> dict[str | None, int]:
    """`_walk` for the common case of segments that all hang off the root (no nesting)."""
    out: dict[str | None, int] = {}
    uncovered = 0
    cursor = end
    for child in sorted(segments, key=_LATEST_END_FIRST, reverse=True):
        if cursor <= start:
            break
        child_start = child[5]  # fields by index (start_ns, end_ns, layer): every segment of most requests
        child_end = child[6]
        layer = child[4]
        if child_start >= cursor or child_end <= child_start or layer is None:
            continue
        if child_end < cursor:
            gap_start = child_end if child_end > start else start
            uncovered += cursor - gap_start
            if pieces is not None:
                pieces.append((gap_start, cursor, None, None))
            cursor = gap_start
            if cursor <= start:
                break
        owned_from = child_start if child_start > start else start
        out[layer] = out.get(layer, 0) + (cursor - owned_from)
        if pieces is not None:
            pieces.append((owned_from, cursor, layer, child.segment_id))
        cursor = owned_from
    if cursor > start:
        uncovered += cursor - start
        if pieces is not None:
            pieces.append((start, cursor, None, None))
    out[None] = uncovered
    return out


# Sort key (with reverse=True): latest end first; of two that end together, the later start
# (the more specific one) first. Segment is a named tuple: 6 = end_ns, 5 = start_ns.
_LATEST_END_FIRST = operator.itemgetter(6, 5)


def _owner_key(segment: Segment, by_id: Mapping[str, Segment]) -> object:
    """The id of the nearest ancestor that has a layer, or the root."""
    parent_id = segment.parent_id
    hops = 0
    while parent_id is not None and hops < 64:
        parent = by_id.get(parent_id)
        if parent is None or parent is segment:
            return _ROOT
        if parent.layer is not None:
            return parent_id
        parent_id = parent.parent_id
        hops += 1
    return _ROOT


def _walk(
    node: object,
    start: int,
    end: int,
    layer: str | None,
    kids: Mapping[object, list[Segment]],
    out: dict[str | None, int],
    pieces: list[Piece] | None = None,
) -> None:
    """Attribute [start, end) of `node` (whose time is `layer`'s) to its children, latest end first.

    Walking back from `end`, the child that ends last among those that started before the
    cursor owns the time from its start to the cursor; time no child covers is the node's own.
    """
    cursor = end
    for child in kids.get(node, ()):
        if cursor <= start:
            break
        child_start = child.start_ns
        if child_start >= cursor:
            continue  # entirely after the cursor: a sibling that ended later owns that time
        child_end = child.end_ns
        if child_end < cursor:
            gap_start = child_end if child_end > start else start
            out[layer] = out.get(layer, 0) + (cursor - gap_start)
            if pieces is not None:
                pieces.append((gap_start, cursor, layer, None if node is _ROOT else str(node)))
            cursor = gap_start
            if cursor <= start:
                break
        owned_from = child_start if child_start > start else start
        inner = child.layer if layer is None else effective_layer(child.layer, layer)  # type: ignore[arg-type]
        if child.segment_id in kids:
            _walk(child.segment_id, owned_from, cursor, inner, kids, out, pieces)
        else:
            out[inner] = out.get(inner, 0) + (cursor - owned_from)
            if pieces is not None:
                pieces.append((owned_from, cursor, inner, child.segment_id))
        cursor = owned_from
    if cursor > start:
        out[layer] = out.get(layer, 0) + (cursor - start)
        if pieces is not None:
            pieces.append((start, cursor, layer, None if node is _ROOT else str(node)))


def split_uncovered(uncovered_ns: int, cpu_ns: int | None) -> tuple[int, int]:
    """Split time no segment covers into (`app`, `unattributed`) nanoseconds.

    It is `app` only as far as the CPU time measured for the request's thread backs it; with
    no CPU measurement all of it is `unattributed`.
    """
    if uncovered_ns <= 0:
        return 0, 0
    if cpu_ns is None or cpu_ns <= 0:
        return 0, uncovered_ns
    app = cpu_ns if cpu_ns < uncovered_ns else uncovered_ns
    return app, uncovered_ns - app


def layer_times_ms(rt: RequestTimeline) -> dict[str, float]:
    """Return milliseconds per layer (only layers with time) for one request; sums to latency."""
    path = critical_path(rt)
    uncovered = path.pop(None, 0)
    app, unattributed = split_uncovered(uncovered, rt.request.cpu_ns)
    if app:
        path[APP] = path.get(APP, 0) + app
    if unattributed:
        path[UNATTRIBUTED] = path.get(UNATTRIBUTED, 0) + unattributed
    return {layer: ns / NS_PER_MS for layer, ns in path.items() if ns}  # type: ignore[misc]


# --- across requests --------------------------------------------------------------------------


def skip_warmup(requests: Sequence[RequestTimeline], warmup_s: float) -> tuple[list[RequestTimeline], int]:
    """Leave out requests that arrived in the first `warmup_s` seconds of each process's traffic.

    A process's traffic starts with its first request's arrival. Returns (kept, skipped count).
    """
    if warmup_s <= 0:
        return list(requests), 0
    kept = [requests[i] for i in kept_indices(requests, warmup_s)]
    return kept, len(requests) - len(kept)


def kept_indices(requests: Sequence[RequestTimeline], warmup_s: float) -> list[int]:
    """The indices of the requests `skip_warmup` keeps (those at least `warmup_s` after their process's first
    arrival), in order: the inferences judge the kept requests but change the timeline's."""
    if warmup_s <= 0:
        return list(range(len(requests)))
    first: dict[int, int] = {}
    for rt in requests:
        request = rt.request  # fields by index (start 2, pid 4): this runs over every request
        known = first.get(request[4])
        if known is None or request[2] < known:
            first[request[4]] = request[2]
    cutoff_ns = int(warmup_s * NS_PER_S)
    kept_from = {pid: start + cutoff_ns for pid, start in first.items()}
    return [i for i, rt in enumerate(requests) if rt.request[2] >= kept_from[rt.request[4]]]


def sample_weight(rt: RequestTimeline) -> int:
    """The requests `rt` stands for: its root's `latprof.sample_weight` (recorded as a 1-in-k
    random sample), 1 when absent or not a believable whole number."""
    value = rt.request.attrs.get(SAMPLE_WEIGHT) if rt.request.attrs else None
    if value is None or isinstance(value, bool):
        return 1
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and 1 <= value <= MAX_SAMPLE_WEIGHT else 1


def weights_of(requests: Sequence[RequestTimeline]) -> list[int] | None:
    """Each request's sample weight, or None when every request counts once (nothing was sampled)."""
    if not any_sampled(requests):
        return None
    weights = [sample_weight(rt) for rt in requests]
    return weights if any(w != 1 for w in weights) else None


def any_sampled(requests: Sequence[RequestTimeline]) -> bool:
    """Whether any request's root says it stands for others (`SAMPLE_WEIGHT`): when none does, each weighs 1."""
    key = SAMPLE_WEIGHT
    return any(key in (rt.request[7] or ()) for rt in requests)  # (attrs by index: every request)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Return the q-th percentile (0-100) of ascending values, linearly interpolated (numpy's default)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def _percentile_with_zeros(sorted_nonzero: Sequence[float], zeros: int, q: float) -> float:
    """`percentile` of `zeros` zeros followed by `sorted_nonzero`, without building that list."""
    n = zeros + len(sorted_nonzero)
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)

    def at(i: int) -> float:
        return 0.0 if i < zeros else sorted_nonzero[i - zeros]

    return at(lo) + (at(hi) - at(lo)) * (pos - lo)


def weighted_percentile(sorted_values: Sequence[float], cumulative: Sequence[int], q: float, zeros: int = 0) -> float:
    """`percentile` of the list in which each of `sorted_values` appears as often as its weight,
    after `zeros` zeros, without building that list. `cumulative[i]` is the sum of the weights
    of `sorted_values[: i + 1]`. Integer weights k give exactly what k copies would."""
    n = zeros + (cumulative[-1] if cumulative else 0)
    if n <= 0:
        raise ValueError("percentile of no values")
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)

    def at(i: int) -> float:
        return 0.0 if i < zeros else sorted_values[bisect.bisect_right(cumulative, i - zeros)]

    return at(lo) + (at(hi) - at(lo)) * (pos - lo)


def _sorted_with_cumulative(values: Sequence[float], weights: Sequence[int]) -> tuple[list[float], list[int]]:
    """`values` ascending, and the running sum of their weights in that order (of equal values, the
    weights' order does not change a percentile)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    return [values[i] for i in order], list(itertools.accumulate([weights[i] for i in order]))


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """End-to-end latency of the requests analysed, measured from arrival at the socket."""

    count: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float

    def to_dict(self) -> dict[str, float]:
        """report-v1's `latency_ms`: p50, p90, p99 and max, to the microsecond."""
        return {"p50": round(self.p50_ms, 3), "p90": round(self.p90_ms, 3), "p99": round(self.p99_ms, 3),
                "max": round(self.max_ms, 3)}  # fmt: skip


def summarize_latency(latencies_ms: Sequence[float], weights: Sequence[int] | None = None) -> LatencySummary | None:
    """Return p50/p90/p99/max/mean of the latencies, or None when there are none.

    With `weights`, each latency counts as many times as its weight (`count` is their sum).
    """
    if not latencies_ms:
        return None
    if weights is not None:
        ordered, cumulative = _sorted_with_cumulative(latencies_ms, weights)
        total = cumulative[-1]
        return LatencySummary(
            count=total,
            p50_ms=weighted_percentile(ordered, cumulative, 50),
            p90_ms=weighted_percentile(ordered, cumulative, 90),
            p99_ms=weighted_percentile(ordered, cumulative, 99),
            max_ms=ordered[-1],
            mean_ms=sum(v * w for v, w in zip(latencies_ms, weights)) / total,
        )
    ordered = sorted(latencies_ms)
    return LatencySummary(
        count=len(ordered),
        p50_ms=percentile(ordered, 50),
        p90_ms=percentile(ordered, 90),
        p99_ms=percentile(ordered, 99),
        max_ms=ordered[-1],
        mean_ms=sum(ordered) / len(ordered),
    )


@dataclass(frozen=True, slots=True)
class Cohorts:
    """Indices of requests (into the analysed list) in the median and tail cohorts.

    `median`: requests ranked between p40 and p60; `tail`: the slowest 1% (at least 3);
    `tail5`: the slowest 5% (at least 3). Each is ordered slowest first where it is a tail.
    A sampled request (weight k) stands for k requests of equal latency: its index appears
    once for each of them inside the cohort, so a mean over a cohort is a weighted mean.
    """

    median: tuple[int, ...]
    tail: tuple[int, ...]
    tail5: tuple[int, ...]


def cohorts(latencies_ms: Sequence[float], weights: Sequence[int] | None = None) -> Cohorts:
    """Rank requests by latency and pick the median, 1% and 5% cohorts (report-v1)."""
    n = len(latencies_ms)
    if n == 0:
        return Cohorts((), (), ())
    order = sorted(range(n), key=latencies_ms.__getitem__)
    if weights is not None:
        return _weighted_cohorts(order, weights)
    lo = math.floor(0.4 * (n - 1))
    hi = math.ceil(0.6 * (n - 1))
    tail_n = min(n, max(3, math.ceil(0.01 * n)))
    tail5_n = min(n, max(3, math.ceil(0.05 * n)))
    slowest_first = order[::-1]
    return Cohorts(
        median=tuple(order[lo : hi + 1]),
        tail=tuple(slowest_first[:tail_n]),
        tail5=tuple(slowest_first[:tail5_n]),
    )


def _weighted_cohorts(order: Sequence[int], weights: Sequence[int]) -> Cohorts:
    """`cohorts` over the list in which request i appears weights[i] times (`order`: fastest first)."""
    total = sum(weights)
    lo = math.floor(0.4 * (total - 1))
    hi = math.ceil(0.6 * (total - 1))
    median: list[int] = []
    position = 0  # expanded rank of the request's first copy
    for i in order:
        w = weights[i]
        first, last = max(position, lo), min(position + w - 1, hi)
        if last >= first:
            median.extend([i] * (last - first + 1))
        position += w
        if position > hi:
            break

    def slowest(count: int) -> tuple[int, ...]:
        out: list[int] = []
        for i in reversed(order):
            take = min(weights[i], count - len(out))
            out.extend([i] * take)
            if len(out) >= count:
                break
        return tuple(out)

    return Cohorts(
        median=tuple(median),
        tail=slowest(min(total, max(3, math.ceil(0.01 * total)))),
        tail5=slowest(min(total, max(3, math.ceil(0.05 * total)))),
    )


@dataclass(frozen=True, slots=True)
class LayerStats:
    """One layer's time per request across the analysed requests, and its part in the tail."""

    layer: str
    p50_ms: float
    p99_ms: float
    mean_ms: float
    median_mean_ms: float  # mean over the median cohort
    tail_mean_ms: float  # mean over the slowest 1%
    tail_excess_ms: float  # tail_mean_ms - median_mean_ms
    tail5_excess_ms: float  # the same over the slowest 5%
    share_of_tail_excess: float  # of the positive excesses; 0 when not positive

    @property
    def seen(self) -> bool:
        return self.mean_ms > 0


def layer_stats(
    breakdowns: Sequence[Mapping[str, float]], groups: Cohorts, weights: Sequence[int] | None = None
) -> dict[str, LayerStats]:
    """Return every layer's stats, in vocabulary order; layers a request lacks count as 0 ms.

    `tail_excess_ms` is the layer's mean in the tail cohort minus its mean in the median
    cohort; shares sum to 1 over the layers with positive excess (report-v1). With
    `weights`, each request counts as many times as its weight.
    """
    if weights is not None:
        return _weighted_layer_stats(breakdowns, groups, weights)
    n = len(breakdowns)
    # Percentiles need every request's value, but most requests have no time in most layers:
    # sort only the non-zero values and account for the zeros by position.
    nonzero: dict[str, list[float]] = {layer: [] for layer in LAYERS}
    for breakdown in breakdowns:
        for layer, value in breakdown.items():
            nonzero[layer].append(value)

    median_means, tail_means, tail5_means = (_cohort_means(breakdowns, idx) for idx in (groups.median, groups.tail, groups.tail5))

    raw: dict[str, tuple[float, float, float, float, float, float, float]] = {}
    for layer, seen in nonzero.items():
        if not seen:
            raw[layer] = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
            continue
        seen.sort()
        median_mean = median_means.get(layer, 0.0)
        tail_mean = tail_means.get(layer, 0.0)
        raw[layer] = (
            _percentile_with_zeros(seen, n - len(seen), 50),
            _percentile_with_zeros(seen, n - len(seen), 99),
            sum(seen) / n,
            median_mean,
            tail_mean,
            tail_mean - median_mean,
            tail5_means.get(layer, 0.0) - median_mean,
        )
    positive = sum(r[5] for r in raw.values() if r[5] > 0)
    return {
        layer: LayerStats(layer, *r, share_of_tail_excess=(r[5] / positive if r[5] > 0 and positive else 0.0))
        for layer, r in raw.items()
    }


def _cohort_means(breakdowns: Sequence[Mapping[str, float]], idx: tuple[int, ...]) -> dict[str, float]:
    """Each layer's mean over the requests `idx` of `breakdowns` (a layer a request lacks counts as 0 ms), in one
    pass over the cohort: each layer's values added in the cohort's order, as a sum per layer would add them."""
    sums: dict[str, float] = {}
    for i in idx:
        for layer, value in breakdowns[i].items():
            sums[layer] = sums.get(layer, 0) + value
    return {layer: total / len(idx) for layer, total in sums.items()}


def _weighted_layer_stats(
    breakdowns: Sequence[Mapping[str, float]], groups: Cohorts, weights: Sequence[int]
) -> dict[str, LayerStats]:
    n = sum(weights)
    nonzero: dict[str, list[tuple[float, int]]] = {layer: [] for layer in LAYERS}
    for breakdown, w in zip(breakdowns, weights):
        for layer, value in breakdown.items():
            nonzero[layer].append((value, w))

    median_means, tail_means, tail5_means = (_cohort_means(breakdowns, idx) for idx in (groups.median, groups.tail, groups.tail5))

    raw: dict[str, tuple[float, float, float, float, float, float, float]] = {}
    for layer, seen in nonzero.items():
        if not seen:
            raw[layer] = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
            continue
        ordered, cumulative = _sorted_with_cumulative([v for v, _ in seen], [w for _, w in seen])
        zeros = n - cumulative[-1]
        median_mean = median_means.get(layer, 0.0)
        tail_mean = tail_means.get(layer, 0.0)
        raw[layer] = (
            weighted_percentile(ordered, cumulative, 50, zeros),
            weighted_percentile(ordered, cumulative, 99, zeros),
            sum(v * w for v, w in seen) / n,
            median_mean,
            tail_mean,
            tail_mean - median_mean,
            tail5_means.get(layer, 0.0) - median_mean,
        )
    positive = sum(r[5] for r in raw.values() if r[5] > 0)
    return {
        layer: LayerStats(layer, *r, share_of_tail_excess=(r[5] / positive if r[5] > 0 and positive else 0.0))
        for layer, r in raw.items()
    }


def coverage(breakdowns: Iterable[Mapping[str, float]], weights: Sequence[int] | None = None) -> float | None:
    """Share of all request time that landed in a layer other than `unattributed`."""
    total = unattributed = 0.0
    for i, b in enumerate(breakdowns):
        w = 1 if weights is None else weights[i]
        total += w * sum(b.values())
        unattributed += w * b.get(UNATTRIBUTED, 0.0)
    return None if total <= 0 else (total - unattributed) / total


@dataclass(frozen=True, slots=True)
class Window:
    """Requests that arrived in one time window and their p99 (None when there were none)."""

    start_unix_s: float
    end_unix_s: float
    requests: int
    p99_ms: float | None


_WINDOW_SIZES_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)


def windows(
    requests: Sequence[RequestTimeline],
    latencies_ms: Sequence[float],
    max_windows: int = 60,
    weights: Sequence[int] | None = None,
) -> list[Window]:
    """Split the requests by arrival into at most `max_windows` equal windows of a round size.

    With `weights`, a window's request count and p99 count each request as often as its weight.
    """
    if not requests:
        return []
    starts = [rt.request.start_ns for rt in requests]
    first, last = min(starts), max(starts)
    span_s = (last - first) / NS_PER_S
    size_s = next((w for w in _WINDOW_SIZES_S if span_s / w < max_windows), _WINDOW_SIZES_S[-1])
    origin = first - first % (size_s * NS_PER_S)
    count = int((last - origin) // (size_s * NS_PER_S)) + 1
    buckets: list[list[int]] = [[] for _ in range(count)]
    for i, start in enumerate(starts):
        buckets[int((start - origin) // (size_s * NS_PER_S))].append(i)
    out = []
    for k, bucket in enumerate(buckets):
        begin = (origin + k * size_s * NS_PER_S) / NS_PER_S
        if not bucket:
            out.append(Window(begin, begin + size_s, 0, None))
        elif weights is None:
            values = sorted(latencies_ms[i] for i in bucket)
            out.append(Window(begin, begin + size_s, len(values), percentile(values, 99)))
        else:
            ordered, cumulative = _sorted_with_cumulative([latencies_ms[i] for i in bucket], [weights[i] for i in bucket])
            out.append(Window(begin, begin + size_s, cumulative[-1], weighted_percentile(ordered, cumulative, 99)))
    return out


# --- the whole analysis -----------------------------------------------------------------------


@dataclass(frozen=True)
class Population:
    """Every analysed request's root, when the analysis holds the segments of only some of them
    (a cohort-first analysis, `latprof.analysis.cohort_first`), and how those were picked.

    Request-level numbers (latency percentiles, windows, counts, arrivals and requests in
    flight) are computed from these, exactly; layer times come from the materialised requests:
    exactly for the cohorts (tail, 5% tail, median) and each window's tail, and estimated for
    the whole distribution from a deterministic sample of the others, `Analysis.weights`
    weighing each sampled request by the requests it stands for.
    """

    #: The requests kept after warm-up, by arrival.
    requests: list[Request]
    #: Each one's sample weight (`sample_weight`), None when every request counts once.
    weights: list[int] | None
    #: Requests whose segments were read: the cohorts, the windows' tails and the sample.
    materialised: int
    #: Of the other requests, those in the sample (one in `one_in`, by a hash of the request id).
    sampled: int
    one_in: int
    #: The cohorts too large to read whole, read as a sample (`cohort_first.DEFAULT_COHORT_CAP`):
    #: name ("tail", "tail5", "median", "window_tails") -> (requests in it, one in k read).
    capped: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def represented(self) -> int:
        return len(self.requests) if self.weights is None else sum(self.weights)


class LayerIndex(NamedTuple):
    """The segments of one layer, and beside each the index of its request in `Analysis.requests`."""

    requests: list[int]
    segments: list[Segment]


@dataclass
class Analysis:
    """Everything rules and the report read. Requests are those kept after warm-up."""

    timeline: Timeline
    requests: list[RequestTimeline]
    breakdowns: list[dict[str, float]]
    latencies_ms: list[float]
    latency: LatencySummary | None
    groups: Cohorts
    layers: dict[str, LayerStats]
    windows: list[Window]
    warmup_skipped: int
    coverage: float | None
    warnings: list[str] = field(default_factory=list)
    #: Segments by layer (None for layer-less markers), with the index of their request.
    by_layer: dict[str | None, LayerIndex] = field(default_factory=dict, repr=False)
    #: How many requests each analysed request stands for (a random sample recorded 1 in k
    #: of them with weight k); None when every request was recorded. Counts, percentiles,
    #: cohorts and layer statistics above are weighted already; a rule that counts requests
    #: itself weighs them with `weight(i)`.
    weights: list[int] | None = None
    #: The tail excess (`tail_excess_ms`) below which there is no tail worth explaining.
    min_tail_excess_ms: float = DEFAULT_MIN_TAIL_EXCESS_MS
    #: Every analysed request's root when `requests` are only some of them (cohort-first); None
    #: when every analysed request is materialised. Read through `arrivals`, `represented`, `recorded`.
    population: Population | None = field(default=None, repr=False)

    def layer(self, name: str) -> LayerStats:
        return self.layers[name]

    def _cohort_mean_ms(self, which: str) -> float:
        idx = getattr(self.groups, which)
        return sum(self.latencies_ms[i] for i in idx) / len(idx) if idx else 0.0

    @property
    def tail_excess_ms(self) -> float:
        """How much longer the slowest 1% took than the median cohort, on average (the sum of
        every layer's `tail_excess_ms`)."""
        return self._cohort_mean_ms("tail") - self._cohort_mean_ms("median")

    @property
    def median_latency_ms(self) -> float:
        """The mean latency of the median cohort (p40-p60): the typical request, which every
        layer's `median_mean_ms` adds up to."""
        return self._cohort_mean_ms("median")

    def share_of_median(self, layer: str) -> float:
        """The share of the typical request's latency spent in `layer` (0 without requests)."""
        total = self.median_latency_ms
        return self.layers[layer].median_mean_ms / total if total > 0 else 0.0

    @property
    def window_ns(self) -> tuple[int, int] | None:
        """From the first analysed request's arrival to the last one's response; None without requests."""
        if self.population is not None:
            roots = self.population.requests
            return (min(r.start_ns for r in roots), max(r.end_ns for r in roots)) if roots else None
        if not self.requests:
            return None
        return min(rt.request.start_ns for rt in self.requests), max(rt.request.end_ns for rt in self.requests)

    @functools.cached_property
    def arrivals(self) -> list[tuple[int, int, int, int]]:
        """(start_ns, end_ns, pid, weight) of every analysed request, by arrival - also of those whose
        segments a cohort-first analysis did not read: counts of arrivals and of requests in flight
        are exact either way. Built once per analysis (rules and the report read it several times);
        read it, do not change it."""
        if self.population is not None:
            roots, weights = self.population.requests, self.population.weights
            if weights is None:
                return [(r.start_ns, r.end_ns, r.pid, 1) for r in roots]
            return [(r.start_ns, r.end_ns, r.pid, w) for r, w in zip(roots, weights)]
        return [(rt.request.start_ns, rt.request.end_ns, rt.request.pid, self.weight(i)) for i, rt in enumerate(self.requests)]

    @property
    def recorded(self) -> int:
        """How many analysed requests were recorded (materialised or not; sampled ones once each)."""
        return len(self.population.requests) if self.population is not None else len(self.requests)

    def gauge_means(self, name: str) -> dict[tuple[int, str], float]:
        """The time-weighted mean of each instance (process and attributes, `timeline.gauge_instances`)
        of gauge `name` over the analysed window (`timeline.time_weighted_mean`): a reading counts
        for as long as it held, not once per reading, since collectors read a busy pool far more
        often than an idle one. Without requests, over the readings' own span."""
        readings = self.timeline.gauges.get(name, ())
        if not readings:
            return {}
        window = self.window_ns or (min(g.ts_ns for g in readings), max(g.ts_ns for g in readings))
        out: dict[tuple[int, str], float] = {}
        for key, series in gauge_instances(readings).items():
            mean = time_weighted_mean(series, *window)
            if mean is not None:
                out[key] = mean
        return out

    def gauge_utilisation(self, in_use: str, limit: str) -> float:
        """Time-weighted use of a pool: the mean of gauge `in_use` of each instance (`gauge_means`),
        summed, over the most of gauge `limit` each allowed, summed (an instance without a
        `limit` reading counts with the largest one seen); 0 without limits."""
        means = self.gauge_means(in_use)
        instances = gauge_instances(self.timeline.gauges.get(limit, ()))
        limits = {key: max(g.value for g in series) for key, series in instances.items()}
        largest = max(limits.values(), default=0.0)
        capacity = sum(limits.get(key, largest) for key in means)
        return sum(means.values()) / capacity if capacity > 0 else 0.0

    def weight(self, i: int) -> int:
        """How many requests the analysed request `i` stands for (1 unless it was sampled)."""
        return 1 if self.weights is None else self.weights[i]

    @property
    def represented(self) -> int:
        """How many requests the analysed ones stand for: their count, or the sum of their weights."""
        if self.population is not None:
            return self.population.represented
        return len(self.requests) if self.weights is None else sum(self.weights)

    def distinct(self, which: str) -> list[int]:
        """The indices of cohort `which` once each, in cohort order (a sampled request's index repeats)."""
        return list(dict.fromkeys(getattr(self.groups, which)))

    def example_request_ids(self, layer: str, n: int = 3, *, with_time_only: bool = False) -> list[str]:
        """Ids of the `n` tail-cohort requests with the most time in `layer` (slowest first on ties)."""
        tail = self.distinct("tail")
        if with_time_only:
            tail = [i for i in tail if self.breakdowns[i].get(layer)]
        ranked = sorted(tail, key=lambda i: -self.breakdowns[i].get(layer, 0.0))[:n]
        return [self.requests[i].request.request_id for i in ranked]

    @property
    def enough_for_verdict(self) -> bool:
        """At least `MIN_REQUESTS_FOR_VERDICT` requests (counting what sampled ones stand for) were analysed."""
        return self.latency is not None and self.latency.count >= MIN_REQUESTS_FOR_VERDICT

    @property
    def has_tail(self) -> bool:
        """True when there is a tail worth explaining (report-v1 verdict rules): enough requests,
        p99 at least `TAIL_RATIO` x p50, and a tail excess of at least `min_tail_excess_ms`."""
        lat = self.latency
        return bool(
            lat
            and self.enough_for_verdict
            and lat.p99_ms >= TAIL_RATIO * lat.p50_ms
            and self.tail_excess_ms >= self.min_tail_excess_ms
        )

    def cohort(self, which: str) -> list[RequestTimeline]:
        """The requests of cohort `median`, `tail` or `tail5`."""
        return [self.requests[i] for i in getattr(self.groups, which)]

    def segments(self, layer: str | None = None, *, name: str | None = None) -> list[tuple[int, Segment]]:
        """(request index, segment) for the analysed requests' segments of `layer` (any when None),
        optionally only those called `name`. Served from `by_layer`, so each rule pays for the
        segments of its own layer, not for every segment."""
        if layer is None:
            found = [pair for entry in self.by_layer.values() for pair in zip(entry.requests, entry.segments)]
            found.sort(key=lambda pair: pair[0])
        else:
            entry = self.by_layer.get(layer)
            found = list(zip(entry.requests, entry.segments)) if entry else []
        if name is not None:
            found = [pair for pair in found if pair[1].name == name]
        return found


def analyze(
    timeline: Timeline, *, warmup_s: float = DEFAULT_WARMUP_S, min_tail_excess_ms: float = DEFAULT_MIN_TAIL_EXCESS_MS
) -> Analysis:
    """Run every analysis step over a timeline; `min_tail_excess_ms` is the smallest tail worth explaining."""
    kept, skipped = skip_warmup(timeline.requests, warmup_s)
    breakdowns, by_layer, split_warnings = materialise(kept)
    latencies = [(rt.request.end_ns - rt.request.start_ns) / NS_PER_MS for rt in kept]
    weights = weights_of(timeline.requests)
    if weights is not None:
        skipped = sum(map(sample_weight, timeline.requests)) - sum(map(sample_weight, kept))
        weights = [sample_weight(rt) for rt in kept]
        sampled = [sampling_warning(len(kept), sum(weights))]
    else:
        sampled = []
    groups = cohorts(latencies, weights)
    return Analysis(
        timeline=timeline,
        requests=kept,
        breakdowns=breakdowns,
        latencies_ms=latencies,
        latency=summarize_latency(latencies, weights),
        groups=groups,
        layers=layer_stats(breakdowns, groups, weights),
        windows=windows(kept, latencies, weights=weights),
        warmup_skipped=skipped,
        coverage=coverage(breakdowns, weights),
        warnings=list(timeline.warnings) + sampled + split_warnings,
        by_layer=by_layer,
        weights=weights,
        min_tail_excess_ms=min_tail_excess_ms,
    )


def materialise(kept: list[RequestTimeline]) -> tuple[list[dict[str, float]], dict[str | None, LayerIndex], list[str]]:
    """Each request's layer times on its critical path, and the index of segments by layer that
    rules read: (breakdowns, by_layer, warnings). Replaces a request of `kept` whose sleeps were
    classified (`retries.classify_sleeps`) or whose non-streamed LLM call was split
    (`genai.unstreamed_splitter`) by the request as analysed.

    One pass over every segment, while each request's segments are in cache. Requests with a
    non-streamed LLM call wait until the streamed calls have given each model's decode rate.
    """
    breakdowns: list[dict[str, float]] = []
    by_layer: dict[str | None, LayerIndex] = {}

    def index(i: int, segments: Sequence[Segment]) -> None:
        for segment in segments:
            layer = segment[4]
            entry = by_layer.get(layer)
            if entry is None:
                entry = by_layer[layer] = LayerIndex([], [])
            entry.requests.append(i)
            entry.segments.append(segment)

    unstreamed: list[int] = []
    for i, rt in enumerate(kept):
        sleeps = False
        for segment in rt.segments:
            # `is_unstreamed` and `is_pending_sleep` inlined (fields by index: name 3, layer 4, attrs 8): every segment
            layer = segment[4]
            if layer is None:
                if segment[3] == SLEEP_SEGMENT:
                    sleeps = True
            elif layer == PROVIDER and segment[8].get(TTFT_KNOWN) is False:
                unstreamed.append(i)
                breakdowns.append({})
                break
        else:
            if sleeps:  # which of them were backoff between attempts (latprof.analysis.retries)
                rt = kept[i] = classify_sleeps(rt)
            breakdowns.append(layer_times_ms(rt))
            for segment in rt.segments:  # `index` inlined: every segment
                entry = by_layer.get(segment[4])
                if entry is None:
                    entry = by_layer[segment[4]] = LayerIndex([], [])
                entry.requests.append(i)
                entry.segments.append(segment)
    split_warnings: list[str] = []
    if unstreamed:
        splitter = unstreamed_splitter(by_layer[MODEL].segments if MODEL in by_layer else (), (kept[i] for i in unstreamed))
        for i in unstreamed:
            kept[i] = splitter(classify_sleeps(kept[i]))
            breakdowns[i] = layer_times_ms(kept[i])
            index(i, kept[i].segments)
        split_warnings = splitter.warnings()
    return breakdowns, by_layer, split_warnings


def sampling_warning(recorded: int, represented: int) -> str:
    return (
        f"sampled: {recorded:,} requests recorded stand for about {represented:,} (each carries latprof.sample_weight:"
        " above `latprof run --max-rate` requests a second per process the hooks record a random sample, and ClickHouse's"
        " pick brings back one in k of a large range); counts, percentiles, cohorts and layer times weigh each recorded"
        " request by the requests it stands for"
    )
