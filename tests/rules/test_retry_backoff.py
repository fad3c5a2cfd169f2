"""retry-backoff: fires when backoff sleeps own the tail; says what they followed and who slept."""

from __future__ import annotations

from timelines import analysed, assert_min_tail_excess_is_the_boundary, req, seg

from latprof.layers import PROVIDER
from latprof.rules.retry_backoff import RetryBackoff, Thresholds
from latprof.semconv import HTTP_STATUS_CODE, RETRY_LIBRARY, SERVER_ADDRESS, SLEEP_SEGMENT
from latprof.analysis.timeline import RequestTimeline

N = 200  # every 20th request (i = 19, 39, ...) is rate limited once, or twice for i = 199


def service(backoff_ms: float = 800.0) -> list[RequestTimeline]:
    out = []
    for i in range(N):
        t0 = i * 1000.0
        segs = []
        cursor = t0 + 10
        failures = (2 if i == 199 else 1) if i % 20 == 19 else 0
        for k in range(failures):
            segs.append(seg(PROVIDER, cursor, cursor + 50, name="chat", **{HTTP_STATUS_CODE: 429, SERVER_ADDRESS: "llm"}))
            cursor += 50
            attrs = {RETRY_LIBRARY: "tenacity"} if i == 39 else {}
            segs.append(seg(None, cursor, cursor + backoff_ms, name=SLEEP_SEGMENT, **attrs))  # classified by the analysis
            cursor += backoff_ms
        segs.append(seg(PROVIDER, cursor, cursor + 300, name="chat", **{SERVER_ADDRESS: "llm"}))
        out.append(req(t0, cursor + 300, *segs, id=f"r{i}", cpu_ms=5))
    return out


def test_fires_when_backoff_owns_the_tail_and_names_the_429s():
    [finding] = RetryBackoff().check(analysed(service()))
    ev = finding.evidence
    # Tail = r199 (two backoffs: 1600 ms), r179, r159 (800 ms each): mean 1066.667 ms over a median of 0.
    assert finding.impact_ms == 1066.667
    assert ev["after"] == {"429": 11} and ev["retries_per_tail_request"] == round(4 / 3, 3)
    assert ev["retried_by"] == {"hand-written loop": 10, "tenacity": 1}
    assert ev["example_request_ids"][0] == "r199"
    assert "rate limiting (429)" in finding.summary and "retry-after" in finding.fix


def test_quiet_without_a_backoff_tail():
    assert list(RetryBackoff().check(analysed(service(backoff_ms=1.0)))) == []


def test_min_tail_excess_is_the_boundary():
    assert_min_tail_excess_is_the_boundary(RetryBackoff, Thresholds, analysed(service()))


def test_fires_without_a_tail_when_every_request_sleeps_in_backoff() -> None:
    from timelines import population

    from latprof.layers import RETRY

    requests = population(200, [(PROVIDER, 50), (RETRY, 500), (PROVIDER, 60)], [(PROVIDER, 50), (RETRY, 520), (PROVIDER, 60)])
    analysis = analysed(requests)
    assert not analysis.has_tail
    [finding] = RetryBackoff().check(analysis)
    assert finding.evidence["dominates_median"] is True and finding.evidence["median_ms"] == 500.0
    assert finding.severity == "critical"  # 82% of the median request
    assert finding.summary.startswith("Every request sleeps in retry backoff: 500 ms of the median request's")


def test_the_openai_and_anthropic_clients_own_backoff_is_the_sdks() -> None:
    from latprof.layers import RETRY

    out = []
    for i in range(N):
        t0 = i * 1000.0
        segs = [seg(PROVIDER, t0 + 10, t0 + 60, name="chat", **{HTTP_STATUS_CODE: 429})] if i % 20 == 19 else []
        cursor = t0 + 60
        if segs:  # the client's backoff, as its hook names it, inside the call
            name = "anthropic retry" if i % 40 == 39 else "openai retry"
            segs.append(seg(RETRY, cursor, cursor + 800, name=name, **{HTTP_STATUS_CODE: 429}))
            cursor += 800
        segs.append(seg(PROVIDER, cursor, cursor + 300, name="chat"))
        out.append(req(t0, cursor + 300, *segs, id=f"r{i}", cpu_ms=5))
    [finding] = RetryBackoff().check(analysed(out))
    assert finding.evidence["retried_by"] == {"sdk": 10} and finding.evidence["after"] == {"429": 10}
