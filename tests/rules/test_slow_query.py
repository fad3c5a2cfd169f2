"""slow-query: fires when statement time owns the tail and names the statements; numbers checked by hand."""

from __future__ import annotations

from typing import Callable

from timelines import assert_min_tail_excess_is_the_boundary, analysed, req, seg

from latprof.events import Segment
from latprof.layers import DB_QUERY, PROVIDER
from latprof.rules.slow_query import SlowQuery, Thresholds
from latprof.semconv import DB_QUERY_SUMMARY, DB_SYSTEM_NAME
from latprof.analysis.timeline import RequestTimeline

N = 200  # requests, 100 ms apart; every 20th (i = 19, 39, ..., 199) is slow: k = 0..9


def query(summary: str | None, start: float, dur: float) -> Segment:
    """A statement as the SQLAlchemy hook records it: named `execute`, its summary in the attributes.

    Without a summary the statement is the segment's name (what a driver-level hook might give).
    """
    if summary is None:
        return seg(DB_QUERY, start, start + dur, name="SELECT attachments")
    attrs = {DB_QUERY_SUMMARY: summary, DB_SYSTEM_NAME: "postgresql"}
    return seg(DB_QUERY, start, start + dur, name="execute", **attrs)


def service(
    *,
    queries: bool = True,
    slow_messages_ms: Callable[[int], float] = lambda k: 300 + 50 * k,
    slow_attachment_calls: Callable[[int], int] = lambda k: 10,
    slow_extra: bool = True,
    slow_provider_ms: Callable[[int], float] = lambda k: 200.0,
) -> list[RequestTimeline]:
    """Each request: SELECT users (4 ms), SELECT messages (10 ms), then a 200 ms LLM call.

    Slow request k: SELECT messages takes `slow_messages_ms(k)`, SELECT attachments (20 ms, no
    summary attribute) runs `slow_attachment_calls(k)` times, and with `slow_extra` an UPDATE
    conversations (30 ms) and a SELECT settings (5 ms) run that typical requests skip.
    """
    out = []
    for i in range(N):
        slow, k = i % 20 == 19, i // 20
        t0 = cursor = i * 100.0
        segs = []
        if queries:
            plan: list[tuple[str | None, float]] = [("SELECT users", 4.0)]
            plan.append(("SELECT messages", slow_messages_ms(k) if slow else 10.0))
            if slow:
                plan += [(None, 20.0)] * slow_attachment_calls(k)
                if slow_extra:
                    plan += [("UPDATE conversations", 30.0), ("SELECT settings", 5.0)]
            for summary, dur in plan:
                segs.append(query(summary, cursor, dur))
                cursor += dur
        provider_ms = slow_provider_ms(k) if slow else 200.0
        segs.append(seg(PROVIDER, cursor, cursor + provider_ms, name="chat gpt-4o-mini"))
        cursor += provider_ms
        out.append(req(t0, cursor, *segs, id=f"r{i}"))
    return out


def test_fires_and_names_the_statements_that_make_the_tail_with_hand_computed_evidence() -> None:
    analysis = analysed(service())

    [finding] = SlowQuery().check(analysis)

    assert finding.rule == "slow-query"
    assert finding.layer == DB_QUERY
    # Tail = k = 9, 8, 7. Per tail request: 4 + mean(750, 700, 650) + 10 x 20 + 30 + 5 = 939 ms of
    # statements; per median request 4 + 10 = 14 ms.
    assert finding.impact_ms == 925.0
    assert finding.severity == "critical"
    assert finding.confidence == 1.0
    ev = finding.evidence
    assert ev["query_p50_ms"] == 14.0
    assert ev["query_p99_ms"] == 889.5  # between the 198th (889) and 199th (939) request, at 1%
    assert ev["tail_excess_ms"] == 925.0
    assert ev["share_of_tail_excess"] == 1.0
    # Top three by their part of the tail; SELECT settings (+5 ms) is fourth, SELECT users (+0) none.
    assert ev["statements"] == [
        {
            "statement": "SELECT messages",
            "db_system": "postgresql",
            "count": 200,
            "p50_ms": 10.0,
            "p99_ms": 650.5,  # 190 x 10 ms then 300..750: between 650 and 700, at 1%
            "tail_excess_ms": 690.0,
            "calls_per_tail_request": 1.0,
            "calls_per_median_request": 1.0,
        },
        {
            "statement": "SELECT attachments",  # no summary attribute: the segment's name
            "count": 100,
            "p50_ms": 20.0,
            "p99_ms": 20.0,
            "tail_excess_ms": 200.0,
            "calls_per_tail_request": 10.0,
            "calls_per_median_request": 0.0,
        },
        {
            "statement": "UPDATE conversations",
            "db_system": "postgresql",
            "count": 10,
            "p50_ms": 30.0,
            "p99_ms": 30.0,
            "tail_excess_ms": 30.0,
            "calls_per_tail_request": 1.0,
            "calls_per_median_request": 0.0,
        },
    ]
    assert ev["example_request_ids"] == ["r199", "r179", "r159"]
    assert finding.summary == (
        "The slowest 1% of requests spent 925 ms longer executing database statements than the median request;"
        " most of it in `SELECT messages` (+690 ms), `SELECT attachments` (+200 ms), `UPDATE conversations` (+30 ms)."
    )
    assert "EXPLAIN (ANALYZE, BUFFERS) on `SELECT messages` and `UPDATE conversations`" in finding.fix
    assert "`SELECT attachments` runs 10 times per slow request (0 per median request): an N+1 loop" in finding.fix
    assert "statement_timeout" in finding.fix
    assert "execute" not in str(ev)  # statements go by their summary, not the hook's span name


