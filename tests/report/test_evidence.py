"""A finding's evidence as rows: every key in its order, named without its unit, the value rounded, the unit from the key."""

from __future__ import annotations

import json

import pytest

from latprof.report.evidence import MAX_ENTRIES, MAX_ITEMS, MAX_NESTED_CHARS, EvidenceRow, evidence_rows, with_unit


def row(key: str, value: object) -> EvidenceRow:
    [only] = evidence_rows({key: value})
    assert only.key == key
    return only


@pytest.mark.parametrize(
    ("key", "value", "name", "shown", "unit"),
    [
        ("pool_wait_p99_ms", 356.568, "pool wait p99", "357", "ms"),
        ("tpot_ms_tail", 10.007, "tpot tail", "10", "ms"),  # the unit mid-key, a statistic after it
        ("idle_age_ms_p50", 35.74, "idle age p50", "35.7", "ms"),
        ("mean_llm_ms_while_held", 234.286, "mean llm while held", "234", "ms"),
        ("first_byte_s", 0.4567, "first byte", "0.457", "s"),
        ("wait_ns", 1_234_567, "wait", "1,234,567", "ns"),
        ("call_us", 3.5, "call", "3.5", "µs"),
        ("rate_hz", 100, "rate", "100", "Hz"),
        ("sampled_at_hz", 99.5, "sampled at", "99.5", "Hz"),
        ("accept_rate_per_s", 12.345, "accept rate", "12.3", "/s"),
        ("cpu_percent", 95.0, "cpu", "95", "%"),  # already in percent: not 9500
        ("overhead_pct", 1.84, "overhead", "1.84", "%"),
        ("rss_mib", 512.4, "rss", "512", "MiB"),
        ("peak_gib", 1.5, "peak", "1.5", "GiB"),
        ("p99_over_p50", 2.78, "p99 over p50", "2.78", "×"),
        ("ms_per_1k_input_tokens", 12.5, "ms per 1k input tokens", "12.5", "ms"),  # a unit that opens the key stays in the name
        ("peak_waiters", 7.0, "peak waiters", "7", ""),
        ("dominant_cause", "output_tokens", "dominant cause", "output_tokens", ""),
    ],
)
def test_the_unit_comes_from_the_key_and_leaves_the_name(key: str, value: object, name: str, shown: str, unit: str) -> None:
    assert row(key, value) == EvidenceRow(key, name, shown, unit)


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("share_of_tail_excess", 0.9951, "99.5"),
        ("mean_utilisation", 0.95, "95"),
        ("mean_utilization", 0.5, "50"),
        ("held_across_llm_share", 1, "100"),  # an int share is a fraction too
        ("floor_share_of_ttft_p99", 0.0539, "5.39"),
        ("coverage", 0.5, "50"),
        ("loop_fraction", 0.25, "25"),
    ],
)
def test_a_share_or_utilisation_is_a_fraction_shown_in_percent(key: str, value: float, shown: str) -> None:
    r = row(key, value)
    assert (r.value, r.unit) == (shown, "%")


def test_a_value_already_in_percent_is_not_multiplied_even_when_it_is_a_share() -> None:
    assert (row("cpu_share_percent", 95.0).value, row("busy_share_pct", 40).value) == ("95", "40")


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (356.568, "357"), (35.6568, "35.7"), (3.56568, "3.57"), (0.356568, "0.357"), (0.00356568, "0.00357"),
        (0.0000123, "0.0000123"),  # no exponent
        (2401.59, "2,402"),  # whole units from 100 on, not 2,400
        (1234567.8, "1,234,568"), (9.996, "10"), (99.96, "100"), (0.5, "0.5"), (3.0, "3"), (0.0, "0"),
        (-8.915, "-8.91"), (-1500.4, "-1,500"), (float("nan"), "nan"), (float("inf"), "inf"),
        (1234567, "1,234,567"), (42, "42"), (0, "0"), (-3, "-3"),
    ],
)  # fmt: skip
def test_numbers_are_rounded_to_about_three_significant_digits(value: float, shown: str) -> None:
    assert row("tail_calls", value).value == shown


def test_booleans_are_yes_or_no_and_none_a_dash_without_a_unit() -> None:
    assert [(r.value, r.unit) for r in evidence_rows({"dominates_median": True, "split_unknown": False, "floor_ms": None})] == [
        ("yes", ""), ("no", ""), ("-", "")
    ]  # fmt: skip


def test_bytes_take_the_binary_unit_that_suits_the_size() -> None:
    assert [(row("rss_bytes", v).value, row("rss_bytes", v).unit) for v in (512, 2048, 123_456_789, 3 * 1024**3)] == [
        ("512", "B"), ("2", "KiB"), ("118", "MiB"), ("3", "GiB")
    ]  # fmt: skip


