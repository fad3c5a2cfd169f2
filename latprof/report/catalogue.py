"""The rule catalogue: every rule's id, layer, documentation and thresholds (with the values a config gives them), as text, JSON or markdown."""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence, TextIO

from latprof.ci.config import Config
from latprof.engine import DOC_SECTIONS, ENTRY_POINT_GROUP, Rule, discover_rules


def entries(rule_classes: Sequence[type[Rule]], config: Config) -> list[dict[str, Any]]:
    """One entry per rule: its documentation, whether the config enables it, at which level, and
    each threshold's default and configured value (`value`: what the rule runs with)."""
    builtin = {cls.id for cls in discover_rules()}
    out: list[dict[str, Any]] = []
    for cls in rule_classes:
        settings = config.rule(cls.id)
        thresholds = [
            {"name": name, "type": type_name, "default": default,
             "value": settings.thresholds.get(name, default), "configured": name in settings.thresholds}
            for name, type_name, default in cls.threshold_fields()
        ]  # fmt: skip
        out.append({
            "id": cls.id, "layer": cls.layer, "summary": cls.summary_line(),
            "source": "built-in" if cls.id in builtin else f"entry point ({ENTRY_POINT_GROUP}): {cls.__module__}",
            "enabled": settings.enabled, "severity": settings.level,
            "docs": {section: cls.docs().get(section, "") for section in DOC_SECTIONS}, "thresholds": thresholds,
        })  # fmt: skip
    return out


def render_text(items: list[dict[str, Any]], config: Config, out: TextIO) -> None:
    for item in items:
        state = "" if item["enabled"] else "  (disabled)"
        level = "" if item["severity"] == "error" else f"  [{item['severity']}]"
        out.write(f"{item['id']:<24} {item['layer']:<12} {item['summary']}{level}{state}\n")
    if config.path:
        out.write(f"\n(as configured by {config.path})\n")


def render_json(items: list[dict[str, Any]], config: Config, out: TextIO) -> None:
    json.dump({"schema": "latprof.rules/1", "config": config.path, "rules": items}, out, indent=2)
    out.write("\n")


def render_markdown(items: list[dict[str, Any]], config: Config, out: TextIO) -> None:
    out.write("# latprof rules\n\n")
    if config.path:
        out.write(f"Thresholds as configured by `{config.path}`.\n\n")
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


def explain_text(item: dict[str, Any], out: TextIO) -> None:
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


FORMATS: dict[str, Callable[[list[dict[str, Any]], Config, TextIO], None]] = {
    "text": render_text, "json": render_json, "markdown": render_markdown,
}  # fmt: skip


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
