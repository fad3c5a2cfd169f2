"""One request explained: its critical path by layer and by span, its longest uncovered gap, and
what a single request shows without a tail to compare it with.

A person who saved one slow trace from a trace UI asks "why was this request slow?". A tail
verdict needs 50 requests; one request still tells a lot, read as a careful engineer reads a
waterfall:

- **critical path**: at each instant the innermost span that was running and ends last owns
  the time (the rule of `latprof.analysis.requests.critical_path`, here over every span, layered
  or not), so each span's share of the request's latency is its own time on that path;
- **the longest uncovered gap**: the longest stretch of the path that no span with a layer
  covers, with the span it sits in and the spans on either side;
- **per-request findings** (`RequestFinding`), each marked inferred with what it was read from:
  - `sequential-calls` (N+1): three or more identical calls (same name, target and statement)
    under one parent, strictly one after another with no other call between them, whose
    parent could have run them at once or in one batch; the time a concurrent or a batched
    version would save. Never for calls that overlap (they already run concurrently) nor for
    different calls (each may need the last one's answer);
  - `timeout-masked`: a span that failed (an error status, HTTP 5xx or 408) after most of its
    time went to a span below it that did not fail: the failed one gave up (a proxy's route
    timeout), the one below used the budget;
  - `first-error`: several failed siblings under one parent: the first to fail is the likely
    cause, the later ones fallout; followed down to the deepest failed span below it. A failed
    call followed by the same call that succeeded was retried: not a failure of the request.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from latprof.analysis.inference import Inference
from latprof.analysis.requests import NS_PER_MS, NS_PER_S, layer_times_ms
from latprof.analysis.timeline import RequestTimeline
from latprof.events import Segment
from latprof.layers import DB_QUERY, TOOL
from latprof.semconv import ERROR_TYPE, SPAN_STATUS_ERROR

#: Spans listed on a request's critical path (the longest first).
TOP_SPANS = 5
#: Requests explained at most (the slowest first) when a file holds a handful.
MAX_EXPLAINED = 10
#: A run of identical sequential calls is an N+1 from this many calls on ...
MIN_SEQUENTIAL_CALLS = 3
#: ... when running them at once would save at least this share of the request's latency
#: (three quick cache reads in a 15 s request are not what made it slow).
MIN_SEQUENTIAL_SAVING_SHARE = 0.05
#: Layers of calls a parent could make concurrently or in one batch.
CALL_LAYERS = frozenset({DB_QUERY, TOOL})
#: A span below a failed one "used its budget" when it lasted at least this share of it ...
MASKED_SHARE = 0.9
#: ... and the failed span lasted at least this long (a fast failure masks nothing).
MIN_MASKED_MS = 100.0
#: HTTP statuses that are a caller giving up or a failure.
_TIMEOUT_STATUSES = frozenset({408, 504})
#: Confidence of the per-request inferences: what a trace shows, not a measurement of the cause.
SEQUENTIAL_CONFIDENCE = 0.6
MASKED_CONFIDENCE = 0.8
FIRST_ERROR_CONFIDENCE = 0.6
_MAX_DEPTH = 200

_STATUS_KEYS = ("http.response.status_code", "http.status_code")
_STATEMENT_KEYS = ("db.query.text", "db.statement", "db.query.summary", "db.operation.name", "db.operation")
_TARGET_KEYS = ("server.address", "net.peer.name", "peer.service", "db.system.name", "db.system", "rpc.service")


@dataclass(frozen=True)
class RequestFinding:
    """What one request shows by itself: `kind` (sequential-calls, timeout-masked, first-error),
    a sentence, a fix, the time at stake and the evidence (inferred, in `Inference`'s shape)."""

    kind: str
    summary: str
    fix: str
    confidence: float
    impact_ms: float
    evidence: Mapping[str, Any]
    severity: str = "warning"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "confidence": self.confidence,
            "impact_ms": round(self.impact_ms, 3),
            "summary": self.summary,
            "evidence": dict(self.evidence),
            "fix": self.fix,
        }


