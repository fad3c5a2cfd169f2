"""The `latprof` command line: parse options, call the library, render. No logic of its own."""

from __future__ import annotations

import difflib
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import click

from latprof import __version__
from latprof.report import renderers
from latprof.analysis.requests import DEFAULT_WARMUP_S
from latprof.errors import CollectorError, ConfigError, InputError, LatprofError
from latprof.semconv import DEFAULT_MAX_RATE

# Exit codes: 0 ok, 1 a failed check, 2 usage/input/config errors, 3 a latprof bug.
EXIT_INTERNAL = 3

# Big results a command is done with: freeing millions of objects one by one takes longer
# than exiting, so the console script (`entry_point`) leaves without freeing them.
_KEEP_UNTIL_EXIT: list[object] = []


class _Main(click.Group):
    """Turns every error into one line on stderr and its exit code; tracebacks only with --debug."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LatprofError as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"latprof: error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            click.echo("latprof: interrupted", err=True)
            ctx.exit(130)
        except BrokenPipeError:  # `latprof ... | head`: the reader left; so do we, quietly
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # Python's docs: keep the exit flush from failing again
            ctx.exit(0)
        except Exception as exc:  # a bug: still one line unless asked for the traceback
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(
                f"latprof: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", err=True
            )
            ctx.exit(EXIT_INTERNAL)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="latprof")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Find which layer really owns your AI service's p99: DB pool, queueing, provider floor,
    decode, event loop, HTTP pool, retries or locks."""
    ctx.obj = {"debug": debug}


def _format_option(fn: Any) -> Any:
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(renderers.names()),
        default="text",
        show_default=True,
        help="Report format.",
    )(fn)


def _warmup_option(fn: Any) -> Any:
    return click.option(
        "--skip-warmup",
        "warmup_s",
        type=click.FloatRange(min=0),
        default=DEFAULT_WARMUP_S,
        show_default=True,
        metavar="S",
        help="Leave out the first S seconds of each process's traffic (of each service instance's, in traces).",
    )(fn)


_CONFIG_OPTION = click.option(
    "--config", "config_path", type=click.Path(path_type=Path), metavar="FILE",
    help="pyproject.toml ([tool.latprof]) or latprof.toml; default: the nearest one from the working directory.",
)  # fmt: skip


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@_format_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the report here instead of stdout.")
@_warmup_option
@_CONFIG_OPTION
@click.pass_context
def analyze(ctx: click.Context, paths: tuple[Path, ...], fmt: str, output: Path | None, warmup_s: float,
            config_path: Path | None) -> None:  # fmt: skip
    """Diagnose captures: name the layer that owns the tail, with evidence and a fix.

    PATHS are capture files (.jsonl or .jsonl.gz), OpenTelemetry OTLP JSON trace files (.json,
    .gz; told by content) or directories of them; several are merged. The rules run as the
    config (`[tool.latprof]`, latprof.toml) sets them.
    """
    from latprof.ci.config import load_config
    from latprof.engine import all_rules
    from latprof.pipeline import run_configured

    classes = all_rules()
    config = load_config(config_path, rule_classes=classes)
    given = ctx.get_parameter_source("warmup_s") is not click.core.ParameterSource.DEFAULT
    diagnosis = run_configured(paths, config, classes, warmup_s=warmup_s if given else None)
    _emit(lambda out: renderers.get(fmt)(diagnosis.report, out), output)
    # The analysis stays referenced until here: `run` leaves without freeing it.
    _KEEP_UNTIL_EXIT.append(diagnosis)


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@_CONFIG_OPTION
@click.option("--baseline", type=click.Path(path_type=Path), metavar="CAPTURE",
              help="A capture (or trace file) of an earlier run: the reference of relative budgets like '+10%'.")
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE", help="Write a JUnit XML report here.")
@click.option("--sarif", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE", help="Write a SARIF 2.1.0 log here.")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True,
              help="Format of the results on stdout (or -o).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the results here instead of stdout.")
@click.option("--skip-warmup", "warmup_s", type=click.FloatRange(min=0), default=None, metavar="S",
              help=f"Leave out the first S seconds of each process's traffic [default: the config's skip_warmup_s, or {DEFAULT_WARMUP_S:g}].")
