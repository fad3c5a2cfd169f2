"""Checks: the configured budgets and rules run against a diagnosis as a CI gate, each a result that passes, fails or is skipped."""

from __future__ import annotations

import difflib
import fnmatch
import itertools
import math
import operator
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from latprof.analysis.requests import NS_PER_MS, Analysis, LatencySummary, percentile, summarize_latency, weighted_percentile
from latprof.capture.reader import Input
from latprof.events import Segment
from latprof.ci.config import BUDGET_METRICS, LAYER_METRICS, Config, CustomCheck, Limit, load_config, percentile_of
from latprof.engine import Finding, Rule
from latprof.layers import DB_POOL, PROVIDER
from latprof.report.model import Report
from latprof.semconv import TTFT_KNOWN

if TYPE_CHECKING:
    from latprof.pipeline import Diagnosis

#: What became of a check: it held, it did not, or it could not be evaluated (no data for it).
OUTCOMES = ("pass", "fail", "skip")
#: How a failed check is reported: "error" fails the gate (exit 1), "warning" is reported only.
LEVELS = ("error", "warning")
#: Where a check comes from: a budget of the config, a rule (built-in or from an entry point), a declarative rule.
KINDS = ("budget", "rule", "custom")


@dataclass(frozen=True, slots=True)
class Location:
    """Code a check's finding points at: a stack frame or a span's `code.*` attributes."""

    path: str
    line: int | None = None
    function: str | None = None


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check and what became of it.

    `id` is stable across runs ("budget.p99_ms", "budget.route.POST /chat.p99_ms",
    "rule.db-pool-exhaustion", "custom.<name>"): CI systems key test history on it.
    `message` is one sentence with the observed value and the threshold (a rule's: its
    finding's summary). `observed`/`threshold` are in `unit` ("ms", "share", "count", "%"),
    None where the check has no single number (a rule that did not fire has no observed value).
    """

    id: str
    kind: str
    title: str
    outcome: str
    level: str
    message: str
    observed: float | None = None
    threshold: float | None = None
    unit: str = ""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    fix: str = ""
    rule: str | None = None
    layer: str | None = None
    fingerprint: str = ""
    locations: tuple[Location, ...] = ()
    description: str = ""

    @property
    def failed(self) -> bool:
        """Failed and gating: an error-level check that did not hold."""
        return self.outcome == "fail" and self.level == "error"


@dataclass(frozen=True)
class CheckRun:
    """Every check run on one diagnosis: what `latprof check` reports and its exit code comes from."""

    inputs: list[str]
    results: list[CheckResult]
    report: Report
    config_path: str | None = None
    baseline: str | None = None

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.failed]

    @property
    def warnings(self) -> list[CheckResult]:
        return [r for r in self.results if r.outcome == "fail" and r.level == "warning"]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


# --- running the checks ---------------------------------------------------------------------------

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
}  # fmt: skip
#: Findings of these severities fail their rule's check; an `info` finding is reported and passes.
FAILING_SEVERITIES = ("critical", "warning")
#: Span and segment attributes that say where in the code a call was made (OTel `code.*`, old and new names).
CODE_PATH_KEYS = ("code.file.path", "code.filepath")
CODE_LINE_KEYS = ("code.line.number", "code.lineno")
CODE_FUNCTION_KEYS = ("code.function.name", "code.function")


def run_checks(diagnosis: Diagnosis, config: Config, *, rule_classes: Sequence[type[Rule]],
               baseline: Diagnosis | None = None, inputs: Sequence[str] = (),
               baseline_input: str | None = None) -> CheckRun:  # fmt: skip
    """Every configured check against `diagnosis`: the budgets, then one check per enabled rule
    (the findings the diagnosis holds for it), then the declarative checks.

    `rule_classes` are the rules the diagnosis ran with (built-in and entry points); disabled
    ones are left out. A relative budget needs `baseline`; without one it is a ConfigError.
    """
    config.require_baseline(baseline)
    results: list[CheckResult] = []
    results += _budgets(diagnosis, config, baseline)
    results += _rules(diagnosis, config, rule_classes)
    results += [_custom(diagnosis, check) for check in config.checks]
    return CheckRun(list(inputs), results, diagnosis.report, config.path, baseline_input)


class _Metrics:
    """The numbers budgets are held against, from one diagnosis (None: no data for it)."""

    def __init__(self, diagnosis: Diagnosis) -> None:
        self.analysis = diagnosis.analysis

    def overall(self, metric: str) -> float | None:
        a = self.analysis
        if a is None or a.latency is None:
            return None
        if metric == "ttft_p99_ms":
            return _p99(a, [(i, s) for i, s in a.segments(PROVIDER) if s.attrs.get(TTFT_KNOWN) is True and s.end_ns > s.start_ns])
        if metric == "pool_wait_p99_ms":
            return _p99(a, a.segments(DB_POOL))
        return _latency_field(a.latency, metric)

    def layer(self, layer: str, metric: str) -> float | None:
        a = self.analysis
        if a is None or a.latency is None:
            return None
        stats = a.layer(layer)
        return {"share": stats.share_of_tail_excess, "tail_ms": stats.tail_excess_ms,
                "p99_ms": stats.p99_ms, "p50_ms": stats.p50_ms}[metric]  # fmt: skip

    def route(self, route: str, metric: str) -> tuple[float | None, int]:
        a = self.analysis
        if a is None:
            return None, 0
        population = a.population
        if population is not None:  # cohort-first: every request's latency is known, exactly
            roots = population.requests
            chosen = [k for k, r in enumerate(roots) if _route_matches(r.route, route)]
            latencies = [(roots[k].end_ns - roots[k].start_ns) / NS_PER_MS for k in chosen]
            weights = None if population.weights is None else [population.weights[k] for k in chosen]
        else:
            chosen = [i for i, rt in enumerate(a.requests) if _route_matches(rt.request.route, route)]
            latencies = [a.latencies_ms[i] for i in chosen]
            weights = None if a.weights is None else [a.weights[i] for i in chosen]
        summary = summarize_latency(latencies, weights)
        return (None if summary is None else _latency_field(summary, metric)), len(chosen)

    def routes(self) -> list[str]:
        a = self.analysis
        if a is None:
            return []
        if a.population is not None:
            return sorted({r.route for r in a.population.requests})
        return sorted({rt.request.route for rt in a.requests})


def _latency_field(summary: LatencySummary, metric: str) -> float:
    return float({"p50_ms": summary.p50_ms, "p90_ms": summary.p90_ms, "p99_ms": summary.p99_ms, "max_ms": summary.max_ms}[metric])


def _p99(analysis: Analysis, segments: Sequence[tuple[int, Segment]]) -> float | None:
    """p99 of the segments' durations, each counted as often as its request's sampling weight."""
    return _weighted(analysis, [(i, (s.end_ns - s.start_ns) / NS_PER_MS) for i, s in segments], 99.0)


def _weighted(analysis: Analysis, values: Sequence[tuple[int, float]], q: float) -> float | None:
    """Percentile `q` of (request index, value) pairs, a sampled request's value counting for the requests it stands for."""
    if not values:
        return None
    if analysis.weights is None:
        return percentile(sorted(v for _, v in values), q)
    ordered = sorted(values, key=lambda pair: pair[1])
    cumulative = list(itertools.accumulate(analysis.weight(i) for i, _ in ordered))
    return weighted_percentile([v for _, v in ordered], cumulative, q)


def _route_matches(route: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(route, pattern) if any(c in pattern for c in "*?[") else route == pattern


def _budgets(diagnosis: Diagnosis, config: Config, baseline: Diagnosis | None) -> list[CheckResult]:
    now, before = _Metrics(diagnosis), _Metrics(baseline) if baseline is not None else None
    out: list[CheckResult] = []
    no_latency = ("the input has no per-request latencies (an attach capture, or no requests after warm-up)"
                  if diagnosis.analysis is None or diagnosis.analysis.latency is None else None)  # fmt: skip
    for metric, limit in config.budget.items():
        what = BUDGET_METRICS[metric]
        out.append(_held(f"budget.{metric}", what, limit, now.overall(metric), before.overall(metric) if before else None,
                         "ms", no_data=no_latency or _no_data(metric)))  # fmt: skip
    for layer, limits in config.layer_budgets.items():
        for metric, limit in limits.items():
            unit = "share" if metric == "share" else "ms"
            out.append(_held(f"budget.layers.{layer}.{metric}", f"{layer} {LAYER_METRICS[metric]}", limit,
                             now.layer(layer, metric), before.layer(layer, metric) if before else None, unit,
                             no_data=no_latency, layer=layer))  # fmt: skip
    for budget in config.route_budgets:
        for metric, limit in budget.limits.items():
            observed, count = now.route(budget.route, metric)
            base = before.route(budget.route, metric)[0] if before else None
            no_data = no_latency
            if no_data is None and count == 0:
                close = difflib.get_close_matches(budget.route, now.routes(), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f"; routes seen: {', '.join(now.routes()[:8]) or 'none'}"
                no_data = f"no request of route {budget.route!r} was analysed{hint}"
            out.append(_held(f"budget.route.{budget.route}.{metric}", f"{budget.route} {metric.removesuffix('_ms')}",
                             limit, observed, base, "ms", no_data=no_data, extra={"route": budget.route, "requests": count}))  # fmt: skip
    return out


def _no_data(metric: str) -> str:
    return {"ttft_p99_ms": "no streamed LLM call with a measured time to first token was recorded",
            "pool_wait_p99_ms": "no connection checkout from a pool was recorded"}.get(metric, "no data")  # fmt: skip


def _held(check_id: str, what: str, limit: Limit, observed: float | None, base: float | None, unit: str, *,
          no_data: str | None, layer: str | None = None, extra: Mapping[str, Any] | None = None) -> CheckResult:  # fmt: skip
    """A budget's result: `observed` against the limit (or the baseline's value and the allowed change)."""
    threshold = limit.value
    evidence: dict[str, Any] = {"config_key": limit.key, **(extra or {})}
    if limit.relative_pct is not None:
        evidence.update(baseline=None if base is None else round(base, 3), allowed_change_pct=limit.relative_pct)
        threshold = None if base is None else base * (1 + limit.relative_pct / 100)
    bound_text = limit.describe(unit) if limit.value is None else _show(limit.value, unit)
    title = f"{what} <= {bound_text}"
    if observed is None or threshold is None:
        reason = no_data if observed is None else "the baseline has no value for it"
        return CheckResult(check_id, "budget", title, "skip", "error", f"{what}: not checked: {reason or 'no data'}",
                           None, threshold, unit, evidence, layer=layer)  # fmt: skip
    evidence["observed"] = round(observed, 4)
    ok = observed <= threshold
    shown, bound = _show(observed, unit), _show(threshold, unit)
    if limit.relative_pct is not None and base is not None:
        change = (observed / base - 1) * 100 if base > 0 else math.inf
        evidence["change_pct"] = round(change, 2) if math.isfinite(change) else None
        message = (f"{what} {shown} is {change:+.0f}% of the baseline's {_show(base, unit)}"
                   f" ({'within' if ok else 'over'} the allowed {limit.relative_pct:+g}%, {bound})")  # fmt: skip
    else:
        message = f"{what} {shown} {'within' if ok else 'over'} the budget of {bound}"
    return CheckResult(check_id, "budget", title, "pass" if ok else "fail", "error", message, round(observed, 4),
                       round(threshold, 4), unit, evidence, layer=layer,
                       fix="" if ok else "latprof analyze on the same input says which layer owns the time")  # fmt: skip


def _show(value: float, unit: str) -> str:
    if unit == "share":
        return f"{value:.0%}"
    if unit == "ms":
        if value >= 10_000:
            return f"{value / 1000:.2f}".rstrip("0").rstrip(".") + " s"
        return f"{value:.0f} ms" if value >= 10 else f"{value:.1f}".rstrip("0").rstrip(".") + " ms"
    return f"{value:g}"


def _rules(diagnosis: Diagnosis, config: Config, rule_classes: Sequence[type[Rule]]) -> list[CheckResult]:
    out: list[CheckResult] = []
    for cls in rule_classes:
        settings = config.rule(cls.id)
        if not settings.enabled:
            continue
        docs = cls.docs()
        description = docs.get("What it detects", "") or cls.summary_line()
        title = cls.id
        found = [f for f in diagnosis.findings if f.rule == cls.id]
        crashed = [f for f in found if f.crashed]
        failing = [f for f in found if not f.crashed and f.severity in FAILING_SEVERITIES]
        if crashed:
            out.append(CheckResult(f"rule.{cls.id}", "rule", title, "skip", settings.level, crashed[0].summary,
                                   evidence=dict(crashed[0].evidence), rule=cls.id, layer=cls.layer, description=description))
            continue
        if not failing:
            note = f" (info: {found[0].summary})" if found else ""
            out.append(CheckResult(f"rule.{cls.id}", "rule", title, "pass", settings.level,
                                   f"{cls.id} found nothing{note}", rule=cls.id, layer=cls.layer, description=description))
            continue
        top = failing[0]
        more = f" (and {len(failing) - 1} more finding{'s' if len(failing) > 2 else ''} of this rule)" if len(failing) > 1 else ""
        evidence = {"severity": top.severity, "confidence": top.confidence, "impact_ms": top.impact_ms, **top.evidence}
        out.append(CheckResult(
            f"rule.{cls.id}", "rule", title, "fail", settings.level, top.summary + more, top.impact_ms, None, "ms",
            evidence, top.fix, cls.id, top.layer, top.fingerprint, _locations(diagnosis, top), description,
        ))  # fmt: skip
    return out


def _locations(diagnosis: Diagnosis, finding: Finding) -> tuple[Location, ...]:
    """Code the finding points at: frames its evidence names with a location, else the `code.*`
    attributes of its layer's segments in its example requests."""
    found: list[Location] = []
    for frame in finding.evidence.get("hot_frames", ()) if isinstance(finding.evidence.get("hot_frames"), list) else ():
        where = frame.get("location") if isinstance(frame, dict) else None
        if isinstance(where, dict) and where.get("path"):
            found.append(Location(str(where["path"]), where.get("line") or None, where.get("function")))
    a = diagnosis.analysis
    examples = set(finding.evidence.get("example_request_ids") or ())
    if not found and a is not None and finding.layer is not None and examples:
        for _, segment in a.segments(finding.layer):
            if segment.request_id not in examples:
                continue
            path = _first(segment.attrs, CODE_PATH_KEYS)
            if path:
                line = _first(segment.attrs, CODE_LINE_KEYS)
                found.append(Location(str(path), int(line) if isinstance(line, int) else None,
                                      _first(segment.attrs, CODE_FUNCTION_KEYS)))  # fmt: skip
    unique = list(dict.fromkeys(found))
    return tuple(unique[:3])


def _first(attrs: Mapping[str, Any], keys: Sequence[str]) -> Any:
    return next((attrs[k] for k in keys if attrs.get(k) not in (None, "")), None)


def _custom(diagnosis: Diagnosis, check: CustomCheck) -> CheckResult:
    """A declarative check: the statistic of the requests or segments its `where` selects."""
    title = check.description or f"{check.id}: {check.stat} of {check.select} {check.op} {check.threshold:g}"
    share = check.stat == "share"
    unit = "share" if share else "count" if check.stat == "count" else "ms"
    evidence: dict[str, Any] = {"config_key": check.key, "select": check.select, "stat": check.stat}
    a = diagnosis.analysis
    if a is None or a.latency is None:
        return CheckResult(f"custom.{check.id}", "custom", title, "skip", check.level,
                           f"{check.id}: not checked: the input has no per-request latencies", None, check.threshold,
                           unit, evidence)  # fmt: skip
    requests = [i for i, rt in enumerate(a.requests) if check.route is None or _route_matches(rt.request.route, check.route)]
    # (request index, value) pairs: a sampled request's value counts for the requests it stands for
    if check.select == "requests":
        picked = [i for i in requests if _attrs_match(a.requests[i].request.attrs, check.attributes)]
        values = [(i, a.breakdowns[i].get(check.layer, 0.0) if check.layer else a.latencies_ms[i]) for i in picked]
        with_any = {i for i, v in values if v > 0 or not check.layer}
    else:
        in_route = set(requests)
        segments = [(i, s) for i, s in a.segments(check.layer) if i in in_route and _attrs_match(s.attrs, check.attributes)
                    and (check.name is None or fnmatch.fnmatchcase(s.name, check.name))]  # fmt: skip
        values = [(i, (s.end_ns - s.start_ns) / NS_PER_MS) for i, s in segments]
        with_any = {i for i, _ in segments}
    count = sum(a.weight(i) for i, _ in values)
    represented = sum(a.weight(i) for i in requests)
    evidence.update(matched=count, requests=represented)
    value: float | None
    if check.stat == "count":
        value = float(count)
    elif share:
        value = sum(a.weight(i) for i in with_any) / represented if represented else None
    elif not values:
        value = None
    elif check.stat == "mean":
        value = sum(a.weight(i) * v for i, v in values) / count
    elif check.stat == "max":
        value = max(v for _, v in values)
    else:
        value = _weighted(a, values, percentile_of(check.stat) or 50.0)
    if value is None:
        return CheckResult(f"custom.{check.id}", "custom", title, "skip", check.level,
                           f"{check.id}: not checked: nothing matched its selection", None, check.threshold, unit,
                           evidence)  # fmt: skip
    ok = _OPS[check.op](value, check.threshold)
    evidence["observed"] = round(value, 4)
    if check.message:
        message = check.message.format(value=value, threshold=check.threshold, count=count, id=check.id)
    else:
        message = (f"{check.id}: {check.stat} of {count} {check.select} {_show(value, unit)}"
                   f" {'holds' if ok else 'breaks'} {check.op} {_show(check.threshold, unit)}")  # fmt: skip
    return CheckResult(f"custom.{check.id}", "custom", title, "pass" if ok else "fail", check.level, message,
                       round(value, 4), check.threshold, unit, evidence, layer=check.layer,
                       description=check.description)  # fmt: skip


def _attrs_match(attrs: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return all(k in attrs and (attrs[k] == v or str(attrs[k]) == str(v)) for k, v in wanted.items())


def check_paths(paths: Sequence[Input], *, config_path: str | os.PathLike[str] | None = None,
                baseline: str | os.PathLike[str] | None = None, warmup_s: float | None = None,
                config: Config | None = None, exact: bool = False, sample_requests: int | None = None) -> CheckRun:  # fmt: skip
    """Diagnose `paths` with the configured rules and run every configured check (`latprof check`).

    The config is `config`, else the file at `config_path`, else the one found from the working
    directory (none: the defaults, every rule gating). `warmup_s` overrides its `skip_warmup_s`.
    `exact` and `sample_requests`: how a large capture is read (`latprof.pipeline.run_diagnosis`).
    """
    from latprof.engine import all_rules
    from latprof.pipeline import run_configured

    classes = all_rules()
    if config is None:
        config = load_config(config_path, rule_classes=classes)
    config.require_baseline(baseline)
    reading: dict[str, Any] = {"exact": exact, "sample_requests": sample_requests}
    diagnosis = run_configured(paths, config, classes, warmup_s=warmup_s, **reading)
    before = run_configured([baseline], config, classes, warmup_s=warmup_s, **reading) if baseline is not None else None
    enabled = [cls for cls in classes if config.rule(cls.id).enabled]
    return run_checks(diagnosis, config, rule_classes=enabled, baseline=before, inputs=[str(p) for p in paths],
                      baseline_input=None if baseline is None else str(baseline))  # fmt: skip
