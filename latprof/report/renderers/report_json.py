"""The report-v1 JSON renderer."""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

import orjson

from latprof.report.renderers import REPORT

if TYPE_CHECKING:
    from latprof.report.model import Report


@REPORT.register("json")
def render_json(report: Report, out: TextIO) -> None:
    out.write(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())
    out.write("\n")
