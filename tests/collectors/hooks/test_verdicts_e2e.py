"""Verdicts end to end: each `latprof demo` scenario under real uvicorn, real drivers, real load.

The pool and blocking-call scenarios run under both servers the hooks support, (h11, asyncio)
and (httptools, uvloop); the other asyncio scenarios under one each, taking turns, so that both
servers see every kind of verdict without running each scenario twice (the hook tests run both
servers on every hook); the PostgreSQL and thread-pool scenarios once. Each is 10 s of load
(`LATPROF_TEST_DEMO_SECONDS`). PostgreSQL comes from `$LATPROF_TEST_PG`: without it the test
skips on a developer box and fails in CI.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from apps.harness import CONFIGS
from services import require_pg

from latprof.collectors.hooks._async_request import BLOCKED_BY_OTHERS, HELD_THE_LOOP
from latprof.demo.run import DemoResult, run_demo
from latprof.layers import EVENT_LOOP, MODEL, PROVIDER

PG_DSN = os.environ.get("LATPROF_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
DEMO_SECONDS = float(os.environ.get("LATPROF_TEST_DEMO_SECONDS", "10"))

#: (http, loop) of uvicorn: the same pairs as the hook tests.
SERVERS = [(http, loop) for loop, http in CONFIGS]
SERVER_IDS = [f"{http}+{loop}" for http, loop in SERVERS]
servers = pytest.mark.parametrize(("http", "loop"), SERVERS, ids=SERVER_IDS)


def server(n: int) -> pytest.MarkDecorator:
    """Only the `n`th of SERVERS."""
    return pytest.mark.parametrize(("http", "loop"), SERVERS[n : n + 1], ids=SERVER_IDS[n : n + 1])


def _demo(tmp_path: Path, scenario: str, *, dsn: str | None = None, http: str = "auto", loop: str = "auto") -> DemoResult:
    """Run `scenario` for DEMO_SECONDS; check what every scenario must give; print its margins."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    capture = tmp_path / "demo.jsonl"
    result = run_demo(scenario, dsn=dsn, capture=capture, duration_s=DEMO_SECONDS, progress=None, http=http, loop=loop)
    report = result.report
    verdict, latency = report.verdict, report.latency_ms
    assert latency is not None
    # One line per run (shown with -rP, and on failure): how far from the verdict's thresholds.
    print(
        f"{scenario} ({'PostgreSQL' if dsn else 'SQLite'}, {http}+{loop}): verdict {verdict.layer} ({verdict.status}) rule {verdict.rule}"
        f" share {verdict.share_of_tail_excess} confidence {verdict.confidence};"
        f" p50 {latency['p50']:.0f} ms p99 {latency['p99']:.0f} ms p99/p50 {latency['p99'] / latency['p50']:.2f};"
        f" {report.window['requests']} requests; findings {[f.rule for f in report.findings]}"
    )
    assert result.capture == capture.resolve() and capture.exists()
    assert result.load.errors == 0, result.load.error_samples
    assert report.window["requests"] >= 60, report.window
    assert not report.collection["warnings"], report.collection["warnings"]
    return result


def _names_tail(result: DemoResult, layer: str, rule: str) -> None:
    """The verdict names `layer`, explained by `rule`: in every run, on any host."""
    verdict = result.report.verdict
    assert verdict.layer == layer and verdict.status == "layer", verdict
    assert verdict.rule == rule, verdict


def _margins_missed(result: DemoResult) -> list[str]:
    """What keeps `result` from owning its tail by a wide margin: the layer has >= 80% of the tail's excess, leads
    the slowest 5% too (confidence not halved), and the tail is one by a margin (the verdict needs p99 >= 2x p50; the
    pool scenario measures 2.6-3.0)."""
    report = result.report
    verdict, latency = report.verdict, report.latency_ms
    missed = []
    if verdict.share_of_tail_excess is None or verdict.share_of_tail_excess < 0.8:
        missed.append(f"share of the tail's excess {verdict.share_of_tail_excess} < 0.8")
    if verdict.confidence < 0.8:
        missed.append(f"confidence {verdict.confidence} < 0.8")
    if latency is None or latency["p99"] < 2.25 * latency["p50"]:
        missed.append(f"p99 < 2.25 x p50 ({latency})")
    return missed


