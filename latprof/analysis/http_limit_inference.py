"""An outbound HTTP connection limit read from stock client spans: the wait for a slot hides inside each call's span.

A stock HTTP client instrumentation (httpx's `HTTPXClientInstrumentor`, and the others that wrap the
transport) starts its span before the request waits for a connection of the client's pool: with
`httpx.Limits(max_connections=N)` too small for the service's concurrency, the wait is inside the
span and a tail of slow calls reads as a slow provider (or tool). What gives it away is the calls'
shape, per process instance and per target host:port:

- **A replay through a pool of N.** Served first come first served by N connections, a call starts
  its service when it is sent (its span's start) or, when N earlier calls are still running then,
  when the N-th latest of their ends comes (a slot frees): `implied_starts`. The part of the span
  before that is a wait for a connection, the rest the service. Too few slots make calls start later
  than they did, which leaves them too short: N is the fewest slots under which what is left of the
  waiting calls is as long as the calls that did not wait (`MAX_BELOW_FASTEST`, `MIN_SERVICE_FIT`).
- **The replay must explain the tail.** Some calls waited and most did not; the slowest calls are
  mostly ones that waited; once the wait is taken off, what the waiting calls were served in looks
  like the calls that never waited (their quartiles within `MAX_FIT_RATIO`), while their spans as
  recorded do not (median at least `MIN_RAW_RATIO` times); and the waits are a good part of the
  slowest requests' excess over the median one.

Then each waiting call gets an inferred `http.pool` segment inside its span (`latprof.inferred:
true`, the ceiling in `latprof.inferred.connection_ceiling`, the host in `server.address`), which
owns that time (the innermost segment does), and the `http-pool-exhaustion` rule reads it.

**Cheap on traces without it.** The calls come grouped by instance and layer as mapping the spans
noted them (`SpanFacts.calls`; else one pass over every segment, touching no attributes); about a
thousand calls of each group say its host (a group with several is split call by call). A group is dropped before any replay unless its slowest calls began while more calls
to the host were in flight than when a typical call began (a pool's waiters always do; a healthy
service's slow calls begin at any load; a closed loop's at the same load): judged on a sample of a
few thousand calls, with two sorts and a few hundred bisections (`_slowest_began_busier`). On the
1M-span benchmark (benchmarks/bench_otlp.py) the whole step takes about 0.2 s.

A call with another service's server span below it is left out: that service is traced, its span says
when it began serving, and `latprof.analysis.inference.infer_queueing` reads the time before.

**What it cannot tell.** A client limit of N and a provider (or a proxy in front of it) that serves
N requests at a time and queues the rest look the same from the client's spans; so does a limit of
the service's own around those calls (a semaphore taken inside the span). The finding names both
readings, and it is believed less than half (`AMBIGUOUS_CONFIDENCE`): `latprof run`'s httpx pool
hooks time the client's pool itself, and the provider's own concurrency limit (its docs, its
metrics) says whether it queues. A load that never has more than N requests in flight (a closed loop
of N clients) leaves no call waiting in the replay and is not a limit. A pool at its limit all the time
(nearly every call waits) is not concluded either: no call shows what a call takes without the wait,
and the tail is then the median's (the requests' latency is the pool's queue).
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import operator
from typing import Any, Iterable, Mapping, Sequence

from latprof.analysis.inference import INFERRED, INFERRED_CEILING, INFERRED_FROM
from latprof.analysis.requests import NS_PER_MS, NS_PER_S, cohorts
from latprof.analysis.timeline import RequestTimeline, Timeline
from latprof.collectors.traces.tracemap import SPAN_KIND
from latprof.events import Segment
from latprof.layers import HTTP_POOL, MODEL, PROVIDER, TOOL
from latprof.semconv import HTTP_REQUEST_METHOD, SERVER_ADDRESS, SERVER_PORT

#: Layers of the segments made from HTTP client spans (`latprof.collectors.traces.tracemap`).
CALL_LAYERS = frozenset({PROVIDER, MODEL, TOOL})
#: A host is judged on at least this many calls from one instance (after the warm-up).
MIN_CALLS = 30
#: A ceiling larger than this is not read as a connection limit: a pool that large is rarely the
#: bottleneck, and the replays cost a pass each.
MAX_CEILING = 32
#: The slowest calls: this share of a host's calls, at least `MIN_SLOWEST` of them.
SLOWEST_SHARE = 0.05
MIN_SLOWEST = 3
#: The cheap test judges about this many of a host's calls, taken evenly.
SAMPLED_CALLS = 4096
#: A group of calls (an instance's calls in one layer) is taken as one host's when about this many of its calls,
#: taken evenly, all went to that host: a host with fewer than 1 in 1024 of the group's calls may go unjudged.
SAMPLED_HOSTS = 1024
#: A typical call's in-flight count is read on about this many of them.
TYPICAL_READ = 256
#: Too few slots make calls start later than they did, which shortens what is left of them: the ceiling is the
#: fewest slots under which the waiting calls' service is not shorter than the durations of the calls that did not
#: wait - at most this share of it shorter than their 10th percentile (by `SHORTER_THAN_FASTEST` and `SLACK_NS`;
#: in simulations one slot short leaves 0.23-0.7 of it so, the right number 0-0.14) ...
MAX_BELOW_FASTEST = 0.2
SHORTER_THAN_FASTEST = 0.95
#: ... and its lower quartile and median at least this share of theirs (one slot short: 0.4-0.85; right: 0.93-1.05).
MIN_SERVICE_FIT = 0.85
#: A call's end, read at its caller's next step (`latprof.collectors.traces.tracemap` extends LLM calls so), comes a
#: little after its connection went back to the pool, which the next call took at once: what is left of a waiting
#: call is short of its service by up to that much (about 1 ms in recordings).
SLACK_NS = 2 * NS_PER_MS
#: A call waited when its inferred wait is at least this share of the host's median call duration (and 1 ms).
MIN_WAIT_SHARE_OF_MEDIAN = 0.1
#: At least this many calls waited, and at least this share of the calls (and `MIN_UNWAITED`) did not:
#: they are what a call is when it does not wait.
MIN_WAITED = 5
MIN_UNWAITED = 10
MIN_UNWAITED_SHARE = 0.25
#: The waiting calls' inferred service and the others' durations fit when each quartile is within this ratio ...
MAX_FIT_RATIO = 1.5
#: ... and the waiting calls' spans as recorded do not: their median is at least this many times the others'.
MIN_RAW_RATIO = 1.5
#: At least this share of the slowest calls waited: the waits are what made them slow.
MIN_SLOWEST_WAITED = 0.6
#: The slowest 1% of requests' mean wait must be at least this share of their excess over the median cohort.
MIN_SHARE_OF_EXCESS = 0.2
#: The most an inferred client limit is believed (a rule's confidence cap): under 0.5, since a provider
#: that serves N at a time looks the same from the client's spans.
AMBIGUOUS_CONFIDENCE = 0.4

INFERRED_HTTP_POOL = "http pool wait (inferred)"
SOURCE_CALLS_REPLAYED = (
    "the HTTP client spans to one host, replayed through a first-come-first-served pool of as few connections as"
    " explain them"
)
#: int on an inferred `http.pool` segment: the host's calls judged, and how many of them waited.
INFERRED_CALLS = "latprof.inferred.calls"
INFERRED_WAITED_CALLS = "latprof.inferred.waited_calls"
#: float: the median ms the waiting calls were served in once the wait is taken off, the median span of
#: the calls that did not wait, and the median span of the waiting calls as recorded.
INFERRED_SERVICE_MS = "latprof.inferred.waited_service_median_ms"
INFERRED_UNWAITED_MS = "latprof.inferred.unwaited_median_ms"
INFERRED_WAITED_SPAN_MS = "latprof.inferred.waited_span_median_ms"

_START = operator.itemgetter(5)
_END = operator.itemgetter(6)


def call_host(attrs: Any) -> tuple[Any, Any] | None:
    """(host, port) an HTTP client span called, or None when it is not an HTTP call: `server.address`
    and `server.port` (old conventions `net.peer.*`), else the authority of `url.full` / `http.url`."""
    if HTTP_REQUEST_METHOD not in attrs and "http.method" not in attrs:
        return None
    host = attrs.get(SERVER_ADDRESS) or attrs.get("net.peer.name")
    if host:
        return host, attrs.get(SERVER_PORT) or attrs.get("net.peer.port")
    url = attrs.get("url.full") or attrs.get("http.url")
    if not isinstance(url, str):
        return None
    begin = url.find("://")
    begin = begin + 3 if begin >= 0 else 0
    end = len(url)
    for stop in "/?#":
        cut = url.find(stop, begin)
        if 0 <= cut < end:
            end = cut
    authority = url[begin:end].rpartition("@")[2]
    return (authority, None) if authority else None


def host_name(host: tuple[Any, Any]) -> str:
    """`host:port`, or the host alone when the span gave no port."""
    return f"{host[0]}:{host[1]}" if host[1] not in (None, "") else str(host[0])


def implied_starts(starts: Sequence[int], ends: Sequence[int], slots: int) -> list[int]:
    """When each call (in the order it started) was served, through a first-come-first-served pool of
    `slots`: its start, or the N-th latest end among the calls that started before it, when later."""
    heap: list[int] = []  # the `slots` latest ends so far: the earliest of them frees a slot
    out: list[int] = []
    append, replace, push = out.append, heapq.heapreplace, heapq.heappush
    for start, end in zip(starts, ends):
        if len(heap) < slots:
            push(heap, end)
            append(start)
            continue
        free = heap[0]
        append(start if start >= free else free)
        if end > free:
            replace(heap, end)
    return out


def _quantile(values: Sequence[int], q: float) -> float:
    """The `q` quantile of sorted `values` (the nearest rank)."""
    return values[min(len(values) - 1, int(q * len(values)))]


def _in_flight(starts: Sequence[int], ends: Sequence[int], t: int) -> int:
    """How many calls (their sorted starts and ends) were running at `t`, counting one starting then."""
    return bisect.bisect_right(starts, t) - bisect.bisect_right(ends, t)


def _slowest_began_busier(starts: list[int], ends: list[int], after_ns: int) -> bool:
    """The cheap test a host passes before any replay: its slowest calls (their `starts` and `ends`, in
    the same order) began while more calls were in flight than when a typical one began (their median
    above the upper quartile of all calls'); only calls that began at `after_ns` or later are judged.

    Judged on a sample of the calls (every k-th, at most about `SAMPLED_CALLS`: the slowest of a sample
    are spread as the slowest of all), their in-flight counts read against every call: two sorts and a
    few hundred bisections. False when fewer than `MIN_CALLS` calls are judged."""
    step = max(1, len(starts) // SAMPLED_CALLS)
    sample = [(start, end - start) for start, end in zip(starts[::step], ends[::step]) if start >= after_ns]
    if len(sample) * step < MIN_CALLS or len(sample) < MIN_SLOWEST:
        return False
    sample.sort(key=operator.itemgetter(1))
    slowest = sample[-max(MIN_SLOWEST, int(SLOWEST_SHARE * len(sample))) :]
    by_start, by_end = sorted(starts), sorted(ends)
    busy_slow = sorted(_in_flight(by_start, by_end, t) for t, _ in slowest)
    busy_all = sorted(_in_flight(by_start, by_end, t) for t, _ in sample[:: max(1, len(sample) // TYPICAL_READ)])
    return _quantile(busy_slow, 0.5) > _quantile(busy_all, 0.75)


@dataclasses.dataclass(frozen=True)
class _Replay:
    """A host's judged calls (by start) replayed through `slots` connections."""

    calls: list[tuple[int, Segment]]  # (request index, call segment)
    slots: int
    served: list[int]  # when each call got a connection (never after its end)
    waited: list[bool]


def _replay(calls: list[tuple[int, Segment]]) -> _Replay | None:
    """The fewest slots that explain the calls, replayed (module docstring); None when no ceiling up to
    `MAX_CEILING` does, or the host never had more calls in flight than that ceiling."""
    starts = [s[5] for _, s in calls]
    ends = [s[6] for _, s in calls]
    min_wait_ns = max(NS_PER_MS, MIN_WAIT_SHARE_OF_MEDIAN * _quantile(sorted(e - s for s, e in zip(starts, ends)), 0.5))
    by_start, by_end = sorted(starts), sorted(ends)
    top = min(MAX_CEILING, max(_in_flight(by_start, by_end, t) for t in starts) - 1)
    for slots in range(1, top + 1):
        served = [min(got, end) for got, end in zip(implied_starts(starts, ends, slots), ends)]
        waited = [got - start >= min_wait_ns for got, start in zip(served, starts)]
        served_in = sorted(end - got for got, end, w in zip(served, ends, waited) if w)
        unwaited = sorted(end - start for start, end, w in zip(starts, ends, waited) if not w)
        if not served_in or not unwaited:
            continue
        fastest = _quantile(unwaited, 0.1)
        below = bisect.bisect_left(served_in, min(SHORTER_THAN_FASTEST * fastest, fastest - SLACK_NS)) / len(served_in)
        as_long = all(_quantile(served_in, q) + SLACK_NS >= MIN_SERVICE_FIT * _quantile(unwaited, q) for q in (0.25, 0.5))
        if below <= MAX_BELOW_FASTEST and as_long:
            return _Replay(calls, slots, served, waited)
    return None


def _explains(replay: _Replay, timeline: Timeline, judged: Sequence[int]) -> dict[str, Any] | None:
    """The inference's numbers when the replay explains the host's slow calls and the requests' tail
    (module docstring), else None."""
    spans = [s[6] - s[5] for _, s in replay.calls]
    service = [s[6] - got for (_, s), got in zip(replay.calls, replay.served)]
    waiting = [i for i, w in enumerate(replay.waited) if w]
    unwaited = sorted(spans[i] for i, w in enumerate(replay.waited) if not w)
    n = len(replay.calls)
    if len(waiting) < MIN_WAITED or len(unwaited) < max(MIN_UNWAITED, MIN_UNWAITED_SHARE * n):
        return None
    served_in = sorted(service[i] for i in waiting)
    as_recorded = sorted(spans[i] for i in waiting)
    for q in (0.25, 0.5, 0.75):
        base = max(1, _quantile(unwaited, q))
        if not 1 / MAX_FIT_RATIO <= _quantile(served_in, q) / base <= MAX_FIT_RATIO:
            return None
    if _quantile(as_recorded, 0.5) < MIN_RAW_RATIO * _quantile(unwaited, 0.5):
        return None
    slowest = heapq.nlargest(max(MIN_SLOWEST, int(SLOWEST_SHARE * n)), range(n), key=spans.__getitem__)
    if sum(replay.waited[i] for i in slowest) < MIN_SLOWEST_WAITED * len(slowest):
        return None
    # the requests' tail: their waits against their excess over the median cohort
    wait_by_request: dict[int, int] = {}
    for (r, s), got, w in zip(replay.calls, replay.served, replay.waited):
        if w:
            wait_by_request[r] = wait_by_request.get(r, 0) + got - s[5]
    requests = timeline.requests
    ranked = cohorts([requests[i].latency_ns for i in judged])
    if not ranked.tail or not ranked.median:
        return None

    def mean(values: Iterable[int], count: int) -> float:
        return sum(values) / count

    tail = [judged[i] for i in ranked.tail]
    median = [judged[i] for i in ranked.median]
    excess = mean((requests[i].latency_ns for i in tail), len(tail)) - mean((requests[i].latency_ns for i in median), len(median))
    tail_wait = mean((wait_by_request.get(i, 0) for i in tail), len(tail))
    if excess <= 0 or tail_wait < MIN_SHARE_OF_EXCESS * excess:
        return None
    return {
        INFERRED_CALLS: n,
        INFERRED_WAITED_CALLS: len(waiting),
        INFERRED_SERVICE_MS: round(_quantile(served_in, 0.5) / NS_PER_MS, 3),
        INFERRED_UNWAITED_MS: round(_quantile(unwaited, 0.5) / NS_PER_MS, 3),
        INFERRED_WAITED_SPAN_MS: round(_quantile(as_recorded, 0.5) / NS_PER_MS, 3),
    }


def _warmup_ends(timeline: Timeline, pids: Iterable[int], warmup_s: float) -> dict[int, int]:
    """Per instance among `pids`: when its warm-up ends (its first request's arrival plus `warmup_s`),
    as `skip_warmup` reads it. Requests are sorted by arrival: the first of each instance is its first."""
    wanted = set(pids)
    first: dict[int, int] = {}
    if warmup_s <= 0:
        return {pid: -(2**63) for pid in wanted}
    for rt in timeline.requests:
        pid = rt.request.pid
        if pid in wanted and pid not in first:
            first[pid] = rt.request.start_ns
            if len(first) == len(wanted):
                break
    cutoff = int(warmup_s * NS_PER_S)
    return {pid: start + cutoff for pid, start in first.items()}


@dataclasses.dataclass
class _HostCalls:
    """The client calls of one instance to one host: their segments, starts and ends (in the same order)."""

    segments: list[Segment]
    starts: list[int]
    ends: list[int]

    def extend(self, other: _HostCalls) -> None:
        self.segments += other.segments
        self.starts += other.starts
        self.ends += other.ends


def _calls_by_host(timeline: Timeline) -> dict[tuple[int, Any, Any], _HostCalls]:
    """The segments of HTTP client calls (`CALL_LAYERS`) by instance and host: (pid, host, port).

    The calls come grouped by instance and layer: as mapping noted them (`SpanFacts.calls`), else from
    one pass over every segment that touches only the segments (their attributes lie elsewhere in
    memory: reading them for every call is what costs). A group whose calls, read at about
    `SAMPLED_HOSTS` of them, all went to one host is taken as that host's (the replay checks each call
    again); one with several is split call by call. Non-HTTP calls are left out."""
    facts = timeline.span_facts
    by_layer: Mapping[tuple[int, str], Sequence[Segment]]
    if facts is not None:
        by_layer = facts.calls
    else:
        lumps: dict[tuple[int, str], list[Segment]] = {}
        get = lumps.get
        for rt in timeline.requests:
            for s in rt.segments:
                if s[4] in CALL_LAYERS:
                    lump = (s[7], s[4])
                    found = get(lump)
                    if found is None:
                        lumps[lump] = [s]
                    else:
                        found.append(s)
        by_layer = lumps
    groups: dict[tuple[int, Any, Any], _HostCalls] = {}
    for (pid, _), calls in by_layer.items():
        hosts = {call_host(s[8]) for s in calls[:: max(1, -(-len(calls) // SAMPLED_HOSTS))]}
        only = next(iter(hosts)) if len(hosts) == 1 else None
        parts: dict[tuple[int, Any, Any], Sequence[Segment]] = {}
        if only is not None:
            parts[(pid, only[0], only[1])] = calls
        else:
            split: dict[tuple[int, Any, Any], list[Segment]] = {}
            for s in calls:
                named = call_host(s[8])
                if named is not None:
                    split.setdefault((pid, named[0], named[1]), []).append(s)
            parts.update(split)
        for key, part in parts.items():
            host_calls = _HostCalls(list(part), list(map(_START, part)), list(map(_END, part)))
            if key in groups:
                groups[key].extend(host_calls)
            else:
                groups[key] = host_calls
    return groups


def _calls_into_traced_services(requests: Sequence[RequestTimeline], among: Iterable[int]) -> set[str]:
    """The ids of the client segments, in the requests at the indices `among`, with a server span below them: the
    called service is traced, its span says when it began serving, and `infer_queueing` reads the time before."""
    return {s[2] for i in among for s in requests[i].segments if s[4] is None and s[8].get(SPAN_KIND) == "server" and s[2]}


def infer_http_limits(timeline: Timeline, warmup_s: float = 0.0) -> Timeline:
    """The timeline with an inferred `http.pool` segment inside each HTTP client span that waited for a
    connection of a pool at its limit (module docstring); the same timeline when no host shows one.

    Judged per instance and host on the requests the analysis keeps (those after `warmup_s`, as
    `skip_warmup`): a service's first calls, slow for their own reasons (connections opened), would
    otherwise be the slow calls it is judged by."""
    groups = _calls_by_host(timeline)
    cutoffs = _warmup_ends(timeline, {key[0] for key in groups}, warmup_s)
    candidates = []
    for key, host_calls in groups.items():
        if len(host_calls.starts) >= MIN_CALLS and _slowest_began_busier(host_calls.starts, host_calls.ends, cutoffs[key[0]]):
            candidates.append(key)
    if not candidates:
        return timeline
    requests = timeline.requests
    index = {rt.request.request_id: i for i, rt in enumerate(requests)}
    cutoffs = _warmup_ends(timeline, {rt.request.pid for rt in requests}, warmup_s)
    judged = [i for i, rt in enumerate(requests) if rt.request.start_ns >= cutoffs[rt.request.pid]]
    kept = set(judged)
    added: dict[int, list[Segment]] = {}
    for key in candidates:
        segments = groups[key].segments
        traced = _calls_into_traced_services(requests, {index[s[0]] for s in segments if s[0] in index})
        host = (key[1], key[2])  # the group was named from a sample: each call is checked here
        judged_calls = (s for s in segments
                        if index.get(s[0]) in kept and s[6] > s[5] and s[1] not in traced and call_host(s[8]) == host)  # fmt: skip
        calls = sorted(((index[s[0]], s) for s in judged_calls), key=lambda c: (c[1][5], c[1][6]))
        if len(calls) < MIN_CALLS:
            continue
        replay = _replay(calls)
        if replay is None:
            continue
        numbers = _explains(replay, timeline, judged)
        if numbers is None:
            continue
        attrs: dict[str, Any] = {INFERRED: True, INFERRED_FROM: SOURCE_CALLS_REPLAYED, INFERRED_CEILING: replay.slots,
                                 SERVER_ADDRESS: host_name((key[1], key[2])), **numbers}  # fmt: skip
        for (r, call), got in zip(calls, replay.served):
            if got - call[5] >= NS_PER_MS:
                added.setdefault(r, []).append(
                    Segment(call[0], f"{call[1]}.http_pool", call[1], INFERRED_HTTP_POOL, HTTP_POOL, call[5], got, call[7], attrs)
                )
    if not added:
        return timeline
    changed = [RequestTimeline(rt.request, rt.segments + tuple(added[i])) if i in added else rt for i, rt in enumerate(requests)]
    return dataclasses.replace(timeline, requests=changed)
