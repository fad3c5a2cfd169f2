"""Rules from other packages: an entry point of an installed-looking distribution, listed, checked, configured, and refused loudly when broken."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
POOL = EXAMPLES / "pool_held_across_llm.jsonl.gz"  # p99 ~600 ms: over the plugin's default ceiling
HEALTHY = EXAMPLES / "healthy.jsonl.gz"  # p99 ~170 ms: over it too, but no built-in rule fires

SECTIONS = {
    "What it detects": "Request latency whose p99 is above the team's ceiling `max_p99_ms`.",
    "Why it matters for p99": "The ceiling is the service's promise; a p99 over it breaks it.",
    "Evidence": "p99_ms of the analysed requests and max_p99_ms.",
    "How to fix": "Run `latprof analyze` on the capture: it names the layer that owns the tail.",
    "Example": "A chat service with a 100 ms ceiling and a p99 of 600 ms.",
}

PACKAGE = '''\
"""A team's own latprof rules."""

from __future__ import annotations

from dataclasses import dataclass

from latprof.engine import Rule


@dataclass(frozen=True, slots=True)
class Thresholds:
    max_p99_ms: float = 100.0


class NoSlowRequests(Rule):
    """Requests are slower than the team's p99 ceiling.

    What it detects:
        {What it detects}

    Why it matters for p99:
        {Why it matters for p99}

    Evidence:
        {Evidence}

    How to fix:
        {How to fix}

    Example:
        {Example}
    """

    id = "no-slow-requests"
    layer = "app"
    Thresholds = Thresholds

    def check(self, analysis):
        t = self.thresholds
        lat = analysis.latency
        if lat is None or lat.p99_ms <= t.max_p99_ms:
            return
        yield self.finding(
            severity="critical",
            confidence=1.0,
            impact_ms=lat.p99_ms - t.max_p99_ms,
            summary=f"p99 {{lat.p99_ms:.0f}} ms is over the team's ceiling of {{t.max_p99_ms:g}} ms",
            evidence={{"p99_ms": lat.p99_ms, "max_p99_ms": t.max_p99_ms}},
            fix="latprof analyze names the layer that owns the tail",
            subject="p99",
        )


@dataclass(frozen=True, slots=True)
class CountThresholds:
    max_requests: int = 1_000_000


class NotTooManyRequests(Rule):
    """More requests than the team planned for.

    What it detects:
        More analysed requests than `max_requests`.

    Why it matters for p99:
        Load beyond the plan is where queues form.

    Evidence:
        The number of requests.

    How to fix:
        Plan for more.

    Example:
        Two million requests against a plan of one million.
    """

    id = "not-too-many-requests"
    layer = "app"
    Thresholds = CountThresholds

    def check(self, analysis):
        if len(analysis.requests) > self.thresholds.max_requests:
            yield self.finding(severity="warning", confidence=1.0, impact_ms=0.0, summary="too many requests",
                               evidence={{"requests": len(analysis.requests)}}, fix="plan for more")
'''.format(**SECTIONS)

BROKEN = '''\
"""Things an entry point may name by mistake."""

from latprof.engine import Rule
from myrules_pkg import NoSlowRequests, Thresholds


class NotARule:
    """A class, but no Rule."""


class HalfDocumented(NoSlowRequests):
    """Documented but for its example.

    What it detects:
        x

    Why it matters for p99:
        x

    Evidence:
        x

    How to fix:
        x
    """

    id = "half-documented"


class PoolToo(NoSlowRequests):
    __doc__ = NoSlowRequests.__doc__
    id = "db-pool-exhaustion"


LIMIT = 5


def make_rules():
    return [NoSlowRequests]