@dataclass(frozen=True)
class PathSpan:
    """A span's own time on the critical path."""

    segment_id: str
    name: str
    service: str
    layer: str | None
    ms: float
    share: float


@dataclass(frozen=True)
class Gap:
    """The longest stretch of the critical path no span with a layer covers."""

    ms: float
    start_offset_ms: float
    inside: str
    after: str | None
    before: str | None


@dataclass
class Explanation:
    """One request explained (report-v1 `requests[]`)."""

    request_id: str
    route: str
    service: str
    start_unix_s: float
    latency_ms: float
    status_code: int | None
    layers: dict[str, float]
    path: list[PathSpan]
    gap: Gap | None
    findings: list[RequestFinding] = field(default_factory=list)
    spans: int = 0

    def to_dict(self) -> dict[str, Any]:
        total = self.latency_ms or 1.0
        return {
            "request_id": self.request_id,
            "route": self.route,
            "service": self.service or None,
            "start_unix_s": self.start_unix_s,
            "latency_ms": round(self.latency_ms, 3),
            "status_code": self.status_code,
            "spans": self.spans,
            "critical_path": {
                "layers": [
                    {"layer": layer, "ms": round(ms, 3), "share": round(ms / total, 4)}
                    for layer, ms in sorted(self.layers.items(), key=lambda kv: -kv[1])
                ],
                "spans": [
                    {"span_id": p.segment_id, "name": p.name, "service": p.service or None, "layer": p.layer,
                     "ms": round(p.ms, 3), "share": round(p.share, 4)}
                    for p in self.path
                ],  # fmt: skip
            },
            "longest_gap": None if self.gap is None else {
                "ms": round(self.gap.ms, 3), "start_offset_ms": round(self.gap.start_offset_ms, 3),
                "inside": self.gap.inside, "after": self.gap.after, "before": self.gap.before,
            },  # fmt: skip
            "findings": [f.to_dict() for f in sorted(self.findings, key=lambda f: -f.impact_ms)],
        }


class _Tree:
    """A request's segments as a tree: children by parent (None: the request root), and the
    layer each segment's time counts as (its own, else its nearest layered ancestor's)."""

    def __init__(self, rt: RequestTimeline) -> None:
        self.rt = rt
        self.by_id: dict[str, Segment] = {s.segment_id: s for s in rt.segments}
        self.kids: dict[str | None, list[Segment]] = {}
        for segment in rt.segments:
            if segment.end_ns < segment.start_ns:
                continue
            parent = segment.parent_id if segment.parent_id in self.by_id and segment.parent_id != segment.segment_id else None
            self.kids.setdefault(parent, []).append(segment)
        for siblings in self.kids.values():
            siblings.sort(key=lambda s: (s.start_ns, s.end_ns))
        self._layers: dict[str, str | None] = {}
        self._keys: dict[int, tuple[Any, ...]] = {}

    def key(self, segment: Segment) -> tuple[Any, ...]:
        """`_call_key` of a segment, computed once."""
        key = self._keys.get(id(segment))
        if key is None:
            key = self._keys[id(segment)] = _call_key(segment)
        return key

    def layer_of(self, segment: Segment) -> str | None:
        """The layer a segment's time counts as: its own, else its nearest layered ancestor's."""
        cached = self._layers.get(segment.segment_id, "?")
        if cached != "?":
            return cached
        node: Segment | None = segment
        hops = 0
        layer = None
        while node is not None and hops < _MAX_DEPTH:
            if node.layer is not None:
                layer = node.layer
                break
            node = self.by_id.get(node.parent_id) if node.parent_id is not None else None
            hops += 1
        self._layers[segment.segment_id] = layer
        return layer

    def pieces(self) -> list[tuple[int, int, Segment | None]]:
        """The critical path as (start, end, owner) pieces, owner None for the root's own time:
        walking back from each node's end, the child that ends last among those started before
        the cursor owns the time from its start to the cursor; inside it, its children likewise."""
        out: list[tuple[int, int, Segment | None]] = []
        request = self.rt.request
        self._walk(None, request.start_ns, request.end_ns, out, 0)
        out.reverse()
        return out

    def _walk(self, node: Segment | None, start: int, end: int, out: list[tuple[int, int, Segment | None]], depth: int) -> None:
        cursor = end
        kids = self.kids.get(None if node is None else node.segment_id, ()) if depth < _MAX_DEPTH else ()
        for child in sorted(kids, key=lambda s: (s.end_ns, s.start_ns), reverse=True):
            if cursor <= start:
                break
            if child.start_ns >= cursor or child.end_ns <= child.start_ns:
                continue
            if child.end_ns < cursor:
                gap_start = max(child.end_ns, start)
                out.append((gap_start, cursor, node))
                cursor = gap_start
                if cursor <= start:
                    break
            owned_from = max(child.start_ns, start)
            self._walk(child, owned_from, cursor, out, depth + 1)
            cursor = owned_from
        if cursor > start:
            out.append((start, cursor, node))


