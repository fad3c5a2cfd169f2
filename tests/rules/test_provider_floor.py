"""Rule provider-floor: TTFT split into a floor and a per-input-token part, per model."""

from __future__ import annotations

import random
from typing import Any

import pytest
from timelines import analysed, req, seg

from latprof.engine import fingerprint, run_rules
from latprof.layers import APP, MODEL, PROVIDER
from latprof.rules.provider_floor import ProviderFloor, Thresholds, fit_floor
from latprof.semconv import (
    ESTIMATED,
    GEN_AI_INPUT_TOKENS,
    GEN_AI_OPERATION_NAME,
    GEN_AI_OUTPUT_TOKENS,
    GEN_AI_REQUEST_MODEL,
    LLM_CALL_ID,
    SPLIT_UNKNOWN,
    TTFT_KNOWN,
)
from latprof.analysis.timeline import RequestTimeline

MINI = "gpt-4o-mini"


def llm_request(
    i: int,
    ttft_ms: float,
    input_tokens: int | None,
    *,
    model: str = MINI,
    streamed: bool = True,
    app_ms: float = 40.0,
    decode_ms: float = 300.0,
    **provider_attrs: Any,
) -> RequestTimeline:
    """App work, then one LLM call: `provider` for `ttft_ms`, then `model` for `decode_ms`."""
    t0 = i * 50.0
    call = {LLM_CALL_ID: f"call-{i}", GEN_AI_REQUEST_MODEL: model}
    attrs: dict[str, Any] = {**call, GEN_AI_OPERATION_NAME: "chat", TTFT_KNOWN: streamed, **provider_attrs}
    if input_tokens is not None:
        attrs[GEN_AI_INPUT_TOKENS] = input_tokens
    first_token = t0 + app_ms + ttft_ms
    return req(
        t0,
        first_token + decode_ms,
        seg(APP, t0, t0 + app_ms),
        seg(PROVIDER, t0 + app_ms, first_token, name=f"chat {model}", **attrs),
        seg(
            MODEL,
            first_token,
            first_token + decode_ms,
            name=f"chat {model} stream",
            **call,
            **{GEN_AI_OUTPUT_TOKENS: 60},
        ),
    )


def floor_population(
    n: int = 150,
    *,
    floor_ms: float = 700.0,
    ms_per_1k: float = 40.0,
    model: str = MINI,
    seed: int = 1,
    first: int = 0,
    spike_every: int = 0,
    spike_ms: float = 4000.0,
    constant_tokens: int | None = None,
    **kw: Any,
) -> list[RequestTimeline]:
    """Streamed calls with TTFT = floor + slope x tokens / 1000 + noise in [-5, 5] ms."""
    rng = random.Random(seed)
    out = []
    for i in range(first, first + n):
        tokens = constant_tokens if constant_tokens is not None else rng.randint(200, 8000)
        ttft = floor_ms + ms_per_1k * tokens / 1000 + rng.uniform(-5.0, 5.0)
        if spike_every and i % spike_every == spike_every - 1:
            ttft += spike_ms
        out.append(llm_request(i, ttft, tokens, model=model, **kw))
    return out


def findings(requests: list[RequestTimeline], rule: ProviderFloor | None = None) -> list[Any]:
    return list((rule or ProviderFloor()).check(analysed(requests)))


# --- the fit on its own ------------------------------------------------------------------------


def test_fit_recovers_floor_and_slope_of_an_exact_line() -> None:
    tokens = [200 + 97 * k for k in range(60)]
    fit = fit_floor([700 + 40 * t / 1000 for t in tokens], tokens)
    assert fit.ms_per_1k_input_tokens == pytest.approx(40.0)
    assert fit.floor_ms == pytest.approx(700.0)
    assert fit.intercept_ms == pytest.approx(700.0)
    assert fit.r_squared == pytest.approx(1.0) and fit.robust_r_squared == pytest.approx(1.0)
    assert fit.fitted_calls == 60


def test_fit_ignores_queueing_spikes_for_the_slope() -> None:
    tokens = [200 + 97 * k for k in range(100)]
    ttfts = [700 + 40 * t / 1000 + (3000 if k % 25 == 3 else 0) for k, t in enumerate(tokens)]
    fit = fit_floor(ttfts, tokens)
    assert fit.ms_per_1k_input_tokens == pytest.approx(40.0, abs=0.01)
    assert fit.floor_ms == pytest.approx(700.0, abs=0.5)


