"""http-pool-exhaustion: fires when waiting for an outbound HTTP connection owns the tail; numbers checked by hand."""

from __future__ import annotations

from typing import Callable

from timelines import analysed, assert_min_tail_excess_is_the_boundary, gauge, req, seg

from latprof.events import Gauge
from latprof.layers import HTTP_POOL, MODEL, PROVIDER, TOOL
from latprof.rules.http_pool_exhaustion import (
    GAUGE_HTTP_POOL_IN_USE,
    GAUGE_HTTP_POOL_MAX,
    GAUGE_HTTP_POOL_WAITERS,
    HTTP_POOL_MAX_CONNECTIONS,
    HTTP_POOL_MAX_KEEPALIVE,
    HTTP_POOL_NAME,
    HttpPoolExhaustion,
    Thresholds,
)
from latprof.semconv import SERVER_ADDRESS
from latprof.analysis.timeline import RequestTimeline

N = 200  # requests, 100 ms apart; every 20th (i = 19, 39, ..., 199) is slow: k = 0..9


def service(
    *,
    host: Callable[[int], str] = lambda i: "search.internal",
    pool: Callable[[int], str] = lambda i: "httpx pool 1",
    limits: bool = True,
    slow_wait_ms: Callable[[int], float] = lambda k: 400 + 50 * k,
    slow_tool_ms: Callable[[int], float] = lambda k: 100.0,
) -> list[RequestTimeline]:
    """A search tool call (100 ms), then an LLM call (200 ms to the first token, 100 ms decode).

    The slow requests first wait `slow_wait_ms` for a connection of the tool's client pool (an
    `http.pool` segment nested in the tool call's segment, as the httpx hook records it); the
    others are served at once and have no wait. A wait of 0 ms records no segment.
    """
    out = []
    for i in range(N):
        slow, k = i % 20 == 19, i // 20
        t0 = i * 100.0
        wait = slow_wait_ms(k) if slow else 0.0
        tool_ms = slow_tool_ms(k) if slow else 100.0
        call_end = t0 + wait + tool_ms
        attrs = {SERVER_ADDRESS: host(i), HTTP_POOL_NAME: pool(i)}
        if limits:
            attrs.update({HTTP_POOL_MAX_CONNECTIONS: 2, HTTP_POOL_MAX_KEEPALIVE: 2})
        segs = [seg(TOOL, t0, call_end, name=f"HTTP GET {host(i)}", id=f"call{i}", **{SERVER_ADDRESS: host(i)})]
        if wait:
            segs.append(seg(HTTP_POOL, t0, t0 + wait, name="httpx pool wait", parent=f"call{i}", **attrs))
        segs += [
            seg(PROVIDER, call_end, call_end + 200, name="chat gpt-4o-mini"),
            seg(MODEL, call_end + 200, call_end + 300, name="chat gpt-4o-mini"),
        ]
        out.append(req(t0, call_end + 300, *segs, id=f"r{i}"))
    return out


def pool_gauges(pool: str = "httpx pool 1") -> list[Gauge]:
    readings = {
        GAUGE_HTTP_POOL_MAX: [2, 2, 2, 2],
        GAUGE_HTTP_POOL_IN_USE: [1, 2, 2, 1],
        GAUGE_HTTP_POOL_WAITERS: [0, 3, 6, 0],
    }
    return [
        gauge(name, v, at_ms=1000 * (j + 1), **{HTTP_POOL_NAME: pool})
        for name, values in readings.items()
        for j, v in enumerate(values)
    ]


def test_fires_when_pool_waits_own_the_tail_with_hand_computed_evidence() -> None:
    analysis = analysed(service(), gauges=pool_gauges())

    [finding] = HttpPoolExhaustion().check(analysis)

    assert finding.rule == "http-pool-exhaustion"
    assert finding.layer == HTTP_POOL
    # Tail = k = 9, 8, 7 (850, 800, 750 ms waiting for a connection), mean 800; the median cohort never waits.
    assert finding.impact_ms == 800.0
    assert finding.severity == "critical"
    assert finding.confidence == 1.0
    ev = finding.evidence
    assert ev["pool_wait_p50_ms"] == 0.0
    assert ev["pool_wait_p99_ms"] == 750.5  # between the 198th (750) and 199th (800) value, at 1%
    assert ev["tail_excess_ms"] == 800.0
    assert ev["share_of_tail_excess"] == 1.0
    assert ev["hosts"] == ["search.internal"]
    assert ev["max_connections"] == [2]
    assert ev["max_keepalive_connections"] == [2]
    assert ev["pools_waited"] == 1
    assert ev["peak_in_use"] == 2
    assert ev["peak_waiters"] == 6
    # Time-weighted: read at 1, 2, 3 and 4 s, the last reading (1) holding until the last
    # response at 21.15 s (r199: 19.9 s + 850 + 100 + 300 ms).
    assert ev["mean_utilisation"] == round((1 + 2 + 2 + 1 * 17.15) / 20.15 / 2, 4)  # 0.5496
    assert ev["example_request_ids"] == ["r199", "r179", "r159"]
    assert finding.summary == (
        "The slowest 1% of requests waited 800 ms longer for a free HTTP connection to search.internal than the"
        " median request (max_connections 2, peak 2 in use, up to 6 waiting)."
    )
    assert finding.fix.startswith("Raise the client's pool limit: httpx.Limits(max_connections=...) (at least 8:")


