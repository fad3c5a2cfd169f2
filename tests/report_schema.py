"""The report's JSON Schema (docs/report-v1.schema.json) as the tests check it: every field declared.

Not a test module: `from report_schema import ...` (tests/ is on sys.path, see tests/conftest.py).
The schema itself is open to fields added later, as report-v1 promises its readers; the tests
close each object it declares (`unevaluatedProperties: false`), so a field the code starts to
emit fails here until it is added to the schema (and to docs/report-v1.md).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Mapping

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "docs" / "report-v1.schema.json"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def closed(schema: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` with the root and every object in `$defs` that lists its properties closed to others."""
    out = copy.deepcopy(dict(schema))
    for node in [out, *out.get("$defs", {}).values()]:
        if "properties" in node:
            node.setdefault("unevaluatedProperties", False)
    return out


#: Compiled once for the session: the public schema, and the closed one the tests hold reports to.
VALIDATOR = Draft202012Validator(SCHEMA)
STRICT_VALIDATOR = Draft202012Validator(closed(SCHEMA))


def as_json(report: Mapping[str, Any]) -> Any:
    """The report as `latprof ... --format json` writes it (renderers/report_json.py) and a reader loads it."""
    return orjson.loads(orjson.dumps(report, option=orjson.OPT_NON_STR_KEYS))


def schema_errors(report: Mapping[str, Any], validator: Draft202012Validator = STRICT_VALIDATOR) -> list[str]:
    """Each way the report breaks the schema, as 'path: message' (empty when it validates)."""
    errors = sorted(validator.iter_errors(as_json(report)), key=lambda e: [str(p) for p in e.absolute_path])
    return list(dict.fromkeys(_describe(e) for e in errors))


def _describe(error: ValidationError) -> str:
    """'path: message', naming the deepest failure under an anyOf rather than 'not valid under any'."""
    while error.context:
        depth = max(len(e.absolute_path) for e in error.context)
        error = best_match([e for e in error.context if len(e.absolute_path) == depth])
    return f"{'/'.join(map(str, error.absolute_path)) or '(root)'}: {_short(error.message)}"


def _short(message: str, limit: int = 300) -> str:
    """A message that quotes a whole object is cut: the path already says which one."""
    return message if len(message) <= limit else message[: limit - 3] + "..."


def assert_valid(report: Mapping[str, Any]) -> None:
    """For the JSON a `latprof` subprocess printed: fail with each way it breaks the schema."""
    errors = schema_errors(report)
    assert not errors, "a report does not match docs/report-v1.schema.json:\n  " + "\n  ".join(errors)


def printed_report(stdout: object) -> dict | None:
    """The report-v1 JSON object a `latprof` command printed (alone, or after a service's own lines), or None."""
    text = stdout.decode("utf-8", "replace") if isinstance(stdout, bytes) else stdout
    if not isinstance(text, str) or '"latprof.report/1"' not in text:
        return None
    start = 0 if text.startswith("{") else text.find("\n{") + 1
    while start > 0 or text.startswith("{"):
        try:
            found = json.loads(text[start:])
        except ValueError:
            pass
        else:
            if isinstance(found, dict) and found.get("schema") == "latprof.report/1":
                return found
        following = text.find("\n{", start)
        if following < 0:
            return None
        start = following + 1
    return None
