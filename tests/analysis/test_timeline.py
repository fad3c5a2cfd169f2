"""build_timeline: grouping, requests that never completed, duplicates, quality records."""

from __future__ import annotations

from latprof.capture.reader import CaptureData
from latprof.events import Gauge, QualityRecord, Request, Segment
from latprof.analysis.timeline import build_timeline

T0 = 1_764_000_000_000_000_000


def data(**kw) -> CaptureData:
    d = CaptureData(inputs=["c.jsonl"], headers=[{"type": "header", "source": "attach", "pid": 1}])
    for key, value in kw.items():
        setattr(d, key, value)
    return d


def test_segments_are_grouped_under_their_request_and_requests_sorted_by_arrival():
    late = Request("b", "GET /b", T0 + 50, T0 + 90, 1)
    early = Request("a", "GET /a", T0, T0 + 40, 1)
    seg_a = Segment("a", "s1", None, "x", "tool", T0 + 1, T0 + 2, 1)
    timeline = build_timeline(data(requests=[late, early], segments_by_request={"a": [seg_a]}, segment_count=1))
    assert [rt.request.request_id for rt in timeline.requests] == ["a", "b"]
    assert timeline.requests[0].segments == (seg_a,) and timeline.requests[1].segments == ()
    assert timeline.source_kind == "attach"


def test_segments_of_requests_still_in_flight_are_counted_and_reported():
    stray = [Segment("gone", f"s{i}", None, "x", "tool", T0, T0 + 1, 1) for i in range(3)]
    timeline = build_timeline(data(requests=[Request("a", "GET /a", T0, T0 + 1, 1)], segments_by_request={"gone": stray}))
    assert timeline.orphan_segments == 3
    assert any("3 segment(s) belong to 1 request(s) that had not completed" in w for w in timeline.warnings)


def test_duplicate_ids_keep_the_first_and_backwards_requests_are_left_out():
    first = Request("a", "GET /a", T0, T0 + 10, 1)
    again = Request("a", "GET /a", T0, T0 + 99, 1)
    backwards = Request("z", "GET /z", T0 + 10, T0, 1)
    timeline = build_timeline(data(requests=[first, again, backwards]))
    assert [rt.request for rt in timeline.requests] == [first]
    assert any("recorded twice" in w for w in timeline.warnings)
    assert any("end before they start" in w for w in timeline.warnings)


def test_gauges_are_indexed_by_name_in_time_order():
    g2, g1 = Gauge("db.pool.in_use", 2, T0 + 2, 1), Gauge("db.pool.in_use", 1, T0 + 1, 1)
    timeline = build_timeline(data(gauges=[g2, g1, Gauge("event_loop.lag_ms", 5, T0, 1)]))
    assert timeline.gauges["db.pool.in_use"] == [g1, g2]
    assert set(timeline.gauges) == {"db.pool.in_use", "event_loop.lag_ms"}


def test_quality_records_become_summed_warnings_and_hooks_name_the_collectors():
    quality = [
        QualityRecord("hooks_loaded", T0, 1, "", 1, {"collectors": ["asgi", "sqlalchemy"]}),
        QualityRecord("hooks_loaded", T0, 2, "", 1, {"collectors": ["asgi", "openai"]}),
        QualityRecord("dropped", T0, 1, "buffer full", 10),
        QualityRecord("dropped", T0 + 1, 1, "buffer full", 5),
    ]
    timeline = build_timeline(data(quality=quality))
    assert timeline.collectors == ["asgi", "sqlalchemy", "openai"]
    assert timeline.warnings == ["pid 1: dropped x15: buffer full"]
