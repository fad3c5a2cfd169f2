"""`latprof top --pid PID`: a live layer table of a running service."""

from __future__ import annotations

import click

from latprof.cli._common import main
from latprof.errors import CollectorError


@main.command()
@click.option("--pid", type=int, required=True, help="The service's process: a gunicorn master, a worker, any Python process.")
@click.option("--rate", type=click.IntRange(1, 1000), default=100, show_default=True, metavar="HZ", help="Samples per second per thread.")
@click.option("--no-subprocesses", is_flag=True, help="Sample only PID, not its Python children (workers).")
@click.option("--interval", "interval_s", type=click.FloatRange(min=0.1), default=1.0, show_default=True, metavar="S",
              help="Seconds between refreshes (between tables when stdout is not a terminal).")
def top(pid: int, rate: int, no_subprocesses: bool, interval_s: float) -> None:
    """A live layer table of a running service and its workers: which layer its busy threads are
    in now and since the start, by the same sampler as `latprof attach` (no capture is written).

    q or Ctrl-C quits. When stdout is not a terminal, one plain table is printed every interval.
    """
    from latprof.attach.top import run_top
    from latprof.collectors.attach import pyspy

    try:
        result = run_top(pid, rate=rate, subprocesses=not no_subprocesses, interval_s=interval_s,
                         on_note=lambda line: click.echo(f"latprof top: {line}", err=True))  # fmt: skip
    except pyspy.SamplerError as exc:
        raise CollectorError(str(exc)) from None
    click.echo(f"latprof top: {result.message()}", err=True)