def test_theil_sen_recovers_a_known_slope_within_10_percent_from_noisy_spiky_calls() -> None:
    """Calls drawn with heavy noise, 8% provider-side queueing spikes (0.5-6 s) and a few
    stalls at the shortest prompts: Theil-Sen recovers the slope within 10% without trimming,
    where an ordinary least-squares line is pulled far off."""
    rng = random.Random(23)
    tokens, ttfts = [], []
    for k in range(600):
        n = rng.randint(300, 12_000)
        ttft = 450 + 55 * n / 1000 + rng.gauss(0, 60)
        if rng.random() < 0.08:
            ttft += rng.uniform(500, 6000)
        if n < 1500 and rng.random() < 0.3:
            ttft += 2500  # spikes that happen to hit short prompts tilt a least-squares line down
        tokens.append(n)
        ttfts.append(ttft)
    fit = fit_floor(ttfts, tokens)
    assert fit.ms_per_1k_input_tokens == pytest.approx(55.0, rel=0.10)
    assert fit.fitted_calls == 600
    assert fit.robust_r_squared is not None and fit.robust_r_squared > 0.8  # the bulk follows the line ...
    assert fit.r_squared is not None and fit.r_squared < fit.robust_r_squared  # ... the spikes do not
    xs = [n / 1000 for n in tokens]
    mean_x, mean_y = sum(xs) / len(xs), sum(ttfts) / len(ttfts)
    ols = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ttfts)) / sum((x - mean_x) ** 2 for x in xs)
    assert abs(ols - 55.0) > 0.10 * 55.0  # the case is one least squares gets wrong


def test_fit_without_token_counts_is_the_low_percentile() -> None:
    ttfts = [float(600 + k) for k in range(101)]  # p5 is exactly 605
    fit = fit_floor(ttfts, [None] * 101)
    assert fit.floor_ms == pytest.approx(605.0)
    assert fit.ms_per_1k_input_tokens is None and fit.r_squared is None


def test_fit_clamps_a_negative_slope_and_a_negative_floor() -> None:
    tokens = [1000 * k for k in range(1, 41)]
    falling = fit_floor([2000 - 10 * t / 1000 for t in tokens], tokens)
    assert falling.ms_per_1k_input_tokens == 0.0
    assert falling.floor_ms == pytest.approx(sorted(2000 - 10 * k for k in range(1, 41))[1] + 0.95 * 10, abs=1.0)
    steep = fit_floor([-50 + 40 * t / 1000 for t in tokens], tokens)
    assert steep.floor_ms == 0.0


# --- firing ---------------------------------------------------------------------------------------


def test_fires_with_floor_and_slope_when_provider_dominates_typical_latency() -> None:
    requests = floor_population()
    a = analysed(requests)
    assert not a.has_tail  # uniformly slow at the floor: no tail, still worth saying
    [f] = ProviderFloor().check(a)
    e = f.evidence
    assert f.rule == "provider-floor" and f.layer == PROVIDER
    assert e["model"] == MINI and e["calls"] == 150 and e["fitted_calls"] == 150
    assert e["floor_ms"] == pytest.approx(700.0, abs=8.0)
    assert e["ms_per_1k_input_tokens"] == pytest.approx(40.0, abs=1.0)
    assert e["r_squared"] > 0.95
    assert e["floor_ms"] <= e["ttft_p5_ms"] <= e["ttft_p50_ms"] <= e["ttft_p99_ms"]
    assert e["floor_share_of_ttft_p50"] == pytest.approx(e["floor_ms"] / e["ttft_p50_ms"], abs=1e-3)
    assert e["floor_share_of_ttft_p99"] == pytest.approx(e["floor_ms"] / e["ttft_p99_ms"], abs=1e-3)
    assert 200 <= e["input_tokens_p50"] <= e["input_tokens_p99"] <= 8000
    assert e["prompt_part_at_p50_input_ms"] == pytest.approx(40.0 * e["input_tokens_p50"] / 1000, rel=0.05)
    assert e["non_streamed_calls_excluded"] == 0
    assert e["provider_share_of_median_latency"] > 0.5
    assert f.severity == "warning"
    assert f.impact_ms == pytest.approx(max(0.0, a.layer(PROVIDER).tail_excess_ms), abs=1e-3)
    assert "floor of 69" in f.summary or "floor of 70" in f.summary
    assert "no prompt change moves" in f.summary and "40 ms per 1k input tokens" in f.summary
    assert "provisioned throughput" in f.fix and "Stream" in f.fix and "caching" in f.fix
    assert "Trim prompts first" not in f.fix  # the floor dominates, not the prompt


