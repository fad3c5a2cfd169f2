"""`latprof receive`: take traces from running services over OTLP/HTTP, then diagnose them."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

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
from latprof.errors import CollectorError, InputError

if TYPE_CHECKING:
    from latprof.collectors.traces.receive import ReceiveStats


@main.command()
@click.option("--listen", metavar="HOST:PORT",
              help="Where to serve OTLP/HTTP [default: 127.0.0.1:4318]. Another address than loopback is used only when"
              " named here, with a warning.")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="The trace file written, OTLP JSON lines [default: latprof-receive-<date>-<time>.otlp.jsonl].")
@click.option("--duration", "duration_s", type=click.FloatRange(min=0, min_open=True), metavar="S",
              help="Stop after S seconds [default: at Ctrl-C or SIGTERM].")
@click.option("--max-spans", type=click.IntRange(min=1), metavar="N",
              help="Keep at most N spans; exporters are told the rest were rejected (partial success) [default: 2,000,000].")
@format_option
@output_option("report")
@engine_metrics_option
@warmup_option
@config_option
@click.pass_context
def receive(ctx: click.Context, listen: str | None, out: Path | None, duration_s: float | None, max_spans: int | None,
            fmt: str, output: Path | None, engine_metrics: tuple[str, ...], warmup_s: float, config_path: Path | None,
            include_attributes: bool) -> None:  # fmt: skip
    """Receive traces from running services over OTLP/HTTP until Ctrl-C (or --duration), then diagnose them.

    Point a service's OpenTelemetry exporter here, e.g. OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318
    and OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf: POST /v1/traces takes protobuf or OTLP JSON bodies,
    gzip or not. What arrives is written to --out as OTLP JSON lines, which `latprof analyze` reads.
    With --engine-metrics, the engine's metrics go to a latprof capture beside it (`*.engine.jsonl`).
    """
    import signal
    import threading

    from latprof.collectors.scrape.prometheus import scraping_into
    from latprof.collectors.traces.receive import DEFAULT_LISTEN, DEFAULT_MAX_SPANS, Receiver, is_loopback, parse_listen

    check_format(fmt, include_attributes)
    engines = check_engine_metrics(engine_metrics)
    judging = Judging(config_path, given_warmup(ctx, warmup_s))  # a bad config stops here, before anything is received
    host, port = parse_listen(listen or DEFAULT_LISTEN)
    if not is_loopback(host):
        click.echo(f"latprof receive: warning: {host} is not a loopback address: whatever reaches this host on port {port}"
                   " can send spans", err=True)  # fmt: skip
    capture = out or Path(time.strftime("latprof-receive-%Y%m%d-%H%M%S.otlp.jsonl"))
    engine_capture = engine_capture_of(capture) if engines else None
    receiver = Receiver(host, port, capture, max_spans=max_spans or DEFAULT_MAX_SPANS)
    click.echo(f"latprof receive: listening on {receiver.endpoint} (OTLP/HTTP, protobuf or JSON), writing {capture};"
               + (f" diagnosing after {duration_s:g} s" if duration_s else " Ctrl-C to stop and diagnose"), err=True)  # fmt: skip
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with scraping_into(engine_capture or capture, engines, "receive"):
            stats = receiver.serve(stop, duration_s, _receive_progress())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if sys.stderr.isatty():
            click.echo("", err=True)
    for line in stats.summary_lines():
        click.echo(f"latprof receive: {line}", err=True)
    if receiver.write_error is not None:
        raise InputError(f"{capture}: cannot write: {receiver.write_error}")
    if not stats.spans:
        capture.unlink(missing_ok=True)  # nothing in it
        raise CollectorError(f"no spans received on {receiver.endpoint}; was OTEL_EXPORTER_OTLP_ENDPOINT set to {receiver.base_url}?")
    inputs = [capture] if engine_capture is None or not engine_capture.exists() else [capture, engine_capture]
    diagnosis = judging.diagnose(inputs, source_kind="receive")
    again = judging.command(capture).replace(f"analyze {capture}", f"analyze {' '.join(map(str, inputs))}", 1)
    print_capture_report(diagnosis.report, fmt, output, capture, again=again,
                         written=f" ({stats.spans:,} spans from {stats.requests:,} export requests)", diagnosis=diagnosis,
                         include_attributes=include_attributes)  # fmt: skip
    KEEP_UNTIL_EXIT.append(diagnosis)


def engine_capture_of(capture: Path) -> Path:
    """Where `receive --engine-metrics` writes the engine's metrics: a latprof capture beside the OTLP file."""
    name = capture.name
    for suffix in (".otlp.jsonl", ".jsonl", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return capture.with_name(name + ".engine.jsonl")


def _receive_progress() -> Callable[[ReceiveStats, float], None]:
    """A `\\r` line on a terminal (every tick); otherwise a line every 5 s while spans arrive."""
    tty = sys.stderr.isatty()
    last_at, last_counts = 0.0, (0, 0)

    def progress(stats: ReceiveStats, elapsed_s: float) -> None:
        nonlocal last_at, last_counts
        line = f"latprof receive: {stats.spans:,} spans from {stats.requests:,} requests in {elapsed_s:.0f} s"
        refused = stats.rejected_spans + stats.dropped_spans
        if refused:
            line += f", {refused:,} spans refused"
        if tty:
            click.echo(f"\r{line}   ", err=True, nl=False)
        elif elapsed_s - last_at >= 5 and (stats.spans, stats.requests) != last_counts:
            click.echo(line, err=True)
            last_at, last_counts = elapsed_s, (stats.spans, stats.requests)

    return progress
