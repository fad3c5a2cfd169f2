"""`latprof export`: write a capture in a trace viewer's format (Perfetto / chrome://tracing, OTLP/JSON)."""

from __future__ import annotations

from pathlib import Path

import click

from latprof.cli._common import KEEP_UNTIL_EXIT, emit, main, output_option
from latprof.export import EXPORT, read_input


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(EXPORT.names()), required=True,
              help="perfetto: Chrome trace-event JSON for Perfetto UI and chrome://tracing; otlp: OTLP/JSON lines for"
                   " Jaeger, Tempo or any OTLP backend.")
@output_option("export")
def export(paths: tuple[Path, ...], fmt: str, output: Path | None) -> None:  # fmt: skip
    """Export captures to trace viewers: each request a trace (a track), its segments nested in it, by layer.

    PATHS are what `latprof analyze` reads (captures, OTLP/Jaeger/Zipkin trace files, directories);
    several are merged. Only what the capture holds is written (docs/export.md). `latprof analyze`
    of an OTLP export gives the capture's verdict.
    """
    data = read_input(paths)
    emit(lambda out: EXPORT.render(fmt, data, out), output)
    KEEP_UNTIL_EXIT.append(data)
