"""sequential-tool-calls: fires on independent calls made one after another; not on parallel, dependent or agent-loop calls."""

from __future__ import annotations

from typing import Callable

from timelines import analysed, assert_min_tail_excess_is_the_boundary, req, seg

from latprof.events import Segment
from latprof.layers import PROVIDER, TOOL
from latprof.rules.sequential_tool_calls import SequentialToolCalls, Thresholds
from latprof.semconv import SERVER_ADDRESS, TOOL_DEPENDS_ON
from latprof.analysis.timeline import RequestTimeline

N = 200  # requests, 100 ms apart; every 20th is slow (i = 19, 39, ..., 199)
TARGETS = ("crm.local", "tickets.local", "billing.local")


def call(target: str, start: float, ms: float, *, id: str | None = None, **attrs) -> Segment:
    return seg(TOOL, start, start + ms, name=f"HTTP GET {target}", id=id, **{SERVER_ADDRESS: target, **attrs})


Shape = Callable[[float, int], tuple[list[Segment], float]]  # (t0, i) -> (segments, end)


def sequential(t0: float, i: int) -> tuple[list[Segment], float]:
    """Three independent 150 ms lookups one after another (2 ms apart), then the LLM."""
    segs, cursor = [], t0 + 10
    for target in TARGETS:
        segs.append(call(target, cursor, 150))
        cursor += 152
    segs.append(seg(PROVIDER, cursor, cursor + 200))
    return segs, cursor + 200


def gathered(t0: float, i: int) -> tuple[list[Segment], float]:
    """The same lookups started together (150, 300 and 450 ms long)."""
    segs = [call(target, t0 + 10, 150 * (k + 1)) for k, target in enumerate(TARGETS)]
    segs.append(seg(PROVIDER, t0 + 462, t0 + 662))
    return segs, t0 + 662


def chained(t0: float, i: int) -> tuple[list[Segment], float]:
    """Each lookup sends an id from the previous one's response."""
    segs, cursor, previous = [], t0 + 10, None
    for k, target in enumerate(TARGETS):
        sid = f"c{i}-{k}"
        attrs = {TOOL_DEPENDS_ON: previous} if previous else {}
        segs.append(call(target, cursor, 150, id=sid, **attrs))
        previous = sid
        cursor += 152
    segs.append(seg(PROVIDER, cursor, cursor + 200))
    return segs, cursor + 200


def agent_loop(t0: float, i: int) -> tuple[list[Segment], float]:
    """LLM -> tool -> LLM -> tool -> LLM: each tool was chosen by the LLM call before it."""
    segs, cursor = [], t0 + 10
    for target in TARGETS[:2]:
        segs.append(seg(PROVIDER, cursor, cursor + 60))
        cursor += 61
        segs.append(call(target, cursor, 200))
        cursor += 201
    segs.append(seg(PROVIDER, cursor, cursor + 60))
    return segs, cursor + 60


def typical(t0: float, i: int) -> tuple[list[Segment], float]:
    segs = [call(TARGETS[0], t0 + 10, 150), seg(PROVIDER, t0 + 162, t0 + 262)]
    return segs, t0 + 262


def service(slow: Shape) -> list[RequestTimeline]:
    out = []
    for i in range(N):
        t0 = i * 1000.0
        segs, end = (slow if i % 20 == 19 else typical)(t0, i)
        out.append(req(t0, end, *segs, id=f"r{i}", cpu_ms=5))
    return out


def test_fires_on_independent_calls_one_after_another_with_the_saving():
    [finding] = SequentialToolCalls().check(analysed(service(sequential)))
    ev = finding.evidence
    # Tail: three 150 ms calls (450 ms) against one in the median; calling them together saves 300 ms.
    assert ev["tail_mean_parallel_saving_ms"] == 300.0 and ev["median_mean_parallel_saving_ms"] == 0.0
    assert finding.impact_ms == 300.0
    assert ev["tail_requests_with_sequential_calls"] == 1.0 and ev["longest_run_calls"] == 3
    assert ev["common_run"] == list(TARGETS) and ev["dependent_pairs_in_tail"] == 0
    assert "LLM call between" in ev["judged_independent_by"]
    assert ev["example_request_ids"][0] in {"r199", "r179", "r159"}
    assert "crm.local -> tickets.local -> billing.local" in finding.summary and "gather" in finding.fix


def test_silent_when_the_calls_already_run_together():
    analysis = analysed(service(gathered))
    assert analysis.layer(TOOL).share_of_tail_excess > 0.5  # tool still owns the tail: the calls are slow
    assert list(SequentialToolCalls().check(analysis)) == []


def test_silent_when_each_call_uses_the_previous_response():
    analysis = analysed(service(chained))
    assert analysis.layer(TOOL).share_of_tail_excess > 0.5
    assert list(SequentialToolCalls().check(analysis)) == []


def test_silent_on_an_agent_loop():
    analysis = analysed(service(agent_loop))
    assert analysis.layer(TOOL).share_of_tail_excess > 0.5
    assert list(SequentialToolCalls().check(analysis)) == []


def test_calls_far_apart_are_not_one_run():
    def apart(t0: float, i: int) -> tuple[list[Segment], float]:
        segs, cursor = [], t0 + 10
        for target in TARGETS:
            segs.append(call(target, cursor, 150))
            cursor += 150 + 80  # 80 ms of the request's own work between calls
        return segs, cursor

    assert list(SequentialToolCalls().check(analysed(service(apart)))) == []
    assert list(SequentialToolCalls(Thresholds(max_gap_ms=100)).check(analysed(service(apart))))


def test_min_tail_excess_is_the_boundary():
    assert_min_tail_excess_is_the_boundary(SequentialToolCalls, Thresholds, analysed(service(sequential)))
