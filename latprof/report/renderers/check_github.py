"""Under GitHub Actions: a check run's failures as `::error` / `::warning` workflow commands."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from latprof.report.renderers.check_common import pseudo_file, relative_to

if TYPE_CHECKING:
    from latprof.ci.checks import CheckRun


def workflow_commands(run: CheckRun, *, cwd: str | os.PathLike[str] | None = None) -> list[str]:
    """`::error` / `::warning` workflow commands for the failed checks, at their first location."""
    base = Path(cwd if cwd is not None else os.getcwd()).resolve()
    lines = []
    for result in run.results:
        if result.outcome != "fail":
            continue
        command = "error" if result.level == "error" else "warning"
        properties: list[tuple[str, str]] = []
        located = [loc for loc in result.locations if not pseudo_file(loc.path)]
        if located:
            loc = located[0]
            # GitHub resolves `file` against the checkout; an outside path stays absolute.
            properties.append(("file", relative_to(loc.path, base) or str(Path(loc.path).absolute())))
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
