"""`latprof check --format json`: the latprof.check/1 document."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TextIO

from latprof.report.renderers import CHECK

if TYPE_CHECKING:
    from latprof.ci.checks import CheckResult, CheckRun

JSON_SCHEMA = "latprof.check/1"


def to_dict(run: CheckRun) -> dict[str, Any]:
    """The latprof.check/1 JSON shape."""
    return {
        "schema": JSON_SCHEMA,
        "passed": not run.failed,
        "exit_code": run.exit_code,
        "inputs": list(run.inputs),
        "config": run.config_path,
        "baseline": run.baseline,
        "summary": {
            "checks": len(run.results),
            "failed": len(run.failed),
            "warnings": len(run.warnings),
            "skipped": sum(1 for r in run.results if r.outcome == "skip"),
        },
        "checks": [result_to_dict(r) for r in run.results],
        "verdict": run.report.verdict.to_dict(),
    }


def result_to_dict(result: CheckResult) -> dict[str, Any]:
    """Every field of a `CheckResult`, plus whether it gates (`failed`)."""
    return {
        "id": result.id,
        "kind": result.kind,
        "title": result.title,
        "outcome": result.outcome,
        "level": result.level,
        "failed": result.failed,
        "message": result.message,
        "observed": result.observed,
        "threshold": result.threshold,
        "unit": result.unit,
        "evidence": dict(result.evidence),
        "fix": result.fix,
        "rule": result.rule,
        "layer": result.layer,
        "fingerprint": result.fingerprint,
        "locations": [{"path": loc.path, "line": loc.line, "function": loc.function} for loc in result.locations],
        "description": result.description,
    }


@CHECK.register("json")
def render_json(run: CheckRun, out: TextIO) -> None:
    # default=str: evidence comes from rules and config, and may hold a value JSON has no type for.
    out.write(json.dumps(to_dict(run), indent=2, ensure_ascii=False, default=str))
    out.write("\n")
