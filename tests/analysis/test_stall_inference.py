"""An event loop blocked by one request's own code, inferred from stock spans (latprof.analysis.stall_inference):
hand-built services with known stalls, and the shapes that must not read as one."""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from timelines import ms, req, seg, timeline

from latprof.analysis.inference import INFERRED, INFERRED_CONFIDENCE
from latprof.analysis.requests import analyze
from latprof.analysis.span_inference import infer_from_spans
from latprof.analysis.stall_inference import (
    INFERRED_BLOCKED_BY,
    INFERRED_BLOCKING_REQUEST,
    INFERRED_BLOCKING_SPAN,
    INFERRED_HELD,
    INFERRED_STALL_MS,
    MIN_STALLS,
    POSSIBLE_STALL_CONFIDENCE,
    PossibleStall,
    candidate_stalls,
    find_stalls,
    infer_event_loop_stalls,
    own_code_gaps,
    share_in_possible_stalls,
)
from latprof.analysis.timeline import RequestTimeline, Timeline
from latprof.engine import run_rules
from latprof.layers import DB_QUERY, EVENT_LOOP, PROVIDER, TOOL
from latprof.pipeline import default_rules
from latprof.report.model import build_report

STALL_MS = 300.0
#: What the requests in flight at a stall were awaiting: two queries and two LLM calls.
MIXED = (DB_QUERY, PROVIDER, DB_QUERY, PROVIDER)


def chat(t: float, db_ms: float = 40, llm_ms: float = 100, pid: int = 1) -> RequestTimeline:
    """An ordinary request at `t`: a query, then an LLM call (~142 ms, no gap between its spans)."""
    return req(t, t + 2 + db_ms + llm_ms, seg(DB_QUERY, t + 0.5, t + 0.5 + db_ms, name="SELECT"),
               seg(PROVIDER, t + 1 + db_ms, t + 1 + db_ms + llm_ms, name="POST"), pid=pid, route="GET /chat")  # fmt: skip


def stall(at: float, awaiting: Sequence[str] = MIXED, *, stall_ms: float = STALL_MS, pid: int = 1,
          route: str = "GET /export", spread_ms: float = 2.0, internal: bool = False,
          awaited_ms: float = 0.0) -> list[RequestTimeline]:  # fmt: skip
    """A request of `route` whose own code holds the loop from `at` for `stall_ms` after a query (its
    response at the end: it resumes first), and one request in flight per `awaiting` layer whose span,
    open across the stall, ends in the release, `spread_ms` apart. With `internal` the blocking code runs
    in an INTERNAL span (`render_pdf`, layer-less); with `awaited_ms` the request first awaits that long
    something no span shows, while the others go on."""
    end = at + stall_ms
    inner = [seg(None, at + 1, end - 1, name="render_pdf")] if internal else []
    query = seg(DB_QUERY, at - 29 - awaited_ms, at - awaited_ms, name="SELECT")
    out = [req(at - 30 - awaited_ms, end, query, *inner, route=route, pid=pid)]
    for j, layer in enumerate(awaiting):
        opened, released = at - 10 - 15 * j, end + 0.5 + spread_ms * j
        if layer == PROVIDER:  # its last step: the response follows
            out.append(req(opened - 1, released + 1, seg(PROVIDER, opened, released, name="POST"), pid=pid, route="GET /chat"))
        else:  # then an LLM call
            out.append(req(opened - 1, released + 102, seg(layer, opened, released, name="SELECT"),
                           seg(PROVIDER, released + 1, released + 101, name="POST"), pid=pid, route="GET /chat"))  # fmt: skip
    return out


def service(stall_times: Iterable[float], until: float = 12_000, freeze_times: Iterable[float] = (), freeze_ms: float = STALL_MS,
            every_ms: float = 25, **kwargs: object) -> Timeline:  # fmt: skip
    """Ordinary requests every `every_ms`, none in flight across a stall or a freeze, a stall at each of
    `stall_times` and a freeze of `freeze_ms` at each of `freeze_times` (`freezes`)."""
    stalls, frozen = sorted(stall_times), sorted(freeze_times)
    out: list[RequestTimeline] = []
    t = 0.0
    while t < until:
        if any(at - 160 < t < at + STALL_MS + 10 for at in stalls + frozen):
            t += 5
            continue
        out.append(chat(t))
        t += every_ms
    for at in stalls:
        out += stall(at, **kwargs)  # type: ignore[arg-type]
    return timeline(out + freezes(frozen, freeze_ms), source_kind="otlp")


