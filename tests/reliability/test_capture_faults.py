"""Faults around the capture and `latprof run`: what must still hold when they happen.

A real uvicorn + FastAPI service runs under `latprof run` (every request recorded), driven by
client threads that time every request. Then:

- The service is SIGKILLed mid-capture, under load: every request the client saw completed more
  than `FLUSH_SLACK_S` before the kill is in the capture (the writer flushes every second), and
  the report says that process's capture ended abruptly (its header promised a closing record).
- The capture becomes unwritable mid-run: the service's file size limit is lowered to the
  capture's size (`prlimit`, as a full disk: every write fails, EFBIG), lifted, then lowered
  again until the end. The service keeps serving at the same latency; the capture stays readable
  (no torn line), holds what was written and says what was lost while the writes failed; what
  was lost after the last write that got through is told by `latprof run` on stderr and in the
  report, from the totals each writer leaves beside the capture.
- `--out` that cannot be a capture (/dev/full, a FIFO, a directory): one line, exit 2, before
  the service starts.
- latprof itself gets SIGTERM (it goes on to the service, which stops and closes its capture)
  or SIGKILL (the service gets SIGTERM from the kernel, PR_SET_PDEATHSIG, and stops the same
  way): nothing hangs, the capture is complete and readable.
"""

from __future__ import annotations

import http.client
import json
import os
import resource
import signal
import socket
import stat
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from latprof.capture.reader import CaptureData, read_captures
from latprof.semconv import NOTE_CLOSED, NOTE_DROPPED

pytestmark = [pytest.mark.slow, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.collectors.hooks.apps.app:app"
ROUTE = "GET /chat/{chat_id}"
#: Events older than this when the service dies must be in the capture: the writer's flush
#: interval (1 s) plus what a flush may lag on two loaded cores.
FLUSH_SLACK_S = 1.5
TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Service:
    """`latprof run --max-rate 0 [ARGS] -- uvicorn APP` on a free port; output in files."""

    workdir: Path
    args: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def capture(self) -> Path:
        return self.workdir / "capture.jsonl"

    def start(self) -> Service:
        cmd = [sys.executable, "-m", "latprof", "run", "--out", str(self.capture), "--max-rate", "0", "--skip-warmup", "0",
               *self.args, "--", sys.executable, "-m", "uvicorn", APP, "--host", "127.0.0.1", "--port", str(self.port),
               "--log-level", "warning", "--no-access-log"]  # fmt: skip
        self.stdout = open(self.workdir / "stdout", "wb")
        self.stderr = open(self.workdir / "stderr", "wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.stdout, stderr=self.stderr)
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    conn.close()
                    return self
            except OSError:
                time.sleep(0.1)
        self.kill()
        raise AssertionError(f"the service did not start: {self.output()}")

    @property
    def service_pid(self) -> int:
        """uvicorn's pid: latprof's child."""
        assert self.proc is not None
        (child,) = psutil.Process(self.proc.pid).children()
        return int(child.pid)

    def wait(self) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"latprof run did not end within {TIMEOUT_S} s") from None

    def kill(self) -> None:
        """Kill what this test started, by pid (latprof and its children)."""
        if self.proc is None:
            return
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            children = []
        for process in [*children]:
            try:
                process.kill()
            except psutil.Error:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=TIMEOUT_S)
        self.stdout.close()
        self.stderr.close()

    def output(self) -> str:
        for stream in (self.stdout, self.stderr):
            if not stream.closed:
                stream.flush()
        return (self.workdir / "stdout").read_text(errors="replace")[-3000:] + (self.workdir / "stderr").read_text(
            errors="replace"
        )[-3000:]

    def report(self) -> dict[str, Any]:
        text = (self.workdir / "stdout").read_text()
        return json.loads(text[text.index("{") :])  # type: ignore[no-any-return]


