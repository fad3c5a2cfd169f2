"""`latprof demo --traces KIND`: the demo's LLM faults traced by a GenAI instrumentation on top of the
stock ones, diagnosed from the traces alone — the scoreboard's GenAI column, in CI.

Stock spans cannot see these faults (openai 3.x sends on httpx2, which the httpx instrumentation
does not trace): with a GenAI instrumentation that marks the first token, the tail's owner is
named as `latprof run` names it — long answers (`model`) apart from a slow provider
(`provider`). A held event loop stretches the streams in flight, which read as slow tokens; with
the demo's few requests in flight latprof cannot prove the stall from spans, and must not name
another layer with confidence. Run by the `genai_openinference` and `genai_openllmetry` nox
sessions, KIND from `LATPROF_TEST_GENAI_KIND` (the demo and the stock instrumentations are
installed there too).
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


def test_a_held_event_loop_is_never_blamed_on_another_layer_with_confidence(tmp_path: Path) -> None:
    """The demo's blocking call (a 300 ms sync call in an async endpoint, 3% of requests) stretches the
    streams in flight: their tokens read as slow. With one or two requests in flight at each stall the
    stall inference cannot prove it; the windows no request could begin in (`possible_stalls`) then keep
    the layer the stretched spans name under 0.5 and say why."""
    result = run_demo("blocking-call", capture=tmp_path / "traces.jsonl", duration_s=max(DEMO_SECONDS, 14.0),
                      progress=None, traces=KIND)  # fmt: skip
    verdict = result.report.verdict
    print(f"{KIND} blocking-call: {verdict.layer} ({verdict.status}) {verdict.confidence} {verdict.rule}: {verdict.summary}")
    assert result.load.errors == 0, result.load.error_samples
    if verdict.layer not in (None, "event_loop", "unattributed"):
        assert verdict.confidence < 0.5, verdict
