"""An asyncio event loop blocked by one request's own code, read from stock spans: every other request's spans
stretch across the stall and end together the moment the loop is released.

A sync call inside an `async def` endpoint (`time.sleep`, a sync SDK, driver or cache client, a
CPU-heavy chunk) holds the process's event loop: nothing else runs until it returns. Stock
instrumentations (FastAPI, httpx, SQLAlchemy, asyncpg, redis) record no span for it, and in the
other requests in flight it shows only as their spans taking longer - a provider call, a query -
so the stall is read as `provider` or `db.query`, or left `unattributed`. In the spans of one
process instance (the requests' `pid`: service, instance id, host and pid) a stall has this shape
(`candidate_stalls`, `is_stall`):

- **a quiet window**: at least `MIN_STALL_NS` in which no span of the instance started or ended
  (a running loop starts and ends spans; a blocked one cannot);
- **a request running its own code across it**: inside its server span, with none of its layered
  spans open (no call, no query awaited; its own layer-less spans, INTERNAL ones around its code,
  do not cut a window in a gap where nothing else happened), and its next step - a span's start
  or end, its response - is what ends the window: it resumed first, before any task the loop had
  to wake;
- **a common release**: spans of at least `MIN_RELEASED_REQUESTS` other requests were open
  across the window and all end within `RELEASE_NS` after it - whatever each awaited, it could
  resume only once the loop was free. Spans that merely run long for their own reasons (a slow
  provider, a slow query) end when their answers arrive, at no common moment, and a request that
  only awaited something unseen (`asyncio.sleep`, an uninstrumented client) wakes up on its own
  schedule, not first at the end of a quiet window just before everyone else; a fan-out
  (`asyncio.gather`) ends its calls together, but they are one request's.

A stall proves the loop was blocked (`proves_stall`) when what it released spans at least
`MIN_RELEASED_LAYERS` layers: one kind of wait ending together (a provider answering a batch, a
database lock released) may have its own reasons. A process stopped as a whole - a GC pause, its
CPU throttled or taken by other processes - leaves the same shape whenever it stops a request
between spans, and otherwise a freeze (`is_freeze`): the same release with no request resuming
first. So an instance is judged blocked (`find_stalls`) when, among the analysed requests (blocked
by requests after `warmup_s`, as the analysis keeps them), at least `MIN_STALLS` proving stalls
outnumber its freezes about as long `STALLS_PER_FREEZE` times over: a blocking call stalls the loop
every time it runs, and freezes, if any, come on their own. Then every window of that instance that
a request between spans ended by resuming first is a stall, whatever it released.

In each stall, each layered span of another request open across the window gets an inferred
`event_loop` child from the window's start (or its own, if later) until the span ended when it was
released with the others, else until the window's end (its answer came after: it waited for the
loop during the stall only), so that the child owns that time (report-v1: the innermost segment
owns it); each other request between spans across the window gets such a segment off its root
over its gap. This is how the `latprof run` hooks record a blocked loop: the whole overlap of a
request in flight with the stall counts as waiting for the loop, although its answer may have
arrived part-way through. The segments carry `latprof.inferred: true`, `latprof.inferred.from` and
the stall's numbers: the blocking request's route and id, the layer-less span its code ran in if
it had one (`blocking_span`: the code that blocked), the stall's length. The blocking request gets
a layer-less `held the event loop (inferred)` segment over the window, owning no time.

What it cannot see: requests that arrived during the stall (their server span starts when the
loop is released: the wait before it is invisible); a blocking call inside a span of its own (a
sync driver's query: the request is not between spans) or followed by an unseen await (it does
not resume first); stalls while every request in flight waited on one layer only (an LLM gateway
whose requests only call the provider); several worker processes exporting as one instance (no
`service.instance.id` or `process.pid` in their resource: one worker's stall is not quiet in the
others' spans); a downstream service's stalls, unless its requests are roots of their own;
stalls with fewer than `MIN_RELEASED_REQUESTS` other requests in flight; and a blocked loop in a
process that is also stopped as a whole about as often (a throttled CPU): its stalls prove nothing.
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
from collections import Counter
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from latprof.analysis.inference import INFERRED, INFERRED_FROM
from latprof.analysis.requests import skip_warmup
from latprof.analysis.timeline import RequestTimeline, Timeline
from latprof.collectors.traces.tracemap import SPAN_KIND
from latprof.events import Segment
from latprof.layers import EVENT_LOOP

#: A stall is a window at least this long in which no span of the instance started or ended: a
#: healthy loop under concurrent traffic starts or ends a span every few ms, and `PYTHONASYNCIODEBUG`
#: itself calls a callback slow from 100 ms; a 50 ms stall is already a p99 problem.
MIN_STALL_NS = 50_000_000
#: The released spans end within this long after the window: the loop resumes the waiting tasks one
#: after another, 1-3 ms each on an idle machine, up to ~10 ms each with the cores busy.
RELEASE_NS = 40_000_000
#: At least this many other requests' spans are released together ...
MIN_RELEASED_REQUESTS = 3
#: ... in at least this many layers (a provider that answers a batch at once releases one layer only).
MIN_RELEASED_LAYERS = 2
#: A process is judged blocked only with at least this many stalls among the analysed requests ...
MIN_STALLS = 3
#: ... outnumbering its freezes as long more than this many times over. A process stopped as a whole (a
#: GC pause, its CPU throttled or taken by other processes) stops whatever runs - now and then a request
#: between spans, which then resumes first, as a blocker does: recordings of a busy service on a loaded
#: 2-core machine showed 12 such "stalls" for 42 freezes (at most 3 for 2 in one). A blocking call stalls
#: the loop every time it runs, with no freeze like it.
STALLS_PER_FREEZE = 2
#: A window that looks like a stall but proves none (`possible_stalls`) counts only when at least this many
#: requests were due to arrive in it at the instance's mean rate and none did (chance: about e**-3, 5%).
MIN_MISSED_ARRIVALS = 3
#: When at least this share of the tail's time in a layer lies in possible stalls, that layer is believed at
#: most `POSSIBLE_STALL_CONFIDENCE` (under 0.5): a blocked loop stretches its spans the same way.
MIN_POSSIBLE_STALL_SHARE = 0.5
POSSIBLE_STALL_CONFIDENCE = 0.4

#: str on an inferred `event_loop` segment: the route of the request whose own code held the loop.
INFERRED_BLOCKED_BY = "latprof.inferred.blocked_by"
#: str: the layer-less span that request's code ran in during the stall (`blocking_span`), if any.
INFERRED_BLOCKING_SPAN = "latprof.inferred.blocking_span"
#: str: that request's id.
INFERRED_BLOCKING_REQUEST = "latprof.inferred.blocking_request"
#: float: the stall's length in ms (the quiet window).
INFERRED_STALL_MS = "latprof.inferred.stall_ms"
#: int: how many other requests' spans the release ended.
INFERRED_RELEASED = "latprof.inferred.released_requests"
#: int: how many stalls among the analysed requests released 2 or more layers (`proves_stall`).
INFERRED_STALLS = "latprof.inferred.stalls"
INFERRED_STALL = "event loop blocked by another request (inferred)"
INFERRED_HELD = "held the event loop (inferred)"
SOURCE_COMMON_RELEASE = (
    "the spans of 3 or more requests all ending within 40 ms after a quiet window of 50 ms or more that another"
    " request, running its own code with no span open, ended by resuming first"
)

_START = operator.itemgetter(5)
_LAYER = operator.itemgetter(4)
_PID = operator.itemgetter(4)
_REQUEST = operator.attrgetter("request")
_Window = tuple[int, int, int]  # (pid, start, end) of a quiet window
_Gap = tuple[int, int, int]  # (end, start, request index) of a request's own-code gap around it


@dataclasses.dataclass(frozen=True)
class Stall:
    """A quiet window of an instance, what its end released, and the request between spans across it if any."""

    pid: int
    start_ns: int
    end_ns: int
    #: The index (in the timeline's requests) of the request whose own code ran across the window (of
    #: several, the one that resumed first); None when every request in flight was inside a span.
    blocker: int | None
    #: True when that request's own next step ended the window (it resumed first, as a blocker does).
    resumed_first: bool
    #: (request index, span) of the other requests' spans open across the window that ended within
    #: `RELEASE_NS` after it (the innermost ones when nested).
    released: tuple[tuple[int, Segment], ...]
    #: (request index, gap start, gap end) of the other requests between spans across the window (ready
    #: to run, or awaiting something no span shows).
    waiting: tuple[tuple[int, int, int], ...] = ()

    @property
    def stall_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def released_requests(self) -> int:
        return len({i for i, _ in self.released})

    @property
    def released_layers(self) -> frozenset[str]:
        return frozenset(str(s[4]) for _, s in self.released)


class PossibleStall(NamedTuple):
    """A window that looks like a blocked event loop on an instance the stall inference did not judge
    blocked (`possible_stalls`): the verdict believes less a layer whose tail time lies mostly in such
    windows, since a blocked loop stretches every span in flight the same way."""

    pid: int
    start_ns: int
    end_ns: int
    #: The route of the request whose own code ran across the window.
    blocked_by: str


def possible_stall_caveat(requests: Sequence[RequestTimeline], layer: str, stalls: Sequence[PossibleStall]) -> str | None:
    """The sentence that says why `layer` is believed at most `POSSIBLE_STALL_CONFIDENCE`, when at least
    `MIN_POSSIBLE_STALL_SHARE` of the `requests`' (the tail's) time in it lies in possible stalls; else None."""
    if not stalls or layer == EVENT_LOOP:
        return None
    share = share_in_possible_stalls(requests, layer, stalls)
    if share < MIN_POSSIBLE_STALL_SHARE:
        return None
    routes = sorted({s.blocked_by for s in stalls if s.blocked_by})
    longest_ms = max(s.end_ns - s.start_ns for s in stalls) / 1e6
    return (
        f"{share:.0%} of the tail's {layer} time came while a request ({', '.join(routes[:3]) or 'no route'}) ran its own"
        f" code with no span open and no other span of its process started or ended, nor a request arrived (inferred"
        f" from {len(stalls)} window(s) of up to {longest_ms:,.0f} ms): a blocked event loop (a sync call in async code)"
        " stretches every span in flight the same way, and too few requests were in flight to prove it - `latprof run`"
        " (its event-loop hook) would tell"
    )


def own_code_gaps(rt: RequestTimeline, min_ns: int = MIN_STALL_NS) -> list[tuple[int, int]]:
    """The [start, end) intervals of at least `min_ns` inside the request's root in which none of its
    layered segments was open: it ran its own code (or awaited something no span shows)."""
    request = rt.request
    start, end = request[2], request[3]
    out: list[tuple[int, int]] = []
    if end - start < min_ns:
        return out
    cursor = start
    for s in sorted(rt.segments, key=_START):
        if s[4] is None:
            continue
        if s[5] - cursor >= min_ns:
            out.append((cursor, s[5]))
        if s[6] > cursor:
            cursor = s[6]
    if end - cursor >= min_ns:
        out.append((cursor, end))
    return out


def find_stalls(timeline: Timeline, warmup_s: float = 0.0) -> tuple[list[Stall], int]:
    """(the stalls to infer, how many proved them): every stall (`is_stall`) of each instance judged
    blocked, and the number of proving stalls (`proves_stall`) in the analysed requests (blocked by a
    request after `warmup_s`, as `skip_warmup` keeps them) of those instances; ([], 0) when none is.

    An instance is judged blocked when, of the windows at least half as long as its median proving
    stall, at least `MIN_STALLS` proving stalls outnumber its freezes (`is_freeze`) in the analysed
    requests `STALLS_PER_FREEZE` times over. Its stalls are then all the windows a request between spans
    ended by resuming first, whatever they released."""
    stalls, judged, _ = _judge(candidate_stalls(timeline), timeline, warmup_s)
    return stalls, judged


def _judge(windows: list[Stall], timeline: Timeline, warmup_s: float) -> tuple[list[Stall], int, set[int]]:
    """`find_stalls` on the candidate `windows`, and the instances judged blocked."""
    if not windows:
        return [], 0, set()
    requests = timeline.requests
    kept = {id(rt) for rt in skip_warmup(requests, warmup_s)[0]}
    proving: dict[int, list[int]] = {}  # by instance: the lengths of the proving stalls and of the freezes
    freezes: dict[int, list[int]] = {}
    for c in windows:
        if proves_stall(c) and c.blocker is not None and id(requests[c.blocker]) in kept:
            proving.setdefault(c.pid, []).append(c.stall_ns)
        elif is_freeze(c) and any(id(requests[i]) in kept for i, _ in c.released):
            freezes.setdefault(c.pid, []).append(c.stall_ns)
    judged = 0
    blocked = set()
    for pid, lengths in proving.items():
        lengths.sort()
        at_least = lengths[len(lengths) // 2] // 2
        stalls = sum(1 for n in lengths if n >= at_least)
        frozen = sum(1 for n in freezes.get(pid, ()) if n >= at_least)
        if stalls >= MIN_STALLS and stalls > STALLS_PER_FREEZE * frozen:
            blocked.add(pid)
            judged += len(lengths)
    if not blocked:
        return [], 0, blocked
    stalls_of_blocked = [c for c in windows if c.pid in blocked and c.resumed_first]
    return sorted(stalls_of_blocked, key=lambda c: (c.pid, c.start_ns)), judged, blocked


def possible_stalls(windows: Sequence[Stall], timeline: Timeline, blocked: Iterable[int] = (),
                    warmup_s: float = 0.0) -> tuple[PossibleStall, ...]:  # fmt: skip
    """The windows of instances not judged blocked that still look like a blocked loop, too few of them or
    with too few requests in flight to prove it (`PossibleStall`): a request running its own code across
    the window resumed first and another request's span ended right after (`Stall.resumed_first`), and the
    window is long enough that its quiet means something: no request of the instance began in it (no span
    did) although at least `MIN_MISSED_ARRIVALS` were due at its mean arrival rate. A request that awaits
    something unseen leaves the loop free, and requests keep arriving: at a few a second, a quiet 300 ms
    is chance; at 16 a second it is not. Only the windows of requests after `warmup_s` (as `skip_warmup` keeps
    them) count."""
    judged = set(blocked)
    shaped = [c for c in windows if c.resumed_first and c.blocker is not None and c.pid not in judged]
    if not shaped:
        return ()
    kept = {id(rt) for rt in skip_warmup(timeline.requests, warmup_s)[0]}
    shaped = [c for c in shaped if c.blocker is not None and id(timeline.requests[c.blocker]) in kept]
    arrivals: dict[int, list[int]] = {}
    for rt in timeline.requests:
        arrivals.setdefault(rt.request[4], []).append(rt.request[2])
    out = []
    for c in shaped:
        starts = arrivals.get(c.pid, [])
        if len(starts) < 2 or starts[-1] <= starts[0]:
            continue
        gap_ns = (starts[-1] - starts[0]) / (len(starts) - 1)  # requests are sorted by arrival
        if c.stall_ns < MIN_MISSED_ARRIVALS * gap_ns:
            continue
        blocker = timeline.requests[c.blocker] if c.blocker is not None else None
        out.append(PossibleStall(c.pid, c.start_ns, c.end_ns, blocker.request.route if blocker is not None else ""))
    return tuple(sorted(out))


def share_in_possible_stalls(requests: Iterable[RequestTimeline], layer: str, stalls: Sequence[PossibleStall]) -> float:
    """The share of the requests' time in `layer` segments that lies inside the possible stalls of their
    instance (0.0 when they have none)."""
    by_pid: dict[int, list[PossibleStall]] = {}
    for stall in stalls:
        by_pid.setdefault(stall.pid, []).append(stall)
    starts = {pid: [s.start_ns for s in found] for pid, found in by_pid.items()}
    total = inside = 0
    for rt in requests:
        for s in rt.segments:
            if s[4] != layer or s[6] <= s[5]:
                continue
            total += s[6] - s[5]
            found = by_pid.get(s[7])
            if found is None:
                continue
            j = max(0, bisect.bisect_right(starts[s[7]], s[5]) - 1)  # disjoint, by start
            while j < len(found) and found[j].start_ns < s[6]:
                inside += max(0, min(s[6], found[j].end_ns) - max(s[5], found[j].start_ns))
                j += 1
    return inside / total if total else 0.0


def is_stall(candidate: Stall) -> bool:
    """True when a quiet window has a stall's shape: the request between spans across it resumed first,
    and the spans of at least `MIN_RELEASED_REQUESTS` other requests ended right after it."""
    return candidate.resumed_first and candidate.released_requests >= MIN_RELEASED_REQUESTS


def proves_stall(candidate: Stall) -> bool:
    """True for a stall (`is_stall`) that released at least `MIN_RELEASED_LAYERS` layers: spans that only
    one kind of wait ended (a batch of answers, a lock released in the database) may have ended together
    for their own reasons. Once an instance has enough of these, its other stalls are read the same way."""
    return is_stall(candidate) and len(candidate.released_layers) >= MIN_RELEASED_LAYERS


def is_freeze(candidate: Stall) -> bool:
    """True for a quiet window whose end released what a proving stall releases, with no request between
    spans across it that resumed first: the whole process stopped (a GC pause, its CPU taken away), or
    the loop was blocked where no span shows it."""
    return (not candidate.resumed_first and candidate.released_requests >= MIN_RELEASED_REQUESTS
            and len(candidate.released_layers) >= MIN_RELEASED_LAYERS)  # fmt: skip


def candidate_stalls(timeline: Timeline) -> list[Stall]:
    """Every quiet window of an instance that has a request's own-code gap (`own_code_gaps`) whose end
    released at least one other request's span, with or without a request between spans across it
    (`Stall.blocker`), in no particular order."""
    requests = timeline.requests
    # a stall needs a blocker and MIN_RELEASED_REQUESTS others on one instance; the sweep below is
    # `own_code_gaps` inlined: it runs over every segment of every request, the cost of this step
    instances = {pid for pid, n in Counter(map(_PID, map(_REQUEST, requests))).items() if n > MIN_RELEASED_REQUESTS}
    if not instances:
        return []
    gaps: dict[int, list[tuple[int, int, int]]] = {}  # by instance: (gap start, gap end, request index)
    min_ns = MIN_STALL_NS
    for i, rt in enumerate(requests):
        request = rt.request
        start, end = request[2], request[3]
        if end - start < min_ns or request[4] not in instances:
            continue
        cursor = start
        for s in sorted(filter(_LAYER, rt.segments), key=_START):  # the layered ones (a layer is a non-empty name)
            if s[5] - cursor >= min_ns:
                gaps.setdefault(request[4], []).append((cursor, s[5], i))
            if s[6] > cursor:
                cursor = s[6]
        if end - cursor >= min_ns:
            gaps.setdefault(request[4], []).append((cursor, end, i))
    if not gaps:
        return []
    marks = _marks(requests, gaps.keys())
    windows: dict[_Window, list[_Gap]] = {}
    for pid, points in marks.items():
        quiet = [(a, b) for a, b in zip(points, points[1:]) if b - a >= min_ns]  # where nothing at all happened
        for a, b in quiet:
            windows[pid, a, b] = []
        quiet_starts = [a for a, _ in quiet]
        for g0, g1, i in gaps.get(pid, ()):  # where nothing happened but one request's own code
            for a, b in _quiet_in_gap(points, quiet, quiet_starts, g0, g1, requests[i], pid):
                windows.setdefault((pid, a, b), []).append((g1, g0, i))
    return _released(requests, _disjoint(windows))


def _disjoint(windows: dict[_Window, list[_Gap]]) -> dict[_Window, list[_Gap]]:
    """The windows without those overlapping a better one of their instance - one with a request between
    spans across it over one without, else the longer - whose requests between spans it takes over (a gap
    that does not start or end at a mark of the instance, or that only its own layer-less spans cut, sees
    the instance's quiet window clipped or joined)."""
    kept: dict[_Window, list[_Gap]] = {}
    last: dict[int, _Window] = {}
    for key in sorted(windows):
        pid, a, b = key
        gaps = windows[key]
        before = last.get(pid)
        if before is not None and a < before[2]:
            if (bool(gaps), b - a) <= (bool(kept[before]), before[2] - before[1]):
                kept[before] = kept[before] + [g for g in gaps if g not in kept[before]]
                continue
            gaps = gaps + [g for g in kept.pop(before) if g not in gaps]
        kept[key] = gaps
        last[pid] = key
    return kept


def _marks(requests: Sequence[RequestTimeline], pids: Iterable[int]) -> dict[int, list[int]]:
    """The sorted times at which a span of each instance in `pids` started or ended (roots included)."""
    marks: dict[int, list[int]] = {pid: [] for pid in pids}
    for rt in requests:
        request = rt.request
        own = marks.get(request[4])
        if own is not None:
            own.append(request[2])
            own.append(request[3])
        for s in rt.segments:
            points = marks.get(s[7])
            if points is not None:
                points.append(s[5])
                points.append(s[6])
    for points in marks.values():
        points.sort()
    return marks


def _quiet_in_gap(points: list[int], quiet: list[tuple[int, int]], quiet_starts: list[int], g0: int, g1: int,
                  rt: RequestTimeline, pid: int) -> list[tuple[int, int]]:  # fmt: skip
    """The quiet windows inside the request's gap [g0, g1]: the whole gap when nothing but the request's
    own layer-less spans (INTERNAL ones around its code) started or ended in it, else the instance's quiet
    windows (`quiet`, between consecutive `points`, starting at `quiet_starts`) clipped to the gap. A few
    bisections per gap, not a walk over the marks inside it (a gap around an uninstrumented call holds
    every other request's marks meanwhile)."""
    inside = bisect.bisect_left(points, g1) - bisect.bisect_right(points, g0)
    if 0 < inside <= 2 * len(rt.segments):
        own = sum(1 for s in rt.segments if s[4] is None and s[7] == pid for t in (s[5], s[6]) if g0 < t < g1)
        if own == inside:
            return [(g0, g1)] if g1 - g0 >= MIN_STALL_NS else []
    out: list[tuple[int, int]] = []
    j = max(0, bisect.bisect_right(quiet_starts, g0) - 1)
    while j < len(quiet) and quiet[j][0] < g1:
        a, b = max(quiet[j][0], g0), min(quiet[j][1], g1)
        if b - a >= MIN_STALL_NS:
            out.append((a, b))
        j += 1
    return out


def _released(requests: Sequence[RequestTimeline], windows: Mapping[_Window, list[_Gap]]) -> list[Stall]:
    """Each window whose end released another request's span, with what it released."""
    by_pid: dict[int, list[_Window]] = {}
    for key in windows:
        by_pid.setdefault(key[0], []).append(key)
    for keys in by_pid.values():
        keys.sort(key=lambda key: key[2])
    window_ends = {pid: [key[2] for key in keys] for pid, keys in by_pid.items()}
    hits: dict[_Window, list[tuple[int, Segment]]] = {}
    for i, rt in enumerate(requests):
        for s in rt.segments:
            if s[4] is None:
                continue
            at = window_ends.get(s[7])
            if at is None:
                continue
            j = bisect.bisect_right(at, s[6]) - 1
            if j < 0 or s[6] - at[j] > RELEASE_NS:
                continue
            key = by_pid[s[7]][j]
            if s[5] <= key[1]:
                hits.setdefault(key, []).append((i, s))
    stalls = []
    for key, released in hits.items():
        pid, a, b = key
        gaps = sorted(windows[key])
        blocker: int | None = None
        first = False
        waiting: tuple[tuple[int, int, int], ...] = ()
        if gaps:
            # of the requests between spans across it, the one whose next step (or own span's start or end)
            # ended the window resumed first; without one, the one that resumed soonest after
            resumed = [g for g in gaps if g[0] == b or _marks_at(requests[g[2]], pid, b)]
            first = bool(resumed)
            blocker = (resumed or gaps)[0][2]
            waiting = tuple((i, g0, g1) for g1, g0, i in gaps if i != blocker)
        others = [(i, s) for i, s in released if i != blocker]
        if others:
            stalls.append(Stall(pid, a, b, blocker, first, tuple(_innermost(others)), waiting))
    return stalls


def _marks_at(rt: RequestTimeline, pid: int, t: int) -> bool:
    """True when one of the request's own layer-less spans on the instance started or ended at `t`."""
    return any(s[4] is None and s[7] == pid and (s[5] == t or s[6] == t) for s in rt.segments)


def _innermost(released: list[tuple[int, Segment]]) -> list[tuple[int, Segment]]:
    """The released spans without those that enclose another released span of their request (its parent's)."""
    parents = {(i, s[2]) for i, s in released if s[2] is not None}
    return [(i, s) for i, s in released if (i, s[1]) not in parents]


def blocking_span(rt: RequestTimeline, stall: Stall) -> Segment | None:
    """The blocking request's span its own code ran in during the stall: of its layer-less spans on the
    instance (INTERNAL ones around its code; not a server span below it, another service's) that
    overlap at least half the window, the one that overlaps most (the innermost on a tie); or None."""
    best: Segment | None = None
    best_ns = stall.stall_ns // 2
    for s in rt.segments:
        if s[4] is not None or s[7] != stall.pid or s[8].get(SPAN_KIND) == "server":
            continue
        overlap = min(s[6], stall.end_ns) - max(s[5], stall.start_ns)
        if overlap > best_ns or (overlap == best_ns and (best is None or s[5] > best[5])):
            best, best_ns = s, overlap
    return best


def infer_event_loop_stalls(timeline: Timeline, warmup_s: float = 0.0) -> Timeline:
    """The timeline with inferred `event_loop` segments where the stalls of the instances judged blocked
    (`find_stalls`: after `warmup_s`) held the other requests in flight (module docstring); else the same
    timeline."""
    windows = candidate_stalls(timeline)
    stalls, judged, blocked = _judge(windows, timeline, warmup_s)
    possible = possible_stalls(windows, timeline, blocked, warmup_s)
    if possible:
        timeline = dataclasses.replace(timeline, possible_stalls=possible)
    if not stalls:
        return timeline
    requests = timeline.requests
    added: dict[int, list[Segment]] = {}
    waited = _waited(requests, stalls)
    for k, stall in enumerate(stalls):
        if stall.blocker is None:  # (a stall has one)
            continue
        blocker = requests[stall.blocker]
        held_in = blocking_span(blocker, stall)
        attrs: dict[str, Any] = {INFERRED: True, INFERRED_FROM: SOURCE_COMMON_RELEASE,
                                 INFERRED_BLOCKED_BY: blocker.request.route,
                                 INFERRED_BLOCKING_REQUEST: blocker.request.request_id,
                                 INFERRED_STALL_MS: round(stall.stall_ns / 1e6, 3),
                                 INFERRED_RELEASED: stall.released_requests, INFERRED_STALLS: judged}  # fmt: skip
        if held_in is not None:
            attrs[INFERRED_BLOCKING_SPAN] = held_in.name
        rid = blocker.request.request_id
        added.setdefault(stall.blocker, []).append(
            Segment(rid, f"{rid}.held_loop.{k}", held_in.segment_id if held_in is not None else None, INFERRED_HELD,
                    None, stall.start_ns, stall.end_ns, stall.pid, attrs)  # fmt: skip
        )
        released_by = stall.end_ns + RELEASE_NS
        for i, span in waited.get(k, ()):  # under the span it waited in, which owns the time
            until = span.end_ns if span.end_ns <= released_by else stall.end_ns
            added.setdefault(i, []).append(
                Segment(span.request_id, f"{span.segment_id}.loop_stall.{k}", span.segment_id, INFERRED_STALL, EVENT_LOOP,
                        max(stall.start_ns, span.start_ns), until, span.pid, attrs)  # fmt: skip
            )
        for i, gap_start, gap_end in stall.waiting:  # between spans: the wait hangs off the root
            rid = requests[i].request.request_id
            until = gap_end if gap_end <= released_by else stall.end_ns
            added.setdefault(i, []).append(
                Segment(rid, f"{rid}.loop_stall.{k}", None, INFERRED_STALL, EVENT_LOOP, max(stall.start_ns, gap_start),
                        until, stall.pid, attrs)  # fmt: skip
            )
    out = [RequestTimeline(rt.request, rt.segments + tuple(added[i])) if i in added else rt for i, rt in enumerate(requests)]
    return dataclasses.replace(timeline, requests=out)


def _waited(requests: Sequence[RequestTimeline], stalls: Sequence[Stall]) -> dict[int, list[tuple[int, Segment]]]:
    """By stall (its index in `stalls`, sorted by instance and start, disjoint): (request index, span) of each
    layered span of another request open across it - the innermost ones when nested. Each waited for the
    loop during the stall, whether its answer arrived then (a released span) or only after."""
    by_pid: dict[int, list[int]] = {}
    for k, stall in enumerate(stalls):
        by_pid.setdefault(stall.pid, []).append(k)
    starts = {pid: [stalls[k].start_ns for k in ks] for pid, ks in by_pid.items()}
    found: dict[int, list[tuple[int, Segment]]] = {}
    for i, rt in enumerate(requests):
        for s in rt.segments:
            if s[4] is None:
                continue
            ks = by_pid.get(s[7])
            if ks is None:
                continue
            at = starts[s[7]]
            j = bisect.bisect_left(at, s[5])
            while j < len(ks) and stalls[ks[j]].end_ns <= s[6]:  # disjoint, by start: those it covers are in a row
                if stalls[ks[j]].blocker != i:
                    found.setdefault(ks[j], []).append((i, s))
                j += 1
    return {k: _innermost(spans) for k, spans in found.items()}
