"""Compare two diagnoses: latency, each layer's time in the tail, the verdict and the findings, before → after.

`diff_reports` is the pure step: two `Report`s (and, when they came from captures, each
layer's mean time in the slowest 1%) in, one `Diff` out. `load` turns a path into what it
needs: a capture or trace file is diagnosed by `latprof.pipeline.run_diagnosis`, a saved
report (`latprof analyze --format json`, schema `latprof.report/1`) is read back as it is.
Its formats (`text`, `json`, `markdown`) are renderers, registered on `latprof.report.renderers.DIFF`.

The `json` format, schema `latprof.diff/1` (add fields freely, never rename one without
bumping it)::

    {
      "schema": "latprof.diff/1",
      "summary": "p99 +464 ms (+266%, 174 ms → 639 ms): db.pool +410 ms ... in the slowest 1%; ...",
      "material": true,
      "before": {"input": "healthy.jsonl", "source": {<report source>}, "requests": 93,
                 "latency_ms": {"p50": .., "p90": .., "p99": .., "max": ..} | null,
                 "verdict": {"layer": .. | null, "rule": .. | null, "status": "layer|unattributed|no_tail|too_few_requests|not_saturated|at_capacity",
                             "summary": ".."}},
      "after": {... the same ...},
      "latency_ms": {"p50": CHANGE, "p90": CHANGE, "p99": CHANGE},
      "tail_metric": "tail_mean_ms" | "tail_excess_ms",
      "layers": [{"layer": "db.pool", "p50_ms": CHANGE, "p99_ms": CHANGE, "mean_ms": CHANGE,
                  "share_of_tail_excess": CHANGE, "tail_ms": CHANGE}, ...],
      "verdict": {"before": .. | null, "after": .. | null, "before_status": .., "after_status": .., "changed": bool},
      "findings": {"appeared": [FINDING], "disappeared": [FINDING], "unchanged": [FINDING]},
      "regression": {"p99_pct": float | null, "threshold_pct": float | null, "failed": bool}
    }

    CHANGE  = {"before": float | null, "after": float | null, "delta": float | null, "pct": float | null}
    FINDING = {"rule": .., "layer": .. | null, "summary": .., "fingerprint": .., "impact_ms": ..}

`layers` is the union of both reports' layer rows, the largest change of tail time first; a
layer a report did not list has null `p50_ms`/`p99_ms`/`mean_ms`/`share_of_tail_excess` on that
side and 0 tail time (it had no time). `tail_ms` is the layer's mean time in the slowest 1% of
requests (`tail_metric` "tail_mean_ms"); when a side was read from a saved report, which does
not carry that mean, both sides use the layer's tail excess over the median instead
("tail_excess_ms"). `pct` is null when `before` is 0 or either side is null. Findings are
matched by `fingerprint`; an unchanged finding is given as AFTER has it.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import orjson

from latprof.analysis.cohort_first import DEFAULT_SAMPLE_REQUESTS
from latprof.analysis.requests import DEFAULT_WARMUP_S, Analysis
from latprof.engine import Finding, fmt_ms
from latprof.capture.reader import Input
from latprof.collectors.traces.clickhouse import ClickHouseSource
from latprof.errors import InputError
from latprof.layers import LAYERS
from latprof.report.model import SCHEMA as REPORT_SCHEMA
from latprof.report.model import LayerRow, Report, WindowRow
from latprof.report.verdict import Verdict

if TYPE_CHECKING:
    from latprof.pipeline import Diagnosis

SCHEMA = "latprof.diff/1"
#: A p99 change within this many percent, with no finding appearing or disappearing, is no material change.
MATERIAL_P99_PCT = 5.0
#: The summary names at most this many layers whose tail time changed ...
MAX_NAMED_LAYERS = 3
#: ... each of them by at least this share of the p99 change ...
MIN_NAMED_SHARE_OF_P99_CHANGE = 0.05
#: ... and by at least this many milliseconds.
MIN_NAMED_CHANGE_MS = 1.0
#: Tail metrics a `Diff` may hold (see the module docstring).
TAIL_MEAN = "tail_mean_ms"
TAIL_EXCESS = "tail_excess_ms"

# How much of a file is read to tell a saved report from a capture or trace file.
_SNIFF_BYTES = 64 * 1024
_VERDICT_LABELS = {"no_tail": "no tail", "too_few_requests": "no verdict", "not_saturated": "not saturated",
                   "at_capacity": "at capacity"}


# --- the diff ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Change:
    """One number before and after; `None` where a side does not have it."""

    before: float | None
    after: float | None

    @property
    def delta(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        return self.after - self.before

    @property
    def pct(self) -> float | None:
        """The change in percent of `before`; None when `before` is 0 or a side is missing."""
        delta = self.delta
        if delta is None or not self.before:
            return None
        return 100.0 * delta / self.before

    def to_dict(self) -> dict[str, float | None]:
        delta, pct = self.delta, self.pct
        return {
            "before": self.before,
            "after": self.after,
            "delta": None if delta is None else round(delta, 3),
            "pct": None if pct is None else round(pct, 2),
        }


@dataclass(frozen=True, slots=True)
class LayerChange:
    """One layer of either report, before → after. `tail_ms` is its time in the tail (`Diff.tail_metric`)."""

    layer: str
    p50_ms: Change
    p99_ms: Change
    mean_ms: Change
    share_of_tail_excess: Change
    tail_ms: Change

    @property
    def tail_delta_ms(self) -> float:
        return self.tail_ms.delta or 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "p50_ms": self.p50_ms.to_dict(),
            "p99_ms": self.p99_ms.to_dict(),
            "mean_ms": self.mean_ms.to_dict(),
            "share_of_tail_excess": self.share_of_tail_excess.to_dict(),
            "tail_ms": self.tail_ms.to_dict(),
        }


@dataclass(frozen=True, slots=True)
class FindingRef:
    """What a diff says about a finding: which rule, where, its sentence and its fingerprint."""

    rule: str
    layer: str | None
    summary: str
    fingerprint: str
    impact_ms: float

    @classmethod
    def of(cls, finding: Finding) -> FindingRef:
        return cls(finding.rule, finding.layer, finding.summary, finding.fingerprint, finding.impact_ms)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "layer": self.layer,
            "summary": self.summary,
            "fingerprint": self.fingerprint,
            "impact_ms": self.impact_ms,
        }


@dataclass(frozen=True, slots=True)
class FindingChanges:
    """Findings matched by fingerprint: only in AFTER, only in BEFORE, in both (as AFTER has them)."""

    appeared: list[FindingRef] = field(default_factory=list)
    disappeared: list[FindingRef] = field(default_factory=list)
    unchanged: list[FindingRef] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.appeared or self.disappeared)

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        return {
            "appeared": [f.to_dict() for f in self.appeared],
            "disappeared": [f.to_dict() for f in self.disappeared],
            "unchanged": [f.to_dict() for f in self.unchanged],
        }


@dataclass(frozen=True, slots=True)
class Regression:
    """AFTER's p99 against BEFORE's, and against `--fail-on-regression` when one was given."""

    p99_pct: float | None
    threshold_pct: float | None = None

    @property
    def failed(self) -> bool:
        return self.threshold_pct is not None and self.p99_pct is not None and self.p99_pct > self.threshold_pct

    def to_dict(self) -> dict[str, Any]:
        return {
            "p99_pct": None if self.p99_pct is None else round(self.p99_pct, 2),
            "threshold_pct": self.threshold_pct,
            "failed": self.failed,
        }


@dataclass(frozen=True)
class Diff:
    """Two diagnoses compared. Renderers format it; they compute nothing."""

    before: Report
    after: Report
    #: What the user named for each side (a path), for headers.
    before_input: str
    after_input: str
    latency_ms: dict[str, Change]
    #: Every layer of either report, the largest absolute change of tail time first.
    layers: list[LayerChange]
    tail_metric: str
    findings: FindingChanges
    material: bool
    summary: str
    regression: Regression

    @property
    def verdict_changed(self) -> bool:
        return verdict_label(self.before.verdict) != verdict_label(self.after.verdict)

    def with_threshold(self, threshold_pct: float | None) -> Diff:
        """This diff checked against `--fail-on-regression threshold_pct` (None: not checked)."""
        return replace(self, regression=Regression(self.regression.p99_pct, threshold_pct))

    def to_dict(self) -> dict[str, Any]:
        """The `latprof.diff/1` JSON shape (the module docstring documents it)."""
        return {
            "schema": SCHEMA,
            "summary": self.summary,
            "material": self.material,
            "before": _side_dict(self.before, self.before_input),
            "after": _side_dict(self.after, self.after_input),
            "latency_ms": {name: change.to_dict() for name, change in self.latency_ms.items()},
            "tail_metric": self.tail_metric,
            "layers": [row.to_dict() for row in self.layers],
            "verdict": {
                "before": self.before.verdict.layer,
                "after": self.after.verdict.layer,
                "before_status": self.before.verdict.status,
                "after_status": self.after.verdict.status,
                "changed": self.verdict_changed,
            },
            "findings": self.findings.to_dict(),
            "regression": self.regression.to_dict(),
        }


def _side_dict(report: Report, label: str) -> dict[str, Any]:
    verdict = report.verdict
    return {
        "input": label,
        "source": report.source,
        "requests": report.window.get("requests"),
        "latency_ms": report.latency_ms,
        "verdict": {"layer": verdict.layer, "rule": verdict.rule, "status": verdict.status, "summary": verdict.summary},
    }


def tail_means(analysis: Analysis | None) -> dict[str, float] | None:
    """Each layer's mean time in the slowest 1% of requests (`LayerStats.tail_mean_ms`), or None without an analysis."""
    if analysis is None:
        return None
    return {name: stats.tail_mean_ms for name, stats in analysis.layers.items()}


