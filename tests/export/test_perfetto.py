"""`latprof export --format perfetto`: Chrome trace-event JSON held to the format's documented fields."""

from __future__ import annotations

import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from latprof.events import Gauge, Request, Segment
from latprof.export import EXPORT, read_input
from latprof.export.perfetto import LAYER_COLOURS, lanes
from latprof.layers import LAYERS

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.jsonl.gz"))
#: The reserved colour names of catapult's tracing/base/color_scheme.html that the mapping may use.
RESERVED_CNAMES = {
    "thread_state_uninterruptible", "thread_state_iowait", "thread_state_running", "thread_state_runnable",
    "thread_state_sleeping", "thread_state_unknown", "background_memory_dump", "light_memory_dump",
    "detailed_memory_dump", "vsync_highlight_color", "generic_work", "good", "bad", "terrible", "black", "grey",
    "white", "yellow", "olive", "rail_response", "rail_animation", "rail_idle", "rail_load", "startup",
}  # fmt: skip


def export(path: Path) -> dict[str, Any]:
    out = io.StringIO()
    EXPORT.render("perfetto", read_input([path]), out)
    parsed: dict[str, Any] = json.loads(out.getvalue())
    return parsed


def ns(us: float) -> int:
    """A trace-event time (µs, to the ns) as integer ns, as Perfetto's importer reads it."""
    return round(us * 1000)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_event(event: dict[str, Any]) -> None:
    """The fields the trace-event format requires of each phase, with their types."""
    ph = event["ph"]
    assert isinstance(event["name"], str) and event["name"]
    assert isinstance(event["pid"], int)
    if ph == "X":
        assert isinstance(event["tid"], int) and isinstance(event["cat"], str)
        assert is_number(event["ts"]) and event["ts"] >= 0 and is_number(event["dur"]) and event["dur"] >= 0
        assert isinstance(event["args"], dict) and event["cname"] in RESERVED_CNAMES
    elif ph == "M":
        assert event["name"] in ("process_name", "thread_name", "thread_sort_index")
        assert isinstance(event["tid"], int)
        if event["name"] == "thread_sort_index":
            assert isinstance(event["args"]["sort_index"], int)
        else:
            assert isinstance(event["args"]["name"], str) and event["args"]["name"]
    elif ph == "C":
        assert is_number(event["ts"]) and event["ts"] >= 0
        assert event["args"] and all(is_number(v) for v in event["args"].values())
    else:
        raise AssertionError(f"unexpected phase {ph!r}")


def check_nested(slices: list[dict[str, Any]]) -> None:
    """The slices of one track nest: each starts inside every slice still open and ends within it."""
    open_ends: list[int] = []
    for event in sorted(slices, key=lambda e: (ns(e["ts"]), -ns(e["dur"]))):
        start, end = ns(event["ts"]), ns(event["ts"]) + ns(event["dur"])
        while open_ends and open_ends[-1] <= start:
            open_ends.pop()
        assert not open_ends or end <= open_ends[-1], f"{event['name']} overlaps its enclosing slice"
        open_ends.append(end)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name.split(".")[0])
def test_example_export_is_valid_trace_event_json(path: Path) -> None:
    document = export(path)
    data = read_input([path])
    assert document["displayTimeUnit"] == "ms"
    events = document["traceEvents"]
    for event in events:
        check_event(event)
    by_track: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        if event["ph"] == "X":
            by_track[(event["pid"], event["tid"])].append(event)
    for slices in by_track.values():
        check_nested(slices)
    named = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    assert set(by_track) <= named
    assert {e["pid"] for e in events if e["name"] == "process_name"} >= {pid for pid, _ in by_track}
    # every request and segment once, at its capture times in µs from the origin
    origin = document["otherData"]["latprof.origin_unix_ns"]
    requests = {e["args"]["request_id"]: e for e in events if e["ph"] == "X" and e["cat"] == "request"}
    assert len(requests) == len({r.request_id for r in data.requests})
    for request in data.requests:
        event = requests[request.request_id]
        assert origin + ns(event["ts"]) == request.start_ns
        assert ns(event["dur"]) == request.end_ns - request.start_ns
    segments = [e for e in events if e["ph"] == "X" and e["cat"] != "request"]
    assert len(segments) == sum(len(v) for k, v in data.segments_by_request.items() if k in requests)
    assert {e["cat"] for e in segments} == {s.layer or "none" for v in data.segments_by_request.values() for s in v}
    # gauges as counters
    assert sum(1 for e in events if e["ph"] == "C") == len(data.gauges)


def test_the_outer_slice_of_each_request_track_is_the_request() -> None:
    events = export(EXAMPLES[0])["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    first: dict[tuple[int, int], dict[str, Any]] = {}
    for event in events:
        if event["ph"] == "X":
            first.setdefault((event["pid"], event["tid"]), event)
    request_tracks = [track for track in first if not names[track].endswith(")")]  # not a "(+1)" overflow track
    assert len(request_tracks) == len({r.request_id for r in read_input([EXAMPLES[0]]).requests})
    for track in request_tracks:
        event = first[track]
        assert event["cat"] == "request" and names[track] == f"{event['name']} {event['args']['request_id']}"


def test_every_layer_has_one_reserved_colour() -> None:
    assert set(LAYERS) <= set(LAYER_COLOURS)
    assert set(LAYER_COLOURS.values()) <= RESERVED_CNAMES
    assert len(set(LAYER_COLOURS.values())) == len(LAYER_COLOURS)


def segment(sid: str, start: int, end: int, layer: str | None = "tool", parent: str | None = None) -> Segment:
    return Segment("r1", sid, parent, sid, layer, start, end, 1)


def test_lanes_keep_nested_segments_on_the_request_track() -> None:
    request = Request("r1", "GET /x", 0, 100, 1)
    hold = segment("hold", 10, 60, None)
    inner = segment("query", 20, 30, "db.query", parent="hold")
    after = segment("llm", 60, 90, "provider")
    assert lanes(request, [after, inner, hold]) == [[request, hold, inner, after]]


def test_lanes_move_overlapping_and_outlying_segments_to_another_track() -> None:
    request = Request("r1", "GET /x", 0, 100, 1)
    a = segment("a", 10, 50)
    b = segment("b", 40, 80)  # overlaps a without nesting: a concurrent call
    late = segment("late", 90, 120)  # ends after its request
    assert lanes(request, [a, b, late]) == [[request, a], [b, late]]


def test_counters_are_one_track_per_gauge_and_instance(tmp_path: Path) -> None:
    from latprof.capture.reader import CaptureData
    from latprof.export.perfetto import trace_events

    data = CaptureData(gauges=[Gauge("db.pool.in_use", 2.0, 5_000, 7, {"db.client.connection.pool.name": "a"}),
                               Gauge("db.pool.in_use", 3.0, 6_000, 7, {"db.client.connection.pool.name": "b"}),
                               Gauge("event_loop.lag_ms", 12.5, 7_000, 7)])  # fmt: skip
    counters = [e for e in trace_events(data, 1_000) if e["ph"] == "C"]
    assert [(e["name"], e["ts"], e["args"]["value"]) for e in counters] == [
        ("db.pool.in_use (db.client.connection.pool.name=a)", 4.0, 2.0),
        ("db.pool.in_use (db.client.connection.pool.name=b)", 5.0, 3.0),
        ("event_loop.lag_ms", 6.0, 12.5),
    ]
