"""The report: the verdict (`latprof.report.verdict`), the layer table, the findings and what collection could see (report-v1)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from latprof.analysis.capacity import window_loads
from latprof.analysis.engine import collection_engines
from latprof.analysis.explain import Explanation
from latprof.analysis.cohort_first import estimated
from latprof.analysis.requests import NS_PER_S, Analysis, LayerStats
from latprof.analysis.timeline import Timeline
from latprof.engine import Finding
from latprof.layers import LAYERS
from latprof.report.verdict import Verdict, decide_verdict
from latprof.semconv import ENGINE_SCRAPER, NOTE_INJECTED, NOTE_OVERHEAD, OVERHEAD_SOURCE, OVERHEAD_SOURCE_HOOKS

if TYPE_CHECKING:
    from latprof.report.pictures import Pictures

SCHEMA = "latprof.report/1"


@dataclass(frozen=True, slots=True)
class LayerRow:
    layer: str
    p50_ms: float | None
    p99_ms: float | None
    mean_ms: float | None
    tail_excess_ms: float
    share_of_tail_excess: float


@dataclass(frozen=True, slots=True)
class WindowRow:
    start_unix_s: float
    requests: int | None
    p99_ms: float | None
    #: attach mode, per second: busy workers, the layer most of them were in, the accept queue
    extra: dict[str, Any] | None = None


@dataclass(frozen=True)
class Report:
    """A finished diagnosis. Renderers format it; they compute nothing."""

    source: dict[str, Any]
    window: dict[str, Any]
    latency_ms: dict[str, Any] | None
    layers: list[LayerRow]
    verdict: Verdict
    findings: list[Finding]
    collection: dict[str, Any]
    p99_over_time: list[WindowRow] = field(default_factory=list)
    window_s: float | None = None
    schema: str = SCHEMA
    #: Each request explained (`latprof.analysis.explain`) when there are too few for a tail
    #: verdict or one trace was picked; None otherwise (the key is then left out).
    requests: list[Explanation] | None = None
    #: `collection.overhead` by whose cost it is (`overhead_parts`: "hooks", "sampler"), for the
    #: text report to tell them apart; not in the JSON, whose `overhead` is their sum.
    overhead_parts: dict[str, dict[str, float | None]] = field(default_factory=dict)
    #: What the HTML report draws besides (`latprof.report.pictures`): made only for `--format
    #: html`, None otherwise; not in the JSON.
    pictures: Pictures | None = None

    def to_dict(self) -> dict[str, Any]:
        """The report-v1 JSON shape."""
        out: dict[str, Any] = {
            "schema": self.schema,
            "source": self.source,
            "window": self.window,
            "latency_ms": self.latency_ms,
            "layers": [
                {
                    "layer": row.layer,
                    "p50_ms": row.p50_ms,
                    "p99_ms": row.p99_ms,
                    "mean_ms": row.mean_ms,
                    "tail_excess_ms": row.tail_excess_ms,
                    "share_of_tail_excess": row.share_of_tail_excess,
                }
                for row in self.layers
            ],
            "verdict": self.verdict.to_dict(),
            "findings": [
                {
                    "rule": f.rule,
                    "layer": f.layer,
                    "severity": f.severity,
                    "confidence": f.confidence,
                    "impact_ms": f.impact_ms,
                    "summary": f.summary,
                    "evidence": dict(f.evidence),
                    "fix": f.fix,
                    "fingerprint": f.fingerprint,
                }
                for f in self.findings
            ],
            "collection": self.collection,
            "p99_over_time": {
                "window_s": self.window_s,
                "windows": [
                    {"start_unix_s": w.start_unix_s, "requests": w.requests, "p99_ms": w.p99_ms, **(w.extra or {})}
                    for w in self.p99_over_time
                ],
            },
        }
        if self.requests is not None:
            out["requests"] = [explanation.to_dict() for explanation in self.requests]
        return out


def _layer_rows(analysis: Analysis) -> list[LayerRow]:
    rows = [_row(s) for s in analysis.layers.values() if s.seen]
    order = {layer: i for i, layer in enumerate(LAYERS)}
    rows.sort(key=lambda r: (-max(r.tail_excess_ms, 0.0), -(r.p50_ms or 0.0), order[r.layer]))
    return rows


def _row(s: LayerStats) -> LayerRow:
    return LayerRow(
        layer=s.layer,
        p50_ms=round(s.p50_ms, 3),
        p99_ms=round(s.p99_ms, 3),
        mean_ms=round(s.mean_ms, 3),
        tail_excess_ms=round(s.tail_excess_ms, 3),
        share_of_tail_excess=round(s.share_of_tail_excess, 4),
    )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def overhead_parts(timeline: Timeline) -> dict[str, dict[str, float | None]]:
    """What collection cost, by whose cost it is, from the `overhead` records (the latest of each
    process and source): "hooks" (in-process hooks, `latprof run` or `attach --inject`) and
    "sampler" (`latprof attach`'s own process). Only the sources that wrote records.

    `cpu_percent` is a percentage of one CPU core. The hooks': the sum over the service's
    processes (each process's hooks use CPU of their own). The sampler's: the mean of its
    records (one per attach session). `added_ms_per_request`: the hooks' time per request served,
    weighted by each process's requests; the sampler adds none it measures.
    """
    last: dict[tuple[str, int], dict[str, Any]] = {}
    for record in timeline.quality:
        if record.kind == NOTE_OVERHEAD:
            source = "hooks" if record.attrs.get(OVERHEAD_SOURCE) == OVERHEAD_SOURCE_HOOKS else "sampler"
            last[(source, record.pid)] = dict(record.attrs)
    parts: dict[str, dict[str, float | None]] = {}
    for source in ("hooks", "sampler"):
        records = [attrs for (s, _), attrs in last.items() if s == source]
        if not records:
            continue
        cpu = [c for c in (_number(r.get("cpu_percent")) for r in records) if c is not None]
        part: dict[str, float | None] = {"cpu_percent": None, "added_ms_per_request": None}
        if cpu:
            part["cpu_percent"] = round(sum(cpu) if source == "hooks" else sum(cpu) / len(cpu), 3)
        added = [(a, _number(r.get("requests"))) for r in records
                 if (a := _number(r.get("added_ms_per_request"))) is not None]  # fmt: skip
        if added:
            weights = [w if w is not None and w > 0 else 0.0 for _, w in added]
            if sum(weights) > 0:
                part["added_ms_per_request"] = round(sum(a * w for (a, _), w in zip(added, weights)) / sum(weights), 4)
            else:
                part["added_ms_per_request"] = round(sum(a for a, _ in added) / len(added), 4)
        parts[source] = part
    return parts


def overhead_of(timeline: Timeline, parts: dict[str, dict[str, float | None]] | None = None) -> dict[str, float | None]:
    """What collection cost, as collectors measured it: report-v1's `collection.overhead`.

    `cpu_percent`: percent of one CPU core, the sum of the sources' (`overhead_parts`): the
    in-process hooks' over the service's processes, plus the attach sampler's own process.
    `added_ms_per_request`: the hooks' time per request served. Null where nothing measured it.
    """
    parts = overhead_parts(timeline) if parts is None else parts
    out: dict[str, float | None] = {"cpu_percent": None, "added_ms_per_request": None}
    cpu = [c for part in parts.values() if (c := part.get("cpu_percent")) is not None]
    if cpu:
        out["cpu_percent"] = round(sum(cpu), 3)
    hooks = parts.get("hooks")
    if hooks is not None:
        out["added_ms_per_request"] = hooks.get("added_ms_per_request")
    return out


def injected_processes(timeline: Timeline) -> list[dict[str, Any]]:
    """`collection.injected`: per process `attach --inject` tried, what happened (its `injected` records)."""
    out = []
    for record in timeline.quality:
        if record.kind == NOTE_INJECTED:
            out.append(dict(record.attrs))
    return out


def _explained_verdict(verdict: Verdict, explained: list[Explanation] | None) -> Verdict:
    """A verdict that could not be given says the requests are explained one by one instead."""
    if explained and verdict.status == "too_few_requests":
        return dataclasses.replace(verdict, summary=f"{verdict.summary} Each request is explained on its own instead.")
    return verdict


def build_report(analysis: Analysis, findings: Sequence[Finding], explained: list[Explanation] | None = None) -> Report:
    """Assemble the report from an analysis, the findings of its rules and, when made, each request explained."""
    timeline = analysis.timeline
    pids = sorted(
        {rt.request.pid for rt in timeline.requests}
        | {h["pid"] for h in timeline.headers if isinstance(h.get("pid"), int) and h.get("role") != ENGINE_SCRAPER}
    )
    lat = analysis.latency
    span = analysis.window_ns
    window = {
        "start_unix_s": span[0] / NS_PER_S if span else None,
        "end_unix_s": span[1] / NS_PER_S if span else None,
        "requests": analysis.represented,
    }
    latency = None if lat is None else lat.to_dict()
    parts = overhead_parts(timeline)
    collection: dict[str, Any] = {
        "collectors": timeline.collectors,
        "coverage": None if analysis.coverage is None else round(analysis.coverage, 4),
        "idle_share": None,
        "warmup_requests_skipped": analysis.warmup_skipped,
        # Requests recorded (a random sample of `window.requests` above `latprof run --max-rate`).
        "recorded_requests": analysis.recorded,
        "overhead": overhead_of(analysis.timeline, parts),
        "warnings": list(analysis.warnings) + [f.summary for f in findings if f.crashed],
    }
    injected = injected_processes(timeline)
    if injected:
        collection["injected"] = injected
    engines = collection_engines(analysis)
    if engines:
        collection["engines"] = engines
    sampled = estimated(analysis)
    if sampled:
        collection["estimated"] = sampled
    size = None
    if len(analysis.windows) >= 1:
        size = analysis.windows[0].end_unix_s - analysis.windows[0].start_unix_s
    return Report(
        source={
            "kind": timeline.source_kind,
            "method": timeline.method,
            "inputs": list(timeline.inputs),
            "pid": pids[0] if len(pids) == 1 else None,
            "pids": pids,
        },
        window=window,
        latency_ms=latency,
        layers=_layer_rows(analysis),
        verdict=_explained_verdict(decide_verdict(analysis, findings), explained),
        findings=list(findings),
        collection=collection,
        p99_over_time=[
            WindowRow(w.start_unix_s, w.requests, None if w.p99_ms is None else round(w.p99_ms, 3),
                      {"arrivals": load.arrivals, "completions": load.completions, "in_flight": load.in_flight_end})
            for w, load in zip(analysis.windows, window_loads(analysis))
        ],
        window_s=size,
        requests=explained,
        overhead_parts=parts,
    )