def _owns_tail(result: DemoResult, layer: str, rule: str) -> None:
    """`layer` is the verdict by a wide margin, explained by `rule`, and leads the slowest 5% too."""
    _names_tail(result, layer, rule)
    assert not _margins_missed(result), (_margins_missed(result), result.report.verdict)


def _demo_owning_tail(tmp_path: Path, scenario: str, layer: str, rule: str, **kwargs: Any) -> DemoResult:
    """Run `scenario` until it owns its tail by the margins of `_owns_tail`, at most twice.

    The layer and rule must be right in every run. The margins are a quiet host's: a host busy
    with something else during the 10 s (CI once measured the thread-pool scenario's median at
    420 ms instead of 186, and the blocked loop's share of the tail at 0.54 with the right
    layer) slows every request and thins the tail's excess, so a run that misses only them gets
    one more run, which must meet them.
    """
    first = _demo(tmp_path / "run-1", scenario, **kwargs)
    _names_tail(first, layer, rule)
    missed = _margins_missed(first)
    if not missed:
        return first
    print(f"{scenario}: the right layer, but not by the margins ({'; '.join(missed)}): one more run")
    second = _demo(tmp_path / "run-2", scenario, **kwargs)
    _owns_tail(second, layer, rule)
    return second


def _check_pool_verdict(tmp_path: Path, dsn: str | None, http: str = "auto", loop: str = "auto") -> None:
    result = _demo_owning_tail(tmp_path, "pool-held-across-llm", "db.pool", "db-pool-exhaustion", dsn=dsn, http=http, loop=loop)
    # Every hook loaded; the report names those that saw traffic (the service's server, pool,
    # LLM client and loop), not the ones for libraries it never used.
    collectors = set(result.report.collection["collectors"])
    assert {"asgi", "sqlalchemy", "openai", "asyncio_loop"} <= collectors, collectors
    assert not {"wsgi", "aiohttp_web", "aiohttp_client", "redis", "psycopg_pool", "agent_tools"} & collectors, collectors
    (finding,) = [f for f in result.report.findings if f.rule == "db-pool-exhaustion"]
    assert finding.evidence["held_across_llm_share"] >= 0.9
    assert finding.evidence["pool_max"] == 3


@pytest.mark.slow
@servers
def test_pool_held_across_llm_sqlite(tmp_path: Path, http: str, loop: str) -> None:
    _check_pool_verdict(tmp_path, None, http=http, loop=loop)


@pytest.mark.slow
def test_pool_held_across_llm_postgresql(tmp_path: Path) -> None:
    require_pg(PG_DSN)
    _check_pool_verdict(tmp_path, PG_DSN)


@pytest.mark.slow
def test_threadpool_queueing(tmp_path: Path) -> None:
    _demo_owning_tail(tmp_path, "threadpool-queueing", "queue", "request-queueing")


@pytest.mark.slow
@server(0)
def test_provider_floor(tmp_path: Path, http: str, loop: str) -> None:
    result = _demo(tmp_path, "provider-floor", http=http, loop=loop)
    report = result.report
    assert report.verdict.layer is None and report.verdict.status == "no_tail", report.verdict
    assert report.verdict.rule is None
    assert "provider" in report.verdict.summary  # no tail, but it names what typical latency is
    (finding,) = [f for f in report.findings if f.rule == "provider-floor"]
    assert 550 <= finding.evidence["floor_ms"] <= 650, finding.evidence  # the provider's uniform 600 ms
    assert finding.evidence["provider_share_of_median_latency"] >= 0.7


@pytest.mark.slow
@server(1)
def test_provider_spikes(tmp_path: Path, http: str, loop: str) -> None:
    result = _demo_owning_tail(tmp_path, "provider-spikes", PROVIDER, "provider-floor", http=http, loop=loop)
    (finding,) = [f for f in result.report.findings if f.rule == "provider-floor"]
    evidence = finding.evidence
    assert 90 <= evidence["floor_ms"] <= 150, evidence  # the 100 ms TTFT every call pays ...
    # ... and the tail's first tokens came far above it: the 1.8 s spikes, provider-side queueing.
    assert evidence["tail_ttft_above_floor_and_prompt_ms"] >= 900, evidence
    assert evidence["ttft_p99_ms"] >= 1500, evidence
    assert finding.severity == "critical"


