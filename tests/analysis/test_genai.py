"""LLM-call helpers, and the estimated split of non-streamed calls (docs/design.md)."""

from __future__ import annotations

import random

import pytest
from timelines import analysed, req, seg

from latprof.analysis.genai import (
    FIT_MIN_CALLS,
    decode_ms_per_token,
    fit_decode_ms_per_token,
    split_unstreamed_calls,
    theil_sen_slope,
    token_count,
)
from latprof.semconv import ESTIMATED, GEN_AI_OUTPUT_TOKENS, GEN_AI_REQUEST_MODEL, LLM_CALL_ID, TTFT_KNOWN


def streamed(t0: float, ttft: float, decode: float, tokens: int, model: str = "m1", call: str = "c"):
    return req(
        t0,
        t0 + ttft + decode,
        seg("provider", t0, t0 + ttft, **{GEN_AI_REQUEST_MODEL: model, TTFT_KNOWN: True, LLM_CALL_ID: call}),
        seg("model", t0 + ttft, t0 + ttft + decode, **{GEN_AI_REQUEST_MODEL: model, GEN_AI_OUTPUT_TOKENS: tokens, LLM_CALL_ID: call}),
    )


def unstreamed(t0: float, duration: float, tokens: int | None, model: str = "m1"):
    attrs = {GEN_AI_REQUEST_MODEL: model, TTFT_KNOWN: False}
    if tokens is not None:
        attrs[GEN_AI_OUTPUT_TOKENS] = tokens
    return req(t0, t0 + duration, seg("provider", t0, t0 + duration, **attrs))


def test_token_count_accepts_only_finite_non_negative_numbers():
    assert token_count(12) == 12.0 and token_count("7") == 7.0
    assert [token_count(v) for v in (None, True, -1, float("nan"), "x")] == [None] * 5


def test_decode_rate_is_the_median_over_streamed_calls_of_each_model():
    reqs = [streamed(0, 500, 100, 50), streamed(1000, 500, 300, 100), streamed(2000, 500, 20, 10), streamed(3000, 400, 50, 10, model="m2")]
    assert decode_ms_per_token(s for rt in reqs for s in rt.segments) == {"m1": pytest.approx(2.0), "m2": pytest.approx(5.0)}


def test_non_streamed_call_is_split_by_the_streamed_rate_of_its_model():
    reqs = [streamed(i * 1000, 500, 200, 100) for i in range(5)] + [unstreamed(9000, 1000, 150)]
    out, warnings = split_unstreamed_calls(reqs)
    assert out[:5] == reqs[:5]
    provider, model = out[5].segments
    assert (provider.layer, model.layer) == ("provider", "model")
    assert (model.end_ns - model.start_ns) / 1e6 == pytest.approx(300.0)  # 150 tokens x 2 ms
    assert provider.end_ns == model.start_ns and provider.attrs[ESTIMATED] and model.attrs[ESTIMATED]
    assert "1 non-streamed LLM call(s)" in warnings[0] and "m1 2.00 ms/token" in warnings[0]


def test_estimated_decode_never_exceeds_the_call():
    reqs = [streamed(0, 500, 200, 10), unstreamed(9000, 300, 1000)]  # 1000 tokens x 20 ms > 300 ms
    out, _ = split_unstreamed_calls(reqs)
    provider, model = out[1].segments
    assert provider.end_ns == provider.start_ns and (model.end_ns - model.start_ns) / 1e6 == pytest.approx(300.0)


def test_calls_without_tokens_or_streamed_peers_stay_whole_in_provider():
    reqs = [streamed(0, 500, 200, 100), unstreamed(5000, 900, None), unstreamed(7000, 900, 50, model="other")]
    out, warnings = split_unstreamed_calls(reqs)
    assert out == reqs
    assert warnings == [
        "2 non-streamed LLM call(s) could not be split (no output token count, or no streamed calls of the same"
        " model): counted whole as provider"
    ]


