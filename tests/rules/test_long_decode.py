"""Rule long-decode: decode owns the tail; many output tokens told apart from slow tokens."""

from __future__ import annotations

from typing import Any

import pytest
from timelines import analysed, req, seg

from latprof.engine import fingerprint, run_rules
from latprof.layers import APP, MODEL, PROVIDER, QUEUE
from latprof.rules.long_decode import LongDecode, Thresholds, decode_cohort, split_excess
from latprof.semconv import (
    ESTIMATED,
    GEN_AI_INPUT_TOKENS,
    GEN_AI_OUTPUT_TOKENS,
    GEN_AI_REQUEST_MODEL,
    LLM_CALL_ID,
    TTFT_KNOWN,
)
from latprof.analysis.timeline import RequestTimeline

MINI = "gpt-4o-mini"


def decode_request(
    i: int,
    output_tokens: int | None,
    tpot_ms: float,
    *,
    model: str = MINI,
    route: str = "POST /chat",
    queue_ms: float = 0.0,
    **model_attrs: Any,
) -> RequestTimeline:
    """Queue (optional), 30 ms app, a 400 ms TTFT, then `output_tokens` x `tpot_ms` of decode."""
    t0 = i * 50.0
    call = {LLM_CALL_ID: f"call-{i}", GEN_AI_REQUEST_MODEL: model}
    decode_ms = (output_tokens or 150) * tpot_ms
    attrs: dict[str, Any] = {**call, **model_attrs}
    if output_tokens is not None:
        attrs[GEN_AI_OUTPUT_TOKENS] = output_tokens
    start = t0 + queue_ms
    segments = [seg(QUEUE, t0, start)] if queue_ms else []
    segments += [
        seg(APP, start, start + 30),
        seg(PROVIDER, start + 30, start + 430, **call, **{TTFT_KNOWN: True, GEN_AI_INPUT_TOKENS: 800}),
        seg(MODEL, start + 430, start + 430 + decode_ms, **attrs),
    ]
    return req(t0, start + 430 + decode_ms, *segments, route=route)


def typical_tokens(i: int) -> int:
    return 145 + i % 11  # 145..155, mean 150


def many_tokens(n: int = 200, *, model: str = MINI) -> list[RequestTimeline]:
    """Every 40th request writes a 3,000-token report at the usual 5 ms per token."""
    return [
        decode_request(i, 3000, 5.0, route="POST /report", model=model)
        if i % 40 == 39
        else decode_request(i, typical_tokens(i), 5.0, model=model)
        for i in range(n)
    ]


def slow_tokens(n: int = 200) -> list[RequestTimeline]:
    """Every 40th request decodes the usual 150 tokens at 60 ms per token instead of 5."""
    return [
        decode_request(i, 150 if i % 40 == 39 else typical_tokens(i), 60.0 if i % 40 == 39 else 5.0) for i in range(n)
    ]


def findings(requests: list[RequestTimeline], rule: LongDecode | None = None) -> list[Any]:
    return list((rule or LongDecode()).check(analysed(requests)))


# --- firing ---------------------------------------------------------------------------------------


def test_fires_when_the_tail_generates_many_more_tokens() -> None:
    requests = many_tokens()
    a = analysed(requests)
    stats = a.layer(MODEL)
    [f] = LongDecode().check(a)
    e = f.evidence
    assert f.rule == "long-decode" and f.layer == MODEL and f.severity == "critical"
    assert f.impact_ms == pytest.approx(stats.tail_excess_ms, abs=1e-3)
    assert e["tail_excess_ms"] == pytest.approx(stats.tail_excess_ms, abs=1e-3)
    assert e["share_of_tail_excess"] == pytest.approx(1.0, abs=1e-3)
    assert e["decode_p50_ms"] == pytest.approx(750.0, abs=25.0)  # 150 tokens x 5 ms
    assert e["decode_p99_ms"] > 10_000
    assert e["output_tokens_tail"] == 3000
    assert e["output_tokens_median"] == pytest.approx(150.0, abs=5.0)
    assert e["tpot_ms_tail"] == pytest.approx(5.0, abs=1e-3)
    assert e["tpot_ms_median"] == pytest.approx(5.0, abs=1e-3)
    assert e["dominant_cause"] == "output_tokens"
    assert e["excess_from_time_per_token_ms"] == pytest.approx(0.0, abs=1.0)
    assert e["excess_from_output_tokens_ms"] == pytest.approx((3000 - e["output_tokens_median"]) * 5.0, abs=1.0)
    assert e["output_tokens_share_of_excess"] == pytest.approx(1.0, abs=1e-3)
    assert e["tail_routes"] == ["POST /report"] and e["tail_models"] == [MINI]
    reports = {rt.request.request_id for rt in requests if rt.request.route == "POST /report"}
    assert len(e["example_request_ids"]) == 3 and set(e["example_request_ids"]) <= reports
    assert "3,000 output tokens vs 15" in f.summary and "many more tokens" in f.summary
    assert "max_tokens" in f.fix and "POST /report" in f.fix and "Stream" in f.fix
    assert "faster model" not in f.fix


