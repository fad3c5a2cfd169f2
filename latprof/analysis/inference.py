"""What latprof concludes rather than measures, for every source, in one shape (`Inference`);
and from traces, what stock instrumentation does not record: pool waits and queues seen only as gaps.

**The shape.** A conclusion no span, hook or sample measured directly is a finding whose
evidence carries `inferred: true`, `inferred_from` (what it was read from, in words) and the
inference's own numbers (`Inference.evidence`). Its confidence is the finding's: a rule that
also sees the measured kind scales an inferred one by `INFERRED_CONFIDENCE`, and the verdict
that names an inferred finding's layer is no surer than that finding and says it was inferred
(`latprof.report.verdict`). Today: pool waits and queues inferred from traces (below), and a
pool inferred on an asyncio server from the socket census (`latprof.attach.analysis`).

**From traces.**

psycopg_pool, asyncpg and most drivers emit a span per statement but none for the pool
checkout, so a request that waits for a connection shows an uncovered gap right before its
first database span. A gap there alone proves nothing (it may be the request's own code); it
is read as a pool wait only when the traces show the shape of a pool at its limit:

- the gap is large in the tail cohort and near zero in the median cohort, and
- while requests sit in such gaps, the number of requests holding a connection (from their
  first database span to the end of their last) stays at a ceiling: the pool's size.

Then each request's gap becomes an inferred `db.pool` segment (`latprof.inferred: true`,
with the evidence in its attributes), and rules and the report say it was inferred. Without
the shape nothing changes and the gap stays `unattributed` for the `uninstrumented-gap` rule.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import operator
from typing import Any, Mapping, Sequence

from latprof.analysis.requests import NS_PER_MS, Cohorts, cohorts, kept_indices
from latprof.events import Segment
from latprof.layers import DB_POOL, DB_QUERY, QUEUE
from latprof.semconv import QUEUE_SOURCE
from latprof.analysis.timeline import RequestTimeline, Timeline
from latprof.collectors.traces.tracemap import SERVICE_NAME, SPAN_KIND

#: A conclusion that was inferred is believed this much less than the same one measured.
INFERRED_CONFIDENCE = 0.6


@dataclasses.dataclass(frozen=True, slots=True)
class Inference:
    """A conclusion drawn rather than measured: what it was read from, and its own numbers."""

    inferred_from: str
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def evidence(self) -> dict[str, Any]:
        """The finding evidence that says so: `inferred`, `inferred_from`, then the details."""
        return {"inferred": True, "inferred_from": self.inferred_from, **self.details}

    @staticmethod
    def of_segment(attrs: Mapping[str, Any], details: Mapping[str, Any]) -> Inference:
        """The inference an inferred segment carries (its `INFERRED_FROM`), with a rule's `details`."""
        return Inference(str(attrs.get(INFERRED_FROM) or "the traces' shape"), details)

    @staticmethod
    def of(evidence: Mapping[str, Any]) -> Inference | None:
        """The inference a finding's evidence holds, or None when the finding was measured."""
        if not evidence.get("inferred"):
            return None
        where = evidence.get("inferred_from")
        details = {k: v for k, v in evidence.items() if k not in ("inferred", "inferred_from")}
        return Inference(where if isinstance(where, str) and where else "the shape of the data", details)


#: bool on a segment that no span measured: the analysis inferred it from the traces' shape.
INFERRED = "latprof.inferred"
#: str on an inferred segment: what it was inferred from.
INFERRED_FROM = "latprof.inferred.from"
#: int on an inferred `db.pool` segment: the ceiling of requests holding a connection.
INFERRED_CEILING = "latprof.inferred.connection_ceiling"
#: float: the share of the waiting time during which that ceiling was reached.
INFERRED_AT_CEILING = "latprof.inferred.share_of_wait_at_ceiling"
INFERRED_TAIL_GAP_MS = "latprof.inferred.tail_mean_gap_ms"
INFERRED_MEDIAN_GAP_MS = "latprof.inferred.median_mean_gap_ms"
INFERRED_POOL_WAIT = "pool wait (inferred)"
SOURCE_GAP_BEFORE_DB = "the uncovered gap before each request's first database span"

