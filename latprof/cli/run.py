"""`latprof run -- CMD`: run a Python service with latprof's hooks, and diagnose it when it stops."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

import click

from latprof.cli._common import (
    KEEP_UNTIL_EXIT,
    Judging,
    check_format,
    check_engine_metrics,
    config_option,
    engine_metrics_option,
    format_option,
    given_warmup,
    main,
    output_option,
    print_capture_report,
    warmup_option,
)
from latprof.errors import CollectorError, LatprofError
from latprof.semconv import DEFAULT_MAX_RATE


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Capture file every process of the command appends to [default: latprof-<date>-<time>.jsonl].",
)
@format_option
@output_option("report")
@click.option("--no-report", is_flag=True, help="Only record; print no report when the command ends.")
@click.option(
    "--hooks",
    default="all",
    show_default=True,
    metavar="NAMES",
    help="Comma-separated hooks to load, or all (`--list` shows them).",
)
@click.option(
    "--disable",
    multiple=True,
    metavar="NAMES",
    help="Hooks not to load (comma-separated; may be repeated).",
)
@click.option("--list", "list_hooks", is_flag=True, help="List every hook and what it records, then exit.")
@click.option(
    "--max-rate",
    type=click.FloatRange(min=0),
    default=DEFAULT_MAX_RATE,
    show_default=True,
    metavar="N",
    help="Record at most about N requests a second per process; above that a random sample of them,"
    " each weighted by the requests it stands for. 0 records every request.",
)
@engine_metrics_option
@warmup_option
@config_option
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run(
    ctx: click.Context,
    out: Path | None,
    fmt: str,
    output: Path | None,
    no_report: bool,
    hooks: str,
    disable: tuple[str, ...],
    list_hooks: bool,
    max_rate: float,
    engine_metrics: tuple[str, ...],
    warmup_s: float,
    config_path: Path | None,
    cmd: tuple[str, ...],
    include_attributes: bool,
) -> None:
    """Run a Python service with latprof's hooks, and diagnose it when it stops.

    Everything after `--` is the command, e.g. `latprof run -- uvicorn app:app`. Every Python
    process it starts loads the hooks (no code change); signals sent to latprof go on to it;
    latprof exits with the command's exit code.
    """
    from latprof.collectors.hooks.launcher import (
        check_capture_path,
        describe_hooks,
        losses,
        processes_with_hooks,
        run_with_hooks,
        select_hooks,
        writer_statuses,
    )
    from latprof.collectors.scrape.prometheus import scraping_into

    if list_hooks:
        for name, summary in describe_hooks():
            click.echo(f"{name:<14} {summary}")
        return
    check_format(fmt, include_attributes)
    if not cmd:
        raise click.UsageError("no command: `latprof run [OPTIONS] -- CMD ARGS...` (or `latprof run --list`)")
    wanted = select_hooks(hooks, disable)
    engines = check_engine_metrics(engine_metrics)
    judging = Judging(config_path, given_warmup(ctx, warmup_s))  # a bad config stops here, before the service starts
    capture = out or Path(time.strftime("latprof-%Y%m%d-%H%M%S.jsonl"))
    check_capture_path(capture)  # an unwritable --out stops here, before the service starts
    # Each process's writer leaves its totals here on close: what it could not write is known
    # even when the capture is what failed (a full disk).
    with tempfile.TemporaryDirectory(prefix="latprof-run-") as status_dir, scraping_into(capture, engines, "run"):
        code = run_with_hooks(cmd, capture, hooks=",".join(wanted), max_rate=max_rate, status_dir=Path(status_dir))
        statuses = writer_statuses(Path(status_dir))
    lost = losses(statuses, capture)
    for line in lost:
        click.echo(f"latprof: {line}", err=True)
    if not processes_with_hooks(capture) and not statuses:
        raise CollectorError(
            f"no process of `{' '.join(cmd)}` loaded latprof's hooks (it exited with {code}): latprof must be"
            " importable by the command's Python - install latprof into the service's environment"
            " (e.g. `pip install latprof` in its virtualenv) and run again"
        )
    if no_report:
        click.echo(f"latprof: capture written to {capture}; its report: {judging.command(capture)}", err=True)
        ctx.exit(code)
    try:
        diagnosis = judging.diagnose([capture])
    except LatprofError as exc:
        click.echo(f"latprof: capture written to {capture}", err=True)
        click.echo(f"latprof: no report: {exc}", err=True)
    else:
        report = diagnosis.report
        if lost:
            collection = {**report.collection, "warnings": [*report.collection.get("warnings", ()), *lost]}
            report = dataclasses.replace(report, collection=collection)
        print_capture_report(report, fmt, output, capture, again=judging.command(capture), diagnosis=diagnosis,
                             include_attributes=include_attributes)
        KEEP_UNTIL_EXIT.append(diagnosis)
    ctx.exit(code)