def diff_reports(
    before: Report,
    after: Report,
    *,
    before_tail_ms: Mapping[str, float] | None = None,
    after_tail_ms: Mapping[str, float] | None = None,
    before_input: str | None = None,
    after_input: str | None = None,
    threshold_pct: float | None = None,
) -> Diff:
    """Compare two reports.

    - latency p50/p90/p99 before → after (a side without latency gives None changes);
    - every layer either report lists, before → after: p50, p99, mean, share of tail excess and
      its time in the tail. That time is the layer's mean in the slowest 1% when both
      `*_tail_ms` are given (`tail_means` of each analysis), else its `tail_excess_ms` on both
      sides; a layer missing from a report had 0 ms there. Sorted by the absolute change of
      tail time, largest first (vocabulary order on ties);
    - findings matched by `Finding.fingerprint`: appeared, disappeared, unchanged;
    - `material` is False when p99 moved by at most `MATERIAL_P99_PCT` percent (both sides
      have one) and no finding appeared or disappeared;
    - `summary` is one sentence on all of it (`summarize`);
    - `regression` holds AFTER's p99 change in percent and `threshold_pct`.
    `*_input` label the sides (default: the report's inputs).
    """
    latency = {name: Change(_latency(before, name), _latency(after, name)) for name in ("p50", "p90", "p99")}
    use_means = before_tail_ms is not None and after_tail_ms is not None
    before_rows = {row.layer: row for row in before.layers}
    after_rows = {row.layer: row for row in after.layers}
    names = set(before_rows) | set(after_rows)
    if before_tail_ms is not None and after_tail_ms is not None:
        # a layer with tail time but no row (not seen on average) still moved the tail
        names |= {n for n, v in before_tail_ms.items() if v} | {n for n, v in after_tail_ms.items() if v}

    def tail(rows: Mapping[str, LayerRow], means: Mapping[str, float] | None, name: str) -> float:
        if use_means:
            return float(means.get(name, 0.0)) if means is not None else 0.0
        row = rows.get(name)
        return 0.0 if row is None else row.tail_excess_ms

    layers = [
        LayerChange(
            layer=name,
            p50_ms=Change(_field(before_rows, name, "p50_ms"), _field(after_rows, name, "p50_ms")),
            p99_ms=Change(_field(before_rows, name, "p99_ms"), _field(after_rows, name, "p99_ms")),
            mean_ms=Change(_field(before_rows, name, "mean_ms"), _field(after_rows, name, "mean_ms")),
            share_of_tail_excess=Change(
                _field(before_rows, name, "share_of_tail_excess"), _field(after_rows, name, "share_of_tail_excess")
            ),
            tail_ms=Change(tail(before_rows, before_tail_ms, name), tail(after_rows, after_tail_ms, name)),
        )
        for name in names
    ]
    order = {layer: i for i, layer in enumerate(LAYERS)}
    layers.sort(key=lambda c: (-abs(c.tail_delta_ms), order.get(c.layer, len(order)), c.layer))
    findings = match_findings(before.findings, after.findings)
    p99 = latency["p99"]
    p99_pct = p99.pct
    material = findings.changed or p99_pct is None or abs(p99_pct) > MATERIAL_P99_PCT
    if p99.before is None and p99.after is None:
        material = findings.changed  # nothing to compare on either side: only findings can say something changed
    tail_metric = TAIL_MEAN if use_means else TAIL_EXCESS
    summary = summarize(latency, layers, tail_metric, before.verdict, after.verdict, findings, material=material)
    return Diff(
        before=before,
        after=after,
        before_input=before_input if before_input is not None else _inputs(before),
        after_input=after_input if after_input is not None else _inputs(after),
        latency_ms=latency,
        layers=layers,
        tail_metric=tail_metric,
        findings=findings,
        material=material,
        summary=summary,
        regression=Regression(p99_pct, threshold_pct),
    )


