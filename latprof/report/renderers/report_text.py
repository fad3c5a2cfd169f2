"""The terminal renderer: the verdict first, then layers, findings, p99 over time and what was seen."""

from __future__ import annotations

from typing import Any, Mapping, TextIO

from rich.console import Console, Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from latprof.engine import Finding, fmt_ms
from latprof.layers import DESCRIPTIONS
from latprof.report.evidence import evidence_rows, with_unit
from latprof.report.renderers import REPORT
from latprof.report.renderers.report_common import cost_line, engine_lines, estimated_line, gap_place, injected_line
from latprof.report.model import Report

_SPARKS = "▁▂▃▄▅▆▇█"
# How each verdict branch is labelled ("" = the layer's name).
_VERDICT_LABELS = {
    "layer": ("", "bold red"),
    "unattributed": ("unattributed", "bold magenta"),
    "no_tail": ("no tail", "bold green"),
    "too_few_requests": ("no verdict", "bold yellow"),
    "not_saturated": ("not saturated", "bold green"),
    "at_capacity": ("at capacity", "bold yellow"),
}
_SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
_BAR_WIDTH = 20
# The evidence rows that say a finding was inferred, and how they stand out of the dim rest.
_INFERENCE_KEYS = ("inferred", "inferred_from")
_INFERRED_STYLE = "yellow"
# Below this console width the layer table leaves out the column that explains each layer.
_DESCRIBE_FROM_WIDTH = 120


@REPORT.register("text")
def render_text(report: Report, out: TextIO) -> None:
    console = Console(file=out, highlight=False, soft_wrap=False)
    print_report(report, console)


def print_report(report: Report, console: Console) -> None:
    """Print the report to a rich console (tests pass one with a fixed width)."""
    console.print(_header(report))
    console.print()
    console.print(_verdict(report))
    if report.layers:
        console.print()
        console.print(_layer_table(report, console.width))
    if report.findings:
        console.print()
        console.print(Text("Findings", style="bold"))
        for finding in report.findings:
            console.print(_finding(finding, report.source.get("kind") == "attach"))
    if report.requests:
        console.print()
        for part in _explained(report):
            console.print(part)
    spark = _sparkline(report)
    if spark is not None:
        console.print()
        console.print(spark)
    console.print()
    console.print(_collection(report))


def _header(report: Report) -> Text:
    source = report.source
    inputs = ", ".join(source.get("inputs") or []) or "-"
    text = Text()
    text.append("latprof", style="bold")
    how = " (hooks injected into the running service)" if source.get("method") == "inject" else ""
    text.append(f"  {source['kind']}{how}: {inputs}")
    window = report.window
    if window.get("requests") is not None and window.get("start_unix_s") is not None:
        span = window["end_unix_s"] - window["start_unix_s"]
        recorded = report.collection.get("recorded_requests")
        if isinstance(recorded, int) and recorded != window["requests"]:
            text.append(f"\n~{window['requests']:,} requests ({recorded:,} recorded) over {span:,.0f} s")
        else:
            text.append(f"\n{window['requests']:,} requests over {span:,.0f} s")
    lat = report.latency_ms
    if lat:
        text.append(
            f"   p50 {fmt_ms(lat['p50'])} · p90 {fmt_ms(lat['p90'])} · p99 {fmt_ms(lat['p99'])} · max {fmt_ms(lat['max'])}"
        )
    return text


def _verdict(report: Report) -> Table:
    verdict = report.verdict
    label, style = _VERDICT_LABELS.get(verdict.status, (verdict.layer or "", "bold"))
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column()
    details = [f"confidence {verdict.confidence:.2f}"]
    if verdict.rule:
        details.append(f"rule {verdict.rule}")
    summary = Text(verdict.summary)
    summary.append(f"\n({', '.join(details)})", style="dim")
    grid.add_row(Text(f"VERDICT  {label or verdict.layer}", style=style), summary)
    return grid


