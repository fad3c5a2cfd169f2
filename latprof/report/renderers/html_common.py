"""What the HTML renderers (`report_html`, `diff_html`) share: the page, its style and script, the
layers' colours, and the parts both pages show (verdict, layer table, evidence, p99 over time).

The page is one self-contained file: no network, no external resource. Its Content-Security-Policy
is `default-src 'none'` plus the hashes of its own one style sheet and one script, so nothing else
runs or loads even if a capture's text got past the escaping. Everything a capture supplies goes
through `esc`. Charts are plain SVG written here (no chart library): they draw with JavaScript
off, print, and add nothing to trust; the script only shows a clicked element's details.
SVG elements carry their details in a `<title>` (the browser's own tooltip), so hovering works
without the script.
"""

from __future__ import annotations

import base64
import hashlib
import html
from typing import Callable, Iterable, Sequence

from latprof import __version__
from latprof.engine import Finding, fmt_ms
from latprof.layers import DESCRIPTIONS, LAYERS
from latprof.report.evidence import evidence_rows, with_unit
from latprof.report.model import Report, WindowRow
from latprof.report.pictures import TailWindow

#: One colour per layer (colour-blind-safe hues first, for the layers that most often own a tail).
LAYER_COLOURS: dict[str, str] = {
    "queue": "#e69f00",
    "event_loop": "#cc79a7",
    "db.pool": "#d55e00",
    "db.query": "#f0b27a",
    "http.pool": "#8c510a",
    "provider": "#0072b2",
    "model": "#56b4e9",
    "tool": "#009e73",
    "retry": "#b2182b",
    "lock": "#7b3294",
    "app": "#9e9e9e",
    "unattributed": "#d9d9d9",
}
#: Segments with no layer of their own or above (markers such as a connection hold).
NO_LAYER_COLOUR = "#ffffff"

_STYLE = """
:root { color-scheme: light; --fg: #1d1d1f; --dim: #6e6e73; --line: #d2d2d7; --bg: #ffffff; --card: #f5f5f7; }
* { box-sizing: border-box; }
body { margin: 0 auto; padding: 24px 32px 48px; max-width: 1200px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI",
       Roboto, "Helvetica Neue", Arial, sans-serif; color: var(--fg); background: var(--bg); }
header.top { color: var(--dim); font-size: 13px; border-bottom: 1px solid var(--line); padding-bottom: 8px; }
header.top b { color: var(--fg); }
h1 { font-size: 22px; margin: 16px 0 4px; }
h2 { font-size: 17px; margin: 32px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 0 0 6px; }
.dim, .note { color: var(--dim); }
.note { font-size: 12px; }
section.verdict { border-left: 6px solid var(--line); padding: 4px 0 8px 16px; margin-top: 12px; }
section.verdict.layer { border-color: #b2182b; }
section.verdict.unattributed { border-color: #7b3294; }
section.verdict.no_tail, section.verdict.not_saturated { border-color: #1a9850; }
section.verdict.too_few_requests, section.verdict.at_capacity { border-color: #e69f00; }
.verdict .label { font-size: 13px; text-transform: uppercase; letter-spacing: 0.06em; color: var(--dim); }
.verdict .sentence { font-size: 19px; font-weight: 600; margin: 2px 0 6px; }
table { border-collapse: collapse; }
th, td { padding: 3px 10px 3px 0; text-align: left; vertical-align: top; }
th { font-weight: 600; border-bottom: 1px solid var(--line); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.owner td { font-weight: 600; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px; vertical-align: baseline;
          border: 1px solid rgba(0,0,0,0.25); }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 12px; color: var(--dim); margin: 6px 0; }
.legend svg { vertical-align: -1px; margin-right: 4px; }
article.finding { background: var(--card); border-radius: 8px; padding: 12px 16px; margin: 10px 0; }
article.finding .head { display: flex; flex-wrap: wrap; gap: 4px 14px; align-items: baseline; }
.sev { font-size: 12px; font-weight: 700; text-transform: uppercase; }
.sev.critical { color: #b2182b; } .sev.warning { color: #b35806; } .sev.info { color: #2166ac; }
.evidence { margin: 8px 0; font-size: 13px; }
.evidence td { padding: 1px 14px 1px 0; }
.fix { margin: 6px 0 0; }
.fix b { color: #1a7f37; }
.wf-row { margin: 14px 0 18px; }
.wf-head { display: flex; flex-wrap: wrap; gap: 2px 12px; align-items: baseline; font-size: 13px; }
.role { font-size: 11px; font-weight: 700; text-transform: uppercase; padding: 1px 6px; border-radius: 4px; }
.role.tail { background: #fde0dd; color: #99000d; } .role.median { background: #e5f5e0; color: #00441b; }
.role.explained { background: #e8eaf6; color: #1a237e; }
.wf-row:target .wf-head { background: #fff7bc; }
svg text { font: 11px system-ui, sans-serif; fill: #1d1d1f; }
svg text.axis { fill: #6e6e73; }
svg .seg, svg .piece, svg .win { cursor: pointer; }
svg .seg:hover, svg .piece:hover, svg .win:hover { stroke: #000; stroke-width: 1; }
#detail { position: sticky; bottom: 0; background: #fffbe6; border: 1px solid #e6d77a; border-radius: 6px; padding: 6px 10px;
          white-space: pre-wrap; font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; margin-top: 12px; }
#detail[hidden] { display: none; }
ul.warnings li { color: #8a5300; }
dl.seen { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 0; }
dl.seen dt { color: var(--dim); }
dl.seen dd { margin: 0; }
.cols { display: grid; grid-template-columns: 1fr 1fr; gap: 24px; }
.up { color: #b2182b; } .down { color: #1a7f37; }
footer { margin-top: 40px; color: var(--dim); font-size: 12px; border-top: 1px solid var(--line); padding-top: 8px; }
"""

