"""`latprof attach`: sample a running service from outside into a capture.

Three collectors run side by side for `--duration` seconds, all into one capture file
(`source: attach`), so `latprof analyze CAPTURE` later reads exactly what the live report read:

- **stacks** (`collectors/attach/pyspy.py`): back-to-back five-second py-spy recordings of the target
  and (by default) each of its Python children, at `--rate` Hz (`ATTACH_WINDOW_S`: each start
  costs the service); every (thread, stack) of each second of a recording becomes one `stack`
  event weighted by its sample count, stamped with that second's start. A stack no signature
  explains (a C call that left no frame) is split over the wait channels its thread was seen
  in during that second, one event per channel. Requests of threaded servers are
  reconstructed from each worker thread's stacks in time (`latprof.attach.reconstruct`).
- **wait channels** of every thread, polled at the sampling rate (for the split above).
- **/proc** (`collectors/attach/procfs.py`), every `POLL_S`: the accept-queue depth of each listening
  port (`accept.queue_depth`), and each second the connections accepted (`accept.rate`, per
  second), every process's CPU (`process.cpu_percent`) and context switches
  (`process.context_switches.voluntary`/`.involuntary`, per second), every thread's CPU
  (`thread.cpu_percent`, `thread.id` the kernel TID the stacks carry) and the established
  connections per remote endpoint (`connections.established`).
"""

from __future__ import annotations

import bisect
from collections import Counter
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from latprof.capture.writer import CaptureWriter
from latprof.collectors.attach import pg_activity, procfs, pyspy, sockdiag
from latprof.collectors.scrape.prometheus import COLLECTOR as ENGINE_COLLECTOR
from latprof.collectors.scrape.prometheus import EngineScraper
from latprof.errors import InputError
from latprof.events import Frame as EventFrame
from latprof.events import Gauge, QualityRecord, StackSample
from latprof.attach.reconstruct import reconstruct
from latprof.attach.wire import DB_PORTS
from latprof.semconv import NOTE_OVERHEAD, NOTE_WARNING
from latprof.collectors.attach.stacks import BUSY, Classification, classify_sample, event_loop_thread, loop_waiting, match, share_out


#: How often /proc is read for the accept queue (its depth changes faster than once a second).
POLL_S = 0.1

GAUGE_ACCEPT_QUEUE = "accept.queue_depth"
GAUGE_ACCEPT_RATE = "accept.rate"
GAUGE_CPU = "process.cpu_percent"
GAUGE_CONNECTIONS = "connections.established"
GAUGE_THREAD_CPU = "thread.cpu_percent"
GAUGE_CTX_VOLUNTARY = "process.context_switches.voluntary"
GAUGE_CTX_INVOLUNTARY = "process.context_switches.involuntary"
#: An event loop thread's share of wait-channel readings in which something held the loop (per window).
GAUGE_LOOP_BUSY = "event_loop.busy_share"
#: One interval of at least `BLOCK_MS` in which the loop never waited for events: value its length in ms.
GAUGE_LOOP_BLOCKED = "event_loop.blocked_ms"

#: An outbound connection that received data this recently has an answer in progress (a stream):
#: an LLM stream's role chunk comes right after the headers and its first token may take seconds.
RECEIVING_MS = 1000

#: The census reads established connections only (thousands of TIME_WAIT rows after a load cost time, say nothing).
ESTABLISHED = frozenset({"ESTABLISHED"})
LISTEN_OR_ESTABLISHED = frozenset({"LISTEN", "ESTABLISHED"})

