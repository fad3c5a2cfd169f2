"""`latprof rules`: one line per rule; `latprof rules explain ID`: one rule's whole documentation."""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from latprof.report.renderers import RULES

if TYPE_CHECKING:
    from latprof.report.catalogue import Catalogue, RuleEntry


@RULES.register("text")
def render_text(catalogue: Catalogue, out: TextIO) -> None:
    """Id, layer and summary of each rule, its level unless `error`, and whether it is disabled."""
    for item in catalogue.rules:
        state = "" if item["enabled"] else "  (disabled)"
        level = "" if item["severity"] == "error" else f"  [{item['severity']}]"
        out.write(f"{item['id']:<24} {item['layer']:<12} {item['summary']}{level}{state}\n")
    if catalogue.config_path:
        out.write(f"\n(as configured by {catalogue.config_path})\n")


def explain(item: RuleEntry, out: TextIO) -> None:
    """`latprof rules explain ID`: the whole documentation and the thresholds with their values."""
    out.write(f"{item['id']}  (layer {item['layer']})\n{item['summary']}\n")
    for section, text in item["docs"].items():
        out.write(f"\n{section}:\n")
        for line in text.splitlines():
            out.write(f"    {line}\n" if line.strip() else "\n")
    out.write("\nThresholds:\n")
    if not item["thresholds"]:
        out.write("    (none)\n")
    for t in item["thresholds"]:
        configured = f"  (configured; default {t['default']!r})" if t["configured"] else ""
        out.write(f"    {t['name']} = {t['value']!r}  ({t['type']}){configured}\n")
    if not item["enabled"] or item["severity"] != "error":
        out.write(f"\nConfigured: {'enabled' if item['enabled'] else 'disabled'}, severity {item['severity']}\n")
