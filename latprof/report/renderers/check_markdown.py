"""`latprof check --format markdown`: a heading, the verdict, a table of the checks and the tally (also GitHub's step summary)."""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from latprof.report.renderers import CHECK
from latprof.report.renderers.check_common import format_value, status, tally

if TYPE_CHECKING:
    from latprof.ci.checks import CheckRun

_MARKDOWN_MARKS = {"PASS": "✅", "FAIL": "❌", "WARN": "⚠️", "SKIP": "⏭️"}


@CHECK.register("markdown")
def render_markdown(run: CheckRun, out: TextIO) -> None:
    out.write(to_markdown(run))


def to_markdown(run: CheckRun) -> str:
    """A heading, the verdict, a table of the checks and the tally (also the GitHub step summary)."""
    lines = [
        f"## latprof check: {'failed' if run.failed else 'passed'}",
        "",
        f"**Verdict:** {_md_cell(run.report.verdict.summary)}",
        "",
    ]
    warnings = run.report.collection.get("warnings") or []
    if warnings:
        lines += [f"> warning: {_md_cell(w)}" for w in warnings] + [""]
    if run.results:
        lines += ["| | check | observed | threshold | message |", "|---|---|---|---|---|"]
        for r in run.results:
            cells = [
                _MARKDOWN_MARKS[status(r)],
                _md_cell(r.title),
                _md_cell(format_value(r.observed, r.unit)),
                _md_cell(format_value(r.threshold, r.unit)),
                _md_cell(r.message),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines.append(tally(run))
    return "\n".join(lines) + "\n"


def _md_cell(text: str) -> str:
    # `|` would end the cell and a newline the row; `<`/`&` would be taken as HTML by GitHub.
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = text.replace("\\", "\\\\").replace("|", "\\|")
    return "<br>".join(line.strip() for line in text.splitlines())