def match_findings(before: Iterable[Finding], after: Iterable[Finding]) -> FindingChanges:
    """Match findings by fingerprint, each list in its report's order (largest impact first)."""
    before_refs = _unique(FindingRef.of(f) for f in before)
    after_refs = _unique(FindingRef.of(f) for f in after)
    before_prints = {f.fingerprint for f in before_refs}
    after_prints = {f.fingerprint for f in after_refs}
    return FindingChanges(
        appeared=[f for f in after_refs if f.fingerprint not in before_prints],
        disappeared=[f for f in before_refs if f.fingerprint not in after_prints],
        unchanged=[f for f in after_refs if f.fingerprint in before_prints],
    )


def _unique(refs: Iterable[FindingRef]) -> list[FindingRef]:
    seen: dict[str, FindingRef] = {}
    for ref in refs:
        seen.setdefault(ref.fingerprint, ref)
    return list(seen.values())


def _latency(report: Report, name: str) -> float | None:
    value = (report.latency_ms or {}).get(name)
    return float(value) if isinstance(value, (int, float)) else None


def _field(rows: Mapping[str, LayerRow], name: str, attr: str) -> float | None:
    row = rows.get(name)
    value = None if row is None else getattr(row, attr)
    return None if value is None else float(value)


def _inputs(report: Report) -> str:
    return ", ".join(str(i) for i in report.source.get("inputs") or []) or "-"


