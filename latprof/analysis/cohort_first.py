"""Cohort-first analysis: read every request's latency, then only the segments the verdict needs.

A verdict rests on every request's latency (the percentiles, the cohorts, the windows) and on
the segments of a few requests: the tail cohorts, the median cohort they are compared with, and
each window's tail. The layer table's percentiles and what rules count over all requests need
the whole distribution, which a sample estimates. So a large capture is read in two passes
(`latprof.capture.reader`):

1. every line but the segments: requests, gauges, stack samples, quality records, headers.
   A segment line in the writer's own form is recognised by its first bytes and not parsed;
2. after the cohorts are chosen from the latencies, the segment lines of the requests picked
   (`pick`): the slowest 1% and 5%, the median cohort (p40-p60), the requests at or above their
   window's p99, and a deterministic sample of the others - one in `one_in`, by a hash of the
   request id, so the same capture gives the same sample (and `latprof check` the same result).

The analysis (`latprof.analysis.requests.Analysis`) then holds the picked requests, with
`population` holding every request's root. Exact: latency percentiles, `p99_over_time`,
counts of requests, arrivals and requests in flight, every cohort's layer times (so
`tail_excess_ms` and the shares of it, which the verdict reads). Estimated from the sample (each
sampled request weighted by the `one_in` it stands for, `Analysis.weights`): the layers'
`p50_ms`, `p99_ms` and `mean`, `coverage`, and what a rule sums over all requests' segments.
The report's `collection.estimated` says so, with the sample's size.

When the picked requests would be most of the capture (`MAX_READ_SHARE`), every segment is read
and the analysis is the exact one; `--exact` asks for it always.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

from latprof.analysis.requests import (
    NS_PER_MS,
    NS_PER_S,
    Analysis,
    Cohorts,
    Population,
    Window,
    cohorts,
    coverage,
    kept_indices,
    layer_stats,
    materialise,
    sample_weight,
    sampling_warning,
    summarize_latency,
    weights_of,
    windows,
)
from latprof.analysis.timeline import RequestTimeline, Timeline
from latprof.events import Request

#: How many requests outside the cohorts the sample aims at: the layers' percentiles are
#: estimated from about this many (plus the cohorts), whatever the capture's size.
DEFAULT_SAMPLE_REQUESTS = 10_000
#: When the requests picked are more than this share of all, every segment is read: the second
#: pass costs about the same, and the analysis is then exact.
MAX_READ_SHARE = 0.6
#: The most requests whose segments are read for one cohort (the slowest 1%, the slowest 5%,
#: the median cohort, the windows' tails): a larger cohort is read as a deterministic sample of
#: about this many, each standing for the k requests of its cohort it was drawn from, so the
#: segments held stay bounded whatever the capture's size. The cohorts of a capture of up to
#: about 100,000 requests (1M spans of ten) are read whole.
DEFAULT_COHORT_CAP = 20_000


@dataclass(frozen=True)
class Pick:
    """The requests whose segments a cohort-first analysis reads, as indices into the requests
    kept after warm-up (`kept_indices` of the timeline), ascending."""

    kept: list[int]  # indices into timeline.requests of the requests kept after warm-up
    read: list[int]  # indices into `kept` of the requests to materialise, ascending
    sampled: frozenset[int]  # those of `read` in the sample of the others (not in a cohort or a window's tail)
    one_in: int
    #: Each read request's weight in the sample it was drawn from: 1 for a cohort read whole,
    #: k for a capped cohort read 1 in k, `one_in` for the sample of the others.
    factor: dict[int, int]
    #: The cohorts read as a sample (`DEFAULT_COHORT_CAP`): name -> (requests in it, one in k read).
    capped: dict[str, tuple[int, int]]
    # what the pick was made from, for the analysis (all of them over `kept`)
    latencies: list[float]
    weights: list[int] | None
    groups: Cohorts
    windows: list[Window]

    def wanted_ids(self, timeline: Timeline) -> set[str]:
        return {timeline.requests[self.kept[i]].request.request_id for i in self.read}


def in_sample(request_id: str, one_in: int) -> bool:
    """Whether a request is in the 1-in-`one_in` sample: by the CRC-32 of its id, so the same
    capture always gives the same sample."""
    return zlib.crc32(request_id.encode("utf-8", "surrogatepass")) % one_in == 0


def pick(
    timeline: Timeline,
    warmup_s: float,
    *,
    sample_requests: int = DEFAULT_SAMPLE_REQUESTS,
    max_read_share: float = MAX_READ_SHARE,
    cohort_cap: int = DEFAULT_COHORT_CAP,
) -> Pick | None:
    """The requests a cohort-first analysis of `timeline` (its requests' roots, segments not read
    yet) materialises, or None when that would be more than `max_read_share` of them (read
    everything then). See the module's docstring for what is picked.

    The kept requests fall into strata, each request into the first that holds it: each window's
    slowest (read whole), the slowest 1%, the slowest 5%, the median cohort, the requests at or
    above their window's p99 (each read whole up to `cohort_cap` requests, else 1 in k by the
    hash of the request id), and the others (1 in `one_in`, about `sample_requests` of them).
    A request read stands for the requests of its stratum it was drawn from (`Pick.factor`).
    """
    requests = timeline.requests
    kept = kept_indices(requests, warmup_s)
    if not kept:
        return None
    roots = [requests[i].request for i in kept]
    latencies = [(r.end_ns - r.start_ns) / NS_PER_MS for r in roots]
    weights = _weights(timeline, kept)
    groups = cohorts(latencies, weights)
    wins = windows([requests[i] for i in kept], latencies, weights=weights)
    slowest, window_tails = _window_tails(roots, wins, latencies)
    factor: dict[int, int] = dict.fromkeys(slowest, 1)
    assigned = set(slowest)
    capped: dict[str, tuple[int, int]] = {}
    strata = (("tail", groups.tail), ("tail5", groups.tail5), ("median", groups.median), ("window_tails", window_tails))
    for name, members in strata:
        own = [i for i in dict.fromkeys(members) if i not in assigned]
        assigned.update(own)
        k = math.ceil(len(own) / cohort_cap) if len(own) > cohort_cap else 1
        if k > 1:
            capped[name] = (len(set(members)), k)
        factor.update((i, k) for i in own if k == 1 or in_sample(roots[i].request_id, k))
    rest = len(kept) - len(assigned)
    one_in = max(1, math.ceil(rest / max(1, sample_requests)))
    if one_in == 1 and not capped:
        return None
    sampled = frozenset(
        i for i in range(len(kept)) if i not in assigned and (one_in == 1 or in_sample(roots[i].request_id, one_in))
    )
    factor.update(dict.fromkeys(sampled, one_in))
    read = sorted(factor)
    if len(read) > max_read_share * len(kept):
        return None
    if capped:
        groups = Cohorts(*(_drawn(cohort, factor) for cohort in (groups.median, groups.tail, groups.tail5)))
    return Pick(kept, read, sampled, one_in, factor, capped, latencies, weights, groups, wins)


def _drawn(cohort: tuple[int, ...], factor: dict[int, int]) -> tuple[int, ...]:
    """A cohort as read: each request read in it as often as the requests it stands for (the
    weighted-cohort form of `Cohorts`); those not read are left out."""
    return tuple(j for i in cohort if i in factor for j in (i,) * factor[i])


def _weights(timeline: Timeline, kept: list[int]) -> list[int] | None:
    """The sample weights of the kept requests, as `analyze` takes them (None when nothing was sampled)."""
    if weights_of(timeline.requests) is None:
        return None
    return [sample_weight(timeline.requests[i]) for i in kept]


def _window_tails(roots: list[Request], wins: list[Window], latencies: list[float]) -> tuple[list[int], list[int]]:
    """Each window's slowest request, and the requests at or above their window's p99 (of
    `windows`): what `p99_over_time` and the HTML report's tail per window are made of."""
    if not wins:
        return [], []
    size_ns = round((wins[0].end_unix_s - wins[0].start_unix_s) * NS_PER_S)
    origin = round(wins[0].start_unix_s * NS_PER_S)
    slowest: dict[int, int] = {}
    out: list[int] = []
    for i, root in enumerate(roots):
        k = (root.start_ns - origin) // size_ns if size_ns > 0 else 0
        if not 0 <= k < len(wins):
            continue
        p99 = wins[k].p99_ms
        if p99 is not None and latencies[i] >= p99:
            out.append(i)
        if k not in slowest or latencies[i] > latencies[slowest[k]]:
            slowest[k] = i
    return sorted(slowest.values()), out


