"""Check-run output formats: text, JSON, markdown, JUnit XML, SARIF and GitHub Actions commands."""

from __future__ import annotations

import io
import json
import os
import xml.etree.ElementTree as ET
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import jsonschema
import pytest

import latprof
from latprof.ci import check_output
from latprof.ci.checks import CheckResult, CheckRun, Location
from latprof.pipeline import run_diagnosis
from latprof.report import renderers
from latprof.report.model import Report
from latprof.report.renderers.check_common import format_value
from latprof.report.renderers.check_github import workflow_commands
from latprof.report.renderers.check_markdown import to_markdown

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CAPTURE = EXAMPLES / "pool_held_across_llm.jsonl.gz"
SARIF_SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "schemas" / "sarif-schema-2.1.0.json").read_text())


@pytest.fixture(scope="module")
def report() -> Report:
    return run_diagnosis([CAPTURE]).report


def budget(report: Report, threshold_ms: float, level: str = "error") -> CheckResult:
    """A p99 budget on the real report, judged here the way `latprof check` would."""
    assert report.latency_ms is not None
    observed = report.latency_ms["p99"]
    held = observed <= threshold_ms
    return CheckResult(
        id="budget.p99_ms",
        kind="budget",
        title=f"p99 <= {threshold_ms:g} ms",
        outcome="pass" if held else "fail",
        level=level,
        message=f"p99 {observed:.0f} ms {'is within' if held else 'exceeds'} the budget of {threshold_ms:g} ms",
        observed=observed,
        threshold=threshold_ms,
        unit="ms",
        evidence={"requests": report.window["requests"]},
        fix="" if held else "Find the layer that owns the tail: latprof report",
    )


def rule_check(report: Report, *, locations: tuple[Location, ...] = (), level: str = "error") -> CheckResult:
    """The report's first finding as a failed rule check."""
    finding = report.findings[0]
    return CheckResult(
        id=f"rule.{finding.rule}",
        kind="rule",
        title=finding.rule,
        outcome="fail",
        level=level,
        message=finding.summary,
        observed=finding.impact_ms,
        threshold=None,
        unit="ms",
        evidence=dict(finding.evidence),
        fix=finding.fix,
        rule=finding.rule,
        layer=finding.layer,
        fingerprint=finding.fingerprint,
        locations=locations,
        description="Requests wait for a pooled database connection held by other requests.",
    )


def skipped(check_id: str = "budget.route.POST /chat.p99_ms") -> CheckResult:
    return CheckResult(
        id=check_id,
        kind="budget",
        title="POST /chat p99 <= 900 ms",
        outcome="skip",
        level="error",
        message="no request to POST /chat in the capture",
        threshold=900.0,
        unit="ms",
    )


def mixed_run(report: Report) -> CheckRun:
    """Two gating failures (one located in code), a warning-level failure, a pass and a skip."""
    observed = report.latency_ms["p99"] if report.latency_ms else 0.0
    return CheckRun(
        inputs=[str(CAPTURE)],
        results=[
            budget(report, threshold_ms=observed / 2),
            rule_check(report, locations=(Location("app/handlers.py", 42, "chat"),)),
            replace(budget(report, threshold_ms=observed / 3, level="warning"), id="budget.p90_ms", title="p90 budget"),
            replace(budget(report, threshold_ms=observed * 10), id="budget.max_ms"),
            skipped(),
        ],
        report=report,
        config_path="latprof.toml",
    )


def sarif_errors(log: dict) -> list[str]:
    validator = jsonschema.Draft4Validator(SARIF_SCHEMA)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(log)]


# --- text / json / markdown -----------------------------------------------------------------


def test_text_gives_the_verdict_one_line_per_check_and_the_tally(report):
    run = mixed_run(report)
    out = io.StringIO()
    renderers.CHECK.render("text", run, out)
    lines = out.getvalue().splitlines()
    assert lines[0] == f"verdict: {report.verdict.summary}"
    assert [line.split()[0] for line in lines[1:-1]] == ["FAIL", "FAIL", "WARN", "PASS", "SKIP"]
    assert "db-pool-exhaustion" in lines[2] and report.findings[0].summary in lines[2]
    assert lines[-1] == "2 of 5 checks failed, 1 warning, 1 skipped"