def test_fires_critical_when_provider_queueing_owns_the_tail() -> None:
    requests = floor_population(200, spike_every=50)
    a = analysed(requests)
    stats = a.layer(PROVIDER)
    assert a.has_tail and stats.share_of_tail_excess > 0.95
    [f] = ProviderFloor().check(a)
    e = f.evidence
    assert f.severity == "critical"
    assert f.impact_ms == pytest.approx(stats.tail_excess_ms, abs=1e-3)
    assert e["floor_ms"] == pytest.approx(700.0, abs=8.0)  # the spikes do not move the floor ...
    assert e["ms_per_1k_input_tokens"] == pytest.approx(40.0, abs=1.0)  # ... nor the slope
    assert e["tail_calls"] == 3
    assert e["tail_ttft_above_floor_and_prompt_ms"] == pytest.approx(4000.0, abs=15.0)
    spiked = {requests[i].request.request_id for i in range(49, 200, 50)}
    assert set(e["example_request_ids"]) <= spiked and len(e["example_request_ids"]) == 3
    assert f.summary.startswith("The provider owns 100% of the tail excess")
    assert "above floor and prompt (provider-side queueing)" in f.summary
    assert "hedged" in f.fix
    # A long prompt that is not the tail's cause: the spikes hit prompts of every length.
    assert e["tail_excess_share_from_prompt"] < 0.15
    assert e["tail_ttft_excess_ms"] == pytest.approx(4000.0, abs=400.0)
    assert "longer prompts explain" not in f.summary


def test_says_how_much_of_the_tails_ttft_long_prompts_explain() -> None:
    """2% of calls carry 40k-token prompts at 40 ms per 1k: they are the tail, and the line
    explains their extra TTFT (1.6 s of it) whole."""
    requests = [
        llm_request(i, 700 + 40 * n / 1000 + (i % 7), n)
        for i, n in enumerate(40_000 if i % 50 == 49 else 300 + (i * 37) % 2000 for i in range(300))
    ]
    [f] = findings(requests)
    e = f.evidence
    assert f.summary.startswith("The provider owns")
    assert e["ms_per_1k_input_tokens"] == pytest.approx(40.0, rel=0.05)
    assert e["tail_prompt_part_ms"] == pytest.approx(1600.0, rel=0.05)
    assert e["tail_prompt_share_of_ttft"] == pytest.approx(1600 / 2300, abs=0.03)
    assert e["tail_excess_share_from_prompt"] > 0.9
    assert e["tail_excess_from_prompt_ms"] == pytest.approx(e["tail_ttft_excess_ms"], rel=0.1)
    assert "longer prompts explain" in f.summary and "of the tail's extra TTFT" in f.summary
    assert "provider-side queueing" not in f.summary  # a few ms above floor and prompt is the fit's noise


def test_fix_leads_with_trimming_prompts_when_the_prompt_part_dominates() -> None:
    [f] = findings(floor_population(floor_ms=250.0, ms_per_1k=300.0))
    assert f.evidence["prompt_part_at_p50_input_ms"] > f.evidence["floor_ms"]
    assert f.fix.startswith("Trim prompts first")


def test_floor_is_the_low_percentile_when_input_tokens_do_not_vary() -> None:
    [f] = findings(floor_population(constant_tokens=1500))
    e = f.evidence
    assert e["ms_per_1k_input_tokens"] is None and "r_squared" not in e
    assert e["floor_ms"] == e["ttft_p5_ms"]
    assert e["floor_ms"] == pytest.approx(700 + 60 - 4.5, abs=2.0)  # p5 of uniform noise in [-5, 5]
    assert "prompt's part is unknown" in f.summary


def test_floor_is_the_low_percentile_when_input_tokens_are_missing() -> None:
    requests = [llm_request(i, 800.0 + i % 10, None) for i in range(120)]
    [f] = findings(requests)
    assert f.evidence["ms_per_1k_input_tokens"] is None and "input_tokens_p50" not in f.evidence
    assert f.evidence["floor_ms"] == pytest.approx(800.0, abs=1.0)


def test_one_finding_per_model_with_its_own_floor() -> None:
    requests = floor_population(120, model=MINI) + floor_population(
        120, model="gpt-4o", floor_ms=1200.0, ms_per_1k=80.0, seed=2, first=120
    )
    by_model = {f.evidence["model"]: f for f in findings(requests)}
    assert set(by_model) == {MINI, "gpt-4o"}
    assert by_model[MINI].evidence["floor_ms"] == pytest.approx(700.0, abs=8.0)
    assert by_model["gpt-4o"].evidence["floor_ms"] == pytest.approx(1200.0, abs=8.0)
    assert by_model["gpt-4o"].evidence["ms_per_1k_input_tokens"] == pytest.approx(80.0, abs=1.5)
    assert by_model[MINI].fingerprint != by_model["gpt-4o"].fingerprint
    assert "For gpt-4o," in by_model["gpt-4o"].summary