# --- the sentence -----------------------------------------------------------------------------


def signed_ms(ms: float) -> str:
    """`+410 ms`, `-0.4 s`, `+2.3 s`: `fmt_ms` with the sign always shown."""
    return ("-" if ms < 0 else "+") + fmt_ms(abs(ms))


def signed_pct(pct: float) -> str:
    """`+266%`, `-12%`, `+1.2%`: whole percent from 10% on."""
    return f"{pct:+.0f}%" if abs(pct) >= 10 else f"{pct:+.1f}%"


def verdict_label(verdict: Verdict) -> str:
    """The verdict's layer, or what its status says when it names none ("no tail", "no verdict")."""
    if verdict.layer is not None:
        return verdict.layer
    return _VERDICT_LABELS.get(verdict.status, "none")


def named_layers(layers: Iterable[LayerChange], p99_delta_ms: float | None) -> list[LayerChange]:
    """The layers the summary names: the largest absolute changes of tail time, at most
    `MAX_NAMED_LAYERS`, each at least `MIN_NAMED_CHANGE_MS` and `MIN_NAMED_SHARE_OF_P99_CHANGE`
    of the p99 change (when it is known)."""
    floor = MIN_NAMED_CHANGE_MS
    if p99_delta_ms is not None:
        floor = max(floor, MIN_NAMED_SHARE_OF_P99_CHANGE * abs(p99_delta_ms))
    ranked = sorted(layers, key=lambda c: -abs(c.tail_delta_ms))
    return [c for c in ranked if abs(c.tail_delta_ms) >= floor][:MAX_NAMED_LAYERS]


