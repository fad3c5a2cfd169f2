"""Wording the check renderers share: a check's status, the tally of a run, values in their units, paths."""

from __future__ import annotations

from pathlib import Path, PurePath
from typing import TYPE_CHECKING

from latprof.engine import fmt_ms

if TYPE_CHECKING:
    from latprof.ci.checks import CheckResult, CheckRun


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


def pseudo_file(path: str) -> bool:
    """Whether `path` names no file: frames of code with none ('<string>', '<frozen importlib._bootstrap>')."""
    return not path or (path.startswith("<") and path.endswith(">"))


def relative_to(path: str, base: Path) -> str | None:
    """`path` as a POSIX path relative to `base`, or None when it lies outside it."""
    pure = PurePath(path)
    if not pure.is_absolute():
        return pure.as_posix()
    try:
        return Path(path).resolve().relative_to(base).as_posix()
    except ValueError:
        return None
