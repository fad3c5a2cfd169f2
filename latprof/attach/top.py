"""`latprof top`: a live, refreshing layer table of a running process and its workers (no capture).

The same sampler as `latprof attach` (`collectors/attach/pyspy.py`: back-to-back one-second py-spy
windows per process, and every thread's wait channels), each window classified by the same
function (`attach_session.classify_window`), so top and attach agree on every sample. Three
parts, kept apart:

- **aggregation** (`tally`, `TopCounts`): windows in, counters out — busy samples by layer in
  each process's last window ("now") and since the start ("total"), idle samples, threads.
  Pure, and tested on hand-built windows.
- **rendering** (`render`, in `latprof.report.renderers.top_table`): a `TopSnapshot` in, rich
  renderables out (a header, the layer table, the process table); computes nothing.
- **the live loop** (`run_top`): starts the sampler, refreshes the display, reads `q` from the
  terminal (cbreak mode, restored on exit) and Ctrl-C, stops the sampler's py-spy processes.

On an event loop's thread (`stacks.event_loop_thread`) every busy sample is the loop being
held: it is counted under `event_loop` (report-v1's layer for what a blocked loop costs), its
own classification going into the "what" column (`app: handler (app.py)`).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import termios
import threading
import time
import tty
from collections import Counter
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any, Callable, Sequence, TextIO

from rich.console import Console, RenderableType
from rich.live import Live

from latprof.attach.session import classify_window
from latprof.collectors.attach import pyspy
from latprof.events import StackSample
from latprof.layers import EVENT_LOOP, UNATTRIBUTED
from latprof.collectors.attach.stacks import BUSY, SIGNATURES, Classification, event_loop_thread
from latprof.report.renderers.top_table import render


#: A process's last window that ended this long before the newest window of any process no
#: longer counts as "now" (its sampling loop ended: the process exited or py-spy failed).
STALE_NS = 3_000_000_000

#: How long `run_top` samples at most: until it is stopped, in practice.
_FOREVER_S = 10 * 365 * 24 * 3600.0

#: How often the live loop looks for a key, Ctrl-C or the sampler's end between refreshes.
_POLL_S = 0.1

_SIGNATURE_IDS = frozenset(sig.id for sig in SIGNATURES)


# --- aggregation ---------------------------------------------------------------------------------


def attribute(sample: StackSample, classification: Classification) -> tuple[str, str]:
    """The layer a busy sample counts under in top, and what it was doing there.

    What: the signature that decided, else the innermost frame (`function (file)`). An event
    loop's thread is `event_loop` whatever it does (the loop is held), with its own layer in
    front of what (`app: handler (app.py)`); a busy sample no signal explains is `unattributed`."""
    if classification.signature in _SIGNATURE_IDS or not sample.frames:
        what = classification.signature
    else:
        inner = sample.frames[0]
        file = inner.filename.rsplit("/", 1)[-1] if inner.filename.startswith("/") else inner.filename  # a narrow column
        what = f"{inner.function} ({file})" if file else inner.function
    layer = classification.layer or UNATTRIBUTED
    if event_loop_thread(sample.frames):
        return EVENT_LOOP, f"{layer}: {what}"
    return layer, what


@dataclass(frozen=True, slots=True)
class WindowTally:
    """One window of one process, counted: busy samples by layer, with the threads in each and
    what they did; idle samples; every thread seen."""

    pid: int
    end_ns: int
    idle: int
    threads: frozenset[int]
    busy: dict[str, int]
    layer_threads: dict[str, frozenset[int]]
    what: dict[str, Counter[str]]

    @property
    def busy_total(self) -> int:
        return sum(self.busy.values())


def tally(window: Any, classified: Sequence[tuple[StackSample, Classification]]) -> WindowTally:
    """Count one py-spy window (`pyspy.Window`) whose samples `classify_window` classified."""
    idle = 0
    threads: set[int] = set()
    busy: dict[str, int] = {}
    layer_threads: dict[str, set[int]] = {}
    what: dict[str, Counter[str]] = {}
    for sample, classification in classified:
        threads.add(sample.tid)
        if classification.state != BUSY:
            idle += sample.weight
            continue
        layer, doing = attribute(sample, classification)
        busy[layer] = busy.get(layer, 0) + sample.weight
        layer_threads.setdefault(layer, set()).add(sample.tid)
        what.setdefault(layer, Counter())[doing] += sample.weight
    return WindowTally(window.pid, window.end_ns, idle, frozenset(threads), busy,
                       {layer: frozenset(tids) for layer, tids in layer_threads.items()}, what)  # fmt: skip


@dataclass(frozen=True, slots=True)
class LayerRow:
    """One layer of the table: its busy samples now (the processes' last windows) and since the
    start, their shares of all busy samples, the threads in it now, and what they mostly did."""

    layer: str
    now_samples: int
    now_share: float
    total_samples: int
    total_share: float
    threads_now: int
    what: str


@dataclass(frozen=True, slots=True)
class ProcessRow:
    """One process in its last window: threads seen, busy and idle shares of its samples, its top busy layer."""

    pid: int
    threads: int
    busy_share: float
    idle_share: float
    top_layer: str | None


@dataclass(frozen=True, slots=True)
class TopSnapshot:
    """What the display shows at one refresh (`TopCounts.snapshot`)."""

    windows: int
    samples: int
    #: idle share of every sample in the processes' last windows (None before the first window)
    idle_share_now: float | None
    layers: tuple[LayerRow, ...]
    processes: tuple[ProcessRow, ...]


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


class TopCounts:
    """Every window so far, added up: each process's last window ("now") and the totals since
    the start. Thread-safe: the sampler's threads add, the display takes snapshots."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.windows = 0
        self.samples = 0
        self._busy: dict[str, int] = {}
        self._what: dict[str, Counter[str]] = {}
        self._last: dict[int, WindowTally] = {}

    def add(self, window: Any, wchans: dict[int, dict[str, int]]) -> WindowTally:
        """Add one window (`pyspy.Window`) and its threads' wait channels over it (`WaitChannels.between`)."""
        counted = tally(window, classify_window(window, wchans))
        with self._lock:
            self.windows += 1
            self.samples += counted.idle + counted.busy_total
            for layer, n in counted.busy.items():
                self._busy[layer] = self._busy.get(layer, 0) + n
                self._what.setdefault(layer, Counter()).update(counted.what[layer])
            last = self._last.get(counted.pid)
            if last is None or last.end_ns <= counted.end_ns:
                self._last[counted.pid] = counted
        return counted

    def forget(self, pid: int) -> None:
        """A process exited: its last window is no longer "now" (its totals stay)."""
        with self._lock:
            self._last.pop(pid, None)

    def snapshot(self) -> TopSnapshot:
        """The layer and process tables now: layers busiest now first (then since the start)."""
        with self._lock:
            newest = max((t.end_ns for t in self._last.values()), default=0)
            now = sorted((t for t in self._last.values() if t.end_ns >= newest - STALE_NS), key=lambda t: t.pid)
            total_busy = dict(self._busy)
            total_what = {layer: Counter(c) for layer, c in self._what.items()}
            windows, samples = self.windows, self.samples
        now_busy: dict[str, int] = {}
        now_threads: dict[str, set[tuple[int, int]]] = {}
        now_what: dict[str, Counter[str]] = {}
        for t in now:
            for layer, n in t.busy.items():
                now_busy[layer] = now_busy.get(layer, 0) + n
                now_threads.setdefault(layer, set()).update((t.pid, tid) for tid in t.layer_threads[layer])
                now_what.setdefault(layer, Counter()).update(t.what[layer])
        all_now, all_total = sum(now_busy.values()), sum(total_busy.values())
        rows = []
        for layer, total in total_busy.items():
            what = now_what.get(layer) or total_what[layer]
            rows.append(LayerRow(layer, now_busy.get(layer, 0), _share(now_busy.get(layer, 0), all_now), total,
                                 _share(total, all_total), len(now_threads.get(layer, ())), what.most_common(1)[0][0]))  # fmt: skip
        rows.sort(key=lambda r: (-r.now_samples, -r.total_samples, r.layer))
        processes = []
        for t in now:
            seen = t.idle + t.busy_total
            top = min(t.busy.items(), key=lambda kv: (-kv[1], kv[0]), default=None)
            processes.append(ProcessRow(t.pid, len(t.threads), _share(t.busy_total, seen), _share(t.idle, seen),
                                        top[0] if top else None))  # fmt: skip
        idle_now = sum(t.idle for t in now)
        seen_now = idle_now + all_now
        return TopSnapshot(windows, samples, _share(idle_now, seen_now) if now else None, tuple(rows), tuple(processes))


# --- the live loop -------------------------------------------------------------------------------


class TopSession:
    """The sampler behind `latprof top`: `start()` checks the target and samples it (and its
    Python children) in a thread of its own until `stop()`, adding every window to `counts`."""

    def __init__(self, pid: int, *, rate: int = 100, subprocesses: bool = True) -> None:
        self.pid = pid
        self.counts = TopCounts()
        self.channels = pyspy.WaitChannels(hz=min(rate, 100))
        self.sampler = pyspy.Sampler(pid, self._window, rate=rate, subprocesses=subprocesses)
        self.failure: str | None = None  # why sampling ended by itself, when not because the target exited
        self.window_errors: list[str] = []
        self._thread = threading.Thread(target=self._sample, name="latprof-top-sampler", daemon=True)

    def start(self) -> None:
        """Fail early and clearly (`pyspy.SamplerError`: no such process, not Python, not permitted, py-spy missing), then sample."""
        if not os.path.exists(f"/proc/{self.pid}"):
            raise pyspy.SamplerError(f"no process with PID {self.pid}")
        pyspy.dump(self.pid)
        self.watch_processes()
        self.channels.start()
        self._thread.start()

    def watch_processes(self) -> None:
        """Read the wait channels of the target's processes now (workers started since included)."""
        for pid in self.sampler.processes():
            self.channels.watch(pid)

    def running(self) -> bool:
        return self._thread.is_alive()

    def target_exited(self) -> bool:
        return self.pid in self.sampler.exited or not pyspy.alive(self.pid)

    def stop(self) -> None:
        """Ask the sampler to stop: a py-spy window in progress ends within its second."""
        self.sampler.stop_event.set()

    def close(self) -> None:
        """Stop, and wait for the sampler's py-spy processes and the wait-channel reader to end."""
        self.stop()
        if self._thread.is_alive():
            self._thread.join(pyspy.WINDOW_S + pyspy.DUMP_TIMEOUT_S + 5)
        self.channels.stop()

    def _sample(self) -> None:
        try:
            self.sampler.run(_FOREVER_S)
        except Exception as exc:  # shown, not raised into a sampler thread
            self.failure = str(exc) or type(exc).__name__

    def _window(self, window: Any) -> None:
        try:  # called from a sampler thread: an error here would end that process's loop with a traceback
            self.channels.watch(window.pid)
            self.counts.add(window, self.channels.between(window.pid, window.start_ns, window.end_ns))
        except Exception as exc:
            self.window_errors.append(f"PID {window.pid}: window not counted: {type(exc).__name__}: {exc}")


class _Keys:
    """Keys typed at the terminal, one at a time without Enter (cbreak mode, echo off); the
    terminal's modes are restored on exit. Nothing is read when stdin is not a terminal."""

    def __init__(self, stream: TextIO | None) -> None:
        self.fd: int | None = None
        try:
            if stream is not None and stream.isatty():
                self.fd = stream.fileno()
        except (ValueError, OSError):  # closed, or not a real file
            self.fd = None
        self._saved: list[Any] | None = None

    @property
    def interactive(self) -> bool:
        return self.fd is not None

    def __enter__(self) -> _Keys:
        if self.fd is not None:
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd, termios.TCSANOW)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.fd is not None and self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def wait(self, timeout_s: float, stop: threading.Event) -> str:
        """Wait up to `timeout_s` for a key (or `stop`); the keys typed, '' when none."""
        if self.fd is None:
            stop.wait(timeout_s)
            return ""
        try:
            ready, _, _ = select.select([self.fd], [], [], timeout_s)
        except InterruptedError:  # a signal (Ctrl-C) came in: its handler set `stop`
            return ""
        if not ready:
            return ""
        try:
            data = os.read(self.fd, 64)
        except OSError:  # the terminal went away: no more keys
            self.fd = None
            return ""
        if not data:  # end of input (the terminal hung up)
            self.fd = None
        return data.decode(errors="replace")


