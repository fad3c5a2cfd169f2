"""The report: the verdict, the layer table, the findings and what collection could see (report-v1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from latprof.analysis.requests import MIN_REQUESTS_FOR_VERDICT, NS_PER_S, TAIL_RATIO, Analysis, LayerStats
from latprof.engine import Finding, fmt_ms
from latprof.layers import LAYERS, UNATTRIBUTED
from latprof.semconv import NOTE_OVERHEAD

SCHEMA = "latprof.report/1"
#: When the leading layer does not also lead the slowest 5%, its confidence is scaled by this.
NOT_LEADING_TAIL5_FACTOR = 0.5

# How the verdict sentence says what the tail did in each layer: "... {phrase} than the median".
_PHRASES = {
    "queue": "queued {x} longer before a worker started on them",
    "event_loop": "waited {x} longer for a blocked event loop",
    "db.pool": "waited {x} longer for a database connection",
    "db.query": "spent {x} longer in database statements",
    "http.pool": "waited {x} longer for a free HTTP connection",
    "provider": "waited {x} longer for the LLM's first token",
    "model": "spent {x} longer generating after the first token",
    "tool": "spent {x} longer in tools and outbound calls",
    "retry": "slept {x} longer in retry backoff",
    "lock": "waited {x} longer on locks",
    "app": "spent {x} longer running the service's own code",
}

# What would see unattributed time, by how the data was collected.
_BLIND_SPOT_HINTS = {
    "run": "it is time outside every hooked library: sample the service's stacks with `latprof attach --pid` while it happens to see where it goes",
    "attach": "from outside the process the cause is not visible: run the service under `latprof run` so in-process hooks time each request",
    "otlp": "it lies in gaps between spans: instrument the calls made there, or record the service with `latprof run`",
    "jaeger": "it lies in gaps between spans: instrument the calls made there, or record the service with `latprof run`",
    "zipkin": "it lies in gaps between spans: instrument the calls made there, or record the service with `latprof run`",
    "receive": "it lies in gaps between spans: instrument the calls made there, or record the service with `latprof run`",
}


@dataclass(frozen=True, slots=True)
class Verdict:
    layer: str | None
    rule: str | None
    share_of_tail_excess: float | None
    confidence: float
    summary: str
    #: Which branch of the verdict rules decided: "layer", "unattributed", "no_tail" or
    #: "too_few_requests" (the last two have `layer` null).
    status: str = "layer"

    def to_dict(self) -> dict[str, Any]:
        """The report-v1 `verdict` object."""
        return {
            "layer": self.layer,
            "rule": self.rule,
            "share_of_tail_excess": self.share_of_tail_excess,
            "confidence": self.confidence,
            "summary": self.summary,
            "status": self.status,
        }


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

    def to_dict(self) -> dict[str, Any]:
        """The report-v1 JSON shape."""
        return {
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


def decide_verdict(analysis: Analysis, findings: Sequence[Finding]) -> Verdict:
    """Name the layer that owns the tail, exactly by report-v1's verdict rules.

    - null when fewer than 50 requests, p99 < 2x p50, or the slowest 1% take less than
      `analysis.min_tail_excess_ms` longer than the median request (a fast healthy service's
      tail is noise; the summary still names the layer that dominates typical latency);
    - `unattributed` when it has the largest excess, or when attributed layers explain less
      than half of the tail cohort's excess over the median (the summary names what would
      see it);
    - else the layer with the largest positive excess; its confidence is its share, halved
      when it does not also lead in the slowest 5%.
    `rule` is the id of the highest-impact finding on the verdict layer, or null.
    """
    lat = analysis.latency
    typical = _typical_layer(analysis)
    if lat is None or lat.count < MIN_REQUESTS_FOR_VERDICT:
        count = 0 if lat is None else lat.count
        summary = (
            f"Too few requests for a verdict: {count} analysed, {MIN_REQUESTS_FOR_VERDICT} needed"
            + (f" ({analysis.warmup_skipped} more were warm-up)" if analysis.warmup_skipped else "")
            + (f"; typical latency is dominated by {typical}." if typical else ".")
        )
        return Verdict(None, None, None, 0.0, summary, "too_few_requests")
    if lat.p99_ms < TAIL_RATIO * lat.p50_ms:
        summary = f"No tail worth explaining: p99 {fmt_ms(lat.p99_ms)} is {lat.p99_ms / lat.p50_ms:.1f}x p50 {fmt_ms(lat.p50_ms)}"
        if typical:
            summary += f"; typical latency is dominated by {typical}."
        else:
            summary += "."
        return Verdict(None, None, None, 1.0, summary, "no_tail")
    if analysis.tail_excess_ms < analysis.min_tail_excess_ms:
        summary = (
            f"No tail worth explaining: the slowest 1% of requests took {fmt_ms(max(0.0, analysis.tail_excess_ms))}"
            f" longer than the median request (p99 {fmt_ms(lat.p99_ms)}, p50 {fmt_ms(lat.p50_ms)}), under the"
            f" {fmt_ms(analysis.min_tail_excess_ms)} worth acting on (min_tail_excess_ms)"
        )
        summary += f"; typical latency is dominated by {typical}." if typical else "."
        return Verdict(None, None, None, 1.0, summary, "no_tail")

    stats = [s for s in analysis.layers.values() if s.tail_excess_ms > 0]
    if not stats:  # every layer's excess is <= 0: cannot happen when p99 >= 2x p50, but be safe
        return Verdict(UNATTRIBUTED, None, None, 0.0, "The tail could not be attributed to any layer.", "unattributed")
    top = max(stats, key=lambda s: s.tail_excess_ms)
    total_excess = sum(s.tail_excess_ms for s in analysis.layers.values())
    attributed_excess = total_excess - analysis.layer(UNATTRIBUTED).tail_excess_ms
    unattributed = analysis.layer(UNATTRIBUTED)
    if top.layer == UNATTRIBUTED or (total_excess > 0 and attributed_excess < 0.5 * total_excess):
        hint = _BLIND_SPOT_HINTS.get(analysis.timeline.source_kind, _BLIND_SPOT_HINTS["run"])
        summary = (
            f"The tail is not explained by what was collected: {unattributed.share_of_tail_excess:.0%} of the"
            f" tail excess ({fmt_ms(unattributed.tail_excess_ms)} of {fmt_ms(total_excess)}) is unattributed;"
            f" {hint}."
        )
        confidence = max(0.0, 1.0 - attributed_excess / total_excess) if total_excess > 0 else 0.0
        return Verdict(
            UNATTRIBUTED,
            _rule_for(UNATTRIBUTED, findings),
            round(unattributed.share_of_tail_excess, 4),
            round(confidence, 3),
            summary,
            "unattributed",
        )

    leads_tail5 = top.tail5_excess_ms >= max(s.tail5_excess_ms for s in analysis.layers.values())
    confidence = top.share_of_tail_excess * (1.0 if leads_tail5 else NOT_LEADING_TAIL5_FACTOR)
    phrase = _PHRASES.get(top.layer, "spent {x} longer in " + top.layer).format(x=fmt_ms(top.tail_excess_ms))
    summary = (
        f"{top.layer} owns {top.share_of_tail_excess:.0%} of the tail: the slowest 1% of requests"
        f" (p99 {fmt_ms(lat.p99_ms)}, p50 {fmt_ms(lat.p50_ms)}) {phrase} than the median request"
    )
    if not leads_tail5:
        leader = max(analysis.layers.values(), key=lambda s: s.tail5_excess_ms)
        summary += f"; across the slowest 5% {leader.layer} leads instead"
    rule = _rule_for(top.layer, findings)
    explaining = next((f for f in findings if f.rule == rule and f.layer == top.layer), None) if rule else None
    if explaining is not None and explaining.evidence.get("inferred"):
        # no span measured this layer: the verdict is as sure as the inference, and says so
        confidence = min(confidence, explaining.confidence)
        summary += f" (inferred from {explaining.evidence.get('inferred_from') or 'the shape of the traces'}; see the finding)"
    return Verdict(top.layer, rule, round(top.share_of_tail_excess, 4), round(confidence, 3), summary + ".")


def _rule_for(layer: str, findings: Sequence[Finding]) -> str | None:
    for finding in findings:  # sorted by impact, largest first
        if finding.layer == layer and not finding.crashed:
            return finding.rule
    return None


def _typical_layer(analysis: Analysis) -> str | None:
    """'provider (610 ms of the median request's 780 ms)': the layer with most median-cohort time."""
    seen = [s for s in analysis.layers.values() if s.median_mean_ms > 0]
    if not seen:
        return None
    top = max(seen, key=lambda s: s.median_mean_ms)
    total = sum(s.median_mean_ms for s in seen)
    return f"{top.layer} ({fmt_ms(top.median_mean_ms)} of the median request's {fmt_ms(total)}, {top.median_mean_ms / total:.0%})"


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


