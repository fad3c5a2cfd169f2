"""Tests of the capture writer with real files, threads, processes, forks and signals."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import orjson
import pytest

from latprof.capture.format import SCHEMA, decode
from latprof.capture.writer import THREAD_NAME, CaptureWriter, install_flush_on_signals
from latprof.events import Event, Frame, Gauge, QualityRecord, Request, Segment, StackSample
from latprof.semconv import NOTE_CLOSED, NOTE_DROPPED, NOTE_ERROR

#: Upper bound of every wait in this file; a passing run waits far less.
DEADLINE_S = 10.0


# --- helpers -----------------------------------------------------------------------------------


def read_capture(path: Path) -> tuple[list[dict[str, Any]], list[Event]]:
    """Headers and decoded events of a capture; fails on any line that does not parse."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), "the last line is torn"
    headers: list[dict[str, Any]] = []
    events: list[Event] = []
    for raw in data.split(b"\n")[:-1]:
        line = orjson.loads(raw)
        if line["type"] == "header":
            headers.append(line)
        elif line.get("kind") != NOTE_CLOSED:  # the closing record has tests of its own
            events.append(decode(line))
    return headers, events


def quality(events: list[Event], kind: str) -> list[QualityRecord]:
    return [e for e in events if isinstance(e, QualityRecord) and e.kind == kind]


