"""Rule capacity-exceeded end to end: the demo service under `latprof run`, in front of the demo provider's
engine (vLLM's scheduler, 4 requests in its batch), under an open load whose rate steps above what the
engine serves for a few seconds, then back. The finding points at that window; the steady load of the
engine-queueing scenario, which queues but never piles up, gets none.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from latprof.demo.run import run_demo
from latprof.demo.scenarios import get_scenario
from latprof.layers import PROVIDER

DEMO_SECONDS = float(os.environ.get("LATPROF_TEST_DEMO_SECONDS", "10"))
#: From second 4 to 7.5 arrivals come at 35/s; the engine serves about 22/s (4 at a time, ~180 ms each).
SURGE_FROM_S, SURGE_TO_S = 4.0, 7.5
SURGE = dataclasses.replace(
    get_scenario("engine-queueing"), name="surge", rate_rps=8.0, rate_steps=((SURGE_FROM_S, 35.0), (SURGE_TO_S, 8.0)),
    provider={**get_scenario("engine-queueing").provider, "engine_max_running": 4}, expected_finding="capacity-exceeded",
)  # fmt: skip


@pytest.mark.slow
@pytest.mark.long
def test_a_load_that_steps_above_capacity_is_found_at_its_window(tmp_path: Path) -> None:
    # no warm-up left out: the capture's seconds are the load's (its first request comes at its start)
    result = run_demo(SURGE, capture=tmp_path / "demo.jsonl", duration_s=DEMO_SECONDS, progress=None, warmup_s=0.0)
    report = result.report
    findings = {f.rule: f for f in report.findings}
    print(f"verdict {report.verdict}; findings {[(f.rule, f.layer, f.impact_ms) for f in report.findings]}")
    assert result.load.errors == 0, result.load.error_samples
    assert "capacity-exceeded" in findings, report.findings
    finding = findings["capacity-exceeded"]
    assert finding.layer == PROVIDER  # the piled-up requests waited in the engine's queue, inside TTFT
    print(finding.summary, finding.evidence)
    e = finding.evidence
    # the stretch (whole windows of 1 s, from the capture's first arrival) starts with the surge and ends by its end
    assert SURGE_FROM_S - 1.5 <= e["stretch_start_offset_s"] <= SURGE_FROM_S + 1.0, e
    assert SURGE_FROM_S < e["stretch_end_offset_s"] <= SURGE_TO_S + 1.5, e
    assert e["arrivals_per_s"] > 1.2 * e["completions_per_s"]
