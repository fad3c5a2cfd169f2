"""Decode against load: calls in flight by a sweep, the load and length fits, the tail against the median."""

from __future__ import annotations

import random

import pytest
from bursts import ENDPOINT, MODEL_NAME, load_bound, rounds, steady, tokens_of
from timelines import analysed, ms, req, seg

from latprof.analysis.decode_load import (
    DecodeCall,
    decode_calls,
    decode_segments,
    fit_load,
    key_of,
    mean_others_in_flight,
    tail_load,
)
from latprof.layers import MODEL
from latprof.semconv import ESTIMATED, GEN_AI_OUTPUT_TOKENS, GEN_AI_REQUEST_MODEL, SERVER_PORT

# --- calls in flight -------------------------------------------------------------------------------


def test_others_in_flight_is_the_time_weighted_overlap_with_the_other_intervals() -> None:
    #   a: 0----------100
    #   b:      50---------150
    #   c:           100--------200   (starts as a ends: no overlap with a)
    #   d:                          300--400
    a, b, c, d = (0, 100), (50, 150), (100, 200), (300, 400)
    assert mean_others_in_flight([a, b, c, d]) == pytest.approx([0.5, 1.0, 0.5, 0.0])
    assert mean_others_in_flight([(0, 10), (5, 5)]) == [0.0, 0.0]  # an empty interval counts for nothing
    assert mean_others_in_flight([]) == []


def test_others_in_flight_matches_the_pairwise_overlap() -> None:
    rng = random.Random(3)
    intervals = []
    for _ in range(300):
        start = rng.randrange(0, 10_000)
        intervals.append((start, start + rng.randrange(1, 2_000)))
    intervals += intervals[:20]  # identical intervals overlap each other wholly
    expected = [
        sum(max(0, min(e, e2) - max(s, s2)) for j, (s2, e2) in enumerate(intervals) if j != i) / (e - s)
        for i, (s, e) in enumerate(intervals)
    ]
    assert mean_others_in_flight(intervals) == pytest.approx(expected)


def test_others_in_flight_is_a_sweep_not_pairs() -> None:
    # 200,000 calls in one burst: pairwise that is 4e10 overlaps, swept it is a sort.
    n = 200_000
    out = mean_others_in_flight([(i, 10 * n + i) for i in range(n)])
    assert len(out) == n and out[0] == pytest.approx((n - 1) * (1 - (n / 2) / (10 * n)), rel=0.01)


# --- the calls and the fits ------------------------------------------------------------------------


def test_calls_are_grouped_by_model_and_endpoint_and_only_measured_calls_with_tokens_are_points() -> None:
    model = {GEN_AI_REQUEST_MODEL: MODEL_NAME}
    requests = [
        req(0, 100, seg(MODEL, 0, 100, **model, **{GEN_AI_OUTPUT_TOKENS: 10})),
        req(0, 100, seg(MODEL, 0, 100, **model, **{GEN_AI_OUTPUT_TOKENS: 10}, **ENDPOINT, **{SERVER_PORT: 443})),
        req(0, 100, seg(MODEL, 0, 100, **model)),  # no token count: load, not a point
        req(0, 100, seg(MODEL, 0, 100, **model, **{GEN_AI_OUTPUT_TOKENS: 10, ESTIMATED: True})),  # estimated: load only
        req(0, 100, seg(MODEL, 50, 50, **model, **{GEN_AI_OUTPUT_TOKENS: 10})),  # no duration
    ]
    calls = decode_calls(s for rt in requests for s in rt.segments)
    assert set(calls) == {(MODEL_NAME, ""), (MODEL_NAME, "api.example.com:443")}
    [alone] = calls[(MODEL_NAME, "api.example.com:443")]
    assert alone.in_flight == 0.0 and alone.tpot_ms == pytest.approx(10.0)
    [shared] = calls[(MODEL_NAME, "")]
    assert shared.in_flight == pytest.approx(2.0)  # the call without tokens and the estimated one
    assert key_of(requests[1].segments[0]) == (MODEL_NAME, "api.example.com:443")