def test_fingerprint_is_stable_across_runs_and_follows_the_leading_statement() -> None:
    [first] = SlowQuery().check(analysed(service()))
    [again] = SlowQuery().check(analysed(service()))
    # SELECT messages stays at 10 ms; the slow requests run SELECT attachments 27-29 times instead.
    [n_plus_one] = SlowQuery().check(
        analysed(service(slow_messages_ms=lambda k: 10.0, slow_attachment_calls=lambda k: 20 + k, slow_extra=False))
    )

    assert first.fingerprint == again.fingerprint
    assert n_plus_one.fingerprint != first.fingerprint
    [top] = n_plus_one.evidence["statements"]
    assert top["statement"] == "SELECT attachments"
    assert top["tail_excess_ms"] == 560.0  # 28 calls x 20 ms on average in the tail, none in the median
    assert top["calls_per_tail_request"] == 28.0
    assert n_plus_one.fix.startswith("`SELECT attachments` runs 28 times per slow request")


def test_the_loop_threshold_decides_between_explain_and_batching() -> None:
    analysis = analysed(service())

    [finding] = SlowQuery(Thresholds(min_calls_per_request_for_loop=20.0)).check(analysis)

    assert "N+1" not in finding.fix
    assert "on `SELECT messages` and `SELECT attachments` and `UPDATE conversations`" in finding.fix


def test_does_not_fire_when_there_are_no_statements() -> None:
    analysis = analysed(service(queries=False, slow_provider_ms=lambda k: 900 + 50 * k))
    assert not analysis.layer(DB_QUERY).seen

    assert list(SlowQuery().check(analysis)) == []


def test_does_not_fire_when_statements_are_not_in_the_tail() -> None:
    analysis = analysed(
        service(
            slow_messages_ms=lambda k: 10.0,
            slow_attachment_calls=lambda k: 0,
            slow_extra=False,
            slow_provider_ms=lambda k: 900 + 50 * k,
        )
    )
    assert analysis.layer(DB_QUERY).seen and analysis.layer(DB_QUERY).tail_excess_ms == 0

    assert list(SlowQuery().check(analysis)) == []


def test_does_not_fire_when_the_query_excess_is_below_min_tail_excess() -> None:
    assert_min_tail_excess_is_the_boundary(SlowQuery, Thresholds, analysed(service()))

def test_does_not_fire_when_the_query_share_is_below_min_share() -> None:
    # Slow requests: SELECT messages 110 ms (100 over the median), provider 700 ms over.
    analysis = analysed(
        service(
            slow_messages_ms=lambda k: 110.0,
            slow_attachment_calls=lambda k: 0,
            slow_extra=False,
            slow_provider_ms=lambda k: 500 + 50 * k,
        )
    )
    assert analysis.layer(DB_QUERY).share_of_tail_excess == 0.125

    assert list(SlowQuery().check(analysis)) == []
    [finding] = SlowQuery(Thresholds(min_share_of_tail_excess=0.1)).check(analysis)
    assert finding.severity == "warning"


def test_does_not_fire_when_thresholds_are_raised_above_the_tail() -> None:
    analysis = analysed(service())

    assert list(SlowQuery(Thresholds(min_tail_excess_ms=2000.0)).check(analysis)) == []
    assert list(SlowQuery(Thresholds(min_share_of_tail_excess=1.01)).check(analysis)) == []
