"""`latprof check`, `analyze --config` and `rules` end to end on real `latprof demo` captures.

The numbers each check reports are held against numbers computed here from the capture's own
request and segment events (`Raw`), with the same percentile definition latprof uses.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, NamedTuple

import jsonschema
import pytest
from click.testing import CliRunner, Result

from latprof.analysis.requests import DEFAULT_WARMUP_S, percentile
from latprof.cli import main
from latprof.ci.config import find_config
from latprof.engine import DOC_SECTIONS, discover_rules

SARIF_SCHEMA = json.loads((Path(__file__).parents[1] / "schemas" / "sarif-schema-2.1.0.json").read_text(encoding="utf-8"))
POOL = "pool-held-across-llm"
HEALTHY = "healthy"
CHAT = "GET /chat"  # the route of every request the pool-held-across-llm service serves (but its health probe)
BUILTIN_RULES = sorted(cls.id for cls in discover_rules())


# --- what the capture itself says ----------------------------------------------------------------


class Raw(NamedTuple):
    """A capture's request events after warm-up and the segment events of those requests."""

    requests: list[dict[str, Any]]
    segments: list[dict[str, Any]]

    def latencies(self, route: str | None = None) -> list[float]:
        return [ms(r) for r in self.requests if route is None or r["route"] == route]

    def durations(self, layer: str) -> list[float]:
        return [ms(s) for s in self.segments if s["layer"] == layer]


def raw(capture: Path, warmup_s: float = DEFAULT_WARMUP_S) -> Raw:
    """The events `latprof` analyses: requests that arrived `warmup_s` or more after their process's first."""
    events = [json.loads(line) for line in capture.read_text(encoding="utf-8").splitlines() if line.strip()]
    requests = [e for e in events if e["type"] == "request"]
    first: dict[int, int] = {}
    for r in requests:
        first[r["pid"]] = min(first.get(r["pid"], r["start_ns"]), r["start_ns"])
    kept = [r for r in requests if r["start_ns"] - first[r["pid"]] >= warmup_s * 1e9]
    ids = {r["request_id"] for r in kept}
    return Raw(kept, [e for e in events if e["type"] == "segment" and e["request_id"] in ids])


def ms(event: dict[str, Any]) -> float:
    return (event["end_ns"] - event["start_ns"]) / 1e6


def p(values: list[float], q: float) -> float:
    assert values, "nothing to take a percentile of"
    return percentile(sorted(values), q)


# --- running the CLI -------------------------------------------------------------------------------


def latprof(*args: str | Path, env: dict[str, str | None] | None = None) -> Result:
    """`latprof ARGS` in-process; outside GitHub Actions unless `env` says otherwise (also when CI runs this)."""
    environment: dict[str, str | None] = {"GITHUB_ACTIONS": None, "GITHUB_STEP_SUMMARY": None, **(env or {})}
    return CliRunner().invoke(main, [str(a) for a in args], env=environment, catch_exceptions=False)


def check_json(*args: str | Path, exit_code: int, env: dict[str, str | None] | None = None) -> dict[str, Any]:
    result = latprof("check", *args, "--format", "json", env=env)
    assert result.exit_code == exit_code, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    assert data["schema"] == "latprof.check/1" and data["exit_code"] == exit_code
    return data


