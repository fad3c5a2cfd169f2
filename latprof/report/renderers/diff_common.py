"""Cells and lines the diff renderers share: each side in one line, the layer rows, the regression check."""

from __future__ import annotations

from latprof.ci.diff import TAIL_MEAN, Diff, signed_ms, signed_pct, verdict_label
from latprof.engine import fmt_ms
from latprof.report.model import Report


def share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def ms(value: float | None) -> str:
    return "-" if value is None else fmt_ms(value)


def side_line(report: Report, label: str) -> str:
    """`label (93 requests, p50 120 ms, p99 174 ms, verdict db.pool)`."""
    requests = report.window.get("requests")
    lat = report.latency_ms
    text = f"{label} ({requests if requests is not None else '?'} requests"
    if lat:
        text += f", p50 {fmt_ms(lat['p50'])}, p99 {fmt_ms(lat['p99'])}"
    return text + f", verdict {verdict_label(report.verdict)})"


def layer_cells(diff: Diff) -> list[tuple[str, str, str, str]]:
    """Per layer: its name, p99 before → after, tail share before → after, the change of tail time."""
    return [
        (
            c.layer,
            f"{ms(c.p99_ms.before)} → {ms(c.p99_ms.after)}",
            f"{share(c.share_of_tail_excess.before)} → {share(c.share_of_tail_excess.after)}",
            signed_ms(c.tail_delta_ms),
        )
        for c in diff.layers
    ]


def tail_header(diff: Diff) -> str:
    return "Δ tail (slowest 1%)" if diff.tail_metric == TAIL_MEAN else "Δ tail excess"


def regression_line(diff: Diff) -> str | None:
    """How the `--fail-on-regression` check came out, or None when it was not asked for."""
    regression = diff.regression
    if regression.threshold_pct is None:
        return None
    if regression.p99_pct is None:
        return f"regression check (+{regression.threshold_pct:g}% allowed): not possible, a side has no p99"
    outcome = "FAILED" if regression.failed else "passed"
    return f"regression check: p99 {signed_pct(regression.p99_pct)}, +{regression.threshold_pct:g}% allowed: {outcome}"
