"""What the report renderers (text, html) say alike: latprof's own cost, and each process `attach --inject` tried."""

from __future__ import annotations

from typing import Any

from latprof.analysis.explain import Gap
from latprof.report.model import Report


def cost_line(report: Report) -> str:
    """What latprof cost, as measured (`collection.overhead`, told apart by source where the report
    has `overhead_parts`): "latprof cost the service at least 1.8% of a CPU core, +0.04 ms per
    request"; in attach mode the sampler's process and the injected hooks each; "" when unknown."""
    total = report.collection.get("overhead") or {}
    parts = report.overhead_parts
    hooks, sampler = parts.get("hooks") or {}, parts.get("sampler") or {}
    if not parts:  # a report without the parts (read back from JSON, or built without them): the total
        if total.get("cpu_percent") is None and total.get("added_ms_per_request") is None:
            return ""
        if report.source.get("kind") != "attach":
            hooks = total
        elif total.get("added_ms_per_request") is None:
            sampler = total
        else:  # the sampler and injected hooks, not told apart
            return (f"latprof cost at least {percent(total.get('cpu_percent'))} of a CPU core (its sampler and the injected"
                    f" hooks together), the hooks +{cost_ms(total.get('added_ms_per_request'))} per request")  # fmt: skip
    said = []
    if sampler.get("cpu_percent") is not None:
        said.append(f"latprof's sampler used about {percent(sampler['cpu_percent'])} of a CPU core in its own process")
    if hooks:
        who = "the injected hooks cost the service" if sampler or report.source.get("kind") == "attach" else "latprof cost the service"
        # "at least": what the hooks' own code is timed to cost; the service's code runs slower beside
        # it too, by about as much again (docs/run.md, benchmarks/bench_reported_overhead.py).
        cost = f"{who} at least {percent(hooks.get('cpu_percent'))} of a CPU core"
        if hooks.get("added_ms_per_request") is not None:
            cost += f", +{cost_ms(hooks['added_ms_per_request'])} per request"
        said.append(cost)
    return "; ".join(said)


def percent(value: Any) -> str:
    """Two significant digits, no exponent: "1.8%", "0.04%", "<0.01%", "12%"."""
    if value is None:
        return "?%"
    return "<0.01%" if value < 0.01 else f"{value:.2g}%" if value < 10 else f"{value:.0f}%"


def cost_ms(value: Any) -> str:
    """Two significant digits, no exponent: "0.012 ms", "<0.001 ms", "3.4 ms"."""
    if value is None:
        return "? ms"
    return "<0.001 ms" if value < 0.001 else f"{value:.2g} ms" if value < 10 else f"{value:.0f} ms"


def injected_line(process: dict[str, Any]) -> str:
    """One line per process `attach --inject` tried: what it loaded, how long it held it, how it left."""
    line = f"injected PID {process.get('pid')} (CPython {process.get('python') or '?'}): {process.get('outcome')}"
    if process.get("held_ms") is not None:
        line += f", held {process['held_ms']:.0f} ms"
    if process.get("hooks"):
        line += f", {len(process['hooks'])} hooks"
    detach = process.get("detach") or {}
    if detach.get("patched") is not None:
        line += f"; detached: {detach.get('restored')}/{detach.get('patched')} patched attributes restored"
        if detach.get("modules_imported"):
            line += f", {len(detach['modules_imported'])} modules left imported"
    elif detach.get("reason"):
        line += f"; detach: {detach['reason']}"
    if process.get("outcome") != "recorded" and process.get("message"):
        line += f" - {process['message']}"
    return line


def engine_lines(engine: dict[str, Any]) -> list[str]:
    """What one `--engine-metrics` endpoint showed: the engine and its scrapes, then per instance the
    tail's and the median's time inside it (inferred: lined up by time, not per request)."""
    title = engine.get("title") or engine.get("engine") or "no known engine"
    line = f"engine metrics: {title} at {engine.get('endpoint')}"
    if engine.get("scrapes") is not None:
        line += f", {engine['scrapes']} scrapes" + (f" ({engine['failed']} failed)" if engine.get("failed") else "")
    lines = [line]
    for split in engine.get("split") or []:
        parts = []
        for cohort in ("tail", "median"):
            numbers = split.get(cohort) or {}
            if not numbers.get("calls"):
                continue
            stages = ", ".join(f"{stage} {numbers[f'{stage}_ms']:.0f} ms" for stage in ("queue", "prefill", "decode")
                               if numbers.get(f"{stage}_ms") is not None)  # fmt: skip
            waiting = numbers.get("waiting")
            parts.append(f"{cohort}'s calls: " + (stages or "no stage timings")
                         + (f", {waiting:.1f} waiting" if waiting is not None else ""))  # fmt: skip
        if parts:
            model = f" {split['model']}" if split.get("model") else ""
            lines.append(f"  inside the engine{model} (inferred): " + "; ".join(parts))
    return lines


def gap_place(gap: Gap) -> str:
    """Where a request's longest gap sits: "inside X, after Y, before Z"."""
    return f"inside {gap.inside}" + (f", after {gap.after}" if gap.after else "") + (f", before {gap.before}" if gap.before else "")


def estimated_line(estimated: Any) -> str | None:
    """One line on what a cohort-first analysis (`collection.estimated`) read and estimated; None for an exact one."""
    if not isinstance(estimated, dict):
        return None
    head = (
        f"cohort-first: segments read for {estimated.get('requests_read', 0):,} of {estimated.get('requests', 0):,}"
        " requests (the slowest 5%, the median cohort, each window's tail); the layers' p50/p99 and coverage are"
        f" estimated from a sample of {estimated.get('sample_requests', 0):,} others (1 in"
        f" {estimated.get('sample_one_in', 1)})"
    )
    sampled = estimated.get("cohorts_sampled")
    if not isinstance(sampled, dict) or not sampled:
        return head + "; the verdict and tail numbers are exact (--exact reads everything)"
    names = {"tail": "slowest 1%", "tail5": "slowest 5%", "median": "median cohort", "window_tails": "windows' tails"}
    parts = ", ".join(
        f"{names.get(name, name)} 1 in {row.get('sample_one_in', 1)} of {row.get('requests', 0):,}"
        for name, row in sampled.items() if isinstance(row, dict)
    )  # fmt: skip
    return head + f"; cohorts too large to read whole were sampled ({parts}): tail numbers are estimated too (--exact reads everything)"


