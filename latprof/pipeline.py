"""From capture files to a finished report: read, build the timeline, analyse, run the rules, report."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Sequence

from latprof.analysis.requests import DEFAULT_WARMUP_S, Analysis, analyze
from latprof.capture.files import gc_paused
from latprof.capture.format import SOURCE_KINDS, TRACE_SOURCES
from latprof.capture.reader import read_captures
from latprof.ci.config import Config
from latprof.engine import Finding, Rule, all_rules, configured, run_rules
from latprof.analysis.inference import infer_pool_waits, infer_queueing
from latprof.report.model import Report, build_report
from latprof.analysis.timeline import build_timeline


def default_rules() -> list[Rule]:
    """An instance of every rule (built-in and from entry points) with its default thresholds."""
    return [rule_class() for rule_class in all_rules()]


@dataclass(frozen=True)
class Diagnosis:
    """A finished diagnosis with what it was made from: the analysis and the rules' findings.

    `analysis` is None for an attach capture (stack samples, no requests: `latprof.attach.analysis`).
    """

    analysis: Analysis | None
    findings: list[Finding]
    report: Report


def run_diagnosis(
    paths: Iterable[str | os.PathLike[str]],
    *,
    warmup_s: float = DEFAULT_WARMUP_S,
    rules: Sequence[Rule] | None = None,
    source_kind: str | None = None,
) -> Diagnosis:
    """Read the captures (or trace files) at `paths`, analyse them and run the rules.

    `source_kind` (one of report-v1's `source.kind`s) says how the data was collected when the
    files cannot: `latprof receive` passes "receive" for the OTLP file it wrote, which read
    alone is "otlp". By default the files' headers (or trace format) decide.
    """
    if source_kind is not None and source_kind not in SOURCE_KINDS:
        raise ValueError(f"source_kind must be one of {SOURCE_KINDS}, not {source_kind!r}")
    with gc_paused(freeze=True):
        timeline = build_timeline(read_captures(paths))
        if source_kind is not None:
            timeline.source_kind = source_kind
        if timeline.source_kind == "attach" and not timeline.requests:
            from latprof.attach.analysis import analyze_attach, attach_findings, build_attach_report

            attach = analyze_attach(timeline)
            attach_found = attach_findings(attach)
            return Diagnosis(None, attach_found, build_attach_report(attach, attach_found))
        if timeline.source_kind in TRACE_SOURCES:
            timeline = infer_queueing(infer_pool_waits(timeline))
        analysis = analyze(timeline, warmup_s=warmup_s)
        findings = run_rules(analysis, default_rules() if rules is None else rules)
        return Diagnosis(analysis, findings, build_report(analysis, findings))


def run_configured(
    paths: Iterable[str | os.PathLike[str]],
    config: Config,
    rule_classes: Sequence[type[Rule]],
    *,
    warmup_s: float | None = None,
) -> Diagnosis:
    """`run_diagnosis` as the config says: its enabled rules with their thresholds, and its
    `skip_warmup_s` unless `warmup_s` is given (else the default)."""
    if warmup_s is None:
        warmup_s = config.skip_warmup_s if config.skip_warmup_s is not None else DEFAULT_WARMUP_S
    return run_diagnosis(paths, warmup_s=warmup_s, rules=configured(rule_classes, config.rules))


def diagnose(
    paths: Iterable[str | os.PathLike[str]],
    *,
    warmup_s: float = DEFAULT_WARMUP_S,
    rules: Sequence[Rule] | None = None,
) -> Report:
    """Diagnose the captures at `paths` and return the report."""
    return run_diagnosis(paths, warmup_s=warmup_s, rules=rules).report
