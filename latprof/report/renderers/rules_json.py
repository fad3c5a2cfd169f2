"""`latprof rules --format json`: the latprof.rules/1 document, every rule's documentation and thresholds."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, TextIO

from latprof.report.renderers import RULES

if TYPE_CHECKING:
    from latprof.report.catalogue import Catalogue


@RULES.register("json")
def render_json(catalogue: Catalogue, out: TextIO) -> None:
    json.dump({"schema": "latprof.rules/1", "config": catalogue.config_path, "rules": catalogue.rules}, out, indent=2)
    out.write("\n")
