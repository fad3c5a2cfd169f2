"""`latprof attach --pid PID`: diagnose a running service from outside by sampling it."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import click

from latprof.cli._common import Judging, config_option, format_option, main, output_option, print_capture_report
from latprof.errors import CollectorError, ConfigError

if TYPE_CHECKING:
    from latprof.attach.session import AttachStats


@main.command()
@click.option("--pid", type=int, required=True, help="The service's process: a gunicorn master, a worker, any Python process.")
@click.option("--duration", "duration_s", type=click.FloatRange(min=1), default=30, show_default=True, metavar="S",
              help="Seconds to sample (Ctrl-C ends early and still reports).")
@click.option("--rate", type=click.IntRange(1, 1000), default=100, show_default=True, metavar="HZ", help="Samples per second per thread.")
@click.option("--no-subprocesses", is_flag=True, help="Sample only PID, not its Python children (workers).")
@click.option("--db", "db", metavar="DSN", help="Also sample pg_stat_activity for the target's own PostgreSQL backends "
              "(a libpq URL or key=value DSN; needs psycopg).")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="The capture file (default latprof-attach-<time>.jsonl).")
@format_option
@output_option("report")
@config_option
def attach(pid: int, duration_s: float, rate: int, no_subprocesses: bool, db: str | None, out: Path | None, fmt: str,
           output: Path | None, config_path: Path | None) -> None:  # fmt: skip
    """Diagnose a running service from outside: sample its threads' stacks (py-spy), wait
    channels, event loops, accept queue and sockets for a while, then name the layer that
    saturates it.

    Needs py-spy and permission to read the process (same user or root; in containers
    --cap-add SYS_PTRACE). Workers of a gunicorn master are followed unless --no-subprocesses.
    """
    import signal

    from latprof.attach.session import AttachSession
    from latprof.collectors.attach import pg_activity, pyspy
    judging = Judging(config_path)  # a bad config stops here, before sampling starts
    capture = out or Path(time.strftime("latprof-attach-%Y%m%d-%H%M%S.jsonl"))
    session = AttachSession(pid, str(capture), duration_s=duration_s, rate=rate, subprocesses=not no_subprocesses, db=db,
                            on_progress=_attach_progress(duration_s))  # fmt: skip
    previous = signal.signal(signal.SIGINT, lambda *_: session.stop())
    try:
        stats = session.run()
    except pyspy.SamplerError as exc:
        raise CollectorError(str(exc)) from None
    except pg_activity.PgActivityError as exc:
        raise ConfigError(f"--db: {exc}") from None
    finally:
        signal.signal(signal.SIGINT, previous)
        if sys.stderr.isatty():
            click.echo("", err=True)
    if stats.windows == 0:
        raise CollectorError(f"no stack of PID {pid} was sampled" + (f": {stats.errors[0]}" if stats.errors else ""))
    diagnosis = judging.diagnose([capture])
    print_capture_report(diagnosis.report, fmt, output, capture, again=judging.command(capture),
                         written=f" (PID {pid} exited during it)" if pid in stats.exited else "")  # fmt: skip


def _attach_progress(duration_s: float) -> Callable[[AttachStats], None]:
    started = time.monotonic()

    def progress(stats: AttachStats) -> None:
        if sys.stderr.isatty():
            top = max(stats.layers.items(), key=lambda kv: kv[1], default=None)
            busy = sum(stats.layers.values())
            click.echo(
                f"\rlatprof attach: {time.monotonic() - started:5.1f}/{duration_s:g} s, {stats.samples:,} samples,"
                f" {len(stats.processes)} process(es)"
                + (f", busy threads mostly in {top[0]} ({top[1] / busy:.0%})" if top and busy else "") + "   ",
                err=True, nl=False,
            )  # fmt: skip

    return progress