@click.pass_context
def check(ctx: click.Context, paths: tuple[Path, ...], config_path: Path | None, baseline: Path | None,
          junit: Path | None, sarif: Path | None, fmt: str, output: Path | None, warmup_s: float | None) -> None:  # fmt: skip
    """Run the rules and budgets as a CI gate: exit 0 when every check passes, 1 when one fails.

    PATHS are what `latprof analyze` reads. The checks are the budgets and declarative checks of
    the config, and every enabled rule (built-in or from an installed package): a rule fails its
    check when it finds something. Exit 2 for bad input or configuration. Under GitHub Actions
    (GITHUB_ACTIONS=true) failures also become ::error/::warning annotations and a summary in
    $GITHUB_STEP_SUMMARY.
    """
    from latprof.ci import check_output
    from latprof.ci.checks import check_paths

    run = check_paths(paths, config_path=config_path, baseline=baseline, warmup_s=warmup_s)
    _KEEP_UNTIL_EXIT.append(run)
    for path, write in ((junit, check_output.write_junit), (sarif, check_output.write_sarif)):
        if path is not None:
            try:
                write(run, path)
            except OSError as exc:
                raise InputError(f"{path}: cannot write: {exc.strerror or exc}") from None
    _emit(lambda out: check_output.render(run, fmt, out), output)
    # workflow commands on stdout, unless stdout holds the JSON results
    annotations_to = sys.stderr if fmt == "json" and output is None else sys.stdout
    for warning in check_output.emit_github(run, annotations_to, os.environ):
        click.echo(f"latprof check: warning: {warning}", err=True)
    ctx.exit(run.exit_code)


def _emit(write: Any, output: Path | None) -> None:
    if output is None:
        write(sys.stdout)
        return
    try:
        with open(output, "w", encoding="utf-8") as out:
            write(out)
    except OSError as exc:
        raise InputError(f"{output}: cannot write: {exc.strerror or exc}") from None


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Capture file every process of the command appends to [default: latprof-<date>-<time>.jsonl].",
)
@_format_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the report here instead of stdout.")
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
@_warmup_option
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
    warmup_s: float,
    cmd: tuple[str, ...],
) -> None:
    """Run a Python service with latprof's hooks, and diagnose it when it stops.

    Everything after `--` is the command, e.g. `latprof run -- uvicorn app:app`. Every Python
    process it starts loads the hooks (no code change); signals sent to latprof go on to it;
    latprof exits with the command's exit code.
    """
    from latprof.collectors.hooks.launcher import (
        available_hooks,
        describe_hooks,
        processes_with_hooks,
        run_with_hooks,
    )
    from latprof.pipeline import run_diagnosis

    if list_hooks:
        for name, summary in describe_hooks():
            click.echo(f"{name:<14} {summary}")
        return
    if not cmd:
        raise click.UsageError("no command: `latprof run [OPTIONS] -- CMD ARGS...` (or `latprof run --list`)")
    known = available_hooks()
    wanted = [name.strip() for name in hooks.split(",") if name.strip()]
    if wanted != ["all"]:
        unknown = sorted(set(wanted) - set(known))
        if unknown:
            raise ConfigError(f"--hooks: no hook {', '.join(unknown)} (known: {', '.join(known)})")
    disabled = {name.strip() for item in disable for name in item.split(",") if name.strip()}
    if disabled:
        unknown = sorted(disabled - set(known))
        if unknown:
            raise ConfigError(f"--disable: no hook {', '.join(unknown)} (known: {', '.join(known)})")
        wanted = [name for name in (known if wanted == ["all"] else wanted) if name not in disabled]
        if not wanted:
            raise ConfigError("--disable: every hook is disabled; nothing would be recorded")
    capture = out or Path(time.strftime("latprof-%Y%m%d-%H%M%S.jsonl"))
    code = run_with_hooks(cmd, capture, hooks=",".join(wanted), max_rate=max_rate)
    if not processes_with_hooks(capture):
        raise CollectorError(
            f"no process of `{' '.join(cmd)}` loaded latprof's hooks (it exited with {code}): latprof must be"
            " importable by the command's Python - install latprof into the service's environment"
            " (e.g. `pip install latprof` in its virtualenv) and run again"
        )
    click.echo(f"latprof: capture written to {capture}", err=True)
    if not no_report:
        try:
            diagnosis = run_diagnosis([capture], warmup_s=warmup_s)
        except LatprofError as exc:
            click.echo(f"latprof: no report: {exc}", err=True)
        else:
            _emit(lambda stream: renderers.get(fmt)(diagnosis.report, stream), output)
            _KEEP_UNTIL_EXIT.append(diagnosis)
    ctx.exit(code)


