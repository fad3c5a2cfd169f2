"""Configuration: `[tool.latprof]` in pyproject.toml or the same keys in latprof.toml, found, read and validated once.

The shape (pyproject.toml spelling; latprof.toml drops the `tool.latprof.` prefix)::

    [tool.latprof]
    skip_warmup_s = 2.0                     # warm-up left out of the cohorts, per process
    min_tail_excess_ms = 20.0               # a smaller tail gets no verdict (docs/layers.md)

    [tool.latprof.budget]                   # overall latency budgets
    p99_ms = 2000                           # a number of ms, or "+10%" against --baseline
    p50_ms = 500
    ttft_p99_ms = 1200                      # time to first token of streamed LLM calls
    pool_wait_p99_ms = 50                   # one connection checkout's wait

    [tool.latprof.budget.layers."db.pool"]  # per-layer ceilings
    share = 0.10                            # at most 10% of the tail's excess over the median
    tail_ms = 100                           # at most 100 ms more in the tail than at the median
    p99_ms = 80                             # a request's time in the layer, p99

    [[tool.latprof.budget.routes]]          # per route, as the inbound hooks record it
    route = "POST /chat"
    p99_ms = 1500

    [tool.latprof.rules.db-pool-exhaustion] # a built-in or entry-point rule
    enabled = true
    severity = "warning"                    # report, do not fail (default "error")
    min_share_of_tail_excess = 0.1          # any of the rule's thresholds

    [[tool.latprof.checks]]                 # a rule without Python
    id = "search-tool-p99"
    select = "segments"                     # or "requests"
    where = {layer = "tool", name = "GET *search*", attributes = {"server.address" = "127.0.0.1"}}
    stat = "p99"                            # pNN, mean, max, count, share
    op = "<="
    threshold = 300
    message = "search calls p99 {value:.0f} ms (budget {threshold:.0f} ms)"

Every error names the file and the key (`pyproject.toml:tool.latprof.budget.p99_ms: ...`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from latprof.errors import ConfigError
from latprof.layers import LAYERS

if TYPE_CHECKING:
    from latprof.engine import Rule

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

CONFIG_FILES = ("latprof.toml", ".latprof.toml", "pyproject.toml")
LEVELS = ("error", "warning")
OPERATORS = ("<", "<=", ">", ">=", "==", "!=")
SELECTS = ("requests", "segments")
_PERCENTILE = re.compile(r"^p(\d{1,2}(\.\d+)?)$")
_RELATIVE = re.compile(r"^\s*([+-]?\d+(\.\d+)?)\s*%\s*$")
_ID = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")

#: Overall budgets: key -> what it measures (for messages and `latprof rules`).
BUDGET_METRICS = {
    "p50_ms": "p50 latency",
    "p90_ms": "p90 latency",
    "p99_ms": "p99 latency",
    "max_ms": "max latency",
    "ttft_p99_ms": "p99 time to first token",
    "pool_wait_p99_ms": "p99 pool wait per checkout",
}
ROUTE_METRICS = ("p50_ms", "p90_ms", "p99_ms", "max_ms")
LAYER_METRICS = {
    "share": "share of the tail's excess",
    "tail_ms": "tail excess over the median",
    "p99_ms": "p99 time per request",
    "p50_ms": "p50 time per request",
}


@dataclass(frozen=True, slots=True)
class Limit:
    """An upper bound: `value` in the metric's unit, or with `relative_pct` a percentage over the baseline's value."""

    key: str  # where it was configured: "tool.latprof.budget.p99_ms"
    value: float | None = None
    relative_pct: float | None = None

    def describe(self, unit: str = "ms") -> str:
        if self.relative_pct is not None:
            return f"{self.relative_pct:+g}% of the baseline"
        return f"{self.value:g} {unit}" if unit else f"{self.value:g}"


@dataclass(frozen=True, slots=True)
class RouteBudget:
    route: str
    limits: dict[str, Limit]


@dataclass(frozen=True, slots=True)
class RuleSettings:
    """A rule's configuration: whether it runs, how a finding of it is reported, its threshold overrides."""

    enabled: bool = True
    level: str = "error"
    thresholds: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CustomCheck:
    """A declarative rule: a statistic of the selected requests or segments held against a threshold."""

    key: str
    id: str
    select: str
    stat: str
    op: str
    threshold: float
    message: str = ""
    level: str = "error"
    description: str = ""
    route: str | None = None
    layer: str | None = None
    name: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    """A validated configuration; `Config()` is the defaults (no budgets, every rule on, gating)."""

    path: str | None = None
    skip_warmup_s: float | None = None
    #: The tail excess (slowest 1% over the median request) below which there is no verdict;
    #: None: the default, `latprof.analysis.requests.DEFAULT_MIN_TAIL_EXCESS_MS`.
    min_tail_excess_ms: float | None = None
    budget: dict[str, Limit] = field(default_factory=dict)
    layer_budgets: dict[str, dict[str, Limit]] = field(default_factory=dict)
    route_budgets: list[RouteBudget] = field(default_factory=list)
    rules: dict[str, RuleSettings] = field(default_factory=dict)
    checks: list[CustomCheck] = field(default_factory=list)

    def rule(self, rule_id: str) -> RuleSettings:
        return self.rules.get(rule_id, RuleSettings())

    def limits(self) -> list[Limit]:
        """Every budget's limit: overall, per layer, per route."""
        return [*self.budget.values(), *(x for b in self.layer_budgets.values() for x in b.values()),
                *(x for r in self.route_budgets for x in r.limits.values())]  # fmt: skip

    @property
    def needs_baseline(self) -> bool:
        """Some budget is relative to a baseline (`"+10%"`)."""
        return any(limit.relative_pct is not None for limit in self.limits())

    def require_baseline(self, baseline: object) -> None:
        """Raise ConfigError naming the first relative budget when there is no baseline to hold it against."""
        if self.needs_baseline and baseline is None:
            key = next(limit.key for limit in self.limits() if limit.relative_pct is not None)
            raise ConfigError(f"{self.path}:{key}: is relative to a baseline: pass --baseline CAPTURE")


