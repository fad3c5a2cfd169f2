"""Requests reconstructed from a worker thread's samples in time order (`latprof.attach.reconstruct`):
py-spy's chrometrace read into spans, runs made into requests, and what the analysis believes of them."""

from __future__ import annotations

import json

from attach.sampled import ORIGIN_NS

from latprof.analysis.timeline import RequestTimeline, Timeline
from latprof.attach.analysis import analyze_attach, build_attach_report, judge
from latprof.attach.reconstruct import GAUGE_CUT, RECONSTRUCTED, THREAD_ID, reconstruct
from latprof.attach.session import classify_window
from latprof.collectors.attach import pyspy
from latprof.collectors.attach.stacks import Frame
from latprof.events import Gauge, Request, Segment
from latprof.layers import DB_POOL, DB_QUERY
from latprof.pipeline import default_rules

SITE = "/venv/lib/python3.12/site-packages"
MS = 1_000_000
IDLE = (Frame("_worker", "concurrent/futures/thread.py"), Frame("Thread.run", "threading.py"))
HANDLE = (Frame("ThreadWorker.handle_request", "gunicorn/workers/gthread.py"), Frame("_WorkItem.run", "concurrent/futures/thread.py"),
          *IDLE)  # fmt: skip
VIEW = (Frame("lookup", "/srv/app/views.py"), *HANDLE)
QUERY = (Frame("Connection.wait", "psycopg/connection.py"), *VIEW)
POOL = (Frame("WaitingClient.wait", "psycopg_pool/pool.py"), Frame("ConnectionPool.getconn", "psycopg_pool/pool.py"), *VIEW)


def _event(ph: str, frame: tuple[str, str], ts_us: int, key: int = 77) -> dict[str, object]:
    return {"ph": ph, "name": frame[0], "args": {"filename": frame[1], "line": 3}, "ts": ts_us, "tid": key, "pid": 1, "cat": "py-spy"}


def test_chrometrace_becomes_each_threads_stacks_in_time_and_their_counts() -> None:
    thread = ("thread (4242): worker", "")
    boot = ("Thread.run", "/usr/lib/python3.12/threading.py")
    wait = ("Connection.wait", f"{SITE}/psycopg/connection.py")
    events = [
        _event("B", thread, 0), _event("B", boot, 0),  # idle from 0 ...
        _event("B", wait, 30_000),  # ... in a query from 30 ms ...
        _event("E", wait, 110_000),  # ... back to idle at 110 ms
        _event("E", boot, 200_000), _event("E", thread, 200_000),  # the recording's end
        _event("B", ("thread (4243)", ""), 0, key=78), _event("B", boot, 0, key=78), _event("E", boot, 50_000, key=78),
        _event("E", ("thread (4243)", ""), 50_000, key=78), {"ph": "B", "torn": True},
    ]  # fmt: skip
    counts, spans = pyspy.parse_chrometrace(json.dumps(events), rate=100)
    idle, query, other = counts
    assert (idle.tid, idle.thread, idle.frames) == (4242, "worker", (Frame("Thread.run", "threading.py"),))
    assert query.frames == (Frame("Connection.wait", "psycopg/connection.py"), Frame("Thread.run", "threading.py"))
    # counts are time at the rate: 30 + 90 ms idle, 80 ms in the query, at 100 Hz
    assert (idle.count, query.count) == (12, 8)
    assert (other.tid, other.thread, other.count) == (4243, "", 5)
    assert spans[4242] == ((0, 30 * MS, 0), (30 * MS, 110 * MS, 1), (110 * MS, 200 * MS, 0))
    assert spans[4243] == ((0, 50 * MS, 2),)
    assert pyspy.parse_chrometrace("[torn", rate=100) == ([], {})


