"""`latprof diff --format json`: the `latprof.diff/1` document (`latprof.ci.diff` documents its shape)."""

from __future__ import annotations

from typing import TextIO

import orjson

from latprof.ci.diff import Diff
from latprof.report.renderers import DIFF


@DIFF.register("json")
def render_json(diff: Diff, out: TextIO) -> None:
    """The `latprof.diff/1` dict, indented."""
    out.write(orjson.dumps(diff.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())
    out.write("\n")
