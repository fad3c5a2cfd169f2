"""Write a capture as Chrome trace-event JSON (the JSON Object Format), which Perfetto UI and chrome://tracing open.

    {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {"latprof.origin_unix_ns": ...}}

- A process per capture process (`process_name` metadata: its service name and pid), a track
  (`tid`) per request, named for its route and id and sorted by arrival (`thread_name`,
  `thread_sort_index`).
- The request is the outer complete slice (`"ph": "X"`, `cat` `request`), its segments slices
  nested inside it (`cat` the layer, `none` for a layer-less one such as `db.connection.hold`),
  `args` the capture's attributes. Slices of one track must nest; segments that overlap without
  nesting (concurrent calls) or lie outside their request go to the request's next track
  (`... (+1)`), so no slice is dropped or cut.
- Gauges are counters (`"ph": "C"`), one track per gauge and instance (its attributes).
- `ts` and `dur` are microseconds (to the ns, three decimals) since `otherData.latprof.origin_unix_ns`,
  the capture's earliest time.
- Each layer has one of chrome://tracing's reserved colour names (`cname`): `LAYER_COLOURS`.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence, TextIO

import orjson

from latprof.capture.reader import CaptureData
from latprof.events import Gauge, Request, Segment
from latprof.export import EXPORT, process_about, requests_with_segments
from latprof.layers import APP, DB_POOL, DB_QUERY, EVENT_LOOP, HTTP_POOL, LOCK, MODEL, PROVIDER, QUEUE, RETRY, TOOL, UNATTRIBUTED

#: `cat` of a request's own slice, and of a segment without a layer.
REQUEST_CATEGORY = "request"
NO_LAYER_CATEGORY = "none"
#: The reserved colour name (catapult's `tracing/base/color_scheme.html`) of each slice category.
LAYER_COLOURS: Mapping[str, str] = {
    QUEUE: "thread_state_runnable",  # light blue: ready, not yet picked up
    EVENT_LOOP: "terrible",  # dark red
    DB_POOL: "bad",  # amber
    DB_QUERY: "good",  # green
    HTTP_POOL: "thread_state_iowait",  # orange
    PROVIDER: "rail_response",  # blue
    MODEL: "rail_animation",  # coral red
    TOOL: "olive",
    RETRY: "yellow",
    LOCK: "thread_state_uninterruptible",  # mauve
    APP: "thread_state_running",  # light green
    UNATTRIBUTED: "grey",  # no segment carries it; listed so every layer has a colour
    REQUEST_CATEGORY: "generic_work",  # mid grey: the request's own slice
    NO_LAYER_CATEGORY: "thread_state_sleeping",  # near white: owns no time of its own
}
#: Slices hold this key in `args`: the segment's layer (or the category) as latprof names it.
LAYER_ARG = "latprof.layer"


def _us(ns: int) -> float:
    """Nanoseconds as microseconds to the ns (three decimals), the trace-event format's unit."""
    return round(ns / 1000, 3)


def lanes(request: Request, segments: Sequence[Segment]) -> list[list[Request | Segment]]:
    """The request's slices spread over tracks so that the slices of each track nest: the request
    first on track 0, then each segment (by start, longer first) on the first track where it fits
    inside the innermost slice still open at its start (or where none is open)."""
    placed: list[list[Request | Segment]] = [[request]]
    open_ends: list[list[int]] = [[request.end_ns]]
    for segment in sorted(segments, key=lambda s: (s.start_ns, -s.end_ns)):
        for lane, ends in zip(placed, open_ends):
            while ends and ends[-1] <= segment.start_ns:
                ends.pop()
            if not ends or segment.end_ns <= ends[-1]:
                lane.append(segment)
                ends.append(segment.end_ns)
                break
        else:
            placed.append([segment])
            open_ends.append([segment.end_ns])
    return placed


def _slice(item: Request | Segment, pid: int, tid: int, origin_ns: int) -> dict[str, Any]:
    """The complete event (`"ph": "X"`) of a request or a segment."""
    if isinstance(item, Request):
        category = REQUEST_CATEGORY
        name = item.route
        args: dict[str, Any] = {"request_id": item.request_id, "status_code": item.status_code, "cpu_ns": item.cpu_ns,
                                **item.attrs}  # fmt: skip
    else:
        category = item.layer or NO_LAYER_CATEGORY
        name = item.name
        args = {"request_id": item.request_id, "segment_id": item.segment_id, "parent_id": item.parent_id, **item.attrs}
    args[LAYER_ARG] = category
    return {
        "name": name,
        "cat": category,
        "ph": "X",
        "ts": _us(item.start_ns - origin_ns),
        "dur": _us(item.end_ns - item.start_ns),
        "pid": pid,
        "tid": tid,
        "cname": LAYER_COLOURS[category],
        "args": args,
    }


def _metadata(name: str, pid: int, args: dict[str, Any], tid: int = 0) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _counter(gauge: Gauge, origin_ns: int) -> dict[str, Any]:
    """The counter event of one gauge reading; a gauge of several instances (pools) is a track per instance."""
    instance = ", ".join(f"{k}={v}" for k, v in sorted(gauge.attrs.items()))
    return {
        "name": f"{gauge.name} ({instance})" if instance else gauge.name,
        "cat": "gauge",
        "ph": "C",
        "ts": _us(gauge.ts_ns - origin_ns),
        "pid": gauge.pid,
        "args": {"value": gauge.value},
    }


def origin_ns(data: CaptureData) -> int:
    """The capture's earliest request, segment or gauge time: `ts` 0."""
    starts = [r.start_ns for r in data.requests] + [g.ts_ns for g in data.gauges]
    starts += [s.start_ns for segments in data.segments_by_request.values() for s in segments]
    return min(starts, default=0)


def trace_events(data: CaptureData, origin: int) -> Iterator[dict[str, Any]]:
    """Every event of the export: process names, then per request its track names and slices, then the counters."""
    pids = sorted({r.pid for r in data.requests} | {g.pid for g in data.gauges})
    for pid in pids:
        about = process_about(data, pid)
        service = about.get("service.name")
        label = f"pid {about.get('process.pid', pid)}"
        yield _metadata("process_name", pid, {"name": f"{service} ({label})" if service else label})
    next_tid: dict[int, int] = {}
    for request, segments in requests_with_segments(data):
        for extra, lane in enumerate(lanes(request, segments)):
            tid = next_tid[request.pid] = next_tid.get(request.pid, 0) + 1
            track = f"{request.route} {request.request_id}" + (f" (+{extra})" if extra else "")
            yield _metadata("thread_name", request.pid, {"name": track}, tid)
            yield _metadata("thread_sort_index", request.pid, {"sort_index": tid}, tid)
            for item in lane:
                yield _slice(item, request.pid, tid, origin)
    for gauge in data.gauges:
        yield _counter(gauge, origin)


@EXPORT.register("perfetto")
def write_perfetto(data: CaptureData, out: TextIO) -> None:
    """Write the capture to `out` as one trace-event JSON object (module docstring)."""
    origin = origin_ns(data)
    document = {
        "traceEvents": list(trace_events(data, origin)),
        "displayTimeUnit": "ms",
        "otherData": {"latprof.origin_unix_ns": origin},
    }
    out.write(orjson.dumps(document, option=orjson.OPT_NON_STR_KEYS).decode())
    out.write("\n")