def test_warm_up_requests_count_as_load() -> None:
    requests = rounds(load_bound, n_rounds=8, burst_every=4)
    assert len(decode_segments(analysed(requests))) == len(requests)
    later = analysed(requests, warmup_s=(requests[len(requests) // 2].request.start_ns - ms(0)) / 1e9)
    assert len(later.requests) < len(requests) and len(decode_segments(later)) == len(requests)


def test_the_load_slope_is_recovered_from_a_crowded_batch() -> None:
    calls = decode_calls(s for rt in rounds(load_bound) for s in rt.segments)[(MODEL_NAME, "")]
    fit = fit_load((MODEL_NAME, ""), calls)
    assert fit is not None and fit.calls == len(calls)
    assert fit.ms_per_token_per_call_in_flight == pytest.approx(2.0, abs=1e-6)
    assert fit.ms_per_token_per_output_token == pytest.approx(0.0, abs=0.1)
    # calls: rounds of 1-4 (most calls in rounds of 4) and bursts of 30; the upper quarter holds the bursts
    assert fit.in_flight_low < 2.0 and fit.in_flight_high > 10.0
    assert fit.tpot_ms_low == pytest.approx(10 + 2 * fit.in_flight_low)  # linear: the mean's prediction holds
    assert fit.tpot_ms_high == pytest.approx(10 + 2 * fit.in_flight_high)


def test_no_load_slope_when_time_per_token_does_not_depend_on_load() -> None:
    calls = decode_calls(s for rt in rounds(steady) for s in rt.segments)[(MODEL_NAME, "")]
    fit = fit_load((MODEL_NAME, ""), calls)
    assert fit is not None and fit.ms_per_token_per_call_in_flight == pytest.approx(0.0, abs=1e-6)
    assert fit.tpot_ms_low == pytest.approx(10.0) and fit.tpot_ms_high == pytest.approx(10.0)


def test_the_length_slope_is_recovered_when_long_answers_slow_their_tokens() -> None:
    def longer_is_slower(i: int, r: int, others: int) -> tuple[int, float]:
        return tokens_of(i) * 10, 5.0 + 0.01 * tokens_of(i) * 10

    calls = decode_calls(s for rt in rounds(longer_is_slower) for s in rt.segments)[(MODEL_NAME, "")]
    fit = fit_load((MODEL_NAME, ""), calls)
    assert fit is not None and fit.ms_per_token_per_output_token == pytest.approx(0.01, abs=1e-6)


def test_too_few_calls_give_no_fit() -> None:
    calls = [DecodeCall("r", f"s{i}", i, 100.0, 10.0, float(i)) for i in range(19)]
    assert fit_load((MODEL_NAME, ""), calls) is None
    assert fit_load((MODEL_NAME, ""), [*calls, DecodeCall("r", "s", 0, 100.0, 10.0, 3.0)]) is not None


def test_large_captures_are_subsampled_for_the_slopes() -> None:
    calls = [DecodeCall("r", f"s{i}", i, (10.0 + 2.0 * (i % 30)) * 40, 40.0, float(i % 30)) for i in range(100_000)]
    fit = fit_load((MODEL_NAME, ""), calls)
    assert fit is not None and fit.calls == 100_000
    assert fit.ms_per_token_per_call_in_flight == pytest.approx(2.0)


# --- the tail against the median ------------------------------------------------------------------


def test_the_tail_decoded_beside_more_calls_and_the_load_explains_its_slower_tokens() -> None:
    load = tail_load(analysed(rounds(load_bound)))
    assert load is not None
    assert load.tail.in_flight == pytest.approx(29.0, abs=0.5)
    assert load.median.in_flight < 3.0
    assert load.tpot_excess_ms == pytest.approx(load.from_load_ms, rel=0.05)
    assert load.from_length_ms == pytest.approx(0.0, abs=1.0)
    assert load.load_share > 0.95 and load.explains(0.5)


def test_the_load_does_not_explain_slow_tokens_that_come_regardless_of_it() -> None:
    def slow_now_and_then(i: int, r: int, others: int) -> tuple[int, float]:
        return tokens_of(r), 60.0 if i % 40 == 39 else 10.0

    load = tail_load(analysed(rounds(slow_now_and_then)))
    assert load is not None and load.tpot_excess_ms > 40
    assert abs(load.fit.ms_per_token_per_call_in_flight) < 0.2
    assert not load.explains(0.5) and load.load_share < 0.2


def test_no_tail_load_without_measured_calls() -> None:
    requests = [req(i * 100, i * 100 + 50, seg(MODEL, i * 100, i * 100 + 50, **{GEN_AI_REQUEST_MODEL: "m"})) for i in range(60)]
    assert tail_load(analysed(requests)) is None
