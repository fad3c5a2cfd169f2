"""The rule catalogue: every rule's id, layer, documentation and thresholds, with the values a config gives them.

Its formats (`latprof rules --format text|json|markdown`, `latprof rules explain`) are
renderers: `latprof.report.renderers.rules_*`, registered on `renderers.RULES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from latprof.ci.config import Config
from latprof.engine import DOC_SECTIONS, ENTRY_POINT_GROUP, Rule, discover_rules


#: One rule's entry (`entries`): the JSON shape of `latprof rules --format json`'s "rules" items.
RuleEntry = dict[str, Any]


@dataclass(frozen=True)
class Catalogue:
    """Every rule's entry, and the config file that set their values (None: the defaults)."""

    rules: list[RuleEntry]
    config_path: str | None


def catalogue(rule_classes: Sequence[type[Rule]], config: Config) -> Catalogue:
    """The catalogue of `rule_classes` as `config` sets them."""
    return Catalogue(entries(rule_classes, config), config.path)


def entries(rule_classes: Sequence[type[Rule]], config: Config) -> list[RuleEntry]:
    """One entry per rule: its documentation, whether the config enables it, at which level, and
    each threshold's default and configured value (`value`: what the rule runs with)."""
    builtin = {cls.id for cls in discover_rules()}
    out: list[RuleEntry] = []
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
