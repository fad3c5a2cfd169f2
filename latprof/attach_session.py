"""`latprof attach`: sample a running service from outside into a capture.

Three collectors run side by side for `--duration` seconds, all into one capture file
(`source: attach`), so `latprof analyze CAPTURE` later reads exactly what the live report read:

- **stacks** (`collectors/pyspy.py`): back-to-back one-second py-spy recordings of the target
  and (by default) each of its Python children, at `--rate` Hz; every (thread, stack) of a
  window becomes one `stack` event weighted by its sample count, stamped with the window's
  start. A stack no signature explains (a C call that left no frame) is split over the wait
  channels its thread was seen in during that window, one event per channel.
- **wait channels** of every thread, polled at the sampling rate (for the split above).
- **/proc** (`collectors/procfs.py`), every `POLL_S`: the accept-queue depth of each listening
  port (`accept.queue_depth`), and each second the connections accepted (`accept.rate`, per
  second), every process's CPU (`process.cpu_percent`) and context switches
  (`process.context_switches.voluntary`/`.involuntary`, per second), every thread's CPU
  (`thread.cpu_percent`, `thread.id` the kernel TID the stacks carry) and the established
  connections per remote endpoint (`connections.established`).
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from latprof.capture.writer import CaptureWriter
from latprof.events import Frame as EventFrame
from latprof.events import Gauge, QualityRecord, StackSample
from latprof.semconv import NOTE_WARNING
from latprof.stacks import BUSY, Classification, by_wait_channel, match, share_out

# `latprof.collectors` is installed from collectors/ (a package-dir mapping mypy does not follow)
pyspy: Any = importlib.import_module("latprof.collectors.pyspy")
procfs: Any = importlib.import_module("latprof.collectors.procfs")

#: How often /proc is read for the accept queue (its depth changes faster than once a second).
POLL_S = 0.1

GAUGE_ACCEPT_QUEUE = "accept.queue_depth"
GAUGE_ACCEPT_RATE = "accept.rate"
GAUGE_CPU = "process.cpu_percent"
GAUGE_CONNECTIONS = "connections.established"
GAUGE_THREAD_CPU = "thread.cpu_percent"
GAUGE_CTX_VOLUNTARY = "process.context_switches.voluntary"
GAUGE_CTX_INVOLUNTARY = "process.context_switches.involuntary"


@dataclass
class AttachStats:
    """What a session collected (for the progress line and the report's collection section)."""

    windows: int = 0
    samples: int = 0
    #: busy samples of every thread by layer so far (for the progress line's top layer)
    layers: dict[str, int] = field(default_factory=dict)
    processes: set[int] = field(default_factory=set)
    exited: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class AttachSession:
    """One attach: `run()` samples `pid` for `duration_s` into `out`, then closes the capture."""

    def __init__(
        self,
        pid: int,
        out: str,
        *,
        duration_s: float,
        rate: int = 100,
        subprocesses: bool = True,
        on_progress: Callable[[AttachStats], None] | None = None,
    ) -> None:
        self.pid = pid
        self.out = out
        self.duration_s = duration_s
        self.rate = rate
        self.subprocesses = subprocesses
        self.on_progress = on_progress
        self.stats = AttachStats()
        self._lock = threading.Lock()
        self._proc_started = threading.Event()
        self.writer = CaptureWriter(
            out, source="attach", header_extra={"collectors": ["py-spy", "procfs"], "target_pid": pid, "rate_hz": rate}
        )
        self.channels = pyspy.WaitChannels(hz=min(rate, 100))
        self.sampler = pyspy.Sampler(pid, self._window, rate=rate, subprocesses=subprocesses)

    def stop(self) -> None:
        """End early (Ctrl-C): what was sampled so far is kept."""
        self.sampler.stop_event.set()

    def run(self) -> AttachStats:
        if not os.path.exists(f"/proc/{self.pid}"):
            self.writer.close()
            raise pyspy.SamplerError(f"no process with PID {self.pid}")
        pyspy.dump(self.pid)  # fails early and clearly: not Python, not permitted, py-spy missing
        for pid in self.sampler.processes():
            self.channels.watch(pid)
        self.channels.start()
        poller = threading.Thread(target=self._poll_proc, name="latprof-procfs", daemon=True)
        poller.start()
        self._proc_started.wait(5)  # the first window's second has an accept-queue reading too
        try:
            self.sampler.run(self.duration_s)
        finally:
            self.sampler.stop_event.set()
            poller.join(5)
            self.channels.stop()
            with self._lock:
                self.stats.exited = list(self.sampler.exited)
                self.stats.errors = list(self.sampler.errors)
            now = time.time_ns()
            for message in self.stats.errors:
                self.writer.emit(QualityRecord(NOTE_WARNING, now, self.pid, message))
            if self.pid in self.stats.exited:
                self.writer.emit(QualityRecord(NOTE_WARNING, now, self.pid, f"PID {self.pid} exited during the capture"))
            self.writer.close()
        return self.stats

    # -- stacks -------------------------------------------------------------------------------

    def _window(self, window: Any) -> None:
        self.channels.watch(window.pid)
        classified = classify_window(window, self.channels.between(window.pid, window.start_ns, window.end_ns))
        events = [e for e, _ in classified]
        total = sum(e.weight for e in events)
        busy: dict[str, int] = {}  # busy samples by layer, for the progress line
        for e, c in classified:
            if c.state == BUSY and c.layer is not None:
                busy[c.layer] = busy.get(c.layer, 0) + e.weight
        for e in events:
            self.writer.emit(e)
        with self._lock:
            for layer, n in busy.items():
                self.stats.layers[layer] = self.stats.layers.get(layer, 0) + n
            self.stats.windows += 1
            self.stats.samples += total
            self.stats.processes.add(window.pid)
            stats = self.stats
        if self.on_progress is not None:
            self.on_progress(stats)

    # -- /proc ----------------------------------------------------------------------------------

    def _poll_proc(self) -> None:
        try:
            pids = self.sampler.processes()
            ports = procfs.listening_ports(self.pid, pids)
            counter = procfs.AcceptCounter(self.pid, ports)
            counter.poll()
            seconds = _EverySecond(self, ports)
            next_second = time.monotonic() + 1.0
            accepted = 0
            while True:  # a reading at once, then one every POLL_S until the sampling stops
                now = time.time_ns()
                for port, depth in procfs.accept_queues(self.pid, ports).items():
                    self.writer.emit(Gauge(GAUGE_ACCEPT_QUEUE, depth, now, self.pid, {"server.port": port}))
                self._proc_started.set()  # the first reading is in: sampling may begin
                accepted += counter.poll()
                if time.monotonic() >= next_second:
                    next_second += 1.0
                    seconds.read(now, accepted)
                    accepted = 0
                if self.sampler.stop_event.wait(POLL_S):
                    break
        except Exception as exc:  # the stacks go on without /proc; say so in the capture
            self._proc_started.set()
            self.writer.emit(QualityRecord(NOTE_WARNING, time.time_ns(), self.pid, f"/proc polling stopped: {type(exc).__name__}: {exc}"))


def classify_window(window: Any, wchans: dict[int, dict[str, int]]) -> list[tuple[StackSample, Classification]]:
    """One py-spy window's stacks as capture events, each with what it says (`latprof.stacks`).

    A stack a signature explains is one event; a stack none explains (a C call that left no
    frame) is shared out over the wait channels its thread was seen in during the window
    (`wchans`: tid -> wait channel -> readings), one event per channel, each classified by it.
    What `latprof attach` writes and what `latprof top` shows are made here, alike."""
    out: list[tuple[StackSample, Classification]] = []
    for c in window.counts:
        frames = tuple(EventFrame(f.name, f.file) for f in c.frames)
        found = match(c.frames)
        seen = wchans.get(c.tid)
        if found is not None or not seen:
            sample = StackSample(window.start_ns, window.pid, c.tid, c.thread, frames, False, None, c.count)
            out.append((sample, found if found is not None else by_wait_channel(None, False)))
            continue
        for w, n in share_out(c.count, seen):
            out.append((StackSample(window.start_ns, window.pid, c.tid, c.thread, frames, w == "0", w, n),
                        by_wait_channel(w, w == "0")))  # fmt: skip
    return out


class _EverySecond:
    """The /proc and psutil readings taken once a second: accepts, CPU, context switches, connections."""

    def __init__(self, session: AttachSession, ports: set[int]) -> None:
        self.session = session
        self.ports = ports
        self.procs: dict[int, Any] = {}
        self.last_threads: dict[tuple[int, int], float] = {}  # CPU seconds of each thread at the last reading
        self.last_ctx: dict[int, tuple[int, int]] = {}
        self.last_at = time.monotonic()

    def read(self, now: int, accepted: int) -> None:
        import psutil  # type: ignore[import-untyped]

        emit, target = self.session.writer.emit, self.session.pid
        for port in self.ports:
            emit(Gauge(GAUGE_ACCEPT_RATE, accepted, now, target, {"server.port": port}))
        pids = self.session.sampler.processes()
        elapsed, self.last_at = time.monotonic() - self.last_at, time.monotonic()
        for pid in pids:
            try:
                self._process(pid, now, elapsed)
            except psutil.Error:
                self.procs.pop(pid, None)
        for (address, port, status), n in procfs.remote_endpoints(pids, self.ports).items():
            if status == "ESTABLISHED":
                emit(Gauge(GAUGE_CONNECTIONS, n, now, target, {"server.address": address, "server.port": port}))

    def _process(self, pid: int, now: int, elapsed: float) -> None:
        import psutil

        emit = self.session.writer.emit
        proc = self.procs.get(pid)
        if proc is None:
            proc = self.procs[pid] = psutil.Process(pid)
            proc.cpu_percent(None)  # the first reading only starts the clock
        else:
            emit(Gauge(GAUGE_CPU, proc.cpu_percent(None), now, pid))
        ctx = proc.num_ctx_switches()
        if pid in self.last_ctx:
            emit(Gauge(GAUGE_CTX_VOLUNTARY, ctx.voluntary - self.last_ctx[pid][0], now, pid))
            emit(Gauge(GAUGE_CTX_INVOLUNTARY, ctx.involuntary - self.last_ctx[pid][1], now, pid))
        self.last_ctx[pid] = (ctx.voluntary, ctx.involuntary)
        for t in proc.threads():
            used = t.user_time + t.system_time
            before = self.last_threads.get((pid, t.id))
            self.last_threads[(pid, t.id)] = used
            if before is not None and elapsed > 0:
                emit(Gauge(GAUGE_THREAD_CPU, round((used - before) / elapsed * 100, 1), now, pid, {"thread.id": t.id}))
