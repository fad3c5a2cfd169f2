"""db-pool-exhaustion: fires when waiting for a connection owns the tail; numbers checked by hand."""

from __future__ import annotations

from typing import Callable

from timelines import assert_min_tail_excess_is_the_boundary, analysed, gauge, population, req, seg

from latprof.events import Gauge
from latprof.layers import DB_POOL, DB_QUERY, MODEL, PROVIDER
from latprof.rules.db_pool_exhaustion import DbPoolExhaustion, Thresholds, _pool_gauges
from latprof.semconv import (
    DB_POOL_NAME,
    GAUGE_POOL_IN_USE,
    GAUGE_POOL_MAX,
    GAUGE_POOL_SIZE,
    GAUGE_POOL_WAITERS,
    SEGMENT_CONNECTION_HOLD,
)
from latprof.analysis.timeline import RequestTimeline

N = 200  # requests, 100 ms apart; every 20th (i = 19, 39, ..., 199) is slow: k = 0..9


def service(
    *,
    pool: str = "main",
    checkout: bool = True,
    holds: bool = True,
    slow_wait_ms: Callable[[int], float] = lambda k: 400 + 50 * k,
    slow_provider_ms: Callable[[int], float] = lambda k: 200.0,
    llm_ms_held: float = 300.0,
) -> list[RequestTimeline]:
    """Checkout (1 ms typically), SELECT (10 ms), LLM call (200 ms to first token, 100 ms decode), INSERT (5 ms).

    Even requests keep the connection from the SELECT across `llm_ms_held` of the LLM call (all
    of it by default: one 315 ms hold); odd ones release it after the SELECT and hold one again
    for the INSERT (10 + 5 ms). Holds are layer-less `db.connection.hold` markers.
    """
    out = []
    for i in range(N):
        slow, k = i % 20 == 19, i // 20
        t0 = c = i * 100.0
        segs = []
        if checkout:
            wait = slow_wait_ms(k) if slow else 1.0
            segs.append(seg(DB_POOL, c, c + wait, name="sqlalchemy checkout", **{DB_POOL_NAME: pool}))
            c += wait
        provider_ms = slow_provider_ms(k) if slow else 200.0
        llm_end = c + 10 + provider_ms + 100
        segs += [
            seg(DB_QUERY, c, c + 10, name="SELECT conversations"),
            seg(PROVIDER, c + 10, c + 10 + provider_ms, name="chat gpt-4o-mini"),
            seg(MODEL, c + 10 + provider_ms, llm_end, name="chat gpt-4o-mini stream"),
            seg(DB_QUERY, llm_end, llm_end + 5, name="INSERT messages"),
        ]
        if holds:
            across = i % 2 == 0
            held_to = c + 10 + (llm_ms_held if across else 0.0)
            segs.append(seg(None, c, held_to, name=SEGMENT_CONNECTION_HOLD, **{DB_POOL_NAME: pool}))
            if held_to < llm_end:
                segs.append(seg(None, llm_end, llm_end + 5, name=SEGMENT_CONNECTION_HOLD, **{DB_POOL_NAME: pool}))
            else:
                segs[-1] = seg(None, c, llm_end + 5, name=SEGMENT_CONNECTION_HOLD, **{DB_POOL_NAME: pool})
        out.append(req(t0, llm_end + 5, *segs, id=f"r{i}"))
    return out


def pool_gauges(pool: str = "main") -> list[Gauge]:
    readings = {
        GAUGE_POOL_MAX: [10, 10, 10, 10],
        GAUGE_POOL_SIZE: [5, 10, 10, 10],
        GAUGE_POOL_IN_USE: [4, 10, 10, 6],
        GAUGE_POOL_WAITERS: [0, 3, 7, 0],
    }
    return [
        gauge(name, v, at_ms=1000 * (j + 1), **{DB_POOL_NAME: pool})
        for name, values in readings.items()
        for j, v in enumerate(values)
    ]