'''

ENTRY = "no-slow-requests"
WHERE = f"entry point {ENTRY!r}"


def install(tmp_path: Path, entry_points: str) -> Path:
    """A distribution `myrules-pkg` 1.0 as pip leaves one in site-packages: its package and its dist-info."""
    site = tmp_path / "site"
    (site / "myrules_pkg").mkdir(parents=True)
    (site / "myrules_pkg" / "__init__.py").write_text(PACKAGE, encoding="utf-8")
    (site / "myrules_pkg" / "broken.py").write_text(BROKEN, encoding="utf-8")
    (site / "raising_rules.py").write_text('raise RuntimeError("the team\'s rules are broken")\n', encoding="utf-8")
    (site / "empty_rules.py").write_text('"""No rules here (any more)."""\n', encoding="utf-8")
    info = site / "myrules_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myrules-pkg\nVersion: 1.0\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[latprof.rules]\n" + textwrap.dedent(entry_points), encoding="utf-8")
    return site


def latprof(site: Path, cwd: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """`python -m latprof ARGS` in a fresh interpreter that finds the distribution on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "latprof", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


@pytest.fixture
def site(tmp_path: Path) -> Path:
    return install(tmp_path, f"{ENTRY} = myrules_pkg:NoSlowRequests\n")


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    return tmp_path / "work"


def p99_of(capture: Path, cwd: Path) -> float:
    """The capture's p99 as `latprof analyze` reports it, without any plugin installed."""
    done = subprocess.run([sys.executable, "-m", "latprof", "analyze", str(capture), "--format", "json"], cwd=cwd,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return float(json.loads(done.stdout)["latency_ms"]["p99"])


def test_latprof_rules_lists_the_entry_point_rule_with_its_docs_and_thresholds(site: Path, work: Path) -> None:
    listing = latprof(site, work, "rules")
    assert listing.returncode == 0, listing.stderr
    [line] = [line for line in listing.stdout.splitlines() if line.startswith(f"{ENTRY} ")]
    assert line.split(None, 2) == [ENTRY, "app", "Requests are slower than the team's p99 ceiling."]
    catalogue = latprof(site, work, "rules", "--format", "json")
    assert catalogue.returncode == 0, catalogue.stderr
    rules = {r["id"]: r for r in json.loads(catalogue.stdout)["rules"]}
    mine = rules[ENTRY]
    assert mine["source"] == "entry point (latprof.rules): myrules_pkg"
    assert rules["db-pool-exhaustion"]["source"] == "built-in"
    assert mine["docs"] == SECTIONS
    assert mine["thresholds"] == [{"name": "max_p99_ms", "type": "float", "default": 100.0, "value": 100.0, "configured": False}]
    assert (mine["enabled"], mine["severity"], mine["layer"]) == (True, "error", "app")
    explained = latprof(site, work, "rules", "explain", ENTRY)
    assert explained.returncode == 0, explained.stderr
    for section, text in SECTIONS.items():
        assert f"\n{section}:\n    {text}\n" in explained.stdout
    assert explained.stdout.endswith("\nThresholds:\n    max_p99_ms = 100.0  (float)\n")


def test_a_module_entry_point_contributes_every_rule_of_the_module(tmp_path: Path, work: Path) -> None:
    site = install(tmp_path, "team = myrules_pkg\n")
    catalogue = latprof(site, work, "rules", "--format", "json")
    assert catalogue.returncode == 0, catalogue.stderr
    rules = {r["id"]: r for r in json.loads(catalogue.stdout)["rules"]}
    assert rules[ENTRY]["source"] == rules["not-too-many-requests"]["source"] == "entry point (latprof.rules): myrules_pkg"
    assert rules["not-too-many-requests"]["thresholds"][0]["type"] == "int"


def test_latprof_check_fails_with_the_entry_point_rule(site: Path, work: Path, tmp_path: Path) -> None:
    p99 = p99_of(POOL, work)
    assert p99 > 100
    sarif = tmp_path / "latprof.sarif"
    done = latprof(site, work, "check", POOL, "--format", "json", "--sarif", sarif)
    assert done.returncode == 1, done.stderr
    checks = {c["id"]: c for c in json.loads(done.stdout)["checks"]}
    mine = checks[f"rule.{ENTRY}"]
    assert (mine["outcome"], mine["level"], mine["failed"], mine["layer"], mine["kind"]) == ("fail", "error", True, "app", "rule")
    assert mine["evidence"]["p99_ms"] == pytest.approx(p99, abs=1e-3)
    assert mine["message"] == f"p99 {mine['evidence']['p99_ms']:.0f} ms is over the team's ceiling of 100 ms"
    assert mine["description"] == SECTIONS["What it detects"]
    assert [c for c in checks if checks[c]["failed"]] == ["rule.db-pool-exhaustion", f"rule.{ENTRY}"]
    results = json.loads(sarif.read_text(encoding="utf-8"))["runs"][0]["results"]
    assert [r["ruleId"] for r in results] == ["rule.db-pool-exhaustion", f"rule.{ENTRY}"]
    analyzed = latprof(site, work, "analyze", POOL, "--format", "json")
    assert analyzed.returncode == 0, analyzed.stderr
    assert ENTRY in [f["rule"] for f in json.loads(analyzed.stdout)["findings"]]


def test_the_entry_point_rules_threshold_is_configured_like_a_built_in_ones(site: Path, work: Path) -> None:
    assert p99_of(HEALTHY, work) > 100
    failing = latprof(site, work, "check", HEALTHY)
    assert failing.returncode == 1, failing.stderr
    assert [line.split()[:2] for line in failing.stdout.splitlines() if line.startswith("FAIL")] == [["FAIL", ENTRY]]

    (work / "latprof.toml").write_text(f"[rules.{ENTRY}]\nmax_p99_ms = 1e9\n", encoding="utf-8")  # found from the cwd
    passing = latprof(site, work, "check", HEALTHY, "--format", "json")
    assert passing.returncode == 0, passing.stderr
    data = json.loads(passing.stdout)
    mine = next(c for c in data["checks"] if c["id"] == f"rule.{ENTRY}")
    assert (mine["outcome"], mine["message"]) == ("pass", f"{ENTRY} found nothing")
    assert data["config"] == str(work / "latprof.toml")
    explained = latprof(site, work, "rules", "explain", ENTRY)
    assert "    max_p99_ms = 1000000000.0  (float)  (configured; default 100.0)" in explained.stdout.splitlines()

    (work / "latprof.toml").write_text(f'[rules.{ENTRY}]\nseverity = "warning"\n', encoding="utf-8")
    warned = latprof(site, work, "check", HEALTHY)
    assert warned.returncode == 0 and any(line.startswith(f"WARN  {ENTRY}") for line in warned.stdout.splitlines())
    (work / "latprof.toml").write_text(f"[rules.{ENTRY}]\nenabled = false\n", encoding="utf-8")
    off = latprof(site, work, "check", HEALTHY, "--format", "json")
    assert off.returncode == 0 and f"rule.{ENTRY}" not in [c["id"] for c in json.loads(off.stdout)["checks"]]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f'[rules.{ENTRY}]\nmax_p99_ms = "fast"\n', f"rules.{ENTRY}.max_p99_ms: must be a number, not 'fast'"),
        (f"[rules.{ENTRY}]\nmax_p99 = 5\n", f"rules.{ENTRY}.max_p99: unknown key (did you mean 'max_p99_ms'?)"),
        ("[rules.no-slow-request]\nenabled = false\n", f"rules.no-slow-request: no such rule (did you mean '{ENTRY}'?)"),
    ],
    ids=["wrong-type", "unknown-threshold", "misspelt-id"],
)
def test_the_config_schema_of_an_entry_point_rule_comes_from_the_rule(site: Path, work: Path, text: str, expected: str) -> None:
    config = work / "latprof.toml"
    config.write_text(text, encoding="utf-8")
    done = latprof(site, work, "check", HEALTHY, "--config", config)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [f"latprof: error: {config}:{expected}"]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("raising_rules:NoSlowRequests", "cannot be loaded: RuntimeError: the team's rules are broken"),
        ("myrules_pkg:Gone", "cannot be loaded: AttributeError: module 'myrules_pkg' has no attribute 'Gone'"),
        ("myrules_pkg.broken:NotARule", "NotARule is not a latprof.engine.Rule subclass"),
        ("myrules_pkg.broken:HalfDocumented", "HalfDocumented: docstring lacks section(s) Example"),
    ],
    ids=["raises-on-import", "no-such-attribute", "not-a-rule", "missing-doc-section"],
)
def test_a_broken_entry_point_is_one_line_naming_it_and_exit_2(tmp_path: Path, work: Path, value: str, problem: str) -> None:
    site = install(tmp_path, f"{ENTRY} = {value}\n")
    expected = f"latprof: error: {WHERE} ({value}, from myrules-pkg): {problem}"
    for args in (("check", POOL), ("rules",), ("analyze", POOL)):
        done = latprof(site, work, *args)
        assert (done.returncode, done.stdout) == (2, ""), (args, done.stdout, done.stderr)
        assert done.stderr.splitlines() == [expected], args


def test_an_entry_point_rule_reusing_a_built_in_id_is_refused(tmp_path: Path, work: Path) -> None:
    site = install(tmp_path, f"{ENTRY} = myrules_pkg.broken:PoolToo\n")
    for args in (("check", POOL), ("rules",)):
        done = latprof(site, work, *args)
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert done.stderr.splitlines() == [
            f"latprof: error: {WHERE} (myrules_pkg.broken:PoolToo, from myrules-pkg): rule id 'db-pool-exhaustion' of"
            " myrules_pkg.broken.PoolToo is already taken by"
            " latprof.rules.db_pool_exhaustion.DbPoolExhaustion"
        ]


def test_an_id_clash_names_the_entry_point_and_its_distribution(tmp_path: Path, work: Path) -> None:
    site = install(tmp_path, f"{ENTRY} = myrules_pkg.broken:PoolToo\n")
    done = latprof(site, work, "rules")
    assert done.returncode == 2
    assert f"{WHERE} (myrules_pkg.broken:PoolToo, from myrules-pkg)" in done.stderr


@pytest.mark.parametrize("value", ["myrules_pkg.broken:LIMIT", "myrules_pkg.broken:make_rules", "empty_rules"],
                         ids=["an-int", "a-function", "a-module-without-rules"])  # fmt: skip
def test_an_entry_point_that_names_no_rule_is_one_line_naming_it_and_exit_2(tmp_path: Path, work: Path, value: str) -> None:
    site = install(tmp_path, f"{ENTRY} = {value}\n")
    done = latprof(site, work, "check", HEALTHY)
    assert done.returncode == 2, (done.stdout, done.stderr)
    [line] = done.stderr.splitlines()
    assert line.startswith(f"latprof: error: {WHERE} ({value}, from myrules-pkg): ")