def test_analysis_counts_the_estimated_decode_as_model_and_says_so():
    reqs = [streamed(i * 1000, 500, 200, 100) for i in range(60)] + [unstreamed(70_000, 1000, 150)]
    a = analysed(reqs)
    assert a.breakdowns[-1] == {"provider": pytest.approx(700.0), "model": pytest.approx(300.0)}
    assert any("non-streamed" in w for w in a.warnings)


# --- the fit: decode from how non-streamed call durations grow with output tokens ------------------


def noisy_unstreamed_calls(n: int, ms_per_token: float, ttft_ms: float, tokens_of, seed: int = 7):
    """`n` non-streamed calls lasting TTFT + tokens x rate, with jitter and a few provider spikes."""
    rng = random.Random(seed)
    calls = []
    for i in range(n):
        tokens = tokens_of(i, rng)
        jitter = rng.gauss(0, 20) + (rng.random() < 0.1) * rng.uniform(500, 3000)  # 1 in 10 queued at the provider
        calls.append(unstreamed(i * 10_000, max(1.0, ttft_ms + tokens * ms_per_token + jitter), tokens))
    return calls


def test_fit_recovers_a_known_time_per_token_from_noisy_calls():
    calls = noisy_unstreamed_calls(40, 4.0, 300, lambda i, rng: rng.randint(20, 400))
    fits = fit_decode_ms_per_token(s for rt in calls for s in rt.segments)
    assert fits["m1"].calls == 40
    assert fits["m1"].ms_per_token == pytest.approx(4.0, rel=0.10)


def test_theil_sen_slope_is_the_median_pairwise_slope():
    assert theil_sen_slope([(1, 1), (2, 2), (3, 3), (4, 4), (5, 100)]) == pytest.approx(1.0)  # an outlier does not move it
    assert theil_sen_slope([(5, 1), (5, 9)]) is None


def test_fit_refuses_when_output_tokens_do_not_vary():
    calls = noisy_unstreamed_calls(40, 4.0, 300, lambda i, rng: 100 + i % 3)  # 100..102 tokens: max/min < 2
    assert fit_decode_ms_per_token(s for rt in calls for s in rt.segments) == {}


def test_fit_refuses_too_few_calls_and_non_positive_slopes():
    few = noisy_unstreamed_calls(FIT_MIN_CALLS - 1, 4.0, 300, lambda i, rng: 20 + 50 * i)
    assert fit_decode_ms_per_token(s for rt in few for s in rt.segments) == {}
    shrinking = [unstreamed(i * 10_000, 2000 - 10 * tokens, tokens) for i, tokens in enumerate(range(10, 200, 20))]
    assert fit_decode_ms_per_token(s for rt in shrinking for s in rt.segments) == {}


def test_non_streamed_calls_without_streamed_peers_are_split_by_the_fit_and_the_warning_says_so():
    calls = [unstreamed(i * 10_000, 300 + 5.0 * tokens, tokens) for i, tokens in enumerate(range(10, 210, 20))]
    out, warnings = split_unstreamed_calls(calls)
    provider, model = out[-1].segments  # 190 tokens x 5 ms
    assert (model.end_ns - model.start_ns) / 1e6 == pytest.approx(950.0)
    assert (provider.end_ns - provider.start_ns) / 1e6 == pytest.approx(300.0)
    assert provider.attrs[ESTIMATED] and model.attrs[ESTIMATED]
    assert len(warnings) == 1 and "fitted" in warnings[0] and "m1 5.00 ms/token over 10 calls" in warnings[0]


def test_streamed_rate_comes_before_the_fit():
    calls = [unstreamed(i * 10_000, 300 + 5.0 * tokens, tokens) for i, tokens in enumerate(range(10, 210, 20))]
    reqs = [streamed(200_000 + i * 1000, 500, 200, 100) for i in range(3)] + calls  # 2 ms/token streamed
    out, warnings = split_unstreamed_calls(reqs)
    _, model = out[-1].segments
    assert (model.end_ns - model.start_ns) / 1e6 == pytest.approx(190 * 2.0)
    assert len(warnings) == 1 and "median time per token of streamed calls" in warnings[0]
