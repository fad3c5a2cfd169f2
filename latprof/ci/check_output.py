"""Output formats for a `CheckRun`: text, JSON, markdown, JUnit XML, SARIF and GitHub Actions commands.

Everything here formats what `latprof.ci.checks` computed; nothing decides an outcome. The
text/json/markdown renderers are registered by name in `CHECK_FORMATS` (the value of
`latprof check --format`); JUnit and SARIF are written to files, atomically, so a CI step that
crashes half-way never leaves a torn report for the next step to choke on.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path, PurePath
from typing import Any, Mapping, TextIO
from urllib.parse import quote

import latprof
from latprof.ci.checks import CheckResult, CheckRun, Location
from latprof.engine import fmt_ms
from latprof.report.renderers import Formats

JSON_SCHEMA = "latprof.check/1"
SARIF_SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
#: The key of SARIF `partialFingerprints`: code scanning matches alerts across runs by it.
FINGERPRINT_KEY = "latprof/v1"
#: The `uriBaseId` of locations under the working directory (the checkout, in CI).
SRCROOT = "SRCROOT"

#: The formats `render` knows, by name.
CHECK_FORMATS: Formats[CheckRun] = Formats("check")
_register = CHECK_FORMATS.register


def render(run: CheckRun, fmt: str, out: TextIO) -> None:
    """Write `run` to `out` in the format named `fmt` (one of `CHECK_FORMATS`)."""
    CHECK_FORMATS.render(run, fmt, out)


# --- shared wording -------------------------------------------------------------------------


def status(result: CheckResult) -> str:
    """PASS, FAIL (gating), WARN (a warning-level failure) or SKIP."""
    if result.outcome == "skip":
        return "SKIP"
    if result.outcome == "fail":
        return "FAIL" if result.level == "error" else "WARN"
    return "PASS"


def tally(run: CheckRun) -> str:
    """'2 of 9 checks failed, 1 warning, 1 skipped', or 'all 9 checks passed'."""
    total = len(run.results)
    failed = len(run.failed)
    warnings = len(run.warnings)
    skipped = sum(1 for r in run.results if r.outcome == "skip")
    if total == 0:
        return "no checks ran"
    if not (failed or warnings or skipped):
        return f"all {total} checks passed" if total > 1 else "the 1 check passed"
    parts = [f"{failed} of {total} {_plural(total, 'check')} failed"]
    if warnings:
        parts.append(f"{warnings} {_plural(warnings, 'warning')}")
    if skipped:
        parts.append(f"{skipped} skipped")
    return ", ".join(parts)


def _plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"


def format_value(value: float | None, unit: str) -> str:
    """An observed value or threshold in its unit: '3.4 s', '42.5%', '12', '—' when there is none."""
    if value is None:
        return "—"
    if unit == "ms":
        return fmt_ms(value)
    if unit == "share":
        return f"{value * 100:.3g}%"
    if unit == "%":
        return f"{value:.3g}%"
    if unit in ("", "count"):
        return f"{value:g}"
    return f"{value:g} {unit}"


# --- text, json, markdown -------------------------------------------------------------------


@_register("text")
def render_text(run: CheckRun, out: TextIO) -> None:
    """The verdict, one line per check, then the tally."""
    out.write(f"verdict: {run.report.verdict.summary}\n")
    for warning in run.report.collection.get("warnings") or ():  # a torn capture, dropped events: what the checks saw
        out.write(f"warning: {warning}\n")
    width = min(40, max((len(r.title) for r in run.results), default=0))
    for result in run.results:
        # Messages are one sentence, but a custom rule's may not be: keep one line per check.
        message = " ".join(result.message.split())
        out.write(f"{status(result)}  {result.title.ljust(width)}  {message}".rstrip() + "\n")
    out.write(tally(run) + "\n")


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


@_register("json")
def render_json(run: CheckRun, out: TextIO) -> None:
    # default=str: evidence comes from rules and config, and may hold a value JSON has no type for.
    out.write(json.dumps(to_dict(run), indent=2, ensure_ascii=False, default=str))
    out.write("\n")


_MARKDOWN_MARKS = {"PASS": "✅", "FAIL": "❌", "WARN": "⚠️", "SKIP": "⏭️"}


@_register("markdown")
def render_markdown(run: CheckRun, out: TextIO) -> None:
    out.write(to_markdown(run))


def to_markdown(run: CheckRun) -> str:
    """A heading, the verdict, a table of the checks and the tally (also the GitHub step summary)."""
    lines = [
        f"## latprof check: {'failed' if run.failed else 'passed'}",
        "",
        f"**Verdict:** {_md_cell(run.report.verdict.summary)}",
        "",
    ]
    warnings = run.report.collection.get("warnings") or []
    if warnings:
        lines += [f"> warning: {_md_cell(w)}" for w in warnings] + [""]
    if run.results:
        lines += ["| | check | observed | threshold | message |", "|---|---|---|---|---|"]
        for r in run.results:
            cells = [
                _MARKDOWN_MARKS[status(r)],
                _md_cell(r.title),
                _md_cell(format_value(r.observed, r.unit)),
                _md_cell(format_value(r.threshold, r.unit)),
                _md_cell(r.message),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines.append(tally(run))
    return "\n".join(lines) + "\n"


def _md_cell(text: str) -> str:
    # `|` would end the cell and a newline the row; `<`/`&` would be taken as HTML by GitHub.
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = text.replace("\\", "\\\\").replace("|", "\\|")
    return "<br>".join(line.strip() for line in text.splitlines())


# --- JUnit XML ------------------------------------------------------------------------------

# Characters XML 1.0 cannot hold even escaped; ElementTree would write them and break the file.
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(text: str) -> str:
    return _XML_ILLEGAL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def junit_xml(run: CheckRun, *, timestamp: datetime | None = None) -> bytes:
    """The run as JUnit XML in the Jenkins/Surefire dialect pytest's `--junitxml` writes."""
    when = (timestamp or datetime.now(timezone.utc)).isoformat(timespec="seconds")
    root = ET.Element("testsuites", name="latprof")
    suite = ET.SubElement(
        root,
        "testsuite",
        name="latprof",
        tests=str(len(run.results)),
        failures=str(len(run.failed)),
        errors="0",
        skipped=str(sum(1 for r in run.results if r.outcome == "skip")),
        time="0",
        timestamp=when,
    )
    properties = ET.SubElement(suite, "properties")
    for path in run.inputs:
        ET.SubElement(properties, "property", name="input", value=_xml_text(path))
    for name, value in (("config", run.config_path), ("baseline", run.baseline)):
        if value is not None:
            ET.SubElement(properties, "property", name=name, value=_xml_text(value))
    verdict = run.report.verdict
    ET.SubElement(properties, "property", name="verdict.layer", value=_xml_text(verdict.layer or ""))
    ET.SubElement(properties, "property", name="verdict.summary", value=_xml_text(verdict.summary))
    for result in run.results:
        case = ET.SubElement(
            suite, "testcase", classname=f"latprof.{result.kind}", name=_xml_text(result.title), time="0"
        )
        if result.failed:
            failure = ET.SubElement(case, "failure", message=_xml_text(result.message), type=_xml_text(result.id))
            failure.text = _xml_text(failure_text(result))
        elif result.outcome == "skip":
            ET.SubElement(case, "skipped", message=_xml_text(result.message))
        elif result.outcome == "fail":  # warning level: reported, but the test case passes
            out = ET.SubElement(case, "system-out")
            out.text = _xml_text(f"warning: {result.message}")
    ET.indent(root)
    xml: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return xml + b"\n"