def _layer_table(report: Report, width: int) -> Table:
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    table.add_column("layer", no_wrap=True, min_width=12)
    attach = report.source.get("kind") == "attach"  # time per second of the capture, over busy workers and the backlog
    for name in ("p50", "p99", "per second" if attach else "tail excess", "share"):
        table.add_column(name, justify="right", no_wrap=True, min_width=max(7, len(name)))
    table.add_column("", no_wrap=True, min_width=_BAR_WIDTH)
    described = width >= _DESCRIBE_FROM_WIDTH
    if described:
        table.add_column("what it is", style="dim", overflow="ellipsis", no_wrap=True)
    for row in report.layers:
        share = row.share_of_tail_excess
        bar = "█" * round(share * _BAR_WIDTH)
        style = "bold red" if report.verdict.layer == row.layer else None
        cells: list[Any] = [
            Text(row.layer, style=style or ""),
            _ms(row.p50_ms),
            _ms(row.p99_ms),
            _ms(row.tail_excess_ms) if row.tail_excess_ms > 0 else "-",
            f"{share:.0%}" if share > 0 else "-",
            Text(bar, style=style or "blue"),
        ]
        if described:
            cells.append(DESCRIPTIONS.get(row.layer, ""))
        table.add_row(*cells)
    return table


def _explained(report: Report) -> list[Any]:
    """Each request explained: its critical path by layer and by span, its longest uncovered gap, its findings."""
    explained = report.requests or []
    recorded = report.collection.get("recorded_requests")
    total = len(explained) if not isinstance(recorded, int) else max(len(explained), recorded + int(report.collection.get("warmup_requests_skipped") or 0))
    parts: list[Any] = [Text(f"Each request explained ({'the slowest ' + str(len(explained)) + ' of ' + str(total) if total > len(explained) else len(explained)})",
                             style="bold")]  # fmt: skip
    for e in explained:
        head = Text()
        head.append(e.route, style="bold")
        if e.service:
            head.append(f"  [{e.service}]")
        head.append(f"  {fmt_ms(e.latency_ms)}")
        if e.status_code is not None:
            head.append(f"  status {e.status_code}")
        head.append(f"  {e.request_id}", style="dim")
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True, style="dim")
        grid.add_column()
        total_ms = e.latency_ms or 1.0
        grid.add_row("critical path", Text(" · ".join(f"{layer} {fmt_ms(ms)} ({ms / total_ms:.0%})"
                                                for layer, ms in sorted(e.layers.items(), key=lambda kv: -kv[1]))))  # fmt: skip
        if e.path:
            grid.add_row("longest spans", Text("\n".join(
                f"{p.name}{f' [{p.service}]' if p.service else ''}  {p.layer or 'no layer'}  {fmt_ms(p.ms)} ({p.share:.0%})" for p in e.path
            )))  # fmt: skip
        if e.gap is not None and e.gap.ms > 0:
            where = gap_place(e.gap)
            grid.add_row("longest gap", Text(f"{fmt_ms(e.gap.ms)} no span explains, at +{fmt_ms(e.gap.start_offset_ms)} {where}"))
        items: list[Any] = [head, Padding(grid, (0, 0, 0, 2))]
        for finding in e.findings:
            line = Text()
            line.append(f"● {finding.severity:<8}", style=_SEVERITY_STYLE.get(finding.severity, ""))
            line.append(f" {finding.kind}", style="bold")
            if finding.impact_ms > 0:
                line.append(f"  impact {fmt_ms(finding.impact_ms)}")
            inferred = " (inferred)" if finding.evidence.get("inferred") else ""
            line.append(f"  confidence {finding.confidence:.2f}{inferred}", style="dim")
            fix = Text("fix: ", style="green")
            fix.append(finding.fix)
            items.append(Padding(Group(line, Padding(Text(finding.summary), (0, 0, 0, 2)), Padding(fix, (0, 0, 0, 2))), (0, 0, 0, 2)))
        parts.append(Group(*items))
    return parts


def _ms(value: float | None) -> str:
    return "-" if value is None else fmt_ms(value)