def by_id(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    checks = {c["id"]: c for c in data["checks"]}
    assert len(checks) == len(data["checks"]), "check ids are unique"
    return checks


def write_config(directory: Path, text: str, name: str = "latprof.toml") -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def one_error_line(result: Result) -> str:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("latprof: error: ") and "Traceback" not in result.stderr
    return line


@pytest.fixture
def held(demo_capture) -> Path:
    return demo_capture(POOL).capture


@pytest.fixture
def healthy(demo_capture) -> Path:
    return demo_capture(HEALTHY).capture


@pytest.fixture
def pool_finding(demo_capture) -> dict[str, Any]:
    """The db-pool-exhaustion finding of the report `latprof demo` wrote for the pool capture."""
    report = json.loads(demo_capture(POOL).report_json.read_text(encoding="utf-8"))
    [finding] = [f for f in report["findings"] if f["rule"] == "db-pool-exhaustion"]
    return finding


# --- the gate: budgets and rules -------------------------------------------------------------------


@pytest.mark.slow
def test_a_p99_budget_the_capture_cannot_meet_fails_in_json_junit_and_sarif(held: Path, pool_finding, tmp_path: Path) -> None:
    config = write_config(tmp_path, "[budget]\np99_ms = 100\n")
    junit, sarif = tmp_path / "junit.xml", tmp_path / "latprof.sarif"
    result = latprof("check", held, "--config", config, "--junit", junit, "--sarif", sarif, "--format", "json")
    assert result.exit_code == 1, result.output
    assert result.stderr == ""
    data = json.loads(result.stdout)
    checks = by_id(data)
    p99 = p(raw(held).latencies(), 99)
    assert p99 > 100

    budget = checks["budget.p99_ms"]
    assert (budget["outcome"], budget["level"], budget["failed"]) == ("fail", "error", True)
    assert budget["observed"] == pytest.approx(p99, abs=1e-3) and budget["threshold"] == 100
    assert budget["message"] == f"p99 latency {p99:.0f} ms over the budget of 100 ms"
    assert budget["evidence"]["config_key"] == "budget.p99_ms"
    rule = checks["rule.db-pool-exhaustion"]
    assert (rule["outcome"], rule["level"], rule["layer"]) == ("fail", "error", "db.pool")
    assert rule["message"] == pool_finding["summary"] and rule["fingerprint"] == pool_finding["fingerprint"]
    assert rule["observed"] == pool_finding["impact_ms"] and rule["fix"] == pool_finding["fix"]
    failed = [c["id"] for c in data["checks"] if c["failed"]]
    assert failed == ["budget.p99_ms", "rule.db-pool-exhaustion"]
    assert [c["id"] for c in data["checks"]] == ["budget.p99_ms", *(f"rule.{r}" for r in BUILTIN_RULES)]
    assert data["summary"] == {"checks": len(data["checks"]), "failed": 2, "warnings": 0, "skipped": 0}
    assert data["passed"] is False and data["config"] == str(config) and data["inputs"] == [str(held)]

    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert int(suite.get("tests", "-1")) == len(data["checks"]) == len(suite.findall("testcase"))
    assert int(suite.get("failures", "-1")) == len(failed) and suite.get("errors") == "0"
    failures = {f.get("type"): f for f in suite.iter("failure")}
    assert sorted(failures) == sorted(failed)
    assert failures["budget.p99_ms"].get("message") == budget["message"]
    assert failures["rule.db-pool-exhaustion"].get("message") == pool_finding["summary"]
    assert f"fix: {pool_finding['fix']}" in (failures["rule.db-pool-exhaustion"].text or "")
    assert "pool_wait_p99_ms: " in (failures["rule.db-pool-exhaustion"].text or "")  # the evidence, a line each

    log = json.loads(sarif.read_text(encoding="utf-8"))
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in jsonschema.Draft4Validator(SARIF_SCHEMA).iter_errors(log)]
    assert errors == []
    [run] = log["runs"]
    assert [(r["ruleId"], r["level"]) for r in run["results"]] == [("budget.p99_ms", "error"), ("rule.db-pool-exhaustion", "error")]
    assert run["results"][1]["message"]["text"] == pool_finding["summary"]
    assert run["results"][1]["partialFingerprints"] == {"latprof/v1": pool_finding["fingerprint"]}
    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == [c["id"] for c in data["checks"]]
    assert run["invocations"] == [{"executionSuccessful": True, "exitCode": 1}]