def explain_requests(
    requests: Sequence[RequestTimeline], services: Mapping[int, str] | None = None, *, limit: int = MAX_EXPLAINED
) -> list[Explanation]:
    """Explain the slowest `limit` of `requests` (all of them when fewer), slowest first.

    `services` names the service of each instance number (a segment's `pid` in trace files)."""
    chosen = sorted(requests, key=lambda rt: -(rt.request.end_ns - rt.request.start_ns))[:limit]
    return [explain_request(rt, services or {}) for rt in chosen]


def explain_request(rt: RequestTimeline, services: Mapping[int, str]) -> Explanation:
    """One request's critical path, longest uncovered gap and findings (module docstring)."""
    request = rt.request
    tree = _Tree(rt)
    latency_ns = max(0, request.end_ns - request.start_ns)
    latency_ms = latency_ns / NS_PER_MS
    pieces = tree.pieces()

    def service_of(segment: Segment | None) -> str:
        if segment is None:
            return str(request.attrs.get("service.name") or services.get(request.pid, ""))
        return str(segment.attrs.get("service.name") or services.get(segment.pid, ""))

    own: dict[str, int] = {}
    for start, end, owner in pieces:
        if owner is not None and end > start:
            own[owner.segment_id] = own.get(owner.segment_id, 0) + (end - start)
    path = [
        PathSpan(sid, tree.by_id[sid].name, service_of(tree.by_id[sid]), tree.layer_of(tree.by_id[sid]), ns / NS_PER_MS,
                 ns / latency_ns if latency_ns else 0.0)
        for sid, ns in sorted(own.items(), key=lambda kv: -kv[1])[:TOP_SPANS]
    ]  # fmt: skip
    explanation = Explanation(
        request_id=request.request_id,
        route=request.route,
        service=service_of(None),
        start_unix_s=request.start_ns / NS_PER_S,
        latency_ms=latency_ms,
        status_code=request.status_code,
        layers={layer: round(ms, 3) for layer, ms in layer_times_ms(rt).items()},
        path=path,
        gap=_longest_gap(tree, pieces, service_of),
        spans=len(rt.segments),
    )
    explanation.findings.extend(_sequential_calls(tree, latency_ms, service_of))
    explanation.findings.extend(_timeouts_masked(tree, service_of))
    explanation.findings.extend(_first_errors(tree, service_of))
    return explanation


def _label(segment: Segment | None, service: str, route: str) -> str:
    if segment is None:
        return f"the request ({route})"
    return f"`{segment.name}`" + (f" in {service}" if service else "")


