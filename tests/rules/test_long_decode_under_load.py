"""Rule long-decode under load: the tail's tokens come slower because more calls to the model are in flight."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bursts import MODEL_NAME, load_bound, rounds, steady, tokens_of
from timelines import analysed

from latprof.engine import run_rules
from latprof.layers import MODEL
from latprof.pipeline import run_diagnosis
from latprof.report.verdict import decide_verdict
from latprof.rules.long_decode import CALLS_IN_FLIGHT, LOAD_INFERRED_FROM, LongDecode, Thresholds

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def finding(requests: list[Any], rule: LongDecode | None = None) -> Any:
    [f] = (rule or LongDecode()).check(analysed(requests))
    return f


def test_fires_when_the_tail_decodes_slower_beside_more_calls_in_flight() -> None:
    f = finding(rounds(load_bound))
    e = f.evidence
    assert f.layer == MODEL and e["dominant_cause"] == "time_per_token"
    assert e["slow_tokens_cause"] == CALLS_IN_FLIGHT and e["cause_inferred_from"] == LOAD_INFERRED_FROM
    assert e["load_model"] == MODEL_NAME and e["load_endpoint"] == ""
    assert e["tpot_ms_per_call_in_flight"] == pytest.approx(2.0, abs=1e-3)  # the batch's 2 ms per other stream
    assert e["calls_in_flight_tail"] == pytest.approx(29.0, abs=0.5) and e["calls_in_flight_median"] < 3
    assert e["tpot_ms_tail"] == pytest.approx(10 + 2 * 29, abs=0.5) and e["tpot_ms_median"] < 16
    assert e["output_tokens_tail"] == pytest.approx(e["output_tokens_median"], abs=6)  # not longer answers
    assert e["tpot_ms_at_high_in_flight"] > e["tpot_ms_at_low_in_flight"] + 10
    assert e["load_share_of_tpot_excess"] > 0.95
    assert "rises with the calls to gpt-4o-mini in flight" in f.summary and "by 2.00 ms per extra call" in f.summary
    assert "inferred from a correlation" in f.summary
    assert "cap the calls in flight" in f.fix and "max-num-seqs" in f.fix and "provisioned throughput" in f.fix
    assert "faster model" not in f.fix and "max_tokens" not in f.fix


def test_the_verdict_names_long_decode_whose_finding_says_load() -> None:
    a = analysed(rounds(load_bound))
    findings = run_rules(a, [LongDecode()])
    verdict = decide_verdict(a, findings)
    assert (verdict.layer, verdict.rule) == (MODEL, "long-decode")
    assert verdict.confidence > 0.9  # the layer is measured; only the cause inside it is inferred
    assert findings[0].evidence["slow_tokens_cause"] == CALLS_IN_FLIGHT


def test_the_threshold_decides_how_much_of_the_slower_tokens_the_load_must_explain() -> None:
    requests = rounds(load_bound)
    share = finding(requests).evidence["load_share_of_tpot_excess"]
    above = finding(requests, LongDecode(Thresholds(min_load_share_of_tpot_excess=share + 0.01)))
    assert above.evidence["slow_tokens_cause"] == "unknown" and "cause_inferred_from" not in above.evidence
    assert "faster model" in above.fix and "cap the calls in flight" not in above.fix


def test_both_fixes_when_the_tail_is_longer_and_slower_under_load() -> None:
    def longer_bursts(i: int, r: int, others: int) -> tuple[int, float]:
        tokens, tpot = load_bound(i, r, others)
        return (tokens * 3 if others > 10 else tokens), tpot

    f = finding(rounds(longer_bursts))
    assert f.evidence["slow_tokens_cause"] == CALLS_IN_FLIGHT
    assert "max_tokens" in f.fix and "cap the calls in flight" in f.fix


# --- not firing ------------------------------------------------------------------------------------


def test_not_load_when_the_tail_generates_longer_answers() -> None:
    def long_now_and_then(i: int, r: int, others: int) -> tuple[int, float]:
        return (2000 if i % 40 == 39 else tokens_of(r)), 10.0

    f = finding(rounds(long_now_and_then))
    assert f.evidence["dominant_cause"] == "output_tokens"
    assert "slow_tokens_cause" not in f.evidence and "calls in flight" not in f.summary
    assert "max_tokens" in f.fix and "cap the calls in flight" not in f.fix


def test_not_load_when_slow_tokens_do_not_depend_on_the_calls_in_flight() -> None:
    def slow_now_and_then(i: int, r: int, others: int) -> tuple[int, float]:
        return tokens_of(r), 60.0 if i % 40 == 39 else 10.0

    f = finding(rounds(slow_now_and_then))  # bursts of 30 come and go, tokens do not care
    e = f.evidence
    assert e["dominant_cause"] == "time_per_token" and e["slow_tokens_cause"] == "unknown"
    assert abs(e["tpot_ms_per_call_in_flight"]) < 0.2
    assert "in flight" not in f.summary and "faster model" in f.fix and "cap the calls in flight" not in f.fix


def test_no_finding_when_the_load_does_not_slow_tokens() -> None:
    assert list(LongDecode().check(analysed(rounds(steady)))) == []


def test_not_load_on_the_long_outputs_demo_capture() -> None:
    diagnosis = run_diagnosis([EXAMPLES / "long_decode.jsonl.gz"])
    [f] = [f for f in diagnosis.findings if f.rule == "long-decode"]
    assert f.evidence["dominant_cause"] == "output_tokens" and "slow_tokens_cause" not in f.evidence
    assert diagnosis.report.verdict.rule == "long-decode" and "cap the calls in flight" not in f.fix
