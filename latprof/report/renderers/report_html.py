"""`--format html`: the report as one self-contained page (`html_common` says what that means).

In reading order: the verdict, the layer table, each finding as a card, the waterfalls of the
tail's example requests beside a typical one, p99 over time with the tail's layers per window
(attach: the per-second timeline), each request explained (when there were too few for a
verdict), and what latprof could see. The waterfalls and the tail's layers per window come from
`Report.pictures` (`latprof.report.pictures.with_pictures`); a report without them (read back
from JSON) leaves those sections out.
"""

from __future__ import annotations

from typing import TextIO

from latprof.analysis.explain import Explanation
from latprof.engine import fmt_ms
from latprof.report.model import Report
from latprof.report.pictures import Bar, Pictures, Waterfall
from latprof.report.renderers import REPORT
from latprof.report.renderers.html_common import (
    colour,
    esc,
    finding_card,
    layer_table,
    legend,
    ms,
    page,
    seconds_chart,
    tail_over_time,
    verdict_label,
    verdict_section,
)
from latprof.report.renderers.report_common import cost_line, engine_lines, estimated_line, gap_place, injected_line

_WIDTH = 960
_LANE = 13
_BAR = 11
_PATH_TOP = 18
_LANES_TOP = 40
#: The stretches of a request's critical path no segment covers: its own code, or what nothing collected saw.
_UNCOVERED_COLOUR = "#efefef"
_ROLES = {"tail": "slow", "median": "typical", "explained": "request"}


@REPORT.register("html")
def render_html(report: Report, out: TextIO) -> None:
    out.write(page(f"latprof: {verdict_label(report)} - {', '.join(report.source.get('inputs') or []) or report.source.get('kind')}",
                   _body(report)))  # fmt: skip


def _body(report: Report) -> list[str]:
    pictures = report.pictures
    drawn = [w.request_id for w in pictures.waterfalls] if pictures else []
    parts = [_header(report), verdict_section(report), layer_table(report)]
    if report.findings:
        per_second = report.source.get("kind") == "attach"
        parts.append('<section id="findings"><h2>Findings</h2>')
        parts.extend(finding_card(f, per_second=per_second, drawn=drawn) for f in report.findings)
        parts.append("</section>\n")
    if pictures and pictures.waterfalls:
        parts.append(_waterfalls(pictures))
    if report.source.get("kind") == "attach":
        parts.append(seconds_chart(report.p99_over_time))
    elif pictures:
        parts.append(tail_over_time(pictures.windows, report.window_s, (report.latency_ms or {}).get("p50")))
    if report.requests:
        parts.append(_explained(report.requests, drawn))
    parts.append(_collection(report))
    return parts


def _header(report: Report) -> str:
    source = report.source
    inputs = ", ".join(source.get("inputs") or []) or "-"
    how = " (hooks injected into the running service)" if source.get("method") == "inject" else ""
    line = [f"<b>latprof</b> · {esc(source.get('kind'))}{esc(how)}: {esc(inputs)}"]
    window = report.window
    if window.get("requests") is not None and window.get("start_unix_s") is not None:
        span = window["end_unix_s"] - window["start_unix_s"]
        line.append(f"{window['requests']:,} requests over {span:,.0f} s")
    lat = report.latency_ms
    if lat:
        line.append(f"p50 {ms(lat.get('p50'))} · p90 {ms(lat.get('p90'))} · p99 {ms(lat.get('p99'))} · max {ms(lat.get('max'))}")
    return f'<header class="top">{" · ".join(line)}</header>\n'


# --- waterfalls -------------------------------------------------------------------------------


def _waterfalls(pictures: Pictures) -> str:
    scale_ms = max((w.latency_ms for w in pictures.waterfalls), default=0.0) or 1.0
    layers = {piece.layer for w in pictures.waterfalls for piece in w.path} | {b.layer for w in pictures.waterfalls for b in w.bars}
    attributes = ("statements and URLs included (--include-attributes)" if pictures.include_attributes
                  else "statements and URLs left out; --include-attributes adds them")  # fmt: skip
    return (
        f'<section id="waterfalls"><h2>{_waterfalls_title(pictures)}</h2>'
        '<p class="dim">One row per request, all on one time scale. The top strip is the request\'s critical path, '
        "coloured by the layer that owns each stretch (light grey: time no segment covers); below it every segment, "
        "nested under its parent. Hover or click a bar for its name, duration and attributes "
        f"({esc(attributes)}).</p>" + legend(layers)
        + "".join(_waterfall_row(w, scale_ms) for w in pictures.waterfalls)
        + "</section>\n"
    )  # fmt: skip


def _waterfalls_title(pictures: Pictures) -> str:
    if any(w.role == "explained" for w in pictures.waterfalls):
        return "Where the time went, request by request"
    return "Where the time went: slow requests beside a typical one"


