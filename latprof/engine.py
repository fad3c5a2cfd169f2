"""The rule engine: the `Rule` interface, findings, discovery of the built-in rules, and running them."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import textwrap
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Mapping, Sequence

from latprof.analysis.requests import Analysis, LayerStats
from latprof.layers import LAYERS

if TYPE_CHECKING:
    from latprof.attach.analysis import AttachAnalysis

SEVERITIES = ("critical", "warning", "info")
DOC_SECTIONS = ("What it detects", "Why it matters for p99", "Evidence", "How to fix", "Example")
_ID = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing a rule found: the layer, how bad, how sure, the numbers behind it and the fix.

    `impact_ms` is how much of the tail (mean excess of the slowest 1% over the median) the
    finding explains. `fingerprint` is stable across runs for the same problem (rule, layer
    and the finding's subject such as a pool or a statement), not for the same numbers.
    """

    rule: str
    layer: str | None
    severity: str
    confidence: float
    impact_ms: float
    summary: str
    evidence: Mapping[str, Any]
    fix: str
    fingerprint: str

    @property
    def crashed(self) -> bool:
        return bool(self.evidence.get("rule_crashed"))


@dataclass(frozen=True, slots=True)
class NoThresholds:
    """A rule without tunable thresholds."""


class Rule:
    """Base of every rule. A rule is one file in `rules/`, a subclass with a docstring in sections.

    Subclasses set `id` (stable, kebab-case), `layer`, and `Thresholds` (a frozen dataclass
    whose field names carry their units), and judge one kind of analysis or both:

    - `check(analysis)`: a request analysis (`latprof run` captures, trace files: requests
      and their segments);
    - `judge_samples(samples)`: a sample analysis (`latprof attach` captures: stack samples,
      wait channels and gauges of a service seen from outside, `latprof.attach.analysis`).

    `run_rules` gives each rule the analysis it has: a rule that does not implement
    `judge_samples` finds nothing in an attach capture, and one that implements only
    `judge_samples` is not asked about requests (`judges`). The config (`enabled`, `severity`,
    thresholds) applies to both; thresholds used only on attach captures start with `attach_`.
    """

    id: ClassVar[str] = ""
    layer: ClassVar[str] = ""
    Thresholds: ClassVar[type] = NoThresholds

    def __init__(self, thresholds: Any = None) -> None:
        self.thresholds = thresholds if thresholds is not None else self.Thresholds()

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        """The findings of a request analysis."""
        raise NotImplementedError

    def judge_samples(self, samples: AttachAnalysis) -> Iterable[Finding]:
        """The findings of a sample analysis (an attach capture); none unless a rule implements it."""
        return ()

    @classmethod
    def judges(cls) -> tuple[str, ...]:
        """What the rule judges: "requests", "samples" or both (by the methods it implements)."""
        samples = cls.judge_samples is not Rule.judge_samples
        requests = cls.check is not Rule.check or not samples
        return tuple(kind for kind, judged in (("requests", requests), ("samples", samples)) if judged)

    def finding(
        self,
        *,
        severity: str,
        confidence: float,
        impact_ms: float,
        summary: str,
        evidence: Mapping[str, Any],
        fix: str,
        subject: str = "",
        layer: str | None = None,
    ) -> Finding:
        """Build a finding of this rule; `subject` (a pool, a statement) makes its fingerprint."""
        if severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {severity!r}")
        layer = layer or self.layer
        return Finding(
            rule=self.id,
            layer=layer,
            severity=severity,
            confidence=round(min(1.0, max(0.0, confidence)), 3),
            impact_ms=round(max(0.0, impact_ms), 3),
            summary=summary,
            evidence=dict(evidence),
            fix=fix,
            fingerprint=fingerprint(self.id, layer, subject),
        )

    @classmethod
    def docs(cls) -> dict[str, str]:
        """The rule's documentation, by section (`DOC_SECTIONS`), from its docstring."""
        return parse_doc_sections(cls.__doc__ or "")

    @classmethod
    def summary_line(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    @classmethod
    def threshold_fields(cls) -> list[tuple[str, str, Any]]:
        """(name, type, default) of each threshold."""
        return [
            (f.name, f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type)), f.default)
            for f in dataclasses.fields(cls.Thresholds)
        ]