def test_text_says_all_passed_when_nothing_failed_or_was_skipped(report):
    run = CheckRun([str(CAPTURE)], [budget(report, 10_000), replace(budget(report, 20_000), id="b2")], report)
    out = io.StringIO()
    renderers.CHECK.render("text", run, out)
    assert out.getvalue().splitlines()[-1] == "all 2 checks passed"


def test_json_parses_and_its_counts_match_the_run(report):
    run = mixed_run(report)
    out = io.StringIO()
    renderers.CHECK.render("json", run, out)
    doc = json.loads(out.getvalue())
    assert doc["schema"] == "latprof.check/1"
    assert doc["passed"] is False and doc["exit_code"] == 1 == run.exit_code
    assert doc["inputs"] == [str(CAPTURE)] and doc["config"] == "latprof.toml" and doc["baseline"] is None
    assert doc["summary"] == {"checks": 5, "failed": 2, "warnings": 1, "skipped": 1}
    assert [c["id"] for c in doc["checks"]] == [r.id for r in run.results]
    rule = doc["checks"][1]
    assert rule["locations"] == [{"path": "app/handlers.py", "line": 42, "function": "chat"}]
    assert rule["evidence"] == json.loads(json.dumps(dict(report.findings[0].evidence), default=str))
    assert rule["fingerprint"] == report.findings[0].fingerprint
    assert doc["verdict"]["layer"] == report.verdict.layer == "db.pool"
    assert doc["verdict"]["share_of_tail_excess"] == report.verdict.share_of_tail_excess


def test_json_of_a_passing_run_says_passed_with_exit_code_0(report):
    run = CheckRun([str(CAPTURE)], [budget(report, 10_000)], report)
    out = io.StringIO()
    renderers.CHECK.render("json", run, out)
    doc = json.loads(out.getvalue())
    assert (doc["passed"], doc["exit_code"], doc["summary"]["failed"]) == (True, 0, 0)


def test_markdown_has_heading_verdict_and_a_row_per_check(report):
    run = mixed_run(report)
    md = to_markdown(run)  # also the GitHub step summary
    lines = md.splitlines()
    assert lines[0] == "## latprof check: failed"
    assert report.verdict.summary in md
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| |")]
    assert [row.split(" | ")[0][2:] for row in rows] == ["❌", "❌", "⚠️", "✅", "⏭️"]
    assert format_value(report.latency_ms["p99"], "ms") in rows[0]
    assert lines[-1] == "2 of 5 checks failed, 1 warning, 1 skipped"


def test_markdown_escapes_pipes_and_newlines_in_cells(report):
    weird = replace(skipped(), title="a|b <= c", message="first | line\nsecond line")
    run = CheckRun([str(CAPTURE)], [weird], report)
    out = io.StringIO()
    renderers.CHECK.render("markdown", run, out)
    row = next(line for line in out.getvalue().splitlines() if line.startswith("| ⏭️"))
    assert "a\\|b &lt;= c" in row
    assert "first \\| line<br>second line" in row
    # the row still has exactly 5 cells: every unescaped pipe is a cell border
    assert len([i for i, ch in enumerate(row) if ch == "|" and row[i - 1 : i] != "\\"]) == 6
    assert out.getvalue().startswith("## latprof check: passed")


def test_render_rejects_an_unknown_format(report):
    assert renderers.CHECK.names() == ["json", "markdown", "text"]
    with pytest.raises(ValueError, match="known: json, markdown, text"):
        renderers.CHECK.render("yaml", CheckRun([], [], report), io.StringIO())


# --- JUnit ----------------------------------------------------------------------------------