# Shows the details of a clicked bar, stretch or window (its <title>, already the tooltip) in a
# panel that stays in view; textContent, never innerHTML.
_SCRIPT = """
(function () {
  var panel = document.getElementById("detail");
  if (!panel) { return; }
  document.addEventListener("click", function (event) {
    var node = event.target;
    if (!node || !node.closest) { return; }
    var item = node.closest(".seg, .piece, .win");
    if (!item) { return; }
    var title = item.querySelector("title");
    panel.textContent = title ? title.textContent : "";
    panel.hidden = false;
  });
})();
"""


def esc(value: object) -> str:
    """Text from a capture or a report, safe in an element's content and in a quoted attribute."""
    return html.escape(str(value), quote=True)


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def content_security_policy() -> str:
    """`default-src 'none'`, and only the page's own style sheet and script by their hashes."""
    return f"default-src 'none'; style-src {_sha256(_STYLE)}; script-src {_sha256(_SCRIPT)}; base-uri 'none'; form-action 'none'"


def page(title: str, body: Iterable[str]) -> str:
    """The whole document: `body` (already escaped HTML) with the style, the script and the policy."""
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{esc(content_security_policy())}\">\n",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
        "<meta name=\"referrer\" content=\"no-referrer\">\n",
        f"<title>{esc(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n",
        *body,
        "\n<div id=\"detail\" hidden></div>\n",
        f"<footer>latprof {esc(__version__)} · report schema latprof.report/1 · one file: no network, nothing loaded</footer>\n",
        f"<script>{_SCRIPT}</script>\n</body>\n</html>\n",
    ])  # fmt: skip


def colour(layer: str | None) -> str:
    return LAYER_COLOURS.get(layer or "", NO_LAYER_COLOUR)


def swatch(layer: str | None) -> str:
    """A small square of the layer's colour (SVG: a page without style attributes)."""
    return (f'<svg width="10" height="10" aria-hidden="true"><rect width="10" height="10" rx="2" fill="{colour(layer)}"'
            ' stroke="rgba(0,0,0,0.3)"/></svg>')  # fmt: skip


def legend(layers: Iterable[str | None]) -> str:
    """The colours of `layers` (in the vocabulary's order; None: no layer)."""
    wanted = set(layers)
    items = [f"<span>{swatch(layer)}{esc(layer)}</span>" for layer in LAYERS if layer in wanted]
    if None in wanted:
        items.append(f"<span>{swatch(None)}no layer (a marker)</span>")
    return f'<div class="legend">{"".join(items)}</div>' if items else ""


def ms(value: float | None) -> str:
    return "-" if value is None else esc(fmt_ms(value))