def _overhead(analysis: Analysis) -> dict[str, float | None]:
    """Overhead collectors measured on the observed process (last record per process, averaged)."""
    last: dict[int, dict[str, Any]] = {}
    for record in analysis.timeline.quality:
        if record.kind == NOTE_OVERHEAD:
            last[record.pid] = dict(record.attrs)
    out: dict[str, float | None] = {"cpu_percent": None, "added_ms_per_request": None}
    for key in out:
        values = [float(v[key]) for v in last.values() if isinstance(v.get(key), (int, float))]
        if values:
            out[key] = round(sum(values) / len(values), 3)
    return out


def build_report(analysis: Analysis, findings: Sequence[Finding]) -> Report:
    """Assemble the report from an analysis and the findings of its rules."""
    timeline = analysis.timeline
    requests = analysis.requests
    pids = sorted(
        {rt.request.pid for rt in timeline.requests} | {h["pid"] for h in timeline.headers if isinstance(h.get("pid"), int)}
    )
    lat = analysis.latency
    window = {
        "start_unix_s": min(rt.request.start_ns for rt in requests) / NS_PER_S if requests else None,
        "end_unix_s": max(rt.request.end_ns for rt in requests) / NS_PER_S if requests else None,
        "requests": analysis.represented,
    }
    latency = (
        None
        if lat is None
        else {
            "p50": round(lat.p50_ms, 3),
            "p90": round(lat.p90_ms, 3),
            "p99": round(lat.p99_ms, 3),
            "max": round(lat.max_ms, 3),
        }
    )
    collection = {
        "collectors": timeline.collectors,
        "coverage": None if analysis.coverage is None else round(analysis.coverage, 4),
        "idle_share": None,
        "warmup_requests_skipped": analysis.warmup_skipped,
        # Requests recorded (a random sample of `window.requests` above `latprof run --max-rate`).
        "recorded_requests": len(requests),
        "overhead": _overhead(analysis),
        "warnings": list(analysis.warnings) + [f.summary for f in findings if f.crashed],
    }
    size = None
    if len(analysis.windows) >= 1:
        size = analysis.windows[0].end_unix_s - analysis.windows[0].start_unix_s
    return Report(
        source={
            "kind": timeline.source_kind,
            "inputs": list(timeline.inputs),
            "pid": pids[0] if len(pids) == 1 else None,
            "pids": pids,
        },
        window=window,
        latency_ms=latency,
        layers=_layer_rows(analysis),
        verdict=decide_verdict(analysis, findings),
        findings=list(findings),
        collection=collection,
        p99_over_time=[
            WindowRow(w.start_unix_s, w.requests, None if w.p99_ms is None else round(w.p99_ms, 3))
            for w in analysis.windows
        ],
        window_s=size,
    )