# --- finding and reading the file -----------------------------------------------------------------


def find_config(start: str | os.PathLike[str] | None = None) -> Path | None:
    """The config file that applies in `start` (default: the working directory) or the nearest parent.

    In each directory, `latprof.toml` and `.latprof.toml` come before `pyproject.toml`, and a
    pyproject.toml counts only when it has a `[tool.latprof]` table (as ruff finds its config).
    """
    here = Path(start or os.getcwd()).resolve()
    for directory in (here, *here.parents):
        for name in CONFIG_FILES:
            candidate = directory / name
            if not candidate.is_file():
                continue
            if name != "pyproject.toml":
                return candidate
            try:
                data = tomllib.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                return candidate  # broken: load_config says how
            if isinstance(data.get("tool"), dict) and "latprof" in data["tool"]:
                return candidate
    return None


def load_config(path: str | os.PathLike[str] | None = None, *, search: bool = True,
                rule_classes: Sequence[type[Rule]] | None = None) -> Config:  # fmt: skip
    """Read and validate the config at `path`, or the one `find_config` finds (none: defaults).

    `rule_classes` are the rules whose ids and thresholds the `rules` tables may name (default:
    every built-in and entry-point rule). Raises ConfigError naming the file and key.
    """
    if path is None:
        found = find_config() if search else None
        if found is None:
            return Config()
        path = found
    path = Path(path)
    label = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{label}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{label}: is a directory, not a config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{label}: cannot read: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{label}: not valid TOML: {exc}") from None
    if path.name == "pyproject.toml":
        table = data.get("tool", {}).get("latprof") if isinstance(data.get("tool"), dict) else None
        if table is None:
            raise ConfigError(f"{label}: has no [tool.latprof] table")
        prefix = "tool.latprof"
    else:
        table, prefix = data, ""
    if rule_classes is None:
        from latprof.engine import all_rules

        rule_classes = all_rules()
    return _Parser(label, prefix, {cls.id: cls for cls in rule_classes}).config(table)


