"""The `latprof` click group and what its commands share: options, error handling, writing output."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, TextIO, TypeVar

import click
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from latprof import __version__
from latprof.analysis.requests import DEFAULT_WARMUP_S
from latprof.errors import InputError, LatprofError
from latprof.report import renderers

if TYPE_CHECKING:
    from latprof.ci.config import Config
    from latprof.engine import Rule
    from latprof.pipeline import Diagnosis
    from latprof.report.model import Report

# Exit codes: 0 ok, 1 a failed check, 2 usage/input/config errors, 3 a latprof bug.
EXIT_INTERNAL = 3

# Big results a command is done with: freeing millions of objects one by one takes longer
# than exiting, so the console script (`entry_point`) leaves without freeing them.
KEEP_UNTIL_EXIT: list[object] = []

F = TypeVar("F", bound=Callable[..., Any])


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


# --- options ----------------------------------------------------------------------------------


def format_option(fn: F) -> F:
    """`--format` of a command that prints a report (the formats registered on `renderers.REPORT`),
    and `--include-attributes` for the HTML one (`check_format` tells a misuse up front)."""
    fn = click.option(
        "--include-attributes",
        is_flag=True,
        help="With --format html: also show SQL statements and URLs with each segment (left out by default: the file is made to be shared).",
    )(fn)
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(renderers.REPORT.names()),
        default="text",
        show_default=True,
        help="Report format (html: one self-contained page, best written with -o FILE).",
    )(fn)


def check_format(fmt: str, include_attributes: bool) -> None:
    """A usage error for --include-attributes without --format html (before anything runs)."""
    if include_attributes and fmt != "html":
        raise click.UsageError("--include-attributes applies to --format html only")


def output_option(what: str) -> Callable[[F], F]:
    """`-o/--output FILE`: write `what` there instead of stdout."""
    return click.option(
        "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help=f"Write the {what} here instead of stdout."
    )


def warmup_option(fn: F) -> F:
    return click.option(
        "--skip-warmup",
        "warmup_s",
        type=click.FloatRange(min=0),
        default=DEFAULT_WARMUP_S,
        show_default=True,
        metavar="S",
        help="Leave out the first S seconds of each process's traffic (of each service instance's, in traces).",
    )(fn)


def engine_metrics_option(fn: F) -> F:
    return click.option(
        "--engine-metrics",
        "engine_metrics",
        multiple=True,
        metavar="URL",
        help="Also scrape this Prometheus endpoint of a self-hosted inference engine (vLLM, SGLang, TGI, llama.cpp's"
        " server; e.g. http://127.0.0.1:8000/metrics) once a second into the capture. May be repeated.",
    )(fn)


def check_engine_metrics(urls: tuple[str, ...]) -> list[str]:
    """The `--engine-metrics` URLs, each checked (one line and exit 2 for a bad one, before anything starts)."""
    from latprof.collectors.scrape.prometheus import check_url

    return [check_url(url) for url in urls]


config_option = click.option(
    "--config", "config_path", type=click.Path(path_type=Path), metavar="FILE",
    help="pyproject.toml ([tool.latprof]) or latprof.toml; default: the nearest one from the working directory.",
)  # fmt: skip


# --- output -----------------------------------------------------------------------------------


def emit(write: Callable[[TextIO], None], output: Path | None) -> None:
    """Call `write` with stdout, or with the file `output` (an unwritable one is an `InputError`)."""
    if output is None:
        write(sys.stdout)
        return
    try:
        with open(output, "w", encoding="utf-8") as out:
            write(out)
    except OSError as exc:
        raise InputError(f"{output}: cannot write: {exc.strerror or exc}") from None


def print_report(report: Report, fmt: str, output: Path | None, diagnosis: Diagnosis | None = None,
                 include_attributes: bool = False) -> None:  # fmt: skip
    """Write `report` in the format `fmt` to stdout, or to the file `output`; for html, with the
    pictures of `diagnosis` (`latprof.report.pictures`) drawn from the capture."""
    if fmt == "html" and diagnosis is not None:
        from latprof.report.pictures import with_pictures

        report = with_pictures(diagnosis, report, include_attributes=include_attributes)
    emit(lambda out: renderers.REPORT.render(fmt, report, out), output)


def report_command(capture: Path, warmup_s: float | None = DEFAULT_WARMUP_S, config_path: Path | None = None) -> str:
    """The command that prints the report of `capture` again (None: the warm-up the config sets)."""
    return (
        f"latprof analyze {capture}"
        + ("" if warmup_s is None or warmup_s == DEFAULT_WARMUP_S else f" --skip-warmup {warmup_s:g}")
        + (f" --config {config_path}" if config_path is not None else "")
    )


class Judging:
    """What a report is judged by: the config (`--config`, else the nearest one from the working
    directory) and the rules. `run`, `attach` and `receive` load it before they capture anything,
    so a bad config is one line and exit 2 up front, and their report says what `latprof
    analyze` of the capture says."""

    def __init__(self, config_path: Path | None, warmup_s: float | None = None) -> None:
        from latprof.ci.config import load_config
        from latprof.engine import all_rules

        self.path = config_path
        self.classes: list[type[Rule]] = all_rules()
        self.config: Config = load_config(config_path, rule_classes=self.classes)
        #: --skip-warmup when given on the command line; None: the config's, else the default
        self.warmup_s = warmup_s

    def diagnose(self, paths: Sequence[Any], source_kind: str | None = None, trace_id: str | None = None,
                 exact: bool = False, sample_requests: int | None = None) -> Diagnosis:  # fmt: skip
        from latprof.pipeline import run_configured

        return run_configured(paths, self.config, self.classes, warmup_s=self.warmup_s, source_kind=source_kind,
                              trace_id=trace_id, exact=exact, sample_requests=sample_requests)  # fmt: skip

    def command(self, capture: Path) -> str:
        """`latprof analyze` of `capture` as this report was judged."""
        return report_command(capture, self.warmup_s, self.path)


def reading_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--exact` and `--sample-requests`, on the commands that analyse files (`exact`, `sample_requests`)."""
    from latprof.analysis.cohort_first import DEFAULT_SAMPLE_REQUESTS

    command = click.option(
        "--sample-requests", "sample_requests", type=click.IntRange(min=1), default=DEFAULT_SAMPLE_REQUESTS,
        show_default=True, metavar="N",
        help="In a large capture, how many requests besides the tail, median and per-window tail ones to read the"
        " segments of: the sample that estimates the layers' p50/p99.",
    )(command)
    return click.option(
        "--exact", is_flag=True,
        help="Read and analyse every segment. By default a large capture is read cohort-first: each request's latency,"
        " then the segments of the tail, median and per-window tail requests and of a fixed sample of the others (a"
        " trace file is read and inferred whole, then analysed so); the verdict and tail numbers are exact, the layers'"
        " p50/p99 estimated (the report's collection.estimated says so).",
    )(command)  # fmt: skip


