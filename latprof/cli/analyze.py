"""`latprof analyze`: diagnose captures and trace files."""

from __future__ import annotations

from pathlib import Path

import click

from latprof.cli._common import (
    KEEP_UNTIL_EXIT,
    Judging,
    check_format,
    config_option,
    reading_options,
    resolve_inputs,
    table_options,
    INPUT,
    format_option,
    given_warmup,
    main,
    output_option,
    print_report,
    warmup_option,
)


@main.command()
@click.argument("paths", nargs=-1, required=True, type=INPUT)
@format_option
@output_option("report")
@warmup_option
@config_option
@click.option("--trace", "trace_id", metavar="ID",
              help="Explain the one trace with this id (hex, as a trace UI shows it) instead of the whole file.")
@reading_options
@table_options
@click.pass_context
def analyze(ctx: click.Context, paths: tuple[Path, ...], fmt: str, output: Path | None, warmup_s: float,
            config_path: Path | None, trace_id: str | None, exact: bool, sample_requests: int,
            include_attributes: bool, since: str | None, until: str | None, service: str | None,
            route: str | None) -> None:  # fmt: skip
    """Diagnose captures: name the layer that owns the tail, with evidence and a fix.

    PATHS are capture files (.jsonl or .jsonl.gz), OpenTelemetry OTLP JSON trace files (.json,
    .gz; told by content) or directories of them; several are merged. A clickhouse://HOST:8123/DB?table=otel_traces
    URL reads the spans the OpenTelemetry Collector's ClickHouse exporter stored (--since; docs/clickhouse.md). The rules run as the
    config (`[tool.latprof]`, latprof.toml) sets them. With fewer requests than a verdict needs
    (50), or one trace picked with --trace, each request is explained instead: its critical path,
    its longest uncovered gap, and what one request shows (N+1 calls, a timeout masking the span
    that used the time, the first of several errors).
    """
    check_format(fmt, include_attributes)
    inputs = resolve_inputs(paths, since=since, until=until, service=service, route=route, sample_requests=sample_requests,
                            exact=exact)  # fmt: skip
    diagnosis = Judging(config_path, given_warmup(ctx, warmup_s)).diagnose(inputs, trace_id=trace_id, exact=exact, sample_requests=sample_requests)
    print_report(diagnosis.report, fmt, output, diagnosis, include_attributes)
    # The analysis stays referenced until here: `run` leaves without freeing it.
    KEEP_UNTIL_EXIT.append(diagnosis)