def _longest_gap(tree: _Tree, pieces: Sequence[tuple[int, int, Segment | None]], service_of: Any) -> Gap | None:
    """The longest piece of the path whose owner has no layer of its own or above it."""
    best: tuple[int, int, Segment | None] | None = None
    for start, end, owner in pieces:
        if end <= start or (owner is not None and tree.layer_of(owner) is not None):
            continue
        if best is None or end - start > best[1] - best[0]:
            best = (start, end, owner)
    if best is None:
        return None
    start, end, owner = best
    siblings = tree.kids.get(None if owner is None else owner.segment_id, [])
    before = [s for s in siblings if s.end_ns <= start]
    after = [s for s in siblings if s.start_ns >= end]
    previous = max(before, key=lambda s: s.end_ns) if before else None
    following = min(after, key=lambda s: s.start_ns) if after else None
    route = tree.rt.request.route
    return Gap(
        ms=(end - start) / NS_PER_MS,
        start_offset_ms=(start - tree.rt.request.start_ns) / NS_PER_MS,
        inside=_label(owner, service_of(owner), route),
        after=None if previous is None else _label(previous, service_of(previous), route),
        before=None if following is None else _label(following, service_of(following), route),
    )


def status_of(segment: Segment) -> int | None:
    """The HTTP status a span recorded (either convention, a number or a numeric string)."""
    for key in _STATUS_KEYS:
        value = segment.attrs.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int):
            return value
        if isinstance(value, str) and value.isdigit():
            return int(value)
    return None


def failed(segment: Segment) -> bool:
    """A span that failed: an error status, an `error.type`, or HTTP 5xx or 408."""
    if segment.attrs.get(SPAN_STATUS_ERROR) or segment.attrs.get(ERROR_TYPE):
        return True
    status = status_of(segment)
    return status is not None and (status >= 500 or status in _TIMEOUT_STATUSES)


def _how_failed(segment: Segment) -> str:
    status = status_of(segment)
    if status is not None and (status >= 500 or status in _TIMEOUT_STATUSES):
        return f"HTTP {status}"
    error = segment.attrs.get(ERROR_TYPE)
    return str(error) if error else "an error status"


def _call_key(segment: Segment) -> tuple[Any, ...]:
    """What makes two calls the same call: name, target and statement (hashed: it is compared, never shown)."""
    statement = next((segment.attrs[k] for k in _STATEMENT_KEYS if segment.attrs.get(k)), None)
    target = next((segment.attrs[k] for k in _TARGET_KEYS if segment.attrs.get(k)), None)
    url = segment.attrs.get("url.full") or segment.attrs.get("http.url") or segment.attrs.get("url.path")
    path = str(url).split("?", 1)[0] if url else None
    return (segment.name, segment.layer, str(target), hash(str(statement)) if statement is not None else None, path)


def _sequential_calls(tree: _Tree, latency_ms: float, service_of: Any) -> list[RequestFinding]:
    """N+1: runs of identical calls under one parent, one after another (module docstring)."""
    out: list[RequestFinding] = []
    for parent_id, siblings in tree.kids.items():
        calls = [s for s in siblings if s.layer in CALL_LAYERS and s.end_ns > s.start_ns]
        if len(calls) < MIN_SEQUENTIAL_CALLS:
            continue
        calls.sort(key=lambda s: (s.start_ns, s.end_ns))
        keys = [tree.key(call) for call in calls]
        # a key whose calls overlap anywhere under this parent runs concurrently already
        concurrent: set[tuple[Any, ...]] = set()
        last_end: dict[tuple[Any, ...], int] = {}
        for call, key in zip(calls, keys):
            if call.start_ns < last_end.get(key, call.start_ns):
                concurrent.add(key)
            last_end[key] = max(last_end.get(key, 0), call.end_ns)
        # runs: the same call back to back; a different call in between (maybe what the next one needs) ends a run
        start = 0
        for i in range(1, len(calls) + 1):
            if i < len(calls) and keys[i] == keys[start]:
                continue
            if i - start >= MIN_SEQUENTIAL_CALLS and keys[start] not in concurrent:
                finding = _sequential_finding(tree, parent_id, calls[start:i], latency_ms, service_of)
                if finding is not None:
                    out.append(finding)
            start = i
    return out


