"""What the HTML report draws besides the report itself: example requests as waterfalls, and the
tail's layers window by window.

`build_pictures` reads a finished diagnosis and keeps only what a picture needs - a handful of
requests, a bounded number of segments each, one row per time window - so the page of a
100k-request capture stays small. Renderers draw it; they compute nothing.

Attributes are copied from an allowlist (`SHARED_ATTRIBUTES`): the file is made to be shared, so
statements and URLs (`WITH_INCLUDE_ATTRIBUTES`) come only when asked for (`--include-attributes`),
and prompts, completions, parameters and headers never (latprof does not record them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from latprof.analysis.requests import NS_PER_MS, NS_PER_S, Analysis, Piece, critical_path
from latprof.analysis.timeline import RequestTimeline
from latprof.events import Segment
from latprof.layers import effective_layer

if TYPE_CHECKING:
    from latprof.pipeline import Diagnosis
    from latprof.report.model import Report

#: Tail requests drawn at most (the findings' examples first, then the slowest).
MAX_TAIL_EXAMPLES = 5
#: Segments drawn per request at most (the longest); the rest are counted, not drawn.
MAX_BARS = 300
#: Stretches of a critical path drawn at most: beyond, neighbours of one layer merge, then the
#: path is drawn at this many equal steps (each the layer that owned most of it).
MAX_PIECES = 480
#: A value longer than this is cut (an attribute is for reading, not for copying a payload).
MAX_VALUE_CHARS = 160

#: Attributes shown with a segment in every HTML report: what kind of call it was and how it
#: went, never what it carried.
SHARED_ATTRIBUTES: frozenset[str] = frozenset({
    "db.system", "db.system.name", "db.operation", "db.operation.name", "db.collection.name", "db.namespace",
    "db.query.summary", "server.address", "server.port", "network.peer.address", "peer.service",
    "http.request.method", "http.method", "http.route", "http.response.status_code", "http.status_code",
    "error.type", "otel.status_code", "rpc.system", "rpc.service", "rpc.method", "messaging.system",
    "gen_ai.system", "gen_ai.provider.name", "gen_ai.operation.name", "gen_ai.request.model", "gen_ai.response.model",
    "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.response.finish_reasons", "gen_ai.tool.name",
    "gen_ai.request.max_tokens", "gen_ai.request.stream",
    "pool.name", "db.client.connection.pool.name", "thread.name", "code.function", "code.namespace",
})  # fmt: skip
#: Attributes that may hold what a request carried (a statement's text, a URL's query string):
#: shown only with `--include-attributes`.
WITH_INCLUDE_ATTRIBUTES: frozenset[str] = frozenset({
    "db.query.text", "db.statement", "url.full", "url.query", "url.path", "http.url", "http.target",
})  # fmt: skip
#: latprof's own attributes (`latprof.*`) are shown too, but for these, which name a call's text.
_OWN_HIDDEN_PREFIXES = ("latprof.statement", "latprof.query", "latprof.url")


@dataclass(frozen=True, slots=True)
class Bar:
    """One segment drawn: where it sits in its request (ms from the request's start), how deep it
    nests, the layer its time counts as (its own, absorbed by a more specific enclosing one, or
    its nearest layered ancestor's; None when nothing above it has a layer) and its attributes."""

    name: str
    layer: str | None
    start_ms: float
    end_ms: float
    depth: int
    attrs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class PathPiece:
    """A stretch of the critical path (ms from the request's start) and who owns it: the layer,
    or None for time no segment covers (the request's own code, or nothing collected saw it)."""

    start_ms: float
    end_ms: float
    layer: str | None
    name: str


@dataclass(frozen=True)
class Waterfall:
    """One request drawn: `role` "tail" (an example of the slowest 1%), "median" (a typical one) or
    "explained" (one of the requests a report explains one by one)."""

    role: str
    request_id: str
    route: str
    latency_ms: float
    #: Milliseconds per layer on its critical path, as the analysis counted them (sums to latency).
    layers_ms: dict[str, float]
    path: list[PathPiece]
    bars: list[Bar]
    #: Segments not drawn (beyond `MAX_BARS`).
    not_drawn: int = 0


@dataclass(frozen=True, slots=True)
class TailWindow:
    """One time window: its requests, their p99, and the mean time per layer of its slowest 1%
    (the requests at or above the window's p99, at least one), which add up to their latency."""

    start_unix_s: float
    end_unix_s: float
    requests: int
    p99_ms: float | None
    tail_requests: int
    tail_layers_ms: dict[str, float]


@dataclass(frozen=True)
class Pictures:
    waterfalls: list[Waterfall]
    windows: list[TailWindow]
    #: Whether statements and URLs were included (`--include-attributes`).
    include_attributes: bool = False


def with_pictures(diagnosis: Diagnosis, report: Report | None = None, *, include_attributes: bool = False) -> Report:
    """`report` (default: the diagnosis's own) with its pictures, for the HTML renderer."""
    base = diagnosis.report if report is None else report
    return dataclasses.replace(base, pictures=build_pictures(diagnosis.analysis, base, include_attributes=include_attributes))


def build_pictures(analysis: Analysis | None, report: Report, *, include_attributes: bool = False) -> Pictures:
    """The waterfalls and tail windows of a request analysis; empty ones for an attach capture
    (no analysis: its per-second timeline is in the report itself)."""
    if analysis is None:
        return Pictures([], [], include_attributes)
    if report.requests is not None:  # too few for a verdict, or one trace picked: the requests explained
        analysed = {rt.request.request_id: rt for rt in analysis.requests}
        timeline = {rt.request.request_id: rt for rt in analysis.timeline.requests}
        waterfalls = [
            _waterfall(rt, "explained", e.latency_ms, e.layers, include_attributes)
            for e in report.requests
            if (rt := analysed.get(e.request_id) or timeline.get(e.request_id)) is not None
        ]
        return Pictures(waterfalls, tail_windows(analysis), include_attributes)
    waterfalls = [
        _waterfall(analysis.requests[i], role, analysis.latencies_ms[i], analysis.breakdowns[i], include_attributes)
        for i, role in _chosen(analysis, report)
    ]
    return Pictures(waterfalls, tail_windows(analysis), include_attributes)


def _chosen(analysis: Analysis, report: Report) -> list[tuple[int, str]]:
    """(request index, role): the findings' example requests, then the slowest of the tail
    cohort, up to `MAX_TAIL_EXAMPLES`; then the request closest to the median cohort's middle."""
    index = {rt.request.request_id: i for i, rt in enumerate(analysis.requests)}
    tail: list[int] = []
    for finding in report.findings:
        for request_id in finding.evidence.get("example_request_ids") or ():
            i = index.get(str(request_id))
            if i is not None and i not in tail:
                tail.append(i)
    slowest = analysis.distinct("tail") + analysis.distinct("tail5")
    by_latency = sorted(slowest or range(len(analysis.requests)), key=lambda i: -analysis.latencies_ms[i])
    for i in by_latency:
        if len(tail) >= MAX_TAIL_EXAMPLES:
            break
        if i not in tail:
            tail.append(i)
    tail = sorted(tail[:MAX_TAIL_EXAMPLES], key=lambda i: -analysis.latencies_ms[i])
    out = [(i, "tail") for i in tail]
    median = analysis.distinct("median")
    if median:
        middle = sorted(median, key=lambda i: analysis.latencies_ms[i])[len(median) // 2]
        if middle not in tail:
            out.append((middle, "median"))
    return out


def _waterfall(rt: RequestTimeline, role: str, latency_ms: float, layers_ms: Mapping[str, float], include_attributes: bool) -> Waterfall:
    start = rt.request.start_ns
    bars = _bars(rt, include_attributes)
    not_drawn = max(0, len(bars) - MAX_BARS)
    if not_drawn:
        longest = sorted(range(len(bars)), key=lambda k: -(bars[k].end_ms - bars[k].start_ms))[:MAX_BARS]
        bars = [bars[k] for k in sorted(longest)]
    pieces: list[Piece] = []
    critical_path(rt, pieces)
    names = {s.segment_id: s.name for s in rt.segments}
    path = _fewer_pieces([
        PathPiece(_ms(a - start), _ms(b - start), layer, "" if owner is None else names.get(owner, ""))
        for a, b, layer, owner in reversed(pieces)
        if b > a
    ])  # fmt: skip
    return Waterfall(role, rt.request.request_id, rt.request.route, latency_ms, {k: round(v, 3) for k, v in layers_ms.items()},
                     path, bars, not_drawn)  # fmt: skip


def _fewer_pieces(path: list[PathPiece]) -> list[PathPiece]:
    """`path` with at most `MAX_PIECES` stretches: neighbours of one layer merged (named for the
    segment when they share one), then, if still too many, the path at `MAX_PIECES` equal steps."""
    if len(path) <= MAX_PIECES:
        return path
    merged: list[PathPiece] = []
    for piece in path:
        last = merged[-1] if merged else None
        if last is not None and last.layer == piece.layer:
            merged[-1] = PathPiece(last.start_ms, piece.end_ms, last.layer, last.name if last.name == piece.name else "")
        else:
            merged.append(piece)
    if len(merged) <= MAX_PIECES:
        return merged
    start, end = merged[0].start_ms, merged[-1].end_ms
    step = (end - start) / MAX_PIECES
    steps: list[PathPiece] = []
    k = 0
    for n in range(MAX_PIECES):
        lo, hi = start + n * step, start + (n + 1) * step
        owned: dict[str | None, float] = {}
        while k < len(merged) and merged[k].end_ms <= lo:
            k += 1
        j = k
        while j < len(merged) and merged[j].start_ms < hi:
            piece = merged[j]
            owned[piece.layer] = owned.get(piece.layer, 0.0) + min(piece.end_ms, hi) - max(piece.start_ms, lo)
            j += 1
        layer = max(owned, key=lambda key: owned[key]) if owned else None
        if steps and steps[-1].layer == layer:
            steps[-1] = PathPiece(steps[-1].start_ms, round(hi, 3), layer, "")
        else:
            steps.append(PathPiece(round(lo, 3), round(hi, 3), layer, ""))
    return steps


def _ms(ns: int) -> float:
    return round(ns / NS_PER_MS, 3)


def _bars(rt: RequestTimeline, include_attributes: bool) -> list[Bar]:
    """Every segment of the request, parents before children, siblings by start."""
    start = rt.request.start_ns
    ids = {s.segment_id for s in rt.segments}
    kids: dict[str | None, list[Segment]] = {}
    for segment in rt.segments:
        parent = segment.parent_id if segment.parent_id in ids and segment.parent_id != segment.segment_id else None
        kids.setdefault(parent, []).append(segment)
    out: list[Bar] = []
    seen: set[str] = set()
    stack: list[tuple[Segment, int, str | None]] = [(s, 0, None) for s in sorted(kids.get(None, ()), key=_by_start, reverse=True)]
    while stack:
        segment, depth, enclosing = stack.pop()
        if segment.segment_id in seen:  # a cycle of parent ids
            continue
        seen.add(segment.segment_id)
        layer = enclosing if segment.layer is None else effective_layer(segment.layer, enclosing)
        out.append(Bar(segment.name, layer, _ms(segment.start_ns - start), _ms(max(segment.end_ns, segment.start_ns) - start), depth,
                       shown_attributes(segment.attrs, include_attributes)))  # fmt: skip
        for child in sorted(kids.get(segment.segment_id, ()), key=_by_start, reverse=True):
            stack.append((child, depth + 1, layer))
    return out


def _by_start(segment: Segment) -> tuple[int, int]:
    return segment.start_ns, -segment.end_ns


def shown_attributes(attrs: Mapping[str, Any], include_attributes: bool = False) -> tuple[tuple[str, str], ...]:
    """The attributes a shared page may show (`SHARED_ATTRIBUTES`, latprof's own, and with
    `include_attributes` also `WITH_INCLUDE_ATTRIBUTES`), as text cut to `MAX_VALUE_CHARS`."""
    out = []
    for key, value in attrs.items():
        allowed = key in SHARED_ATTRIBUTES or (include_attributes and key in WITH_INCLUDE_ATTRIBUTES) or (
            key.startswith("latprof.") and not key.startswith(_OWN_HIDDEN_PREFIXES))
        if not allowed or isinstance(value, (dict, bytes)):
            continue
        text = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        out.append((key, text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"))
    return tuple(sorted(out))


def tail_windows(analysis: Analysis) -> list[TailWindow]:
    """Per window of `analysis.windows`, its slowest 1% and their mean time per layer."""
    windows = analysis.windows
    if not windows:
        return []
    size_ns = round((windows[0].end_unix_s - windows[0].start_unix_s) * NS_PER_S)
    origin = round(windows[0].start_unix_s * NS_PER_S)
    members: list[list[int]] = [[] for _ in windows]
    for i, rt in enumerate(analysis.requests):
        k = (rt.request.start_ns - origin) // size_ns if size_ns > 0 else 0
        if 0 <= k < len(members):
            members[k].append(i)
    return [_tail_window(analysis, w.start_unix_s, w.end_unix_s, w.requests, w.p99_ms, idx) for w, idx in zip(windows, members)]


def _tail_window(analysis: Analysis, start_s: float, end_s: float, requests: int, p99_ms: float | None,
                 idx: Sequence[int]) -> TailWindow:  # fmt: skip
    if not idx or p99_ms is None:
        return TailWindow(start_s, end_s, requests, p99_ms, 0, {})
    tail = [i for i in idx if analysis.latencies_ms[i] >= p99_ms] or [max(idx, key=lambda i: analysis.latencies_ms[i])]
    weights = [analysis.weight(i) for i in tail]
    total = sum(weights)
    layers: dict[str, float] = {}
    for i, w in zip(tail, weights):
        for layer, ms in analysis.breakdowns[i].items():
            layers[layer] = layers.get(layer, 0.0) + w * ms
    return TailWindow(start_s, end_s, requests, p99_ms, total, {k: round(v / total, 3) for k, v in layers.items() if v > 0})