#: The tail's mean gap before the first database span must be at least this long ...
MIN_TAIL_GAP_MS = 50.0
#: ... and explain at least this share of the tail's excess latency over the median ...
MIN_SHARE_OF_EXCESS = 0.2
#: ... while the median cohort's mean gap is at most this share of the tail's (or 5 ms).
MAX_MEDIAN_GAP_RATIO = 0.1
MAX_MEDIAN_GAP_MS = 5.0
#: The holders' ceiling is stable when it is reached during this share of the waiting time.
MIN_SHARE_AT_CEILING = 0.6


@dataclasses.dataclass(frozen=True)
class GapBeforeDb:
    """A request's uncovered time right before its first database span."""

    start_ns: int
    end_ns: int
    first_db: Segment
    hold_end_ns: int  # the end of the request's last database span

    @property
    def gap_ns(self) -> int:
        return self.end_ns - self.start_ns


def gap_before_first_db(rt: RequestTimeline) -> GapBeforeDb | None:
    """The uncovered interval that ends where the request's first `db.query` segment starts.

    It starts where the latest layered segment that began earlier ended (clipped to the
    database span's start), or at the request's start. None when the request has no database
    span or already has a `db.pool` segment (a measured checkout)."""
    return leading_gaps(rt)[0]


def gap_before_first_step(rt: RequestTimeline) -> GapBeforeDb | None:
    """For a request that runs database statements: the uncovered interval from its start to its
    first layered segment, when that segment comes before the first statement (a connection taken
    at the top of the handler - `with pool.connection():` - then an LLM call, then the queries).
    Its holding runs from that segment to the end of the last statement. None otherwise, or when
    a `db.pool` segment measured the checkout."""
    return leading_gaps(rt)[1]


def leading_gaps(rt: RequestTimeline) -> tuple[GapBeforeDb | None, GapBeforeDb | None]:
    """(`gap_before_first_db`, `gap_before_first_step`) of `rt`, from one pass over its segments
    (and a second over those of a request with statements): `infer_pool_waits` may read every request."""
    # fields by index (layer 4, start 5, end 6), no calls: this runs over every segment of a trace file
    first: Segment | None = None  # the first layered segment
    first_db: Segment | None = None  # the first statement
    first_start = db_start = last_end = 0
    for s in rt.segments:
        layer = s[4]
        if layer is None:
            continue
        if layer == DB_POOL:
            return None, None
        if s[6] <= s[5]:
            continue
        if first is None or s[5] < first_start:
            first, first_start = s, s[5]
        if layer == DB_QUERY:
            if first_db is None or s[5] < db_start:
                first_db, db_start = s, s[5]
            if s[6] > last_end:
                last_end = s[6]
    if first_db is None or first is None:
        return None, None
    request_start = rt.request.start_ns
    gap_start = request_start
    for s in rt.segments:  # the latest end of a layered segment (of any length) that began before the statement
        if s[4] is not None and s[5] < db_start and s is not first_db:
            end = s[6] if s[6] < db_start else db_start
            if end > gap_start:
                gap_start = end
    before_db = GapBeforeDb(min(gap_start, db_start), db_start, first_db, last_end)
    if first[4] == DB_QUERY or first_start >= db_start:
        return before_db, None
    return before_db, GapBeforeDb(min(request_start, first_start), first_start, first, last_end)


