"""Rule lock-contention: requests wait for a lock or semaphore that other requests hold."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from latprof.analysis.requests import Analysis
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
from latprof.layers import LOCK
from latprof.semconv import LOCK_KIND, LOCK_SITE

if TYPE_CHECKING:
    from latprof.attach.analysis import AttachAnalysis

#: At most this many locks are named in the evidence.
_TOP_LOCKS = 5


@dataclass(frozen=True, slots=True)
class Thresholds(WaitThresholds):
    min_tail_excess_ms: float = 20.0
    #: Attach captures: a finding when workers wait here for this share of their busy time (or of
    #: their busy time plus the time connections queued for them).
    attach_min_share: float = 0.2


class LockContention(Rule):
    """Requests wait for a lock or semaphore held by other requests: the tail is serialised.

    What it detects:
        The `lock` layer (contended acquires of a threading Lock, RLock or Semaphore, or an
        asyncio Lock or Semaphore, inside a request) explains a large part of the tail: the
        slowest requests waited far longer to acquire a lock than the median request. Or,
        tail or not, lock waits take most of the median request's latency
        (`min_share_of_median_latency`): every request waits in line, so p99 is barely above
        p50 and there is no tail - the lock is the latency.

    Why it matters for p99:
        A lock turns concurrent requests into a line. While one request holds it - often
        across slow work: an LLM call, a query, a cache fill - every other request that needs
        it waits the whole hold time, and at the back of a burst the waits add up. Nothing
        about the lock is visible in CPU, the database or the provider: the requests just
        look slow in the app.

    Evidence:
        lock wait p50/p99 and its tail excess and share; when it dominates the median request,
        its time there, that request's latency, the share and p99/p50; the locks that were waited on, by
        where they were created (`latprof.lock.site`, or for asyncio locks and semaphores
        where they were acquired) with their kind, their total wait in the tail cohort and
        how many waits; example request ids.

    How to fix:
        Hold the lock for less: never across I/O, an LLM call or a query - compute outside,
        lock only to publish the result. Lock per key instead of one global lock (a dict of
        locks, or a single-flight per cache key). If the lock guards a resource of limited
        capacity (a semaphore sized to a rate limit), size it to what the resource really
        takes, and shed excess requests instead of queueing them behind it.

    Example:
        A RAG service caches embeddings behind one global `threading.Lock` and calls the
        embedding API while holding it. Under 20 concurrent requests the slowest 1% wait
        1.4 s for the lock: lock owns 85% of the tail excess, at `rag/cache.py:41`.
    """

    id = "lock-contention"
    layer = LOCK
    Thresholds = Thresholds

    def judge_samples(self, samples: AttachAnalysis) -> Iterable[Finding]:
        """An attach capture: workers are blocked on locks (stack samples, wait channels)."""
        from latprof.attach.analysis import layer_findings

        return layer_findings(self, samples, LOCK, min_share=self.thresholds.attach_min_share)

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        stats = analysis.layer(LOCK)
        owns, dominates, judged_share = judge_wait(analysis, stats, t)
        if not owns and not dominates:
            return
        evidence = wait_evidence(analysis, stats, "lock_wait", dominates)
        tail = set(analysis.groups.tail)
        by_lock: dict[tuple[str, str], list[float]] = {}  # (site, kind) -> [tail wait ms, waits]
        for i, segment in analysis.segments(LOCK):
            key = (str(segment.attrs.get(LOCK_SITE) or "?"), str(segment.attrs.get(LOCK_KIND) or "lock"))
            entry = by_lock.setdefault(key, [0.0, 0.0])
            entry[1] += analysis.weight(i)
            if i in tail:
                entry[0] += analysis.weight(i) * (segment.end_ns - segment.start_ns) / 1e6
        ranked = sorted(by_lock.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]))[:_TOP_LOCKS]
        evidence["locks"] = [
            {"site": site, "kind": kind, "tail_wait_ms": round(ms, 3), "waits": int(n)} for (site, kind), (ms, n) in ranked
        ]
        evidence["example_request_ids"] = analysis.example_request_ids(LOCK)
        top = ranked[0][0] if ranked else ("?", "lock")
        if owns:
            summary = (
                f"The slowest 1% of requests waited {fmt_ms(stats.tail_excess_ms)} longer for a lock than the median"
                f" request, mostly for the {top[1]} created at {top[0]} (lock wait p99 {fmt_ms(stats.p99_ms)})."
            )
            severity = severity_for_share(judged_share)
        else:
            summary = (
                median_summary(analysis, stats, "waits for a lock")
                + f", mostly for the {top[1]} created at {top[0]}: requests take the lock one at a time."
            )
            severity = severity_for_median(analysis, stats)
        fix = (
            f"Hold the {top[1]} at {top[0]} for less: never across I/O, an LLM call or a query - do the slow work"
            " outside and lock only to publish the result. Lock per key instead of globally (a dict of locks, or"
            " single-flight per cache key); if it is a semaphore sized to a rate limit, size it to what the"
            " resource takes and shed the excess instead of queueing it."
        )
        yield self.finding(
            severity=severity,
            confidence=judged_share + (0.2 if ranked else 0.0),
            impact_ms=stats.tail_excess_ms,
            summary=summary,
            evidence=evidence,
            fix=fix,
            subject=top[0],
        )