def summarize(
    latency: Mapping[str, Change],
    layers: Iterable[LayerChange],
    tail_metric: str,
    before: Verdict,
    after: Verdict,
    findings: FindingChanges,
    *,
    material: bool,
) -> str:
    """One sentence on what changed, e.g. "p99 +1.9 s (+238%, 0.8 s → 2.7 s): retry +2.3 s, model
    -0.4 s in the slowest 1%; verdict provider → retry; new finding retry-backoff", or
    "no material change: p99 ..." when not `material`."""
    p99 = latency["p99"]
    if p99.before is not None and p99.after is not None:
        delta = p99.after - p99.before
        pct = p99.pct
        moved = f"{signed_ms(delta)} ({signed_pct(pct)}, " if pct is not None else f"{signed_ms(delta)} ("
        p99_text = f"p99 {moved}{fmt_ms(p99.before)} → {fmt_ms(p99.after)})"
    else:
        delta = None
        p99_text = f"p99 {_ms_or_none(p99.before)} → {_ms_or_none(p99.after)} (no requests analysed)"
    parts: list[str] = []
    if not material:
        head = f"no material change: {p99_text}"
    else:
        head = p99_text
        named = named_layers(layers, delta)
        if named:
            where = "in the slowest 1%" if tail_metric == TAIL_MEAN else "in the tail's excess over the median"
            head += ": " + ", ".join(f"{c.layer} {signed_ms(c.tail_delta_ms)}" for c in named) + f" {where}"
    before_label, after_label = verdict_label(before), verdict_label(after)
    parts.append(f"verdict {before_label} → {after_label}" if before_label != after_label else f"verdict still {after_label}")
    if findings.appeared:
        rules = _rules(findings.appeared)
        parts.append(("new finding " if len(rules) == 1 else "new findings ") + ", ".join(rules))
    if findings.disappeared:
        rules = _rules(findings.disappeared)
        parts.append(("finding " if len(rules) == 1 else "findings ") + ", ".join(rules) + " gone")
    return "; ".join([head, *parts])


def _rules(refs: Iterable[FindingRef]) -> list[str]:
    return list(dict.fromkeys(ref.rule for ref in refs))


def _ms_or_none(ms: float | None) -> str:
    return "none" if ms is None else fmt_ms(ms)