def test_tail_impact_is_split_between_models_by_their_tail_time() -> None:
    requests = floor_population(100, model=MINI) + floor_population(
        100, model="gpt-4o", seed=2, first=100, spike_every=25
    )
    a = analysed(requests)
    by_model = {f.evidence["model"]: f for f in ProviderFloor().check(a)}
    assert by_model["gpt-4o"].severity == "critical"
    assert by_model[MINI].impact_ms == 0.0  # no tail request called it ...
    assert by_model[MINI].severity == "warning"  # ... so it is reported for typical latency only
    assert not by_model[MINI].summary.startswith("The provider owns")
    assert by_model["gpt-4o"].summary.startswith("The provider owns 100% of the tail excess")
    assert "longer for first tokens from gpt-4o" in by_model["gpt-4o"].summary
    assert by_model["gpt-4o"].evidence["share_of_tail_excess"] == pytest.approx(1.0, abs=1e-3)
    assert by_model["gpt-4o"].impact_ms == pytest.approx(a.layer(PROVIDER).tail_excess_ms, abs=1e-3)


def test_fingerprint_is_stable_across_runs_of_the_same_model() -> None:
    [first] = findings(floor_population(seed=1))
    [second] = findings(floor_population(seed=7, floor_ms=900.0))
    assert first.fingerprint == second.fingerprint == fingerprint("provider-floor", PROVIDER, MINI)
    assert first.evidence["floor_ms"] != second.evidence["floor_ms"]


def test_non_streamed_calls_are_kept_out_of_the_floor() -> None:
    streamed = floor_population(150)
    # Short non-streamed calls: their provider segment is the whole call, not a TTFT; counted
    # in the floor they would drag it down to ~150 ms.
    non_streamed = [llm_request(i, 150.0 + i % 5, 900, streamed=False) for i in range(150, 200)]
    [f] = findings(streamed + non_streamed)
    assert f.evidence["non_streamed_calls_excluded"] == 50
    assert f.evidence["calls"] == 150
    assert f.evidence["floor_ms"] == pytest.approx(700.0, abs=8.0)


def test_rule_runs_inside_the_engine() -> None:
    [f] = run_rules(analysed(floor_population()), [ProviderFloor()])
    assert not f.crashed and f.rule == "provider-floor"


# --- not firing ------------------------------------------------------------------------------------


def test_does_not_fire_when_too_few_calls_are_streamed() -> None:
    streamed = floor_population(19)
    non_streamed = [llm_request(i, 900.0, 2000, streamed=False) for i in range(19, 120)]
    assert findings(streamed + non_streamed) == []


def test_does_not_fire_when_only_non_streamed_calls_were_seen() -> None:
    requests = [llm_request(i, 900.0 + i % 13, 1000 + 50 * i, streamed=False) for i in range(150)]
    assert analysed(requests).layer(PROVIDER).median_mean_ms > 800  # the provider dominates ...
    assert findings(requests) == []  # ... but no TTFT was measured, so there is no floor


def test_does_not_fire_when_ttft_known_is_absent() -> None:
    requests = [llm_request(i, 900.0 + i % 13, 1000 + 50 * i, **{TTFT_KNOWN: None}) for i in range(150)]
    assert findings(requests) == []


def test_does_not_fire_on_attach_mode_llm_time_whose_split_is_unknown() -> None:
    requests = [llm_request(i, 900.0 + i % 13, 1000, **{SPLIT_UNKNOWN: True}) for i in range(150)]
    assert findings(requests) == []


def test_does_not_fire_on_estimated_provider_segments() -> None:
    requests = [llm_request(i, 900.0 + i % 13, 1000 + 50 * i, **{ESTIMATED: True}) for i in range(150)]
    assert findings(requests) == []


def test_does_not_fire_when_the_provider_is_minor() -> None:
    requests = floor_population(app_ms=4000.0)
    a = analysed(requests)
    assert not a.has_tail and a.layer(PROVIDER).median_mean_ms / a.latency.p50_ms < 0.3  # type: ignore[union-attr]
    assert findings(requests) == []


def test_does_not_fire_when_the_floor_is_short_and_there_is_no_tail() -> None:
    assert findings(floor_population(floor_ms=150.0, ms_per_1k=5.0, decode_ms=50.0, app_ms=10.0)) == []


def test_does_not_fire_when_thresholds_are_raised() -> None:
    requests = floor_population()
    assert findings(requests)
    assert findings(requests, ProviderFloor(Thresholds(min_floor_ms=1000.0))) == []
    assert findings(requests, ProviderFloor(Thresholds(min_calls=500))) == []
    assert findings(requests, ProviderFloor(Thresholds(min_share_of_median_latency=0.95))) == []


def test_does_not_claim_the_tail_when_a_raised_threshold_says_it_is_not_owned() -> None:
    requests = floor_population(200, spike_every=50)
    rule = ProviderFloor(Thresholds(min_tail_excess_ms=10_000.0))
    [f] = findings(requests, rule)  # still long and dominant in a typical request ...
    assert not f.summary.startswith("The provider owns")  # ... but not reported as owning the tail
    assert f.severity in ("warning", "info")
