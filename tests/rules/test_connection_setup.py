"""Rule connection-setup: DNS, TCP and TLS inside time to first token, its causes, and where it must stay quiet."""

from __future__ import annotations

import random
from typing import Any

from timelines import analysed, req, seg

from latprof.analysis.network import net_calls, tail_setup_excess_ms
from latprof.engine import run_rules
from latprof.layers import APP, MODEL, PROVIDER
from latprof.report.verdict import decide_verdict
from latprof.rules import connection_setup
from latprof.rules.connection_setup import ConnectionSetup
from latprof.rules.provider_floor import ProviderFloor
from latprof.semconv import (
    GEN_AI_OUTPUT_TOKENS,
    GEN_AI_REQUEST_MODEL,
    LLM_CALL_ID,
    NET_CONNECT_MS,
    NET_NEW_CONNECTION,
    NET_SERVER_MS,
    NET_TLS_MS,
    TTFT_KNOWN,
)


def call_request(i: int, *, setup_ms: float | None, server_ms: float = 200.0, extra_ttft_ms: float = 0.0) -> Any:
    """App work, then one streamed LLM call whose TTFT is its connection set-up (None: a reused
    connection; no timings at all when `setup_ms` is NaN) plus `server_ms` plus `extra_ttft_ms`."""
    t0 = i * 40.0
    attrs: dict[str, Any] = {LLM_CALL_ID: f"c{i}", GEN_AI_REQUEST_MODEL: "m", TTFT_KNOWN: True}
    setup = setup_ms or 0.0
    if setup_ms is None or setup_ms == setup_ms:  # not NaN: the client said how the attempt went
        attrs[NET_NEW_CONNECTION] = setup_ms is not None
        attrs[NET_SERVER_MS] = server_ms
        if setup_ms is not None:
            attrs[NET_CONNECT_MS] = round(setup * 0.4, 3)
            attrs[NET_TLS_MS] = round(setup * 0.6, 3)
    else:
        setup = 0.0
    first = t0 + 20 + setup + server_ms + extra_ttft_ms
    return req(
        t0,
        first + 50,
        seg(APP, t0, t0 + 20),
        seg(PROVIDER, t0 + 20, first, name="chat m", **attrs),
        seg(MODEL, first, first + 50, name="chat m", **{LLM_CALL_ID: f"c{i}", GEN_AI_OUTPUT_TOKENS: 10}),
    )


def check(requests: list[Any]) -> list[Any]:
    return list(ConnectionSetup().check(analysed(requests)))


def test_slow_handshakes_in_the_tail_own_it_and_name_the_verdict_over_provider_floor() -> None:
    rng = random.Random(3)
    requests = [call_request(i, setup_ms=1000.0 + rng.uniform(0, 50) if i % 33 == 5 else 20.0 + rng.uniform(0, 4))
                for i in range(400)]  # fmt: skip
    analysis = analysed(requests)
    (finding,) = ConnectionSetup().check(analysis)
    evidence = finding.evidence
    assert evidence["cause"] == connection_setup.SLOW_SETUP, evidence
    assert evidence["new_connection_share"] == 1.0
    assert 900 <= evidence["tail_excess_ms"] <= 1060, evidence  # ~1,000 ms more set-up than a median request
    assert evidence["share_of_tail_excess"] >= 0.9, evidence
    assert 20 <= evidence["setup_per_new_connection_p50_ms"] <= 24, evidence
    assert finding.impact_ms == evidence["tail_excess_ms"] and finding.severity == "critical"
    assert "Inferred cause" in finding.summary and "retransmission" in finding.summary
    assert 8 <= evidence["round_trip_ms_inferred"] <= 10  # the connect part (40%) of a ~22 ms set-up
    assert tail_setup_excess_ms(analysis, net_calls(analysis)) == evidence["tail_excess_ms"] or abs(tail_setup_excess_ms(analysis, net_calls(analysis)) - evidence["tail_excess_ms"]) < 1e-3
    # The provider owns the tail; of its two explanations, the one that explains the excess is named.
    findings = run_rules(analysis, [ConnectionSetup(), ProviderFloor()])
    verdict = decide_verdict(analysis, findings)
    assert verdict.layer == PROVIDER and verdict.rule == "connection-setup", (verdict, [(f.rule, f.impact_ms) for f in findings])
    # provider-floor leaves the set-up out of its impact and calls none of it provider-side queueing
    (floor,) = [f for f in findings if f.rule == "provider-floor"]
    assert floor.impact_ms < 20 and "queueing" not in floor.summary, (floor.impact_ms, floor.summary)
    assert 990 <= floor.evidence["tail_connection_setup_ms"] <= 1060, floor.evidence


def test_a_tail_that_opened_the_connections_the_median_reused_is_too_few_idle_connections() -> None:
    requests = [call_request(i, setup_ms=300.0 if i % 25 == 3 else None) for i in range(300)]
    (finding,) = check(requests)
    evidence = finding.evidence
    assert evidence["cause"] == connection_setup.TOO_FEW_IDLE_CONNECTIONS, evidence
    assert evidence["tail_new_connection_share"] == 1.0 and evidence["median_new_connection_share"] == 0.0
    assert evidence["new_connection_share"] == 0.04
    assert "max_keepalive_connections" in finding.fix


def test_every_call_paying_a_far_handshake_is_keepalive_lost_without_a_tail() -> None:
    requests = [call_request(i, setup_ms=150.0 + (i % 7)) for i in range(200)]
    (finding,) = check(requests)
    evidence = finding.evidence
    assert evidence["cause"] == connection_setup.KEEPALIVE_LOST, evidence
    assert finding.impact_ms == 0.0 and "tail_excess_ms" not in evidence  # no tail to own: a share of every TTFT
    assert 0.4 <= evidence["setup_share_of_ttft"] <= 0.45, evidence  # ~153 of ~353 ms
    assert finding.severity == "warning"
    assert "http2=True" in finding.fix


def test_a_warm_pool_with_provider_spikes_says_nothing() -> None:
    # Two cold connections at the start, then reuse; the tail is the provider's own queueing.
    requests = [call_request(i, setup_ms=200.0 if i < 2 else None, extra_ttft_ms=1500.0 if i % 30 == 7 else 0.0)
                for i in range(300)]  # fmt: skip
    assert check(requests) == []
    analysis = analysed(requests)
    assert tail_setup_excess_ms(analysis, net_calls(analysis)) == 0.0


def test_a_near_endpoint_that_reconnects_every_call_is_below_the_threshold() -> None:
    requests = [call_request(i, setup_ms=1.0) for i in range(200)]  # 1 ms of a 221 ms TTFT
    assert check(requests) == []


def test_calls_without_network_timings_say_nothing() -> None:
    requests = [call_request(i, setup_ms=float("nan"), extra_ttft_ms=1500.0 if i % 30 == 7 else 0.0) for i in range(300)]
    assert check(requests) == []
    analysis = analysed(requests)
    assert tail_setup_excess_ms(analysis, net_calls(analysis)) == 0.0


def test_too_few_timed_calls_say_nothing() -> None:
    requests = [call_request(i, setup_ms=float("nan")) for i in range(300)]
    requests[:5] = [call_request(i, setup_ms=400.0) for i in range(5)]
    assert check(requests) == []