def inferred_segments(tl: Timeline) -> list[tuple[str, object]]:
    return [(rt.request.route, s) for rt in tl.requests for s in rt.segments if s.attrs.get(INFERRED)]


def test_own_code_gaps_are_where_no_layered_span_is_open():
    rt = req(0, 300, seg(DB_QUERY, 0, 40), seg(None, 50, 250, name="render"), seg(PROVIDER, 260, 280), seg(TOOL, 270, 290))
    assert own_code_gaps(rt) == [(ms(40), ms(260))]  # the layer-less span is the request's own code
    assert own_code_gaps(req(0, 300, seg(PROVIDER, 0, 280))) == []  # 20 ms at the end: not a stall
    assert own_code_gaps(req(0, 300, seg(PROVIDER, 0, 200))) == [(ms(200), ms(300))]


def test_spans_released_together_after_a_requests_own_code_are_an_inferred_stall():
    stalls = [2500 + 1500 * k for k in range(5)]
    tl = service(stalls)
    found, proving = find_stalls(tl)
    assert proving == 5 and len(found) == 5
    assert [(st.start_ns, st.end_ns) for st in found] == [(ms(at), ms(at + STALL_MS)) for at in stalls]
    assert all(st.released_requests == 4 and st.resumed_first for st in found)

    inferred = infer_event_loop_stalls(tl)
    waits = [(route, s) for route, s in inferred_segments(inferred) if s.layer == EVENT_LOOP]  # type: ignore[attr-defined]
    assert len(waits) == 20 and {route for route, _ in waits} == {"GET /chat"}
    for _, s in waits:
        assert s.attrs[INFERRED_BLOCKED_BY] == "GET /export" and s.attrs[INFERRED_STALL_MS] == STALL_MS
        assert s.parent_id is not None and s.segment_id.startswith(s.parent_id)  # under the span it stretched
        assert any(s.start_ns == ms(at) and s.end_ns <= ms(at + STALL_MS + 7) for at in stalls)
    held = [s for route, s in inferred_segments(inferred) if route == "GET /export"]
    assert len(held) == 5 and all(s.layer is None and s.name == INFERRED_HELD for s in held)  # type: ignore[attr-defined]
    assert {s.attrs[INFERRED_BLOCKING_REQUEST] for _, s in waits} == {rt.request.request_id for rt in inferred.requests
                                                                      if rt.request.route == "GET /export"}  # fmt: skip


def test_the_verdict_is_event_loop_inferred_and_names_the_blocking_route():
    tl = infer_from_spans(service([2500 + 1500 * k for k in range(6)], internal=True), warmup_s=2.0)
    analysis = analyze(tl, warmup_s=2.0)
    findings = run_rules(analysis, default_rules())
    report = build_report(analysis, findings)
    assert (report.verdict.layer, report.verdict.rule) == (EVENT_LOOP, "event-loop-blocked"), report.verdict
    assert "inferred from" in report.verdict.summary and report.verdict.confidence <= INFERRED_CONFIDENCE
    [finding] = [f for f in findings if f.rule == "event-loop-blocked"]
    assert finding.summary.startswith("Inferred") and finding.confidence <= INFERRED_CONFIDENCE
    evidence = finding.evidence
    assert evidence["inferred"] is True and evidence["stalls"] == 6 and evidence["proving_stalls"] == 6
    assert evidence["blocked_by"] == {"GET /export": 6} and evidence["blocking_spans"] == {"render_pdf": 6}
    assert evidence["stall_p50_ms"] == STALL_MS
    assert "`GET /export` (span `render_pdf`)" in finding.fix and "asyncio.to_thread" in finding.fix
    assert "run_in_executor" in finding.fix and "async driver" in finding.fix
    # without the inference, the same spans blame the database
    plain = analyze(service([2500 + 1500 * k for k in range(6)], internal=True), warmup_s=2.0)
    assert build_report(plain, run_rules(plain, default_rules())).verdict.layer != EVENT_LOOP