def fingerprint(rule_id: str, layer: str | None, subject: str) -> str:
    return hashlib.sha1(f"{rule_id}\0{layer}\0{subject}".encode()).hexdigest()[:16]


def parse_doc_sections(doc: str) -> dict[str, str]:
    """Split a docstring into its `Title:`-headed sections (the first line is the summary)."""
    sections: dict[str, list[str]] = {}
    current: str | None = None
    lines = doc.expandtabs().splitlines()
    indent = min((len(line) - len(line.lstrip()) for line in lines[1:] if line.strip()), default=0)
    for line in lines[1:]:
        text = line[indent:] if len(line) >= indent else line.strip()
        title = text.rstrip().rstrip(":")
        if text.rstrip().endswith(":") and title in DOC_SECTIONS:
            current = title
            sections[current] = []
        elif current is not None:
            sections[current].append(text.rstrip())
    return {name: textwrap.dedent("\n".join(body)).strip("\n") for name, body in sections.items()}


def validate_rule_class(cls: type[Rule]) -> None:
    """Raise TypeError when a rule class breaks the contract (id, layer, thresholds, docs)."""
    if not _ID.match(cls.id or ""):
        raise TypeError(f"{cls.__name__}: id {cls.id!r} is not a kebab-case id")
    if cls.layer not in LAYERS:
        raise TypeError(f"{cls.__name__}: layer {cls.layer!r} is not a report-v1 layer")
    params = getattr(cls.Thresholds, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(f"{cls.__name__}: Thresholds must be a frozen dataclass")
    docs = cls.docs()
    missing = [s for s in DOC_SECTIONS if not docs.get(s)]
    if missing:
        raise TypeError(f"{cls.__name__}: docstring lacks section(s) {', '.join(missing)}")


def discover_rules() -> list[type[Rule]]:
    """Every built-in rule: the Rule subclasses of each module listed in `latprof.rules.MODULES`."""
    from latprof import rules

    found: dict[str, type[Rule]] = {}
    for module in rules.MODULES:
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Rule) and value.__module__ == module.__name__ and value.id:
                validate_rule_class(value)
                if value.id in found:
                    raise TypeError(f"rule id {value.id!r} is defined twice")
                found[value.id] = value
    return [found[k] for k in sorted(found)]


#: The entry point group other packages register rules under (a Rule subclass, or a module of them).
ENTRY_POINT_GROUP = "latprof.rules"


def plugin_rules() -> list[type[Rule]]:
    """The rules other installed packages provide through the `latprof.rules` entry point group.

    Each entry point names a Rule subclass (`pkg.module:MyRule`) or a module whose Rule
    subclasses are taken. One that cannot be loaded, names no rule, or breaks the rule contract
    is a ConfigError naming the entry point and its distribution: a gate must not pass because
    a check silently went missing.
    """
    return [cls for cls, _ in _plugin_rules()]


def _plugin_rules() -> list[tuple[type[Rule], str]]:
    """(rule class, "entry point 'name' (value, from dist)") of each entry-point rule."""
    import types
    from importlib.metadata import entry_points

    from latprof.errors import ConfigError

    found: list[tuple[type[Rule], str]] = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = getattr(getattr(ep, "dist", None), "name", None)
        where = f"entry point {ep.name!r} ({ep.value}{f', from {dist}' if dist else ''})"
        try:
            loaded = ep.load()
        except Exception as exc:
            raise ConfigError(f"{where}: cannot be loaded: {type(exc).__name__}: {exc}") from None
        if isinstance(loaded, type):
            if not issubclass(loaded, Rule):
                raise ConfigError(f"{where}: {loaded.__qualname__} is not a latprof.engine.Rule subclass")
            classes = [loaded]
        elif isinstance(loaded, types.ModuleType):
            classes = [v for v in vars(loaded).values() if isinstance(v, type) and issubclass(v, Rule)
                       and v.__module__ == loaded.__name__ and v.id]  # fmt: skip
            if not classes:
                raise ConfigError(f"{where}: module {loaded.__name__} defines no latprof.engine.Rule subclass with an id")
        else:
            raise ConfigError(f"{where}: names a {type(loaded).__name__}, not a Rule subclass or a module of them")
        for cls in classes:
            try:
                validate_rule_class(cls)
            except TypeError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            found.append((cls, where))
    return found


