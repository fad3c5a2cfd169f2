"""lock-contention: fires when waits for locks own the tail; names the lock; numbers checked by hand."""

from __future__ import annotations

from timelines import analysed, assert_min_tail_excess_is_the_boundary, req, seg

from latprof.layers import LOCK, PROVIDER
from latprof.rules.lock_contention import LockContention, Thresholds
from latprof.semconv import LOCK_KIND, LOCK_SITE
from latprof.analysis.timeline import RequestTimeline

N = 200  # requests, 100 ms apart; every 20th (i = 19, 39, ..., 199) is slow


def service(slow_lock_ms: float = 600.0, other_lock_ms: float = 0.0) -> list[RequestTimeline]:
    """20 ms of app, a lock wait (slow requests), a 200 ms LLM call; typical requests wait 1 ms on the cache lock."""
    out = []
    for i in range(N):
        slow = i % 20 == 19
        t0 = i * 100.0
        segs = []
        cursor = t0 + 20
        wait = slow_lock_ms if slow else 1.0
        segs.append(seg(LOCK, cursor, cursor + wait, name="lock wait", **{LOCK_KIND: "threading.Lock", LOCK_SITE: "rag/cache.py:41"}))
        cursor += wait
        if other_lock_ms and slow:
            segs.append(
                seg(LOCK, cursor, cursor + other_lock_ms, name="lock wait", **{LOCK_KIND: "asyncio.Semaphore", LOCK_SITE: "rag/llm.py:9"})
            )
            cursor += other_lock_ms
        segs.append(seg(PROVIDER, cursor, cursor + 200, name="chat"))
        cursor += 200
        out.append(req(t0, cursor, *segs, id=f"r{i}"))
    return out


def test_fires_when_lock_waits_own_the_tail_and_names_the_lock_that_was_waited_on_most():
    analysis = analysed(service(other_lock_ms=100.0))
    [finding] = LockContention().check(analysis)
    # Tail = the 3 slowest: each waited 600 + 100 ms on locks; the median cohort 1 ms.
    assert finding.impact_ms == 699.0
    assert finding.severity == "critical" and finding.confidence == 1.0
    locks = finding.evidence["locks"]
    assert locks[0] == {"site": "rag/cache.py:41", "kind": "threading.Lock", "tail_wait_ms": 1800.0, "waits": 200}
    assert locks[1] == {"site": "rag/llm.py:9", "kind": "asyncio.Semaphore", "tail_wait_ms": 300.0, "waits": 10}
    assert "rag/cache.py:41" in finding.summary and "rag/cache.py:41" in finding.fix
    assert finding.evidence["example_request_ids"] == ["r199", "r179", "r159"]


def test_quiet_when_locks_do_not_own_the_tail():
    assert list(LockContention().check(analysed(service(slow_lock_ms=1.0)))) == []


def test_min_tail_excess_is_the_boundary():
    assert_min_tail_excess_is_the_boundary(LockContention, Thresholds, analysed(service()))