def write_junit(run: CheckRun, path: str | os.PathLike[str], *, timestamp: datetime | None = None) -> None:
    """Write `junit_xml(run)` to `path`, atomically."""
    _write_atomically(path, junit_xml(run, timestamp=timestamp))


def failure_text(result: CheckResult) -> str:
    """The message, the evidence one `key: value` a line, where it points and how to fix it."""
    parts = [result.message]
    if result.evidence:
        parts.append("\n".join(f"{key}: {_scalar_or_json(value)}" for key, value in result.evidence.items()))
    if result.locations:
        parts.append("\n".join(f"at {_location_text(loc)}" for loc in result.locations))
    if result.fix:
        parts.append(f"fix: {result.fix}")
    return "\n\n".join(parts)


def _scalar_or_json(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value, ensure_ascii=False, default=str)  # true/null, lists, dicts


def _location_text(loc: Location) -> str:
    where = loc.path if loc.line is None else f"{loc.path}:{loc.line}"
    return where if loc.function is None else f"{where} in {loc.function}"


# --- SARIF 2.1.0 ----------------------------------------------------------------------------


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
            _sarif_location(loc.path, loc.line, loc.function, base) for loc in result.locations if not _pseudo_file(loc.path)
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


def write_sarif(run: CheckRun, path: str | os.PathLike[str], *, cwd: str | os.PathLike[str] | None = None) -> None:
    """Write `sarif_log(run)` to `path`, atomically."""
    text = json.dumps(sarif_log(run, cwd=cwd), indent=2, ensure_ascii=False, default=str)
    _write_atomically(path, (text + "\n").encode("utf-8"))


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


