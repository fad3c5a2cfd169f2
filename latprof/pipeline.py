"""From capture files to a finished report: read, build the timeline, analyse, run the rules, report."""

from __future__ import annotations

import contextlib
import gc
import os
from typing import Iterable, Iterator, Sequence

from latprof.analysis import DEFAULT_WARMUP_S, analyze
from latprof.capture.reader import read_captures
from latprof.engine import Rule, discover_rules, run_rules
from latprof.report import Report, build_report
from latprof.timeline import build_timeline


def default_rules() -> list[Rule]:
    """An instance of every built-in rule with its default thresholds."""
    return [rule_class() for rule_class in discover_rules()]


def diagnose(
    paths: Iterable[str | os.PathLike[str]],
    *,
    warmup_s: float = DEFAULT_WARMUP_S,
    rules: Sequence[Rule] | None = None,
) -> Report:
    """Diagnose the captures at `paths` and return the report."""
    with _gc_paused():
        timeline = build_timeline(read_captures(paths))
        analysis = analyze(timeline, warmup_s=warmup_s)
        findings = run_rules(analysis, default_rules() if rules is None else rules)
        return build_report(analysis, findings)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: events hold no cycles, and a million new objects
    would otherwise trigger full collections over all of them again and again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