def test_junit_counts_match_the_run(report, tmp_path):
    run = mixed_run(report)
    path = tmp_path / "junit.xml"
    check_output.write_junit(run, path, timestamp=datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc))
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    suite = root.find("testsuite")
    assert suite is not None
    assert suite.get("tests") == str(len(run.results)) == str(len(suite.findall("testcase")))
    assert suite.get("failures") == str(len(run.failed)) == str(len(suite.findall("testcase/failure")))
    assert suite.get("skipped") == "1" == str(len(suite.findall("testcase/skipped")))
    assert suite.get("errors") == "0"
    assert suite.get("timestamp") == "2024-05-01T12:00:00+00:00"
    props = [(p.get("name"), p.get("value")) for p in suite.findall("properties/property")]
    assert ("input", str(CAPTURE)) in props and ("verdict.layer", "db.pool") in props
    assert [c.get("classname") for c in suite.findall("testcase")] == [f"latprof.{r.kind}" for r in run.results]


def test_junit_failure_carries_message_evidence_and_fix(report, tmp_path):
    run = mixed_run(report)
    path = tmp_path / "junit.xml"
    check_output.write_junit(run, path)
    case = next(c for c in ET.parse(path).getroot().iter("testcase") if c.get("name") == "db-pool-exhaustion")
    failure = case.find("failure")
    assert failure is not None
    finding = report.findings[0]
    assert failure.get("message") == finding.summary
    assert failure.get("type") == "rule.db-pool-exhaustion"
    body = failure.text or ""
    assert body.startswith(finding.summary)
    evidence_lines = [line for line in body.splitlines() if line.split(":")[0] in finding.evidence]
    assert len(evidence_lines) == len(finding.evidence) > 0
    for key, value in finding.evidence.items():
        shown = next(line for line in evidence_lines if line.startswith(f"{key}: ")).removeprefix(f"{key}: ")
        # strings as they are, everything else JSON (numbers print the same either way)
        assert (shown if isinstance(value, str) else json.loads(shown)) == value
    assert "at app/handlers.py:42 in chat" in body
    assert body.endswith(f"fix: {finding.fix}")


def test_junit_warning_level_failure_passes_with_system_out(report, tmp_path):
    run = mixed_run(report)
    path = tmp_path / "junit.xml"
    check_output.write_junit(run, path)
    case = next(c for c in ET.parse(path).getroot().iter("testcase") if c.get("name") == "p90 budget")
    assert case.find("failure") is None and case.find("skipped") is None
    system_out = case.find("system-out")
    assert system_out is not None and system_out.text == f"warning: {run.results[2].message}"


def test_junit_special_characters_survive_a_round_trip(report, tmp_path):
    message = 'p99 <3 & "quoted" \'single\'\nsecond line — naïve 日本 \x1b[0m'
    check = replace(budget(report, 1.0), title="tail <&> \"title\"", message=message, evidence={"note": "a<b&c", "list": [1, "ü"]})
    path = tmp_path / "junit.xml"
    check_output.write_junit(CheckRun([str(CAPTURE)], [check], report), path)
    failure = ET.parse(path).getroot().find("testsuite/testcase/failure")
    assert failure is not None
    # \x1b cannot be held by XML at all: it is written as its escape, the rest verbatim
    assert failure.get("message") == message.replace("\x1b", "\\x1b")
    assert "note: a<b&c" in (failure.text or "") and 'list: [1, "ü"]' in (failure.text or "")
    case = ET.parse(path).getroot().find("testsuite/testcase")
    assert case is not None and case.get("name") == 'tail <&> "title"'