@dataclass(frozen=True, slots=True)
class TopResult:
    """How `latprof top` ended: quit by the user, or the target exited (`exited`)."""

    pid: int
    exited: bool

    def message(self) -> str:
        return f"PID {self.pid} exited" if self.exited else "stopped"


def _command_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def run_top(
    pid: int,
    *,
    rate: int = 100,
    subprocesses: bool = True,
    interval_s: float = 1.0,
    console: Console | None = None,
    stdin: TextIO | None = None,
    on_note: Callable[[str], None] | None = None,
) -> TopResult:
    """Show the live layer table of `pid` until `q`, Ctrl-C or the target's exit.

    On a terminal the display refreshes in place every `interval_s`; otherwise one plain table is
    printed every `interval_s` (`latprof top --pid P | cat`). Raises `pyspy.SamplerError` when
    the target cannot be sampled at all. `on_note` gets one-line notes (stopping…)
    meant for stderr when the output is not a terminal."""
    console = console or Console(highlight=False)
    session = TopSession(pid, rate=rate, subprocesses=subprocesses)
    session.start()
    name = _command_name(pid)
    stop = threading.Event()
    started = time.monotonic()
    note = on_note or (lambda line: None)

    def on_sigint(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with _Keys(stdin if stdin is not None else sys.stdin) as keys:
            quits = "q or Ctrl-C quits" if keys.interactive else "Ctrl-C quits"

            def frame(status: str = "") -> RenderableType:
                errors = [*session.sampler.errors, *session.window_errors]
                if errors and not status:
                    status = f"{len(errors)} sampling error(s), the last: {errors[-1]}"
                return render(session.counts.snapshot(), pid=pid, name=name, elapsed_s=time.monotonic() - started,
                              quits=quits, status=status)  # fmt: skip

            def print_table() -> None:
                console.print(frame())
                console.print()

            if console.is_terminal:
                with Live(frame(), console=console, auto_refresh=False, redirect_stdout=False, redirect_stderr=False) as live:
                    exited = _loop(session, keys, stop, interval_s, lambda: live.update(frame(), refresh=True))
                    if not exited:
                        live.update(frame("stopping…"), refresh=True)
                    session.close()
                    live.update(frame(), refresh=True)  # the last table stays; the CLI says how it ended
            else:
                exited = _loop(session, keys, stop, interval_s, print_table)
                if not exited:
                    note("stopping…")
                session.close()
    finally:
        signal.signal(signal.SIGINT, previous)
        session.close()
    if session.failure is not None and not exited:
        raise pyspy.SamplerError(session.failure)
    return TopResult(pid, exited)


def _loop(session: TopSession, keys: _Keys, stop: threading.Event, interval_s: float, show: Callable[[], object]) -> bool:
    """Refresh every `interval_s` until `q`, Ctrl-C (`stop`) or the sampler's end; whether the target exited."""
    next_at = time.monotonic()
    while True:
        if stop.is_set():
            return False
        if not session.running():
            if session.failure is not None and not session.target_exited():
                return False
            show()
            return True
        now = time.monotonic()
        if now >= next_at:
            for exited in list(session.sampler.exited):
                session.counts.forget(exited)
            session.watch_processes()
            show()
            next_at = max(next_at + interval_s, now + interval_s / 2)
        typed = keys.wait(max(0.0, min(_POLL_S, next_at - time.monotonic())), stop)
        if "q" in typed.lower():
            return False