def test_fires_when_pool_waits_own_the_tail_with_hand_computed_evidence() -> None:
    analysis = analysed(service(), gauges=pool_gauges())

    [finding] = DbPoolExhaustion().check(analysis)

    assert finding.rule == "db-pool-exhaustion"
    assert finding.layer == DB_POOL
    # Tail = k = 9, 8, 7 (850, 800, 750 ms waiting for a connection), mean 800; median cohort 1 ms.
    assert finding.impact_ms == 799.0
    assert finding.severity == "critical"
    assert finding.confidence == 1.0
    ev = finding.evidence
    assert ev["pool_wait_p50_ms"] == 1.0
    assert ev["pool_wait_p99_ms"] == 750.5  # between the 198th (750) and 199th (800) value, at 1%
    assert ev["tail_excess_ms"] == 799.0
    assert ev["share_of_tail_excess"] == 1.0
    assert ev["pools"] == ["main"]
    assert ev["pool_max"] == 10
    assert ev["peak_pool_size"] == 10
    assert ev["peak_in_use"] == 10
    # Time-weighted: read at 1, 2, 3 and 4 s, the last reading (6) holding until the last
    # response at 21.065 s (r199: 19.9 s + 850 + 10 + 200 + 100 + 5 ms).
    assert ev["mean_utilisation"] == round((4 + 10 + 10 + 6 * 17.065) / 20.065 / 10, 4)  # 0.6299
    assert ev["peak_waiters"] == 7
    # Every request holds a connection; the 100 even ones across their whole 300 ms LLM call.
    assert ev["requests_with_hold"] == 200
    assert ev["held_across_llm_requests"] == 100
    assert ev["held_across_llm_share"] == 0.5
    assert ev["mean_hold_ms"] == 165.0  # (100 x 315 + 100 x (10 + 5)) / 200
    assert ev["mean_llm_ms_while_held"] == 150.0  # 100 x 300 / 200
    assert ev["example_request_ids"] == ["r199", "r179", "r159"]
    assert finding.summary == (
        "The slowest 1% of requests waited 799 ms longer for a database connection than the median request"
        " (pool max 10, peak 10 in use, up to 7 waiting); 50% of requests held their connection across an LLM call."
    )
    assert finding.fix.startswith("Release the database connection before the LLM call")
    assert "held for 165 ms on average, 150 ms of it waiting on the LLM" in finding.fix


def test_a_hold_counts_as_across_the_llm_call_by_min_llm_overlap_ratio() -> None:
    # Even requests hold their connection through the first 180 ms of the 300 ms LLM call (60%).
    analysis = analysed(service(llm_ms_held=180.0))

    [default] = DbPoolExhaustion().check(analysis)
    [strict] = DbPoolExhaustion(Thresholds(min_llm_overlap_ratio=0.9)).check(analysis)

    assert default.evidence["held_across_llm_requests"] == 100
    assert default.evidence["mean_hold_ms"] == 105.0  # (100 x (190 + 5) + 100 x 15) / 200
    assert default.evidence["mean_llm_ms_while_held"] == 90.0  # 100 x 180 / 200
    assert strict.evidence["held_across_llm_requests"] == 0
    assert "held their connection" not in strict.summary
    assert strict.fix.startswith("Size the pool for the concurrency served")


def test_fires_without_gauges_or_holds_and_leaves_their_evidence_out() -> None:
    [finding] = DbPoolExhaustion().check(analysed(service(holds=False)))

    assert finding.impact_ms == 799.0
    for key in ("pool_max", "peak_in_use", "peak_waiters", "requests_with_hold", "held_across_llm_share"):
        assert key not in finding.evidence
    assert finding.summary == (
        "The slowest 1% of requests waited 799 ms longer for a database connection than the median request."
    )
    assert finding.fix.startswith("Size the pool")


def test_fingerprint_is_stable_across_runs_and_differs_by_pool() -> None:
    [first] = DbPoolExhaustion().check(analysed(service(), gauges=pool_gauges()))
    [again] = DbPoolExhaustion().check(analysed(service()))  # other numbers, same problem
    [replica] = DbPoolExhaustion().check(analysed(service(pool="replica")))

    assert first.fingerprint == again.fingerprint
    assert replica.fingerprint != first.fingerprint
    assert replica.evidence["pools"] == ["replica"]


def test_does_not_fire_when_there_are_no_pool_waits() -> None:
    analysis = analysed(service(checkout=False, slow_provider_ms=lambda k: 900 + 50 * k), gauges=pool_gauges())
    assert not analysis.layer(DB_POOL).seen

    assert list(DbPoolExhaustion().check(analysis)) == []


def test_does_not_fire_when_pool_waits_are_not_in_the_tail() -> None:
    # Every checkout takes 1 ms; the slow requests are slow at the provider, connections held across it.
    requests = service(slow_wait_ms=lambda k: 1.0, slow_provider_ms=lambda k: 900 + 50 * k)
    analysis = analysed(requests, gauges=pool_gauges())
    assert analysis.layer(DB_POOL).seen and analysis.layer(DB_POOL).tail_excess_ms == 0

    assert list(DbPoolExhaustion().check(analysis)) == []


def test_does_not_fire_when_the_pool_excess_is_below_min_tail_excess() -> None:
    assert_min_tail_excess_is_the_boundary(DbPoolExhaustion, Thresholds, analysed(service()))