def test_blocking_code_in_an_internal_span_after_an_unseen_await_is_found_by_that_span():
    """The blocking request's gap holds the others' spans starting (it awaited something unseen first):
    the stall is the quiet window its own INTERNAL span's start and end bound, and that span's end is
    the request resuming first."""
    tl = service([2500 + 1500 * k for k in range(4)], internal=True, awaited_ms=60)
    found, proving = find_stalls(tl)
    assert proving == 4 and len(found) == 4
    assert all(st.stall_ns == ms(STALL_MS - 2) - ms(0) for st in found)  # render_pdf's own length
    inferred = infer_event_loop_stalls(tl)
    assert {s.attrs[INFERRED_BLOCKING_SPAN] for _, s in inferred_segments(inferred)} == {"render_pdf"}  # type: ignore[attr-defined]


def test_a_request_between_spans_across_the_stall_waits_for_the_loop_from_its_root():
    tl = service([2500 + 1500 * k for k in range(4)])
    at = 2500.0
    # its LLM call ended just before the stall; its next step came only in the release
    waiting = req(at - 80, at + STALL_MS + 30, seg(PROVIDER, at - 79, at - 5, name="POST"),
                  seg(DB_QUERY, at + STALL_MS + 3, at + STALL_MS + 28, name="INSERT"), id="waiting")  # fmt: skip
    tl.requests = sorted([*tl.requests, waiting], key=lambda rt: rt.request.start_ns)
    inferred = infer_event_loop_stalls(tl)
    [rt] = [rt for rt in inferred.requests if rt.request.request_id == "waiting"]
    [wait] = [s for s in rt.segments if s.layer == EVENT_LOOP]
    assert (wait.parent_id, wait.start_ns, wait.end_ns) == (None, ms(at), ms(at + STALL_MS + 3))


def test_a_span_open_across_the_stall_whose_answer_came_later_waited_during_the_stall_only():
    tl = service([2500 + 1500 * k for k in range(4)])
    at = 4000.0
    # its LLM call was sent as the loop stopped: the provider worked after the release
    late = req(at - 3, at + STALL_MS + 150, seg(PROVIDER, at - 2, at + STALL_MS + 149, name="POST"), id="late")
    tl.requests = sorted([*tl.requests, late], key=lambda rt: rt.request.start_ns)
    [rt] = [rt for rt in infer_event_loop_stalls(tl).requests if rt.request.request_id == "late"]
    [wait] = [s for s in rt.segments if s.layer == EVENT_LOOP]
    assert (wait.start_ns, wait.end_ns) == (ms(at), ms(at + STALL_MS))


def test_one_layer_stalls_count_only_on_an_instance_proven_blocked():
    one_layer = (PROVIDER, PROVIDER, PROVIDER, PROVIDER)  # an LLM gateway answering a batch looks the same
    alone = timeline([rt for k in range(5) for rt in stall(2500 + 1500 * k, one_layer)], source_kind="otlp")
    assert len(candidate_stalls(alone)) == 5
    assert find_stalls(alone) == ([], 0)
    assert infer_event_loop_stalls(alone) is alone
    mixed = timeline([rt for k in range(3) for rt in stall(2500 + 1500 * k)] + stall(7000, one_layer), source_kind="otlp")
    found, proving = find_stalls(mixed)
    assert proving == 3 and len(found) == 4


def freezes(times: Iterable[float], stall_ms: float = STALL_MS) -> list[RequestTimeline]:
    """The process stopped as a whole at each of `times`: the same release, but every request in flight was
    inside a span (none between spans to resume first)."""
    return [rt for at in times for rt in stall(at, stall_ms=stall_ms)[1:]]