def wait_until(predicate: Callable[[], bool], timeout_s: float = DEADLINE_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def file_contains(path: Path, needle: bytes) -> Callable[[], bool]:
    return lambda: path.exists() and needle in path.read_bytes()


def writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


@pytest.fixture
def new_writer(tmp_path: Path) -> Iterator[Callable[..., CaptureWriter]]:
    """Make writers (on tmp_path/capture.jsonl by default) that are closed after the test."""
    made: list[CaptureWriter] = []

    def make(path: Path | None = None, **options: Any) -> CaptureWriter:
        writer = CaptureWriter(path or tmp_path / "capture.jsonl", **options)
        made.append(writer)
        return writer

    yield make
    for writer in made:
        writer.close()


@contextmanager
def started(script: str, *args: object) -> Iterator[subprocess.Popen[bytes]]:
    """Run `script` in a fresh interpreter; it is killed by its PID if still running at the end."""
    # os.fork() in a process with threads warns on Python >= 3.12: that is the point of some scripts.
    command = [sys.executable, "-W", "ignore::DeprecationWarning", "-c", textwrap.dedent(script)]
    with subprocess.Popen([*command, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=DEADLINE_S)


def finish(proc: subprocess.Popen[bytes]) -> tuple[int, str, str]:
    """Wait (bounded) for a started process; return its exit status and output."""
    out, err = proc.communicate(timeout=DEADLINE_S)
    return proc.returncode, out.decode(), err.decode()


def wait_for_output(proc: subprocess.Popen[bytes], marker: bytes) -> None:
    """Read the process's stdout until `marker` appears (bounded)."""
    assert proc.stdout is not None
    fd, seen, deadline = proc.stdout.fileno(), b"", time.monotonic() + DEADLINE_S
    while marker not in seen:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {marker!r} from the process; got {seen!r}"
        if select.select([fd], [], [], remaining)[0]:
            chunk = os.read(fd, 4096)
            assert chunk, f"the process exited before {marker!r} (status {proc.wait(DEADLINE_S)})"
            seen += chunk


def one_of_each(pid: int) -> list[Event]:
    return [
        Request("r1", "POST /chat", 1_000, 9_000, pid, cpu_ns=500, status_code=200, attrs={"http.route": "/chat"}),
        Request("r2", "GET /health", 2_000, 2_500, pid),
        Segment("r1", "s1", None, "pool wait", "db.pool", 1_100, 4_000, pid, {"db.client.connection.pool.name": "p"}),
        Segment("r1", "s2", "s1", "agent", None, 4_000, 8_000, pid),
        Gauge("db.pool.in_use", 9.0, 3_000, pid, {"pool": "main"}),
        Gauge("event_loop.lag_ms", 0.25, 3_100, pid),
        StackSample(3_200, pid, 77, "MainThread", (Frame("f", "a.py", 3), Frame("g", "b.py")), True, "futex_wait", 4),
        StackSample(3_300, pid, 78, "worker", (), False),
        QualityRecord("hooks_loaded", 100, pid, "hooks loaded", 1, {"hooks": ["sqlalchemy"]}),
    ]


# --- in one process ----------------------------------------------------------------------------


def test_round_trip_every_event_type(tmp_path: Path, new_writer: Callable[..., CaptureWriter]) -> None:
    writer = new_writer(flush_interval_s=60, header_extra={"command": ["uvicorn", "app:app"]})
    sent = one_of_each(os.getpid())
    for event in sent:
        writer.emit(event)
    writer.flush()

    headers, events = read_capture(tmp_path / "capture.jsonl")
    first = orjson.loads((tmp_path / "capture.jsonl").read_bytes().split(b"\n")[0])
    assert first["type"] == "header"
    assert first["schema"] == SCHEMA == "latprof.capture/1"
    assert first["pid"] == os.getpid() and first["source"] == "run"
    assert first["command"] == ["uvicorn", "app:app"]
    assert len(headers) == 1
    assert events == sent
    assert writer.dropped == 0 and writer.errors == 0


def test_a_second_flush_writes_no_second_header(tmp_path: Path, new_writer: Callable[..., CaptureWriter]) -> None:
    writer = new_writer(flush_interval_s=60)
    writer.flush()  # nothing buffered: nothing written, not even a header
    assert not (tmp_path / "capture.jsonl").exists()
    writer.emit(Gauge("a", 1, 1, os.getpid()))
    writer.flush()
    writer.emit(Gauge("b", 2, 2, os.getpid()))
    writer.flush()
    headers, events = read_capture(tmp_path / "capture.jsonl")
    assert len(headers) == 1
    assert [e.name for e in events if isinstance(e, Gauge)] == ["a", "b"]


@pytest.mark.slow
def test_timer_flushes_without_a_flush_call(tmp_path: Path, new_writer: Callable[..., CaptureWriter]) -> None:
    writer = new_writer(flush_interval_s=0.1)
    started_at = time.monotonic()
    writer.emit(Gauge("tick", 1, time.time_ns(), os.getpid()))

    assert wait_until(file_contains(tmp_path / "capture.jsonl", b'"tick"'), timeout_s=2.0)
    assert time.monotonic() - started_at < 1.0
    assert len(writer_threads()) >= 1
    assert all(t.daemon for t in writer_threads())


def test_bounded_buffer_drops_and_records_it(tmp_path: Path, new_writer: Callable[..., CaptureWriter]) -> None:
    writer = new_writer(flush_interval_s=60, max_buffered_events=10)
    for i in range(25):
        writer.emit(Gauge("g", i, i, os.getpid()))
    assert writer.dropped == 15
    writer.flush()

    _, events = read_capture(tmp_path / "capture.jsonl")
    assert [e.value for e in events if isinstance(e, Gauge)] == list(range(10))
    (note,) = quality(events, NOTE_DROPPED)
    assert note.occurrences == 15 and note.pid == os.getpid() and "dropped 15 events" in note.message

    # The buffer has room again, and the drops are not reported twice.
    writer.emit(Gauge("g", 99, 99, os.getpid()))
    writer.flush()
    _, events = read_capture(tmp_path / "capture.jsonl")
    assert len(quality(events, NOTE_DROPPED)) == 1
    assert events[-1] == Gauge("g", 99, 99, os.getpid())
    assert writer.dropped == 15


def test_concurrent_emitters_keep_or_count_every_event(
    tmp_path: Path, new_writer: Callable[..., CaptureWriter]
) -> None:
    writer = new_writer(flush_interval_s=60, max_buffered_events=5_000)
    n_threads, per_thread = 8, 1_000

    def emit_many(thread_no: int) -> None:
        for i in range(per_thread):
            writer.emit(Gauge(f"t{thread_no}", i, i, os.getpid()))

    threads = [threading.Thread(target=emit_many, args=(n,)) for n in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE_S)
    writer.flush()

    _, events = read_capture(tmp_path / "capture.jsonl")
    kept = [e for e in events if isinstance(e, Gauge)]
    # Each concurrent emitter may overshoot the bound by one event, never more.
    assert 5_000 <= len(kept) <= 5_000 + n_threads
    assert len(kept) + writer.dropped == n_threads * per_thread
    assert len({(e.name, e.value) for e in kept}) == len(kept)
    (note,) = quality(events, NOTE_DROPPED)
    assert note.occurrences == writer.dropped


def test_unencodable_event_is_counted_not_raised(tmp_path: Path, new_writer: Callable[..., CaptureWriter]) -> None:
    writer = new_writer(flush_interval_s=60)
    pid = os.getpid()
    writer.emit(Gauge("before", 1, 1, pid))
    writer.emit(Gauge("bad", 2, 2, pid, {"obj": object()}))
    writer.emit(Gauge("after", 3, 3, pid))
    writer.flush()
    assert writer.errors == 1

    _, events = read_capture(tmp_path / "capture.jsonl")
    assert [e.name for e in events if isinstance(e, Gauge)] == ["before", "after"]
    (note,) = quality(events, NOTE_ERROR)
    assert note.occurrences == 1 and note.pid == pid
    assert "TypeError" in note.attrs["latprof.last_error"]


def test_something_that_is_not_an_event_is_counted_not_raised(
    tmp_path: Path, new_writer: Callable[..., CaptureWriter]
) -> None:
    writer = new_writer(flush_interval_s=60)
    writer.emit("not an event")  # type: ignore[arg-type]
    writer.emit(None)  # type: ignore[arg-type]
    writer.emit(Gauge("ok", 1, 1, os.getpid()))
    writer.flush()
    assert writer.errors == 2
    _, events = read_capture(tmp_path / "capture.jsonl")
    assert [e.name for e in events if isinstance(e, Gauge)] == ["ok"]
    assert quality(events, NOTE_ERROR)[0].occurrences == 2


def test_header_extra_json_cannot_hold_falls_back_to_a_plain_header(
    tmp_path: Path, new_writer: Callable[..., CaptureWriter]
) -> None:
    writer = new_writer(flush_interval_s=60, header_extra={"bad": object()})
    writer.emit(Gauge("ok", 1, 1, os.getpid()))
    writer.flush()
    (header,), events = read_capture(tmp_path / "capture.jsonl")
    assert header["pid"] == os.getpid() and "bad" not in header
    assert writer.errors == 1 and quality(events, NOTE_ERROR)[0].occurrences == 1


def test_unwritable_path_is_counted_not_raised_and_reported_once_writable(
    tmp_path: Path, new_writer: Callable[..., CaptureWriter]
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # tests run as root: a regular file is what makes the path unusable
    path = blocker / "capture.jsonl"
    writer = new_writer(path, flush_interval_s=60)
    writer.emit(Gauge("lost", 1, 1, os.getpid()))
    writer.flush()
    assert (writer.errors, writer.dropped) == (1, 1)

    blocker.unlink()
    blocker.mkdir()
    writer.emit(Gauge("kept", 2, 2, os.getpid()))
    writer.flush()
    _, events = read_capture(path)
    assert [e.name for e in events if isinstance(e, Gauge)] == ["kept"]
    assert quality(events, NOTE_DROPPED)[0].occurrences == 1
    (error,) = quality(events, NOTE_ERROR)
    assert error.occurrences == 1 and "File exists" in error.attrs["latprof.last_error"]


def test_failing_writes_are_counted_not_raised(new_writer: Callable[..., CaptureWriter]) -> None:
    writer = new_writer(Path("/dev/full"), flush_interval_s=60)  # every write() fails with ENOSPC
    for i in range(3):
        writer.emit(Gauge("lost", i, i, os.getpid()))
    writer.flush()
    writer.close()
    assert writer.errors >= 1 and writer.dropped == 3


def test_parent_directories_are_created(tmp_path: Path, new_writer: Callable[..., CaptureWriter]) -> None:
    path = tmp_path / "deep" / "er" / "capture.jsonl"
    writer = new_writer(path, flush_interval_s=60)
    writer.emit(Gauge("g", 1, 1, os.getpid()))
    writer.close()
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644 & ~umask
    assert len(read_capture(path)[1]) == 1


def test_close_flushes_is_idempotent_and_drops_later_events(
    tmp_path: Path, new_writer: Callable[..., CaptureWriter]
) -> None:
    writer = new_writer(flush_interval_s=60)
    for i in range(3):
        writer.emit(Gauge("g", i, i, os.getpid()))
    assert writer_threads()
    writer.close()
    assert not writer_threads()  # the flush thread stopped, woken at once despite the 60 s interval
    writer.close()
    writer.emit(Gauge("late", 9, 9, os.getpid()))
    writer.flush()
    writer.close()
    assert writer.dropped == 1 and writer.errors == 0

    _, events = read_capture(tmp_path / "capture.jsonl")
    assert [e.name for e in events if isinstance(e, Gauge)] == ["g", "g", "g"]


class _SlowToEncode(Mapping[str, int]):
    """Attrs whose encoding blocks the flush thread until `release` is set."""

    def __init__(self, encoding: threading.Event, release: threading.Event) -> None:
        self.encoding, self.release = encoding, release

    def __getitem__(self, key: str) -> int:
        self.encoding.set()
        self.release.wait(DEADLINE_S)
        return 1

    def __iter__(self) -> Iterator[str]:
        return iter(["k"])

    def __len__(self) -> int:
        return 1


@pytest.mark.slow
def test_close_during_a_timer_flush_writes_what_came_after_its_batch(
    tmp_path: Path, new_writer: Callable[..., CaptureWriter]
) -> None:
    writer = new_writer(flush_interval_s=0.01)
    encoding, release = threading.Event(), threading.Event()
    writer.emit(Gauge("slow", 0, 0, os.getpid(), _SlowToEncode(encoding, release)))
    assert encoding.wait(DEADLINE_S)  # the flush thread has taken its batch and is encoding it
    for i in range(1, 4):
        writer.emit(Gauge("later", i, i, os.getpid()))
    releaser = threading.Timer(0.05, release.set)  # lets the batch finish while close() waits
    releaser.start()
    try:
        writer.close()
    finally:
        release.set()
        releaser.join(DEADLINE_S)

    assert writer.dropped == 0 and writer.errors == 0
    _, events = read_capture(tmp_path / "capture.jsonl")
    gauges = [(e.name, e.value) for e in events if isinstance(e, Gauge)]
    assert gauges == [("slow", 0), ("later", 1), ("later", 2), ("later", 3)]


def test_bad_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        CaptureWriter(tmp_path / "c.jsonl", flush_interval_s=0)
    with pytest.raises(ValueError):
        CaptureWriter(tmp_path / "c.jsonl", max_buffered_events=0)


def test_install_outside_the_main_thread_does_nothing(new_writer: Callable[..., CaptureWriter]) -> None:
    writer = new_writer(flush_interval_s=60)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    failures: list[BaseException] = []

    def install() -> None:
        try:
            install_flush_on_signals(writer)
        except BaseException as exc:  # pragma: no cover - the assertion below reports it
            failures.append(exc)

    thread = threading.Thread(target=install)
    thread.start()
    thread.join(DEADLINE_S)
    assert failures == []
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


# --- several processes on one file -------------------------------------------------------------

EMIT_FROM_TWO_THREADS = """
import os, threading, time
from latprof.events import Segment

PAD = "x" * 300  # long lines, so a torn line could not go unnoticed

def emit_from_threads(writer, label, per_thread):
    pid = os.getpid()

    def work(thread_no):
        for i in range(per_thread):
            rid = f"{pid}-{label}{thread_no}-{i}"
            writer.emit(Segment(rid, "s", None, "query", "db.query", i, i + 1, pid, {"pad": PAD}))
            if i % 100 == 99:
                time.sleep(0.001)  # spread the emission over many flushes

    threads = [threading.Thread(target=work, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
"""

SUBPROCESS_WRITER = (
    EMIT_FROM_TWO_THREADS
    + """
import sys
from latprof.capture.writer import CaptureWriter

path, go, per_thread = sys.argv[1], sys.argv[2], int(sys.argv[3])
writer = CaptureWriter(path, flush_interval_s=0.001)
print("ready", flush=True)
deadline = time.monotonic() + 10
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.001)
emit_from_threads(writer, "t", per_thread)
writer.close()
"""
)

FORKING_MASTER = (
    EMIT_FROM_TWO_THREADS
    + """
import json, multiprocessing, sys
from latprof.capture.writer import CaptureWriter

path, per_thread = sys.argv[1], int(sys.argv[2])
writer = CaptureWriter(path, flush_interval_s=0.001)
master = os.getpid()
# Like gunicorn --preload: the master emits (its flush thread runs) before it forks workers.
for i in range(100):
    writer.emit(Segment(f"{master}-m-{i}", "s", None, "query", "db.query", i, i + 1, master))


def worker():
    emit_from_threads(writer, "t", per_thread)
    writer.close()  # multiprocessing children leave with os._exit: no atexit


workers = [multiprocessing.get_context("fork").Process(target=worker) for _ in range(4)]
for w in workers:
    w.start()
for w in workers:
    w.join(10)
    if w.is_alive():
        w.kill()
        w.join(10)
writer.close()
print(json.dumps({"master": master, "workers": [w.pid for w in workers], "exitcodes": [w.exitcode for w in workers]}))
"""
)


def check_many_writers(path: Path, expected_ids: set[str]) -> None:
    """Every line whole, one header per pid before its events, every event once with its pid."""
    data = path.read_bytes()
    assert data.endswith(b"\n")
    lines = [orjson.loads(raw) for raw in data.split(b"\n")[:-1]]  # raises on a torn line
    expected_pids = {int(rid.split("-")[0]) for rid in expected_ids}

    header_at: dict[int, int] = {}
    closed_at: dict[int, int] = {}
    seen: list[str] = []
    for index, line in enumerate(lines):
        if line["type"] == "header":
            assert line["pid"] not in header_at, f"second header for pid {line['pid']}"
            header_at[line["pid"]] = index
            continue
        event = decode(line)
        if isinstance(event, QualityRecord) and event.kind == NOTE_CLOSED:  # each process's last line, with its total
            assert event.pid not in closed_at, f"second closing record for pid {event.pid}"
            closed_at[event.pid] = index
            assert event.attrs["events"] == sum(1 for rid in seen if int(rid.split("-")[0]) == event.pid)
            continue
        assert isinstance(event, Segment), event
        assert event.pid == int(event.request_id.split("-")[0])
        assert header_at.get(event.pid, index) < index, f"event of pid {event.pid} before its header"
        assert event.pid not in closed_at, f"event of pid {event.pid} after its closing record"
        seen.append(event.request_id)
    assert set(header_at) == set(closed_at) == expected_pids
    assert len(seen) == len(expected_ids) and set(seen) == expected_ids


def thread_ids(pid: int, per_thread: int) -> set[str]:
    return {f"{pid}-t{thread_no}-{i}" for thread_no in range(2) for i in range(per_thread)}


@pytest.mark.slow
def test_separate_processes_append_whole_lines_to_one_file(tmp_path: Path) -> None:
    path, go, per_thread = tmp_path / "capture.jsonl", tmp_path / "go", 2_500
    with ExitStack() as stack:
        procs = [stack.enter_context(started(SUBPROCESS_WRITER, path, go, per_thread)) for _ in range(4)]
        for proc in procs:
            wait_for_output(proc, b"ready")
        go.touch()  # all four emit at the same time
        for proc in procs:
            status, _, err = finish(proc)
            assert status == 0, err

    check_many_writers(path, set().union(*(thread_ids(proc.pid, per_thread) for proc in procs)))


@pytest.mark.slow
def test_forked_workers_append_whole_lines_to_one_file(tmp_path: Path) -> None:
    path, per_thread = tmp_path / "capture.jsonl", 2_500
    with started(FORKING_MASTER, path, per_thread) as proc:
        status, out, err = finish(proc)
    assert status == 0, err
    report = json.loads(out)
    assert report["exitcodes"] == [0, 0, 0, 0]

    master = report["master"]
    expected = {f"{master}-m-{i}" for i in range(100)}
    for pid in report["workers"]:
        expected |= thread_ids(pid, per_thread)
    check_many_writers(path, expected)


# --- fork --------------------------------------------------------------------------------------

FORK = """
import json, os, sys, threading, time
from latprof.capture.writer import THREAD_NAME, CaptureWriter
from latprof.events import Gauge

path, timer_path, report_path = sys.argv[1:4]
parent = os.getpid()
writer = CaptureWriter(path, flush_interval_s=60, max_buffered_events=5)
for i in range(8):
    writer.emit(Gauge("pre", i, time.time_ns(), parent))  # 5 buffered (not flushed for 60 s), 3 dropped
timer = CaptureWriter(timer_path, flush_interval_s=0.05)
timer.emit(Gauge("timer-pre", 0, time.time_ns(), parent))


def names():
    return [t.name for t in threading.enumerate() if t.is_alive()]


pid = os.fork()
if pid == 0:
    status = 1
    try:
        me = os.getpid()
        report = {"dropped": writer.dropped, "errors": writer.errors, "threads_before": names()}
        for i in range(4):
            writer.emit(Gauge("child", i, time.time_ns(), me))
        report["threads_after"] = names()
        writer.flush()
        # Not flushed by hand: the child's own (restarted) timer thread must write it.
        timer.emit(Gauge("timer-child", 0, time.time_ns(), me))
        deadline = time.monotonic() + 5
        found = False
        while not found and time.monotonic() < deadline:
            time.sleep(0.01)
            found = os.path.exists(timer_path) and b"timer-child" in open(timer_path, "rb").read()
        report["timer_flushed"] = found
        with open(report_path, "w") as f:
            json.dump(report, f)
        status = 0
    except BaseException as exc:
        os.write(2, f"child failed: {exc!r}\\n".encode())
    finally:
        os._exit(status)

_, wait_status = os.waitpid(pid, 0)
writer.flush()  # the 5 pre-fork events, still buffered, make room for one more
writer.emit(Gauge("post", 0, time.time_ns(), parent))
writer.close()
timer.close()
print(json.dumps({"parent": parent, "child": pid, "child_exit": os.waitstatus_to_exitcode(wait_status)}))
"""


@pytest.mark.slow
def test_fork_child_starts_afresh_and_parent_keeps_its_buffer(tmp_path: Path) -> None:
    path, timer_path, report_path = tmp_path / "c.jsonl", tmp_path / "timer.jsonl", tmp_path / "child.json"
    with started(FORK, path, timer_path, report_path) as proc:
        status, out, err = finish(proc)
    assert status == 0, err
    pids = json.loads(out)
    parent, child = pids["parent"], pids["child"]
    assert pids["child_exit"] == 0, err

    child_report = json.loads(report_path.read_text())
    assert child_report["dropped"] == 0 and child_report["errors"] == 0  # counters zeroed
    assert THREAD_NAME not in child_report["threads_before"]  # the thread did not survive fork
    assert THREAD_NAME in child_report["threads_after"]  # and restarted on the child's first emit
    assert child_report["timer_flushed"]

    headers, events = read_capture(path)
    assert sorted(h["pid"] for h in headers) == sorted([parent, child])
    assert next(h for h in headers if h["pid"] == child)["ppid"] == parent
    gauges = [e for e in events if isinstance(e, Gauge)]
    # The parent's buffered pre-fork events: written once, by the parent, not by the child.
    assert sorted((e.value, e.pid) for e in gauges if e.name == "pre") == [(float(i), parent) for i in range(5)]
    assert sorted((e.value, e.pid) for e in gauges if e.name == "child") == [(float(i), child) for i in range(4)]
    assert [(e.name, e.pid) for e in gauges if e.name == "post"] == [("post", parent)]
    (dropped,) = quality(events, NOTE_DROPPED)
    assert (dropped.pid, dropped.occurrences) == (parent, 3)

    timer_headers, timer_events = read_capture(timer_path)
    assert sorted(h["pid"] for h in timer_headers) == sorted([parent, child])
    assert sorted((e.name, e.pid) for e in timer_events if isinstance(e, Gauge)) == [
        ("timer-child", child),
        ("timer-pre", parent),
    ]


# --- signals -----------------------------------------------------------------------------------

SIGNALLED = """
import os, signal, sys, time
from latprof.capture.writer import CaptureWriter, install_flush_on_signals
from latprof.events import Gauge

path, signum, previous, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])


def handler(signum, frame):
    os.write(1, b"previous handler ran\\n")
    os._exit(7)


# Set explicitly: a process started in the background inherits SIGINT ignored.
python_default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
signal.signal(signum, {"default": python_default, "callable": handler, "ignore": signal.SIG_IGN}[previous])
writer = CaptureWriter(path, flush_interval_s=60)
install_flush_on_signals(writer)
for i in range(n):
    writer.emit(Gauge("g", i, time.time_ns(), os.getpid()))
print("ready", flush=True)
time.sleep(30)
print("slept", flush=True)
"""


def gauge_values(path: Path) -> list[float]:
    return [e.value for e in read_capture(path)[1] if isinstance(e, Gauge)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("previous", "signum", "expected_status"),
    [
        ("default", signal.SIGTERM, -signal.SIGTERM),  # dies by the signal, as without latprof
        ("default", signal.SIGINT, -signal.SIGINT),  # KeyboardInterrupt, then Python exits by SIGINT
        ("callable", signal.SIGTERM, 7),  # the service's own handler still runs
    ],
)
def test_signal_flushes_then_does_what_it_would_have(
    tmp_path: Path, previous: str, signum: int, expected_status: int
) -> None:
    path, n = tmp_path / "capture.jsonl", 500
    with started(SIGNALLED, path, int(signum), previous, n) as proc:
        wait_for_output(proc, b"ready")
        assert not path.exists()  # nothing flushed yet: the interval is 60 s
        os.kill(proc.pid, signum)
        status, out, err = finish(proc)
    assert status == expected_status, err
    assert "slept" not in out
    if previous == "callable":
        assert "previous handler ran" in out
    assert gauge_values(path) == list(range(n))


@pytest.mark.slow
def test_signal_that_was_ignored_flushes_and_stays_ignored(tmp_path: Path) -> None:
    path, n = tmp_path / "capture.jsonl", 500
    with started(SIGNALLED, path, int(signal.SIGTERM), "ignore", n) as proc:
        wait_for_output(proc, b"ready")
        os.kill(proc.pid, signal.SIGTERM)
        assert wait_until(lambda: path.exists() and len(gauge_values(path)) == n)
        time.sleep(0.05)
        assert proc.poll() is None  # still running: the signal is ignored as before
    assert gauge_values(path) == list(range(n))


SIGNAL_DURING_FLUSH = """
import collections.abc, os, signal, sys, time
from latprof.capture.writer import CaptureWriter, install_flush_on_signals
from latprof.events import Gauge


class SignalWhileEncoded(collections.abc.Mapping):
    # Encoding an event reads its attrs: SIGTERM arrives while the main thread is mid-flush.
    def __getitem__(self, key):
        os.kill(os.getpid(), signal.SIGTERM)  # the Python handler runs before kill() returns
        os.write(1, b"kill returned\\n")
        return 1

    def __iter__(self):
        return iter(["k"])

    def __len__(self):
        return 1


path, n = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGTERM, signal.SIG_DFL)
writer = CaptureWriter(path, flush_interval_s=60)
install_flush_on_signals(writer)
pid = os.getpid()
writer.emit(Gauge("g", -1, time.time_ns(), pid, SignalWhileEncoded()))
for i in range(n):
    writer.emit(Gauge("g", i, time.time_ns(), pid))
writer.flush()
print("survived the flush", flush=True)
"""


@pytest.mark.slow
def test_signal_during_a_flush_lets_that_flush_finish_first(tmp_path: Path) -> None:
    path, n = tmp_path / "capture.jsonl", 500
    with started(SIGNAL_DURING_FLUSH, path, n) as proc:
        status, out, err = finish(proc)
    assert status == -signal.SIGTERM, err
    assert "kill returned" in out  # the handler deferred its chaining instead of dying mid-batch
    assert "survived the flush" not in out
    assert gauge_values(path) == [-1.0, *range(n)]
    assert next(e for e in read_capture(path)[1] if isinstance(e, Gauge)).attrs == {"k": 1}
