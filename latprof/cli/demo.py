"""`latprof demo`: a bundled AI service with a known fault, under load, diagnosed."""

from __future__ import annotations

from pathlib import Path

import click

from latprof.analysis.requests import DEFAULT_WARMUP_S
from latprof.cli._common import KEEP_UNTIL_EXIT, check_format, format_option, main, output_option, print_report


@main.command()
@click.option(
    "--scenario",
    default="pool-held-across-llm",
    show_default=True,
    metavar="NAME",
    help=(
        "The fault to show: pool-held-across-llm, threadpool-queueing, provider-floor, provider-spikes,"
        " long-outputs, blocking-call, growing-context, or healthy (no fault)."
    ),
)
@click.option("--dsn", metavar="URL", help="PostgreSQL URL (postgresql://user@host:5432/db) instead of a temporary SQLite file.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Capture file [default: latprof-demo-<date>-<time>.jsonl].",
)
@click.option(
    "--seconds",
    "duration_s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="S",
    help="Seconds of load [default: $LATPROF_DEMO_SECONDS or 20].",
)
@click.option(
    "--attach",
    is_flag=True,
    help="Start the service plainly and diagnose it with `latprof attach` (sampling from outside) instead of `latprof run`'s hooks.",
)
@click.option(
    "--inject",
    is_flag=True,
    help="Start the service plainly and record it with `latprof attach --inject` (the hooks loaded into it for the load) instead.",
)
@click.option(
    "--traces",
    type=click.Choice(["stock", "openllmetry", "openinference", "openai-v2"]),
    help="Start the service traced with stock OpenTelemetry (and a GenAI instrumentation of openai), sending to"
    " `latprof receive`, and diagnose its traces instead (needs those packages installed).",
)
@format_option
@output_option("report")
def demo(scenario: str, dsn: str | None, out: Path | None, duration_s: float | None, attach: bool, inject: bool,
         traces: str | None, fmt: str, output: Path | None, include_attributes: bool) -> None:  # fmt: skip
    """Run a bundled AI service with a known fault under load, and diagnose it.

    Starts a local OpenAI-compatible provider and a small FastAPI + SQLAlchemy + openai service
    under `latprof run`, sends open-loop load for ~20 s, stops the service and prints the report.
    With --attach the service runs without latprof and `latprof attach` samples it meanwhile;
    with --inject `latprof attach --inject` loads the hooks into it for the load; with --traces it
    runs traced by OpenTelemetry instead, and latprof diagnoses the traces it sent.
    """
    check_format(fmt, include_attributes)
    if sum((attach, inject, traces is not None)) > 1:
        raise click.UsageError("--attach, --inject and --traces: choose one")
    from latprof.demo.run import run_demo

    result = run_demo(scenario, dsn=dsn, capture=out, duration_s=duration_s, warmup_s=DEFAULT_WARMUP_S, attach=attach,
                      inject=inject, traces=traces)  # fmt: skip
    print_report(result.report, fmt, output, result.diagnosis, include_attributes)
    KEEP_UNTIL_EXIT.append(result)