class Load:
    """Client threads sending GET /chat/N?ms=2 one after the other, each on its own kept-alive
    connection; every completed request's (sent, done) wall-clock ns."""

    def __init__(self, port: int, clients: int = 2) -> None:
        self.port = port
        self.done: list[tuple[int, int]] = []
        self.failed = 0
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]
        for thread in self._threads:
            thread.start()

    def _client(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        n = 0
        while not self._stop.is_set():
            if self._paused.is_set():
                time.sleep(0.01)
                continue
            n += 1
            sent = time.time_ns()
            try:
                conn.request("GET", f"/chat/{n}?ms=2")
                response = conn.getresponse()
                response.read()
                assert response.status == 200
            except Exception:
                self.failed += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                time.sleep(0.05)
                continue
            self.done.append((sent, time.time_ns()))
        conn.close()

    def pause(self) -> None:
        self._paused.set()
        time.sleep(0.05)  # a request in flight completes

    def resume(self) -> None:
        self._paused.clear()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def between(self, start_ns: int, end_ns: int) -> list[tuple[int, int]]:
        return [(s, d) for s, d in self.done if start_ns <= s and d <= end_ns]


def chat_requests(data: CaptureData) -> list[Any]:
    return [r for r in data.requests if r.route == ROUTE]


def latency_ms(requests: list[tuple[int, int]]) -> tuple[float, float]:
    """(median, p99) client-side latency in ms."""
    values = sorted((d - s) / 1e6 for s, d in requests)
    return statistics.median(values), values[min(len(values) - 1, int(len(values) * 0.99))]


def test_the_service_sigkilled_under_load_leaves_every_event_older_than_a_flush_and_the_report_says_so(tmp_path: Path) -> None:
    service = Service(tmp_path, ("--format", "json")).start()
    load: Load | None = None
    try:
        pid = service.service_pid
        load = Load(service.port)
        time.sleep(4)
        killed_ns = time.time_ns()
        os.kill(pid, signal.SIGKILL)
        code = service.wait()
    finally:
        if load is not None:
            load.stop()
        service.kill()
    assert code == 128 + signal.SIGKILL, service.output()

    data = read_captures([service.capture])
    cutoff_ns = killed_ns - int(FLUSH_SLACK_S * 1e9)
    seen = load.between(0, cutoff_ns)
    recorded = [r for r in chat_requests(data) if r.pid == pid]
    assert len(seen) > 100  # the load was real
    # The server ends a request before its client sees the response: every one the client saw
    # before the cutoff ended before it too (the ids are the counts: requests are not labelled).
    assert len([r for r in recorded if r.end_ns <= cutoff_ns]) >= len(seen)
    newest_ms = (killed_ns - max(r.end_ns for r in recorded)) / 1e6
    assert newest_ms < FLUSH_SLACK_S * 1000
    assert not any(q.kind == NOTE_CLOSED and q.pid == pid for q in data.quality)
    assert data.unclosed == [(str(service.capture), pid)]

    report = service.report()
    (warning,) = [w for w in report["collection"]["warnings"] if "ended abruptly" in w]
    assert f"pid {pid}:" in warning and "SIGKILL" in warning and "were read" in warning
    print(f"\nSIGKILL: {len(seen)} requests completed before kill-{FLUSH_SLACK_S}s, all in the capture;"
          f" newest recorded request ended {newest_ms:.0f} ms before the kill;"
          f" {len(load.done)} completed in all, {len(recorded)} recorded")  # fmt: skip


def test_an_unwritable_capture_mid_run_costs_the_service_no_latency_and_latprof_says_what_was_lost(tmp_path: Path) -> None:
    service = Service(tmp_path, ("--format", "json")).start()
    load: Load | None = None
    phases: dict[str, tuple[int, int]] = {}
    try:
        pid = service.service_pid
        load = Load(service.port)
        unlimited = resource.prlimit(pid, resource.RLIMIT_FSIZE)

        def phase(name: str, seconds: float) -> None:
            assert load is not None
            load.resume()
            start = time.time_ns()
            time.sleep(seconds)
            load.pause()
            phases[name] = (start, time.time_ns())
            time.sleep(FLUSH_SLACK_S)  # what the phase recorded meets the writer's next flush

        def full() -> None:
            # as a full disk: no write may make the capture any longer
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (service.capture.stat().st_size, unlimited[1]))

        phase("before", 3)
        full()
        phase("failing", 3)
        resource.prlimit(pid, resource.RLIMIT_FSIZE, unlimited)
        phase("after", 3)
        full()
        phase("failing at the end", 2)
        os.kill(service.proc.pid, signal.SIGTERM)  # type: ignore[union-attr]
        code = service.wait()
    finally:
        if load is not None:
            load.stop()
        service.kill()
    assert code == 128 + signal.SIGTERM, service.output()
    assert load.failed == 0

    # the service served as fast while every write failed as while they got through (each side
    # pooled from two phases, so a burst of load from elsewhere on the machine weighs less)
    figures = {name: latency_ms(load.between(*span)) for name, span in phases.items()}
    writing = latency_ms([r for name in ("before", "after") for r in load.between(*phases[name])])
    failing = latency_ms([r for name in ("failing", "failing at the end") for r in load.between(*phases[name])])
    assert failing[0] < writing[0] * 1.3 + 0.5, figures
    assert failing[1] < writing[1] * 2 + 5.0, figures

    # the capture: readable, what was written is there, what was not is counted
    data = read_captures([service.capture])
    recorded = [r for r in chat_requests(data) if r.pid == pid]
    for name in ("before", "after"):
        sent = load.between(*phases[name])
        inside = [r for r in recorded if phases[name][0] <= r.start_ns and r.end_ns <= phases[name][1]]
        assert len(inside) >= len(sent) - 2 > 100, name  # the first and last may straddle the phase's edges
    for name in ("failing", "failing at the end"):
        start, end = phases[name]
        assert not [r for r in recorded if start < r.start_ns < end], name
    dropped = sum(q.occurrences for q in data.quality if q.kind == NOTE_DROPPED and q.pid == pid)
    assert dropped >= len(load.between(*phases["failing"]))  # at least each request root lost
    assert data.unclosed == [(str(service.capture), pid)]  # its closing record could not be written

    # what the capture cannot say, latprof run says: on stderr and in the report
    stderr = (tmp_path / "stderr").read_text()
    (line,) = [x for x in stderr.splitlines() if x.startswith(f"latprof: pid {pid}: could not write to ")]
    lost = int(line.split(": ")[-1].split(" events lost")[0].rsplit(" ", 1)[-1])
    assert lost >= dropped + len(load.between(*phases["failing at the end"]))
    assert "File too large" in line
    assert line.removeprefix("latprof: ") in service.report()["collection"]["warnings"]
    print("\nunwritable capture, client latency median/p99 ms: "
          + "; ".join(f"{name} {m:.2f}/{p:.2f}" for name, (m, p) in figures.items())
          + f"; writes getting through {writing[0]:.2f}/{writing[1]:.2f}, failing {failing[0]:.2f}/{failing[1]:.2f}"
          + f"; lost while failing: {dropped} events in the capture's drop records, {lost} in all (latprof run)")  # fmt: skip