def holders_during(waits: Sequence[tuple[int, int]], holds: Sequence[tuple[int, int]]) -> tuple[int, float]:
    """(ceiling, share): the most requests holding a connection at once, and the share of the
    total waiting time during which that many (or more) held one.

    `holds` are [start, end) intervals of holding a connection, `waits` of waiting for one."""
    points: list[tuple[int, int]] = [(s, 1) for s, e in holds if e > s] + [(e, -1) for s, e in holds if e > s]
    points.sort()
    level = 0
    times: list[int] = []
    levels: list[int] = []
    for t, step in points:
        level += step
        if times and times[-1] == t:
            levels[-1] = level
        else:
            times.append(t)
            levels.append(level)
    if not levels:
        return 0, 0.0
    ceiling = max(levels)
    # the periods at the ceiling, as sorted disjoint [start, end)
    at: list[tuple[int, int]] = []
    for i, lv in enumerate(levels):
        if lv >= ceiling and i + 1 < len(times):
            at.append((times[i], times[i + 1]))
    starts = [a for a, _ in at]
    total = covered = 0
    for ws, we in waits:
        if we <= ws:
            continue
        total += we - ws
        i = max(0, bisect.bisect_right(starts, ws) - 1)
        while i < len(at) and at[i][0] < we:
            lo, hi = max(ws, at[i][0]), min(we, at[i][1])
            if hi > lo:
                covered += hi - lo
            i += 1
    return ceiling, (covered / total if total else 0.0)


#: A holders' ceiling of exactly this many is the default size of the worker thread pool that
#: runs FastAPI/Starlette `def` endpoints (anyio's 40 tokens): requests waiting for a thread, not
#: a connection, look the same when every endpoint holds a connection from its first step.
THREADPOOL_DEFAULT_SIZE = 40
SOURCE_GAP_BEFORE_FIRST_STEP = (
    "the uncovered gap before the first step of each request that then runs database statements (a connection"
    " taken at the top of the handler)"
)


def infer_pool_waits(timeline: Timeline, warmup_s: float = 0.0) -> Timeline:
    """The timeline with inferred `db.pool` segments when the gaps before the first database
    span have a pool's shape (module docstring); else, when the connection is taken before the
    request's first step (`gap_before_first_step`), the gaps before that step; else the same timeline.

    The shape is judged on the requests the analysis keeps (those after `warmup_s`, as
    `skip_warmup`): a service's first requests, slow for their own reasons (connections opened,
    clients built), would otherwise be the tail it is judged by. The tail and median cohorts are
    judged first, from their gaps alone: most files show no pool's shape there, and then no other
    request's segments are read."""
    requests = timeline.requests
    judged = kept_indices(requests, warmup_s)
    latencies = [(rt.request[3] - rt.request[2]) / NS_PER_MS for rt in requests]  # end 3, start 2
    ranked = cohorts([latencies[i] for i in judged])
    groups = Cohorts(*(tuple(judged[i] for i in cohort) for cohort in (ranked.median, ranked.tail, ranked.tail5)))
    if not groups.tail or not groups.median:
        return timeline
    # the tail's gaps first (1% of the requests), the median's (a fifth) only when the tail's could be a pool's
    read = {i: leading_gaps(requests[i]) for i in groups.tail}
    excess = _mean(latencies, groups.tail) - _mean(latencies, groups.median)
    shaped = [which for which in (0, 1) if _tail_shaped(_mean_gap_ms({i: g[which] for i, g in read.items()}, groups.tail), excess)]
    if not shaped:
        return timeline
    for i in groups.median:
        if i not in read:
            read[i] = leading_gaps(requests[i])
    shaped = [which for which in shaped if _cohorts_shaped({i: g[which] for i, g in read.items()}, groups, latencies)]
    if not shaped:
        return timeline
    gaps = [read[i] if i in read else leading_gaps(rt) for i, rt in enumerate(requests)]
    if 0 in shaped:
        found = _infer_pool_waits(timeline, [before_db for before_db, _ in gaps], SOURCE_GAP_BEFORE_DB, judged, groups, latencies)
        if found is not None:
            return found
    if 1 in shaped:
        leading = [before_step for _, before_step in gaps]
        found = _infer_pool_waits(timeline, leading, SOURCE_GAP_BEFORE_FIRST_STEP, judged, groups, latencies, THREADPOOL_DEFAULT_SIZE)
        if found is not None:
            return found
    return timeline