def _window(plan: list[tuple[tuple[Frame, ...], int]], *, tid: int = 11, pid: int = 10, start_ns: int = ORIGIN_NS) -> pyspy.Window:
    """A recording of one worker thread that spends each (stack, ms) of `plan` in turn."""
    stacks: list[tuple[Frame, ...]] = []
    spans, at = [], 0
    for frames, ms in plan:
        if frames not in stacks:
            stacks.append(frames)
        spans.append((at * MS, (at + ms) * MS, stacks.index(frames)))
        at += ms
    counts = [pyspy.StackCount(tid, "worker", frames, max(1, sum(ms for f, ms in plan if f == frames) // 10)) for frames in stacks]
    return pyspy.Window(pid, start_ns, start_ns + at * MS, 100, counts, {tid: tuple(spans)})


def test_a_run_between_two_idle_spans_is_a_request_with_a_segment_per_layer() -> None:
    window = _window([(HANDLE, 40), (IDLE, 100), (POOL, 30), (QUERY, 80), (VIEW, 10), (IDLE, 200), (QUERY, 90)])
    events, cut = reconstruct(window, lambda tid, start_ns, end_ns: "0")  # every wait channel read: running
    (request,) = [e for e in events if isinstance(e, Request)]
    segments = [e for e in events if isinstance(e, Segment)]
    assert (request.start_ns - ORIGIN_NS, request.end_ns - ORIGIN_NS) == (140 * MS, 260 * MS)
    assert request.route == "lookup (views.py)"  # the service's outermost own frame: its view
    assert request.attrs[RECONSTRUCTED] == 100.0 and request.attrs[THREAD_ID] == 11
    # waiting for a connection, then the statement (their frames say so), then the view's own
    # 10 ms running Python (its wait channel says so: app)
    assert [(s.layer, (s.end_ns - s.start_ns) // MS) for s in segments] == [(DB_POOL, 30), (DB_QUERY, 80), ("app", 10)]
    assert all(s.attrs[RECONSTRUCTED] == 100.0 for s in segments)
    # the first run began before the recording, the last ended after it: both left out, and counted
    assert cut is not None and (cut.name, cut.value) == (GAUGE_CUT, 2)


def _timeline(windows: list[pyspy.Window]) -> Timeline:
    """What `latprof attach` writes of `windows` (stack samples, reconstructed requests), as the analysis reads it."""
    samples, requests, segments, gauges = [], [], {}, {}
    for window in windows:
        samples += [sample for sample, _ in classify_window(window, {}, 100)]
        events, cut = reconstruct(window)
        for e in events:
            if isinstance(e, Request):
                requests.append(e)
            else:
                segments.setdefault(e.request_id, []).append(e)
        if cut is not None:
            gauges.setdefault(cut.name, []).append(cut)
    samples.sort(key=lambda s: s.ts_ns)
    return Timeline("attach", ["<test>"], [RequestTimeline(r, tuple(segments.get(r.request_id, ()))) for r in requests],
                    gauges=gauges, samples=samples,
                    headers=[{"type": "header", "source": "attach", "rate_hz": 100, "target_pid": 10}])  # fmt: skip


def _seconds(plan: list[tuple[tuple[Frame, ...], int]], seconds: int, threads: int = 2) -> list[pyspy.Window]:
    """`plan` (a second's worth) recorded on `threads` worker threads, `seconds` recordings apart."""
    return [_window(plan, tid=11 + t, start_ns=ORIGIN_NS + s * 2_500 * MS) for s in range(seconds) for t in range(threads)]


def test_a_tail_whose_time_went_elsewhere_than_the_medians_is_judged_and_inferred() -> None:
    """Most requests run a 60 ms statement; one in twenty first waits 200 ms for a connection:
    too little of the workers' busy time for the samples alone to name the pool (14%, under
    20%), and not saturated (workers idle a third of the time), but the reconstructed requests
    have a tail the pool owns."""
    typical = [(IDLE, 30), (QUERY, 60)]
    slow = [(IDLE, 30), (POOL, 200), (QUERY, 60)]
    plan = [(HANDLE, 5), *typical * 10, *slow, *typical * 9, (IDLE, 30)]
    aa = analyze_attach(_timeline(_seconds(plan, 12)))
    assert aa.reconstructed is not None and aa.reconstructed["tail"] == "judged", aa.reconstructed
    assert aa.reconstructed["requests"] == 12 * 2 * 20  # every run between two idle spans, the cut one left out
    findings = judge(aa, default_rules())
    report = build_attach_report(aa, findings)
    verdict = report.verdict
    assert verdict.layer == DB_POOL and verdict.status == "layer", verdict
    assert 0 < verdict.confidence <= 0.6  # inferred: believed less than a measured verdict
    assert "reconstructed" in verdict.summary and "inferred" in verdict.summary
    reconstructed = report.collection["reconstructed"]
    assert 0.1 < reconstructed["layers"][DB_POOL] < 0.2 and reconstructed["latency_ms"]["p99"] >= 250
    assert report.latency_ms is None and report.window["requests"] is None  # estimates stay in `reconstructed`


def test_a_tail_that_spends_its_time_as_the_median_does_is_not_judged() -> None:
    """Two 60 ms statements a thread served back to back with no idle sample between them are
    one 120 ms run: a tail made of those has the median's layer mix, and names no layer."""
    plan = [(HANDLE, 5), *[(IDLE, 30), (QUERY, 60)] * 8, (IDLE, 30), (QUERY, 120), (IDLE, 30)]
    aa = analyze_attach(_timeline(_seconds(plan, 12)))
    assert aa.reconstructed is not None and aa.reconstructed["tail_mix_distance"] < 0.1
    assert aa.reconstructed["tail"].startswith("like the median") and aa.requests is None
    report = build_attach_report(aa, judge(aa, default_rules()))
    assert report.verdict.layer is None and report.verdict.status == "not_saturated", report.verdict
    assert "back to back" in report.verdict.summary
    assert not [f for f in report.findings if f.evidence.get("inferred_from", "").startswith("runs of")]


def test_requests_of_a_thread_never_seen_idle_are_left_out() -> None:
    """A thread busy in every sample may have served several requests in one run."""
    plan = [(HANDLE, 5), *[(IDLE, 1), (QUERY, 200)] * 5]
    timeline = _timeline(_seconds(plan, 3, threads=1))
    timeline.gauges[GAUGE_CUT] = timeline.gauges.get(GAUGE_CUT, []) + [Gauge(GAUGE_CUT, 0, ORIGIN_NS, 10)]
    aa = analyze_attach(timeline)
    assert aa.reconstructed is not None and aa.reconstructed["requests"] == 0 and aa.reconstructed["threads_left_out"] == 1


def test_a_tail_in_llm_calls_names_no_layer_since_stacks_cannot_split_first_token_from_decoding() -> None:
    """Most requests run a 60 ms statement; one in twenty streams an LLM answer for 400 ms. A
    stack inside the stream is waiting for a token or decoding one: `provider` or `model`, and
    naming either could be the wrong one."""
    stream = (Frame("Stream.__iter__", "openai/_streaming.py"), *VIEW)
    typical = [(IDLE, 30), (QUERY, 60)]
    plan = [(HANDLE, 5), *typical * 10, (IDLE, 30), (stream, 400), *typical * 9, (IDLE, 30)]
    aa = analyze_attach(_timeline(_seconds(plan, 12)))
    assert aa.reconstructed is not None and aa.reconstructed["tail"] == "judged", aa.reconstructed
    report = build_attach_report(aa, judge(aa, default_rules()))
    assert report.verdict.layer is None and report.verdict.status == "not_saturated", report.verdict
    assert "cannot tell apart" in report.verdict.summary and "latprof run" in report.verdict.summary


def test_a_longer_recording_is_cut_into_its_seconds_each_with_the_time_spent_then() -> None:
    """`latprof attach` records five seconds at a time (py-spy's start costs the service) and still
    stamps each sample with its own second."""
    window = _window([(IDLE, 700), (QUERY, 600), (IDLE, 1000), (POOL, 900)], tid=11)  # 3.2 s
    parts = window.seconds()
    assert [(p.start_ns - ORIGIN_NS, p.end_ns - ORIGIN_NS) for p in parts] == [(0, 1000 * MS), (1000 * MS, 2000 * MS),
                                                                             (2000 * MS, 3200 * MS)]  # fmt: skip
    by_part = [{c.frames[0].name: c.count for c in p.counts} for p in parts]
    # at 100 Hz: 700 ms idle and 300 ms of the statement, then 300 + 700 ms, then 300 ms idle and 900 ms of pool wait
    assert by_part == [{"_worker": 70, "Connection.wait": 30}, {"Connection.wait": 30, "_worker": 70},
                       {"_worker": 30, "WaitingClient.wait": 90}]  # fmt: skip
    assert _window([(IDLE, 1100)]).seconds() == [_window([(IDLE, 1100)])]  # a second's recording stays whole