def test_a_unix_timestamp_is_a_utc_time_not_a_rounded_number() -> None:
    assert (row("start_unix_s", 1_765_000_000.25).value, row("start_unix_s", 0).unit) == ("2025-12-06 05:46:40.250", "UTC")


def test_a_list_is_compact_and_counts_what_it_leaves_out() -> None:
    ids = [f"id{i}" for i in range(MAX_ITEMS + 3)]
    assert row("example_request_ids", ids[:3]) == EvidenceRow("example_request_ids", "example request ids", "id0, id1, id2", "")
    assert row("example_request_ids", ids).value == ", ".join(ids[:MAX_ITEMS]) + ", +3 more"
    assert row("tail_routes", []).value == ""


def test_a_container_of_numbers_carries_its_unit_in_the_value() -> None:
    assert row("loop_busy_share_by_second", [0.5, 0.911, 1.0]) == EvidenceRow(
        "loop_busy_share_by_second", "loop busy share by second", "50%, 91.1%, 100%", ""
    )
    assert row("latency_ms", {"p50": 200.5, "p99": 2401.59}).value == "p50: 200 ms, p99: 2,402 ms"
    assert row("state_share", {"idle in transaction": 0.8, "active": 0.2}).value == "idle in transaction: 80%, active: 20%"
    assert row("max_connections", [10, 20]).value == "10, 20"


def test_a_dict_keeps_its_data_keys_and_names_its_fields() -> None:
    # data keys (a frame, a host, a cause) as they are; fields named like top-level keys, their units after their numbers
    assert row("queue_sources", {"threadpool": 381, "accept_backlog": 2}).value == "threadpool: 381, accept backlog: 2"
    assert row("hot_frames", {"run (asyncio/runners.py)": 41}).value == "run (asyncio/runners.py): 41"
    statement = {"statement": "SELECT 1", "count": 3, "p50_ms": 12.345, "tail_excess_ms": 30.0, "calls_per_tail_request": 1.5}
    assert row("statements", [statement, statement]).value == (
        "{statement: SELECT 1, count: 3, p50: 12.3 ms, tail excess: 30 ms, calls per tail request: 1.5}, " * 2
    ).rstrip(", ")
    nested = row("other_positions", [{"between": ["app", None], "tail_growth_ms": 3.2, "inferred": True}])
    assert nested.value == "{between: [app, -], tail growth: 3.2 ms, inferred: yes}"
    many = {f"cause{i}": i for i in range(MAX_ENTRIES + 2)}
    assert row("after", many).value.endswith(f"cause{MAX_ENTRIES - 1}: {MAX_ENTRIES - 1}, +2 more")


def test_a_long_string_is_clipped_inside_a_container_and_whole_on_its_own() -> None:
    sql = "SELECT " + ", ".join(f"column_{i}" for i in range(30)) + " FROM t"
    assert row("statements", [sql]).value == sql[: MAX_NESTED_CHARS - 1] + "…"
    assert row("inferred_from", sql).value == sql


def test_inferred_keeps_its_rows_so_the_report_says_it_was_inferred() -> None:
    rows = evidence_rows({"inferred": True, "inferred_from": "gaps between client spans", "connection_ceiling": 4})
    assert [(r.name, r.value) for r in rows] == [
        ("inferred", "yes"), ("inferred from", "gaps between client spans"), ("connection ceiling", "4")
    ]  # fmt: skip


def test_every_key_is_a_row_in_the_json_order() -> None:
    evidence = {
        "pool_wait_p50_ms": 21.441, "share_of_tail_excess": 0.9951, "pools": ["sqlite:///demo.db"], "pool_max": 3.0,
        "mean_utilisation": 0.7185, "inferred": True, "ms_per_1k_input_tokens": None, "after": {"429": 3}, "z": "last",
        "a": "after z",
    }  # fmt: skip
    read_back = json.loads(json.dumps(evidence))
    assert [r.key for r in evidence_rows(read_back)] == list(evidence)


@pytest.mark.parametrize(
    ("value", "unit", "joined"), [("357", "ms", "357 ms"), ("99.5", "%", "99.5%"), ("12", "/s", "12/s"), ("2.78", "×", "2.78×"), ("yes", "", "yes")]
)  # fmt: skip
def test_with_unit_writes_a_percent_a_ratio_and_a_rate_against_the_number(value: str, unit: str, joined: str) -> None:
    assert with_unit(value, unit) == joined
