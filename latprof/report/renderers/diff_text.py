"""`latprof diff --format text`: the sentence, both sides, a layer table and the findings that came and went."""

from __future__ import annotations

from typing import TextIO

from latprof.ci.diff import Diff
from latprof.report.renderers import DIFF
from latprof.report.renderers.diff_common import layer_cells, regression_line, side_line, tail_header


@DIFF.register("text")
def render_text(diff: Diff, out: TextIO) -> None:
    """The sentence, both sides, a layer table and the findings that came and went."""
    out.write(diff.summary + "\n\n")
    out.write(f"before  {side_line(diff.before, diff.before_input)}\n")
    out.write(f"after   {side_line(diff.after, diff.after_input)}\n")
    rows = [("layer", "p99 before → after", "tail share before → after", tail_header(diff)), *layer_cells(diff)]
    if len(rows) > 1:
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        out.write("\n")
        for row in rows:
            out.write(
                f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]:>{widths[3]}}".rstrip()
                + "\n"
            )
    lines = (
        [f"+ {f.rule} ({f.layer or '-'}): {f.summary}" for f in diff.findings.appeared]
        + [f"- {f.rule} ({f.layer or '-'}): {f.summary}" for f in diff.findings.disappeared]
        + [f"= {f.rule} ({f.layer or '-'})" for f in diff.findings.unchanged]
    )
    if lines:
        out.write("\nfindings (+ new, - gone, = in both)\n")
        out.write("".join(line + "\n" for line in lines))
    failure = regression_line(diff)
    if failure:
        out.write(f"\n{failure}\n")