@pytest.mark.slow
@server(0)
def test_long_outputs(tmp_path: Path, http: str, loop: str) -> None:
    result = _demo_owning_tail(tmp_path, "long-outputs", MODEL, "long-decode", http=http, loop=loop)
    (finding,) = [f for f in result.report.findings if f.rule == "long-decode"]
    evidence = finding.evidence
    assert evidence["dominant_cause"] == "output_tokens", evidence
    assert evidence["output_tokens_median"] == 8, evidence
    assert evidence["output_tokens_tail"] >= 80, evidence  # long answers are 240 tokens
    assert 8 <= evidence["tpot_ms_tail"] <= 13 and 8 <= evidence["tpot_ms_median"] <= 13, evidence
    assert "provider-floor" not in {f.rule for f in result.report.findings}  # a 100 ms TTFT is no floor to fix


@pytest.mark.slow
@server(1)
def test_growing_context(tmp_path: Path, http: str, loop: str) -> None:
    result = _demo_owning_tail(tmp_path, "growing-context", PROVIDER, "context-growth", http=http, loop=loop)
    (finding,) = [f for f in result.report.findings if f.rule == "context-growth"]
    evidence = finding.evidence
    assert evidence["grouped_by"] == "request" and evidence["turns"] == 10, evidence  # the long agent loops
    assert evidence["input_tokens_last_turn"] >= 5 * evidence["input_tokens_first_turn"], evidence
    assert evidence["ttft_last_turn_ms"] >= 300, evidence  # 60 ms + 60 ms per 1k of ~7k input tokens
    assert 54 <= evidence["ms_per_1k_input_tokens"] <= 66, evidence  # the provider's 60 ms per 1k, within 10%
    assert evidence["tail_excess_share_from_input_tokens"] >= 0.6, evidence
    # provider-floor sees the same slope and says the prompt, not queueing, makes the tail's TTFT
    (floor,) = [f for f in result.report.findings if f.rule == "provider-floor"]
    assert 54 <= floor.evidence["ms_per_1k_input_tokens"] <= 66, floor.evidence


@pytest.mark.slow
@pytest.mark.long  # (the README's command stays near its 15 minutes; .ci/run runs it after)
@server(1)
def test_network_bound(tmp_path: Path, http: str, loop: str) -> None:
    result = _demo_owning_tail(tmp_path, "network-bound", PROVIDER, "connection-setup", http=http, loop=loop)
    (finding,) = [f for f in result.report.findings if f.rule == "connection-setup"]
    evidence = finding.evidence
    assert evidence["cause"] == "slow_setup" and evidence["new_connection_share"] == 1.0, evidence  # a client per request
    assert 110 <= evidence["setup_per_new_connection_p50_ms"] <= 400, evidence  # the provider's 120 ms per handshake
    assert 110 <= evidence["tls_p50_ms"] and evidence["connect_p50_ms"] < 50, evidence  # the delay sits in the TLS handshake
    assert evidence["tail_setup_mean_ms"] >= 900, evidence  # the 1 s handshakes
    # provider-floor leaves the set-up to this rule: it names no provider-side queueing it did not see.
    floors = [f for f in result.report.findings if f.rule == "provider-floor"]
    assert all(f.impact_ms < finding.impact_ms / 2 and "provider-side queueing" not in f.summary for f in floors), floors


@pytest.mark.slow
@server(1)
def test_healthy(tmp_path: Path, http: str, loop: str) -> None:
    result = _demo(tmp_path, "healthy", http=http, loop=loop)
    report = result.report
    assert report.verdict.layer is None and report.verdict.status == "no_tail", report.verdict
    assert report.verdict.rule is None
    assert report.latency_ms is not None and report.latency_ms["p99"] < 1.6 * report.latency_ms["p50"]
    assert report.findings == [], [(f.rule, f.summary) for f in report.findings]