def analyze_picked(
    timeline: Timeline, chosen: Pick, *, warmup_skipped: int, min_tail_excess_ms: float
) -> Analysis:
    """The analysis of `timeline` (segments read for the requests of `chosen`) as `analyze` would
    make it, with request-level numbers from every kept request and layer times from the picked."""
    requests = timeline.requests
    all_kept = [requests[i] for i in chosen.kept]
    roots = [rt.request for rt in all_kept]
    latencies, weights, groups = chosen.latencies, chosen.weights, chosen.groups

    picked: list[RequestTimeline] = [all_kept[i] for i in chosen.read]
    breakdowns, by_layer, split_warnings = materialise(picked)
    position = {i: n for n, i in enumerate(chosen.read)}
    picked_groups = Cohorts(
        median=tuple(position[i] for i in groups.median),
        tail=tuple(position[i] for i in groups.tail),
        tail5=tuple(position[i] for i in groups.tail5),
    )
    picked_weights = [(1 if weights is None else weights[i]) * chosen.factor[i] for i in chosen.read]
    sampled_note = [] if weights is None else [sampling_warning(len(all_kept), sum(weights))]
    skipped = warmup_skipped
    if weights is not None:
        skipped = sum(map(sample_weight, requests)) - sum(weights)
    population = Population(roots, weights, len(picked), len(chosen.sampled), chosen.one_in, chosen.capped)
    return Analysis(
        timeline=timeline,
        requests=picked,
        breakdowns=breakdowns,
        latencies_ms=[latencies[i] for i in chosen.read],
        latency=summarize_latency(latencies, weights),
        groups=picked_groups,
        layers=layer_stats(breakdowns, picked_groups, picked_weights),
        windows=chosen.windows,
        warmup_skipped=skipped,
        coverage=coverage(breakdowns, picked_weights),
        warnings=list(timeline.warnings) + sampled_note + split_warnings,
        by_layer=by_layer,
        weights=picked_weights,
        min_tail_excess_ms=min_tail_excess_ms,
        population=population,
    )