#: A loop held this long without waiting for events once is blocked (asyncio debug mode's
#: `slow_callback_duration` is 100 ms too).
BLOCK_MS = 100.0


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
        db: str | None = None,
        on_progress: Callable[[AttachStats], None] | None = None,
        engine_metrics: Sequence[str] = (),
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
        #: `--db DSN`: the target's PostgreSQL backends from pg_stat_activity (opened in `run`)
        self.pg = pg_activity.PgActivity(db) if db else None
        self._header = {"collectors": ["py-spy", "procfs", "sock_diag"] + (["pg_stat_activity"] if db else [])
                        + ([ENGINE_COLLECTOR] if engine_metrics else []), "target_pid": pid, "rate_hz": rate}  # fmt: skip
        #: `--engine-metrics URL`: an inference engine's Prometheus endpoint, scraped each second into the capture
        self.engines = EngineScraper(engine_metrics, lambda event: None, pid=os.getpid())
        self.writer: Any = None  # opened in `run`, once the target and the database are known to be there
        self.channels = pyspy.WaitChannels(hz=min(rate, 100))
        self.sampler = pyspy.Sampler(pid, self._window, rate=rate, subprocesses=subprocesses, window_s=pyspy.ATTACH_WINDOW_S)
        self.loops = LoopWatch(self.channels)
        self._reconstruct_failed = False  # said once in the capture

    def stop(self) -> None:
        """End early (Ctrl-C): what was sampled so far is kept."""
        self.sampler.stop_event.set()

    def run(self) -> AttachStats:
        if not os.path.exists(f"/proc/{self.pid}"):
            raise pyspy.SamplerError(f"no process with PID {self.pid}")
        pyspy.dump(self.pid)  # fails early and clearly: not Python, not permitted, py-spy missing
        if self.pg is not None:
            self.pg.open()  # a bad DSN fails here, before any capture is written
            self._header["db_server"] = list(self.pg.server())
        try:
            self.writer = CaptureWriter(self.out, source="attach", header_extra=self._header)
        except OSError as exc:
            if self.pg is not None:
                self.pg.close()
            raise InputError(f"{self.out}: cannot write: {exc.strerror or exc}") from None
        for pid in self.sampler.processes():
            self.channels.watch(pid)
        self.channels.start()
        self.engines.emit = self.writer.emit
        self.engines.start()
        poller = threading.Thread(target=self._poll_proc, name="latprof-procfs", daemon=True)
        poller.start()
        self._proc_started.wait(5)  # the first window's second has an accept-queue reading too
        cost = _Cost()
        try:
            self.sampler.run(self.duration_s)
        finally:
            for record in cost.records(self.pid):
                self.writer.emit(record)
            self.sampler.stop_event.set()
            poller.join(5)
            self.channels.stop()
            with self._lock:
                self.stats.exited = list(self.sampler.exited)
                self.stats.errors = list(self.sampler.errors)
            for g in self.loops.close():
                self.writer.emit(g)
            if self.engines:
                self.engines.stop()
            now = time.time_ns()
            for message in self.stats.errors:
                self.writer.emit(QualityRecord(NOTE_WARNING, now, self.pid, message))
            if self.pid in self.stats.exited:
                self.writer.emit(QualityRecord(NOTE_WARNING, now, self.pid, f"PID {self.pid} exited during the capture"))
            self.writer.close()
            if self.pg is not None:
                self.pg.close()
        return self.stats

    # -- stacks -------------------------------------------------------------------------------

    def _window(self, window: Any) -> bool:
        """Write one window's samples; whether one of them was busy (else the sampler may slow
        down on a supervisor)."""
        self.channels.watch(window.pid)
        classified: list[tuple[StackSample, Classification]] = []
        loop_gauges: list[Gauge] = []
        for part in window.seconds():  # each sample stamped with its own second
            mine = classify_window(part, self.channels.between(part.pid, part.start_ns, part.end_ns), self.rate)
            classified += mine
            loop_gauges += self.loops.window(part, mine)
        events = [e for e, _ in classified]
        total = sum(e.weight for e in events)
        busy: dict[str, int] = {}  # busy samples by layer, for the progress line
        for e, c in classified:
            if c.state == BUSY and c.layer is not None:
                busy[c.layer] = busy.get(c.layer, 0) + e.weight
        for e in events:
            self.writer.emit(e)
        try:
            requests, cut = reconstruct(window, self._wchan_in(window))
        except Exception as exc:  # the samples are written; only the requests made from them are lost
            requests, cut = [], None
            if not self._reconstruct_failed:
                self._reconstruct_failed = True
                self.writer.emit(QualityRecord(NOTE_WARNING, time.time_ns(), window.pid,
                                               f"requests not reconstructed from samples: {type(exc).__name__}: {exc}"))  # fmt: skip
        for r in requests:
            self.writer.emit(r)
        if cut is not None:
            self.writer.emit(cut)
        for g in loop_gauges:
            self.writer.emit(g)
        with self._lock:
            for layer, n in busy.items():
                self.stats.layers[layer] = self.stats.layers.get(layer, 0) + n
            self.stats.windows += 1
            self.stats.samples += total
            self.stats.processes.add(window.pid)
            stats = self.stats
        if self.on_progress is not None:
            self.on_progress(stats)
        return any(c.state == BUSY for _, c in classified)

    def _wchan_in(self, window: Any) -> Callable[[int, int, int], str | None]:
        """The wait channel a thread of `window`'s process was most seen in over a time range
        (the reading nearest its start when none fell in it; None: none read)."""
        readings: dict[int, tuple[list[int], list[str]]] = {}

        def most(tid: int, start_ns: int, end_ns: int) -> str | None:
            if tid not in readings:
                seen = self.channels.readings(window.pid, tid, window.start_ns - 100_000_000, window.end_ns)
                readings[tid] = ([t for t, _ in seen], [w for _, w in seen])
            times, values = readings[tid]
            if not times:
                return None
            lo, hi = bisect.bisect_left(times, start_ns), bisect.bisect_left(times, end_ns)
            if lo < hi:
                return Counter(values[lo:hi]).most_common(1)[0][0]
            return values[min(lo, len(times) - 1)]

        return most

    # -- /proc ----------------------------------------------------------------------------------

    def _census(self, wire: _Wire, pids: list[int], dumps: _Handoff) -> None:
        """The socket census (and the --db backends) on each of the accept-queue poller's
        dumps (`dumps`; every `POLL_S`), the census written once a second."""
        next_second = time.monotonic() + 1.0
        seen = 0
        try:
            while not self.sampler.stop_event.is_set():
                seen, sockets = dumps.take(seen, 3 * POLL_S)
                if self.sampler.stop_event.is_set():
                    break
                wire.poll(pids, sockets)
                if time.monotonic() >= next_second:
                    next_second += 1.0
                    wire.flush(time.time_ns())
                    pids = self.sampler.processes() or pids
            wire.flush_exchanges(time.time_ns(), last=True)
        except Exception as exc:  # the stacks and /proc go on without it; say so in the capture
            self.writer.emit(QualityRecord(NOTE_WARNING, time.time_ns(), self.pid, f"socket census stopped: {type(exc).__name__}: {exc}"))

    def _poll_proc(self) -> None:
        try:
            pids = self.sampler.processes()
            ports = procfs.listening_ports(self.pid, pids)
            counter = procfs.AcceptCounter(self.pid, ports)
            counter.poll()
            seconds = _EverySecond(self, ports)
            # One sock_diag dump per reading serves the accept queues here and the census in a
            # thread of its own (so that these readings keep their cadence): the kernel walks
            # every TCP socket of the namespace for a dump, the largest part of latprof's CPU.
            dumps = _Handoff()
            census = threading.Thread(target=self._census, args=(_Wire(self, ports), pids, dumps), name="latprof-census", daemon=True)
            census.start()
            next_second = time.monotonic() + 1.0
            accepted = 0
            reader: sockdiag.SocketReader | None = sockdiag.SocketReader(self.pid)  # else /proc/PID/net/tcp (costly: it walks the kernel's whole socket table)
            while True:  # a reading at once, then one every POLL_S until the sampling stops
                now = time.time_ns()
                rows = None
                if reader is not None:
                    try:
                        sockets = reader.sockets(LISTEN_OR_ESTABLISHED)
                        dumps.put([s for s in sockets if s.state == "ESTABLISHED"])
                        rows = procfs.rows_of(sockets)
                    except sockdiag.SockDiagError:
                        reader = None
                if reader is None:
                    dumps.put(None)  # the census asks for its own (and says so if it cannot)
                for port, depth in procfs.accept_queues(self.pid, ports, rows).items():
                    self.writer.emit(Gauge(GAUGE_ACCEPT_QUEUE, depth, now, self.pid, {"server.port": port}))
                self._proc_started.set()  # the first reading is in: sampling may begin
                accepted += counter.poll(rows)
                if time.monotonic() >= next_second:
                    next_second += 1.0
                    seconds.read(now, accepted, sockets if reader is not None else None)
                    accepted = 0
                if self.sampler.stop_event.wait(POLL_S):
                    break
            dumps.put(None)  # wakes the census to see the stop
            census.join(5)
            if reader is not None:
                reader.close()
        except Exception as exc:  # the stacks go on without /proc; say so in the capture
            self._proc_started.set()
            self.writer.emit(QualityRecord(NOTE_WARNING, time.time_ns(), self.pid, f"/proc polling stopped: {type(exc).__name__}: {exc}"))