def _pseudo_file(path: str) -> bool:
    # Frames of code with no file ('<string>', '<frozen importlib._bootstrap>') name no artifact.
    return not path or (path.startswith("<") and path.endswith(">"))


def _sarif_location(path: str, line: int | None, function: str | None, base: Path) -> dict[str, Any]:
    location: dict[str, Any] = {"physicalLocation": {"artifactLocation": _artifact(path, base)}}
    if line is not None and line >= 1:
        location["physicalLocation"]["region"] = {"startLine": line}
    if function:
        location["logicalLocations"] = [{"name": function, "kind": "function"}]
    return location


def _artifact(path: str, base: Path) -> dict[str, Any]:
    relative = _relative_to(path, base)
    if relative is not None:
        return {"uri": quote(relative), "uriBaseId": SRCROOT}
    return {"uri": Path(path).absolute().as_uri()}


def _relative_to(path: str, base: Path) -> str | None:
    """`path` as a POSIX path relative to `base`, or None when it lies outside it."""
    pure = PurePath(path)
    if not pure.is_absolute():
        return pure.as_posix()
    try:
        return Path(path).resolve().relative_to(base).as_posix()
    except ValueError:
        return None


# --- GitHub Actions -------------------------------------------------------------------------


def github_annotations(run: CheckRun, *, cwd: str | os.PathLike[str] | None = None) -> list[str]:
    """`::error` / `::warning` workflow commands for the failed checks, at their first location."""
    base = Path(cwd if cwd is not None else os.getcwd()).resolve()
    lines = []
    for result in run.results:
        if result.outcome != "fail":
            continue
        command = "error" if result.level == "error" else "warning"
        properties: list[tuple[str, str]] = []
        located = [loc for loc in result.locations if not _pseudo_file(loc.path)]
        if located:
            loc = located[0]
            # GitHub resolves `file` against the checkout; an outside path stays absolute.
            properties.append(("file", _relative_to(loc.path, base) or str(Path(loc.path).absolute())))
            if loc.line is not None and loc.line >= 1:
                properties.append(("line", str(loc.line)))
        properties.append(("title", result.title))
        props = ",".join(f"{key}={_escape_property(value)}" for key, value in properties)
        lines.append(f"::{command} {props}::{_escape_data(result.message)}")
    return lines


def _escape_data(text: str) -> str:
    # The escaping of @actions/core's `escapeData`: the runner turns these back.
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_step_summary(run: CheckRun) -> str:
    """The markdown for `$GITHUB_STEP_SUMMARY`."""
    return to_markdown(run)


def emit_github(run: CheckRun, out: TextIO, env: Mapping[str, str]) -> list[str]:
    """Under GitHub Actions, write the annotations to `out` and append the step summary.

    Does nothing unless `env["GITHUB_ACTIONS"] == "true"`. Returns warnings for the caller to
    print: a summary file that cannot be written must not fail a check that passed.
    """
    if env.get("GITHUB_ACTIONS") != "true":
        return []
    for line in github_annotations(run):
        out.write(line + "\n")
    summary_path = env.get("GITHUB_STEP_SUMMARY")
    if not summary_path:
        return []
    try:
        # Append: other steps' tools (and earlier checks in this step) write to the same file.
        with open(summary_path, "a", encoding="utf-8") as summary:
            summary.write(github_step_summary(run) + "\n")
    except OSError as exc:
        return [f"could not append the check summary to $GITHUB_STEP_SUMMARY ({summary_path}): {exc.strerror or exc}"]
    return []


# --- files ----------------------------------------------------------------------------------


def _write_atomically(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, then rename it over `path`.

    A reader (or the next CI step) sees the old file or the whole new one, never a torn one.
    The temporary file is created with mode 0o666 so the umask applies as for a plain open().
    """
    target = Path(path)
    temp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise

