"""The rule engine: discovery, the rule contract, and a crashing rule that becomes a finding."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from timelines import analysed, population

from latprof.engine import DOC_SECTIONS, Rule, discover_rules, run_rules, validate_rule_class
from latprof.layers import LAYERS
from latprof.report.model import build_report

DOC = """Summary line.

    What it detects:
        x
    Why it matters for p99:
        x
    Evidence:
        x
    How to fix:
        x
    Example:
        x
    """

BUILTIN = {"db-pool-exhaustion", "request-queueing", "provider-floor", "long-decode", "event-loop-blocked", "slow-query"}


def test_every_builtin_rule_is_discovered_and_keeps_the_contract():
    rules = discover_rules()
    assert {r.id for r in rules} >= BUILTIN
    for rule in rules:
        assert rule.layer in LAYERS
        docs = rule.docs()
        assert all(docs.get(section) for section in DOC_SECTIONS), rule.id
        for name, _type, default in rule.threshold_fields():
            assert default is not None, f"{rule.id}.{name} needs a default"
        with pytest.raises(Exception):
            rule.Thresholds().__setattr__(rule.threshold_fields()[0][0], 1)  # frozen


def test_every_module_of_the_rules_folder_is_listed_and_defines_one_rule():
    import latprof.rules as package

    files = sorted(p.stem for p in Path(package.__file__).parent.glob("*.py") if not p.stem.startswith("_"))
    assert sorted(m.__name__.rsplit(".", 1)[1] for m in package.MODULES) == files
    by_module = {r.__module__ for r in discover_rules()}
    assert by_module == {m.__name__ for m in package.MODULES}
    assert len(discover_rules()) == len(files)


def test_a_rule_without_doc_sections_is_rejected():
    class Undocumented(Rule):
        """Nothing else."""

        id = "undocumented"
        layer = "app"

    with pytest.raises(TypeError, match="lacks section"):
        validate_rule_class(Undocumented)


def test_bad_ids_layers_and_mutable_thresholds_are_rejected():
    @dataclass
    class Mutable:
        limit_ms: float = 1.0

    def make(**kw):
        return type("R", (Rule,), {"__doc__": DOC, "id": "ok-id", "layer": "app", **kw})

    with pytest.raises(TypeError, match="kebab-case"):
        validate_rule_class(make(id="Bad_Id"))
    with pytest.raises(TypeError, match="not a report-v1 layer"):
        validate_rule_class(make(layer="gpu"))
    with pytest.raises(TypeError, match="frozen dataclass"):
        validate_rule_class(make(Thresholds=Mutable))
    validate_rule_class(make())


class Exploding(Rule):
    __doc__ = DOC
    id = "exploding"
    layer = "app"

    def check(self, analysis):
        raise ZeroDivisionError("division by zero")


def test_a_crashing_rule_becomes_a_finding_and_the_report_still_renders():
    a = analysed(population(200, [("provider", 400)], [("db.pool", 3000), ("provider", 400)]))
    rules = [Exploding()] + [r() for r in discover_rules()]
    findings = run_rules(a, rules)
    crash = [f for f in findings if f.rule == "exploding"]
    assert len(crash) == 1 and crash[0].crashed
    assert "ZeroDivisionError" in crash[0].summary and crash[0].layer is None
    report = build_report(a, findings)
    assert report.verdict.layer == "db.pool" and report.verdict.rule == "db-pool-exhaustion"
    assert any("rule exploding crashed" in w for w in report.collection["warnings"])


def test_findings_are_sorted_by_impact_largest_first():
    a = analysed(population(200, [("db.query", 30), ("provider", 400)], [("db.pool", 3000), ("db.query", 900), ("provider", 400)]))
    findings = run_rules(a, [r() for r in discover_rules()])
    impacts = [f.impact_ms for f in findings]
    assert impacts == sorted(impacts, reverse=True)
    assert [f.rule for f in findings][:2] == ["db-pool-exhaustion", "slow-query"]