def _finding(finding: Finding, per_second: bool = False) -> Group:
    head = Text()
    head.append(f"● {finding.severity:<8}", style=_SEVERITY_STYLE.get(finding.severity, ""))
    head.append(f" {finding.rule}", style="bold")
    if finding.layer:
        head.append(f"  {finding.layer}")
    if finding.impact_ms > 0:
        head.append(f"  impact {fmt_ms(finding.impact_ms)}" + ("/s" if per_second else ""))
    head.append(f"  confidence {finding.confidence:.2f}", style="dim")
    fix = Text("fix: ", style="green")
    fix.append(finding.fix)
    parts: list[Any] = [Text(finding.summary)]
    if finding.evidence:
        parts.append(Group(Text("evidence", style="dim"), Padding(_evidence_table(finding.evidence), (0, 0, 0, 2))))
    return Group(head, *(Padding(part, (0, 0, 0, 2)) for part in (*parts, fix)))


def _evidence_table(evidence: Mapping[str, Any]) -> Table:
    """The evidence, one row a key in the JSON report's order: name, then the value with its unit
    (`latprof.report.evidence`); dim, but what says the finding was inferred stands out."""
    table = Table(box=None, show_header=False, pad_edge=False, show_edge=False, padding=(0, 2))
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    for row in evidence_rows(evidence):
        style = _INFERRED_STYLE if row.key in _INFERENCE_KEYS and evidence.get("inferred") else "dim"
        table.add_row(Text(row.name, style=style), Text(with_unit(row.value, row.unit), style=style))
    return table


def _sparkline(report: Report) -> Text | None:
    if report.source.get("kind") == "attach":
        return _attach_seconds(report)
    points = [w.p99_ms for w in report.p99_over_time]
    values = [p for p in points if p is not None]
    if len(values) < 2:
        return None
    low, high = min(values), max(values)
    span = high - low or 1.0
    chars = "".join(" " if p is None else _SPARKS[min(7, int((p - low) / span * 7.999))] for p in points)
    text = Text(f"p99 over time ({report.window_s:g} s windows)  ", style="bold")
    text.append(f"{fmt_ms(low)} ")
    text.append(chars, style="blue")
    text.append(f" {fmt_ms(high)}")
    return text


def _attach_seconds(report: Report) -> Text | None:
    """Attach mode: per second, how many workers were busy and in which layer most were."""
    rows = [w.extra for w in report.p99_over_time if w.extra]
    if len(rows) < 2:
        return None
    if any(row.get("requests_in_flight") is not None for row in rows):  # an asyncio server: the loop and the wire
        text = Text("per second (requests in flight, event loop busy, accept queue)\n", style="bold")
        for i, row in enumerate(rows):
            flight, busy, queue = row.get("requests_in_flight"), row.get("loop_busy_share"), row.get("accept_queue")
            text.append(f"  {i:>3}s  in flight {'-' if flight is None else f'{flight:.1f}':>5}"
                        f"  loop {'-' if busy is None else f'{busy:.0%}':>4}"
                        + (f"  queue {queue:g}" if queue is not None else "") + "\n")  # fmt: skip
        return text
    text = Text("per second (busy workers/workers, top layer, accept queue)\n", style="bold")
    text.append("  a worker is busy in a second when half its samples were; ? = not every worker sampled yet\n", style="dim")
    for i, row in enumerate(rows):
        queue = row.get("accept_queue")
        busy = row.get("busy_workers")
        text.append(f"  {i:>3}s  {'?' if busy is None else busy}/{row.get('workers')}  {row.get('top_layer') or '-':<13}"
                    + (f"  queue {queue:g}" if queue is not None else "") + "\n")  # fmt: skip
    return text


def _collection(report: Report) -> Text:
    c = report.collection
    parts = [f"collectors: {', '.join(c['collectors']) or 'none reported'}"]
    if c.get("coverage") is not None:
        parts.append(f"coverage {c['coverage']:.0%}")
    if c.get("warmup_requests_skipped"):
        parts.append(f"{c['warmup_requests_skipped']} warm-up requests skipped")
    text = Text("What latprof could see: ", style="bold")
    text.append(" · ".join(parts))
    cost = cost_line(report)
    if cost:
        text.append(f"\n  {cost}")
    for process in c.get("injected") or []:
        text.append("\n  " + injected_line(process))
    for engine in c.get("engines") or []:
        for line in engine_lines(engine):
            text.append("\n  " + line)
    said = estimated_line(c.get("estimated"))
    if said:
        text.append(f"\n  {said}")
    for warning in c.get("warnings") or []:
        text.append(f"\n  warning: {warning}", style="yellow")
    return text
