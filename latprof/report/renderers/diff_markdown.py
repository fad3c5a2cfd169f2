"""`latprof diff --format markdown`: GitHub-flavoured markdown for a pull-request comment or `$GITHUB_STEP_SUMMARY`."""

from __future__ import annotations

from typing import TextIO

from latprof.ci.diff import Diff, signed_ms, signed_pct, verdict_label
from latprof.report.renderers import DIFF
from latprof.report.renderers.diff_common import layer_cells, ms, regression_line, tail_header


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


@DIFF.register("markdown")
def render_markdown(diff: Diff, out: TextIO) -> None:
    """GitHub-flavoured markdown for a pull-request comment or `$GITHUB_STEP_SUMMARY`."""
    out.write("### latprof diff\n\n")
    out.write(f"**{_md(diff.summary)}**\n\n")
    line = regression_line(diff)
    if line:
        out.write(f"{_md(line)}\n\n")
    out.write("| | before | after | change |\n|---|---:|---:|---:|\n")
    out.write(f"| input | `{_md(diff.before_input)}` | `{_md(diff.after_input)}` | |\n")
    out.write(f"| requests | {diff.before.window.get('requests', '-')} | {diff.after.window.get('requests', '-')} | |\n")
    for name, change in diff.latency_ms.items():
        delta, pct = change.delta, change.pct
        moved = "" if delta is None else signed_ms(delta) + ("" if pct is None else f" ({signed_pct(pct)})")
        out.write(f"| {name} | {ms(change.before)} | {ms(change.after)} | {moved} |\n")
    out.write(f"| verdict | {verdict_label(diff.before.verdict)} | {verdict_label(diff.after.verdict)} | |\n")
    cells = layer_cells(diff)
    if cells:
        out.write(f"\n| layer | p99 before → after | tail share before → after | {tail_header(diff)} |\n")
        out.write("|---|---:|---:|---:|\n")
        for layer, p99, share, tail in cells:
            out.write(f"| `{layer}` | {p99} | {share} | {tail} |\n")
    groups = (
        ("New findings", diff.findings.appeared),
        ("Findings gone", diff.findings.disappeared),
        ("Findings in both", diff.findings.unchanged),
    )
    for title, refs in groups:
        if refs:
            out.write(f"\n**{title}**\n\n")
            for ref in refs:
                out.write(f"- `{ref.rule}` ({ref.layer or '-'}): {_md(ref.summary)}\n")
