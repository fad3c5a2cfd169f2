"""The writer and the reader together: several processes write one capture, `analyze` reads it whole."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from latprof.analysis.requests import analyze
from latprof.capture.reader import read_captures
from latprof.analysis.timeline import build_timeline

WRITER = textwrap.dedent(
    """
    import os, sys, time
    from latprof.capture.writer import CaptureWriter
    from latprof.events import Request, Segment

    path, n = sys.argv[1], int(sys.argv[2])
    writer = CaptureWriter(path, flush_interval_s=0.02)
    pid = os.getpid()
    t0 = 1_764_000_000_000_000_000
    for i in range(n):
        rid = f"{pid}-{i}"
        start = t0 + i * 10_000_000
        writer.emit(Segment(rid, "q", None, "SELECT 1", "db.query", start + 1_000_000, start + 3_000_000, pid))
        writer.emit(Segment(rid, "p", None, "chat m", "provider", start + 3_000_000, start + 8_000_000, pid))
        writer.emit(Request(rid, "POST /chat", start, start + 9_000_000, pid, 500_000, 200))
        if i % 50 == 0:
            time.sleep(0.01)  # let batches from the processes interleave
    # no close(): the atexit flush must deliver the rest
    """
)


@pytest.mark.slow
def test_processes_writing_one_capture_are_read_back_whole(tmp_path):
    path = tmp_path / "capture.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), "400"]) for _ in range(3)]
    try:
        for proc in procs:
            assert proc.wait(timeout=60) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    data = read_captures([path])
    assert data.warnings == []
    assert len(data.headers) == 3
    timeline = build_timeline(data)
    assert len(timeline.requests) == 1200
    assert timeline.orphan_segments == 0
    assert all(len(rt.segments) == 2 for rt in timeline.requests)
    analysis = analyze(timeline, warmup_s=0)
    assert analysis.layer("provider").mean_ms == pytest.approx(5.0)
    assert analysis.layer("db.query").mean_ms == pytest.approx(2.0)
    assert analysis.layer("app").mean_ms == pytest.approx(0.5)
    assert analysis.layer("unattributed").mean_ms == pytest.approx(1.5)