#: A command's inputs (paths, or `clickhouse://` URLs) as typed: `resolve_inputs` makes each a `Path` or a source (a
#: `click.Path` would fold a URL's "//").
INPUT = click.UNPROCESSED


def table_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--since`, `--until`, `--service`, `--route`: which requests of a `clickhouse://` input to read."""
    for option in reversed((
        click.option("--since", metavar="TIME", help="For clickhouse:// inputs: read the requests that began since TIME (1h, 30m, 2d ago;"
                     " an ISO 8601 time; epoch seconds). Required for them, unless the URL says since=."),
        click.option("--until", metavar="TIME", help="For clickhouse:// inputs: ... and before TIME [default: now]."),
        click.option("--service", metavar="NAME", help="For clickhouse:// inputs: only the requests whose root span is this service's."),
        click.option("--route", metavar="ROUTE", help="For clickhouse:// inputs: only this route, as the report names it ('GET /chat')."),
    )):  # fmt: skip
        command = option(command)
    return command


def resolve_inputs(values: Sequence[Any], *, since: str | None, until: str | None, service: str | None, route: str | None,
                   sample_requests: int, exact: bool = False) -> list[Any]:  # fmt: skip
    """The command's inputs with each `clickhouse://` URL made a source, its range and filters from the URL, else the
    options (`exact`: every request in the range comes back); its warnings (a password in the URL) said on stderr. The
    options without such an input are a usage error."""
    from latprof.collectors.traces.clickhouse import is_clickhouse_url, source_of

    out: list[Any] = []
    for value in values:
        if is_clickhouse_url(value):
            source = source_of(value, since=since, until=until, service=service, route=route, sample_requests=sample_requests,
                               exact=exact)  # fmt: skip
            for warning in source.warnings:
                click.echo(f"latprof: warning: {warning}", err=True)
            out.append(source)
        else:
            out.append(Path(value))
    if len(out) == sum(isinstance(v, Path) for v in out) and any(v is not None for v in (since, until, service, route)):
        raise click.UsageError("--since, --until, --service and --route apply to clickhouse:// inputs only")
    return out


def given_warmup(ctx: click.Context, warmup_s: float) -> float | None:
    """--skip-warmup when the command line gave it, else None (the config decides)."""
    return warmup_s if ctx.get_parameter_source("warmup_s") is not click.core.ParameterSource.DEFAULT else None


def print_capture_report(report: Report, fmt: str, output: Path | None, capture: Path, *, written: str = "",
                         again: str | None = None, diagnosis: Diagnosis | None = None,
                         include_attributes: bool = False) -> None:  # fmt: skip
    """The report at the end of `run`, `attach` and `receive`, set apart from what came before it.

    A service's own output (thousands of access-log lines) precedes it: a banner on stderr
    opens the report, and a footer on stderr says where the capture was written (`written`
    adds to that) and how to see the report again. stdout holds the report alone, so a JSON
    report stays parseable.
    """
    if output is None:
        banner(f"latprof report — {capture}")
    print_report(report, fmt, output, diagnosis, include_attributes)
    sys.stdout.flush()  # the report before the footer, when both go to one terminal
    if output is not None:
        click.echo(f"latprof: report written to {output}", err=True)
    click.echo(f"latprof: capture written to {capture}{written}; to see this report again: {again or report_command(capture)}",
               err=True)  # fmt: skip


def banner(title: str) -> None:
    """A rule across stderr with `title` in it; the rule, then the whole title, when it does not fit in it."""
    console = Console(file=sys.stderr, highlight=False)
    text = Text(title, style="bold")
    if cell_len(title) + 8 <= console.width:
        console.rule(text, style="cyan")
    else:  # a long capture path stays whole, to be copied
        console.rule(style="cyan")
        console.print(text, soft_wrap=True)