def classify_window(window: Any, wchans: dict[int, dict[str, int]], rate: int | None = None) -> list[tuple[StackSample, Classification]]:
    """One py-spy window's stacks as capture events, each with what it says (`latprof.collectors.attach.stacks`).

    A stack a signature explains is one event; a stack none explains (a C call that left no
    frame) is shared out over the wait channels its thread was seen in during the window
    (`wchans`: tid -> wait channel -> readings), one event per channel. What `latprof attach`
    writes and what `latprof top` shows are made here, alike, and each event is classified by
    `stacks.classify_sample`, as the analysis of the capture classifies it again. A window
    sampled at a lower rate than the session's `rate` (an idle supervisor's) weighs each
    sample as the session's rate would have counted it."""
    out: list[tuple[StackSample, Classification]] = []
    scale = max(1, round(rate / window.rate)) if rate and window.rate else 1
    for c in window.counts:
        frames = tuple(EventFrame(f.name, f.file) for f in c.frames)
        seen = wchans.get(c.tid)
        count = c.count * scale
        if not seen or match(c.frames) is not None:
            samples = [StackSample(window.start_ns, window.pid, c.tid, c.thread, frames, False, None, count)]
        else:
            samples = [StackSample(window.start_ns, window.pid, c.tid, c.thread, frames, w == "0", w, n)
                       for w, n in share_out(count, seen)]  # fmt: skip
        out += [(sample, classify_sample(sample)) for sample in samples]
    return out


