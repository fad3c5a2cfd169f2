"""`latprof rules` and `latprof rules explain ID`: the rule catalogue."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from latprof.cli._common import config_option, main
from latprof.errors import ConfigError
from latprof.report import renderers

if TYPE_CHECKING:
    from latprof.ci.config import Config
    from latprof.engine import Rule


@main.group(invoke_without_command=True)
@click.option("--format", "fmt", type=click.Choice(renderers.RULES.names()), default="text", show_default=True,
              help="json or markdown: the whole catalogue (documentation, thresholds) to publish.")
@config_option
@click.pass_context
def rules(ctx: click.Context, fmt: str, config_path: Path | None) -> None:
    """List every rule (built-in and from installed packages), or explain one: `latprof rules explain ID`.

    Thresholds are shown with the values the config gives them.
    """
    ctx.ensure_object(dict)
    ctx.obj["config_path"] = config_path
    if ctx.invoked_subcommand is None:
        from latprof.report.catalogue import catalogue

        config, classes = _rules_config(config_path)
        renderers.RULES.render(fmt, catalogue(classes, config), sys.stdout)


def _rules_config(config_path: Path | None) -> tuple[Config, list[type[Rule]]]:
    from latprof.ci.config import load_config
    from latprof.engine import all_rules

    classes = all_rules()
    return load_config(config_path, rule_classes=classes), classes


@rules.command()
@click.argument("rule_id")
@config_option
@click.pass_context
def explain(ctx: click.Context, rule_id: str, config_path: Path | None) -> None:
    """Print a rule's documentation and thresholds (with the values the config gives them)."""
    from latprof.report.catalogue import entries
    from latprof.report.renderers.rules_text import explain as explain_text

    config, classes = _rules_config(config_path or (ctx.obj or {}).get("config_path"))
    by_id = {rule.id: rule for rule in classes}
    rule = by_id.get(rule_id)
    if rule is None:
        close = difflib.get_close_matches(rule_id, by_id, n=1)
        hint = f" (did you mean {close[0]}?)" if close else f"; known rules: {', '.join(by_id)}"
        raise ConfigError(f"no rule {rule_id!r}{hint}")
    explain_text(entries([rule], config)[0], sys.stdout)