def _waterfall_row(w: Waterfall, scale_ms: float) -> str:
    def x(value_ms: float) -> float:
        return max(0.0, min(_WIDTH, value_ms / scale_ms * _WIDTH))

    lanes = _lanes(w.bars)
    height = _LANES_TOP + (max(lanes, default=-1) + 1) * _LANE + 4
    parts = [_time_axis(w.latency_ms, scale_ms)]
    for piece in w.path:
        owner = piece.layer or "no segment: the request's own code, or what nothing collected saw"
        title = f"critical path: {owner}\n{fmt_ms(piece.end_ms - piece.start_ms)}, +{fmt_ms(piece.start_ms)} to +{fmt_ms(piece.end_ms)}"
        if piece.name:
            title += f"\nin {piece.name}"
        fill = colour(piece.layer) if piece.layer else _UNCOVERED_COLOUR
        parts.append(f'<g class="piece" data-layer="{esc(piece.layer or "")}"><rect x="{x(piece.start_ms):.1f}" y="{_PATH_TOP}" '
                     f'width="{max(x(piece.end_ms) - x(piece.start_ms), 0.5):.1f}" height="16" fill="{fill}"/>'
                     f"<title>{esc(title)}</title></g>")  # fmt: skip
    for bar, lane in zip(w.bars, lanes):
        parts.append(_bar(bar, x(bar.start_ms), x(bar.end_ms), _LANES_TOP + lane * _LANE))
    top = sorted(w.layers_ms.items(), key=lambda kv: -kv[1])[:3]
    summary = " · ".join(f"{esc(layer)} {esc(fmt_ms(value))}" for layer, value in top)
    more = f' · <span class="dim">{w.not_drawn} shorter segments not drawn</span>' if w.not_drawn else ""
    return (
        f'<div class="wf-row" id="req-{esc(w.request_id)}" data-request-id="{esc(w.request_id)}" data-role="{esc(w.role)}">'
        f'<div class="wf-head"><span class="role {esc(w.role)}">{_ROLES.get(w.role, w.role)}</span>'
        f"<b>{esc(w.route)}</b><span>{esc(fmt_ms(w.latency_ms))}</span><span>{summary}{more}</span>"
        f'<code class="dim">{esc(w.request_id)}</code></div>'
        f'<svg viewBox="0 0 {_WIDTH} {height}" width="100%" role="img" aria-label="{esc(w.route)} {esc(fmt_ms(w.latency_ms))}">'
        f'{"".join(parts)}</svg></div>\n'
    )


def _bar(bar: Bar, x0: float, x1: float, y: int) -> str:
    width = max(x1 - x0, 0.5)
    title = f"{bar.name}\n{bar.layer or 'no layer'} · {fmt_ms(bar.end_ms - bar.start_ms)}, +{fmt_ms(bar.start_ms)} to +{fmt_ms(bar.end_ms)}"
    title += "".join(f"\n{key}: {value}" for key, value in bar.attrs)
    stroke = ' stroke="#9e9e9e" stroke-dasharray="2 2"' if bar.layer is None else ""
    label = ""
    if width > 40:
        fits = int((width - 6) / 6.2)
        text = bar.name if len(bar.name) <= fits else bar.name[: max(fits - 1, 1)] + "…"
        label = f'<text x="{x0 + 3:.1f}" y="{y + _BAR - 2}">{esc(text)}</text>'
    return (f'<g class="seg" data-layer="{esc(bar.layer or "")}"><rect x="{x0:.1f}" y="{y}" width="{width:.1f}" height="{_BAR}" '
            f'fill="{colour(bar.layer)}"{stroke}/>{label}<title>{esc(title)}</title></g>')  # fmt: skip


def _lanes(bars: list[Bar]) -> list[int]:
    """A lane per bar: each depth gets as many lanes as its overlapping bars need (greedy, by
    start), stacked in depth order, so a child always lies below its parent."""
    by_depth: dict[int, list[int]] = {}
    for k, bar in enumerate(bars):
        by_depth.setdefault(bar.depth, []).append(k)
    lane_of = [0] * len(bars)
    offset = 0
    for depth in sorted(by_depth):
        ends: list[float] = []
        for k in sorted(by_depth[depth], key=lambda k: (bars[k].start_ms, -bars[k].end_ms)):
            for lane, end in enumerate(ends):
                if end <= bars[k].start_ms:
                    ends[lane] = bars[k].end_ms
                    break
            else:
                lane = len(ends)
                ends.append(bars[k].end_ms)
            lane_of[k] = offset + lane
        offset += len(ends)
    return lane_of