@pytest.mark.slow
def test_a_rule_at_warning_severity_is_reported_but_does_not_fail_the_gate(held: Path, pool_finding, tmp_path: Path) -> None:
    config = write_config(tmp_path, '[budget]\np99_ms = 60000\n\n[rules.db-pool-exhaustion]\nseverity = "warning"\n')
    junit = tmp_path / "junit.xml"
    data = check_json(held, "--config", config, "--junit", junit, exit_code=0)
    checks = by_id(data)
    rule = checks["rule.db-pool-exhaustion"]
    assert (rule["outcome"], rule["level"], rule["failed"]) == ("fail", "warning", False)
    assert rule["message"] == pool_finding["summary"]
    assert checks["budget.p99_ms"]["outcome"] == "pass"
    assert data["passed"] is True and data["summary"]["failed"] == 0 and data["summary"]["warnings"] == 1
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "0" and not list(suite.iter("failure"))
    assert [out.text for out in suite.iter("system-out")] == [f"warning: {pool_finding['summary']}"]
    text = latprof("check", held, "--config", config)
    assert text.exit_code == 0
    lines = text.stdout.splitlines()
    [warned] = [line for line in lines if line.startswith("WARN  ")]
    assert warned.split(None, 2) == ["WARN", "db-pool-exhaustion", pool_finding["summary"]]
    assert lines[-1] == f"0 of {len(data['checks'])} checks failed, 1 warning"


@pytest.mark.slow
def test_a_disabled_rule_is_neither_checked_nor_found(held: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, "[rules.db-pool-exhaustion]\nenabled = false\n")
    data = check_json(held, "--config", config, exit_code=0)
    assert [c["id"] for c in data["checks"]] == [f"rule.{r}" for r in BUILTIN_RULES if r != "db-pool-exhaustion"]
    assert all(c["outcome"] == "pass" for c in data["checks"])
    # The layer still owns the tail; no finding of the disabled rule explains it.
    assert data["verdict"]["layer"] == "db.pool" and data["verdict"]["rule"] is None


@pytest.mark.slow
def test_a_threshold_the_finding_does_not_reach_makes_the_rule_pass(held: Path, pool_finding, tmp_path: Path) -> None:
    assert pool_finding["evidence"]["tail_excess_ms"] < 10_000  # what the rule compares min_tail_excess_ms with
    config = write_config(tmp_path, "[rules.db-pool-exhaustion]\nmin_tail_excess_ms = 10000\n")
    data = check_json(held, "--config", config, exit_code=0)
    rule = by_id(data)["rule.db-pool-exhaustion"]
    assert (rule["outcome"], rule["message"]) == ("pass", "db-pool-exhaustion found nothing")
    # ... and one it does reach leaves it failing: the value is used, not merely accepted.
    config = write_config(tmp_path, "[rules.db-pool-exhaustion]\nmin_tail_excess_ms = 100\nmin_share_of_tail_excess = 0.5\n")
    assert by_id(check_json(held, "--config", config, exit_code=1))["rule.db-pool-exhaustion"]["outcome"] == "fail"