@main.command()
@click.option("--pid", type=int, required=True, help="The service's process: a gunicorn master, a worker, any Python process.")
@click.option("--duration", "duration_s", type=click.FloatRange(min=1), default=30, show_default=True, metavar="S",
              help="Seconds to sample (Ctrl-C ends early and still reports).")
@click.option("--rate", type=click.IntRange(1, 1000), default=100, show_default=True, metavar="HZ", help="Samples per second per thread.")
@click.option("--no-subprocesses", is_flag=True, help="Sample only PID, not its Python children (workers).")
@click.option("--db", "db", metavar="DSN", help="Also sample pg_stat_activity for the target's own PostgreSQL backends "
              "(a libpq URL or key=value DSN; needs psycopg).")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="The capture file (default latprof-attach-<time>.jsonl).")
@_format_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the report here instead of stdout.")
def attach(pid: int, duration_s: float, rate: int, no_subprocesses: bool, db: str | None, out: Path | None, fmt: str,
           output: Path | None) -> None:  # fmt: skip
    """Diagnose a running service from outside: sample its threads' stacks (py-spy), wait
    channels, event loops, accept queue and sockets for a while, then name the layer that
    saturates it.

    Needs py-spy and permission to read the process (same user or root; in containers
    --cap-add SYS_PTRACE). Workers of a gunicorn master are followed unless --no-subprocesses.
    """
    import signal

    from latprof.attach.session import AttachSession
    from latprof.collectors.attach import pg_activity, pyspy
    from latprof.pipeline import run_diagnosis

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
    click.echo(f"latprof: capture written to {capture}" + (f" (PID {pid} exited during it)" if pid in stats.exited else ""), err=True)
    diagnosis = run_diagnosis([capture])
    _emit(lambda stream: renderers.get(fmt)(diagnosis.report, stream), output)


def _attach_progress(duration_s: float) -> Any:
    started = time.monotonic()

    def progress(stats: Any) -> None:
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
@_format_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the report here instead of stdout.")
@_warmup_option
def receive(listen: str | None, out: Path | None, duration_s: float | None, max_spans: int | None, fmt: str,
            output: Path | None, warmup_s: float) -> None:  # fmt: skip
    """Receive traces from running services over OTLP/HTTP until Ctrl-C (or --duration), then diagnose them.

    Point a service's OpenTelemetry exporter here, e.g. OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318
    and OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf: POST /v1/traces takes protobuf or OTLP JSON bodies,
    gzip or not. What arrives is written to --out as OTLP JSON lines, which `latprof analyze` reads.
    """
    import signal
    import threading

    from latprof.pipeline import run_diagnosis
    from latprof.collectors.traces.receive import DEFAULT_LISTEN, DEFAULT_MAX_SPANS, Receiver, is_loopback, parse_listen

    host, port = parse_listen(listen or DEFAULT_LISTEN)
    if not is_loopback(host):
        click.echo(f"latprof receive: warning: {host} is not a loopback address: whatever reaches this host on port {port}"
                   " can send spans", err=True)  # fmt: skip
    capture = out or Path(time.strftime("latprof-receive-%Y%m%d-%H%M%S.otlp.jsonl"))
    receiver = Receiver(host, port, capture, max_spans=max_spans or DEFAULT_MAX_SPANS)
    click.echo(f"latprof receive: listening on {receiver.endpoint} (OTLP/HTTP, protobuf or JSON), writing {capture};"
               + (f" diagnosing after {duration_s:g} s" if duration_s else " Ctrl-C to stop and diagnose"), err=True)  # fmt: skip
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
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
    click.echo(f"latprof: capture written to {capture} ({stats.spans:,} spans from {stats.requests:,} export requests)", err=True)
    diagnosis = run_diagnosis([capture], warmup_s=warmup_s, source_kind="receive")
    _emit(lambda stream: renderers.get(fmt)(diagnosis.report, stream), output)
    _KEEP_UNTIL_EXIT.append(diagnosis)


def _receive_progress() -> Any:
    """A `\\r` line on a terminal (every tick); otherwise a line every 5 s while spans arrive."""
    tty = sys.stderr.isatty()
    last_at, last_counts = 0.0, (0, 0)

    def progress(stats: Any, elapsed_s: float) -> None:
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