@pytest.mark.parametrize("kind", ["/dev/full", "fifo", "directory"])
def test_an_out_that_cannot_hold_a_capture_is_refused_before_the_service_starts(tmp_path: Path, kind: str) -> None:
    if kind == "fifo":
        out = tmp_path / "fifo"
        os.mkfifo(out)
    elif kind == "directory":
        out = tmp_path / "dir"
        out.mkdir()
    else:
        out = Path(kind)
    marker = tmp_path / "started"
    result = subprocess.run(
        [sys.executable, "-m", "latprof", "run", "--out", str(out), "--", sys.executable, "-c",
         f"open({str(marker)!r}, 'w')"],
        capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    if kind == "directory":  # click's own check of the option
        assert "is a directory" in result.stderr.splitlines()[-1]
    else:
        assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"latprof: error: --out {out}: ")
    assert not marker.exists()  # the service never started
    if kind == "fifo":
        assert stat.S_ISFIFO(out.stat().st_mode)


def test_sigterm_to_latprof_stops_the_service_which_closes_its_capture(tmp_path: Path) -> None:
    service = Service(tmp_path, ("--format", "json")).start()
    load: Load | None = None
    try:
        pid = service.service_pid
        load = Load(service.port)
        time.sleep(2)
        os.kill(service.proc.pid, signal.SIGTERM)  # type: ignore[union-attr]
        started = time.monotonic()
        code = service.wait()
        stopped_s = time.monotonic() - started
    finally:
        if load is not None:
            load.stop()
        service.kill()
    assert code == 128 + signal.SIGTERM or code == 0, service.output()  # uvicorn exits 0 on SIGTERM
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    data = read_captures([service.capture])
    assert data.unclosed == []
    assert [q.pid for q in data.quality if q.kind == NOTE_CLOSED] == [pid]
    assert len([r for r in chat_requests(data)]) >= len(load.done) - 2  # in flight at the stop: maybe cut
    assert not [w for w in service.report()["collection"]["warnings"] if "ended abruptly" in w]
    print(f"\nSIGTERM to latprof: ended in {stopped_s:.2f} s, {len(load.done)} requests, capture closed")


def test_sigkill_to_latprof_stops_the_service_with_sigterm_and_its_capture_is_complete(tmp_path: Path) -> None:
    service = Service(tmp_path, ("--no-report",)).start()
    load: Load | None = None
    try:
        pid = service.service_pid
        load = Load(service.port)
        time.sleep(2)
        killed = time.monotonic()
        service.proc.kill()  # type: ignore[union-attr]  # SIGKILL: latprof forwards nothing
        service.wait()
        while time.monotonic() - killed < TIMEOUT_S:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the service was still running {TIMEOUT_S} s after latprof was killed")
        gone_s = time.monotonic() - killed
    finally:
        if load is not None:
            load.stop()
        service.kill()
        try:  # only when the test failed: the orphaned service is ours (checked by its command line)
            orphan = psutil.Process(pid)
            if APP in orphan.cmdline() and orphan.status() != psutil.STATUS_ZOMBIE:
                orphan.kill()
        except (psutil.Error, UnboundLocalError):
            pass
    data = read_captures([service.capture])
    assert data.unclosed == [] and [q.pid for q in data.quality if q.kind == NOTE_CLOSED] == [pid]
    assert len(chat_requests(data)) >= len(load.done) - 2
    print(f"\nSIGKILL to latprof: the service stopped {gone_s:.2f} s later, capture closed, {len(load.done)} requests")
