"""`latprof check`: the rules and budgets as a CI gate."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from latprof.analysis.requests import DEFAULT_WARMUP_S
from latprof.cli._common import INPUT, KEEP_UNTIL_EXIT, config_option, emit, main, output_option, reading_options, resolve_inputs, table_options
from latprof.errors import InputError
from latprof.report import renderers


@main.command()
@click.argument("paths", nargs=-1, required=True, type=INPUT)
@config_option
@click.option("--baseline", type=click.Path(path_type=Path), metavar="CAPTURE",
              help="A capture (or trace file) of an earlier run: the reference of relative budgets like '+10%'.")
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE", help="Write a JUnit XML report here.")
@click.option("--sarif", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE", help="Write a SARIF 2.1.0 log here.")
@click.option("--format", "fmt", type=click.Choice(renderers.CHECK.names()), default="text", show_default=True,
              help="Format of the results on stdout (or -o).")
@output_option("results")
@click.option("--skip-warmup", "warmup_s", type=click.FloatRange(min=0), default=None, metavar="S",
              help=f"Leave out the first S seconds of each process's traffic [default: the config's skip_warmup_s, or {DEFAULT_WARMUP_S:g}].")
@reading_options
@table_options
@click.pass_context
def check(ctx: click.Context, paths: tuple[Path, ...], config_path: Path | None, baseline: Path | None,
          junit: Path | None, sarif: Path | None, fmt: str, output: Path | None, warmup_s: float | None,
          exact: bool, sample_requests: int, since: str | None, until: str | None, service: str | None,
          route: str | None) -> None:  # fmt: skip
    """Run the rules and budgets as a CI gate: exit 0 when every check passes, 1 when one fails.

    PATHS are what `latprof analyze` reads (clickhouse:// URLs too). The checks are the budgets and declarative checks of
    the config, and every enabled rule (built-in or from an installed package): a rule fails its
    check when it finds something. Exit 2 for bad input or configuration. Under GitHub Actions
    (GITHUB_ACTIONS=true) failures also become ::error/::warning annotations and a summary in
    $GITHUB_STEP_SUMMARY.
    """
    from latprof.ci.check_output import emit_github, write_junit, write_sarif
    from latprof.ci.checks import check_paths

    inputs = resolve_inputs(paths, since=since, until=until, service=service, route=route, sample_requests=sample_requests,
                            exact=exact)  # fmt: skip
    run = check_paths(inputs, config_path=config_path, baseline=baseline, warmup_s=warmup_s, exact=exact,
                      sample_requests=sample_requests)  # fmt: skip
    KEEP_UNTIL_EXIT.append(run)
    for path, write in ((junit, write_junit), (sarif, write_sarif)):
        if path is not None:
            try:
                write(run, path)
            except OSError as exc:
                raise InputError(f"{path}: cannot write: {exc.strerror or exc}") from None
    emit(lambda out: renderers.CHECK.render(fmt, run, out), output)
    # workflow commands on stdout, unless stdout holds the JSON results
    annotations_to = sys.stderr if fmt == "json" and output is None else sys.stdout
    for warning in emit_github(run, annotations_to, os.environ):
        click.echo(f"latprof check: warning: {warning}", err=True)
    ctx.exit(run.exit_code)
