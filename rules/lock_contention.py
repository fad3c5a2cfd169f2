"""Rule lock-contention: requests wait for a lock or semaphore that other requests hold."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from latprof.analysis.requests import Analysis
from latprof.engine import Finding, Rule, fmt_ms, layer_evidence, owns_tail, severity_for_share
from latprof.layers import LOCK
from latprof.semconv import LOCK_KIND, LOCK_SITE
#: At most this many locks are named in the evidence.
_TOP_LOCKS = 5


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_share_of_tail_excess: float = 0.2
    min_tail_excess_ms: float = 20.0


class LockContention(Rule):
    """Requests wait for a lock or semaphore held by other requests: the tail is serialised.

    What it detects:
        The `lock` layer (contended acquires of a threading Lock, RLock or Semaphore, or an
        asyncio Lock or Semaphore, inside a request) explains a large part of the tail: the
        slowest requests waited far longer to acquire a lock than the median request.

    Why it matters for p99:
        A lock turns concurrent requests into a line. While one request holds it - often
        across slow work: an LLM call, a query, a cache fill - every other request that needs
        it waits the whole hold time, and at the back of a burst the waits add up. Nothing
        about the lock is visible in CPU, the database or the provider: the requests just
        look slow in the app.

    Evidence:
        lock wait p50/p99 and its tail excess and share; the locks that were waited on, by
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

    def check(self, analysis: Analysis) -> Iterable[Finding]:
        t: Thresholds = self.thresholds
        stats = analysis.layer(LOCK)
        if not owns_tail(analysis, stats, min_share=t.min_share_of_tail_excess, min_excess_ms=t.min_tail_excess_ms):
            return
        evidence: dict[str, object] = {**layer_evidence(stats, "lock_wait")}
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
        summary = (
            f"The slowest 1% of requests waited {fmt_ms(stats.tail_excess_ms)} longer for a lock than the median"
            f" request, mostly for the {top[1]} created at {top[0]} (lock wait p99 {fmt_ms(stats.p99_ms)})."
        )
        fix = (
            f"Hold the {top[1]} at {top[0]} for less: never across I/O, an LLM call or a query - do the slow work"
            " outside and lock only to publish the result. Lock per key instead of globally (a dict of locks, or"
            " single-flight per cache key); if it is a semaphore sized to a rate limit, size it to what the"
            " resource takes and shed the excess instead of queueing it."
        )
        yield self.finding(
            severity=severity_for_share(stats.share_of_tail_excess),
            confidence=stats.share_of_tail_excess + (0.2 if ranked else 0.0),
            impact_ms=stats.tail_excess_ms,
            summary=summary,
            evidence=evidence,
            fix=fix,
            subject=top[0],
        )
