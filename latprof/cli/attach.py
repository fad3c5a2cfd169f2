"""`latprof attach --pid PID`: diagnose a running service from outside by sampling it."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import click

from latprof.cli._common import (
    Judging,
    check_engine_metrics,
    check_format,
    config_option,
    engine_metrics_option,
    format_option,
    main,
    output_option,
    print_capture_report,
)
from latprof.errors import CollectorError, ConfigError
from latprof.semconv import DEFAULT_MAX_RATE

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
@click.option("--inject", is_flag=True, help="Load latprof's hooks into the running workers for --duration, then remove them:"
              " the per-request report of `latprof run` without a restart (CPython 3.10-3.13, needs gdb; docs/inject.md).")
@click.option("--hooks", default="all", show_default=True, metavar="NAMES", help="With --inject: the hooks to load (comma-separated).")
@click.option("--disable", multiple=True, metavar="NAMES", help="With --inject: hooks not to load (comma-separated; may be repeated).")
@click.option("--max-rate", type=click.FloatRange(min=0), default=DEFAULT_MAX_RATE, show_default=True, metavar="N",
              help="With --inject: record at most about N requests a second per process (0: all), as `latprof run`.")
@click.option("--allow-other-user", is_flag=True, help="With --inject: inject into a process of another user (as root).")
@engine_metrics_option
@format_option
@output_option("report")
@config_option
@click.pass_context
def attach(ctx: click.Context, pid: int, duration_s: float, rate: int, no_subprocesses: bool, db: str | None, out: Path | None,
           inject: bool, hooks: str, disable: tuple[str, ...], max_rate: float, allow_other_user: bool,
           engine_metrics: tuple[str, ...], fmt: str, output: Path | None, config_path: Path | None,
           include_attributes: bool) -> None:  # fmt: skip
    """Diagnose a running service from outside: sample its threads' stacks (py-spy), wait
    channels, event loops, accept queue and sockets for a while, then name the layer that
    saturates it.

    Needs py-spy and permission to read the process (same user or root; in containers
    --cap-add SYS_PTRACE). Workers of a gunicorn master are followed unless --no-subprocesses.

    With --inject, latprof's hooks are loaded into each worker instead (never into a master),
    record every request's layers as `latprof run` does, and are removed after --duration.
    """
    import signal

    check_format(fmt, include_attributes)
    engines = check_engine_metrics(engine_metrics)
    if inject:
        _inject(ctx, pid, duration_s, no_subprocesses, db, out, hooks, disable, max_rate, allow_other_user, fmt, output,
                config_path, include_attributes, engines)  # fmt: skip
        return
    if allow_other_user or hooks != "all" or disable or ctx.get_parameter_source("max_rate") is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--hooks, --disable, --max-rate and --allow-other-user apply to --inject only")
    from latprof.attach.session import AttachSession
    from latprof.collectors.attach import pg_activity, pyspy
    judging = Judging(config_path)  # a bad config stops here, before sampling starts
    capture = out or Path(time.strftime("latprof-attach-%Y%m%d-%H%M%S.jsonl"))
    session = AttachSession(pid, str(capture), duration_s=duration_s, rate=rate, subprocesses=not no_subprocesses, db=db,
                            on_progress=_attach_progress(duration_s), engine_metrics=engines)  # fmt: skip
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
                         written=f" (PID {pid} exited during it)" if pid in stats.exited else "", diagnosis=diagnosis,
                         include_attributes=include_attributes)  # fmt: skip


def _inject(ctx: click.Context, pid: int, duration_s: float, no_subprocesses: bool, db: str | None, out: Path | None,
            hooks: str, disable: tuple[str, ...], max_rate: float, allow_other_user: bool, fmt: str, output: Path | None,
            config_path: Path | None, include_attributes: bool, engines: list[str]) -> None:  # fmt: skip
    """`attach --inject`: the hooks in each worker for `duration_s`, then the run-mode report."""
    import signal

    from latprof.collectors.hooks.launcher import available_hooks, select_hooks
    from latprof.inject.session import InjectSession

    if db is not None or ctx.get_parameter_source("rate") is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--db and --rate apply to sampling, not to --inject")
    wanted = select_hooks(hooks, disable)
    judging = Judging(config_path)  # a bad config stops here, before anything is injected
    capture = out or Path(time.strftime("latprof-inject-%Y%m%d-%H%M%S.jsonl"))

    def progress(message: str) -> None:
        click.echo(f"latprof attach --inject: {message}", err=True)

    session = InjectSession(pid, str(capture), duration_s=duration_s, hooks=available_hooks() if wanted == ["all"] else wanted,
                            max_rate=max_rate, allow_other_user=allow_other_user, subprocesses=not no_subprocesses,
                            on_progress=progress)  # fmt: skip
    from latprof.collectors.scrape.prometheus import scraping_into

    previous = signal.signal(signal.SIGINT, lambda *_: session.stop())
    try:
        with scraping_into(capture, engines, "run"):
            results = session.run()
    finally:
        signal.signal(signal.SIGINT, previous)
    recorded = [r for r in results if r.outcome == "recorded"]
    for result in results:
        if result.outcome != "recorded":
            click.echo(f"latprof: PID {result.pid}: {result.message or result.outcome}", err=True)
    if not recorded:
        first = next((r.message for r in results if r.message), "no process was injected")
        raise CollectorError(first + f" (capture: {capture})")
    diagnosis = judging.diagnose([capture])
    print_capture_report(diagnosis.report, fmt, output, capture, again=judging.command(capture), diagnosis=diagnosis,
                         include_attributes=include_attributes)


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
