"""Every output format latprof writes; those a `--format` chooses are registered by kind and name.

Renderers only render: each takes a finished result (a `Report`, a `CheckRun`, a `Diff`, the
rule `Catalogue`) and writes it; whatever they show was computed before, in `latprof.report`,
`latprof.ci` or `latprof.analysis`. One module per kind and format, named for both
(`report_text`, `check_markdown`, `diff_json`, `rules_markdown`, ...), registers its function
on the kind's `Formats`:

    @CHECK.register("text")
    def render_text(run: CheckRun, out: TextIO) -> None: ...

    CHECK.names()                    # ["json", "markdown", "text"]: `latprof check --format`'s choices
    CHECK.render("text", run, out)   # ValueError for a name not registered

The kinds are `REPORT`, `CHECK`, `DIFF` and `RULES` (`KINDS` by name). Formats an option other
than `--format` asks for live here too, as plain functions: `check_junit` and `check_sarif`
(`latprof check --junit/--sarif FILE`), `check_github` (annotations under GitHub Actions),
`rules_text.explain` (`latprof rules explain ID`) and `top_table` (`latprof top`'s display).
The built-in renderer modules are imported the first time a kind is asked for its formats, so
importing this package stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Generic, TextIO, TypeVar

if TYPE_CHECKING:
    from latprof.ci.checks import CheckRun
    from latprof.ci.diff import Diff
    from latprof.report.catalogue import Catalogue
    from latprof.report.model import Report

T = TypeVar("T")


class Formats(Generic[T]):
    """The formats of one kind of result, by name; `load` imports the modules that register the built-in ones."""

    def __init__(self, kind: str, load: Callable[[], object]) -> None:
        self.kind = kind
        self._load = load
        self._loaded = False
        self._by_name: dict[str, Callable[[T, TextIO], None]] = {}

    def register(self, name: str) -> Callable[[Callable[[T, TextIO], None]], Callable[[T, TextIO], None]]:
        """A decorator: register the function as the format `name` of this kind."""

        def decorate(fn: Callable[[T, TextIO], None]) -> Callable[[T, TextIO], None]:
            self._by_name[name] = fn
            return fn

        return decorate

    def names(self) -> list[str]:
        """Every format of this kind, sorted."""
        return sorted(self._registered())

    def get(self, name: str) -> Callable[[T, TextIO], None]:
        """The renderer of format `name`; ValueError for a name not registered."""
        registered = self._registered()
        try:
            return registered[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} format {name!r}; known: {', '.join(self.names())}") from None

    def render(self, name: str, value: T, out: TextIO) -> None:
        """Write `value` to `out` in the format `name`; ValueError for a name not registered."""
        self.get(name)(value, out)

    def _registered(self) -> dict[str, Callable[[T, TextIO], None]]:
        if not self._loaded:
            self._loaded = True
            self._load()
        return self._by_name


def _load_report() -> None:
    from latprof.report.renderers import report_html, report_json, report_text  # noqa: F401  (registration)


def _load_check() -> None:
    from latprof.report.renderers import check_json, check_markdown, check_text  # noqa: F401  (registration)


def _load_diff() -> None:
    from latprof.report.renderers import diff_html, diff_json, diff_markdown, diff_text  # noqa: F401  (registration)


def _load_rules() -> None:
    from latprof.report.renderers import rules_json, rules_markdown, rules_text  # noqa: F401  (registration)


#: `latprof analyze/run/attach/receive/demo --format`: a diagnosis's report.
REPORT: Formats[Report] = Formats("report", _load_report)
#: `latprof check --format`: a check run's results on stdout (or -o).
CHECK: Formats[CheckRun] = Formats("check", _load_check)
#: `latprof diff --format`: two diagnoses compared.
DIFF: Formats[Diff] = Formats("diff", _load_diff)
#: `latprof rules --format`: the rule catalogue.
RULES: Formats[Catalogue] = Formats("rules", _load_rules)

KINDS: dict[str, Formats[Any]] = {f.kind: f for f in (REPORT, CHECK, DIFF, RULES)}

