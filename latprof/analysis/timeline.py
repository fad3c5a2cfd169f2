"""Build the timeline: requests with their segments, gauges by name, samples and quality records."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from latprof.capture.reader import CaptureData
from latprof.collectors.traces.tracemap import SpanFacts
from latprof.events import Gauge, QualityRecord, Request, Segment, StackSample
from latprof.semconv import (
    NOTE_CLOSED,
    NOTE_ENGINE_METRICS,
    NOTE_HOOK_ACTIVE,
    NOTE_HOOKS_LOADED,
    NOTE_INJECTED,
    NOTE_OVERHEAD,
    NOTES_ACTIVITY,
)

if TYPE_CHECKING:
    from latprof.analysis.stall_inference import PossibleStall


@dataclass(frozen=True, slots=True)
class RequestTimeline:
    """One request root and every segment recorded for it."""

    request: Request
    segments: tuple[Segment, ...]

    @property
    def latency_ns(self) -> int:
        return self.request.end_ns - self.request.start_ns


#: `Timeline.method` of a capture whose headers do not say it.
_METHODS = {"run": "launch", "attach": "sample", "receive": "receive"}


@dataclass
class Timeline:
    """What the analysis reads: requests sorted by arrival, gauges and samples by time."""

    source_kind: str
    inputs: list[str]
    requests: list[RequestTimeline]
    gauges: dict[str, list[Gauge]] = field(default_factory=dict)
    samples: list[StackSample] = field(default_factory=list)
    quality: list[QualityRecord] = field(default_factory=list)
    headers: list[dict[str, Any]] = field(default_factory=list)
    #: Segments whose request never completed in the capture (in flight when it stopped).
    orphan_segments: int = 0
    warnings: list[str] = field(default_factory=list)
    #: What mapping spans noted for the trace inferences (`tracemap.SpanFacts`), when every request was mapped from spans.
    span_facts: SpanFacts | None = None
    #: Windows that look like a blocked event loop but prove none (`stall_inference.possible_stalls`), set by
    #: the stall inference on traces: the verdict believes less a layer whose tail time lies mostly in them.
    possible_stalls: tuple[PossibleStall, ...] = ()

    @property
    def method(self) -> str:
        """How the data got out of the service (report-v1 `source.method`): "launch" (`latprof
        run`), "inject" (`attach --inject`), "sample" (`attach`), "receive" or "read" (trace
        files): a header's `method`, else by the source kind."""
        for header in self.headers:
            method = header.get("method")
            if isinstance(method, str) and method:
                return method
        return _METHODS.get(self.source_kind, "read")

    @property
    def collectors(self) -> list[str]:
        """Collectors that saw traffic: the hooks that recorded something ("hook active" records),
        in the order they loaded, then the collectors the headers name (attach, trace readers).

        A process whose "hooks loaded" record predates the "hook active" records (an older
        capture) counts every hook it loaded."""
        loaded: list[str] = []
        active: set[str] = set()
        for record in self.quality:
            if record.kind == NOTE_HOOKS_LOADED:
                new = [str(name) for name in record.attrs.get("collectors", ()) if str(name) not in loaded]
                loaded.extend(new)
                if not record.attrs.get(NOTES_ACTIVITY):
                    active.update(record.attrs.get("collectors", ()))
            elif record.kind == NOTE_HOOK_ACTIVE:
                active.add(str(record.attrs.get("collector")))
        names = [name for name in loaded if name in active]
        names += sorted(active - set(loaded) - {"None"})
        for header in self.headers:
            for name in header.get("collectors", ()):
                if name not in names:
                    names.append(str(name))
        return names


def build_timeline(data: CaptureData) -> Timeline:
    """Group segments under their request roots and index gauges by name.

    A segment whose request root is not in the capture (the request was still in flight when
    collection stopped) is counted in `orphan_segments` and left out. A request id seen twice
    keeps its first root. Requests are sorted by arrival; gauges by time.
    """
    by_request = dict(data.segments_by_request)

    requests: list[RequestTimeline] = []
    seen: set[str] = set()
    duplicates = 0
    bad_times = 0
    for request in data.requests:
        rid = request.request_id
        if rid in seen:
            duplicates += 1
            continue
        seen.add(rid)
        if request.end_ns < request.start_ns:
            bad_times += 1
            continue
        requests.append(RequestTimeline(request, tuple(by_request.pop(rid, ()))))
    requests.sort(key=lambda r: r.request.start_ns)
    orphans = sum(len(v) for v in by_request.values()) + data.orphan_deferred

    gauges: dict[str, list[Gauge]] = {}
    for gauge in data.gauges:
        gauges.setdefault(gauge.name, []).append(gauge)
    for series in gauges.values():
        series.sort(key=lambda g: g.ts_ns)

    warnings = list(data.warnings) + _orphan_warning(orphans, by_request)
    if duplicates:
        warnings.append(f"{duplicates} request(s) recorded twice under one id; kept the first")
    if bad_times:
        warnings.append(f"{bad_times} request(s) end before they start (clock step?); left out")
    warnings.extend(_summarize_quality(data.quality))

    return Timeline(
        source_kind=data.source_kind,
        inputs=list(data.inputs),
        requests=requests,
        gauges=gauges,
        samples=sorted(data.samples, key=lambda s: s.ts_ns),
        quality=list(data.quality),
        headers=list(data.headers),
        orphan_segments=orphans,
        warnings=warnings,
        span_facts=data.span_facts,
    )