def _mean_gap_ms(gaps: Mapping[int, GapBeforeDb | None] | Sequence[GapBeforeDb | None], cohort: Sequence[int]) -> float:
    values = [gaps[i].gap_ns if gaps[i] is not None else 0 for i in cohort]  # type: ignore[union-attr]
    return sum(values) / len(values) / NS_PER_MS


def _cohorts_shaped(gaps: Mapping[int, GapBeforeDb | None] | Sequence[GapBeforeDb | None], groups: Cohorts,
                    latencies: Sequence[float]) -> bool:  # fmt: skip
    """True when the tail's gaps are long enough to explain its excess and the median's short: what a pool's
    shape needs of the two cohorts (`gaps` holds at least theirs)."""
    tail_gap, median_gap = _mean_gap_ms(gaps, groups.tail), _mean_gap_ms(gaps, groups.median)
    if not _tail_shaped(tail_gap, _mean(latencies, groups.tail) - _mean(latencies, groups.median)):
        return False
    return median_gap <= max(MAX_MEDIAN_GAP_MS, MAX_MEDIAN_GAP_RATIO * tail_gap)


def _tail_shaped(tail_gap_ms: float, excess_ms: float) -> bool:
    """True when the tail's mean gap is long enough to be a pool wait that explains part of its excess."""
    return tail_gap_ms >= MIN_TAIL_GAP_MS and tail_gap_ms >= MIN_SHARE_OF_EXCESS * excess_ms


def _mean(values: Sequence[float], cohort: Sequence[int]) -> float:
    return sum(values[i] for i in cohort) / len(cohort)


def _infer_pool_waits(timeline: Timeline, gaps: Sequence[GapBeforeDb | None], source: str, judged: Sequence[int],
                      groups: Cohorts, latencies: Sequence[float], not_ceiling: int | None = None) -> Timeline | None:  # fmt: skip
    """`infer_pool_waits` on the given gaps, read as `source`, whose cohorts (`groups`, taken among the requests at
    the indices `judged`) have a pool's shape (`_cohorts_shaped`); None when the holders do not (or their ceiling is
    `not_ceiling`)."""
    requests = timeline.requests
    if sum(gaps[i] is not None for i in judged) < 3:  # the cohorts' shape was judged by the caller
        return None
    tail_gap, median_gap = _mean_gap_ms(gaps, groups.tail), _mean_gap_ms(gaps, groups.median)
    found = [g for g in (gaps[i] for i in judged) if g is not None]
    waits = [(g.start_ns, g.end_ns) for g in found if g.gap_ns >= NS_PER_MS]
    holds = [(g.end_ns, g.hold_end_ns) for g in found]
    ceiling, share = holders_during(waits, holds)
    if ceiling < 1 or share < MIN_SHARE_AT_CEILING or ceiling == not_ceiling:
        return None
    attrs: dict[str, Any] = {
        INFERRED: True,
        INFERRED_FROM: source,
        INFERRED_CEILING: ceiling,
        INFERRED_AT_CEILING: round(share, 4),
        INFERRED_TAIL_GAP_MS: round(tail_gap, 3),
        INFERRED_MEDIAN_GAP_MS: round(median_gap, 3),
    }
    out: list[RequestTimeline] = []
    marked = set(judged)
    for i, (rt, g) in enumerate(zip(requests, gaps)):
        if g is None or g.gap_ns <= 0 or i not in marked:
            out.append(rt)
            continue
        first = g.first_db
        wait = Segment(rt.request.request_id, f"{first.segment_id}.pool_wait", first.parent_id, INFERRED_POOL_WAIT, DB_POOL,
                       g.start_ns, g.end_ns, first.pid, attrs)  # fmt: skip
        out.append(RequestTimeline(rt.request, rt.segments + (wait,)))
    return dataclasses.replace(timeline, requests=out)


# --- queueing in front of a service that runs at a fixed concurrency ------------------------------

