"""`latprof check --junit FILE`: a check run as JUnit XML, in the Jenkins/Surefire dialect pytest's `--junitxml` writes."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from latprof.ci.checks import CheckResult, CheckRun, Location


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