def test_stalls_must_outnumber_the_freezes_as_long_twice_over():
    """A process stopped as a whole (a GC pause, its CPU taken) now and then stops a request between spans,
    which then resumes first: stalls among as many freezes as long prove nothing."""
    four = [2500 + 1500 * k for k in range(4)]
    assert len(find_stalls(service(four, until=20_000))[0]) == 4
    with_freezes = service(four, until=20_000, freeze_times=[9000, 10500])
    assert len(candidate_stalls(with_freezes)) == 6
    assert find_stalls(with_freezes) == ([], 0)  # 4 stalls, 2 freezes as long: not twice over
    inferred = infer_event_loop_stalls(with_freezes)
    assert inferred_segments(inferred) == []
    assert len(inferred.possible_stalls) == 4  # proving nothing, each still looks like one (and the freezes do not)
    assert len(find_stalls(service([*four, 12000], until=20_000, freeze_times=[9000, 10500]))[0]) == 5
    short = service(four, until=20_000, freeze_times=[9000, 10500, 13500], freeze_ms=60)
    assert len(find_stalls(short)[0]) == 4  # freezes under half the stalls' length are another matter


def test_does_not_fire_with_fewer_stalls_than_needed():
    tl = service([2500 + 1500 * k for k in range(MIN_STALLS - 1)])
    assert len(find_stalls(tl)[0]) == 0 and len(candidate_stalls(tl)) == MIN_STALLS - 1
    inferred = infer_event_loop_stalls(tl)
    assert inferred_segments(inferred) == [] and len(inferred.possible_stalls) == MIN_STALLS - 1


def test_does_not_fire_when_the_stalls_were_in_the_warm_up():
    tl = service([300, 700, 1100, 1500], until=6_000)  # all in the first 2 s
    assert infer_event_loop_stalls(tl, warmup_s=2.0) is tl
    assert infer_event_loop_stalls(tl, warmup_s=0.0) is not tl  # the same stalls, analysed
    later = service([300, 700, 2500, 3000, 3500], until=6_000)
    assert find_stalls(later, warmup_s=2.0)[1] == 3
    assert len(find_stalls(later, warmup_s=2.0)[0]) == 5  # once concluded, the warm-up's stalls are read alike


def test_does_not_fire_on_a_busy_service_whose_spans_end_when_their_answers_arrive():
    """Many requests in flight, long LLM calls and queries; one request in 10 awaits 300 ms of something
    no span shows (`asyncio.sleep`, an uninstrumented client) while the others go on."""
    out = []
    for i in range(600):
        t = i * 20.0
        if i % 10 == 9:
            out.append(req(t, t + 340, seg(DB_QUERY, t + 1, t + 40, name="SELECT"), route="GET /chat"))
        else:
            out.append(chat(t, db_ms=30 + (i * 7) % 50, llm_ms=150 + (i * 37) % 400))
    tl = timeline(out, source_kind="otlp")
    assert candidate_stalls(tl)  # quiet windows in the waiting requests' gaps, with no common release after them
    assert find_stalls(tl) == ([], 0)
    assert infer_event_loop_stalls(tl) is tl


def test_does_not_fire_when_spans_end_together_but_the_waiting_request_wakes_on_its_own():
    """A quiet window (everyone awaits), then the others' answers arrive together - a batch - and the
    request between spans wakes 60 ms later: it did not hold the loop."""
    out = []
    for k in range(6):
        at = 2500 + 1500 * k
        [blocker, *others] = stall(at)
        out.append(req(at - 30, at + STALL_MS + 60, *blocker.segments, route="GET /export"))
        out += others
    tl = timeline(out, source_kind="otlp")
    candidates = candidate_stalls(tl)
    assert len(candidates) == 6 and all(not c.resumed_first and c.released_requests == 4 for c in candidates)
    assert infer_event_loop_stalls(tl) is tl


def test_does_not_fire_on_a_fan_out_whose_calls_end_together():
    """One request gathers 4 calls in two layers that end together after a quiet window, while another
    request between spans resumes first: the release is one request's, not the loop's."""
    out = []
    for k in range(6):
        at = 2500 + 1500 * k
        end = at + STALL_MS
        out.append(req(at - 30, end, seg(DB_QUERY, at - 29, at, name="SELECT"), route="GET /export"))
        calls = [seg(PROVIDER, at - 20, end + 1 + j, name="POST") for j in range(3)] + [seg(DB_QUERY, at - 20, end + 4)]
        out.append(req(at - 25, end + 6, *calls, route="GET /fanout"))
    tl = timeline(out, source_kind="otlp")
    candidates = candidate_stalls(tl)
    assert len(candidates) == 6 and all(c.resumed_first and c.released_requests == 1 for c in candidates)
    assert infer_event_loop_stalls(tl) is tl