def _sequential_finding(tree: _Tree, parent_id: str | None, run: Sequence[Segment], latency_ms: float,
                        service_of: Any) -> RequestFinding | None:  # fmt: skip
    durations = [(s.end_ns - s.start_ns) / NS_PER_MS for s in run]
    span_ms = (run[-1].end_ns - run[0].start_ns) / NS_PER_MS
    saved_concurrent = span_ms - max(durations)
    saved_batched = span_ms - statistics.median(durations)
    if latency_ms <= 0 or saved_concurrent < MIN_SEQUENTIAL_SAVING_SHARE * latency_ms:
        return None
    parent = tree.by_id.get(parent_id) if parent_id is not None else None
    first = run[0]
    failures = sum(1 for s in run if failed(s))
    where = _label(parent, service_of(parent), tree.rt.request.route)
    summary = (
        f"{len(run)} calls to {_label(first, service_of(first), '')} under {where} ran one after another"
        f" ({span_ms:,.0f} ms, each {min(durations):,.1f}-{max(durations):,.1f} ms): an N+1. Run at once they would"
        f" take about {max(durations):,.0f} ms ({saved_concurrent:,.0f} ms saved); one batched call about"
        f" {statistics.median(durations):,.0f} ms"
    )
    summary += f"; {failures} of them failed and were called again." if failures else "."
    inference = Inference(
        "identical calls (same name, target and statement) back to back under one parent, none overlapping: "
        "independent unless each needs the last one's answer (a cursor, pagination)",
        {
            "calls": len(run),
            "failed_calls": failures,
            "sequential_ms": round(span_ms, 3),
            "call_ms_min": round(min(durations), 3),
            "call_ms_median": round(statistics.median(durations), 3),
            "call_ms_max": round(max(durations), 3),
            "saved_ms_if_concurrent": round(saved_concurrent, 3),
            "saved_ms_if_batched": round(saved_batched, 3),
            "span_ids": [s.segment_id for s in run],
        },
    )
    return RequestFinding(
        "sequential-calls",
        summary,
        "Fetch them in one batched call (an IN (...) query, MGET, a bulk endpoint; with an ORM, eager loading such as"
        " selectinload) or run them concurrently (asyncio.gather, a thread pool) when none needs another's answer.",
        SEQUENTIAL_CONFIDENCE,
        saved_concurrent,
        inference.evidence(),
    )


def _timeouts_masked(tree: _Tree, service_of: Any) -> list[RequestFinding]:
    """Failed spans whose time went to a span below them that did not fail."""
    out: list[RequestFinding] = []
    masked: set[str] = set()
    for segment in sorted(tree.rt.segments, key=lambda s: s.start_ns):
        if segment.segment_id in masked or not failed(segment):
            continue
        duration = segment.end_ns - segment.start_ns
        if duration < MIN_MASKED_MS * NS_PER_MS:
            continue
        node = segment
        chain: list[Segment] = []
        while len(chain) < _MAX_DEPTH:
            covering = [k for k in tree.kids.get(node.segment_id, ()) if k.end_ns - k.start_ns >= MASKED_SHARE * duration]
            if not covering:
                break
            node = max(covering, key=lambda k: k.end_ns - k.start_ns)
            chain.append(node)
        if not chain or failed(chain[-1]):
            continue  # nothing below used the time, or the failure came from below: not masked
        used = chain[-1]
        masked.update(s.segment_id for s in chain)
        used_ms = (used.end_ns - used.start_ns) / NS_PER_MS
        failed_ms = duration / NS_PER_MS
        after_ms = (used.end_ns - segment.end_ns) / NS_PER_MS
        below = tree.kids.get(used.segment_id, ())
        route = tree.rt.request.route
        summary = (
            f"{_label(segment, service_of(segment), route)} failed ({_how_failed(segment)}) after {failed_ms:,.0f} ms, but"
            f" the time went to {_label(used, service_of(used), route)} below it ({used_ms:,.0f} ms,"
            f" {'no error' if not failed(used) else 'failed'}"
            + (f", still running {after_ms:,.0f} ms after the failure" if after_ms > 1 else "")
            + "): the failure only reports the time that span used."
        )
        fix = (
            f"Look at what {_label(used, service_of(used), route)} waited on"
            + (" (nothing below it was traced: add spans to its calls, or run it under `latprof run`)" if not below else "")
            + ", not at the span that gave up; its timeout only reports the budget ran out."
        )
        inference = Inference(
            "a failed span whose time a span below it, that did not fail, used up",
            {
                "failed_span": segment.name,
                "failed_service": service_of(segment) or None,
                "failed_as": _how_failed(segment),
                "failed_ms": round(failed_ms, 3),
                "used_by_span": used.name,
                "used_by_service": service_of(used) or None,
                "used_ms": round(used_ms, 3),
                "share_of_failed": round(used_ms / failed_ms, 4) if failed_ms else None,
                "ended_after_failure_ms": round(max(0.0, after_ms), 3),
                "traced_below": len(below),
                "span_ids": [segment.segment_id, used.segment_id],
            },
        )
        out.append(RequestFinding("timeout-masked", summary, fix, MASKED_CONFIDENCE, used_ms, inference.evidence(), "critical"))
    return out


