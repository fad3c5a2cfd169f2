"""Where a check run's results go besides stdout: JUnit XML and SARIF files, and GitHub Actions.

The formats themselves are renderers (`latprof.report.renderers`: `check_junit`, `check_sarif`,
`check_github`, and the `--format` ones registered on `renderers.CHECK`); this module only
writes them. Files are written atomically, so a CI step that crashes half-way never leaves a
torn report for the next step to choke on.
"""

from __future__ import annotations

import os
import secrets
from datetime import datetime
from pathlib import Path
from typing import Mapping, TextIO

from latprof.ci.checks import CheckRun
from latprof.report.renderers.check_github import workflow_commands
from latprof.report.renderers.check_junit import junit_xml
from latprof.report.renderers.check_markdown import to_markdown
from latprof.report.renderers.check_sarif import sarif_text

__all__ = ["emit_github", "write_junit", "write_sarif"]


def write_junit(run: CheckRun, path: str | os.PathLike[str], *, timestamp: datetime | None = None) -> None:
    """Write `junit_xml(run)` to `path`, atomically."""
    _write_atomically(path, junit_xml(run, timestamp=timestamp))


def write_sarif(run: CheckRun, path: str | os.PathLike[str], *, cwd: str | os.PathLike[str] | None = None) -> None:
    """Write `sarif_log(run)` to `path`, atomically."""
    _write_atomically(path, sarif_text(run, cwd=cwd).encode("utf-8"))


def emit_github(run: CheckRun, out: TextIO, env: Mapping[str, str]) -> list[str]:
    """Under GitHub Actions, write the annotations to `out` and append the step summary.

    Does nothing unless `env["GITHUB_ACTIONS"] == "true"`. Returns warnings for the caller to
    print: a summary file that cannot be written must not fail a check that passed.
    """
    if env.get("GITHUB_ACTIONS") != "true":
        return []
    for line in workflow_commands(run):
        out.write(line + "\n")
    summary_path = env.get("GITHUB_STEP_SUMMARY")
    if not summary_path:
        return []
    try:
        # Append: other steps' tools (and earlier checks in this step) write to the same file.
        with open(summary_path, "a", encoding="utf-8") as summary:
            summary.write(to_markdown(run) + "\n")
    except OSError as exc:
        return [f"could not append the check summary to $GITHUB_STEP_SUMMARY ({summary_path}): {exc.strerror or exc}"]
    return []


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