@main.command()
@click.option(
    "--scenario",
    default="pool-held-across-llm",
    show_default=True,
    metavar="NAME",
    help=(
        "The fault to show: pool-held-across-llm, threadpool-queueing, provider-floor, provider-spikes,"
        " long-outputs, blocking-call, or healthy (no fault)."
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
@_format_option
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the report here instead of stdout.")
def demo(scenario: str, dsn: str | None, out: Path | None, duration_s: float | None, fmt: str, output: Path | None) -> None:
    """Run a bundled AI service with a known fault under load, and diagnose it.

    Starts a local OpenAI-compatible provider and a small FastAPI + SQLAlchemy + openai service
    under `latprof run`, sends open-loop load for ~20 s, stops the service and prints the report.
    """
    from latprof.demo.run import run_demo

    result = run_demo(scenario, dsn=dsn, capture=out, duration_s=duration_s, warmup_s=DEFAULT_WARMUP_S)
    _emit(lambda stream: renderers.get(fmt)(result.report, stream), output)
    _KEEP_UNTIL_EXIT.append(result)


def _diff_formats() -> list[str]:
    from latprof.ci.diff import names

    return names()


@main.command()
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(_diff_formats()), default="text", show_default=True,
              help="Diff format (markdown: for a pull-request comment or $GITHUB_STEP_SUMMARY).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the diff here instead of stdout.")
@click.option("--fail-on-regression", "threshold_pct", type=click.FloatRange(min=0), metavar="PCT",
              help="Exit 1 when AFTER's p99 is more than PCT percent above BEFORE's.")
@_warmup_option
@click.pass_context
def diff(ctx: click.Context, before: Path, after: Path, fmt: str, output: Path | None, threshold_pct: float | None,
         warmup_s: float) -> None:  # fmt: skip
    """Compare two diagnoses: p99, each layer's time in the slowest 1%, the verdict and the findings, BEFORE → AFTER.

    BEFORE and AFTER are anything `latprof analyze` reads (captures, trace files, directories), or
    reports it saved with `--format json` (--skip-warmup does not apply to those).
    """
    from latprof.ci.diff import diff_paths, regression_failure, render

    result, loaded = diff_paths(before, after, warmup_s=warmup_s, threshold_pct=threshold_pct)
    _KEEP_UNTIL_EXIT.append(loaded)
    _emit(lambda out: render(result, fmt, out), output)
    failure = regression_failure(result)
    if failure is not None:
        click.echo(f"latprof diff: {failure}", err=True)
        ctx.exit(1)


@main.group(invoke_without_command=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True,
              help="json or markdown: the whole catalogue (documentation, thresholds) to publish.")
@_CONFIG_OPTION
@click.pass_context
def rules(ctx: click.Context, fmt: str, config_path: Path | None) -> None:
    """List every rule (built-in and from installed packages), or explain one: `latprof rules explain ID`.

    Thresholds are shown with the values the config gives them.
    """
    ctx.ensure_object(dict)
    ctx.obj["config_path"] = config_path
    if ctx.invoked_subcommand is None:
        from latprof.report import catalogue

        config, classes = _rules_config(config_path)
        catalogue.FORMATS[fmt](catalogue.entries(classes, config), config, sys.stdout)


def _rules_config(config_path: Path | None) -> tuple[Any, Any]:
    from latprof.ci.config import load_config
    from latprof.engine import all_rules

    classes = all_rules()
    return load_config(config_path, rule_classes=classes), classes


@rules.command()
@click.argument("rule_id")
@_CONFIG_OPTION
@click.pass_context
def explain(ctx: click.Context, rule_id: str, config_path: Path | None) -> None:
    """Print a rule's documentation and thresholds (with the values the config gives them)."""
    from latprof.report import catalogue

    config, classes = _rules_config(config_path or (ctx.obj or {}).get("config_path"))
    by_id = {rule.id: rule for rule in classes}
    rule = by_id.get(rule_id)
    if rule is None:
        close = difflib.get_close_matches(rule_id, by_id, n=1)
        hint = f" (did you mean {close[0]}?)" if close else f"; known rules: {', '.join(by_id)}"
        raise ConfigError(f"no rule {rule_id!r}{hint}")
    catalogue.explain_text(catalogue.entries([rule], config)[0], sys.stdout)


def entry_point() -> None:
    """The `latprof` console script: `main`, then exit without tearing down the heap.

    A diagnosed capture can hold millions of objects; freeing them one by one at exit took
    longer than some analysis steps, and nothing is left to do by then but flush the output.
    """
    code: int
    try:
        main()
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # `latprof ... | head`: the reader went away
        code = code or 1
    os._exit(code)
