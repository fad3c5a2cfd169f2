"""The bundled examples are recordings of `latprof demo` scenarios, and say what their scenario says."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from latprof.demo.scenarios import get_scenario
from latprof.pipeline import diagnose
from latprof.semconv import NOTE_HOOKS_LOADED

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _recorder():
    spec = importlib.util.spec_from_file_location("record_examples", EXAMPLES / "record.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORDED: dict[str, str] = _recorder().EXAMPLES


def test_every_example_has_a_scenario_and_every_scenario_an_example():
    assert sorted(p.name for p in EXAMPLES.glob("*.jsonl.gz")) == sorted(f"{name}.jsonl.gz" for name in RECORDED)
    assert not list(EXAMPLES.glob("*.jsonl"))


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_example_is_a_recording_by_latprof_run_without_prompts(name):
    raw = gzip.decompress((EXAMPLES / f"{name}.jsonl.gz").read_bytes())
    lines = [json.loads(line) for line in raw.splitlines()]
    headers = [line for line in lines if line["type"] == "header"]
    assert headers and all(h["source"] == "run" and "simulated" not in h for h in headers)
    loaded = [line for line in lines if line["type"] == "quality" and line["kind"] == NOTE_HOOKS_LOADED]
    assert loaded and {"asgi", "openai", "sqlalchemy"} <= set(loaded[0]["attrs"]["collectors"])
    # The demo's prompts and answers never reach the capture (privacy by default).
    assert b"latprof demo assistant" not in raw and b"Answer briefly" not in raw
    assert b"the provider floor is the part" not in raw  # the provider's answer text


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_example_verdict_is_its_scenarios(name):
    scenario = get_scenario(RECORDED[name])
    report = diagnose([EXAMPLES / f"{name}.jsonl.gz"])
    assert report.verdict.layer == scenario.expected_layer, report.verdict
    rules = {f.rule for f in report.findings}
    if scenario.expected_finding is not None:
        assert scenario.expected_finding in rules
    if scenario.name == "healthy":
        assert report.verdict.status == "no_tail" and not report.findings
