"""Rule uninstrumented-gap: the tail sits in time no span or hook covers, and this says where."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from latprof.analysis.requests import NS_PER_MS, Analysis
from latprof.engine import Finding, Rule, fmt_ms, layer_evidence, owns_tail, severity_for_share
from latprof.layers import DB_QUERY, UNATTRIBUTED
from latprof.analysis.timeline import RequestTimeline

START = "the request's start"
END = "the request's end"


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_share_of_tail_excess: float = 0.2
    min_tail_excess_ms: float = 50.0
    #: Gaps shorter than this are the cost of getting from one call to the next, not a gap.
    min_gap_ms: float = 1.0


class Gap:
    """An uncovered interval of one request and the segments on either side of it."""

    __slots__ = ("start_ns", "end_ns", "before", "after", "after_layer")

    def __init__(self, start_ns: int, end_ns: int, before: str, after: str, after_layer: str | None) -> None:
        self.start_ns, self.end_ns, self.before, self.after, self.after_layer = start_ns, end_ns, before, after, after_layer

    @property
    def where(self) -> tuple[str, str]:
        return (self.before, self.after)


def gaps(rt: RequestTimeline, min_gap_ns: int = 0) -> list[Gap]:
    """The intervals of the request that no layered segment covers, in time order, each with
    the name of the segment that ended where it starts and the one that starts where it ends."""
    start, end = rt.request.start_ns, rt.request.end_ns
    covered = sorted(
        (max(s.start_ns, start), min(s.end_ns, end), s) for s in rt.segments if s.layer is not None and s.end_ns > s.start_ns
    )  # fmt: skip
    out: list[Gap] = []
    cursor, before = start, START
    for lo, hi, segment in covered:
        if hi <= lo:
            continue
        if lo - cursor > min_gap_ns:
            out.append(Gap(cursor, lo, before, _label(segment), segment.layer))
        if hi >= cursor:
            cursor, before = hi, _label(segment)
    if end - cursor > min_gap_ns:
        out.append(Gap(cursor, end, before, END, None))
    return out


def _label(segment: object) -> str:
    return f"{segment.name} ({segment.layer})"  # type: ignore[attr-defined]


def _explain(before: str, after: str, after_layer: str | None, source: str) -> str:
    """What would explain a gap at this position, and what would measure it."""
    measure = (
        "add spans there (or the library's OpenTelemetry instrumentation), or record the service with"
        " `latprof run -- CMD`, whose hooks time pool waits, locks, sleeps and the event loop"
        if source in ("otlp", "jaeger", "zipkin", "receive")
        else "sample the stacks while it happens with `latprof attach --pid PID`"
    )
    if after_layer == DB_QUERY and "(db." not in before:
        why = (
            "a wait for a database connection right before the first statement (psycopg_pool, asyncpg and most"
            " drivers emit no span for the pool checkout), or the request's own code before it"
        )
    elif before == START:
        why = "time before the first instrumented call: queueing for a worker or thread, a blocked event loop, or request parsing"
    elif after == END:
        why = "work after the last instrumented call: serialising or writing the response, or an uninstrumented call"
    else:
        why = "code between the two calls that has no span: CPU work, a lock, a sleep or an uninstrumented client call"
    return f"{why}; to measure it, {measure}"


class UninstrumentedGap(Rule):
    """The tail is in time no span or hook covers: where it sits and what would explain it.

    What it detects:
        The `unattributed` layer (time on a request's critical path that no collected
        signal explains) owns a large part of the tail. It finds the uncovered intervals of
        the slow requests, groups them by position - between which two spans (or hooks'
        segments) they sit, or before the first / after the last - and names the position
        whose gaps grew most from the median request to the slowest 1%.

    Why it matters for p99:
        Stock instrumentation times calls, not waits: a pool checkout, a thread-pool queue,
        a lock or a blocked event loop shows as nothing between two spans. Blaming the spans
        on either side (the slow query, the LLM) is the classic misdiagnosis; the gap is
        where the time went.

    Evidence:
        unattributed time p50/p99, tail excess and share; the position with the largest
        growth (`between`), its mean gap in the tail and in the median cohort, the share of
        tail requests that have it, the other positions ranked, what would explain it, and
        example request (trace) ids.

    How to fix:
        Measure the gap: add a span around the code there, enable the library's
        instrumentation (SQLAlchemy's shows the pool checkout as a `connect` span), or run
        the service under `latprof run`, whose hooks time pool waits, queues, locks, sleeps
        and the event loop without code changes. A gap right before the first database
        statement that is large only in the tail is usually a pool wait.

    Example:
        A FastAPI service on asyncpg: its traces show `GET /chat` with a `SELECT` and a
        `POST` to the LLM. The slowest 1% spend 1.4 s between the request's start and the
        `SELECT` that the median request reaches in 2 ms: the pool checkout, invisible to
        the asyncpg instrumentation.
    """

    id = "uninstrumented-gap"
    layer = UNATTRIBUTED
    Thresholds = Thresholds

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        stats = analysis.layer(UNATTRIBUTED)
        if not owns_tail(analysis, stats, min_share=t.min_share_of_tail_excess, min_excess_ms=t.min_tail_excess_ms):
            return
        min_gap_ns = int(t.min_gap_ms * NS_PER_MS)
        tail, median = analysis.distinct("tail"), analysis.distinct("median")

        def by_position(cohort: Sequence[int]) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], int], dict[tuple[str, str], str | None]]:
            total: dict[tuple[str, str], float] = {}
            having: dict[tuple[str, str], int] = {}
            layers: dict[tuple[str, str], str | None] = {}
            for i in cohort:
                seen: set[tuple[str, str]] = set()
                for gap in gaps(analysis.requests[i], min_gap_ns):
                    total[gap.where] = total.get(gap.where, 0.0) + (gap.end_ns - gap.start_ns) / NS_PER_MS
                    layers.setdefault(gap.where, gap.after_layer)
                    seen.add(gap.where)
                for where in seen:
                    having[where] = having.get(where, 0) + 1
            return total, having, layers

        tail_total, tail_having, layers = by_position(tail)
        median_total, _, _ = by_position(median)
        if not tail_total:
            return
        growth = {
            where: tail_total[where] / len(tail) - median_total.get(where, 0.0) / max(1, len(median)) for where in tail_total
        }  # fmt: skip
        ranked = sorted(growth, key=lambda w: -growth[w])
        top = ranked[0]
        if growth[top] <= 0:
            return
        before, after = top
        explanation = _explain(before, after, layers.get(top), analysis.timeline.source_kind)
        evidence: dict[str, object] = {**layer_evidence(stats, "unattributed")}
        evidence.update(
            between=[before, after],
            tail_mean_gap_ms=round(tail_total[top] / len(tail), 3),
            median_mean_gap_ms=round(median_total.get(top, 0.0) / max(1, len(median)), 3),
            tail_requests_with_gap=round(tail_having.get(top, 0) / len(tail), 4),
            other_positions=[
                {"between": list(w), "tail_growth_ms": round(growth[w], 3)} for w in ranked[1:4] if growth[w] > 0
            ],
            explanation=explanation,
        )
        evidence["example_request_ids"] = analysis.example_request_ids(UNATTRIBUTED)
        summary = (
            f"The slowest 1% of requests spent {fmt_ms(stats.tail_excess_ms)} more than the median one in time no"
            f" span covers, most of it between {before} and {after} ({fmt_ms(growth[top])} more per tail request):"
            f" {explanation.split(';')[0]}."
        )
        yield self.finding(
            severity=severity_for_share(stats.share_of_tail_excess),
            confidence=round(min(1.0, stats.share_of_tail_excess), 4),
            impact_ms=stats.tail_excess_ms,
            summary=summary,
            evidence=evidence,
            fix=f"Measure what happens between {before} and {after}: {explanation.split('; to measure it, ')[-1]}.",
            subject=f"{before}|{after}",
        )