class LoopWatch:
    """The state of every event loop thread, from its wait channel readings (taken at the
    sampling rate, each timestamped): after each py-spy window of a process, the busy share of
    each of its loop threads since the last one (`event_loop.busy_share`) and each interval of
    at least `BLOCK_MS` in which the loop never waited for events (`event_loop.blocked_ms`,
    stamped with its start). A thread is a loop thread once a stack of it shows a loop's runner
    (`stacks.event_loop_thread`); stock asyncio and uvloop alike wait in epoll when free."""

    def __init__(self, channels: Any) -> None:
        self.channels = channels
        self.threads: dict[tuple[int, int], int] = {}  # loop thread -> readings consumed up to (ns)
        self.open: dict[tuple[int, int], tuple[int, int]] = {}  # loop thread -> (first, last) busy reading of a run going on

    def window(self, window: Any, classified: list[tuple[StackSample, Classification]]) -> list[Gauge]:
        for e, _ in classified:
            key = (e.pid, e.tid)
            if key not in self.threads and event_loop_thread(e.frames):
                self.threads[key] = window.start_ns
        gauges = []
        for (pid, tid), since in list(self.threads.items()):
            if pid != window.pid:
                continue
            readings = self.channels.readings(pid, tid, since, window.end_ns)
            self.threads[(pid, tid)] = window.end_ns
            if not readings:
                continue
            busy = 0
            run = self.open.pop((pid, tid), None)
            for ts, value in readings:
                if loop_waiting(value):
                    if run is not None:
                        gauges += self._blocked(pid, tid, run)
                        run = None
                    continue
                busy += 1
                run = (ts, ts) if run is None else (run[0], ts)
            if run is not None:
                self.open[(pid, tid)] = run
            attrs = {"thread.id": tid, "latprof.readings": len(readings)}
            gauges.append(Gauge(GAUGE_LOOP_BUSY, round(busy / len(readings), 4), since, pid, attrs))
        return gauges

    def close(self) -> list[Gauge]:
        """The intervals still going on when the capture ends (a loop held to the last reading)."""
        gauges = []
        for (pid, tid), run in self.open.items():
            gauges += self._blocked(pid, tid, run)
        self.open.clear()
        return gauges

    def _blocked(self, pid: int, tid: int, run: tuple[int, int]) -> list[Gauge]:
        length_ms = (run[1] - run[0]) / 1e6 + self.channels.interval_s * 1000  # a reading stands for one interval
        if length_ms < BLOCK_MS:
            return []
        return [Gauge(GAUGE_LOOP_BLOCKED, round(length_ms, 1), run[0], pid, {"thread.id": tid})]