# --- validation -------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, label: str, prefix: str, rule_classes: Mapping[str, Any]) -> None:
        self.label, self.prefix, self.rule_classes = label, prefix, rule_classes

    def key(self, *parts: str) -> str:
        return ".".join([*([self.prefix] if self.prefix else []), *(p if _bare(p) else f'"{p}"' for p in parts)])

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.label}:{key}: {message}")

    def table(self, value: Any, *parts: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(self.key(*parts), f"must be a table, not {_show(value)}")
        return value

    def unknown(self, table: Mapping[str, Any], known: Sequence[str], *parts: str) -> None:
        for name in table:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f"; known keys: {', '.join(known)}"
                raise self.error(self.key(*parts, name), f"unknown key{hint}")

    def config(self, table: Any) -> Config:
        table = self.table(table)
        self.unknown(table, ("skip_warmup_s", "min_tail_excess_ms", "budget", "rules", "checks"))
        skip = table.get("skip_warmup_s")
        if skip is not None:
            skip = self.number(skip, "skip_warmup_s", minimum=0.0)
        floor = table.get("min_tail_excess_ms")
        if floor is not None:
            floor = self.number(floor, "min_tail_excess_ms", minimum=0.0)
        budget, layers, routes = self.budget(table.get("budget", {}))
        return Config(
            path=self.label,
            skip_warmup_s=skip,
            min_tail_excess_ms=floor,
            budget=budget,
            layer_budgets=layers,
            route_budgets=routes,
            rules=self.rules(table.get("rules", {})),
            checks=self.checks(table.get("checks", [])),
        )

    def number(self, value: Any, *parts: str, minimum: float | None = None, maximum: float | None = None) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(self.key(*parts), f"must be a number, not {_show(value)}")
        if minimum is not None and value < minimum:
            raise self.error(self.key(*parts), f"must be at least {minimum:g}, not {value:g}")
        if maximum is not None and value > maximum:
            raise self.error(self.key(*parts), f"must be at most {maximum:g}, not {value:g}")
        return float(value)

    def limit(self, value: Any, *parts: str, share: bool = False) -> Limit:
        key = self.key(*parts)
        if isinstance(value, str):
            match = _RELATIVE.match(value)
            if not match:
                raise self.error(key, f"must be a number or a change against the baseline like '+10%', not {value!r}")
            return Limit(key, relative_pct=float(match.group(1)))
        number = self.number(value, *parts, minimum=0.0, maximum=1.0 if share else None)
        return Limit(key, value=number)

    def budget(self, value: Any) -> tuple[dict[str, Limit], dict[str, dict[str, Limit]], list[RouteBudget]]:
        table = self.table(value, "budget")
        self.unknown(table, (*BUDGET_METRICS, "layers", "routes"), "budget")
        overall = {name: self.limit(table[name], "budget", name) for name in BUDGET_METRICS if name in table}
        layers: dict[str, dict[str, Limit]] = {}
        for layer, limits in self.table(table.get("layers", {}), "budget", "layers").items():
            if layer not in LAYERS:
                close = difflib.get_close_matches(layer, LAYERS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f"; layers: {', '.join(LAYERS)}"
                raise self.error(self.key("budget", "layers", layer), f"not a layer{hint}")
            limits = self.table(limits, "budget", "layers", layer)
            self.unknown(limits, tuple(LAYER_METRICS), "budget", "layers", layer)
            layers[layer] = {m: self.limit(v, "budget", "layers", layer, m, share=m == "share") for m, v in limits.items()}
        routes: list[RouteBudget] = []
        raw_routes = table.get("routes", [])
        if not isinstance(raw_routes, list):
            raise self.error(self.key("budget", "routes"), "must be an array of tables ([[tool.latprof.budget.routes]])")
        for i, entry in enumerate(raw_routes):
            where = f"routes[{i}]"
            entry = self.table(entry, "budget", where)
            self.unknown(entry, ("route", *ROUTE_METRICS), "budget", where)
            route = entry.get("route")
            if not isinstance(route, str) or not route.strip():
                raise self.error(self.key("budget", where, "route"), 'is required: the route as recorded, like "POST /chat"')
            limits = {m: self.limit(entry[m], "budget", where, m) for m in ROUTE_METRICS if m in entry}
            if not limits:
                raise self.error(self.key("budget", where), f"sets no budget; one of {', '.join(ROUTE_METRICS)}")
            for earlier in routes:
                twice = sorted(set(earlier.limits) & set(limits)) if earlier.route == route.strip() else []
                if twice:
                    raise self.error(self.key("budget", where, twice[0]), f"route {route.strip()!r} has a {twice[0]} budget already")
            routes.append(RouteBudget(route.strip(), limits))
        return overall, layers, routes

    def level(self, value: Any, *parts: str) -> str:
        if value not in LEVELS:
            raise self.error(self.key(*parts), f"must be one of {', '.join(LEVELS)}, not {_show(value)}")
        return str(value)

    def rules(self, value: Any) -> dict[str, RuleSettings]:
        out: dict[str, RuleSettings] = {}
        for rule_id, settings in self.table(value, "rules").items():
            cls = self.rule_classes.get(rule_id)
            if cls is None:
                close = difflib.get_close_matches(rule_id, list(self.rule_classes), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else "; `latprof rules` lists them"
                raise self.error(self.key("rules", rule_id), f"no such rule{hint}")
            settings = self.table(settings, "rules", rule_id)
            fields = {f.name: f for f in dataclasses.fields(cls.Thresholds)}
            self.unknown(settings, ("enabled", "severity", *fields), "rules", rule_id)
            enabled = settings.get("enabled", True)
            if not isinstance(enabled, bool):
                raise self.error(self.key("rules", rule_id, "enabled"), f"must be true or false, not {_show(enabled)}")
            level = self.level(settings.get("severity", "error"), "rules", rule_id, "severity")
            thresholds: dict[str, Any] = {}
            for name, value in settings.items():
                if name in fields:
                    thresholds[name] = self.threshold(value, fields[name], "rules", rule_id, name)
            try:
                cls.Thresholds(**thresholds)
            except (TypeError, ValueError) as exc:
                raise self.error(self.key("rules", rule_id), str(exc)) from None
            out[rule_id] = RuleSettings(enabled, level, thresholds)
        return out

    def threshold(self, value: Any, spec: dataclasses.Field[Any], *parts: str) -> Any:
        kind = spec.type if isinstance(spec.type, str) else getattr(spec.type, "__name__", str(spec.type))
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.error(self.key(*parts), f"must be an integer, not {_show(value)}")
            return value
        if kind == "float":
            return self.number(value, *parts)
        if kind == "bool":
            if not isinstance(value, bool):
                raise self.error(self.key(*parts), f"must be true or false, not {_show(value)}")
            return value
        if kind == "str":
            if not isinstance(value, str):
                raise self.error(self.key(*parts), f"must be a string, not {_show(value)}")
            return value
        return value

    def checks(self, value: Any) -> list[CustomCheck]:
        if not isinstance(value, list):
            raise self.error(self.key("checks"), "must be an array of tables ([[tool.latprof.checks]])")
        out: list[CustomCheck] = []
        seen: set[str] = set()
        for i, entry in enumerate(value):
            where = f"checks[{i}]"
            entry = self.table(entry, where)
            self.unknown(entry, ("id", "description", "select", "where", "stat", "op", "threshold", "message", "severity"), where)
            check_id = entry.get("id")
            if not isinstance(check_id, str) or not _ID.match(check_id):
                raise self.error(self.key(where, "id"), f"is required: a lower-case id like 'search-tool-p99', not {_show(check_id)}")
            if check_id in seen:
                raise self.error(self.key(where, "id"), f"{check_id!r} is used by another check")
            seen.add(check_id)
            select = entry.get("select", "requests")
            if select not in SELECTS:
                raise self.error(self.key(where, "select"), f"must be one of {', '.join(SELECTS)}, not {_show(select)}")
            stat = entry.get("stat")
            if not isinstance(stat, str) or not _valid_stat(stat):
                raise self.error(self.key(where, "stat"), f"must be pNN (p50, p99, p99.9), mean, max, count or share, not {_show(stat)}")
            op = entry.get("op", "<=")
            if op not in OPERATORS:
                raise self.error(self.key(where, "op"), f"must be one of {' '.join(OPERATORS)}, not {_show(op)}")
            if "threshold" not in entry:
                raise self.error(self.key(where, "threshold"), "is required")
            threshold = self.number(entry["threshold"], where, "threshold")
            if stat == "share" and not 0 <= threshold <= 1:
                raise self.error(self.key(where, "threshold"), f"a share is between 0 and 1, not {threshold:g}")
            message = entry.get("message", "")
            if not isinstance(message, str):
                raise self.error(self.key(where, "message"), f"must be a string, not {_show(message)}")
            try:
                message.format(value=1.0, threshold=1.0, count=1, id=check_id)
            except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
                raise self.error(self.key(where, "message"), f"cannot be formatted ({exc}); fields: value, threshold, count, id") from None
            description = entry.get("description", "")
            if not isinstance(description, str):
                raise self.error(self.key(where, "description"), f"must be a string, not {_show(description)}")
            selected = self.table(entry.get("where", {}), where, "where")
            self.unknown(selected, ("route", "layer", "name", "attributes"), where, "where")
            for name in ("route", "layer", "name"):
                if name in selected and not isinstance(selected[name], str):
                    raise self.error(self.key(where, "where", name), f"must be a string, not {_show(selected[name])}")
            layer = selected.get("layer")
            if layer is not None and layer not in LAYERS:
                close = difflib.get_close_matches(layer, LAYERS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f"; layers: {', '.join(LAYERS)}"
                raise self.error(self.key(where, "where", "layer"), f"not a layer{hint}")
            if select == "requests" and "name" in selected:
                raise self.error(self.key(where, "where", "name"), "selects segments by name: set select = \"segments\"")
            attributes = self.table(selected.get("attributes", {}), where, "where", "attributes")
            out.append(CustomCheck(
                key=self.key(where), id=check_id, select=select, stat=stat, op=op, threshold=threshold, message=message,
                level=self.level(entry.get("severity", "error"), where, "severity"), description=description,
                route=selected.get("route"), layer=layer, name=selected.get("name"), attributes=dict(attributes),
            ))  # fmt: skip
        return out


def _valid_stat(stat: str) -> bool:
    if stat in ("mean", "max", "count", "share"):
        return True
    match = _PERCENTILE.match(stat)
    return match is not None and 0 < float(match.group(1)) < 100


def percentile_of(stat: str) -> float | None:
    """50.0 for "p50", 99.9 for "p99.9"; None for a statistic that is not a percentile."""
    match = _PERCENTILE.match(stat)
    return float(match.group(1)) if match else None


def _bare(part: str) -> bool:
    return bool(re.match(r"^[A-Za-z0-9_-]+(\[\d+\])?$", part))


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return repr(value)
