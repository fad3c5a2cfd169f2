"""Rule slow-query: database statements make the slowest requests slow, and which statements they are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from latprof.analysis.requests import NS_PER_MS, Analysis, percentile
from latprof.engine import Finding, Rule, fmt_ms, layer_evidence, owns_tail, severity_for_share
from latprof.layers import DB_QUERY
from latprof.semconv import DB_QUERY_SUMMARY, DB_SYSTEM_NAME

#: How many statements the evidence and the summary name.
_TOP_STATEMENTS = 3


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_share_of_tail_excess: float = 0.2
    min_tail_excess_ms: float = 50.0
    #: A statement run at least this many times per tail request is called in a loop (N+1).
    min_calls_per_request_for_loop: float = 5.0


class SlowQuery(Rule):
    """Database statements are slow in the tail: the slowest requests spend far longer executing queries.

    What it detects:
        The `db.query` layer (time executing database or cache statements) explains a large
        part of the tail, and names the statements responsible. Statements are grouped by
        their summary (`db.query.summary`, e.g. `SELECT messages`; else the segment name,
        which the hooks also set to a summary); each one's part of the tail is its time per
        request in the slowest 1% minus its time per request in the median cohort (wall time
        of its segments, so statements run concurrently can add up to more than the layer).
        It is one finding for the layer, not one per statement: the layer's excess is what
        the critical path measured and is the impact; per-statement parts are wall-time
        estimates from as few as three tail requests, too noisy to rank findings or make
        fingerprints of. The subject is the leading statement, so when fixing it lets
        another one lead, that is a new finding.

    Why it matters for p99:
        A query that is fast on a warm cache and small tables turns into seconds on the
        unlucky requests: a sequential scan on a large conversation, a lock wait behind a long
        transaction, or a statement run once per item in a loop (N+1) for the requests with
        many items. The connection is held all that time, so slow statements also drain the
        pool for everyone else.

    Evidence:
        db.query p50/p99 and the layer's tail excess and share; for the top statements (up
        to three, by their part of the tail): the summary, the database system, how many
        times it ran, p50/p99 per execution, its tail excess, and calls per request in the
        tail and median cohorts; example request ids. Only statement summaries are ever
        shown - never parameters or literal values.

    How to fix:
        Run `EXPLAIN (ANALYZE, BUFFERS)` on the named statement with the parameters of a slow
        request and add the index it lacks (or rewrite the query); a statement run many times
        per slow request is an N+1 loop - load the rows in one query (`IN (...)`, a join,
        `selectinload`). Keep transactions short so statements do not queue behind locks, and
        set `statement_timeout` so a runaway statement fails instead of holding the request.

    Example:
        A chat endpoint loads the conversation history with `SELECT messages ... ORDER BY
        created_at` and no index on `(conversation_id, created_at)`. For most users it takes
        10 ms; for the few with 50 000 messages it takes 700 ms, so the slowest 1% spend 690 ms
        more in `SELECT messages` than the median request and db.query owns 75% of the tail.
    """

    id = "slow-query"
    layer = DB_QUERY
    Thresholds = Thresholds

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        stats = analysis.layer(DB_QUERY)
        if not owns_tail(analysis, stats, min_share=t.min_share_of_tail_excess, min_excess_ms=t.min_tail_excess_ms):
            return
        evidence: dict[str, object] = {**layer_evidence(stats, "query")}
        top = [s for s in statement_stats(analysis) if s.tail_excess_ms > 0][:_TOP_STATEMENTS]
        if top:
            evidence["statements"] = [s.evidence() for s in top]
        evidence["example_request_ids"] = analysis.example_request_ids(DB_QUERY)

        summary = (
            f"The slowest 1% of requests spent {fmt_ms(stats.tail_excess_ms)} longer executing database statements"
            " than the median request"
        )
        if top:
            summary += "; most of it in " + ", ".join(f"`{s.statement}` (+{fmt_ms(s.tail_excess_ms)})" for s in top)
        yield self.finding(
            severity=severity_for_share(stats.share_of_tail_excess),
            confidence=stats.share_of_tail_excess + (0.2 if top else 0.0),
            impact_ms=stats.tail_excess_ms,
            summary=summary + ".",
            evidence=evidence,
            fix=_fix(top, t.min_calls_per_request_for_loop),
            subject=top[0].statement if top else "",
        )


@dataclass(frozen=True, slots=True)
class StatementStats:
    """One statement's executions and its part in the tail."""

    statement: str
    db_system: str | None
    count: int
    p50_ms: float
    p99_ms: float
    tail_excess_ms: float  # its ms per tail request minus its ms per median-cohort request
    calls_per_tail_request: float
    calls_per_median_request: float

    def evidence(self) -> dict[str, object]:
        out: dict[str, object] = {"statement": self.statement}
        if self.db_system:
            out["db_system"] = self.db_system
        out.update(
            count=self.count,
            p50_ms=round(self.p50_ms, 3),
            p99_ms=round(self.p99_ms, 3),
            tail_excess_ms=round(self.tail_excess_ms, 3),
            calls_per_tail_request=round(self.calls_per_tail_request, 2),
            calls_per_median_request=round(self.calls_per_median_request, 2),
        )
        return out