def _time_axis(latency_ms: float, scale_ms: float) -> str:
    out = []
    for k in range(6):
        value = scale_ms * k / 5
        x = _WIDTH * k / 5
        anchor = "start" if k == 0 else "end" if k == 5 else "middle"
        out.append(f'<text x="{x:.1f}" y="11" text-anchor="{anchor}" class="axis">{esc(fmt_ms(value))}</text>'
                   f'<line x1="{x:.1f}" x2="{x:.1f}" y1="14" y2="{_PATH_TOP}" stroke="#cccccc"/>')  # fmt: skip
    end = latency_ms / scale_ms * _WIDTH
    out.append(f'<line x1="{end:.1f}" x2="{end:.1f}" y1="14" y2="{_PATH_TOP + 16}" stroke="#1d1d1f"/>')
    return "".join(out)


# --- requests explained one by one -----------------------------------------------------------


def _explained(explained: list[Explanation], drawn: list[str]) -> str:
    parts = ['<section id="requests"><h2>Each request explained</h2>']
    for e in explained:
        total = e.latency_ms or 1.0
        name = f'<a href="#req-{esc(e.request_id)}">{esc(e.request_id)}</a>' if e.request_id in drawn else esc(e.request_id)
        rows = [f"<tr><td class=\"dim\">critical path</td><td>{' · '.join(f'{esc(layer)} {esc(fmt_ms(v))} ({v / total:.0%})' for layer, v in sorted(e.layers.items(), key=lambda kv: -kv[1]))}</td></tr>"]
        for p in e.path:
            service = f" [{p.service}]" if p.service else ""
            rows.append(f"<tr><td class=\"dim\">span</td><td>{esc(p.name + service)} · {esc(p.layer or 'no layer')} · "
                        f"{esc(fmt_ms(p.ms))} ({p.share:.0%})</td></tr>")  # fmt: skip
        if e.gap is not None and e.gap.ms > 0:
            where = gap_place(e.gap)
            rows.append(f"<tr><td class=\"dim\">longest gap</td><td>{esc(fmt_ms(e.gap.ms))} no span explains, at "
                        f"+{esc(fmt_ms(e.gap.start_offset_ms))} {esc(where)}</td></tr>")  # fmt: skip
        status = f" · status {e.status_code}" if e.status_code is not None else ""
        parts.append(f'<article class="finding request"><div class="head"><h3>{esc(e.route)}</h3>'
                     f"<span>{esc(fmt_ms(e.latency_ms))}{status}</span><code class=\"dim\">{name}</code></div>"
                     f"<table>{''.join(rows)}</table>")  # fmt: skip
        for f in e.findings:
            inferred = " (inferred)" if f.evidence.get("inferred") else ""
            parts.append(f'<div class="request-finding"><p><span class="sev {esc(f.severity)}">{esc(f.severity)}</span> '
                         f"<b>{esc(f.kind)}</b> <span class=\"dim\">confidence {f.confidence:.2f}{inferred}</span></p>"
                         f"<p>{esc(f.summary)}</p><p class=\"fix\"><b>Fix:</b> {esc(f.fix)}</p></div>")  # fmt: skip
        parts.append("</article>")
    parts.append("</section>\n")
    return "".join(parts)


# --- what latprof could see --------------------------------------------------------------------


def _collection(report: Report) -> str:
    c = report.collection
    items = [("collectors", ", ".join(c.get("collectors") or []) or "none reported")]
    if c.get("coverage") is not None:
        items.append(("coverage", f"{c['coverage']:.0%} of request time attributed to a layer"))
    if c.get("idle_share") is not None:
        items.append(("idle", f"{c['idle_share']:.0%} of worker time"))
    if c.get("warmup_requests_skipped"):
        items.append(("warm-up", f"{c['warmup_requests_skipped']} requests left out"))
    recorded, represented = c.get("recorded_requests"), report.window.get("requests")
    if isinstance(recorded, int) and isinstance(represented, int) and recorded != represented:
        items.append(("sampling", f"{recorded:,} requests recorded, standing for ~{represented:,}"))
    cost = cost_line(report)
    items.append(("latprof's own cost", cost or "not measured by these collectors"))
    items.extend(("injected", injected_line(process)) for process in c.get("injected") or [])
    items.extend(("engine", line.strip()) for engine in c.get("engines") or [] for line in engine_lines(engine))
    said = estimated_line(c.get("estimated"))
    if said:
        items.append(("estimated", said))
    rows = "".join(f"<dt>{esc(name)}</dt><dd>{esc(value)}</dd>" for name, value in items)
    warnings = c.get("warnings") or []
    listed = "".join(f"<li>{esc(w)}</li>" for w in warnings)
    return (
        f'<section id="collection"><h2>What latprof could see</h2><dl class="seen">{rows}</dl>'
        + (f'<h3>Warnings</h3><ul class="warnings">{listed}</ul>' if warnings else "")
        + "</section>\n"
    )