def _orphan_warning(orphans: int, by_request: dict[str, Any]) -> list[str]:
    """The warning about `orphans` segments of the requests left in `by_request` (not in the timeline), if any."""
    if not orphans:
        return []
    return [f"{orphans} segment(s) belong to {len(by_request) or 'some'} request(s) that had not completed when collection"
            " stopped; left out"]  # fmt: skip


def with_read_segments(timeline: Timeline, data: CaptureData) -> Timeline:
    """`timeline`, built from `data` by the first pass of a cohort-first read, with the segments the second pass
    added to `data` since (`read_deferred_segments`): what `build_timeline(data)` gives now, without grouping,
    sorting and indexing again what the second pass did not change (the requests, their order, the gauges).
    When `data`'s warnings changed in between, the timeline is built again."""
    # the timeline's warnings: the reader's, the orphans' (the one that changes), then the requests' and quality's
    read = len(data.warnings)
    after = read + (1 if timeline.orphan_segments else 0)
    if timeline.warnings[:read] != data.warnings or len(timeline.warnings) < after:
        return build_timeline(data)
    by_request = dict(data.segments_by_request)
    requests = list(timeline.requests)
    for i, rt in enumerate(requests):
        segments = by_request.pop(rt.request.request_id, None)
        if segments is not None and len(segments) != len(rt.segments):  # (segments are only added)
            requests[i] = RequestTimeline(rt.request, tuple(segments))
    orphans = sum(len(v) for v in by_request.values()) + data.orphan_deferred
    warnings = list(data.warnings) + _orphan_warning(orphans, by_request) + timeline.warnings[after:]
    return dataclasses.replace(timeline, requests=requests, orphan_segments=orphans, warnings=warnings)


def gauge_instances(readings: Iterable[Gauge]) -> dict[tuple[int, str], list[Gauge]]:
    """The readings of one gauge split by what they measure: the process and the attributes
    (a pool's name, a port), in the order given (time order in a timeline)."""
    out: dict[tuple[int, str], list[Gauge]] = {}
    for reading in readings:
        what = ",".join(f"{k}={v}" for k, v in sorted(reading.attrs.items())) if reading.attrs else ""
        key = (reading.pid, what)
        out.setdefault(key, []).append(reading)
    return out


def time_weighted_mean(series: Sequence[Gauge], start_ns: int, end_ns: int) -> float | None:
    """The mean of one instance's readings (in time order) over [start_ns, end_ns), each
    weighted by how long it held: from its time until the next reading, the last one until
    `end_ns`. A reading before `start_ns` holds from `start_ns`; time before the first reading
    is not known and not counted. When no reading holds for any time in the window (all of
    them at or after its end), the plain mean of the readings."""
    if not series:
        return None
    total_ns = 0
    weighted = 0.0
    for reading, following in zip(series, [*series[1:], None]):
        begin = max(reading.ts_ns, start_ns)
        until = min(end_ns, following.ts_ns if following is not None else end_ns)
        if until > begin:
            total_ns += until - begin
            weighted += reading.value * (until - begin)
    if total_ns <= 0:
        return sum(g.value for g in series) / len(series)
    return weighted / total_ns


def _summarize_quality(records: list[QualityRecord]) -> list[str]:
    """One warning per (process, kind, message), counts summed: a writer repeats them per flush."""
    totals: dict[tuple[int, str, str], int] = {}
    for record in records:
        if record.kind not in (NOTE_HOOKS_LOADED, NOTE_HOOK_ACTIVE, NOTE_INJECTED, NOTE_CLOSED, NOTE_OVERHEAD, NOTE_ENGINE_METRICS):  # what ran, or `collection`'s
            key = (record.pid, record.kind, record.message)
            totals[key] = totals.get(key, 0) + record.occurrences
    lines = []
    for (pid, kind, message), count in totals.items():
        text = f"pid {pid}: {kind}" + (f" x{count}" if count != 1 else "")
        lines.append(text + (f": {message}" if message else ""))
    return lines