def statement_stats(analysis: Analysis) -> list[StatementStats]:
    """Per statement (its `db.query.summary`, else the segment name): executions, p50/p99, part of the tail.

    A statement's time in a request is the wall time of its segments there (0 when it did not
    run). Sorted by part of the tail excess, largest first, ties by statement.
    """
    durations: dict[str, list[float]] = {}
    per_request: dict[str, dict[int, list[float]]] = {}  # statement -> request index -> [ms, calls]
    systems: dict[str, str] = {}
    for i, segment in analysis.segments(DB_QUERY):
        summary = segment.attrs.get(DB_QUERY_SUMMARY)
        statement = str(summary) if summary else segment.name
        ms = max(0, segment.end_ns - segment.start_ns) / NS_PER_MS
        durations.setdefault(statement, []).append(ms)
        totals = per_request.setdefault(statement, {}).setdefault(i, [0.0, 0.0])
        totals[0] += ms
        totals[1] += 1
        if segment.attrs.get(DB_SYSTEM_NAME) and statement not in systems:
            systems[statement] = str(segment.attrs[DB_SYSTEM_NAME])

    def mean(by_request: dict[int, list[float]], cohort: tuple[int, ...], field: int) -> float:
        return sum(by_request[i][field] for i in cohort if i in by_request) / len(cohort) if cohort else 0.0

    median, tail = analysis.groups.median, analysis.groups.tail
    out = []
    for statement, values in durations.items():
        values.sort()
        by_request = per_request[statement]
        out.append(
            StatementStats(
                statement=statement,
                db_system=systems.get(statement),
                count=len(values),
                p50_ms=percentile(values, 50),
                p99_ms=percentile(values, 99),
                tail_excess_ms=mean(by_request, tail, 0) - mean(by_request, median, 0),
                calls_per_tail_request=mean(by_request, tail, 1),
                calls_per_median_request=mean(by_request, median, 1),
            )
        )
    out.sort(key=lambda s: (-s.tail_excess_ms, s.statement))
    return out


def _fix(top: list[StatementStats], loop_calls: float) -> str:
    """Name what to do with each top statement: EXPLAIN the slow ones, batch the looped ones."""
    steps = []
    looped = [s for s in top if s.calls_per_tail_request >= loop_calls]
    slow = [s for s in top if s.calls_per_tail_request < loop_calls]
    if slow:
        names = " and ".join(f"`{s.statement}`" for s in slow)
        steps.append(
            f"Run EXPLAIN (ANALYZE, BUFFERS) on {names} with the parameters of a slow request and add the"
            " missing index (or rewrite the query)."
        )
    for s in looped:
        steps.append(
            f"`{s.statement}` runs {round(s.calls_per_tail_request, 1):g} times per slow request"
            f" ({round(s.calls_per_median_request, 1):g} per median request): an N+1 loop - load the rows in one"
            " query (IN (...), a join, selectinload)."
        )
    if not top:
        steps.append(
            "Run EXPLAIN (ANALYZE, BUFFERS) on the slowest statements and add the missing indexes; batch"
            " statements run once per item (N+1)."
        )
    steps.append("Keep transactions short and set statement_timeout so a runaway statement fails fast.")
    return " ".join(steps)