def verdict_label(report: Report) -> str:
    labels = {"unattributed": "unattributed", "no_tail": "no tail", "too_few_requests": "no verdict",
              "not_saturated": "not saturated", "at_capacity": "at capacity"}  # fmt: skip
    return labels.get(report.verdict.status) or report.verdict.layer or report.verdict.status


def verdict_section(report: Report, heading: str = "h1", *, link_rule: bool = True) -> str:
    """The verdict first: its label, the sentence, confidence and rule (a link to its finding's card when the page has it)."""
    verdict = report.verdict
    details = [f"confidence {verdict.confidence:.2f}"]
    if verdict.share_of_tail_excess is not None:
        details.append(f"{verdict.share_of_tail_excess:.0%} of the tail excess")
    if verdict.rule:
        details.append(f'rule <a href="#finding-{esc(verdict.rule)}">{esc(verdict.rule)}</a>' if link_rule else f"rule {esc(verdict.rule)}")
    layer = f"{swatch(verdict.layer)} " if verdict.layer else ""
    return (
        f'<section class="verdict {esc(verdict.status)}" id="verdict">'
        f'<div class="label">Verdict · {layer}{esc(verdict_label(report))}</div>'
        f'<{heading} class="sentence">{esc(verdict.summary)}</{heading}>'
        f'<div class="dim">{" · ".join(details)}</div></section>\n'
    )


def share_bar(share: float, layer: str, width: int = 160) -> str:
    filled = max(0.0, min(1.0, share)) * width
    return (f'<svg width="{width}" height="12" role="img" aria-label="{share:.0%}"><rect width="{width}" height="12" fill="#eeeeee"/>'
            f'<rect width="{filled:.1f}" height="12" fill="{colour(layer)}"/></svg>')  # fmt: skip


def layer_table(report: Report) -> str:
    """The layer table with shares of the tail excess (attach: of time per second)."""
    if not report.layers:
        return ""
    attach = report.source.get("kind") == "attach"
    head = "per second" if attach else "tail excess"
    rows = []
    for row in report.layers:
        share = row.share_of_tail_excess
        owner = ' class="owner"' if report.verdict.layer == row.layer else ""
        rows.append(
            f"<tr{owner}><td>{swatch(row.layer)}{esc(row.layer)}</td><td class=\"num\">{ms(row.p50_ms)}</td>"
            f"<td class=\"num\">{ms(row.p99_ms)}</td>"
            f"<td class=\"num\">{ms(row.tail_excess_ms) if row.tail_excess_ms > 0 else '-'}</td>"
            f"<td class=\"num\">{f'{share:.0%}' if share > 0 else '-'}</td><td>{share_bar(share, row.layer)}</td>"
            f"<td class=\"dim\">{esc(DESCRIPTIONS.get(row.layer, ''))}</td></tr>"
        )
    return (
        '<section id="layers"><h2>Layers</h2><table class="layers"><thead><tr><th>layer</th><th class="num">p50</th>'
        f'<th class="num">p99</th><th class="num">{head}</th><th class="num">share</th><th></th><th>what it is</th></tr>'
        f"</thead><tbody>{''.join(rows)}</tbody></table></section>\n"
    )


def evidence_table(evidence: object) -> str:
    """A finding's evidence: name, value and unit, one row each (the same data as the JSON)."""
    if not isinstance(evidence, dict) or not evidence:
        return ""
    rows = "".join(f"<tr><td>{esc(row.name)}</td><td>{esc(with_unit(row.value, row.unit))}</td></tr>" for row in evidence_rows(evidence))
    return f'<table class="evidence"><tbody>{rows}</tbody></table>'


def finding_card(finding: Finding, *, per_second: bool = False, drawn: Sequence[str] = ()) -> str:
    """A finding as a card: head, summary, evidence table, links to its drawn example requests, fix."""
    head = [f'<span class="sev {esc(finding.severity)}">{esc(finding.severity)}</span>', f"<h3>{esc(finding.rule)}</h3>"]
    if finding.layer:
        head.append(f"<span>{swatch(finding.layer)}{esc(finding.layer)}</span>")
    if finding.impact_ms > 0:
        head.append(f"<span>impact {esc(fmt_ms(finding.impact_ms))}{'/s' if per_second else ''}</span>")
    inferred = " (inferred)" if finding.evidence.get("inferred") else ""
    head.append(f'<span class="dim">confidence {finding.confidence:.2f}{inferred}</span>')
    examples = [str(i) for i in finding.evidence.get("example_request_ids") or ()]
    links = ""
    if examples:
        shown = [f'<a href="#req-{esc(i)}">{esc(i)}</a>' if i in drawn else esc(i) for i in examples]
        links = f'<p class="dim">example requests: {", ".join(shown)}</p>'
    return (
        f'<article class="finding" id="finding-{esc(finding.rule)}"><div class="head">{"".join(head)}</div>'
        f"<p>{esc(finding.summary)}</p>{evidence_table(dict(finding.evidence))}{links}"
        f'<p class="fix"><b>Fix:</b> {esc(finding.fix)}</p></article>\n'
    )


