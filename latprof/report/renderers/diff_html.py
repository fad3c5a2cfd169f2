"""`latprof diff --format html`: before and after side by side, as one self-contained page.

The sentence first; then each side's verdict and latency; the change of each layer's time in the
tail as a bar left (less) or right (more) of zero; the findings that appeared, went or stayed;
and each side's p99 over time where its report has windows.
"""

from __future__ import annotations

from typing import TextIO

from latprof.ci.diff import Diff, signed_ms, signed_pct
from latprof.report.model import Report
from latprof.report.renderers import DIFF
from latprof.report.renderers.diff_common import ms, regression_line, share, tail_header
from latprof.report.renderers.html_common import colour, esc, page, swatch, verdict_section

_BAR_HALF = 140


@DIFF.register("html")
def render_html(diff: Diff, out: TextIO) -> None:
    out.write(page(f"latprof diff: {diff.before_input} → {diff.after_input}", _body(diff)))


def _body(diff: Diff) -> list[str]:
    parts = [
        f'<header class="top"><b>latprof diff</b> · before {esc(diff.before_input)} → after {esc(diff.after_input)}</header>\n',
        f'<section class="verdict {"layer" if diff.material else "no_tail"}" id="summary">'
        f'<div class="label">{"A material change" if diff.material else "No material change"}</div>'
        f'<h1 class="sentence">{esc(diff.summary)}</h1></section>\n',
        '<section id="sides"><div class="cols">',
        _side("Before", diff.before, diff.before_input),
        _side("After", diff.after, diff.after_input),
        "</div></section>\n",
        _latency(diff),
        _layers(diff),
        _findings(diff),
        _over_time(diff),
    ]
    failure = regression_line(diff)
    if failure:
        parts.append(f'<section id="regression"><h2>Regression check</h2><p>{esc(failure)}</p></section>\n')
    return parts


def _side(title: str, report: Report, label: str) -> str:
    requests = report.window.get("requests")
    return (
        f'<div class="side" id="{title.lower()}"><h2>{esc(title)}: {esc(label)}</h2>'
        f'<p class="dim">{"?" if requests is None else f"{requests:,}"} requests</p>'
        + verdict_section(report, heading="p", link_rule=False)
        + "</div>"
    )


def _latency(diff: Diff) -> str:
    rows = []
    for name, change in diff.latency_ms.items():
        pct = change.pct
        css = "" if pct is None or abs(pct) < 5 else (' class="up"' if pct > 0 else ' class="down"')
        delta = change.delta
        rows.append(f'<tr><td>{esc(name)}</td><td class="num">{ms(change.before)}</td><td class="num">{ms(change.after)}</td>'
                    f'<td class="num"{css}>{"-" if delta is None else esc(signed_ms(delta))}</td>'
                    f'<td class="num"{css}>{"-" if pct is None else esc(signed_pct(pct))}</td></tr>')  # fmt: skip
    return ('<section id="latency"><h2>Latency</h2><table><thead><tr><th></th><th class="num">before</th>'
            '<th class="num">after</th><th class="num">change</th><th class="num">%</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></section>\n")  # fmt: skip


def _layers(diff: Diff) -> str:
    if not diff.layers:
        return ""
    biggest = max((abs(c.tail_delta_ms) for c in diff.layers), default=0.0) or 1.0
    rows = []
    for c in diff.layers:
        delta = c.tail_delta_ms
        length = abs(delta) / biggest * _BAR_HALF
        x = _BAR_HALF if delta >= 0 else _BAR_HALF - length
        bar = (f'<svg width="{2 * _BAR_HALF}" height="12" role="img" aria-label="{esc(signed_ms(delta))}">'
               f'<rect x="{x:.1f}" width="{max(length, 0.5):.1f}" height="12" fill="{colour(c.layer)}"/>'
               f'<line x1="{_BAR_HALF}" x2="{_BAR_HALF}" y1="0" y2="12" stroke="#1d1d1f"/></svg>')  # fmt: skip
        css = ' class="up"' if delta > 0 else ' class="down"' if delta < 0 else ""
        rows.append(f"<tr><td>{swatch(c.layer)}{esc(c.layer)}</td><td class=\"num\">{ms(c.p99_ms.before)} → {ms(c.p99_ms.after)}</td>"
                    f"<td class=\"num\">{esc(share(c.share_of_tail_excess.before))} → {esc(share(c.share_of_tail_excess.after))}</td>"
                    f"<td class=\"num\"{css}>{esc(signed_ms(delta))}</td><td>{bar}</td></tr>")  # fmt: skip
    return ('<section id="layers"><h2>Layers</h2><p class="dim">The change of each layer\'s time in the tail: left of the line '
            "less, right of it more.</p><table><thead><tr><th>layer</th><th class=\"num\">p99 before → after</th>"
            f"<th class=\"num\">tail share before → after</th><th class=\"num\">{esc(tail_header(diff))}</th><th></th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></section>\n")  # fmt: skip


def _findings(diff: Diff) -> str:
    groups = (("appeared", "New in after", diff.findings.appeared), ("disappeared", "Gone in after", diff.findings.disappeared),
              ("unchanged", "In both", diff.findings.unchanged))  # fmt: skip
    parts = ['<section id="findings"><h2>Findings</h2>']
    if not any(found for _, _, found in groups):
        parts.append('<p class="dim">No finding on either side.</p>')
    for key, title, found in groups:
        if not found:
            continue
        items = "".join(
            f'<li class="finding-ref" data-rule="{esc(f.rule)}">{swatch(f.layer)}<b>{esc(f.rule)}</b> ({esc(f.layer or "-")}): {esc(f.summary)}</li>'
            for f in found
        )
        parts.append(f'<h3>{esc(title)}</h3><ul class="{key}">{items}</ul>')
    parts.append("</section>\n")
    return "".join(parts)


def _over_time(diff: Diff) -> str:
    """Each side's p99 per window as a small line chart on one shared scale."""
    sides = [(name, [w.p99_ms for w in report.p99_over_time]) for name, report in (("before", diff.before), ("after", diff.after))]
    values = [v for _, points in sides for v in points if v is not None]
    if len(values) < 2:
        return ""
    width, height, pad = 460, 120, 6
    top = max(values) or 1.0
    charts = []
    for name, points in sides:
        step = (width - 2 * pad) / max(len(points) - 1, 1)
        line = " ".join(f"{pad + k * step:.1f},{height - pad - (p / top) * (height - 2 * pad):.1f}"
                        for k, p in enumerate(points) if p is not None)  # fmt: skip
        charts.append(f'<div><h3>{esc(name)}</h3><svg viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="p99 {esc(name)}">'
                      f'<rect width="{width}" height="{height}" fill="#fafafa"/><polyline points="{line}" fill="none" stroke="#1d1d1f" '
                      f'stroke-width="1.5"/><text x="{pad}" y="14" class="axis">top {esc(ms(top))}</text></svg></div>')  # fmt: skip
    return f'<section id="over-time"><h2>p99 over time</h2><div class="cols">{"".join(charts)}</div></section>\n'