def test_waits_spread_over_several_client_pools_advise_sharing_one_client() -> None:
    analysis = analysed(service(pool=lambda i: f"httpx pool {i // 20 % 2 + 1}"))  # the slow ones alternate between 2 pools

    [finding] = HttpPoolExhaustion().check(analysis)
    [one_more] = HttpPoolExhaustion(Thresholds(min_pools_for_sharing_advice=3)).check(analysis)

    assert finding.evidence["pools_waited"] == 2
    assert finding.summary.endswith("; the waits were spread over 2 client pools.")
    assert finding.fix.startswith("Share one HTTP client per process: the waits happened in 2 separate client pools of max_connections=2")
    assert one_more.fix.startswith("Raise the client's pool limit")


def test_pools_of_different_processes_are_different_pools() -> None:
    requests = service()
    moved = [
        RequestTimeline(rt.request._replace(pid=2), tuple(s._replace(pid=2) for s in rt.segments)) if i % 40 == 39 else rt
        for i, rt in enumerate(requests)
    ]  # "httpx pool 1" of process 1 and of process 2

    [finding] = HttpPoolExhaustion().check(analysed(moved))

    assert finding.evidence["pools_waited"] == 2


def test_fires_without_gauges_or_limits_and_leaves_their_evidence_out() -> None:
    [finding] = HttpPoolExhaustion().check(analysed(service(limits=False)))

    assert finding.impact_ms == 800.0
    for key in ("max_connections", "max_keepalive_connections", "peak_in_use", "peak_waiters", "mean_utilisation"):
        assert key not in finding.evidence
    assert finding.summary == (
        "The slowest 1% of requests waited 800 ms longer for a free HTTP connection to search.internal than the"
        " median request."
    )
    assert finding.fix.startswith("Raise the client's pool limit: httpx.Limits(max_connections=...), on the one client")
    assert finding.confidence == 1.0


def test_hosts_are_listed_most_waiting_first() -> None:
    # The slow requests with k = 0..3 call "crm.internal" (waits 400..550 ms), k = 4..9 "search.internal" (600..850 ms).
    requests = service(host=lambda i: "crm.internal" if i < 80 else "search.internal")

    [finding] = HttpPoolExhaustion().check(analysed(requests))

    assert finding.evidence["hosts"] == ["search.internal", "crm.internal"]
    assert "connection to search.internal, crm.internal than" in finding.summary


def test_fingerprint_is_stable_across_runs_and_differs_by_host() -> None:
    [first] = HttpPoolExhaustion().check(analysed(service(), gauges=pool_gauges()))
    [again] = HttpPoolExhaustion().check(analysed(service(slow_wait_ms=lambda k: 300 + 40 * k)))  # other numbers
    [other] = HttpPoolExhaustion().check(analysed(service(host=lambda i: "weather.example")))

    assert first.fingerprint == again.fingerprint
    assert other.fingerprint != first.fingerprint


def test_does_not_fire_when_there_are_no_pool_waits() -> None:
    # The same tail, but the tool itself is slow: a tool problem, not a pool problem.
    analysis = analysed(service(slow_wait_ms=lambda k: 0.0, slow_tool_ms=lambda k: 500 + 50 * k), gauges=pool_gauges())
    assert not analysis.layer(HTTP_POOL).seen

    assert list(HttpPoolExhaustion().check(analysis)) == []


def test_does_not_fire_when_pool_waits_are_not_in_the_tail() -> None:
    # Every slow request waits 5 ms for a connection, but its tool call takes 900+ ms.
    analysis = analysed(service(slow_wait_ms=lambda k: 5.0, slow_tool_ms=lambda k: 900 + 50 * k), gauges=pool_gauges())
    assert analysis.layer(HTTP_POOL).seen and analysis.layer(HTTP_POOL).tail_excess_ms == 5.0

    assert list(HttpPoolExhaustion().check(analysis)) == []


def test_does_not_fire_when_the_pool_excess_is_below_min_tail_excess() -> None:
    assert_min_tail_excess_is_the_boundary(HttpPoolExhaustion, Thresholds, analysed(service()))


def test_does_not_fire_when_the_pool_share_is_below_min_share() -> None:
    # Slow requests wait 100 ms for a connection but their tool call takes 700 ms more than usual.
    analysis = analysed(service(slow_wait_ms=lambda k: 100.0, slow_tool_ms=lambda k: 800.0))
    assert analysis.layer(HTTP_POOL).share_of_tail_excess == 0.125

    assert list(HttpPoolExhaustion().check(analysis)) == []
    [finding] = HttpPoolExhaustion(Thresholds(min_share_of_tail_excess=0.1)).check(analysis)
    assert finding.severity == "warning"


def test_does_not_fire_when_thresholds_are_raised_above_the_tail() -> None:
    analysis = analysed(service(), gauges=pool_gauges())

    assert list(HttpPoolExhaustion(Thresholds(min_tail_excess_ms=1000.0)).check(analysis)) == []
    assert list(HttpPoolExhaustion(Thresholds(min_share_of_tail_excess=1.01)).check(analysis)) == []


def test_fires_without_a_tail_when_every_request_waits_for_a_connection() -> None:
    from timelines import population

    requests = population(200, [(HTTP_POOL, 200), (TOOL, 100)], [(HTTP_POOL, 210), (TOOL, 100)])
    analysis = analysed(requests, gauges=pool_gauges())
    assert not analysis.has_tail
    [finding] = HttpPoolExhaustion().check(analysis)
    assert finding.evidence["dominates_median"] is True and finding.evidence["median_ms"] == 200.0
    assert finding.summary.startswith("Every request waits for a free HTTP connection: 200 ms of the median request's")
    assert "(peak 2 in use, up to 6 waiting)" in finding.summary
