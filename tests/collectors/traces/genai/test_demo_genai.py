"""`latprof demo --traces KIND`: the demo's LLM faults traced by a GenAI instrumentation on top of the
stock ones, diagnosed from the traces alone — the scoreboard's GenAI column, in CI.

Stock spans cannot see these faults (openai 3.x sends on httpx2, which the httpx instrumentation
does not trace): with a GenAI instrumentation that marks the first token, the tail's owner is
named as `latprof run` names it — long answers (`model`) apart from a slow provider
(`provider`). Run by the `genai_openinference` and `genai_openllmetry` nox sessions, KIND from
`LATPROF_TEST_GENAI_KIND` (the demo and the stock instrumentations are installed there too).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

KIND = os.environ.get("LATPROF_TEST_GENAI_KIND", "")
if not KIND:
    pytest.skip("LATPROF_TEST_GENAI_KIND names the GenAI instrumentation its nox session installed", allow_module_level=True)
pytest.importorskip("opentelemetry.instrumentation.fastapi")

from latprof.demo.run import run_demo  # noqa: E402

DEMO_SECONDS = float(os.environ.get("LATPROF_TEST_DEMO_SECONDS", "10"))


@pytest.mark.parametrize(
    ("scenario", "layer", "rule"),
    [("long-outputs", "model", "long-decode"), ("provider-spikes", "provider", "provider-floor")],
)
def test_the_llm_fault_is_named_from_genai_spans(tmp_path: Path, scenario: str, layer: str, rule: str) -> None:
    result = run_demo(scenario, capture=tmp_path / "traces.jsonl", duration_s=DEMO_SECONDS, progress=None, traces=KIND)
    verdict = result.report.verdict
    print(f"{KIND} {scenario}: {verdict.layer} ({verdict.status}) {verdict.confidence} {verdict.rule}")
    assert result.load.errors == 0, result.load.error_samples
    assert result.report.source["kind"] == "receive"
    assert (verdict.layer, verdict.rule) == (layer, rule), verdict
    assert verdict.confidence >= 0.5