@pytest.mark.slow
def test_the_healthy_capture_passes_with_the_default_config(healthy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert find_config(tmp_path) is None
    data = check_json(healthy, exit_code=0)
    assert data["config"] is None and data["passed"] is True
    assert [(c["id"], c["outcome"]) for c in data["checks"]] == [(f"rule.{r}", "pass") for r in BUILTIN_RULES]
    assert data["verdict"]["status"] == "no_tail"
    text = latprof("check", healthy)
    assert text.exit_code == 0 and text.stdout.splitlines()[-1] == f"all {len(BUILTIN_RULES)} checks passed"


@pytest.mark.slow
def test_a_relative_budget_is_held_against_the_baseline(held: Path, healthy: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, '[budget]\np99_ms = "+10%"\n')
    base, now = p(raw(healthy).latencies(), 99), p(raw(held).latencies(), 99)
    assert now > base * 1.1
    data = check_json(held, "--config", config, "--baseline", healthy, exit_code=1)
    assert data["baseline"] == str(healthy)
    budget = by_id(data)["budget.p99_ms"]
    assert budget["outcome"] == "fail"
    assert budget["evidence"]["baseline"] == pytest.approx(base, abs=1e-3)
    assert budget["evidence"]["allowed_change_pct"] == 10
    assert budget["threshold"] == pytest.approx(base * 1.1, abs=1e-3)
    assert budget["observed"] == pytest.approx(now, abs=1e-3)
    change = (now / base - 1) * 100
    assert budget["evidence"]["change_pct"] == pytest.approx(change, abs=0.01)
    assert budget["message"] == (
        f"p99 latency {now:.0f} ms is {change:+.0f}% of the baseline's {base:.0f} ms (over the allowed +10%, {base * 1.1:.0f} ms)"
    )
    # The other way round, the healthy run is well within 10% over the pool one.
    back = by_id(check_json(healthy, "--config", config, "--baseline", held, exit_code=0))["budget.p99_ms"]
    assert back["outcome"] == "pass" and back["evidence"]["baseline"] == pytest.approx(now, abs=1e-3)
    assert "(within the allowed +10%" in back["message"]


@pytest.mark.slow
def test_a_relative_budget_without_a_baseline_is_a_config_error(held: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, '[tool.latprof.budget]\np50_ms = 500\np99_ms = "+10%"\n', "pyproject.toml")
    line = one_error_line(latprof("check", held, "--config", config))
    assert line == f"latprof: error: {config}:tool.latprof.budget.p99_ms: is relative to a baseline: pass --baseline CAPTURE"


@pytest.mark.slow
def test_route_budgets_pass_fail_match_globs_and_skip_an_unseen_route(held: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, f"""\
[[budget.routes]]
route = "{CHAT}"
p99_ms = 60000
max_ms = 100

[[budget.routes]]
route = "GET /ch*"
p50_ms = 60000

[[budget.routes]]
route = "POST /chat"
p99_ms = 1
""")  # fmt: skip
    chat = raw(held).latencies(CHAT)
    assert p(chat, 99) < 60000 and max(chat) > 100
    data = check_json(held, "--config", config, exit_code=1)
    checks = by_id(data)
    p99, worst, p50 = checks[f"budget.route.{CHAT}.p99_ms"], checks[f"budget.route.{CHAT}.max_ms"], checks["budget.route.GET /ch*.p50_ms"]
    assert p99["outcome"] == "pass" and p99["observed"] == pytest.approx(p(chat, 99), abs=1e-3)
    assert p99["evidence"]["requests"] == len(chat) and p99["evidence"]["route"] == CHAT
    assert worst["outcome"] == "fail" and worst["observed"] == pytest.approx(max(chat), abs=1e-3)
    assert worst["message"] == f"{CHAT} max {max(chat):.0f} ms over the budget of 100 ms"
    assert p50["outcome"] == "pass" and p50["observed"] == pytest.approx(p(chat, 50), abs=1e-3)
    unseen = checks["budget.route.POST /chat.p99_ms"]
    assert unseen["outcome"] == "skip" and unseen["observed"] is None
    assert unseen["message"] == f"POST /chat p99: not checked: no request of route 'POST /chat' was analysed (did you mean '{CHAT}'?)"
    assert [c["id"] for c in data["checks"] if c["failed"]] == [f"budget.route.{CHAT}.max_ms", "rule.db-pool-exhaustion"]
    assert data["summary"]["skipped"] == 1


@pytest.mark.slow
def test_pool_wait_and_ttft_budgets_are_the_p99s_of_the_recorded_segments(held: Path, tmp_path: Path) -> None:
    events = raw(held)
    pool_waits = events.durations("db.pool")
    ttfts = [ms(s) for s in events.segments if s["layer"] == "provider" and s.get("attrs", {}).get("latprof.ttft_known") is True]
    assert len(pool_waits) == len(events.latencies(CHAT)) and ttfts
    assert p(pool_waits, 99) > 50 and p(ttfts, 99) < 60000
    config = write_config(tmp_path, "[budget]\npool_wait_p99_ms = 50\nttft_p99_ms = 60000\n")
    checks = by_id(check_json(held, "--config", config, exit_code=1))
    pool, ttft = checks["budget.pool_wait_p99_ms"], checks["budget.ttft_p99_ms"]
    assert pool["outcome"] == "fail" and pool["observed"] == pytest.approx(p(pool_waits, 99), abs=1e-3)
    assert pool["message"] == f"p99 pool wait per checkout {p(pool_waits, 99):.0f} ms over the budget of 50 ms"
    assert ttft["outcome"] == "pass" and ttft["observed"] == pytest.approx(p(ttfts, 99), abs=1e-3)
    assert ttft["message"].startswith(f"p99 time to first token {p(ttfts, 99):.0f} ms within the budget of ")


@pytest.mark.slow
def test_pool_wait_budget_on_the_healthy_capture_passes(healthy: Path, tmp_path: Path) -> None:
    pool_waits = raw(healthy).durations("db.pool")
    config = write_config(tmp_path, "[budget]\npool_wait_p99_ms = 50\n")
    pool = by_id(check_json(healthy, "--config", config, exit_code=0))["budget.pool_wait_p99_ms"]
    assert pool["outcome"] == "pass" and pool["observed"] == pytest.approx(p(pool_waits, 99), abs=1e-3) and pool["observed"] < 50


# --- declarative checks ---------------------------------------------------------------------------


@pytest.mark.slow
def test_declarative_checks_compute_their_statistic_of_the_selection(held: Path, tmp_path: Path) -> None:
    events = raw(held)
    pool_waits, provider_ms = events.durations("db.pool"), events.durations("provider")
    chat = events.latencies(CHAT)
    assert max(provider_ms) > 1
    config = write_config(tmp_path, f"""\
[[checks]]
id = "provider-p99"
select = "segments"
where = {{layer = "provider"}}
stat = "p99"
threshold = 60000

[[checks]]
id = "chat-waits-for-the-pool"
description = "chat requests check a connection out"
where = {{route = "{CHAT}", layer = "db.pool"}}
stat = "share"
op = ">"
threshold = 0.5

[[checks]]
id = "chat-p99"
where = {{route = "{CHAT}"}}
stat = "p99"
threshold = 100
message = "chat p99 {{value:.0f}} ms > {{threshold:.0f}} ms over {{count}} requests"

[[checks]]
id = "checkouts"
select = "segments"
where = {{layer = "db.pool", name = "sqlalchemy check*"}}
stat = "count"
op = "=="
threshold = {len(pool_waits)}

[[checks]]
id = "local-provider-max"
select = "segments"
where = {{layer = "provider", attributes = {{"server.address" = "127.0.0.1"}}}}
stat = "max"
op = "<"
threshold = 1
severity = "warning"

[[checks]]
id = "no-tools"
select = "segments"
where = {{layer = "tool"}}
stat = "p99"
threshold = 1
""")  # fmt: skip
    data = check_json(held, "--config", config, exit_code=1)
    checks = by_id(data)
    provider_p99 = checks["custom.provider-p99"]
    assert provider_p99["outcome"] == "pass" and provider_p99["observed"] == pytest.approx(p(provider_ms, 99), abs=1e-3)
    assert provider_p99["evidence"]["matched"] == len(provider_ms)
    assert provider_p99["message"] == f"provider-p99: p99 of {len(provider_ms)} segments {p(provider_ms, 99):.0f} ms holds <= 60 s"
    share = checks["custom.chat-waits-for-the-pool"]
    assert share["outcome"] == "pass" and share["observed"] == 1.0 and share["title"] == "chat requests check a connection out"
    chat_p99 = checks["custom.chat-p99"]
    assert chat_p99["outcome"] == "fail" and chat_p99["failed"] is True
    assert chat_p99["message"] == f"chat p99 {p(chat, 99):.0f} ms > 100 ms over {len(chat)} requests"
    checkouts = checks["custom.checkouts"]
    assert checkouts["outcome"] == "pass" and checkouts["observed"] == len(pool_waits) and checkouts["unit"] == "count"
    local = checks["custom.local-provider-max"]
    assert (local["outcome"], local["level"], local["failed"]) == ("fail", "warning", False)
    assert local["observed"] == pytest.approx(max(provider_ms), abs=1e-3)
    nothing = checks["custom.no-tools"]
    assert (nothing["outcome"], nothing["message"]) == ("skip", "no-tools: not checked: nothing matched its selection")
    assert [c["id"] for c in data["checks"] if c["failed"]] == ["rule.db-pool-exhaustion", "custom.chat-p99"]
    assert data["summary"] == {"checks": len(BUILTIN_RULES) + 6, "failed": 2, "warnings": 1, "skipped": 1}


@pytest.mark.slow
def test_passing_declarative_checks_pass_the_gate(held: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, """\
[rules.db-pool-exhaustion]
enabled = false

[[checks]]
id = "provider-p99"
select = "segments"
where = {layer = "provider"}
stat = "p99"
threshold = 60000
""")  # fmt: skip
    data = check_json(held, "--config", config, exit_code=0)
    assert by_id(data)["custom.provider-p99"]["outcome"] == "pass" and data["passed"] is True


class PreconditionError(Exception):
    """The capture is not what the test needs (kept apart from the test's own AssertionError)."""


@pytest.mark.slow
def test_a_share_of_a_routes_requests_is_over_that_routes_requests(held: Path, tmp_path: Path) -> None:
    events = raw(held, warmup_s=0)
    chat = [r for r in events.requests if r["route"] == CHAT]
    with_pool = {s["request_id"] for s in events.segments if s["layer"] == "db.pool" and ms(s) > 0}
    if not (len(chat) < len(events.requests) and all(r["request_id"] in with_pool for r in chat)):
        raise PreconditionError("needs another route beside GET /chat and a pool wait in every chat request")
    config = write_config(tmp_path, f"""\
[[checks]]
id = "every-chat-request-waits"
where = {{route = "{CHAT}", layer = "db.pool"}}
stat = "share"
op = ">="
threshold = 1.0
""")  # fmt: skip
    check = by_id(check_json(held, "--config", config, "--skip-warmup", "0", exit_code=1))["custom.every-chat-request-waits"]
    assert check["evidence"]["requests"] == len(chat)
    assert check["observed"] == 1.0 and check["outcome"] == "pass", check["message"]


# --- input and config errors ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_missing_or_damaged_capture_is_one_line_and_exit_2(held: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    junit = tmp_path / "junit.xml"
    assert one_error_line(latprof("check", missing, "--junit", junit)) == f"latprof: error: {missing}: no such file or directory"
    assert not junit.exists()  # no report of a run that did not happen

    lines = held.read_text(encoding="utf-8").splitlines(keepends=True)
    middle = len(lines) // 2
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("".join(lines[:middle]) + lines[middle][:25] + "\n" + "".join(lines[middle + 1:]), encoding="utf-8")
    line = one_error_line(latprof("check", damaged, "--junit", junit))
    assert line.startswith(f"latprof: error: {damaged}:{middle + 1}: malformed line")
    assert line.endswith("the capture is damaged before its end")
    assert not junit.exists()

    only_header = tmp_path / "header.jsonl"
    only_header.write_text(lines[0], encoding="utf-8")
    assert "capture holds no events" in one_error_line(latprof("check", only_header))
    baseline = tmp_path / "no-baseline.jsonl"
    config = write_config(tmp_path, '[budget]\np99_ms = "+10%"\n')
    assert one_error_line(latprof("check", held, "--config", config, "--baseline", baseline)) == (
        f"latprof: error: {baseline}: no such file or directory"
    )


@pytest.mark.slow
def test_a_bad_config_is_one_line_naming_the_file_and_key(held: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write_config(tmp_path, '[tool.latprof.budget]\np99_ms = "fast"\n', "pyproject.toml")
    assert one_error_line(latprof("check", held, "--config", config)) == (
        f"latprof: error: {config}:tool.latprof.budget.p99_ms: must be a number or a change against the baseline like '+10%', not 'fast'"
    )
    # ... found from the working directory, not named
    project = tmp_path / "project"
    project.mkdir()
    found = write_config(project, '[rules.db-pool-exhaustoin]\nseverity = "warning"\n')
    monkeypatch.chdir(project)
    assert one_error_line(latprof("check", held)) == (
        f"latprof: error: {found}:rules.db-pool-exhaustoin: no such rule (did you mean 'db-pool-exhaustion'?)"
    )
    missing = tmp_path / "nope.toml"
    assert one_error_line(latprof("check", held, "--config", missing)) == f"latprof: error: {missing}: no such config file"
    assert one_error_line(latprof("analyze", held, "--config", missing)) == f"latprof: error: {missing}: no such config file"
    assert one_error_line(latprof("rules", "--config", config)).startswith(f"latprof: error: {config}:tool.latprof.budget.p99_ms: ")


# --- GitHub Actions ----------------------------------------------------------------------------------

GITHUB_CONFIG = """\
[budget]
p99_ms = 100

[[checks]]
id = "provider-max"
description = "provider calls under 1 ms"
select = "segments"
where = {layer = "provider"}
stat = "max"
threshold = 1
severity = "warning"
"""


def _escaped(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


@pytest.mark.slow
def test_under_github_actions_failures_are_annotations_and_the_summary_a_table(held: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, GITHUB_CONFIG)
    summary = tmp_path / "step-summary.md"
    summary.write_text("## an earlier step\n\n", encoding="utf-8")
    github = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    data = check_json(held, "--config", config, exit_code=1)  # outside GitHub: the numbers to expect
    checks = by_id(data)
    budget, rule, custom = checks["budget.p99_ms"], checks["rule.db-pool-exhaustion"], checks["custom.provider-max"]
    expected = [
        f"::error title=p99 latency <= 100 ms::{_escaped(budget['message'])}",
        f"::error title=db-pool-exhaustion::{_escaped(rule['message'])}",
        f"::warning title=provider calls under 1 ms::{_escaped(custom['message'])}",
    ]
    assert "%25" in expected[1]  # the finding's "1%" is escaped for the runner

    text = latprof("check", held, "--config", config, env=github)
    assert text.exit_code == 1
    assert [line for line in text.stdout.splitlines() if line.startswith("::")] == expected
    written = summary.read_text(encoding="utf-8")
    assert written.startswith("## an earlier step\n\n## latprof check: failed\n")
    table = [line for line in written.splitlines() if line.startswith("|")]
    assert table[:2] == ["| | check | observed | threshold | message |", "|---|---|---|---|---|"]
    assert len(table) == 2 + len(data["checks"])
    assert table[2] == f"| ❌ | p99 latency &lt;= 100 ms | {budget['observed']:.0f} ms | 100 ms | {budget['message']} |"
    assert any(row.startswith("| ❌ | db-pool-exhaustion |") for row in table)
    assert any(row.startswith("| ⚠️ | provider calls under 1 ms |") for row in table)
    assert written.rstrip("\n").endswith(f"2 of {len(data['checks'])} checks failed, 1 warning")

    # With the JSON on stdout the annotations go to stderr, and the summary is appended again.
    as_json = latprof("check", held, "--config", config, "--format", "json", env=github)
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout)["summary"] == data["summary"]
    assert as_json.stderr.splitlines() == expected
    assert summary.read_text(encoding="utf-8").count("## latprof check: failed") == 2


@pytest.mark.slow
def test_outside_github_actions_there_are_no_annotations(held: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, GITHUB_CONFIG)
    summary = tmp_path / "step-summary.md"
    result = latprof("check", held, "--config", config, env={"GITHUB_ACTIONS": "false", "GITHUB_STEP_SUMMARY": str(summary)})
    assert result.exit_code == 1
    assert not [line for line in result.output.splitlines() if line.startswith("::")] and not summary.exists()


# --- analyze --config and the rule catalogue ---------------------------------------------------------


@pytest.mark.slow
def test_analyze_with_a_config_that_disables_a_rule_drops_its_finding(held: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    default = latprof("analyze", held, "--format", "json")
    assert default.exit_code == 0
    before = json.loads(default.stdout)
    assert "db-pool-exhaustion" in [f["rule"] for f in before["findings"]]
    config = write_config(tmp_path, "[rules.db-pool-exhaustion]\nenabled = false\n")
    configured = latprof("analyze", held, "--config", config, "--format", "json")
    assert configured.exit_code == 0
    after = json.loads(configured.stdout)
    assert [f["rule"] for f in after["findings"]] == [f["rule"] for f in before["findings"] if f["rule"] != "db-pool-exhaustion"]
    assert after["latency_ms"] == before["latency_ms"] and after["verdict"]["layer"] == "db.pool"
    # the config's skip_warmup_s applies when --skip-warmup is not given
    later = write_config(tmp_path, "skip_warmup_s = 5\n", "later.toml")
    shifted = json.loads(latprof("analyze", held, "--config", later, "--format", "json").stdout)
    assert shifted["window"]["requests"] == len(raw(held, warmup_s=5).requests) < len(raw(held).requests)


RULES_CONFIG = """\
[rules.db-pool-exhaustion]
severity = "warning"
min_tail_excess_ms = 75

[rules.provider-floor]
min_calls = 5

[rules.slow-query]
enabled = false
"""


def test_rules_json_shows_configured_threshold_values_beside_the_defaults(tmp_path: Path) -> None:
    from latprof.rules.db_pool_exhaustion import DbPoolExhaustion

    config = write_config(tmp_path, RULES_CONFIG)
    result = latprof("rules", "--format", "json", "--config", config)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "latprof.rules/1" and data["config"] == str(config)
    rules = {r["id"]: r for r in data["rules"]}
    assert sorted(rules) == BUILTIN_RULES
    pool = rules["db-pool-exhaustion"]
    assert (pool["enabled"], pool["severity"], pool["source"], pool["layer"]) == (True, "warning", "built-in", "db.pool")
    defaults = DbPoolExhaustion.Thresholds()
    assert {t["name"]: (t["value"], t["default"], t["configured"]) for t in pool["thresholds"]} == {
        "min_share_of_tail_excess": (defaults.min_share_of_tail_excess, defaults.min_share_of_tail_excess, False),
        "min_tail_excess_ms": (75.0, defaults.min_tail_excess_ms, True),
        "min_share_of_median_latency": (defaults.min_share_of_median_latency, defaults.min_share_of_median_latency, False),
        "min_median_wait_ms": (defaults.min_median_wait_ms, defaults.min_median_wait_ms, False),
        "min_llm_overlap_ratio": (defaults.min_llm_overlap_ratio, defaults.min_llm_overlap_ratio, False),
        "attach_min_share": (defaults.attach_min_share, defaults.attach_min_share, False),
    }
    assert pool["docs"] == DbPoolExhaustion.docs()
    [min_calls] = [t for t in rules["provider-floor"]["thresholds"] if t["name"] == "min_calls"]
    assert min_calls == {"name": "min_calls", "type": "int", "default": 20, "value": 5, "configured": True}
    assert rules["slow-query"]["enabled"] is False and rules["request-queueing"]["enabled"] is True
    listing = latprof("rules", "--config", config)
    assert listing.exit_code == 0
    lines = listing.stdout.splitlines()
    assert next(line for line in lines if line.startswith("db-pool-exhaustion ")).endswith("  [warning]")
    assert next(line for line in lines if line.startswith("slow-query ")).endswith("  (disabled)")
    assert lines[-1] == f"(as configured by {config})"


def _explain_sections(text: str) -> dict[str, str]:
    """`rules explain` output split at its unindented `Title:` lines."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines()[2:]:
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {name: "\n".join(body).strip("\n") for name, body in sections.items()}


def test_rules_explain_prints_every_section_and_the_thresholds(tmp_path: Path) -> None:
    from latprof.rules.db_pool_exhaustion import DbPoolExhaustion

    result = latprof("rules", "explain", "db-pool-exhaustion")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[:2] == ["db-pool-exhaustion  (layer db.pool)", DbPoolExhaustion.summary_line()]
    sections = _explain_sections(result.stdout)
    assert list(sections) == [*DOC_SECTIONS, "Thresholds"]
    docs = DbPoolExhaustion.docs()
    for section in DOC_SECTIONS:
        assert sections[section] == "\n".join(f"    {line}" if line.strip() else "" for line in docs[section].splitlines())
    assert "Do not hold a connection across slow non-database work" in sections["How to fix"]
    assert sections["Thresholds"].splitlines() == [
        "    min_share_of_tail_excess = 0.2  (float)",
        "    min_tail_excess_ms = 50.0  (float)",
        "    min_share_of_median_latency = 0.5  (float)",
        "    min_median_wait_ms = 20.0  (float)",
        "    min_llm_overlap_ratio = 0.5  (float)",
        "    attach_min_share = 0.2  (float)",
    ]
    config = write_config(tmp_path, RULES_CONFIG)
    for args in (("rules", "explain", "db-pool-exhaustion", "--config", config), ("rules", "--config", config, "explain", "db-pool-exhaustion")):
        configured = latprof(*args)
        assert configured.exit_code == 0, configured.output
        assert "    min_tail_excess_ms = 75.0  (float)  (configured; default 50.0)" in configured.stdout.splitlines()
        assert configured.stdout.splitlines()[-1] == "Configured: enabled, severity warning"
