"""`latprof check --sarif FILE`: a check run as a SARIF 2.1.0 log, for GitHub code scanning."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import latprof
from latprof.report.renderers.check_common import pseudo_file, relative_to

if TYPE_CHECKING:
    from latprof.ci.checks import CheckResult, CheckRun

SARIF_SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
#: The key of SARIF `partialFingerprints`: code scanning matches alerts across runs by it.
FINGERPRINT_KEY = "latprof/v1"
#: The `uriBaseId` of locations under the working directory (the checkout, in CI).
SRCROOT = "SRCROOT"


def sarif_log(run: CheckRun, *, cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The run as a SARIF 2.1.0 log: every check a rule, every failed check a result.

    Paths under `cwd` (default: the working directory, the checkout in CI) are made relative
    to the `SRCROOT` base; others become absolute file URIs. A failed check that points at no
    code is located on the first input, because GitHub code scanning rejects results without
    a location.
    """
    base = Path(cwd if cwd is not None else os.getcwd()).resolve()
    rules: list[dict[str, Any]] = []
    rule_index: dict[str, int] = {}
    for result in run.results:
        if result.id not in rule_index:
            rule_index[result.id] = len(rules)
            rules.append(_sarif_rule(result))
    fallback = [_sarif_location(run.inputs[0], None, None, base)] if run.inputs else []
    results = []
    for result in run.results:
        if result.outcome != "fail":
            continue
        locations = [
            _sarif_location(loc.path, loc.line, loc.function, base) for loc in result.locations if not pseudo_file(loc.path)
        ]
        results.append(
            {
                "ruleId": result.id,
                "ruleIndex": rule_index[result.id],
                "level": "error" if result.level == "error" else "warning",
                "message": {"text": result.message or result.title},
                "partialFingerprints": {FINGERPRINT_KEY: result.fingerprint or result.id},
                "properties": {
                    "observed": result.observed,
                    "threshold": result.threshold,
                    "unit": result.unit,
                    "evidence": dict(result.evidence),
                    "layer": result.layer,
                },
                "locations": locations or fallback,
            }
        )
    return {
        "$schema": SARIF_SCHEMA_URI,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "latprof",
                        "version": latprof.__version__,
                        "rules": rules,
                    }
                },
                # SARIF requires a base's URI to end in "/" so relative URIs resolve under it.
                "originalUriBaseIds": {SRCROOT: {"uri": base.as_uri().rstrip("/") + "/"}},
                "invocations": [{"executionSuccessful": True, "exitCode": run.exit_code}],
                "results": results,
            }
        ],
    }


def sarif_text(run: CheckRun, *, cwd: str | os.PathLike[str] | None = None) -> str:
    """`sarif_log(run)` as the JSON text written to the file."""
    return json.dumps(sarif_log(run, cwd=cwd), indent=2, ensure_ascii=False, default=str) + "\n"


def _sarif_rule(result: CheckResult) -> dict[str, Any]:
    rule: dict[str, Any] = {
        "id": result.id,
        "name": _pascal_case(result.id) or result.title,
        "shortDescription": {"text": result.title},
        "fullDescription": {"text": result.description or result.title},
        "defaultConfiguration": {"level": "error" if result.level == "error" else "warning"},
        "properties": {"tags": [tag for tag in ("latency", result.kind, result.layer) if tag]},
    }
    if result.fix:
        rule["help"] = {"text": result.fix}
    return rule


def _pascal_case(check_id: str) -> str:
    """'rule.db-pool-exhaustion' → 'RuleDbPoolExhaustion' (SARIF's convention for rule names)."""
    return "".join(word[:1].upper() + word[1:] for word in re.split(r"[^0-9A-Za-z]+", check_id))


def _sarif_location(path: str, line: int | None, function: str | None, base: Path) -> dict[str, Any]:
    location: dict[str, Any] = {"physicalLocation": {"artifactLocation": _artifact(path, base)}}
    if line is not None and line >= 1:
        location["physicalLocation"]["region"] = {"startLine": line}
    if function:
        location["logicalLocations"] = [{"name": function, "kind": "function"}]
    return location


def _artifact(path: str, base: Path) -> dict[str, Any]:
    relative = relative_to(path, base)
    if relative is not None:
        return {"uri": quote(relative), "uriBaseId": SRCROOT}
    return {"uri": Path(path).absolute().as_uri()}
