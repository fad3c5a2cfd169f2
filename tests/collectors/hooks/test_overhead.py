"""What latprof costs the service: each process's `overhead` record, the report's `collection.overhead`, the footer.

The record is made by the hooks' runtime (`runtime.cost`): the capture writer's thread CPU, read
from its clock, and the time in the recording functions, timed on about 1 call in 16 and scaled
up. The tests run the real runtime, the real writer and, at the end, the real `latprof run`.
"""

from __future__ import annotations

import dataclasses
import gc
import io
import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from report_schema import schema_errors

from latprof.capture.reader import read_captures
from latprof.capture.writer import CaptureWriter
from latprof.collectors.hooks import runtime
from latprof.events import QualityRecord
from latprof.pipeline import diagnose
from latprof.report.model import overhead_of, overhead_parts
from latprof.report.renderers import REPORT
from latprof.semconv import NOTE_OVERHEAD, OVERHEAD_SOURCE, OVERHEAD_SOURCE_HOOKS
from timelines import req, seg, timeline



def _spin_in_hooks(seconds: float) -> int:
    """Requests that are mostly latprof's code (a root and many segments), for `seconds`."""
    n = 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        runtime.sampler()
        token = runtime.begin_request("GET /spin", runtime.now_ns())
        for _ in range(20):
            runtime.record("q", "db.query", 1, 2, {"k": 1})
        runtime.end_request(token)
        n += 1
    return n


def _overhead_records(path: Path) -> list[QualityRecord]:
    return [q for q in read_captures([path]).quality if q.kind == NOTE_OVERHEAD]


@pytest.mark.slow
@pytest.mark.long
def test_a_recording_process_writes_what_its_writer_and_its_hook_code_cost(tmp_path: Path) -> None:
    path = tmp_path / "capture.jsonl"
    writer = CaptureWriter(path, flush_interval_s=0.1, max_buffered_events=1_000_000)
    runtime.start(writer)
    try:
        t0 = time.perf_counter()
        served = _spin_in_hooks(runtime.OVERHEAD_REPORT_INTERVAL_S + 0.5)  # one periodic record on the way
        spun_ms = (time.perf_counter() - t0) * 1000  # the recording functions' time and the loop's
        time.sleep(0.3)  # the writer encodes what is buffered: its thread's clock moves
        first = runtime.cost()
    finally:
        runtime.stop()  # writes the last record
        writer.close()
    records = _overhead_records(path)
    assert len(records) >= 2  # periodic, then at stop
    last = records[-1].attrs
    assert last[OVERHEAD_SOURCE] == OVERHEAD_SOURCE_HOOKS
    assert last["requests"] == last["recorded_requests"] == served
    assert last["writer_cpu_ms"] >= first["writer_cpu_ms"] > 0  # the flush thread's CPU clock, read from here
    # 22 recording calls per request, about 1 in 16 of them timed.
    assert last["recording_calls"] == pytest.approx(22 * served, rel=0.01)
    assert last["timed_calls"] == pytest.approx(22 * served / runtime.COST_TIMING_STRIDE, rel=0.2)
    # The loop did little but call them: much of its time, scaled up from the timed calls. Not
    # more than it but for the sample's noise: a timed call preempted on a busy machine counts 16 times.
    assert 0.2 * spun_ms < first["hook_ms"] <= 1.5 * spun_ms
    total_ms = last["writer_cpu_ms"] + last["hook_ms"]
    assert last["cpu_percent"] == pytest.approx(100 * total_ms / 1000 / last["wall_s"], rel=0.01)
    assert last["added_ms_per_request"] == pytest.approx(last["hook_ms"] / served, rel=0.01)
    # What the report makes of it.
    overhead = overhead_of(timeline([], quality=records))
    assert overhead == {"cpu_percent": round(last["cpu_percent"], 3), "added_ms_per_request": pytest.approx(last["added_ms_per_request"], abs=1e-4)}


@pytest.mark.slow
def test_the_timed_sample_scales_to_the_calls_made_whichever_calls_they_are(tmp_path: Path) -> None:
    """Requests of four recording calls, one of them dear: the timed 1 in 16 are drawn at random
    gaps, so the estimate does not lock onto one phase (a fixed stride of 16 over requests of 4
    calls would time the same kind of call every time)."""
    writer = CaptureWriter(tmp_path / "capture.jsonl", max_buffered_events=1_000_000)
    runtime.start(writer)
    try:
        dear = {f"k{i}": i for i in range(400)}  # `record` copies its attrs: a dear call
        spent = 0
        for _ in range(20_000):
            token = runtime.begin_request("GET /x", runtime.now_ns())  # cheap, untimed by this test
            t0 = time.perf_counter_ns()
            runtime.record("q", "db.query", 1, 2, dear)
            spent += time.perf_counter_ns() - t0
            runtime.record("q", "db.query", 1, 2)
            runtime.end_request(token)
        estimate = runtime.cost()
    finally:
        runtime.stop()
        writer.close()
    # The record calls alone, timed by the test, are most of what the runtime estimates for all three kinds.
    assert 0.5 * spent / 1e6 < estimate["hook_ms"] < 3.0 * spent / 1e6  # locked onto one phase: about 0.3x


