"""uninstrumented-gap: says where uncovered tail time sits; not when it is covered or does not grow."""

from __future__ import annotations

from timelines import analysed, assert_min_tail_excess_is_the_boundary, req, seg, timeline

from latprof.analysis.requests import analyze
from latprof.layers import DB_QUERY, PROVIDER, TOOL
from latprof.rules.uninstrumented_gap import END, START, Thresholds, UninstrumentedGap, gaps

N = 200  # every 20th request is slow


def shaped(slow_gap_ms: float, typical_gap_ms: float = 2.0, *, before_db: bool = False) -> list:
    out = []
    for i in range(N):
        t0 = i * 1000.0
        gap = slow_gap_ms if i % 20 == 19 else typical_gap_ms + (i % 7) * 0.1
        if before_db:  # the gap right before the first statement, at the request's start
            out.append(req(t0, t0 + gap + 230, seg(DB_QUERY, t0 + gap, t0 + gap + 20, name="SELECT"),
                           seg(PROVIDER, t0 + gap + 20, t0 + gap + 220, name="POST")))  # fmt: skip
        else:  # between the lookup and the LLM call
            out.append(req(t0, t0 + gap + 230, seg(TOOL, t0 + 5, t0 + 25, name="GET"),
                           seg(PROVIDER, t0 + 25 + gap, t0 + 225 + gap, name="POST")))  # fmt: skip
    return out


def test_gaps_are_the_uncovered_intervals_with_their_neighbours():
    rt = req(0, 100, seg(TOOL, 10, 20, name="GET"), seg(PROVIDER, 15, 40, name="POST"), seg(DB_QUERY, 60, 90, name="SELECT"))
    found = [(g.start_ns - rt.request.start_ns, g.end_ns - rt.request.start_ns, g.before, g.after) for g in gaps(rt)]
    assert found == [
        (0, 10_000_000, START, "GET (tool)"),
        (40_000_000, 60_000_000, "POST (provider)", "SELECT (db.query)"),
        (90_000_000, 100_000_000, "SELECT (db.query)", END),
    ]


def test_fires_and_names_the_position_between_two_spans():
    analysis = analyze(timeline(shaped(900.0), source_kind="otlp"), warmup_s=0)
    [finding] = UninstrumentedGap().check(analysis)
    assert finding.layer == "unattributed"
    assert finding.evidence["between"] == ["GET (tool)", "POST (provider)"]
    assert 850 <= finding.evidence["tail_mean_gap_ms"] <= 900 and finding.evidence["median_mean_gap_ms"] < 5
    assert finding.evidence["tail_requests_with_gap"] == 1.0
    assert "between GET (tool) and POST (provider)" in finding.summary
    assert "latprof run" in finding.fix  # traces: what would measure it


def test_a_gap_before_the_first_statement_is_explained_as_a_possible_pool_wait():
    analysis = analyze(timeline(shaped(900.0, before_db=True), source_kind="otlp"), warmup_s=0)
    [finding] = UninstrumentedGap().check(analysis)
    assert finding.evidence["between"] == [START, "SELECT (db.query)"]
    assert "wait for a database connection" in finding.evidence["explanation"]


def test_min_tail_excess_is_the_boundary():
    assert_min_tail_excess_is_the_boundary(UninstrumentedGap, Thresholds, analysed(shaped(900.0)))


def test_does_not_fire_when_the_tail_is_in_a_covered_layer():
    slow = [req(i * 1000.0, i * 1000.0 + (900 if i % 20 == 19 else 100), seg(TOOL, i * 1000.0, i * 1000.0 + (900 if i % 20 == 19 else 100)))
            for i in range(N)]  # fmt: skip
    assert list(UninstrumentedGap().check(analysed(slow))) == []


def test_does_not_fire_without_a_tail():
    assert list(UninstrumentedGap().check(analysed(shaped(3.0)))) == []