def test_does_not_fire_when_the_pool_share_is_below_min_share() -> None:
    # Slow requests wait 101 ms (100 over the median) but spend 700 ms more at the provider.
    analysis = analysed(service(slow_wait_ms=lambda k: 101.0, slow_provider_ms=lambda k: 500 + 50 * k))
    assert analysis.layer(DB_POOL).share_of_tail_excess == 0.125

    assert list(DbPoolExhaustion().check(analysis)) == []
    [finding] = DbPoolExhaustion(Thresholds(min_share_of_tail_excess=0.1)).check(analysis)
    assert finding.severity == "warning"


def test_does_not_fire_when_thresholds_are_raised_above_the_tail() -> None:
    analysis = analysed(service(), gauges=pool_gauges())

    assert list(DbPoolExhaustion(Thresholds(min_tail_excess_ms=1000.0)).check(analysis)) == []
    assert list(DbPoolExhaustion(Thresholds(min_share_of_tail_excess=1.01)).check(analysis)) == []


def test_mean_utilisation_weighs_each_reading_by_how_long_it_held() -> None:
    # The hook reads the pool on checkouts and checkins, at most every 100 ms: 6 readings of 10
    # of 10 in use during a 600 ms burst, then one reading of 0 when it went idle for 3.6 s.
    burst = [gauge(GAUGE_POOL_IN_USE, 10, at_ms=100 * j, **{DB_POOL_NAME: "main"}) for j in range(6)]
    readings = [
        gauge(GAUGE_POOL_MAX, 10, at_ms=0, **{DB_POOL_NAME: "main"}),
        *burst,
        gauge(GAUGE_POOL_IN_USE, 0, at_ms=600, **{DB_POOL_NAME: "main"}),
    ]
    analysis = analysed([req(0, 4200, seg(DB_QUERY, 0, 4200))], gauges=readings)
    plain = (6 * 10 + 0) / 7 / 10
    assert round(plain, 2) == 0.86  # what a plain average of the readings says
    assert _pool_gauges(analysis)["mean_utilisation"] == round(10 * 600 / 4200 / 10, 4) == 0.1429


def test_mean_utilisation_adds_up_the_pools_of_every_process() -> None:
    # Two workers' pools of 10 over 0-10 s: one always at 8, the other at 2 then 0 from 5 s.
    readings = [
        gauge(GAUGE_POOL_MAX, 10, at_ms=0, pid=1, **{DB_POOL_NAME: "main"}),
        gauge(GAUGE_POOL_MAX, 10, at_ms=0, pid=2, **{DB_POOL_NAME: "main"}),
        gauge(GAUGE_POOL_IN_USE, 8, at_ms=0, pid=1, **{DB_POOL_NAME: "main"}),
        gauge(GAUGE_POOL_IN_USE, 2, at_ms=0, pid=2, **{DB_POOL_NAME: "main"}),
        gauge(GAUGE_POOL_IN_USE, 0, at_ms=5000, pid=2, **{DB_POOL_NAME: "main"}),
    ]
    analysis = analysed([req(0, 10_000, seg(DB_QUERY, 0, 10_000))], gauges=readings)
    assert _pool_gauges(analysis)["mean_utilisation"] == (8 + 1) / 20


# --- every request waits for a connection: the pool dominates the median request --------------------


def test_fires_without_a_tail_when_every_request_waits_for_a_connection() -> None:
    requests = population(200, [(DB_POOL, 150), (DB_QUERY, 10), (PROVIDER, 40)], [(DB_POOL, 170), (DB_QUERY, 10), (PROVIDER, 40)])
    analysis = analysed(requests, gauges=pool_gauges())
    assert not analysis.has_tail
    [finding] = DbPoolExhaustion().check(analysis)
    assert finding.evidence["dominates_median"] is True
    assert finding.evidence["median_ms"] == 150.0 and 0.74 <= finding.evidence["share_of_median_latency"] <= 0.75
    assert finding.severity == "warning"  # under 75% of the median request
    assert finding.summary.startswith("Every request waits for a database connection: 150 ms of the median request's")
    assert "(pool max 10, peak 10 in use, up to 7 waiting)" in finding.summary
    assert "held their connection" not in finding.summary  # no holds recorded here


def test_does_not_fire_on_the_median_when_pool_waits_are_a_minor_part_of_it() -> None:
    requests = population(200, [(DB_POOL, 50), (DB_QUERY, 10), (PROVIDER, 400)], [(DB_POOL, 60), (DB_QUERY, 10), (PROVIDER, 400)])
    assert list(DbPoolExhaustion().check(analysed(requests))) == []
