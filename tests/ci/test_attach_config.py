"""The config applies to attach captures: on a real `latprof attach --pid` capture, `enabled`,
`severity` and thresholds in latprof.toml change what `latprof analyze` and `latprof check` say,
and `latprof rules explain` knows every rule id the report names.

One capture for the module: gunicorn's 2 sync workers burning the CPU (`/cpu`) under 2 clients,
sampled from outside for 4 s (about 6 s with start and load: the only slow part of this file).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attach.procs import ROOT, attach_under_load

pytestmark = pytest.mark.slow  # one real server, sampled from outside


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The capture file of a CPU-bound service and its live report (verdict app, rule cpu-bound)."""
    where = tmp_path_factory.mktemp("attach-config")
    report, _ = attach_under_load(where, ["-w", "2"], "/cpu?ms=50", 2)
    assert (report["verdict"]["layer"], report["verdict"]["rule"]) == ("app", "cpu-bound"), report["verdict"]
    return where / "attach.jsonl", report


def latprof(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "latprof", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def analyze(path: Path, config: Path | None = None) -> dict:
    out = latprof("analyze", "--format", "json", path, *(("--config", config) if config else ()))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def check(path: Path, config: Path | None = None) -> tuple[int, dict]:
    out = latprof("check", "--format", "json", path, *(("--config", config) if config else ()))
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, json.loads(out.stdout)


def toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "latprof.toml"
    path.write_text(text)
    return path


def cpu_finding(report: dict) -> dict | None:
    return next((f for f in report["findings"] if f["rule"] == "cpu-bound"), None)


def test_rules_explain_knows_every_rule_id_the_report_names(capture):
    path, live = capture
    named = {f["rule"] for f in live["findings"]} | {live["verdict"]["rule"]} - {None}
    assert "cpu-bound" in named
    for rule_id in sorted(named):
        out = latprof("rules", "explain", rule_id)
        assert out.returncode == 0 and "How to fix" in out.stdout, (rule_id, out.stderr)


def test_by_default_analyze_and_check_name_the_cpu_bound_rule(capture):
    path, live = capture
    report = analyze(path)
    assert report["findings"] == live["findings"] and report["verdict"] == live["verdict"]
    code, run = check(path)
    assert code == 1
    (result,) = [c for c in run["checks"] if c["id"] == "rule.cpu-bound"]
    assert (result["outcome"], result["level"], result["failed"]) == ("fail", "error", True)
    assert result["message"] == cpu_finding(report)["summary"]


def test_enabled_false_drops_the_finding_and_check_passes(capture, tmp_path):
    path, live = capture
    config = toml(tmp_path, "[rules.cpu-bound]\nenabled = false\n")
    report = analyze(path, config)
    assert cpu_finding(report) is None
    # the verdict is measured: still the app layer, no rule named
    assert (report["verdict"]["layer"], report["verdict"]["rule"]) == ("app", None)
    code, run = check(path, config)
    assert code == 0 and not [c for c in run["checks"] if c["id"] == "rule.cpu-bound"]


def test_the_threshold_moves_the_finding_in_analyze_and_check(capture, tmp_path):
    path, live = capture
    evidence = cpu_finding(live)["evidence"]
    observed = min(evidence["share_of_busy_time"], evidence["share_of_busy_and_queue_time"])
    highest = max(evidence["share_of_busy_time"], evidence["share_of_busy_and_queue_time"])
    below = toml(tmp_path, f"[rules.cpu-bound]\nattach_min_share = {observed - 0.001:.4f}\n")
    assert cpu_finding(analyze(path, below)) == cpu_finding(live)
    above = toml(tmp_path, f"[rules.cpu-bound]\nattach_min_share = {highest + 0.001:.4f}\n")
    assert cpu_finding(analyze(path, above)) is None
    code, run = check(path, above)
    (result,) = [c for c in run["checks"] if c["id"] == "rule.cpu-bound"]
    assert code == 0 and result["outcome"] == "pass"


def test_severity_warning_reports_without_failing_the_gate(capture, tmp_path):
    path, _ = capture
    code, run = check(path, toml(tmp_path, '[rules.cpu-bound]\nseverity = "warning"\n'))
    (result,) = [c for c in run["checks"] if c["id"] == "rule.cpu-bound"]
    assert code == 0 and (result["outcome"], result["level"], result["failed"]) == ("fail", "warning", False)


def test_latprof_attach_judges_its_own_report_by_the_config(tmp_path):
    # The live report of `latprof attach --config` (not only `analyze` of its capture) applies it.
    config = toml(tmp_path, "[rules.cpu-bound]\nenabled = false\n")
    live, again = attach_under_load(tmp_path, ["-w", "2"], "/cpu?ms=50", 2, config=config)
    assert (live["verdict"]["layer"], live["verdict"]["rule"]) == ("app", None), live["verdict"]  # measured; no rule
    assert cpu_finding(live) is None and again["findings"] == live["findings"]
    default = analyze(tmp_path / "attach.jsonl")  # the same capture without the config: the rule's finding
    assert cpu_finding(default) is not None and default["verdict"]["rule"] == "cpu-bound"
