"""`latprof check --format text`: the verdict, one line per check, then the tally."""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from latprof.report.renderers import CHECK
from latprof.report.renderers.check_common import status, tally

if TYPE_CHECKING:
    from latprof.ci.checks import CheckRun


@CHECK.register("text")
def render_text(run: CheckRun, out: TextIO) -> None:
    """The verdict, one line per check, then the tally."""
    out.write(f"verdict: {run.report.verdict.summary}\n")
    for warning in run.report.collection.get("warnings") or ():  # a torn capture, dropped events: what the checks saw
        out.write(f"warning: {warning}\n")
    width = min(40, max((len(r.title) for r in run.results), default=0))
    for result in run.results:
        # Messages are one sentence, but a custom rule's may not be: keep one line per check.
        message = " ".join(result.message.split())
        out.write(f"{status(result)}  {result.title.ljust(width)}  {message}".rstrip() + "\n")
    out.write(tally(run) + "\n")
