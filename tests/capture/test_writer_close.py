"""How a capture ends: the closing record, what its absence means to the reader, failed writes
that leave no torn line, a capture path that would block, and the totals left for `latprof run`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest

from latprof.capture.format import HEADER_CLOSES
from latprof.capture.reader import read_captures
from latprof.capture.writer import CaptureWriter
from latprof.events import Gauge
from latprof.semconv import NOTE_CLOSED, NOTE_DROPPED


def lines(path: Path) -> list[dict]:
    return [orjson.loads(raw) for raw in path.read_bytes().splitlines()]


def child(code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh Python (file size limits and signals stay out of pytest's process)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout)


def test_a_clean_close_ends_the_process_part_with_its_totals_and_reads_without_warning(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    writer = CaptureWriter(path, flush_interval_s=60)
    for i in range(5):
        writer.emit(Gauge("g", i, i + 1, os.getpid()))
    writer.flush()
    writer.emit(Gauge("g", 9, 10, os.getpid()))
    writer.close()
    header, *events, closed = lines(path)
    assert header[HEADER_CLOSES] is True
    assert len(events) == 6 and closed["kind"] == NOTE_CLOSED and closed["pid"] == os.getpid()
    assert closed["attrs"] == {"events": 6, "dropped": 0, "errors": 0}
    assert writer.closed_cleanly and writer.written == 6
    data = read_captures([path])
    assert data.unclosed == [] and data.warnings == []


def test_a_writer_that_never_wrote_leaves_no_file() -> None:
    # nothing to close: no header was promised
    path = Path("/nonexistent-dir-latprof") / "never.jsonl"
    writer = CaptureWriter(path, flush_interval_s=60)
    writer.close()
    assert not path.exists() and writer.errors == 0


def test_a_killed_writer_is_named_with_up_to_when_its_events_were_read(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    result = child(f"""
        import os, signal
        from latprof.capture.writer import CaptureWriter
        from latprof.events import Gauge
        w = CaptureWriter({str(path)!r}, flush_interval_s=60)
        w.emit(Gauge("g", 1, 1_764_000_000_000_000_000, os.getpid()))
        w.flush()
        w.emit(Gauge("g", 2, 1_764_000_001_000_000_000, os.getpid()))  # buffered: lost with the process
        print(os.getpid(), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert result.returncode == -signal.SIGKILL
    pid = int(result.stdout)
    data = read_captures([path])
    assert data.unclosed == [(str(path), pid)] and len(data.gauges) == 1
    (warning,) = data.warnings
    assert warning.startswith(f"{path}: pid {pid}: capture ended abruptly")
    assert "events up to 2025-11-24 16:00:00.000 UTC were read (0 requests)" in warning


def test_headers_without_the_promise_expect_nothing_and_each_header_pairs_with_one_close(tmp_path: Path) -> None:
    old, twice = tmp_path / "old.jsonl", tmp_path / "twice.jsonl"
    header = {"type": "header", "schema": "latprof.capture/1", "source": "run", "pid": 7}
    gauge = {"type": "gauge", "name": "g", "value": 1, "ts_ns": 1, "pid": 7}
    closed = {"type": "quality", "kind": NOTE_CLOSED, "ts_ns": 2, "pid": 7, "message": "", "occurrences": 1}
    old.write_bytes(b"\n".join(orjson.dumps(x) for x in (header, gauge)) + b"\n")  # an older writer's capture
    assert read_captures([old]).warnings == []
    promising = {**header, HEADER_CLOSES: True}
    twice.write_bytes(b"\n".join(orjson.dumps(x) for x in (promising, gauge, closed, promising, gauge)) + b"\n")
    data = read_captures([twice])  # the pid's second writer (a second run appending) did not close
    assert data.unclosed == [(str(twice), 7)] and len(data.warnings) == 1


def test_a_batch_that_does_not_fit_is_cut_off_and_counted_when_writes_get_through_again(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    result = child(f"""
        import os, resource
        from latprof.capture.writer import CaptureWriter
        from latprof.events import Gauge
        w = CaptureWriter({str(path)!r}, flush_interval_s=60)
        for i in range(10):
            w.emit(Gauge("g", i, i + 1, os.getpid()))
        w.flush()
        size = os.path.getsize({str(path)!r})
        limits = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 1000, limits[1]))  # room for a part of the next batch
        for i in range(1000):
            w.emit(Gauge("g", i, i + 1, os.getpid()))
        w.flush()
        assert os.path.getsize({str(path)!r}) == size, "the failed batch left a part of itself"
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        w.emit(Gauge("after", 1, 1, os.getpid()))
        w.close()
        print(w.dropped, w.errors, w.written)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1000", "1", "11"]
    data = read_captures([path])  # every line whole: a torn line before later batches would be an error
    assert len(data.gauges) == 11 and data.warnings == []
    assert sum(q.occurrences for q in data.quality if q.kind == NOTE_DROPPED) == 1000
    assert data.unclosed == []


def test_a_fifo_nobody_reads_neither_blocks_the_writer_nor_its_close(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = CaptureWriter(fifo, flush_interval_s=0.05)
    started = time.monotonic()
    for i in range(100):
        writer.emit(Gauge("g", i, i + 1, os.getpid()))
    time.sleep(0.3)  # a few timed flushes
    writer.close()
    assert time.monotonic() - started < 3
    assert writer.dropped == 100 and writer.errors >= 1 and not writer.closed_cleanly
    assert "ENXIO" in writer._last_error or "No such device" in writer._last_error


@pytest.mark.parametrize("writable", [True, False])
def test_close_leaves_the_totals_in_the_status_folder(tmp_path: Path, writable: bool) -> None:
    status_dir = tmp_path / "status"
    status_dir.mkdir()
    path = tmp_path / "c.jsonl"
    if not writable:
        os.mkfifo(path)
    writer = CaptureWriter(path, flush_interval_s=60, status_dir=status_dir)
    writer.emit(Gauge("g", 1, 1, os.getpid()))
    writer.close()
    assert os.listdir(status_dir) == [f"{os.getpid()}.json"]
    status = orjson.loads((status_dir / f"{os.getpid()}.json").read_bytes())
    assert status["pid"] == os.getpid() and status["capture"] == str(path)
    if writable:
        assert (status["events"], status["dropped"], status["errors"], status["closed"]) == (1, 0, 0, True)
    else:
        assert (status["events"], status["dropped"], status["closed"]) == (0, 1, False) and status["errors"] >= 1
        assert status["last_error"].startswith("OSError")


def test_sigterm_with_the_default_disposition_closes_the_capture_before_the_process_dies(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    result = child(f"""
        import os, signal
        from latprof.capture.writer import CaptureWriter, install_flush_on_signals
        from latprof.events import Gauge
        w = CaptureWriter({str(path)!r}, flush_interval_s=60)
        install_flush_on_signals(w)
        w.emit(Gauge("g", 1, 1, os.getpid()))
        os.kill(os.getpid(), signal.SIGTERM)
        import time; time.sleep(5)
    """)
    assert result.returncode == -signal.SIGTERM
    data = read_captures([path])
    assert len(data.gauges) == 1 and [q.kind for q in data.quality] == [NOTE_CLOSED] and data.warnings == []
