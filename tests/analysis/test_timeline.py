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
    assert timeline.collectors == ["asgi", "sqlalchemy", "openai"]  # a capture from before hook_active: every hook loaded
    assert timeline.warnings == ["pid 1: dropped x15: buffer full"]


def test_the_collectors_are_the_hooks_that_saw_traffic_in_any_process():
    loaded = {"collectors": ["asgi", "sqlalchemy", "psycopg_pool", "redis", "openai"], "notes_activity": True}
    quality = [
        QualityRecord("hooks_loaded", T0, 1, "", 1, loaded),
        QualityRecord("hooks_loaded", T0, 2, "", 1, {**loaded, "forked": True}),
        QualityRecord("hook_active", T0 + 5, 1, "", 1, {"collector": "openai"}),
        QualityRecord("hook_active", T0 + 6, 2, "", 1, {"collector": "asgi"}),
        QualityRecord("hook_active", T0 + 7, 2, "", 1, {"collector": "sqlalchemy"}),
        QualityRecord("hook_active", T0 + 8, 1, "", 1, {"collector": "asgi"}),
    ]
    timeline = build_timeline(data(quality=quality))
    assert timeline.collectors == ["asgi", "sqlalchemy", "openai"]  # loaded order; psycopg_pool and redis saw nothing
    assert timeline.warnings == []
    idle = build_timeline(data(quality=quality[:2]))
    assert idle.collectors == []  # hooks loaded, no traffic: none named


# --- time-weighted gauge means ---------------------------------------------------------------------

from latprof.analysis.timeline import gauge_instances, time_weighted_mean  # noqa: E402


def _g(value: float, at_ms: float, pid: int = 1, **attrs: object) -> Gauge:
    return Gauge("db.pool.in_use", value, int(at_ms * 1_000_000), pid, attrs)


def test_each_reading_counts_for_as_long_as_it_held():
    # 10 in use for 1 s (read 10 times), then 0 for 9 s (read once): 1 s x 10 / 10 s = 1.
    series = [_g(10, 100 * i) for i in range(10)] + [_g(0, 1000)]
    assert time_weighted_mean(series, 0, 10_000_000_000) == 1.0
    assert sum(g.value for g in series) / len(series) > 9  # the plain mean of the readings


def test_a_reading_before_the_window_holds_from_its_start_and_readings_after_its_end_count_for_nothing():
    series = [_g(4, -5000), _g(8, 2000), _g(100, 20_000)]
    # 4 from 0 to 2 s, 8 from 2 s to 10 s: (4 x 2 + 8 x 8) / 10
    assert time_weighted_mean(series, 0, 10_000_000_000) == 7.2


def test_time_before_the_first_reading_is_not_counted_and_no_readings_in_the_window_is_the_plain_mean():
    assert time_weighted_mean([_g(6, 5000), _g(2, 7000)], 0, 10_000_000_000) == (6 * 2 + 2 * 3) / 5
    assert time_weighted_mean([_g(6, 5000), _g(2, 7000)], 0, 1_000_000_000) == 4.0
    assert time_weighted_mean([], 0, 1) is None


def test_gauge_instances_split_readings_by_process_and_attributes():
    readings = [_g(1, 0, pid=1, pool="a"), _g(2, 1, pid=1, pool="b"), _g(3, 2, pid=2, pool="a"), _g(4, 3, pid=1, pool="a")]
    split = gauge_instances(readings)
    assert {key: [g.value for g in series] for key, series in split.items()} == {
        (1, "pool=a"): [1, 4], (1, "pool=b"): [2], (2, "pool=a"): [3],
    }  # fmt: skip