def all_rules() -> list[type[Rule]]:
    """The built-in rules and those of installed packages (entry points), by id; an id used twice is a ConfigError."""
    from latprof.errors import ConfigError

    by_id: dict[str, type[Rule]] = {cls.id: cls for cls in discover_rules()}
    for cls, where in _plugin_rules():
        taken = by_id.get(cls.id)
        if taken is not None and taken is not cls:
            raise ConfigError(f"{where}: rule id {cls.id!r} of {cls.__module__}.{cls.__qualname__} is already taken by"
                              f" {taken.__module__}.{taken.__qualname__}")  # fmt: skip
        by_id[cls.id] = cls
    return [by_id[k] for k in sorted(by_id)]


def configured(rule_classes: Sequence[type[Rule]], settings: Mapping[str, Any]) -> list[Rule]:
    """An instance of each enabled rule with its thresholds as configured (`settings`: id -> RuleSettings)."""
    out: list[Rule] = []
    for cls in rule_classes:
        rule_settings = settings.get(cls.id)
        if rule_settings is None:
            out.append(cls())
        elif rule_settings.enabled:
            out.append(cls(dataclasses.replace(cls.Thresholds(), **rule_settings.thresholds)))
    return out


def run_rules(analysis: Analysis | AttachAnalysis, rules: Sequence[Rule]) -> list[Finding]:
    """Run each rule on a request analysis (`check`) or a sample analysis (`judge_samples`); a rule
    that raises becomes a finding of its own. Sorted by impact, largest first; of equal impact, the
    findings of rules whose own layer is the finding's first, then by rule id."""
    findings: list[Finding] = []
    requests = isinstance(analysis, Analysis)
    own_layer = {rule.id: rule.layer for rule in rules}
    for rule in rules:
        if ("requests" if requests else "samples") not in rule.judges():
            continue
        try:
            findings.extend(rule.check(analysis) if isinstance(analysis, Analysis) else rule.judge_samples(analysis))
        except Exception as exc:  # a broken rule must not take the report down with it
            where = traceback.extract_tb(exc.__traceback__)[-1]
            findings.append(
                Finding(
                    rule=rule.id,
                    layer=None,
                    severity="warning",
                    confidence=0.0,
                    impact_ms=0.0,
                    summary=f"rule {rule.id} crashed ({type(exc).__name__}: {exc}); its check did not run",
                    evidence={
                        "rule_crashed": True,
                        "error": f"{type(exc).__name__}: {exc}",
                        "at": f"{where.filename}:{where.lineno}",
                    },
                    fix="report this as a latprof bug, with the capture if you can share it",
                    fingerprint=fingerprint(rule.id, None, "crash"),
                )
            )
    # Of equal impact, a rule made for the finding's layer first: it names the mechanism (a pool held
    # across the LLM call), a rule that judges any layer (capacity-exceeded) the circumstance.
    findings.sort(key=lambda f: (-f.impact_ms, own_layer.get(f.rule) != f.layer, f.rule, f.fingerprint))
    return findings


# --- helpers rules share ----------------------------------------------------------------------


def owns_tail(analysis: Analysis, stats: LayerStats, *, min_share: float, min_excess_ms: float) -> bool:
    """True when there is a tail worth explaining (report-v1) and this layer explains at least
    `min_share` of its excess over the median and at least `min_excess_ms` of it."""
    return (
        analysis.has_tail and stats.tail_excess_ms >= min_excess_ms and stats.share_of_tail_excess >= min_share
    )


@dataclass(frozen=True, slots=True)
class WaitThresholds:
    """The thresholds every rule of a wait layer (`queue`, `event_loop`, `db.pool`, `http.pool`,
    `retry`, `lock`) starts its own `Thresholds` with (a subclass may change a default)."""

    min_share_of_tail_excess: float = 0.2
    min_tail_excess_ms: float = 50.0
    #: Without a tail it owns, the wait must take this share of the median request's latency ...
    min_share_of_median_latency: float = 0.5
    #: ... and at least this long (every request waits: the wait is the latency).
    min_median_wait_ms: float = 20.0