#: A server span that starts within this long after another of its instance ended took that one's slot
#: (a sync worker's accept and parse of the next request: ~1.3 ms on an idle machine, 2-4 ms with its
#: cores busy). A downstream span whose caller waited longer is allowed a quarter of that wait.
HANDOFF_NS = 10_000_000
HANDOFF_SHARE_OF_WAIT = 0.25
#: An instance runs at a fixed concurrency when at least this many spans took a freed slot at its ceiling.
MIN_HANDOFFS = 3
#: Root spans of an instance that took a freed slot in at least this share: its requests queued before them.
MIN_ROOT_HANDOFF_SHARE = 0.3
QUEUE_SOURCE_DOWNSTREAM = "downstream"
SOURCE_DOWNSTREAM = (
    "the time from the caller's client span to the start of the called service's server span, that service"
    " running at a fixed concurrency with its spans back to back"
)
INFERRED_CONCURRENCY = "latprof.inferred.concurrency"
INFERRED_SERVICE = "latprof.inferred.service"


_START = operator.itemgetter(2)  # of a Request
_END = operator.itemgetter(3)


class _Slot:
    """A server span of one instance: a request's root or a downstream server segment."""

    __slots__ = ("start", "end", "request", "segment")

    def __init__(self, start: int, end: int, request: int, segment: Segment | None) -> None:
        self.start, self.end, self.request, self.segment = start, end, request, segment


def _in_use(starts: list[int], ends: list[int], t: int) -> int:
    """How many of the spans (their sorted starts and ends) were running at `t`."""
    return bisect.bisect_right(starts, t) - bisect.bisect_right(ends, t)


def _caller(slot: _Slot, timeline: Timeline) -> Segment | None:
    """The client segment a downstream server slot was called from (None for a root slot)."""
    if slot.segment is None:
        return None
    parent = slot.segment.parent_id
    return next((s for s in timeline.requests[slot.request].segments if s.segment_id == parent), None)


def _handoff_ns(slot: _Slot, timeline: Timeline) -> int:
    """How long after a slot freed a span may start and still count as having taken it."""
    caller = _caller(slot, timeline)
    if caller is None:
        return HANDOFF_NS
    return max(HANDOFF_NS, int((slot.start - caller.start_ns) * HANDOFF_SHARE_OF_WAIT))


