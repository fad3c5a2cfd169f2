"""Every `latprof demo` fault, with the service started plainly and `latprof attach --inject`
loading the hooks into it under load: the same verdict and rule `latprof run` gives for that fault
(tests/collectors/hooks/test_verdicts_e2e.py asserts these for run)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from latprof.demo.run import run_demo
from latprof.demo.scenarios import SCENARIOS

pytestmark = [pytest.mark.slow, pytest.mark.long]

DEMO_SECONDS = float(os.environ.get("LATPROF_TEST_DEMO_SECONDS", "10"))

#: What `latprof run` says of each scenario: (verdict layer, verdict rule, a finding it must have).
RUN_SAYS = {
    "pool-held-across-llm": ("db.pool", "db-pool-exhaustion", "db-pool-exhaustion"),
    "threadpool-queueing": ("queue", "request-queueing", "request-queueing"),
    "provider-floor": (None, None, "provider-floor"),
    "provider-spikes": ("provider", "provider-floor", "provider-floor"),
    "long-outputs": ("model", "long-decode", "long-decode"),
    "healthy": (None, None, None),
    "blocking-call": ("event_loop", "event-loop-blocked", "event-loop-blocked"),
    "growing-context": ("provider", "context-growth", "context-growth"),
    "network-bound": ("provider", "connection-setup", "connection-setup"),
    "engine-queueing": ("provider", "engine-queueing", "engine-queueing"),
}
#: Verdicts whose rule is inferred (report-v1): no more confident than its finding.
INFERRED_RULES = {"engine-queueing"}


def test_every_demo_scenario_is_covered() -> None:
    assert set(RUN_SAYS) == set(SCENARIOS)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_inject_gives_the_verdict_run_gives(tmp_path: Path, scenario: str) -> None:
    result = run_demo(scenario, capture=tmp_path / "c.jsonl", duration_s=DEMO_SECONDS, progress=None, inject=True)
    report = result.report
    verdict = report.verdict
    print(f"{scenario}: {verdict.layer} ({verdict.status}) {verdict.rule} share {verdict.share_of_tail_excess}"
          f" confidence {verdict.confidence}; {report.window['requests']} requests; findings {[f.rule for f in report.findings]}")  # fmt: skip
    layer, rule, finding = RUN_SAYS[scenario]
    assert result.load.errors == 0, result.load.error_samples
    assert report.source["method"] == "inject" and report.source["kind"] == "run"
    assert report.window["requests"] >= 40, report.window
    assert (verdict.layer, verdict.rule) == (layer, rule), verdict
    if layer is not None:
        assert verdict.confidence >= (0.5 if rule in INFERRED_RULES else 0.8), verdict
    rules = {f.rule for f in report.findings}
    if finding is not None:
        assert finding in rules, rules
    elif scenario == "healthy":
        assert not rules, rules
    (process,) = report.collection["injected"]
    assert process["outcome"] == "recorded" and process["detach"]["restored"] == process["detach"]["patched"] > 0
