"""The analysis steps one by one: warm-up, percentiles, cohorts, tail excess, windows, coverage."""

from __future__ import annotations

import pytest
from timelines import analysed, population, req, seg

from latprof.analysis.requests import cohorts, coverage, layer_stats, percentile, skip_warmup, summarize_latency, windows


def test_percentile_interpolates_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)


def test_warmup_is_counted_from_each_process_first_request():
    early_a = req(0, 10, pid=1)
    late_a = req(2500, 2510, pid=1)
    early_b = req(5000, 5010, pid=2)  # process 2 starts later: its own first 2 s are warm-up
    late_b = req(7100, 7110, pid=2)
    kept, skipped = skip_warmup([early_a, late_a, early_b, late_b], 2.0)
    assert kept == [late_a, late_b]
    assert skipped == 2
    assert skip_warmup([early_a, late_a], 0.0) == ([early_a, late_a], 0)


def test_cohorts_of_100_requests():
    latencies = [float(i) for i in range(100)]  # request i has latency i
    groups = cohorts(latencies)
    assert groups.tail == (99, 98, 97)  # 1% of 100 is 1, at least 3
    assert groups.tail5 == (99, 98, 97, 96, 95)
    assert groups.median == tuple(range(39, 61))  # ranks between p40 and p60


def test_cohorts_with_few_requests_never_exceed_the_population():
    assert cohorts([5.0, 1.0]) == cohorts([5.0, 1.0])
    groups = cohorts([5.0, 1.0])
    assert groups.tail == (0, 1) and groups.tail5 == (0, 1)
    assert groups.median == (1, 0)
    assert cohorts([]) .tail == ()


def test_cohorts_scale_with_large_populations():
    groups = cohorts([float(i) for i in range(1000)])
    assert len(groups.tail) == 10 and groups.tail[0] == 999
    assert len(groups.tail5) == 50


def test_tail_excess_is_tail_mean_minus_median_mean_and_shares_sum_to_one():
    # 100 requests: 95 typical (query 10 + provider 500), 5 slow with 2000 ms pool wait and a
    # 300 ms slower provider. Tail = 3 slowest (all slow ones).
    reqs = population(
        100,
        typical=[("db.query", 10), ("provider", 500)],
        slow=[("db.pool", 2000), ("db.query", 10), ("provider", 800)],
        jitter_ms=0,
    )
    a = analysed(reqs)
    pool, provider, query = a.layer("db.pool"), a.layer("provider"), a.layer("db.query")
    assert pool.tail_excess_ms == pytest.approx(2000)
    assert provider.tail_excess_ms == pytest.approx(300)
    assert query.tail_excess_ms == pytest.approx(0)
    assert pool.share_of_tail_excess == pytest.approx(2000 / 2300)
    assert provider.share_of_tail_excess == pytest.approx(300 / 2300)
    assert sum(s.share_of_tail_excess for s in a.layers.values()) == pytest.approx(1.0)
    assert pool.p50_ms == 0 and provider.p50_ms == 500


def test_negative_excess_gets_no_share():
    breakdowns = [{"provider": 100.0, "tool": 50.0}] * 10 + [{"provider": 900.0, "tool": 10.0}] * 3
    groups = cohorts([sum(b.values()) for b in breakdowns])
    stats = layer_stats(breakdowns, groups)
    assert stats["tool"].tail_excess_ms == pytest.approx(-40.0)
    assert stats["tool"].share_of_tail_excess == 0.0
    assert stats["provider"].share_of_tail_excess == 1.0
    assert not stats["queue"].seen


def test_latency_summary():
    lat = summarize_latency([float(v) for v in range(1, 101)])
    assert (lat.p50_ms, lat.max_ms, lat.count) == (50.5, 100.0, 100)
    assert lat.p99_ms == pytest.approx(99.01)
    assert summarize_latency([]) is None


def test_windows_pick_a_round_size_and_keep_empty_windows():
    reqs = [req(t, t + 10 + (t // 1000)) for t in range(0, 10_000, 500)] + [req(30_000, 30_100)]
    lat = [(r.request.end_ns - r.request.start_ns) / 1e6 for r in reqs]
    out = windows(reqs, lat, max_windows=10)
    assert out[1].start_unix_s - out[0].start_unix_s == 5  # 30 s of traffic in <= 10 windows
    assert [w.requests for w in out] == [10, 10, 0, 0, 0, 0, 1]
    assert out[2].p99_ms is None
    assert out[-1].p99_ms == pytest.approx(100.0)


def test_coverage_is_the_attributed_share_of_request_time():
    assert coverage([{"db.query": 30.0, "unattributed": 10.0}, {"app": 60.0}]) == pytest.approx(0.9)
    assert coverage([]) is None


def test_analyze_skips_warmup_by_default():
    reqs = [req(t, t + 50, seg("db.query", t, t + 50)) for t in range(0, 10_000, 100)]
    from timelines import timeline

    from latprof.analysis.requests import analyze

    a = analyze(timeline(reqs))
    assert a.warmup_skipped == 20
    assert len(a.requests) == 80
    assert a.coverage == 1.0


def test_percentiles_with_most_requests_at_zero_match_the_plain_percentile():
    from latprof.analysis.requests import _percentile_with_zeros

    values = [0.0] * 90 + [float(v) for v in range(1, 11)]
    nonzero = [v for v in values if v]
    for q in (0, 10, 50, 89, 90, 95, 99, 100):
        assert _percentile_with_zeros(nonzero, 90, q) == pytest.approx(percentile(values, q))