def test_junit_write_replaces_the_file_and_leaves_no_temporary_behind(report, tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text("old, torn content")
    check_output.write_junit(mixed_run(report), path)
    assert ET.parse(path).getroot().tag == "testsuites"
    assert os.listdir(tmp_path) == ["junit.xml"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(report, tmp_path, monkeypatch):
    path = tmp_path / "junit.xml"
    path.write_text("previous run")

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(check_output.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        check_output.write_junit(mixed_run(report), path)
    assert path.read_text() == "previous run"
    assert os.listdir(tmp_path) == ["junit.xml"]


# --- SARIF ----------------------------------------------------------------------------------


def write_and_load_sarif(run: CheckRun, tmp_path: Path, **kw) -> dict:
    path = tmp_path / "latprof.sarif"
    check_output.write_sarif(run, path, **kw)
    return json.loads(path.read_text())


def test_sarif_validates_and_keeps_rule_ids_and_indexes_consistent(report, tmp_path):
    run = mixed_run(report)
    log = write_and_load_sarif(run, tmp_path, cwd=tmp_path)
    assert sarif_errors(log) == []
    sarif_run = log["runs"][0]
    driver = sarif_run["tool"]["driver"]
    assert (driver["name"], driver["version"]) == ("latprof", latprof.__version__)
    assert [rule["id"] for rule in driver["rules"]] == [r.id for r in run.results]
    for result in sarif_run["results"]:
        assert driver["rules"][result["ruleIndex"]]["id"] == result["ruleId"]
    failed = [r for r in run.results if r.outcome == "fail"]
    assert [(x["ruleId"], x["level"]) for x in sarif_run["results"]] == [(r.id, r.level) for r in failed]
    assert sarif_run["invocations"] == [{"executionSuccessful": True, "exitCode": 1}]
    rule = driver["rules"][1]
    assert rule["name"] == "RuleDbPoolExhaustion"
    assert rule["help"]["text"] == report.findings[0].fix
    assert rule["fullDescription"]["text"].startswith("Requests wait")
    assert "help" not in driver["rules"][4]  # the skipped budget has no fix
    fingerprints = [x["partialFingerprints"]["latprof/v1"] for x in sarif_run["results"]]
    assert fingerprints == ["budget.p99_ms", report.findings[0].fingerprint, "budget.p90_ms"]


def test_sarif_locations_from_code_and_the_capture_fallback(report, tmp_path):
    run = mixed_run(report)
    log = write_and_load_sarif(run, tmp_path, cwd=EXAMPLES.parent)
    results = log["runs"][0]["results"]
    located = results[1]["locations"][0]
    assert located["physicalLocation"] == {
        "artifactLocation": {"uri": "app/handlers.py", "uriBaseId": "SRCROOT"},
        "region": {"startLine": 42},
    }
    assert located["logicalLocations"] == [{"name": "chat", "kind": "function"}]
    # a budget points at no code: it is located on the capture, relative to the checkout
    fallback = results[0]["locations"]
    assert fallback == [
        {"physicalLocation": {"artifactLocation": {"uri": "examples/pool_held_across_llm.jsonl.gz", "uriBaseId": "SRCROOT"}}}
    ]
    assert log["runs"][0]["originalUriBaseIds"]["SRCROOT"]["uri"] == EXAMPLES.parent.resolve().as_uri() + "/"
    assert sarif_errors(log) == []


def test_sarif_paths_outside_the_checkout_are_absolute_file_uris(report, tmp_path):
    outside = tmp_path / "site packages" / "pool.py"
    check = rule_check(report, locations=(Location(str(outside), 0, None), Location("<string>", 3, "f")))
    log = write_and_load_sarif(CheckRun([str(CAPTURE)], [check], report), tmp_path, cwd=EXAMPLES.parent)
    locations = log["runs"][0]["results"][0]["locations"]
    assert locations == [{"physicalLocation": {"artifactLocation": {"uri": outside.as_uri()}}}]  # line 0: no region
    assert "%20" in locations[0]["physicalLocation"]["artifactLocation"]["uri"]
    assert sarif_errors(log) == []


def test_sarif_of_a_run_with_no_failures_validates_with_no_results(report, tmp_path):
    run = CheckRun([str(CAPTURE)], [budget(report, 10_000), skipped()], report)
    log = write_and_load_sarif(run, tmp_path)
    assert sarif_errors(log) == []
    assert log["runs"][0]["results"] == []
    assert len(log["runs"][0]["tool"]["driver"]["rules"]) == 2
    assert log["runs"][0]["invocations"][0]["exitCode"] == 0


def test_sarif_of_a_warning_level_failure_is_a_warning_and_exit_code_0(report, tmp_path):
    run = CheckRun([str(CAPTURE)], [rule_check(report, level="warning")], report)
    log = write_and_load_sarif(run, tmp_path)
    assert sarif_errors(log) == []
    (result,) = log["runs"][0]["results"]
    assert result["level"] == "warning"
    assert log["runs"][0]["tool"]["driver"]["rules"][0]["defaultConfiguration"]["level"] == "warning"
    assert log["runs"][0]["invocations"][0]["exitCode"] == 0
    assert result["properties"]["layer"] == "db.pool"
    assert result["properties"]["observed"] == report.findings[0].impact_ms


def test_sarif_validator_catches_a_broken_log(report, tmp_path):
    log = write_and_load_sarif(mixed_run(report), tmp_path)
    del log["runs"][0]["tool"]["driver"]["name"]
    log["runs"][0]["results"][0]["level"] = "fatal"
    assert len(sarif_errors(log)) == 2


# --- GitHub Actions -------------------------------------------------------------------------


def test_github_annotations_escape_data_and_properties(report):
    check = replace(budget(report, 1.0), title="p99: 1 ms, strict", message="100% over\nsee: the report, now\r")
    (line,) = workflow_commands(CheckRun([str(CAPTURE)], [check], report))
    assert line == "::error title=p99%3A 1 ms%2C strict::100%25 over%0Asee: the report, now%0D"


def test_github_annotations_carry_file_and_line_and_warning_level(report, tmp_path):
    run = mixed_run(report)
    app = tmp_path / "app" / "handlers.py"
    run.results[1] = replace(run.results[1], locations=(Location(str(app), 42, "chat"),))
    lines = workflow_commands(run, cwd=tmp_path)
    assert [line.split(" ", 1)[0] for line in lines] == ["::error", "::error", "::warning"]
    assert lines[1].startswith("::error file=app/handlers.py,line=42,title=db-pool-exhaustion::")
    assert lines[1].endswith("::" + report.findings[0].summary.replace("%", "%25"))
    assert "file=" not in lines[0]


def test_emit_github_appends_the_summary_and_keeps_earlier_content(report, tmp_path):
    summary = tmp_path / "step_summary.md"
    summary.write_text("# from an earlier step\n")
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    failing, passing = mixed_run(report), CheckRun([str(CAPTURE)], [budget(report, 10_000)], report)
    out = io.StringIO()
    assert check_output.emit_github(failing, out, env) == []
    assert check_output.emit_github(passing, out, env) == []
    text = summary.read_text()
    assert text.startswith("# from an earlier step\n")
    assert text.index("## latprof check: failed") < text.index("## latprof check: passed")
    assert text.count(report.verdict.summary) == 2
    assert out.getvalue().splitlines() == workflow_commands(failing)  # the passing run annotates nothing


def test_emit_github_does_nothing_outside_github_actions(report, tmp_path):
    summary = tmp_path / "step_summary.md"
    out = io.StringIO()
    for value in (None, "false", "1"):
        env = {"GITHUB_STEP_SUMMARY": str(summary)} | ({"GITHUB_ACTIONS": value} if value else {})
        assert check_output.emit_github(mixed_run(report), out, env) == []
    assert out.getvalue() == ""
    assert not summary.exists()


def test_emit_github_reports_an_unwritable_summary_instead_of_raising(report, tmp_path):
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(tmp_path / "missing-dir" / "summary.md")}
    out = io.StringIO()
    warnings = check_output.emit_github(mixed_run(report), out, env)
    assert len(warnings) == 1 and "missing-dir" in warnings[0]
    assert out.getvalue().count("::error") == 2  # the annotations were still written