#: The machine's CPUs this busy (percent) while sampling: the report warns that the sampler
#: competed with the service for them.
MACHINE_SATURATED_PERCENT = 90.0


class _Cost:
    """What sampling cost: the CPU of latprof's own process and of the py-spy recordings it ran
    (its waited-for children), as percent of one core over the capture (report-v1's
    `collection.overhead.cpu_percent`), and how busy the machine's CPUs were meanwhile."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self.wall = time.monotonic()
        self.cpu = self._own()
        self.machine = psutil.cpu_times()

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def records(self, pid: int) -> list[QualityRecord]:
        now = time.time_ns()
        wall = time.monotonic() - self.wall
        if wall <= 0:
            return []
        cpu_percent = (self._own() - self.cpu) / wall * 100
        before, after = self.machine, self._psutil.cpu_times()
        idle = (after.idle + getattr(after, "iowait", 0.0)) - (before.idle + getattr(before, "iowait", 0.0))
        total = sum(after) - sum(before)
        machine = 100 * (1 - idle / total) if total > 0 else 0.0
        cpus = self._psutil.cpu_count() or 1
        out = [QualityRecord(NOTE_OVERHEAD, now, pid, attrs={
            "cpu_percent": round(cpu_percent, 1), "machine_cpu_percent": round(machine, 1), "cpus": cpus})]  # fmt: skip
        if machine >= MACHINE_SATURATED_PERCENT:
            out.append(QualityRecord(NOTE_WARNING, now, pid,
                                     f"the machine's {cpus} CPUs were {machine:.0f}% busy while sampling; the sampler used"
                                     f" {cpu_percent:.0f}% of a core of it: it competed with the service, whose waits may"
                                     " differ from when it is not sampled (try a lower --rate)"))  # fmt: skip
        return out


class _Handoff:
    """The latest of a series of values, from one thread to another that waits for each new one."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._value: Any = None
        self._count = 0

    def put(self, value: Any) -> None:
        with self._cond:
            self._value = value
            self._count += 1
            self._cond.notify_all()

    def take(self, seen: int, timeout_s: float) -> tuple[int, Any]:
        """(count, value) once a value newer than the `seen`th was put, or (seen, None) after `timeout_s`."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._count != seen, timeout_s):
                return seen, None
            return self._count, self._value


class _Wire:
    """The socket census (`collectors/attach/sockdiag.py`), read every `POLL_S` and written as the mean
    of each second (`census.*` gauges); and with `--db`, at each census reading, the target's
    PostgreSQL backends (`db.backend.state_age_ms`, one gauge per backend and reading, its state
    in the attributes).
    Either one failing is said once in the capture, and the rest goes on."""

    def __init__(self, session: AttachSession, ports: set[int]) -> None:
        self.session = session
        self.ports = ports
        self.sums: dict[tuple[str, Any], float] = {}
        self.readings = 0
        self.ages: list[int] = []  # how long each request in flight has waited for its answer, this second
        self.inodes: set[int] | None = None  # the socket inodes among the target's descriptors, this second
        self.foreign: set[int] = set()  # inodes of other processes' sockets seen this second
        self.db_ports: set[int] = set()  # the target's local ports of its connections to --db's server
        self.failed = False
        self.pg_failed = False
        self.warned_restricted = False
        self.exchanges = sockdiag.Exchanges()  # each outbound connection's requests and answers, in time

    def poll(self, pids: list[int], sockets: list[sockdiag.TcpSocket] | None = None) -> None:
        """One reading: `sockets`, the namespace's ESTABLISHED sockets just dumped (None: dump them here)."""
        if self.failed:
            return
        try:
            if self.inodes is None:  # the target's sockets, looked up once a second (outbound connections last)
                self.inodes, self.foreign = procfs.socket_inodes(pids), set()
            if sockets is None:
                sockets = sockdiag.tcp_sockets(self.session.pid, states=ESTABLISHED)  # the kernel leaves out TIME_WAIT and the rest
            # connections accepted since: on a listening port of the target's namespace, they are its own
            accepted = {s.inode for s in sockets if s.local[1] in self.ports}
            inodes = self.inodes | accepted
            # a connection opened since (a client that opens one per call): look the target's
            # sockets up again; those still not its own belong to other processes, asked once
            unknown = {s.inode for s in sockets if s.inode and s.inode not in inodes and s.inode not in self.foreign}
            if unknown:
                self.inodes = procfs.socket_inodes(pids)
                inodes = self.inodes | accepted
                self.foreign |= unknown - inodes
            census = sockdiag.census(self.session.pid, inodes, self.ports, sockets=sockets, receiving_ms=RECEIVING_MS)
        except Exception as exc:  # the census is one signal of several: say so once and go on without it
            self.failed = True
            self.session.writer.emit(QualityRecord(NOTE_WARNING, time.time_ns(), self.session.pid,
                                                   f"socket census stopped: {type(exc).__name__}: {exc}"))  # fmt: skip
            return
        self.readings += 1
        self.exchanges.update(sockets, inodes, self.ports, time.time_ns())
        if len(self.ages) < 10_000:
            self.ages += sockdiag.in_flight_ages_ms(sockets, inodes, self.ports)
        for port, inbound in census.inbound.items():
            for name in ("in_flight", "connections", "backlog"):
                self.sums["inbound." + name, port] = self.sums.get(("inbound." + name, port), 0.0) + getattr(inbound, name)
        for endpoint, outbound in census.outbound.items():
            for name in ("established", "pending", "receiving", "idle", "unread"):
                self.sums["outbound." + name, endpoint] = self.sums.get(("outbound." + name, endpoint), 0.0) + getattr(outbound, name)
        pg = self.session.pg
        if pg is not None:
            server = pg.server()
            self.db_ports = {
                s.local[1] for s in sockets
                if s.inode in inodes and (s.remote[0], s.remote[1]) == server
            }  # fmt: skip
            # read at the census rate: once a second aliases with requests that hold their
            # connections in a cycle near 0.5 or 1 s (each reading would catch the same phase)
            self._backends(time.time_ns())

    def flush(self, now: int) -> None:
        emit, target = self.session.writer.emit, self.session.pid
        if self.readings:
            for (name, where), total in sorted(self.sums.items(), key=str):
                attrs: dict[str, Any] = {"server.port": where}
                if isinstance(where, tuple):
                    attrs = self._endpoint(where)
                emit(Gauge("census." + name, round(total / self.readings, 3), now, target, attrs))
        if self.ages:
            ages = sorted(self.ages)
            emit(Gauge("census.inbound.in_flight_age_ms", ages[len(ages) // 2], now, target, {"latprof.max_ms": ages[-1]}))
        self.sums, self.readings, self.ages = {}, 0, []
        self.inodes = None
        self.flush_exchanges(now)

    def flush_exchanges(self, now: int, *, last: bool = False) -> None:
        """The exchanges with HTTP endpoints that ended since the last flush (with `last`: every
        one, the capture ends), as totals per endpoint (`census.outbound.first_byte_s`,
        `.stream_s`, `.exchanges`, `.streamed`)."""
        if self.failed:
            return
        if last:
            self.exchanges.close(now)
        for where, times in sorted(self.exchanges.take().items()):
            attrs = self._endpoint(where)
            if attrs["latprof.endpoint.kind"] != "http":
                continue
            for name in ("first_byte_s", "stream_s", "exchanges", "streamed"):
                self.session.writer.emit(Gauge("census.outbound." + name, round(getattr(times, name), 4), now, self.session.pid, attrs))

    def _endpoint(self, where: tuple[str, int]) -> dict[str, Any]:
        """A remote endpoint's gauge attributes, with its kind: a database's by its port (`--db`'s
        server is postgresql whatever its port), else http."""
        kind = DB_PORTS.get(where[1], "http")
        pg = self.session.pg
        if pg is not None and tuple(where) == pg.server():
            kind = "postgresql"
        return {"server.address": where[0], "server.port": where[1], "latprof.endpoint.kind": kind}

    def _backends(self, now: int) -> None:
        pg = self.session.pg
        if pg is None or self.pg_failed or not self.db_ports:
            return
        try:
            found = pg.sample(self.db_ports)
        except Exception as exc:
            self.pg_failed = True
            self.session.writer.emit(QualityRecord(NOTE_WARNING, now, self.session.pid,
                                                   f"pg_stat_activity sampling stopped: {exc}"))  # fmt: skip
            return
        for b in found:
            if b.state_age_ms is None:
                continue
            attrs = {"db.backend.state": b.state, "db.backend.pid": b.pid, "network.peer.port": b.client_port,
                     "db.backend.xact_age_ms": b.xact_age_ms, "db.backend.wait_event": b.wait_event}  # fmt: skip
            self.session.writer.emit(Gauge("db.backend.state_age_ms", round(b.state_age_ms, 1), now, self.session.pid, attrs))
        if getattr(pg, "restricted", False) and not self.warned_restricted:
            self.warned_restricted = True
            self.session.writer.emit(QualityRecord(NOTE_WARNING, now, self.session.pid,
                                                   "--db: the DSN's user may not see the target's backends' state"
                                                   " (grant it pg_read_all_stats, or use the service's own user)"))  # fmt: skip


class _EverySecond:
    """The /proc and psutil readings taken once a second: accepts, CPU, context switches, connections."""

    def __init__(self, session: AttachSession, ports: set[int]) -> None:
        self.session = session
        self.ports = ports
        self.procs: dict[int, Any] = {}
        self.last_threads: dict[tuple[int, int], float] = {}  # CPU seconds of each thread at the last reading
        self.last_ctx: dict[int, tuple[int, int]] = {}
        self.last_at = time.monotonic()

    def read(self, now: int, accepted: int, sockets: list[sockdiag.TcpSocket] | None = None) -> None:
        """This second's readings; `sockets`: the namespace's sockets just dumped, if they were."""
        import psutil

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
        for (address, port, status), n in procfs.remote_endpoints(pids, self.ports, sockets).items():
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