def test_a_stall_of_another_instance_is_not_quiet_here_and_instances_are_judged_apart():
    tl = service([2500 + 1500 * k for k in range(4)])
    noise = [chat(2400 + 20 * j, pid=2) for j in range(600)]  # another instance, busy all along
    both = timeline([*tl.requests, *noise], source_kind="otlp")
    found, _ = find_stalls(both)
    assert len(found) == 4 and {st.pid for st in found} == {1}


def test_nothing_to_do_is_cheap_and_returns_the_same_timeline():
    tl = timeline([chat(25.0 * i) for i in range(400)], source_kind="otlp")
    assert candidate_stalls(tl) == []
    assert infer_event_loop_stalls(tl) is tl
    assert infer_event_loop_stalls(timeline([], source_kind="otlp")).requests == []


def test_too_few_stalls_to_prove_one_leave_the_layer_they_stretched_believed_less():
    """Two stalls (MIN_STALLS is 3) at 40 requests a second: nothing is inferred, but the tail's queries they
    stretched lie in windows no request could begin in, where 12 were due: the verdict's layer is believed
    under 0.5, and the summary says a blocked loop looks the same and which route ran its code then."""
    tl = infer_from_spans(service([4000, 8000]), warmup_s=2.0)
    assert inferred_segments(tl) == []
    assert [(s.start_ns, s.end_ns, s.blocked_by) for s in tl.possible_stalls] == [
        (ms(at), ms(at + STALL_MS), "GET /export") for at in (4000, 8000)
    ]
    analysis = analyze(tl, warmup_s=2.0)
    verdict = build_report(analysis, run_rules(analysis, default_rules())).verdict
    assert verdict.layer == DB_QUERY and verdict.confidence <= POSSIBLE_STALL_CONFIDENCE, verdict
    assert "blocked event loop" in verdict.summary and "(GET /export)" in verdict.summary
    assert "2 window(s) of up to 300 ms" in verdict.summary
    # the same spans without those windows: the database, believed
    plain = analyze(dataclasses.replace(tl, possible_stalls=()), warmup_s=2.0)
    believed = build_report(plain, run_rules(plain, default_rules())).verdict
    assert believed.layer == DB_QUERY and believed.confidence > 0.5 and "event loop" not in believed.summary


def test_a_quiet_window_that_chance_explains_at_the_arrival_rate_is_no_possible_stall():
    """The same two stalls' shape at 4 requests a second: a quiet 300 ms is about one missed arrival, what a
    request awaiting something unseen while the loop runs free leaves as often."""
    tl = service([4000, 8000], every_ms=250)
    shaped = [c for c in candidate_stalls(tl) if c.resumed_first and c.blocker is not None]
    assert len(shaped) == 2
    assert infer_from_spans(tl, warmup_s=2.0).possible_stalls == ()
    assert share_in_possible_stalls(tl.requests, DB_QUERY, ()) == 0.0


def test_share_in_possible_stalls_counts_the_layers_time_inside_the_windows_of_its_instance():
    windows = (PossibleStall(1, ms(100), ms(200), "GET /export"), PossibleStall(1, ms(300), ms(400), "GET /export"))
    rt = req(0, 500, seg(DB_QUERY, 50, 350), seg(PROVIDER, 360, 380), seg(DB_QUERY, 450, 550))
    # the first query: 100 + 50 of its 300 ms inside; the last: 0 of 100
    assert share_in_possible_stalls([rt], DB_QUERY, windows) == 150 / 400
    assert share_in_possible_stalls([rt], PROVIDER, windows) == 1.0
    other = req(0, 500, seg(DB_QUERY, 50, 350), pid=2)
    assert share_in_possible_stalls([other], DB_QUERY, windows) == 0.0  # another instance's windows
