"""Rule sequential-tool-calls: independent tool calls of a request run one after another instead of together."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from latprof.analysis.requests import NS_PER_MS, Analysis
from latprof.capture.format import TRACE_SOURCES
from latprof.engine import Finding, Rule, fmt_ms, layer_evidence, owns_tail, severity_for_share
from latprof.events import Segment
from latprof.layers import MODEL, PROVIDER, TOOL
from latprof.semconv import SERVER_ADDRESS, TOOL_DEPENDS_ON

#: How independence is judged, said in the evidence so a reader can weigh the finding.
JUDGED_BY = (
    "calls of one request with the same parent segment that did not overlap, with no LLM call between"
    " them (an LLM choosing the next tool makes it dependent), and no later call carrying a value from"
    " an earlier call's response (latprof.tool.depends_on, set by the HTTP hook)"
)

#: Added for traces, which carry no request or response bodies.
TRACES_CAVEAT = (
    "; from traces: spans carry no request or response values, so a later call that uses an earlier one's answer"
    " is seen only as an LLM call between them or a gap longer than max_gap_ms (the code that read the answer)"
)


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_share_of_tail_excess: float = 0.2
    min_tail_excess_ms: float = 50.0
    #: The tail requests must save at least this share of the tool layer's tail excess, in the mean.
    min_saving_share: float = 0.3
    #: Calls separated by more than this much time are not one run: the work between them
    #: (the request's own code) probably decided the next call.
    max_gap_ms: float = 50.0


class Run:
    """Consecutive independent calls of one request: what parallel execution would save."""

    __slots__ = ("calls",)

    def __init__(self, calls: list[Segment]) -> None:
        self.calls = calls

    @property
    def saving_ns(self) -> int:
        durations = [c.end_ns - c.start_ns for c in self.calls]
        return sum(durations) - max(durations)

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(str(c.attrs.get(SERVER_ADDRESS) or c.name) for c in self.calls)


def sequential_runs(segments: Sequence[Segment], max_gap_ns: int) -> tuple[list[Run], int]:
    """The runs of two or more independent calls one after another in a request's segments.

    Returns (runs, how many adjacent pairs were left out as dependent: an LLM call between them,
    or a value of the earlier response in the later request).
    """
    llm = sorted((s.start_ns, s.end_ns) for s in segments if s.layer in (PROVIDER, MODEL))
    by_parent: dict[str | None, list[Segment]] = {}
    for s in segments:
        if s.layer == TOOL and s.end_ns > s.start_ns:
            by_parent.setdefault(s.parent_id, []).append(s)
    runs: list[Run] = []
    dependent = 0
    for calls in by_parent.values():
        calls.sort(key=lambda s: (s.start_ns, s.end_ns))
        current: list[Segment] = []
        for call in calls:
            if current:
                prev = current[-1]
                overlaps = call.start_ns < max(c.end_ns for c in current)
                gap = call.start_ns - prev.end_ns
                llm_between = any(lo < call.start_ns and hi > prev.end_ns for lo, hi in llm)
                uses = call.attrs.get(TOOL_DEPENDS_ON)
                depends = uses is True or (isinstance(uses, str) and uses in {c.segment_id for c in current})
                if overlaps or gap > max_gap_ns or llm_between or depends:
                    if llm_between or depends:
                        dependent += 1
                    if len(current) >= 2:
                        runs.append(Run(current))
                    current = []
            current.append(call)
        if len(current) >= 2:
            runs.append(Run(current))
    return runs, dependent


class SequentialToolCalls(Rule):
    """Independent tool calls run one after another: the tail pays for each of them in turn.

    What it detects:
        The `tool` layer (outbound calls to non-LLM services, agent tools) explains a large
        part of the tail, and the slow requests make several calls one after another that
        did not need to wait for each other: same parent, no overlap, no LLM call between
        them, and no value from an earlier call's response in a later call's request. Such a
        run could have been one `asyncio.gather` (or a thread pool map); the saving is the
        run's total minus its longest call.

    Why it matters for p99:
        Sequential calls add up: three 300 ms lookups cost 900 ms where 300 ms would do, and
        the requests that need the most lookups (the longest conversations, the biggest
        documents) are the tail. A detector that flags any run of non-overlapping calls
        cries wolf on agent loops and on calls that feed each other; this rule leaves those
        out and says how it judged.

    Evidence:
        tool time p50/p99 and its tail excess and share; the share of tail requests with a
        run of independent calls; the mean time parallel calls would save in the tail and
        in the median cohort; the most common run (its targets) and the longest run; how
        many adjacent call pairs were judged dependent (an LLM call between them, or a
        response value reused); how independence was judged; example request ids.

    How to fix:
        Start independent calls together: `await asyncio.gather(a(), b(), c())` (or
        `asyncio.TaskGroup`), `concurrent.futures.ThreadPoolExecutor.map` in sync code, or
        the agent framework's parallel tool execution (OpenAI `parallel_tool_calls`, LangGraph
        fan-out). Mind the HTTP client's pool limit, which then caps the parallelism.

    Example:
        A support agent looks up the customer, their open tickets and their plan with three
        sequential HTTP calls of ~250 ms each before calling the LLM. The slowest 1% make all
        three; tool owns 70% of the tail excess and parallel calls would save 500 ms of it.
    """

    id = "sequential-tool-calls"
    layer = TOOL
    Thresholds = Thresholds

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        stats = analysis.layer(TOOL)
        if not owns_tail(analysis, stats, min_share=t.min_share_of_tail_excess, min_excess_ms=t.min_tail_excess_ms):
            return
        max_gap_ns = int(t.max_gap_ms * NS_PER_MS)
        found: dict[int, tuple[list[Run], int]] = {}

        def runs_of(i: int) -> tuple[list[Run], int]:
            if i not in found:
                found[i] = sequential_runs(analysis.requests[i].segments, max_gap_ns)
            return found[i]

        def mean_saving_ms(cohort: tuple[int, ...]) -> float:
            if not cohort:
                return 0.0
            return sum(sum(r.saving_ns for r in runs_of(i)[0]) for i in cohort) / len(cohort) / NS_PER_MS

        tail, median = analysis.groups.tail, analysis.groups.median
        tail_saving = mean_saving_ms(tail)
        if tail_saving <= 0 or tail_saving < t.min_saving_share * stats.tail_excess_ms:
            return
        with_runs = [i for i in tail if runs_of(i)[0]]
        targets: Counter[tuple[str, ...]] = Counter()
        longest = 0
        dependent = 0
        for i in dict.fromkeys(tail):
            runs, dep = runs_of(i)
            dependent += dep
            for r in runs:
                targets[r.targets] += 1
                longest = max(longest, len(r.calls))
        evidence: dict[str, object] = {**layer_evidence(stats, "tool")}
        evidence.update(
            tail_requests_with_sequential_calls=round(len(with_runs) / len(tail), 4),
            tail_mean_parallel_saving_ms=round(tail_saving, 3),
            median_mean_parallel_saving_ms=round(mean_saving_ms(median), 3),
            longest_run_calls=longest,
            dependent_pairs_in_tail=dependent,
            judged_independent_by=JUDGED_BY + (TRACES_CAVEAT if analysis.timeline.source_kind in TRACE_SOURCES else ""),
        )
        if targets:
            evidence["common_run"] = list(targets.most_common(1)[0][0])
        evidence["example_request_ids"] = [
            analysis.requests[i].request.request_id
            for i in sorted(dict.fromkeys(with_runs), key=lambda i: -sum(r.saving_ns for r in runs_of(i)[0]))[:3]
        ]
        common = " -> ".join(evidence.get("common_run", [])) or "tools"  # type: ignore[arg-type]
        summary = (
            f"The slowest 1% of requests spent {fmt_ms(stats.tail_excess_ms)} longer in tool calls than the median"
            f" request, and made independent calls one after another ({common}): calling them together would"
            f" save {fmt_ms(tail_saving)} per tail request."
        )
        fix = (
            f"Start the independent calls ({common}) together: `await asyncio.gather(...)` or an"
            " `asyncio.TaskGroup` in async code, `ThreadPoolExecutor.map` in sync code, or the agent framework's"
            " parallel tool execution. Check the HTTP client's pool limit, which then caps the parallelism."
        )
        yield self.finding(
            severity=severity_for_share(min(1.0, tail_saving / max(stats.tail_excess_ms, 1e-9)) * stats.share_of_tail_excess),
            confidence=min(1.0, stats.share_of_tail_excess) * min(1.0, 0.5 + len(with_runs) / max(1, len(tail))),
            impact_ms=min(tail_saving, stats.tail_excess_ms),
            summary=summary,
            evidence=evidence,
            fix=fix,
            subject=common,
        )
