"""Rule db-pool-exhaustion: requests wait for a database connection because the pool is used up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from latprof.analysis.requests import NS_PER_MS, Analysis
from latprof.capture.format import TRACE_SOURCES
from latprof.engine import (
    Finding,
    Rule,
    WaitThresholds,
    fmt_ms,
    judge_wait,
    median_summary,
    severity_for_median,
    severity_for_share,
    wait_evidence,
)
from latprof.analysis.inference import (
    INFERRED,
    INFERRED_CONFIDENCE,
    Inference,
    INFERRED_AT_CEILING,
    INFERRED_CEILING,
    INFERRED_MEDIAN_GAP_MS,
    INFERRED_TAIL_GAP_MS,
    SOURCE_GAP_BEFORE_FIRST_STEP,
)
from latprof.events import Segment
from latprof.layers import DB_POOL, DB_QUERY, MODEL, PROVIDER
from latprof.semconv import (
    DB_POOL_NAME,
    GAUGE_POOL_IN_USE,
    GAUGE_POOL_MAX,
    GAUGE_POOL_SIZE,
    GAUGE_POOL_WAITERS,
    SEGMENT_CONNECTION_HOLD,
)

if TYPE_CHECKING:
    from latprof.attach.analysis import AttachAnalysis


@dataclass(frozen=True, slots=True)
class Thresholds(WaitThresholds):
    #: A hold counts as "across an LLM call" when LLM time covers this share of the call.
    min_llm_overlap_ratio: float = 0.5
    #: Attach captures: a finding when workers wait here for this share of their busy time (or of
    #: their busy time plus the time connections queued for them).
    attach_min_share: float = 0.2




class DbPoolExhaustion(Rule):
    """Requests wait for a database connection: the pool is exhausted in the tail.

    What it detects:
        The `db.pool` layer (time waiting to check a connection out of a database or cache
        pool) explains a large part of the tail: the slowest requests waited for a
        connection far longer than the median one; or, tail or not, pool waits take most of
        the median request's latency (`min_share_of_median_latency`): every request waits
        for a connection, p99 stays close to p50 and there is no tail - the pool is the
        latency. When the capture shows how long each
        request held its connection, it also says whether connections were held across LLM
        calls.

    Why it matters for p99:
        A pool is a queue. Once every connection is checked out, each new request waits for
        one to come back, and waits stack up: at 95% utilisation a small burst turns into
        seconds of waiting. Holding a connection for the whole request - including an LLM
        call that takes seconds - multiplies the hold time and exhausts even a large pool.

    Evidence:
        pool wait p50/p99 and the tail excess (when the wait dominates the median request:
        its time there, that request's latency, the share and p99/p50); pool max size, peak
        connections in use, peak waiters and mean utilisation from the pool gauges (each
        reading weighted by how long it held: pools are read far more often while busy); how many requests held their
        connection across an LLM call and how much of the hold was the LLM call; example
        request ids. From traces without a pool-wait span (psycopg_pool, asyncpg) the waits
        are inferred from the gap before each request's first database span and the ceiling
        of requests holding a connection: `inferred: true`, that ceiling, and a lower
        confidence.

    How to fix:
        Do not hold a connection across slow non-database work: commit and release it before
        the LLM call (`with Session() as s: ...` around the queries only), and open a new one
        afterwards if you must write the result. Then size the pool for the concurrency you
        serve (SQLAlchemy `pool_size` + `max_overflow`, psycopg_pool `max_size`), keep
        transactions short, and set a checkout timeout so overload fails fast.

    Example:
        A chat endpoint with `pool_size=5` opens a session, loads the conversation, calls
        the LLM for 2 s and saves the answer before closing the session. At 10 requests/s
        the pool is at 100% and the slowest 1% wait 6 s for a connection: db.pool owns 85% of
        the tail excess while the LLM itself is unchanged.
    """

    id = "db-pool-exhaustion"
    layer = DB_POOL
    Thresholds = Thresholds

    def judge_samples(self, samples: AttachAnalysis) -> Iterable[Finding]:
        """An attach capture: workers wait in a pool's checkout (stack samples), or an asyncio
        service's requests wait beyond a stable ceiling of DB connections (socket census)."""
        from latprof.attach.analysis import layer_findings, wire_pool_findings

        return (
            layer_findings(self, samples, DB_POOL, min_share=self.thresholds.attach_min_share)
            + wire_pool_findings(self, samples)
        )

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        stats = analysis.layer(DB_POOL)
        owns, dominates, judged_share = judge_wait(analysis, stats, t)
        if not owns and not dominates:
            return
        evidence = wait_evidence(analysis, stats, "pool_wait", dominates)
        pools = sorted({str(s.attrs.get(DB_POOL_NAME)) for _, s in analysis.segments(DB_POOL) if s.attrs.get(DB_POOL_NAME)})
        if pools:
            evidence["pools"] = pools
        evidence.update(_pool_gauges(analysis))
        held = _held_across_llm(analysis, t.min_llm_overlap_ratio)
        evidence.update(held)
        evidence["example_request_ids"] = analysis.example_request_ids(DB_POOL)
        inferred = _inferred(analysis)
        if inferred:
            evidence.update(inferred)

        size_note = ""
        if "pool_max" in evidence and "peak_in_use" in evidence:
            size_note = f" (pool max {evidence['pool_max']:g}, peak {evidence['peak_in_use']:g} in use"
            if "peak_waiters" in evidence:
                size_note += f", up to {evidence['peak_waiters']:g} waiting"
            size_note += ")"
        summary = (
            f"The slowest 1% of requests waited {fmt_ms(stats.tail_excess_ms)} longer for a database connection"
            f" than the median request{size_note}"
        )
        if not owns:
            summary = median_summary(analysis, stats, "waits for a database connection") + size_note
        if inferred and not owns:
            summary = "Inferred (no span times the pool checkout): " + summary[0].lower() + summary[1:]
        elif inferred:
            at_ceiling = inferred["share_of_wait_at_ceiling"]
            share_text = f"{at_ceiling:.0%}" if isinstance(at_ceiling, (int, float)) else "an unknown share"
            summary = (
                f"Inferred (no span times the pool checkout): the slowest 1% of requests waited"
                f" {fmt_ms(stats.tail_excess_ms)} longer than the median one before their first database statement"
                f" (or the first step after taking a connection),"
                f" while {inferred['connection_ceiling']} requests at a time held a connection (at that ceiling"
                f" {share_text} of the waiting time): a pool of about"
                f" {inferred['connection_ceiling']} exhausted"
            )
        if held.get("held_across_llm_requests"):
            share = held["held_across_llm_share"]
            summary += f"; {share:.0%} of requests held their connection across an LLM call"
            fix = (
                "Release the database connection before the LLM call: end the session/transaction after the"
                " queries and open a new one to store the result. Connections are held for"
                f" {fmt_ms(float(held['mean_hold_ms']))} on average, {fmt_ms(float(held['mean_llm_ms_while_held']))}"
                " of it waiting on the LLM."
            )
        else:
            fix = (
                "Size the pool for the concurrency served (pool_size + max_overflow / max_size), keep"
                " transactions short and release connections before slow non-database work; set a checkout"
                " timeout so overload fails fast instead of queueing."
            )
        confidence = min(1.0, judged_share + (0.2 if "peak_in_use" in evidence else 0.0))
        if inferred:
            confidence *= INFERRED_CONFIDENCE
        if inferred.get("inferred_from") == SOURCE_GAP_BEFORE_FIRST_STEP:
            # a wait before the handler's first step: a worker thread pool of that size looks the same
            confidence = min(confidence, AMBIGUOUS_CONFIDENCE)
            summary += (f"; or a worker thread pool of {inferred['connection_ceiling']} (sync endpoints wait for a thread"
                        " before their first step too): the pool's and the thread pool's sizes tell which")  # fmt: skip
        yield self.finding(
            severity=severity_for_share(judged_share) if owns else severity_for_median(analysis, stats),
            confidence=round(confidence, 4),
            impact_ms=stats.tail_excess_ms,
            summary=summary + ".",
            evidence=evidence,
            fix=fix,
            subject=",".join(pools),
        )


#: The most a pool inferred from the gap before a request's first step is believed: below 0.5,
#: since requests waiting for a worker thread (a sync endpoint's thread pool) leave the same gap.
AMBIGUOUS_CONFIDENCE = 0.4


def _inferred(analysis: Analysis) -> dict[str, object]:
    """The inference's evidence when the `db.pool` time was inferred from trace gaps (latprof.analysis.inference), else {}."""
    pool = analysis.segments(DB_POOL)
    marked = [s for _, s in pool if s.attrs.get(INFERRED)]
    if not marked:
        return {}
    attrs = marked[0].attrs
    return Inference.of_segment(attrs, {
        "inferred_share_of_pool_waits": round(len(marked) / len(pool), 4),
        "connection_ceiling": attrs.get(INFERRED_CEILING),
        "share_of_wait_at_ceiling": attrs.get(INFERRED_AT_CEILING),
        "tail_mean_gap_ms": attrs.get(INFERRED_TAIL_GAP_MS),
        "median_mean_gap_ms": attrs.get(INFERRED_MEDIAN_GAP_MS),
    }).evidence()  # fmt: skip


def _pool_gauges(analysis: Analysis) -> dict[str, float]:
    """Peak size/in-use/waiters and mean utilisation from the pool gauges, where recorded.

    Mean utilisation is time-weighted (`Analysis.gauge_utilisation`): each reading counts for
    as long as it held, since a busy pool is read far more often than an idle one.
    """
    gauges = analysis.timeline.gauges
    out: dict[str, float] = {}
    maxima = [g.value for g in gauges.get(GAUGE_POOL_MAX, ())]
    in_use = gauges.get(GAUGE_POOL_IN_USE, [])
    if maxima:
        out["pool_max"] = max(maxima)
    if gauges.get(GAUGE_POOL_SIZE):
        out["peak_pool_size"] = max(g.value for g in gauges[GAUGE_POOL_SIZE])
    if in_use:
        out["peak_in_use"] = max(g.value for g in in_use)
        if maxima and max(maxima) > 0:
            out["mean_utilisation"] = round(analysis.gauge_utilisation(GAUGE_POOL_IN_USE, GAUGE_POOL_MAX), 4)
    if gauges.get(GAUGE_POOL_WAITERS):
        out["peak_waiters"] = max(g.value for g in gauges[GAUGE_POOL_WAITERS])
    return out


def _spanned_hold(segments: Sequence[Segment]) -> list[Segment]:
    """Without a hold marker (traces): the connection is taken as held from the end of the
    request's pool wait, else its first statement, to the end of its last statement."""
    pool_end = max((s.end_ns for s in segments if s.layer == DB_POOL), default=None)
    queries = [s for s in segments if s.layer == DB_QUERY]
    if not queries:
        return []
    start = pool_end if pool_end is not None else min(s.start_ns for s in queries)
    end = max(s.end_ns for s in queries)
    if end <= start:
        return []
    first = queries[0]
    return [first._replace(segment_id=f"{first.segment_id}.hold", name=SEGMENT_CONNECTION_HOLD, layer=None, start_ns=start, end_ns=end)]


def _held_across_llm(analysis: Analysis, min_overlap: float) -> dict[str, float]:
    """How many requests held a pooled connection across an LLM call, and for how long."""
    traced = analysis.timeline.source_kind in TRACE_SOURCES
    holders = across = 0  # requests (sampled ones count as the requests they stand for)
    hold_ns = llm_in_hold_ns = 0
    for i, rt in enumerate(analysis.requests):
        holds = [s for s in rt.segments if s.name == SEGMENT_CONNECTION_HOLD]
        if not holds and traced:
            holds = _spanned_hold(rt.segments)
        if not holds:
            continue
        w = analysis.weight(i)
        holders += w
        llm = [s for s in rt.segments if s.layer in (PROVIDER, MODEL)]
        request_across = False
        for hold in holds:
            hold_ns += w * (hold.end_ns - hold.start_ns)
            inside = sum(max(0, min(hold.end_ns, s.end_ns) - max(hold.start_ns, s.start_ns)) for s in llm)
            llm_in_hold_ns += w * inside
            total_llm = sum(s.end_ns - s.start_ns for s in llm)
            if total_llm and inside / total_llm >= min_overlap:
                request_across = True
        across += w * request_across
    if not holders:
        return {}
    return {
        "requests_with_hold": holders,
        "held_across_llm_requests": across,
        "held_across_llm_share": round(across / holders, 4),
        "mean_hold_ms": round(hold_ns / holders / NS_PER_MS, 3),
        "mean_llm_ms_while_held": round(llm_in_hold_ns / holders / NS_PER_MS, 3),
    }
