"""critical_path / layer_times_ms on hand-built requests with known answers."""

from __future__ import annotations

import pytest
from timelines import req, seg

from latprof.analysis.requests import critical_path, layer_times_ms, split_uncovered

MS = 1_000_000


def path_ms(rt):
    return {k: v / MS for k, v in critical_path(rt).items() if v}


def test_sequential_children_and_uncovered_gaps():
    rt = req(0, 100, seg("db.pool", 10, 30), seg("db.query", 30, 40), seg("provider", 50, 90))
    assert path_ms(rt) == {None: 30, "db.pool": 20, "db.query": 10, "provider": 40}


def test_values_sum_to_latency():
    rt = req(0, 250, seg("db.query", 5, 80), seg("tool", 40, 120), seg("tool", 60, 200), seg("model", 190, 240))
    assert sum(critical_path(rt).values()) == 250 * MS


def test_overlapping_siblings_give_time_to_the_one_that_ends_last():
    # Two parallel tool calls: 10-60 and 20-100. 20-60 overlaps: the later-ending one owns it.
    rt = req(0, 100, seg("tool", 10, 60, name="a"), seg("db.query", 20, 100))
    assert path_ms(rt) == {None: 10, "tool": 10, "db.query": 80}


def test_sibling_contained_in_a_longer_one_gets_nothing():
    rt = req(0, 100, seg("provider", 0, 100), seg("tool", 20, 40))
    assert path_ms(rt) == {"provider": 100}


def test_parallel_children_are_not_double_counted():
    # Three concurrent tool calls of 50 ms each in a 60 ms request: 60 ms total, never 150.
    rt = req(0, 60, seg("tool", 5, 55), seg("tool", 5, 55), seg("tool", 5, 55))
    assert path_ms(rt) == {None: 10, "tool": 50}


def test_nested_children_own_their_time_innermost_first():
    outer = seg("tool", 0, 100, id="outer")
    rt = req(0, 100, outer, seg("db.pool", 10, 30, parent="outer"), seg("db.query", 30, 50, parent="outer"))
    assert path_ms(rt) == {"tool": 60, "db.pool": 20, "db.query": 20}


def test_generic_wait_inside_a_pool_checkout_is_the_checkout():
    checkout = seg("db.pool", 0, 80, id="co")
    rt = req(0, 100, checkout, seg("lock", 10, 70, parent="co"))
    assert path_ms(rt) == {"db.pool": 80, None: 20}


def test_sdk_http_request_is_the_sdks_provider_time_but_retry_sleep_is_retry():
    call = seg("provider", 0, 100, id="call")
    rt = req(
        0,
        100,
        call,
        seg("tool", 0, 30, parent="call", name="POST /v1/chat/completions 429"),
        seg("retry", 30, 60, parent="call"),
        seg("tool", 60, 100, parent="call", name="POST /v1/chat/completions"),
    )
    assert path_ms(rt) == {"provider": 70, "retry": 30}


def test_segment_without_layer_owns_nothing_and_lifts_its_children():
    agent = seg(None, 0, 100, id="agent", name="invoke_agent")
    rt = req(0, 100, agent, seg("tool", 10, 40, parent="agent"), seg("provider", 40, 90, parent="agent"))
    assert path_ms(rt) == {None: 20, "tool": 30, "provider": 50}


def test_connection_hold_marker_does_not_steal_the_llm_call():
    rt = req(
        0,
        100,
        seg("db.query", 0, 10),
        seg(None, 0, 95, name="db.connection.hold"),
        seg("provider", 10, 60),
        seg("model", 60, 90),
    )
    assert path_ms(rt) == {"db.query": 10, "provider": 50, "model": 30, None: 10}


def test_children_are_clipped_to_the_request_and_to_their_parent():
    parent = seg("tool", 50, 80, id="p")
    rt = req(0, 100, seg("queue", -20, 10), parent, seg("db.query", 70, 120, parent="p"))
    assert path_ms(rt) == {"queue": 10, None: 60, "tool": 20, "db.query": 10}


def test_pre_handler_queue_segment_counts_from_arrival():
    rt = req(0, 100, seg("queue", 0, 40, name="accept backlog"), seg("db.query", 40, 60))
    assert path_ms(rt) == {"queue": 40, "db.query": 20, None: 40}


def test_missing_parent_hangs_off_the_root_and_bad_segments_are_ignored():
    rt = req(0, 100, seg("tool", 10, 20, parent="gone"), seg("db.query", 50, 40))
    assert path_ms(rt) == {None: 90, "tool": 10}


def test_parent_cycle_does_not_hang():
    a = seg(None, 0, 50, id="a", parent="b")
    b = seg(None, 0, 50, id="b", parent="a")
    rt = req(0, 100, a, b, seg("tool", 10, 20, parent="a"))
    assert path_ms(rt) == {None: 90, "tool": 10}


def test_request_without_segments_is_all_uncovered():
    assert path_ms(req(0, 42)) == {None: 42}


@pytest.mark.parametrize(
    ("uncovered", "cpu", "expected"),
    [(100, None, (0, 100)), (100, 30, (30, 70)), (100, 500, (100, 0)), (0, 10, (0, 0)), (100, 0, (0, 100))],
)
def test_uncovered_time_is_app_only_as_far_as_cpu_backs_it(uncovered, cpu, expected):
    assert split_uncovered(uncovered, cpu) == expected


def test_layer_times_split_uncovered_by_measured_cpu():
    rt = req(0, 100, seg("db.query", 0, 40), cpu_ms=45)
    assert layer_times_ms(rt) == {"db.query": 40.0, "app": 45.0, "unattributed": 15.0}
    no_cpu = req(0, 100, seg("db.query", 0, 40))
    assert layer_times_ms(no_cpu) == {"db.query": 40.0, "unattributed": 60.0}


def test_siblings_ending_together_give_the_overlap_to_the_later_start():
    # Same end: the one that started later is the more specific one and owns the overlap,
    # whatever order the capture listed them in.
    a = req(0, 100, seg("tool", 0, 100), seg("db.query", 50, 100))
    b = req(0, 100, seg("db.query", 50, 100), seg("tool", 0, 100))
    assert path_ms(a) == path_ms(b) == {"tool": 50, "db.query": 50}