def infer_queueing(timeline: Timeline) -> Timeline:
    """Queue time the traces show only by its shape: an instance whose server spans never run
    more than C at once and start back to back, each as another ends (it ran at a fixed
    concurrency, its requests waiting for a slot).

    - A downstream server span (below a caller's client span) that took a freed slot: the time
      from the client span's start to the server span's start is an inferred `queue` segment.
    - Root spans that took freed slots: their requests may have queued before the span began,
      time the traces cannot show - or a closed-loop load (each client sending its next request
      as its last one is answered) drove the service, which looks the same from its spans; a
      warning says both and what would measure it.
    """
    roots: dict[int, list[int]] = {}  # by instance: the indices of the requests whose roots ran there
    below: dict[int, list[_Slot]] = {}  # by instance: the downstream server spans that ran there
    instances: dict[int, None] = {}  # in the order first seen
    kind = SPAN_KIND
    requests = timeline.requests
    facts = timeline.span_facts  # when mapping noted which requests have a server span below the root, only theirs are read
    downstream = facts.downstream_servers if facts is not None else None
    for i, rt in enumerate(requests):
        request = rt.request  # fields by index (id 0, pid 4): this runs over every request and segment
        found = roots.get(request[4])
        if found is None:
            roots[request[4]] = [i]
            instances.setdefault(request[4])
        else:
            found.append(i)
        if downstream is not None and request[0] not in downstream:
            continue
        for s in rt.segments:
            # a downstream server span owns no layer: only those need their attributes read
            if s[4] is None and s[8].get(kind) == "server" and s[6] > s[5]:
                below.setdefault(s[7], []).append(_Slot(s[5], s[6], i, s))
                instances.setdefault(s[7])
    added: dict[int, list[Segment]] = {}
    warnings: list[str] = []
    right = bisect.bisect_right
    for pid in instances:
        root_indices = roots.get(pid, [])
        root_requests = [requests[i].request for i in root_indices]
        root_starts = list(map(_START, root_requests))
        downstream_slots = below.get(pid, [])
        if len(root_starts) + len(downstream_slots) < MIN_HANDOFFS:
            continue
        starts = sorted(root_starts + [s.start for s in downstream_slots])
        ends = sorted(list(map(_END, root_requests)) + [s.end for s in downstream_slots])
        # the most running at once is reached at some start: those started so far minus those ended (in C: this and
        # the roots' test below run over every request)
        ended = list(map(right, itertools.repeat(ends), starts))  # how many had ended at each start
        ceiling = max(map(operator.sub, range(1, len(starts) + 1), ended))
        # a span took a freed slot when it started within `_handoff_ns` (HANDOFF_NS or more) after another span of
        # its instance ended, with the instance at its ceiling until then; `before[j]` is the last of the first j
        # ends (the sentinel: none)
        before = [-(2**62), *ends]
        # (requests come by arrival: with no downstream span here, the roots' starts are `starts`, read once)
        root_ended = ended if not downstream_slots and starts == root_starts else map(right, itertools.repeat(ends), root_starts)
        last_ends = list(map(before.__getitem__, root_ended))
        close = itertools.compress(range(len(root_starts)), map(HANDOFF_NS.__ge__, map(operator.sub, root_starts, last_ends)))
        took = [_Slot(root_starts[k], root_requests[k][3], root_indices[k], None)
                for k in close if _in_use(starts, ends, last_ends[k] - 1) >= ceiling]  # fmt: skip
        for slot in downstream_slots:
            start = slot.start
            j = right(ends, start) - 1
            if j < 0:
                continue
            since = start - ends[j]
            if since > HANDOFF_NS and since > _handoff_ns(slot, timeline):
                continue
            if _in_use(starts, ends, ends[j] - 1) >= ceiling:
                took.append(slot)
        if len(took) < MIN_HANDOFFS:
            continue
        service = ""
        for slot in took:
            rt = timeline.requests[slot.request]
            if slot.segment is None:
                service = service or str(rt.request.attrs.get(SERVICE_NAME, ""))
                continue
            caller = _caller(slot, timeline)
            if caller is None or slot.segment.start_ns - caller.start_ns < NS_PER_MS:
                continue
            service = service or str(slot.segment.attrs.get(SERVICE_NAME, ""))
            attrs = {INFERRED: True, INFERRED_FROM: SOURCE_DOWNSTREAM, QUEUE_SOURCE: QUEUE_SOURCE_DOWNSTREAM,
                     INFERRED_CONCURRENCY: ceiling, INFERRED_SERVICE: service}  # fmt: skip
            added.setdefault(slot.request, []).append(
                Segment(rt.request.request_id, f"{slot.segment.segment_id}.queue", caller.segment_id, "queue (inferred)",
                        QUEUE, caller.start_ns, slot.segment.start_ns, slot.segment.pid, attrs)  # fmt: skip
            )
        root_took = [s for s in took if s.segment is None]
        if root_indices and len(root_took) >= MIN_HANDOFFS and len(root_took) >= MIN_ROOT_HANDOFF_SHARE * len(root_indices):
            warnings.append(
                f"{service or 'a service'}: {len(root_took) / len(root_indices):.0%} of its requests' spans started the moment"
                f" another ended, never more than {ceiling} at once: it ran at a fixed concurrency of {ceiling}. Either"
                " requests queued in front of it for a free worker - time these traces do not show (trace its callers,"
                f" or record it with `latprof run`, which times the accept backlog) - or a closed-loop load of {ceiling}"
                " clients drove it"
            )
    if not added and not warnings:
        return timeline
    requests = [
        RequestTimeline(rt.request, rt.segments + tuple(added[i])) if i in added else rt for i, rt in enumerate(timeline.requests)
    ]  # fmt: skip
    return dataclasses.replace(timeline, requests=requests, warnings=list(timeline.warnings) + warnings)