def judge_wait(analysis: Analysis, stats: LayerStats, thresholds: WaitThresholds) -> tuple[bool, bool, float]:
    """(owns the tail, dominates the median request, the share that decided): a wait layer is a
    finding when it owns the tail (`owns_tail`) or, tail or not, when every request waits there
    (`dominates_median`). The share is of the tail excess when it owns the tail, else of the
    median request's latency."""
    t = thresholds
    owns = owns_tail(analysis, stats, min_share=t.min_share_of_tail_excess, min_excess_ms=t.min_tail_excess_ms)
    dominates = dominates_median(analysis, stats, min_share=t.min_share_of_median_latency, min_ms=t.min_median_wait_ms)
    return owns, dominates, stats.share_of_tail_excess if owns else analysis.share_of_median(stats.layer)


def wait_evidence(analysis: Analysis, stats: LayerStats, name: str, dominates: bool) -> dict[str, object]:
    """`layer_evidence`, and `median_evidence` when the layer dominates the median request."""
    evidence: dict[str, object] = {**layer_evidence(stats, name)}
    if dominates:
        evidence.update(median_evidence(analysis, stats))
    return evidence


def dominates_median(analysis: Analysis, stats: LayerStats, *, min_share: float, min_ms: float) -> bool:
    """True when the layer takes at least `min_share` of the typical request's latency (the
    median cohort's mean) and at least `min_ms` of it, over enough requests for a verdict
    (report-v1): every request waits there, so it is a finding whether or not there is a tail."""
    return (
        analysis.enough_for_verdict
        and stats.median_mean_ms >= min_ms
        and analysis.share_of_median(stats.layer) >= min_share
    )


def median_evidence(analysis: Analysis, stats: LayerStats) -> dict[str, object]:
    """The evidence of a layer that dominates the typical request: its time there, that request's
    latency and the share, with the latency ratio that says whether there is a tail."""
    lat = analysis.latency
    return {
        "dominates_median": True,
        "median_ms": round(stats.median_mean_ms, 3),
        "median_latency_ms": round(analysis.median_latency_ms, 3),
        "share_of_median_latency": round(analysis.share_of_median(stats.layer), 4),
        "p99_over_p50": round(lat.p99_ms / lat.p50_ms, 2) if lat and lat.p50_ms > 0 else None,
    }


def median_summary(analysis: Analysis, stats: LayerStats, what: str) -> str:
    """'Every request {what}: 209 ms of the median request's 240 ms (87%)': the opening of a
    finding whose layer dominates the typical request rather than the tail."""
    return (
        f"Every request {what}: {fmt_ms(stats.median_mean_ms)} of the median request's"
        f" {fmt_ms(analysis.median_latency_ms)} ({analysis.share_of_median(stats.layer):.0%})"
    )


def severity_for_median(analysis: Analysis, stats: LayerStats, critical_at: float = 0.75) -> str:
    """The severity of a layer that dominates the typical request: critical from `critical_at` of its latency."""
    return severity_for_share(analysis.share_of_median(stats.layer), critical_at)


def layer_evidence(stats: LayerStats, name: str) -> dict[str, float]:
    """The evidence every layer rule starts with: `{name}_p50_ms`, `{name}_p99_ms`, tail excess and share."""
    return {
        f"{name}_p50_ms": round(stats.p50_ms, 3),
        f"{name}_p99_ms": round(stats.p99_ms, 3),
        "tail_excess_ms": round(stats.tail_excess_ms, 3),
        "share_of_tail_excess": round(stats.share_of_tail_excess, 4),
    }


def severity_for_share(share: float, critical_at: float = 0.5) -> str:
    return "critical" if share >= critical_at else "warning"


def fmt_ms(ms: float) -> str:
    """Format milliseconds the way findings print them: `840 ms`, `6.2 s`."""
    if ms >= 10_000:
        return f"{ms / 1000:.0f} s"
    if ms >= 1000:
        return f"{ms / 1000:.1f} s"
    if ms >= 10:
        return f"{ms:.0f} ms"
    return f"{ms:.1f} ms"