def _spin_us(us: float) -> None:
    end = time.perf_counter_ns() + int(us * 1000)
    while time.perf_counter_ns() < end:
        pass


@pytest.mark.slow
def test_a_stretch_of_hook_code_counts_once_with_the_recording_calls_inside_it(tmp_path: Path) -> None:
    """A hook's own code between `cost_begin` and `cost_end` (an inbound hook's bookkeeping) is
    timed like a recording call; the recording calls it makes are taken out of its time, so the
    estimate is the stretches' time once, not their recording calls twice.

    The collector is off meanwhile: its pauses, long in a process the tests before filled, are in
    the test's own timing but not in the hook code's (a timed call that long is left out)."""
    writer = CaptureWriter(tmp_path / "capture.jsonl", max_buffered_events=1_000_000)
    runtime.start(writer)
    gc.collect()
    gc.disable()
    try:
        dear = {f"k{i}": i for i in range(400)}  # most of a stretch's time is in the recording call
        spent = 0
        for _ in range(20_000):
            t0 = time.perf_counter_ns()
            timing = runtime.cost_begin()
            _spin_us(2)
            token = runtime.begin_request("GET /x", runtime.now_ns())
            runtime.record("q", "db.query", 1, 2, dear)
            runtime.end_request(token)
            runtime.cost_end(timing)
            spent += time.perf_counter_ns() - t0
        estimate = runtime.cost()
    finally:
        gc.enable()
        runtime.stop()
        writer.close()
    assert estimate["recording_calls"] == pytest.approx(4 * 20_000, rel=0.01)  # the stretch and its three recording calls
    # Counted twice, the recording calls inside would make it about 1.8x.
    assert 0.6 * spent / 1e6 < estimate["hook_ms"] < 1.4 * spent / 1e6, (estimate["hook_ms"], spent / 1e6)


def test_a_stretch_whose_end_never_comes_is_given_up_and_timing_goes_on(tmp_path: Path) -> None:
    writer = CaptureWriter(tmp_path / "capture.jsonl")
    runtime.start(writer)
    try:
        while not runtime.cost_begin():  # a timed stretch, never ended (an exception past its end)
            pass
        time.sleep(2 * runtime.MAX_TIMED_NS / 1e9)
        timed = runtime.cost()["timed_calls"]
        for _ in range(2_000):
            runtime.end_request(runtime.begin_request("GET /x", runtime.now_ns()))
        after = runtime.cost()
        stretches = sum(1 for _ in range(2_000) if runtime.cost_begin())  # (ended by the next's start: none ends)
    finally:
        runtime.stop()
        writer.close()
    assert after["timed_calls"] >= timed + 2 * 2_000 / runtime.COST_TIMING_STRIDE / 2
    assert stretches >= 1


@pytest.mark.slow
def test_a_forked_child_accounts_for_itself(tmp_path: Path) -> None:
    import os

    writer = CaptureWriter(tmp_path / "capture.jsonl")
    runtime.start(writer)
    try:
        _spin_in_hooks(0.3)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: nothing of the parent's, and a sampler of its own on its first request
            try:
                cost = runtime.cost()
                fresh = cost["requests"] == 0 and cost["hook_ms"] == 0 and cost["recording_calls"] == 0
                _spin_in_hooks(0.3)
                os.write(w, json.dumps({"fresh": fresh, "requests": runtime.cost()["recorded_requests"]}).encode())
            finally:
                os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        child = json.loads(os.read(r, 4096))
        os.close(r)
    finally:
        runtime.stop()
        writer.close()
    assert child["fresh"] and child["requests"] > 0


# --- the report -----------------------------------------------------------------------------------


def _hooks_record(pid: int, cpu: float, added: float, requests: int) -> QualityRecord:
    return QualityRecord(NOTE_OVERHEAD, 1, pid, "", 1, {OVERHEAD_SOURCE: OVERHEAD_SOURCE_HOOKS, "cpu_percent": cpu,
                                                          "added_ms_per_request": added, "requests": requests})  # fmt: skip