@pytest.mark.slow
@servers
def test_blocking_call(tmp_path: Path, http: str, loop: str) -> None:
    result = _demo_owning_tail(tmp_path, "blocking-call", EVENT_LOOP, "event-loop-blocked", http=http, loop=loop)
    report = result.report
    (finding,) = [f for f in report.findings if f.rule == "event-loop-blocked"]
    assert finding.evidence["lag_max_ms"] >= 250, finding.evidence  # the 300 ms blocking call
    assert finding.evidence["lag_readings_over_threshold"] >= 2, finding.evidence

    analysis = result.diagnosis.analysis

    def held_ms(index: int) -> float:
        segments = analysis.requests[index].segments
        return sum(s.end_ns - s.start_ns for s in segments if s.name == HELD_THE_LOOP) / 1e6

    # The tail waited for the loop because of others: who blocked it is named, not charged.
    waited = [i for i in analysis.groups.tail if analysis.breakdowns[i].get(EVENT_LOOP, 0.0) >= 50]
    assert waited, [analysis.breakdowns[i] for i in analysis.groups.tail]
    # A request's own short steps next to the block may be named too (a few ms under a loaded
    # machine); what matters is that none of the 300 ms is charged to a request that waited.
    innocent = [i for i in waited if held_ms(i) < 50]
    assert len(innocent) >= 0.8 * len(waited), [(analysis.requests[i].request.route, held_ms(i)) for i in waited]
    # Where they were awaiting something when the loop stopped (the provider, a query, a held
    # connection), the wait is nested under that segment: it owns that time, so it is event_loop
    # time rather than the provider's. Which segments were open depends on when the blocks fell.
    by_id = {s.segment_id: s for i in innocent for s in analysis.requests[i].segments}
    nested = [s for s in by_id.values() if s.layer == EVENT_LOOP and s.parent_id in by_id]
    assert nested, [analysis.requests[i].segments for i in innocent]
    for s in nested:
        parent = by_id[s.parent_id]
        assert parent.start_ns <= s.start_ns and s.end_ns <= parent.end_ns, (s, parent)
    for i in innocent:
        segments = analysis.requests[i].segments
        waits = [s for s in segments if s.name == BLOCKED_BY_OTHERS]
        for llm in (s for s in segments if s.layer in (PROVIDER, MODEL)):
            for w in waits:
                lo, hi = max(w.start_ns, llm.start_ns), min(w.end_ns, llm.end_ns)
                if hi > lo:  # a block while the LLM call was open: a wait nested under the call owns it
                    assert any(c.parent_id == llm.segment_id and c.start_ns <= lo and hi <= c.end_ns for c in waits), (llm, w)
    blockers = [i for i, rt in enumerate(analysis.requests) if rt.request.route == "GET /export"]
    assert len(blockers) >= 2
    for i in blockers:
        assert held_ms(i) >= 250, analysis.requests[i].segments
        assert analysis.breakdowns[i].get(EVENT_LOOP, 0.0) < held_ms(i) / 2, analysis.breakdowns[i]


@pytest.mark.slow
def test_pool_held_across_llm_keeps_its_verdict_when_only_a_sample_is_recorded(tmp_path: Path) -> None:
    # 11 requests/s with `--max-rate 6`: the hooks record about 1 request in 2 (or 3), weighted 2 (or 3).
    result = run_demo(
        "pool-held-across-llm", capture=tmp_path / "demo.jsonl", duration_s=DEMO_SECONDS, progress=None, max_rate=6
    )
    report = result.report
    recorded, represented = report.collection["recorded_requests"], report.window["requests"]
    print(f"sampled pool run: {recorded} recorded stand for {represented}; {result.load.sent} sent; verdict {report.verdict}")
    assert result.load.errors == 0, result.load.error_samples
    assert recorded <= 0.7 * represented
    # Warm-up (2 s) is left out of the window: it holds about the rest of what was sent.
    expected = result.load.sent * (DEMO_SECONDS - 2) / DEMO_SECONDS
    assert 0.6 * expected <= represented <= 1.4 * expected, (represented, result.load.sent)
    assert [w for w in report.collection["warnings"] if w.startswith("sampled:")]
    _owns_tail(result, "db.pool", "db-pool-exhaustion")
    (finding,) = [f for f in report.findings if f.rule == "db-pool-exhaustion"]
    assert finding.evidence["held_across_llm_share"] >= 0.9