def estimated(analysis: Analysis) -> dict[str, Any] | None:
    """report-v1 `collection.estimated` of a cohort-first analysis (None for an exact one): what was
    read, the sample's size, and which numbers it estimates."""
    population = analysis.population
    if population is None:
        return None
    exact = ["latency_ms", "p99_over_time", "window"]
    cohort_based = ["layers.tail_excess_ms", "layers.share_of_tail_excess", "verdict.share_of_tail_excess"]
    out: dict[str, Any] = {
        "method": "cohort-first",
        "requests": population.represented,
        "requests_read": population.materialised,
        "sample_requests": population.sampled,
        "sample_one_in": population.one_in,
        "exact": exact if population.capped else exact + cohort_based,
        "estimated": ["layers.p50_ms", "layers.p99_ms", "coverage", "sums over all requests in findings' evidence"]
        + (cohort_based if population.capped else []),
    }
    if population.capped:
        out["cohorts_sampled"] = {
            name: {"requests": requests, "sample_one_in": k} for name, (requests, k) in population.capped.items()
        }
    return out


__all__ = ["DEFAULT_COHORT_CAP", "DEFAULT_SAMPLE_REQUESTS", "MAX_READ_SHARE", "Pick", "analyze_picked", "estimated", "in_sample", "pick"]