def _retried(tree: _Tree, calls: Sequence[Segment], siblings: Sequence[Segment]) -> set[int]:
    """The failed `calls` (by id) followed by the same call (name, target, statement) that did
    not fail among `siblings`: handled by a retry."""
    last_success: dict[tuple[Any, ...], int] = {}
    for sibling in siblings:
        if not failed(sibling):
            key = tree.key(sibling)
            last_success[key] = max(last_success.get(key, sibling.start_ns), sibling.start_ns)
    return {id(call) for call in calls if last_success.get(tree.key(call), -1) >= call.end_ns}


def _first_errors(tree: _Tree, service_of: Any) -> list[RequestFinding]:
    """Several failed siblings: the first to fail is the likely cause, followed down to the deepest failure."""
    out: list[RequestFinding] = []
    route = tree.rt.request.route
    for parent_id, siblings in tree.kids.items():
        failures = [s for s in siblings if failed(s)]
        if len(failures) < 2:
            continue
        retried = _retried(tree, failures, siblings)
        failures = sorted((s for s in failures if id(s) not in retried), key=lambda s: (s.end_ns, s.start_ns))
        if len(failures) < 2:
            continue
        first = failures[0]
        origin = first
        for _ in range(_MAX_DEPTH):
            below = sorted((k for k in tree.kids.get(origin.segment_id, ()) if failed(k)), key=lambda s: (s.end_ns, s.start_ns))
            if not below:
                break
            origin = below[0]
        parent = tree.by_id.get(parent_id) if parent_id is not None else None
        later = failures[1:]
        names = ", ".join(_label(s, service_of(s), route) for s in later[:3]) + (f" and {len(later) - 3} more" if len(later) > 3 else "")
        offset = (first.end_ns - tree.rt.request.start_ns) / NS_PER_MS
        summary = (
            f"{len(failures)} calls under {_label(parent, service_of(parent), route)} failed; the first to fail,"
            f" {_label(first, service_of(first), route)} ({_how_failed(first)} at +{offset:,.0f} ms)"
            + (f", failed because {_label(origin, service_of(origin), route)} did ({_how_failed(origin)})" if origin is not first else "")
            + f", is the likely cause; {names} failed after it: likely fallout."
        )
        inference = Inference(
            "the order in which sibling spans failed",
            {
                "failed_siblings": len(failures),
                "first_failed_span": first.name,
                "first_failed_service": service_of(first) or None,
                "first_failed_as": _how_failed(first),
                "origin_span": origin.name,
                "origin_service": service_of(origin) or None,
                "origin_failed_as": _how_failed(origin),
                "later_failed_spans": [s.name for s in later],
                "span_ids": [first.segment_id, origin.segment_id, *(s.segment_id for s in later)],
            },
        )
        out.append(RequestFinding(
            "first-error", summary,
            f"Start with {_label(origin, service_of(origin), route)}'s failure ({_how_failed(origin)}); the later"
            " failures may go away with it.",
            FIRST_ERROR_CONFIDENCE, (first.end_ns - first.start_ns) / NS_PER_MS, inference.evidence(),
        ))  # fmt: skip
    return out