def _nice_top(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above `value` (an axis's top)."""
    if value <= 0:
        return 1.0
    step = 10 ** len(str(int(value))) / 100 if value >= 1 else 0.01
    for multiple in (1, 2, 2.5, 5, 10, 20, 25, 50, 100):
        if step * multiple >= value:
            return step * multiple
    return value


def tail_over_time(windows: Sequence[TailWindow], window_s: float | None, p50_ms: float | None) -> str:
    """p99 over time: per window, its slowest 1%'s mean time stacked by layer, and the window's p99."""
    if not any(w.requests for w in windows):
        return ""
    width, height, left, bottom, top = 960, 220, 56, 22, 8
    top_ms = _nice_top(max(max((w.p99_ms or 0.0) for w in windows), max(sum(w.tail_layers_ms.values()) for w in windows)))
    plot_h = height - bottom - top
    step = (width - left - 4) / len(windows)

    def y(value: float) -> float:
        return top + plot_h - value / top_ms * plot_h

    parts = [_y_axis(top_ms, y, left, width, "ms")]
    t0 = windows[0].start_unix_s
    layers_seen: set[str | None] = set()
    points = []
    for k, w in enumerate(windows):
        x = left + k * step
        label = f"+{w.start_unix_s - t0:g} s: {w.requests} requests"
        if w.p99_ms is None:
            continue
        label += f", p99 {fmt_ms(w.p99_ms)}; the slowest {w.tail_requests} took, on average:"
        base = 0.0
        stack = []
        for layer in LAYERS:
            value = w.tail_layers_ms.get(layer)
            if not value:
                continue
            layers_seen.add(layer)
            stack.append(f'<rect x="{x + 1:.1f}" y="{y(base + value):.1f}" width="{max(step - 2, 1):.1f}" '
                         f'height="{value / top_ms * plot_h:.1f}" fill="{colour(layer)}" data-layer="{esc(layer)}"/>')  # fmt: skip
            label += f"\n  {layer} {fmt_ms(value)}"
            base += value
        parts.append(f'<g class="win">{"".join(stack)}<rect x="{x:.1f}" y="{top}" width="{step:.1f}" height="{plot_h}" '
                     f'fill="transparent"/><title>{esc(label)}</title></g>')  # fmt: skip
        points.append(f"{x + step / 2:.1f},{y(w.p99_ms):.1f}")
    if points:
        parts.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="#1d1d1f" stroke-width="1.5"/>')
        parts.extend(f'<circle cx="{p.split(",")[0]}" cy="{p.split(",")[1]}" r="2.5" fill="#1d1d1f"/>' for p in points)
    if p50_ms is not None and p50_ms <= top_ms:
        parts.append(f'<line x1="{left}" x2="{width - 4}" y1="{y(p50_ms):.1f}" y2="{y(p50_ms):.1f}" stroke="#1a9850" '
                     f'stroke-dasharray="4 3"/><text x="{width - 6}" y="{y(p50_ms) - 3:.1f}" text-anchor="end" class="axis">'
                     f"p50 {esc(fmt_ms(p50_ms))}</text>")  # fmt: skip
    parts.append(_x_axis(windows[-1].end_unix_s - t0, left, width, height - bottom))
    size = f"{window_s:g} s windows" if window_s else "windows"
    return (
        f'<section id="over-time"><h2>p99 over time</h2><p class="dim">Per {esc(size)}: the bars stack the mean time per layer of '
        "each window's slowest 1% (at least one request); the line is the window's p99"
        + (", the dashed line the whole capture's p50" if p50_ms is not None else "") + ".</p>"
        + legend(layers_seen)
        + f'<svg viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="p99 over time">{"".join(parts)}</svg>'
        "</section>\n"
    )  # fmt: skip


def _y_axis(top_value: float, scale: Callable[[float], float], left: int, width: int, unit: str) -> str:
    out = []
    for k in range(5):
        value = top_value * k / 4
        at = scale(value)
        text = fmt_ms(value) if unit == "ms" else f"{value:g}"
        out.append(f'<line x1="{left}" x2="{width - 4}" y1="{at:.1f}" y2="{at:.1f}" stroke="#eeeeee"/>'
                   f'<text x="{left - 4}" y="{at + 4:.1f}" text-anchor="end" class="axis">{esc(text)}</text>')  # fmt: skip
    return "".join(out)


def _x_axis(span_s: float, left: int, width: int, at: float) -> str:
    out = [f'<line x1="{left}" x2="{width - 4}" y1="{at:.1f}" y2="{at:.1f}" stroke="#9e9e9e"/>']
    for k in range(6):
        value = span_s * k / 5
        x = left + (width - 4 - left) * k / 5
        label = f"{value:.0f}" if span_s >= 10 else f"{value:.1f}"
        out.append(f'<text x="{x:.1f}" y="{at + 14:.1f}" text-anchor="middle" class="axis">+{label} s</text>')
    return "".join(out)


def seconds_chart(rows: Sequence[WindowRow]) -> str:
    """Attach captures, per second: busy workers coloured by the layer most were in, the accept queue."""
    seconds = [w.extra for w in rows if w.extra]
    if len(seconds) < 2:
        return ""
    asyncio = any(s.get("requests_in_flight") is not None for s in seconds)
    key = "requests_in_flight" if asyncio else "busy_workers"
    values = [float(s.get(key) or 0) for s in seconds]
    queue = [float(s.get("accept_queue") or 0) for s in seconds]
    workers = max((float(s.get("workers") or 0) for s in seconds), default=0.0)
    width, height, left, bottom, top = 960, 200, 56, 22, 8
    top_value = _nice_top(max(max(values), max(queue), workers, 1.0))
    plot_h = height - bottom - top
    step = (width - left - 4) / len(seconds)

    def y(value: float) -> float:
        return top + plot_h - value / top_value * plot_h

    parts = [_y_axis(top_value, y, left, width, "")]
    layers_seen: set[str | None] = set()
    for k, s in enumerate(seconds):
        layer = s.get("top_layer")
        layers_seen.add(layer)
        x = left + k * step
        what = "requests in flight" if asyncio else f"of {s.get('workers')} workers busy"
        label = f"+{k} s: {values[k]:g} {what}, mostly in {layer or '-'}; accept queue {queue[k]:g}"
        if s.get("loop_busy_share") is not None:
            label += f"; event loop busy {float(s['loop_busy_share']):.0%}"
        parts.append(f'<g class="win"><rect x="{x + 1:.1f}" y="{y(values[k]):.1f}" width="{max(step - 2, 1):.1f}" '
                     f'height="{values[k] / top_value * plot_h:.1f}" fill="{colour(layer)}" data-layer="{esc(layer or "")}"/>'
                     f"<title>{esc(label)}</title></g>")  # fmt: skip
    parts.append(f'<polyline points="{" ".join(f"{left + (k + 0.5) * step:.1f},{y(q):.1f}" for k, q in enumerate(queue))}" '
                 'fill="none" stroke="#b2182b" stroke-width="1.5"/>')  # fmt: skip
    if workers and not asyncio:
        parts.append(f'<line x1="{left}" x2="{width - 4}" y1="{y(workers):.1f}" y2="{y(workers):.1f}" stroke="#1d1d1f" '
                     f'stroke-dasharray="4 3"/><text x="{width - 6}" y="{y(workers) - 3:.1f}" text-anchor="end" class="axis">'
                     f"{workers:g} workers</text>")  # fmt: skip
    parts.append(_x_axis(float(len(seconds)), left, width, height - bottom))
    what = "requests in flight (bars)" if asyncio else "busy workers (bars, coloured by the layer most of them were in)"
    return (
        f'<section id="over-time"><h2>Second by second</h2><p class="dim">{what}; the red line is the accept queue.</p>'
        + legend(layers_seen)
        + f'<svg viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="per second">{"".join(parts)}</svg></section>\n'
    )