def test_fires_when_the_tail_generates_tokens_slower() -> None:
    [f] = findings(slow_tokens())
    e = f.evidence
    assert e["dominant_cause"] == "time_per_token"
    assert e["tpot_ms_tail"] == pytest.approx(60.0, abs=1e-3)
    assert e["tpot_ms_median"] == pytest.approx(5.0, abs=1e-3)
    assert e["output_tokens_tail"] == 150 and e["output_tokens_median"] == pytest.approx(150.0, abs=5.0)
    # (60 - 5) ms x mean of 150 and the median cohort's tokens
    assert e["excess_from_time_per_token_ms"] == pytest.approx(55.0 * (150 + e["output_tokens_median"]) / 2, abs=1.0)
    assert abs(e["excess_from_output_tokens_ms"]) < 0.05 * e["excess_from_time_per_token_ms"]
    assert "tokens come slower" in f.summary
    assert "faster model" in f.fix and "max_tokens" not in f.fix and "Stream" in f.fix


def test_names_both_causes_when_both_matter() -> None:
    requests = [
        decode_request(i, 1000, 20.0) if i % 40 == 39 else decode_request(i, typical_tokens(i), 5.0) for i in range(200)
    ]
    [f] = findings(requests)
    e = f.evidence
    # tokens: (1000-150) x (20+5)/2 ~ 10.6 s; speed: 15 x (1000+150)/2 ~ 8.6 s
    assert e["dominant_cause"] == "output_tokens"
    assert 0.5 < e["output_tokens_share_of_excess"] < 0.6
    assert "max_tokens" in f.fix and "faster model" in f.fix


def test_decode_split_sums_to_the_difference_in_mean_decode() -> None:
    median = decode_cohort([decode_request(i, 100 + i, 5.0) for i in range(5)])
    tail = decode_cohort([decode_request(i, 900, 12.0) for i in range(3)])
    assert median is not None and tail is not None
    assert median.mean_output_tokens == pytest.approx(102.0) and median.tpot_ms == pytest.approx(5.0)
    from_tokens, from_tpot = split_excess(median, tail)
    assert from_tokens + from_tpot == pytest.approx(900 * 12.0 - 102 * 5.0)
    assert from_tokens == pytest.approx((900 - 102) * (12.0 + 5.0) / 2)


def test_cause_is_unknown_without_output_token_counts() -> None:
    requests = [decode_request(i, None, 60.0 if i % 40 == 39 else 5.0) for i in range(200)]
    [f] = findings(requests)
    assert f.evidence["dominant_cause"] == "unknown"
    assert "output_tokens_tail" not in f.evidence
    assert "cannot be told apart" in f.summary and "Record output token counts" in f.fix


def test_estimated_decode_segments_are_left_out_of_time_per_token() -> None:
    requests = many_tokens()
    # Non-streamed calls split by an estimate: 10 "tokens" over 750 ms would read as 75 ms/token.
    for i in range(200, 240):
        requests.append(decode_request(i, 10, 75.0, **{ESTIMATED: True}))
    [f] = findings(requests)
    assert f.evidence["estimated_segments_excluded"] == 40
    assert f.evidence["tpot_ms_median"] == pytest.approx(5.0, abs=1e-3)


def test_fingerprint_is_stable_and_differs_by_model() -> None:
    [first] = findings(many_tokens())
    [again] = findings(slow_tokens())
    [other] = findings(many_tokens(model="gpt-4o"))
    assert first.fingerprint == again.fingerprint == fingerprint("long-decode", MODEL, MINI)
    assert other.fingerprint != first.fingerprint


def test_rule_runs_inside_the_engine() -> None:
    [f] = run_rules(analysed(many_tokens()), [LongDecode()])
    assert not f.crashed and f.rule == "long-decode"


# --- not firing ------------------------------------------------------------------------------------


def test_does_not_fire_when_there_is_no_tail() -> None:
    requests = [decode_request(i, 100 + i % 60, 5.0) for i in range(200)]  # decode 0.5-0.8 s, dominant
    a = analysed(requests)
    assert not a.has_tail and a.layer(MODEL).share_of_tail_excess > 0.9
    assert findings(requests) == []


def test_does_not_fire_with_too_few_requests_for_a_verdict() -> None:
    assert findings(many_tokens(40)) == []


def test_does_not_fire_when_another_layer_owns_the_tail() -> None:
    requests = [decode_request(i, typical_tokens(i), 5.0, queue_ms=5000.0 if i % 40 == 39 else 0.0) for i in range(200)]
    a = analysed(requests)
    assert a.has_tail and a.layer(QUEUE).share_of_tail_excess > 0.9
    assert findings(requests) == []


def test_does_not_fire_when_thresholds_are_raised() -> None:
    requests = many_tokens()
    assert findings(requests)
    assert findings(requests, LongDecode(Thresholds(min_tail_excess_ms=1_000_000.0))) == []
    assert findings(requests, LongDecode(Thresholds(min_share_of_tail_excess=1.01))) == []