# --- inputs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    """One side of a diff: its report, each layer's mean time in the slowest 1% when it was
    diagnosed from a capture (None for a saved report), and the diagnosis it came from (kept so
    the CLI can leave without freeing it)."""

    report: Report
    tail_ms: dict[str, float] | None
    label: str
    diagnosis: Diagnosis | None = None


def load(path: Input, *, warmup_s: float = DEFAULT_WARMUP_S, exact: bool = False,
         sample_requests: int = DEFAULT_SAMPLE_REQUESTS) -> Loaded:  # fmt: skip
    """Read one side of a diff: a saved `latprof.report/1` JSON report (told by its content) as
    it is, anything else by `run_diagnosis` (captures, trace files, directories of them).

    `warmup_s` applies to captures only: a saved report was diagnosed already. Unreadable
    input raises `InputError`.
    """
    if isinstance(path, ClickHouseSource):  # a table of spans (its range in the URL): never a saved report
        label, saved = str(path), None
    else:
        label = os.fspath(path)
        saved = read_saved_report(path)
    if saved is not None:
        return Loaded(saved, None, label)
    from latprof.pipeline import run_diagnosis

    diagnosis = run_diagnosis([path], warmup_s=warmup_s, exact=exact, sample_requests=sample_requests)
    return Loaded(diagnosis.report, tail_means(diagnosis.analysis), label, diagnosis)


def diff_paths(
    before: Input,
    after: Input,
    *,
    warmup_s: float = DEFAULT_WARMUP_S,
    threshold_pct: float | None = None,
    exact: bool = False,
    sample_requests: int = DEFAULT_SAMPLE_REQUESTS,
) -> tuple[Diff, list[Loaded]]:
    """`load` both sides and `diff_reports` them; also returns what was loaded."""
    sides = [load(side, warmup_s=warmup_s, exact=exact, sample_requests=sample_requests) for side in (before, after)]
    old, new = sides
    diff = diff_reports(
        old.report,
        new.report,
        before_tail_ms=old.tail_ms,
        after_tail_ms=new.tail_ms,
        before_input=old.label,
        after_input=new.label,
        threshold_pct=threshold_pct,
    )
    return diff, sides


def read_saved_report(path: str | os.PathLike[str]) -> Report | None:
    """The report saved at `path` by `--format json`, or None when the file is not one (or is
    not a file: the pipeline says why it cannot read it). Gzipped reports are read too."""
    file = Path(path)
    if not file.is_file():
        return None
    try:
        with open(file, "rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
        opener: Callable[[], Any] = (lambda: gzip.open(file, "rb")) if gzipped else (lambda: open(file, "rb"))
        with opener() as stream:
            head = stream.read(_SNIFF_BYTES)
            if not head.lstrip().startswith(b"{") or REPORT_SCHEMA.encode() not in head:
                return None
            data = orjson.loads(head + stream.read())
    except (OSError, EOFError, orjson.JSONDecodeError):
        return None  # not a readable JSON document: let the pipeline name the problem
    if not isinstance(data, dict) or data.get("schema") != REPORT_SCHEMA:
        return None
    try:
        return report_from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{path}: a {REPORT_SCHEMA} report latprof cannot read back: {type(exc).__name__}: {exc}") from None


def report_from_dict(data: Mapping[str, Any]) -> Report:
    """Rebuild a `Report` from its report-v1 JSON (`Report.to_dict`); what a diff does not read may be absent."""
    verdict = data.get("verdict") or {}
    over_time = data.get("p99_over_time") or {}
    return Report(
        source=dict(data.get("source") or {}),
        window=dict(data.get("window") or {}),
        latency_ms=None if data.get("latency_ms") is None else dict(data["latency_ms"]),
        layers=[
            LayerRow(
                layer=str(row["layer"]),
                p50_ms=_opt_float(row.get("p50_ms")),
                p99_ms=_opt_float(row.get("p99_ms")),
                mean_ms=_opt_float(row.get("mean_ms")),
                tail_excess_ms=float(row.get("tail_excess_ms") or 0.0),
                share_of_tail_excess=float(row.get("share_of_tail_excess") or 0.0),
            )
            for row in data.get("layers") or []
        ],
        verdict=Verdict(
            layer=verdict.get("layer"),
            rule=verdict.get("rule"),
            share_of_tail_excess=_opt_float(verdict.get("share_of_tail_excess")),
            confidence=float(verdict.get("confidence") or 0.0),
            summary=str(verdict.get("summary") or ""),
            status=str(verdict.get("status") or ("layer" if verdict.get("layer") else "no_tail")),
        ),
        findings=[
            Finding(
                rule=str(f["rule"]),
                layer=f.get("layer"),
                severity=str(f.get("severity") or "info"),
                confidence=float(f.get("confidence") or 0.0),
                impact_ms=float(f.get("impact_ms") or 0.0),
                summary=str(f.get("summary") or ""),
                evidence=dict(f.get("evidence") or {}),
                fix=str(f.get("fix") or ""),
                # reports without fingerprints match by rule and layer
                fingerprint=str(f.get("fingerprint") or f"{f['rule']}:{f.get('layer')}"),
            )
            for f in data.get("findings") or []
        ],
        collection=dict(data.get("collection") or {}),
        p99_over_time=[
            WindowRow(float(w["start_unix_s"]), w.get("requests"), _opt_float(w.get("p99_ms")),
                      {k: v for k, v in w.items() if k not in _WINDOW_KEYS} or None)  # fmt: skip
            for w in over_time.get("windows") or []
        ],
        window_s=_opt_float(over_time.get("window_s")),
    )


#: A `p99_over_time` window's own keys; the others are its `WindowRow.extra`.
_WINDOW_KEYS = ("start_unix_s", "requests", "p99_ms")


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


# --- the regression check ---------------------------------------------------------------------


def regression_failure(diff: Diff) -> str | None:
    """Why `--fail-on-regression` fails (one line), or None when it passes or was not asked for.

    Raises `InputError` when it was asked for but a side has no p99 to compare.
    """
    regression = diff.regression
    if regression.threshold_pct is None:
        return None
    p99 = diff.latency_ms["p99"]
    if p99.before is None or p99.after is None:
        missing = [label for label, value in (("BEFORE", p99.before), ("AFTER", p99.after)) if value is None]
        raise InputError(
            f"--fail-on-regression: {' and '.join(missing)} {'has' if len(missing) == 1 else 'have'} no p99"
            " (no requests analysed after warm-up); cannot compare"
        )
    if regression.p99_pct is None:
        raise InputError("--fail-on-regression: BEFORE's p99 is 0 ms; a change in percent of it cannot be computed")
    if not regression.failed:
        return None
    return (
        f"p99 regressed {signed_pct(regression.p99_pct)} ({fmt_ms(p99.before)} → {fmt_ms(p99.after)}),"
        f" more than the allowed +{regression.threshold_pct:g}%"
    )
