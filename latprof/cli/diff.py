"""`latprof diff`: compare two diagnoses, before → after."""

from __future__ import annotations

from pathlib import Path

import click

from latprof.cli._common import INPUT, KEEP_UNTIL_EXIT, emit, main, output_option, reading_options, resolve_inputs, table_options, warmup_option
from latprof.report import renderers


@main.command()
@click.argument("before", type=INPUT)
@click.argument("after", type=INPUT)
@click.option("--format", "fmt", type=click.Choice(renderers.DIFF.names()), default="text", show_default=True,
              help="Diff format (markdown: for a pull-request comment or $GITHUB_STEP_SUMMARY).")
@output_option("diff")
@click.option("--fail-on-regression", "threshold_pct", type=click.FloatRange(min=0), metavar="PCT",
              help="Exit 1 when AFTER's p99 is more than PCT percent above BEFORE's.")
@warmup_option
@reading_options
@table_options
@click.pass_context
def diff(ctx: click.Context, before: Path, after: Path, fmt: str, output: Path | None, threshold_pct: float | None,
         warmup_s: float, exact: bool, sample_requests: int, since: str | None, until: str | None, service: str | None,
         route: str | None) -> None:  # fmt: skip
    """Compare two diagnoses: p99, each layer's time in the slowest 1%, the verdict and the findings, BEFORE → AFTER.

    BEFORE and AFTER are anything `latprof analyze` reads (captures, trace files, directories), or
    reports it saved with `--format json` (--skip-warmup does not apply to those), or clickhouse:// URLs: the
    range in each URL (`?table=otel_traces&since=2h&until=1h` against `&since=1h`), else --since and --until.
    """
    from latprof.ci.diff import diff_paths, regression_failure

    before, after = resolve_inputs((before, after), since=since, until=until, service=service, route=route,
                                   sample_requests=sample_requests, exact=exact)  # fmt: skip
    result, loaded = diff_paths(before, after, warmup_s=warmup_s, threshold_pct=threshold_pct, exact=exact,
                                sample_requests=sample_requests)  # fmt: skip
    KEEP_UNTIL_EXIT.append(loaded)
    emit(lambda out: renderers.DIFF.render(fmt, result, out), output)
    failure = regression_failure(result)
    if failure is not None:
        click.echo(f"latprof diff: {failure}", err=True)
        ctx.exit(1)
