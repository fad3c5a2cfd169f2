"""`latprof rules --format markdown`: the whole catalogue as one page (docs/rules.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from latprof.report.renderers import RULES

if TYPE_CHECKING:
    from latprof.report.catalogue import Catalogue


@RULES.register("markdown")
def render_markdown(catalogue: Catalogue, out: TextIO) -> None:
    """A table of every rule, then a section per rule: its documentation and thresholds."""
    items = catalogue.rules
    out.write("# latprof rules\n\n")
    if catalogue.config_path:
        out.write(f"Thresholds as configured by `{catalogue.config_path}`.\n\n")
    out.write("| rule | layer | what it detects |\n|---|---|---|\n")
    for item in items:
        out.write(f"| [`{item['id']}`](#{item['id']}) | `{item['layer']}` | {_cell(item['summary'])} |\n")
    for item in items:
        status = [] if item["enabled"] else ["disabled"]
        if item["severity"] != "error":
            status.append(f"severity {item['severity']}")
        out.write(f"\n## {item['id']}\n\nLayer `{item['layer']}`; {item['source']}{'; ' + ', '.join(status) if status else ''}.\n\n")
        out.write(f"{item['summary']}\n")
        for section, text in item["docs"].items():
            if text:
                out.write(f"\n### {section}\n\n{text}\n")
        if item["thresholds"]:
            out.write("\n### Thresholds\n\n| name | type | default | value |\n|---|---|---|---|\n")
            for t in item["thresholds"]:
                out.write(f"| `{t['name']}` | {t['type']} | {t['default']!r} | {t['value']!r}{' (configured)' if t['configured'] else ''} |\n")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