def test_the_report_adds_the_processes_cpu_and_weighs_their_time_per_request() -> None:
    records = [
        _hooks_record(1, 5.0, 0.5, 100),  # superseded by the process's later record
        _hooks_record(1, 1.0, 0.010, 300),
        _hooks_record(2, 2.0, 0.030, 100),
        QualityRecord(NOTE_OVERHEAD, 1, 3, "", 1, {"cpu_percent": 4.0, "machine_cpu_percent": 50.0}),  # attach's sampler
    ]
    parts = overhead_parts(timeline([], quality=records))
    assert parts["hooks"] == {"cpu_percent": 3.0, "added_ms_per_request": pytest.approx((0.010 * 300 + 0.030 * 100) / 400)}
    assert parts["sampler"] == {"cpu_percent": 4.0, "added_ms_per_request": None}
    assert overhead_of(timeline([], quality=records)) == {"cpu_percent": 7.0, "added_ms_per_request": parts["hooks"]["added_ms_per_request"]}
    assert overhead_of(timeline([], quality=[])) == {"cpu_percent": None, "added_ms_per_request": None}


def _text(report: object) -> str:
    out = io.StringIO()
    REPORT.render("text", report, out)  # type: ignore[arg-type]
    return out.getvalue()


def _requests() -> list[Any]:
    return [req(i * 10.0, i * 10.0 + (50 if i % 20 == 0 else 5), seg("db.query", i * 10.0, i * 10.0 + 2)) for i in range(200)]


def test_the_footer_tells_the_sampler_from_the_injected_hooks() -> None:
    from latprof.analysis.requests import analyze
    from latprof.report.model import build_report

    both = [_hooks_record(7, 0.8, 0.012, 1000), QualityRecord(NOTE_OVERHEAD, 1, 3, "", 1, {"cpu_percent": 3.5})]
    report = build_report(analyze(timeline(_requests(), quality=both, source_kind="attach")), [])
    text = " ".join(_text(report).split())
    assert "latprof's sampler used about 3.5% of a CPU core in its own process" in text
    assert "the injected hooks cost the service at least 0.8% of a CPU core, +0.012 ms per request" in text
    assert "latprof cost the service" not in text
    assert report.to_dict()["collection"]["overhead"] == {"cpu_percent": 4.3, "added_ms_per_request": 0.012}
    assert schema_errors(report.to_dict()) == []

    # An attach report built without the parts (latprof/attach/analysis.py) has only the sum to go by.
    summed = " ".join(_text(dataclasses.replace(report, overhead_parts={})).split())
    assert ("latprof cost at least 4.3% of a CPU core (its sampler and the injected hooks together),"
            " the hooks +0.012 ms per request") in summed  # fmt: skip

    hooks_only = build_report(analyze(timeline(_requests(), quality=both[:1])), [])
    text = " ".join(_text(hooks_only).split())
    assert "latprof cost the service at least 0.8% of a CPU core, +0.012 ms per request" in text
    assert "sampler" not in text


@pytest.mark.slow
@pytest.mark.long
def test_a_real_latprof_run_reports_its_cost(tmp_path: Path) -> None:
    # Requests for about 2.5 s, each with segments recorded and a wrapped 1 ms sleep.
    service = textwrap.dedent(
        """
        import time
        from latprof.collectors.hooks import runtime

        assert runtime.active(), "hooks were not loaded"
        until = time.monotonic() + 2.5
        while time.monotonic() < until:
            runtime.sampler()
            token = runtime.begin_request("POST /chat", runtime.now_ns())
            for _ in range(10):
                runtime.record("SELECT", "db.query", runtime.now_ns(), runtime.now_ns())
            time.sleep(0.001)
            runtime.end_request(token)
        """
    )
    capture = tmp_path / "capture.jsonl"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "latprof", "run", "--out", str(capture), "--skip-warmup", "0", *args,
             "--", sys.executable, "-c", service],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )  # fmt: skip

    result = run("--format", "json", "--max-rate", "0")  # every request recorded: the counts must agree
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    overhead = report["collection"]["overhead"]
    assert overhead["cpu_percent"] > 0 and overhead["added_ms_per_request"] > 0, overhead
    assert schema_errors(report) == []
    (record,) = [q for q in read_captures([capture]).quality if q.kind == NOTE_OVERHEAD][-1:]
    assert record.attrs["recorded_requests"] == report["window"]["requests"]  # the last record, at exit: every request
    again = diagnose([capture], warmup_s=0)
    assert again.collection["overhead"] == overhead
    text = " ".join(_text(again).split())
    assert re.search(r"latprof cost the service at least [0-9.]+% of a CPU core, \+[0-9.e-]+ ms per request", text), text
