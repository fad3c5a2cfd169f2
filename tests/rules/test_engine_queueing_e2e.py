"""Rule engine-queueing end to end: `latprof run --engine-metrics` on the demo service, in front of the
demo provider running vLLM's scheduler and publishing vLLM's metrics, under real load.

Three services, one known answer each: an engine whose queue owns the tail (the rule, by name);
the same engine with room to spare (nothing about it); a client-side HTTP pool too small in
front of that healthy engine (the pool, not the engine).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from latprof.demo.run import DemoResult, run_demo
from latprof.demo.scenarios import get_scenario
from latprof.layers import HTTP_POOL, PROVIDER

DEMO_SECONDS = float(os.environ.get("LATPROF_TEST_DEMO_SECONDS", "10"))
QUEUEING = get_scenario("engine-queueing")
#: The same engine with room: 16 requests in its batch at 8 requests/s.
HEALTHY = dataclasses.replace(QUEUEING, name="engine-healthy", rate_rps=8.0, expected_layer=None, expected_finding=None,
                              provider={**QUEUEING.provider, "engine_max_running": 16})  # fmt: skip
#: ... and in front of it, a service whose LLM client opens at most 2 connections.
CLIENT_POOL = dataclasses.replace(HEALTHY, name="client-pool-before-engine", rate_rps=12.0, llm_max_connections=2,
                                  expected_layer=HTTP_POOL)  # fmt: skip


def demo(tmp_path: Path, scenario: object) -> DemoResult:
    result = run_demo(scenario, capture=tmp_path / "demo.jsonl", duration_s=DEMO_SECONDS, progress=None)  # type: ignore[arg-type]
    report = result.report
    print(f"{result.scenario.name}: verdict {report.verdict.layer} ({report.verdict.status}) rule {report.verdict.rule};"
          f" p50 {report.latency_ms and report.latency_ms['p50']} p99 {report.latency_ms and report.latency_ms['p99']};"
          f" findings {[(f.rule, f.impact_ms) for f in report.findings]}; engines {report.collection.get('engines')}")  # fmt: skip
    assert result.load.errors == 0, result.load.error_samples
    [engine] = report.collection["engines"]
    assert engine["engine"] == "vllm" and engine["scrapes"] >= DEMO_SECONDS - 2 and not engine["failed"]
    assert not report.collection["warnings"], report.collection["warnings"]
    return result


@pytest.mark.slow
@pytest.mark.long
def test_an_engine_whose_queue_owns_the_tail_is_named(tmp_path: Path) -> None:
    result = demo(tmp_path, QUEUEING)
    verdict = result.report.verdict
    assert (verdict.layer, verdict.rule) == (PROVIDER, "engine-queueing"), verdict
    [finding] = [f for f in result.report.findings if f.rule == "engine-queueing"]
    e = finding.evidence
    assert e["inferred"] is True and e["running_at_cap"] is True and e["peak_running"] == 2
    assert e["tail"]["queue_ms"] > 2 * e["median"]["queue_ms"] and e["tail"]["queue_ms"] > 5 * e["tail"]["prefill_ms"]
    assert finding.impact_ms >= 0.5 * result.report.layers[0].tail_excess_ms
    assert "add capacity" in finding.fix and "not the model" in finding.summary
    # a steady load at the engine's limit queues in bursts but never piles up: no window of growth
    assert "capacity-exceeded" not in {f.rule for f in result.report.findings}
    [floor] = [f for f in result.report.findings if f.rule == "provider-floor"] or [None]
    assert floor is None or floor.impact_ms < finding.impact_ms  # the engine's queue is not "provider-side queueing"


@pytest.mark.slow
@pytest.mark.long
def test_a_healthy_engine_is_not_blamed(tmp_path: Path) -> None:
    result = demo(tmp_path, HEALTHY)
    assert not [f for f in result.report.findings if f.rule == "engine-queueing"]
    [engine] = result.report.collection["engines"]
    [split] = engine["split"]
    assert split["peak_running"] < 16  # the batch never filled


@pytest.mark.slow
@pytest.mark.long
def test_a_client_pool_in_front_of_a_healthy_engine_is_not_the_engine(tmp_path: Path) -> None:
    result = demo(tmp_path, CLIENT_POOL)
    verdict = result.report.verdict
    assert verdict.layer == HTTP_POOL, verdict
    assert not [f for f in result.report.findings if f.rule == "engine-queueing"]
